// Streams benchmark: RedisStreamsPubSub (Rust transport + TS shell) vs the same stream layout on
// node-redis, publish → deliver. Run with `node bench/streams.mjs` after `npm run build`.
// BENCH_SCALE=0.2 shrinks every event count; REDIS_URL=redis://... uses an existing server;
// BENCH_MAX_LAG=n changes the publishers' backlog bound (default 256, keep it under 10000).
//
// Throughput = events / (first publish start → last callback's ack resolved), so a contestant
// that delivers fast but acks slowly is not flattered. Latency = publish call start → the
// subscriber callback receiving that event (a hrtime stamp rides in event.data). Publishers
// pause while MAX_LAG events are published but not acked, so a consumer slower than its
// producer shows up as lower throughput rather than as a backlog that `MAXLEN ~` would trim
// (losing events) or that makes latency grow with the run's length.
import { createHash } from 'node:crypto';
import { NodeRedisStreamsPubSub } from './mastra-streams.mjs';
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { hr, SCALE, setupRedis, pct, medianOf, fmt, printResults } from './harness.mjs';

const PREFIX = 'sbench';
const GROUP = 'bench-workers';
const TYPE = 'bench.event';
const MAX_LAG = Number(process.env.BENCH_MAX_LAG ?? 256); // well under MAXLEN ~ 10,000 (Mastra's default): trimming never drops an unread event
const DEADLINE_MS = 30_000; // a run that has not delivered everything by then is invalid
const T0 = hr(); // stamps are ns since this, small enough to be exact as a JS number
const n = (x) => Math.max(1000, Math.round(x * SCALE));

const { url, admin, cleanup, shutdown, version: redisVersion } =
  await setupRedis({ prefix: PREFIX, tmpPrefix: 'streams-bench-' });

// ---------- contestants ---------------------------------------------------------------------
// Which native build this run measured (another build may land between runs).
const NATIVE = new URL('../mastra-lease.linux-x64-gnu.node', import.meta.url);
let build = null;
try {
  build = { mtime: statSync(NATIVE).mtime.toISOString(),
    sha256: createHash('sha256').update(readFileSync(NATIVE)).digest('hex').slice(0, 16) };
} catch { /* another platform's binary name; not essential */ }
let RedisStreamsPubSub = null, oursError = null;
try {
  ({ RedisStreamsPubSub } = await import('../dist/esm/index.js'));
  if (typeof RedisStreamsPubSub !== 'function') throw new Error('dist/esm/index.js does not export RedisStreamsPubSub');
} catch (e) { RedisStreamsPubSub = null; oursError = e; }

const OURS = 'RedisStreamsPubSub (ours)', PEER = 'node-redis streams';
const factories = {};
if (RedisStreamsPubSub) factories[OURS] = (keyPrefix) => new RedisStreamsPubSub({ url, keyPrefix });
factories[PEER] = (keyPrefix) => new NodeRedisStreamsPubSub({ url, keyPrefix });
const slug = { [OURS]: 'ours', [PEER]: 'peer' };

// ---------- one run -------------------------------------------------------------------------
let runSeq = 0;

// The subscriber callback of consumer `c`: checks the event against the run it belongs to,
// records its latency, acks, and counts the ack.
const onEvent = (ct, c) => async (event, ack) => {
  const now = Number(hr() - T0);
  const r = ct.run, d = event?.data;
  if (!r || d?.run !== r.tag) { ct.strays++; await ack(); return; }
  r.lat[r.li++] = (now - d.t) / 1e3;
  const seq = d.seq;
  const seen = r.seen[c]; // fan-out: each subscriber sees every event once; a group: one of them
  if (!(seq >= 0 && seq < r.units) || seen[seq]++ !== 0) r.bad++; // unknown or duplicate
  if (typeof event.id !== 'string') r.bad++;
  else if (c === 0 || !r.fanout) { if (r.ids.has(event.id)) r.bad++; else r.ids.add(event.id); }
  if (event.type !== TYPE || event.runId !== r.tag || event.deliveryAttempt !== 1
    || !(event.createdAt instanceof Date) || Number.isNaN(event.createdAt.getTime())) r.bad++;
  r.split[c]++;
  await ack();
  r.delivered++;
  // Events fully handled: each once (a group), or by every subscriber (fan-out).
  r.acked = r.fanout ? Math.min(...r.split) : r.delivered;
  if (r.openGate && r.next - r.acked <= MAX_LAG * 0.75) { const open = r.openGate; r.openGate = r.gate = null; open(); }
  if (r.delivered === r.units * (r.fanout || 1)) { r.end = hr(); r.finish(); }
};

// What redis-server has done so far: seconds of CPU, and calls per command (INFO cpu and
// commandstats), to see what each contestant costs it and how full its reads are.
const redisStats = async () => {
  const info = String(await admin.sendCommand(['INFO', 'cpu', 'commandstats']));
  const cpu = ['used_cpu_user', 'used_cpu_sys'].reduce((t, f) => t + Number(new RegExp(`${f}:([\\d.]+)`).exec(info)?.[1] ?? 0), 0);
  const calls = {};
  for (const m of info.matchAll(/cmdstat_(\w+):calls=(\d+)/g)) calls[m[1]] = Number(m[2]);
  return { cpu, calls };
};
const STAT_CMDS = ['xadd', 'xread', 'xreadgroup', 'xack', 'evalsha', 'xautoclaim'];

// `inFlight` publishers share `units` events; each awaits its publish before the next.
async function measure(wl, name, ct, units) {
  const tag = `r${runSeq++}`;
  const fanout = wl.fanout ?? 0;
  const r = { tag, units, fanout, next: 0, acked: 0, delivered: 0, li: 0, bad: 0, gated: 0, gate: null, openGate: null, end: null,
    lat: new Float64Array(units * (fanout || 1) + 16), ids: new Set(), split: ct.subs.map(() => 0),
    // a group's consumers share one record of what was seen; fan-out subscribers each keep one
    seen: fanout ? ct.subs.map(() => new Uint8Array(units)) : ct.subs.map(() => null) };
  if (!fanout) { const shared = new Uint8Array(units); r.seen = r.seen.map(() => shared); }
  const done = new Promise((res) => { r.finish = res; });
  const waitGate = () => (r.gate ??= new Promise((res) => { r.openGate = res; }));
  const strays0 = ct.strays;
  ct.run = r;
  let publishError = null, publishEnd = null;
  const publisher = async () => {
    for (;;) {
      while (r.next - r.acked >= MAX_LAG && r.next < units) { r.gated++; await waitGate(); }
      const i = r.next++;
      if (i >= units) return;
      const t = hr();
      try {
        await ct.pub.publish(ct.topic, { type: TYPE, runId: tag, data: { run: tag, seq: i, t: Number(t - T0) } });
      } catch (e) { r.bad++; publishError ??= String(e?.message ?? e); }
    }
  };
  const redis0 = await redisStats(), ru0 = process.resourceUsage();
  const t0 = hr();
  const publishers = Promise.all(Array.from({ length: wl.inFlight }, publisher)).then(() => { publishEnd = hr(); });
  let timer;
  const timedOut = await Promise.race([
    done.then(() => false),
    new Promise((res) => { timer = setTimeout(() => res(true), DEADLINE_MS); }),
  ]);
  clearTimeout(timer);
  if (timedOut) { // let the publishers run out, then judge what did arrive
    r.next = units; r.openGate?.(); r.end = hr();
    console.warn(`\n!! ${name}: ${r.acked}/${units} events acked after ${DEADLINE_MS / 1000}s`);
  }
  await publishers;
  const secs = Number(r.end - t0) / 1e9;
  const ru1 = process.resourceUsage(), redis1 = await redisStats();
  const commands = Object.fromEntries(STAT_CMDS.map((c) => [c, (redis1.calls[c] ?? 0) - (redis0.calls[c] ?? 0)])
    .filter(([, v]) => v > 0)); // the other contestant's idle subscriptions add ~1 read a second
  // Exactly once: every seq seen once (by each fan-out subscriber), every event id distinct,
  // nothing left pending in a group.
  for (const seen of new Set(r.seen)) {
    let once = 0;
    for (const s of seen) if (s === 1) once++;
    if (once !== units) r.bad++;
  }
  if (r.ids.size !== units || r.acked !== units) r.bad++;
  if (!fanout && (await admin.xPending(ct.key, GROUP)).pending !== 0) r.bad++;
  r.bad += ct.strays - strays0; // an event of another run (a duplicate, late) showed up meanwhile
  ct.run = null;
  if (publishError) console.warn(`\n!! ${name}: ${publishError}`);
  const lat = r.lat.subarray(0, r.li).sort();
  const deliveries = units * (fanout || 1);
  return { opsPerSec: deliveries / secs, p50Us: pct(lat, 0.5), p99Us: pct(lat, 0.99), events: units, bad: r.bad,
    publishPerSec: publishEnd ? units / (Number(publishEnd - t0) / 1e9) : null, gated: r.gated, split: r.split,
    // per event: CPU of this process (every thread: JS, libuv, Tokio), of redis-server, and
    // this process's context switches (each cross-thread hand-off that sleeps costs one)
    nodeCpuUs: (ru1.userCPUTime + ru1.systemCPUTime - ru0.userCPUTime - ru0.systemCPUTime) / deliveries,
    redisCpuUs: ((redis1.cpu - redis0.cpu) * 1e6) / deliveries,
    eventsPerRead: (commands.xreadgroup ?? commands.xread) ? deliveries / (commands.xreadgroup ?? commands.xread) : null, commands,
    ctxSwitches: (ru1.voluntaryContextSwitches + ru1.involuntaryContextSwitches
      - ru0.voluntaryContextSwitches - ru0.involuntaryContextSwitches) / deliveries };
}

// Per contestant: `consumers` pubsub instances subscribed in one group to a fresh topic; the
// first also publishes. Warm-up and every round run on the same subscriptions.
async function runWorkload(wl) {
  process.stdout.write(`${wl.label} @${wl.inFlight} in flight ...`);
  const cts = {};
  for (const [name, make] of Object.entries(factories)) {
    const prefix = `${PREFIX}:${slug[name]}`, topic = `${wl.id}`;
    const ct = { topic, key: `${prefix}:${topic}`, run: null, strays: 0, subs: [] };
    if (wl.fanout) {
      // Fan-out: one pubsub (one process) with `fanout` subscriptions to the topic.
      const ps = make(prefix);
      for (let c = 0; c < wl.fanout; c++) {
        const cb = onEvent(ct, c);
        await ps.subscribe(topic, cb);
        ct.subs.push({ ps, cb });
      }
    }
    for (let c = 0; c < wl.consumers; c++) {
      const ps = make(prefix), cb = onEvent(ct, c);
      await ps.subscribe(topic, cb, { group: GROUP });
      ct.subs.push({ ps, cb });
    }
    ct.pub = ct.subs[0].ps;
    cts[name] = ct;
  }
  const results = await medianOf(Object.keys(cts), {
    warmup: (nm) => measure(wl, nm, cts[nm], Math.ceil(wl.units / 10)),
    run: (nm) => measure(wl, nm, cts[nm], wl.units),
  });
  await sleep(200); // a late duplicate would land now
  for (const [name, ct] of Object.entries(cts)) {
    const late = ct.strays; // strays during runs were already counted against those runs
    for (const { ps, cb } of ct.subs) await ps.unsubscribe(ct.topic, cb);
    for (const ps of new Set(ct.subs.map((x) => x.ps))) await ps.close();
    if (ct.strays !== late) results[name].bad += ct.strays - late;
  }
  await cleanup();
  console.log(' done');
  return { id: wl.id, label: wl.label, inFlight: wl.inFlight, consumers: wl.consumers, fanout: wl.fanout, events: wl.units, target: wl.target, results };
}

// ---------- run -----------------------------------------------------------------------------
if (!RedisStreamsPubSub) console.warn(`!! dist/esm not loadable, benchmarking the peer only: ${oursError?.message}`);
await cleanup();
console.log(`node ${process.version}, redis ${redisVersion} at ${url}, ${cpus().length} CPUs, scale ${SCALE}, max lag ${MAX_LAG}`
  + (build ? `, native build ${build.mtime} sha256:${build.sha256}` : ''));
const W = [];
// Targets: the performance issue's (throughput; fan-out counts deliveries).
W.push(await runWorkload({ id: 'a', label: '(a) sequential, 1 consumer', inFlight: 1, consumers: 1, units: n(20_000), target: 1 }));
W.push(await runWorkload({ id: 'a2', label: '(a2) sequential, 2 consumers', inFlight: 1, consumers: 2, units: n(20_000), target: 1 }));
W.push(await runWorkload({ id: 'b', label: '(b) 1 consumer', inFlight: 64, consumers: 1, units: n(50_000), target: 2 }));
W.push(await runWorkload({ id: 'c', label: '(c) 2 competing consumers', inFlight: 64, consumers: 2, units: n(50_000), target: 1.5 }));
W.push(await runWorkload({ id: 'd', label: '(d) fan-out to 10 subscribers', inFlight: 64, consumers: 0, fanout: 10, units: n(10_000), target: 1.5 }));

// localOnly events never reach Redis (Mastra publishes its workflow events so): each publish
// awaited, delivered within it to one fan-out subscriber and to one of a group of two. The
// peer is Mastra's in-process EventEmitterPubSub, which delivers within publish too.
async function localOnly(units) {
  process.stdout.write(`(e) localOnly to 3 subscribers @1 in flight ...`);
  const { EventEmitterPubSub } = await import('@mastra/core/events');
  const EE = 'EventEmitterPubSub (Mastra)';
  const contestants = { [EE]: new EventEmitterPubSub() };
  if (RedisStreamsPubSub) contestants[OURS] = new RedisStreamsPubSub({ url, keyPrefix: `${PREFIX}:local` });
  let delivered = 0;
  const handler = (_event, ack) => { delivered++; void ack?.(); };
  for (const ps of Object.values(contestants)) {
    await ps.subscribe('local', handler);
    await ps.subscribe('local', (e, ack) => handler(e, ack), { group: GROUP });
    await ps.subscribe('local', (e, ack) => handler(e, ack), { group: GROUP });
  }
  const lat = new Float64Array(units);
  const measure = async (name, count) => {
    const ps = contestants[name];
    delivered = 0;
    const t0 = hr();
    for (let i = 0; i < count; i++) {
      const t = hr();
      await ps.publish('local', { type: TYPE, runId: 'local', data: { i } }, { localOnly: true });
      lat[i] = Number(hr() - t) / 1e3;
    }
    const secs = Number(hr() - t0) / 1e9;
    const sorted = lat.subarray(0, count).sort();
    return { opsPerSec: count / secs, p50Us: pct(sorted, 0.5), p99Us: pct(sorted, 0.99), bad: delivered === 2 * count ? 0 : 1 };
  };
  const results = await medianOf(Object.keys(contestants), {
    warmup: (nm) => measure(nm, Math.ceil(units / 10)), run: (nm) => measure(nm, units) });
  for (const ps of Object.values(contestants)) await ps.close();
  console.log(' done');
  return { label: '(e) localOnly to 3 subscribers', inFlight: 1, peer: EE, results };
}
const local = await localOnly(n(100_000));

// ---------- report --------------------------------------------------------------------------
printResults(W, { unit: 'events/s', labelWidth: 34, nameWidth: 28 });
printResults([local], { unit: 'publishes/s', labelWidth: 34, nameWidth: 28 });
console.log(`\n${'per event (medians)'.padEnd(34)}${'contestant'.padEnd(28)}${'publish/s'.padStart(12)}${'gated'.padStart(8)}${'node CPU µs'.padStart(13)}${'redis CPU µs'.padStart(14)}${'ctx sw'.padStart(8)}${'ev/read'.padStart(9)}  split over consumers`);
for (const w of W) {
  let first = true;
  for (const [nm, r] of Object.entries(w.results)) {
    console.log(`${(first ? `${w.label} @${w.inFlight}` : '').padEnd(34)}${nm.padEnd(28)}${fmt(r.publishPerSec).padStart(12)}${fmt(r.gated).padStart(8)}${fmt(r.nodeCpuUs, 1).padStart(13)}${fmt(r.redisCpuUs, 1).padStart(14)}${fmt(r.ctxSwitches, 2).padStart(8)}${fmt(r.eventsPerRead, 1).padStart(9)}  ${r.split.join(' / ')}`);
    first = false;
  }
}
// Targets: each workload's throughput ratio, a lower p99, and for fan-out no more Redis CPU
// per delivery than the peer.
const targets = W.map((w) => {
  const a = w.results[OURS], b = w.results[PEER];
  const valid = !!(a && b && !a.bad && !b.bad);
  const ratio = a && b ? a.opsPerSec / b.opsPerSec : null;
  const throughputPass = valid && ratio >= w.target, p99Pass = valid && a.p99Us < b.p99Us;
  const cpuPass = !w.fanout || (valid && a.redisCpuUs <= b.redisCpuUs);
  return { check: `${w.label} @${w.inFlight}`, ratio, target: w.target, valid, throughputPass, p99Pass, cpuPass,
    p50: a && b ? [a.p50Us, b.p50Us] : null, p99: a && b ? [a.p99Us, b.p99Us] : null, pass: valid && throughputPass && p99Pass && cpuPass };
});
console.log(`\n${'ours / node-redis'.padEnd(34)}${'thr ratio'.padStart(10)}${'target'.padStart(8)}${'p50 µs ours/peer'.padStart(20)}${'p99 µs ours/peer'.padStart(20)}  result`);
for (const t of targets) {
  const pair = (p) => (p ? `${fmt(p[0])} / ${fmt(p[1])}` : '-');
  const res = t.ratio == null ? 'n/a' : !t.valid ? 'INVALID'
    : `${t.pass ? 'PASS' : 'FAIL'} (throughput ${t.throughputPass ? 'ok' : 'short'}, p99 ${t.p99Pass ? 'lower' : 'not lower'}${t.cpuPass ? '' : ', more Redis CPU per delivery'})`;
  console.log(`${t.check.padEnd(34)}${(t.ratio == null ? '-' : `${t.ratio.toFixed(2)}x`).padStart(10)}${`≥${t.target.toFixed(1)}x`.padStart(8)}${pair(t.p50).padStart(20)}${pair(t.p99).padStart(20)}  ${res}`);
}
// localOnly: reported against Mastra's in-process pubsub, no target.
const localRatio = local.results[OURS] && local.results[local.peer].opsPerSec > 0
  ? local.results[OURS].opsPerSec / local.results[local.peer].opsPerSec : null;
console.log(`${'(e) localOnly / EventEmitterPubSub'.padEnd(34)}${(localRatio == null ? '-' : `${localRatio.toFixed(2)}x`).padStart(10)}${'-'.padStart(8)}  reported`);
const out = { date: new Date().toISOString(), node: process.version, redis: redisVersion, cpus: cpus().length,
  scale: SCALE, maxLag: MAX_LAG, build, ours: !!RedisStreamsPubSub, oursError: oursError?.message, workloads: W, targets,
  localOnly: { ...local, ratio: localRatio } };
writeFileSync(new URL('./streams-results.json', import.meta.url), JSON.stringify(out, null, 2) + '\n');
console.log('\nwrote bench/streams-results.json');

await shutdown();
const invalid = [...W, local].some((w) => Object.values(w.results).some((r) => r.bad));
process.exit(!RedisStreamsPubSub || invalid ? 1 : 0);
