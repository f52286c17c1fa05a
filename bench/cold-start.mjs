// One cold start, spawned by bench/lease.mjs in a fresh process: with @mastra/core already
// loaded (as in a Mastra app), the time from importing the client to its first grant.
//   node bench/cold-start.mjs <ours|node-redis> <redis url> <key>
// Prints the milliseconds. BENCH_PACKAGE names another build of ours, as for lease.mjs (its
// dist/cjs/index.js): its dist/esm entry is imported.
//
// Both clients are imported as a Mastra app (ESM) imports them. Ours loaded through
// require() from here would load @mastra/core's CommonJS build beside the ESM one already
// loaded, about 90 ms of zod and the AI SDK that no app pays twice.
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';

const [who, url, key] = process.argv.slice(2);
await import('@mastra/core/events');
const t0 = performance.now();
let granted, close;
if (who === 'ours') {
  const cjs = process.env.BENCH_PACKAGE ?? new URL('../dist/cjs/index.js', import.meta.url).pathname;
  const { RedisLeaseProvider } = await import(pathToFileURL(cjs.replace(/cjs[/\\]index\.js$/, 'esm/index.js')).href);
  const p = new RedisLeaseProvider({ url, keyPrefix: 'cold' });
  granted = (await p.acquireLease(key, 'owner', 30_000)).acquired;
  close = () => p.close();
} else {
  const { createClient } = await import('redis');
  const c = createClient({ url });
  await c.connect();
  granted = (await c.set(`cold:lease:${key}`, 'owner', { NX: true, PX: 30_000 })) === 'OK';
  close = () => c.close();
}
const ms = performance.now() - t0;
await close();
if (!granted) throw new Error(`${who}: ${key} was not granted`);
console.log(ms.toFixed(2));
