// What each call of Mastra's lease lifecycle, and one event, costs redis-server, counted in
// instructions by valgrind's callgrind, ours against Mastra's own backend's: a count that
// stays put whatever else the machine does, where Redis's CPU counters in bench/lease.mjs move
// by a third between runs on a noisy VM. redis-server runs under callgrind; for each command
// kind, N calls on fresh keys (or on keys held as the lifecycle would hold them) go 64 to a
// pipeline between a zeroing and a dump of the counters, so only that command's work is
// counted. An event is counted through the clients themselves (below).
//
//   node bench/redis-instructions.mjs       (needs valgrind and redis-server; about 3 minutes)
//
// The commands are the ones each side sends: ours from src/core/lease/*.lua (passed the
// arguments the Rust encoder passes on one server, src/core/lease/redis/commands.rs), Mastra's as its
// backend sends them (bench/lease.mjs's peer).
import { readFileSync } from 'node:fs';
import { startCallgrindRedis } from './harness.mjs';
import { MASTRA_LUA } from './mastra-scripts.mjs';
import { NodeRedisStreamsPubSub } from './mastra-streams.mjs';

const N = Number(process.env.N ?? 4000);
const { url, admin, zero, instructions: dump, stop } = await startCallgrindRedis();
const lua = (name) => readFileSync(new URL(`../src/core/lease/${name}.lua`, import.meta.url), 'utf8');
const P = 'p:lease:', F = 'p:fence:{0}';
// The lease key, its companion key, the slot's counter.
const keys = (k) => [P + k, `${F}:${k}`, F];
const held = (m, k) => m.set(P + k, 'a', { PX: 60_000 });
// Held by b after a transfer: on one server, the lease key alone (no transfer id is kept).
const handedOver = (m, k) => m.set(P + k, 'b', { PX: 60_000 });
const sha = {};
for (const name of ['renew', 'release', 'transfer']) sha[name] = await admin.scriptLoad(lua(name));
const ours = (name, n, args) => (m, k) => m.sendCommand(['EVALSHA', sha[name], String(n), ...keys(k).slice(0, n), ...args(k)]);
const mastra = (name, args) => (m, k) => m.sendCommand(['EVAL', MASTRA_LUA[name], '1', P + k, ...args(k)]);
// [call, Mastra's command, ours, the state each call finds]
const CALLS = [
  ['acquire (a free key)', (m, k) => m.sendCommand(['SET', P + k, 'a', 'NX', 'PX', '60000']),
    (m, k) => { m.sendCommand(['SET', P + k, 'a', 'NX', 'PX', '60000', 'GET']); m.sendCommand(['EXISTS', `${F}:${k}`]); }, null],
  ['renewLease', mastra('renew', () => ['a', '60000']), ours('renew', 2, () => ['a', '60000']), held],
  ['getLeaseOwner', (m, k) => m.get(P + k), (m, k) => m.get(P + k), held],
  ['transferLease', mastra('transfer', () => ['a', 'b', '60000']), ours('transfer', 3, () => ['a', 'b', '60000']), held],
  ['releaseLease (after a transfer)', mastra('release', () => ['b']), ours('release', 2, () => ['b']), handedOver],
];
async function count(send, prepare) {
  await admin.flushAll();
  for (let i = 0; prepare && i < N; i += 1000) {
    const m = admin.multi();
    for (let k = i; k < Math.min(i + 1000, N); k++) prepare(m, k);
    await m.execAsPipeline();
  }
  zero();
  for (let i = 0; i < N; i += 64) {
    const m = admin.multi();
    for (let k = i; k < Math.min(i + 64, N); k++) send(m, k);
    await m.execAsPipeline();
  }
  return (await dump()) / N;
}
const total = { mastra: 0, ours: 0 };
console.log(`${'call'.padEnd(34)}${"Mastra's".padStart(10)}${'ours'.padStart(10)}${'ours / Mastra'.padStart(16)}   (instructions per call)`);
for (const [call, theirs, mine, prepare] of CALLS) {
  await count(theirs, prepare); // warm-up: scripts compiled, allocator settled
  const m = await count(theirs, prepare), o = await count(mine, prepare);
  total.mastra += m; total.ours += o;
  console.log(`${call.padEnd(34)}${Math.round(m).toLocaleString('en-US').padStart(10)}${Math.round(o).toLocaleString('en-US').padStart(10)}${`${(o / m).toFixed(2)}x`.padStart(16)}`);
}
console.log(`${'the lifecycle'.padEnd(34)}${Math.round(total.mastra).toLocaleString('en-US').padStart(10)}${Math.round(total.ours).toLocaleString('en-US').padStart(10)}${`${(total.ours / total.mastra).toFixed(2)}x`.padStart(16)}`);

// Per event, through the clients themselves (how they read and ack decides what Redis does):
// N events published 64 at a time, each read by one group consumer and acked, ours
// (`RedisStreamsPubSub`, the build in dist/) against Mastra's stream layout on node-redis.
const { RedisStreamsPubSub } = await import('../dist/esm/index.js');
async function perEvent(make) {
  await admin.flushAll();
  const pubsub = make({ url, keyPrefix: 'ev' });
  let acked = 0, allAcked;
  const done = new Promise((resolve) => { allAcked = resolve; });
  await pubsub.subscribe('jobs', async (event, ack) => { await ack(); if (++acked === N) allAcked(); }, { group: 'g' });
  zero();
  let published = 0;
  await Promise.all(Array.from({ length: 64 }, async () => {
    while (published < N) { published++; await pubsub.publish('jobs', { type: 'job', runId: 'r', data: { n: published } }); }
  }));
  await done;
  const per = (await dump()) / N;
  await pubsub.close();
  return per;
}
const make = { ours: (o) => new RedisStreamsPubSub(o), mastra: (o) => new NodeRedisStreamsPubSub(o) };
await perEvent(make.mastra); // warm-up
const event = { mastra: await perEvent(make.mastra), ours: await perEvent(make.ours) };
console.log(`${'an event: published, read, acked'.padEnd(34)}${Math.round(event.mastra).toLocaleString('en-US').padStart(10)}${Math.round(event.ours).toLocaleString('en-US').padStart(10)}${`${(event.ours / event.mastra).toFixed(2)}x`.padStart(16)}`);
await stop();
process.exit(0);
