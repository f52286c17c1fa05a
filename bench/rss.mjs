// Memory over many calls: the process's RSS after 100k lease calls and again after 10M
// (BENCH_SCALE scales the 10M), on the in-memory provider and on Redis (64 in flight, the
// lifecycle of bench/lease.mjs on distinct keys, so every lease comes and goes). Flat means
// within 10% of the 100k figure: nothing grows per call. Run with `node --expose-gc`
// (`npm run bench` does) so the figures are taken after a full collection.
import { createRequire } from 'node:module';
import { SCALE, setupRedis } from './harness.mjs';

const native = createRequire(import.meta.url)(process.env.BENCH_NATIVE ?? '../index.js');
const TOTAL = Math.max(200_000, Math.round(10_000_000 * SCALE));
const FIRST = 100_000;
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

async function measure(name, p) {
  const started = Date.now();
  await drive(p, 0, FIRST, name);
  const early = rssMb();
  await drive(p, FIRST, TOTAL - FIRST, name);
  const late = rssMb();
  const seconds = (Date.now() - started) / 1000;
  const ratio = late / early;
  console.log(`${name.padEnd(28)} RSS after ${FIRST / 1e3}k calls ${early.toFixed(1)} MB, after ${(TOTAL / 1e6).toFixed(1)}M ${late.toFixed(1)} MB: ` +
    `${ratio.toFixed(3)}x ${ratio <= 1.1 ? 'flat' : 'GROWS'} (${seconds.toFixed(0)} s)`);
  return ratio;
}

if (!globalThis.gc) console.warn('!! run with node --expose-gc for figures after a full collection');
const { url, shutdown } = await setupRedis({ prefix: 'rss', tmpPrefix: 'rss-bench-' });
const memory = new native.MemoryLeaseProvider();
const redis = new native.RedisLeaseProvider({ url, keyPrefix: 'rss' });
const ratios = [await measure('MemoryLeaseProvider', memory), await measure('RedisLeaseProvider', redis)];
await memory.close();
await redis.close();
await shutdown();
process.exit(ratios.every((r) => r <= 1.1) ? 0 : 1);
