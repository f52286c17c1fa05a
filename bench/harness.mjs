// Shared by the benches: a private redis-server (or REDIS_URL), one under callgrind, key
// cleanup, the warm-up + alternating-order runner (medians of five), percentiles and tables.
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { createClient } from 'redis';

export const hr = process.hrtime.bigint;
export const SCALE = Number(process.env.BENCH_SCALE ?? 1);

// ---------- redis-server -------------------------------------------------------------------
let server = null, tmp = null;
const freePort = () => new Promise((res, rej) => {
  const s = createServer().once('error', rej).listen(0, '127.0.0.1', () => {
    const { port } = s.address(); s.close(() => res(port));
  });
});
async function startRedis(tmpPrefix) {
  let port; do port = await freePort(); while (port === 6379);
  tmp = mkdtempSync(join(tmpdir(), tmpPrefix));
  server = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '',
    '--appendonly', 'no', '--dir', tmp], { stdio: ['ignore', 'pipe', 'pipe'] });
  await new Promise((res, rej) => {
    const t = setTimeout(() => rej(new Error('redis-server did not start')), 10_000);
    server.once('error', rej).once('exit', (c) => rej(new Error(`redis-server exited (${c})`)));
    server.stdout.on('data', (d) => { if (/Ready to accept connections/.test(d)) { clearTimeout(t); res(); } });
  });
  return port;
}
function stopRedis() {
  if (server && server.exitCode === null && server.signalCode === null) server.kill('SIGTERM');
  if (tmp) rmSync(tmp, { recursive: true, force: true });
  server = tmp = null;
}
process.on('exit', stopRedis);
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => { stopRedis(); process.exit(130); });

/**
 * Starts a throwaway redis-server on a free port, unless REDIS_URL is set; connects an admin
 * client. `cleanup()` empties the server (own server) or unlinks `<prefix>:*` (REDIS_URL);
 * `shutdown()` closes the admin client and stops the server.
 */
export async function setupRedis({ prefix, tmpPrefix = 'bench-' }) {
  const ownServer = !process.env.REDIS_URL;
  const port = ownServer ? await startRedis(tmpPrefix) : null;
  const url = process.env.REDIS_URL ?? `redis://127.0.0.1:${port}`;
  const admin = createClient({ url });
  admin.on('error', (e) => console.error('admin redis error', e));
  await admin.connect();
  const cleanup = async () => {
    if (ownServer) { await admin.flushAll(); return; }
    for await (const keys of admin.scanIterator({ MATCH: `${prefix}:*`, COUNT: 10_000 })) {
      if (keys.length) await admin.unlink(keys);
    }
  };
  const shutdown = async () => {
    await admin.close();
    if (server) { const exited = new Promise((r) => server.once('exit', r)); stopRedis(); await exited; }
  };
  const version = /redis_version:(\S+)/.exec(await admin.info('server'))?.[1];
  return { ownServer, port, url, admin, cleanup, shutdown, version };
}

/**
 * A redis-server of its own under valgrind's callgrind, for Redis's instructions per call: a
 * count that stays put whatever else the machine does, where its CPU counters move by a
 * quarter between runs on a noisy VM. `zero()` zeroes the counters; `instructions()` answers
 * those counted since. About 50 times slower than a plain server.
 */
export async function startCallgrindRedis() {
  try {
    execFileSync('valgrind', ['--version'], { stdio: 'ignore' });
  } catch {
    throw new Error('valgrind is not on the PATH: the instruction counts need it (apt install valgrind)');
  }
  const out = mkdtempSync(join(tmpdir(), 'redis-callgrind-'));
  let port; do port = await freePort(); while (port === 6379);
  const server = spawn('valgrind', ['--tool=callgrind', `--callgrind-out-file=${out}/cg.out`,
    'redis-server', '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', out],
  { stdio: 'ignore' });
  const stop = () => { server.kill(); rmSync(out, { recursive: true, force: true }); };
  process.on('exit', stop);
  const url = `redis://127.0.0.1:${port}`;
  const admin = createClient({ url });
  admin.on('error', () => {});
  for (let tries = 0; ; tries++) {
    try { await admin.connect(); break; } catch (e) { if (tries > 100) throw e; await sleep(300); }
  }
  const control = (flag) => execFileSync('callgrind_control', [flag, String(server.pid)], { stdio: 'ignore' });
  const instructions = async () => {
    const before = new Set(readdirSync(out));
    control('-d');
    for (;;) {
      const fresh = readdirSync(out).filter((f) => !before.has(f) && f.startsWith('cg.out'));
      if (fresh.length) {
        await sleep(300); // let callgrind finish writing it
        return Number(/^(?:summary|totals): (\d+)/m.exec(readFileSync(join(out, fresh[0]), 'utf8'))[1]);
      }
      await sleep(100);
    }
  };
  return { url, admin, zero: () => control('-z'), instructions, stop: async () => { await admin.close(); stop(); } };
}

// ---------- runs ----------------------------------------------------------------------------
export const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];

/** Measured runs per contestant and workload (`BENCH_ROUNDS`, five unless told). */
export const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);

const middle = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/**
 * Warms every contestant up once, then runs each `rounds` times, every other round in reverse
 * order. Each contestant's result is the median of its runs, figure by figure (throughput,
 * percentiles, CPU per call), with `runs` holding every run's throughput for the min–max;
 * `bad` is summed over all runs, the warm-up's included (a wrong answer there still counts).
 * `between(name)` runs after every run.
 */
export async function medianOf(names, { warmup, run, between, rounds = ROUNDS }) {
  const runs = Object.fromEntries(names.map((nm) => [nm, []]));
  const bad = Object.fromEntries(names.map((nm) => [nm, 0]));
  for (const nm of names) {
    bad[nm] += (await warmup(nm)).bad ?? 0;
    await between?.(nm);
  }
  const orders = Array.from({ length: rounds }, (_, i) => (i % 2 ? [...names].reverse() : names));
  for (const order of orders) {
    for (const nm of order) {
      runs[nm].push(await run(nm));
      await between?.(nm);
    }
  }
  const res = {};
  for (const nm of names) {
    const all = runs[nm];
    const figures = Object.keys(all[0]).filter((k) => all.every((r) => typeof r[k] === 'number'));
    res[nm] = { ...all[0], ...Object.fromEntries(figures.map((k) => [k, middle(all.map((r) => r[k]))])),
      runs: all.map((r) => r.opsPerSec), bad: bad[nm] + all.reduce((n, r) => n + (r.bad ?? 0), 0) };
  }
  return res;
}

// ---------- report --------------------------------------------------------------------------
export const fmt = (x, d = 0) => (x == null || Number.isNaN(x) ? '-' : x.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d }));

/** min–max of a result's runs, when it has several. */
const spread = (r) => (r.runs?.length > 1 ? `${fmt(Math.min(...r.runs))}–${fmt(Math.max(...r.runs))}` : '');

/**
 * One row per contestant per workload: throughput (the median of the runs, and their
 * min–max), p50, p99 (µs) and the correctness check.
 */
export function printResults(W, { unit = 'calls/s', labelWidth = 36, nameWidth = 29 } = {}) {
  console.log(`\n${'workload'.padEnd(labelWidth)}${'contestant'.padEnd(nameWidth)}${unit.padStart(12)}${'min–max'.padStart(20)}${'p50 µs'.padStart(10)}${'p99 µs'.padStart(10)}  check`);
  for (const w of W) {
    let first = true;
    for (const [nm, r] of Object.entries(w.results)) {
      const head = first ? `${w.label} @${w.inFlight}` : ''; first = false;
      console.log(`${head.padEnd(labelWidth)}${nm.padEnd(nameWidth)}${fmt(r.opsPerSec).padStart(12)}${spread(r).padStart(20)}${fmt(r.p50Us, 1).padStart(10)}${fmt(r.p99Us, 1).padStart(10)}  ${r.bad ? `INVALID (${r.bad})` : 'ok'}`);
    }
  }
}

/** Throughput ratio ours / peer in one workload, against an optional minimum. */
export function ratioRow(w, ours, peer, target) {
  const a = w.results[ours], b = w.results[peer];
  const ratio = a && b ? a.opsPerSec / b.opsPerSec : null;
  const valid = a && b && !a.bad && !b.bad;
  const pass = target == null || ratio == null ? null : valid && ratio >= target;
  return { check: `${w.label} @${w.inFlight}: ${ours.replace(' (ours)', '')} / ${peer}`, ratio, target, pass, valid: !!valid };
}

export const verdict = (r) => (r.ratio == null ? 'n/a' : !r.valid ? 'INVALID' : r.pass == null ? '' : r.pass ? 'PASS' : 'FAIL');

export function printRatios(ratios, width = 80) {
  console.log(`\n${'ratio (throughput)'.padEnd(width)}${'ratio'.padStart(8)}${'target'.padStart(9)}  result`);
  for (const r of ratios) {
    console.log(`${r.check.padEnd(width)}${(r.ratio == null ? '-' : `${r.ratio.toFixed(2)}x`).padStart(8)}${(r.target == null ? '' : `${r.atMost ? '≤' : '≥'}${r.target.toFixed(2)}x`).padStart(9)}  ${verdict(r)}`);
  }
}
