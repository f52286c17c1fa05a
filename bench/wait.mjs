// Waiting for a lease: what the publish in the release script costs Redis, and how a waiter
// that listens compares with one that polls. Run with `node bench/wait.mjs` (after a build).
// BENCH_SCALE=0.2 shrinks the op counts; REDIS_URL=redis://... uses an existing server.
//
// 1. Redis's main-thread CPU per acquire+release cycle of a fenced lease (node-redis sending the
//    scripts, 64 in flight): release.lua as shipped (SPUBLISH on the lease key, nobody
//    listening: a lease with a companion key publishes; one without, Mastra's, never does),
//    against the same script without that block, in alternating rounds of one run.
// 2. Handovers between two processes' worth of providers (each its own connection): a holder
//    takes a key and releases it after a while, a waiter wants it. `hold({ wait: true })`
//    against a waiter polling `acquireLease` every 50 ms (what an app without notifications
//    writes): the delay from the release to the grant, and the commands Redis ran per handover
//    (those inside scripts counted too), for short holds (20–80 ms) and for 1 s holds.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { SCALE, setupRedis, pct, fmt } from './harness.mjs';

const require = createRequire(import.meta.url);
const { RedisLeaseProvider } = require('../dist/cjs/index.js');

const PREFIX = 'benchwait';
const { url, admin, cleanup, shutdown, version } = await setupRedis({ prefix: PREFIX, tmpPrefix: 'wait-bench-' });
console.log(`Redis ${version}; BENCH_SCALE=${SCALE}\n`);

// ---------- 1. the publish's cost ----------------------------------------------------------
const lua = (name) => readFileSync(new URL(`../src/core/lease/${name}.lua`, import.meta.url), 'utf8');
const released = lua('release');
// The publish is one `if` block: SPUBLISH, and PUBLISH where SPUBLISH is refused.
const withoutPublish = released.replace(/^if type\(redis\.pcall\('SPUBLISH'[\s\S]*?^end\n/m, '');
if (withoutPublish === released) throw new Error('release.lua has no SPUBLISH block to take out');
const sha = {
  acquire: await admin.scriptLoad(lua('acquire')),
  shipped: await admin.scriptLoad(released),
  silent: await admin.scriptLoad(withoutPublish),
};

async function serverCpu() {
  const info = await admin.info('cpu');
  const get = (f) => Number(new RegExp(`${f}:([\\d.]+)`).exec(info)?.[1] ?? NaN);
  return get('used_cpu_user_main_thread') + get('used_cpu_sys_main_thread');
}

/** Redis µs per acquire+release cycle with `release` as the release script. */
async function cycles(release, count, inFlight = 64) {
  const client = admin.duplicate();
  await client.connect();
  let next = 0;
  const cpu0 = await serverCpu();
  await Promise.all(Array.from({ length: inFlight }, async () => {
    while (next < count) {
      const i = next++;
      const k = `k${i % 4096}`;
      const keys = [`${PREFIX}:lease:${k}`, `${PREFIX}:fence:{0}:${k}`, `${PREFIX}:fence:{0}`];
      await client.evalSha(sha.acquire, { keys, arguments: ['o', '60000', '', '1'] });
      await client.evalSha(release, { keys: keys.slice(0, 2), arguments: ['o', ''] });
    }
  }));
  const us = ((await serverCpu()) - cpu0) * 1e6;
  await client.close();
  return us / count;
}

const N = Math.max(5_000, Math.round(100_000 * SCALE));
await cycles(sha.shipped, N / 10);
await cycles(sha.silent, N / 10);
const cost = { shipped: [], silent: [] };
for (let round = 0; round < 3; round++) {
  for (const name of round % 2 ? ['silent', 'shipped'] : ['shipped', 'silent']) {
    cost[name].push(await cycles(sha[name], N));
    await cleanup();
  }
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
console.log('Redis CPU per acquire+release cycle (µs, 64 in flight, three rounds):');
console.log(`  release with SPUBLISH (shipped): ${cost.shipped.map((x) => fmt(x, 2)).join(', ')}`);
console.log(`  release without it:              ${cost.silent.map((x) => fmt(x, 2)).join(', ')}`);
console.log(`  ratio (medians): ${fmt(median(cost.shipped) / median(cost.silent), 3)}x\n`);

// ---------- 2. handovers: listening against polling -----------------------------------------
const POLL_MS = 50;
const WORKLOADS = [
  { label: 'holds of 20–80 ms', handovers: Math.max(20, Math.round(200 * SCALE)), holdMs: (i) => 20 + (i % 7) * 10 },
  { label: 'holds of 1 s', handovers: Math.max(5, Math.round(20 * SCALE)), holdMs: () => 1_000 },
];

async function commandCount() {
  const info = await admin.info('commandstats');
  let total = 0;
  for (const [, name, calls] of info.matchAll(/cmdstat_([^:]+):calls=(\d+)/g)) {
    if (!['info', 'ping', 'client|setname', 'client|id', 'script|load'].includes(name)) total += Number(calls);
  }
  return total;
}

/** `acquire` is how the waiter gets the key (resolving when it was granted). */
async function handovers(acquire, { handovers: count, holdMs }) {
  const holder = new RedisLeaseProvider({ url, keyPrefix: PREFIX });
  const waiter = new RedisLeaseProvider({ url, keyPrefix: PREFIX });
  const delays = [];
  const commands0 = await commandCount();
  for (let i = 0; i < count; i++) {
    const key = `handover-${i}`;
    await holder.acquireLease(key, 'holder', 60_000);
    const granted = acquire(waiter, key);
    await sleep(holdMs(i)); // the holder works a while; the waiter is waiting meanwhile
    await holder.releaseLease(key, 'holder');
    const releasedAt = performance.now();
    const grantedAt = await granted;
    delays.push(grantedAt - releasedAt);
    await waiter.releaseLease(key, 'waiter');
  }
  const commands = (await commandCount()) - commands0;
  await holder.close();
  await waiter.close();
  delays.sort((a, b) => a - b);
  return { p50: pct(delays, 0.5), p99: pct(delays, 0.99), perHandover: commands / count };
}

const listening = (waiter, key) =>
  waiter.hold(key, 'waiter', { ttlMs: 60_000, wait: true }).then(async (lease) => {
    const at = performance.now();
    await lease.release();
    return at;
  });
const polling = async (waiter, key) => {
  for (;;) {
    if ((await waiter.acquireLease(key, 'waiter', 60_000)).acquired) return performance.now();
    await sleep(POLL_MS);
  }
};

for (const workload of WORKLOADS) {
  const runs = { listening: [], polling: [] };
  for (let round = 0; round < 2; round++) {
    for (const name of round % 2 ? ['polling', 'listening'] : ['listening', 'polling']) {
      runs[name].push(await handovers(name === 'listening' ? listening : polling, workload));
      await cleanup();
    }
  }
  console.log(`Handovers, ${workload.label} (${workload.handovers} per run, two runs each): release → grant, Redis commands per handover`);
  for (const [name, results] of Object.entries(runs)) {
    const label = name === 'listening' ? 'hold({ wait: true })' : `polling every ${POLL_MS} ms`;
    console.log(`  ${label.padEnd(24)} p50 ${results.map((r) => fmt(r.p50, 2)).join(' / ')} ms, p99 ${results
      .map((r) => fmt(r.p99, 2)).join(' / ')} ms, ${results.map((r) => fmt(r.perHandover, 1)).join(' / ')} commands`);
  }
  const ratio = (f) => median(runs.listening.map(f)) / median(runs.polling.map(f));
  console.log(`  listening / polling: delay p50 ${fmt(ratio((r) => r.p50), 3)}x, commands ${fmt(ratio((r) => r.perHandover), 2)}x\n`);
}

await shutdown();
