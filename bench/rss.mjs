// Memory over many calls: the process's RSS after 100k, 1M and 10M lease calls (BENCH_SCALE
// scales the 10M), on the in-memory provider beside Mastra's EventEmitterPubSub, and on Redis
// (64 in flight, the lifecycle of bench/lease.mjs on distinct keys, so every lease comes and
// goes). Each runs in a process of its own. V8 itself grows its heap and code space over the
// first million or so calls (EventEmitterPubSub, pure JavaScript, does too), so flat means the
// 10M figure within 10% of the 1M one: nothing grows per call. Run with `node --expose-gc`
// (`npm run bench` does) so the figures are taken after a full collection.
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { EventEmitterPubSub } from '@mastra/core/events';
import { SCALE, setupRedis } from './harness.mjs';

const native = createRequire(import.meta.url)(process.env.BENCH_PACKAGE ?? '../dist/cjs/index.js');
const TOTAL = Math.max(2_000_000, Math.round(10_000_000 * SCALE));
const SAMPLES = [100_000, 1_000_000, TOTAL];
const IN_FLIGHT = 64;
const TTL = 60_000;

const rssMb = () => {
  globalThis.gc?.();
  return process.memoryUsage().rss / 2 ** 20;
};

/** Runs lifecycles (5 calls each) on `p` until `calls` calls are done, 64 in flight. */
async function drive(p, from, calls, tag) {
  let next = from / 5;
  const last = (from + calls) / 5;
  const worker = async (w) => {
    for (let i; (i = next++) < last;) {
      const k = `${tag}:${i}`, a = `a${w}`, b = `b${w}`;
      const r = await p.acquireLease(k, a, TTL);
      const renewed = await p.renewLease(k, a, TTL);
      const owner = await p.getLeaseOwner(k);
      const moved = await p.transferLease(k, a, b, TTL);
      await p.releaseLease(k, b);
      if (!r.acquired || !renewed || owner !== a || !moved) throw new Error(`lease ${k} went wrong`);
    }
  };
  await Promise.all(Array.from({ length: IN_FLIGHT }, (_, w) => worker(w)));
}

/** RSS at each of SAMPLES calls on `p`. */
async function measure(name, p) {
  const started = Date.now();
  const rss = [];
  let done = 0;
  for (const at of SAMPLES) {
    await drive(p, done, at - done, name);
    done = at;
    rss.push(rssMb());
  }
  return { rss, seconds: (Date.now() - started) / 1000 };
}

const which = process.argv[2];
if (which) {
  // One contestant, in this process: print its samples as JSON. Only Redis's needs a server.
  const redis = which === 'RedisLeaseProvider' ? await setupRedis({ prefix: 'rss', tmpPrefix: 'rss-bench-' }) : null;
  const p = which === 'EventEmitterPubSub' ? new EventEmitterPubSub()
    : which === 'MemoryLeaseProvider' ? new native.MemoryLeaseProvider()
      : new native.RedisLeaseProvider({ url: redis.url, keyPrefix: 'rss' });
  console.log(JSON.stringify(await measure(which, p)));
  await p.close();
  await redis?.shutdown();
  process.exit(0);
}

if (!globalThis.gc) console.warn('!! run with node --expose-gc for figures after a full collection');
const self = fileURLToPath(import.meta.url);
let flat = true;
for (const name of ['MemoryLeaseProvider', 'EventEmitterPubSub', 'RedisLeaseProvider']) {
  const { rss, seconds } = JSON.parse(execFileSync(process.execPath, ['--expose-gc', self, name], { encoding: 'utf8' }).trim().split('\n').pop());
  const [early, mid, late] = rss;
  const ratio = late / mid;
  if (name !== 'EventEmitterPubSub') flat &&= ratio <= 1.1;
  console.log(`${name.padEnd(22)} RSS after 100k / 1M / ${(TOTAL / 1e6).toFixed(1)}M calls: ${early.toFixed(1)} / ${mid.toFixed(1)} / ${late.toFixed(1)} MB; ` +
    `last / 1M ${ratio.toFixed(3)}x ${ratio <= 1.1 ? 'flat' : 'GROWS'}, last / 100k ${(late / early).toFixed(3)}x (${seconds.toFixed(0)} s)`);
}
process.exit(flat ? 0 : 1);
