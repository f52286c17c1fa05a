// Compiles the TypeScript shell twice, as ESM (dist/esm) and CommonJS (dist/cjs), each
// folder marked with its module type so Node and TypeScript read every file as it is.
import { execFileSync } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'

const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc')
for (const [config, dir, type] of [
  ['src/shell/tsconfig.json', 'dist/esm', 'module'],
  ['src/shell/tsconfig.cjs.json', 'dist/cjs', 'commonjs'],
]) {
  execFileSync(process.execPath, [tsc, '-p', config], { stdio: 'inherit' })
  writeFileSync(`${dir}/package.json`, JSON.stringify({ type }) + '\n')
}
// One class per provider whichever way the package is loaded, as the binding's own are: the
// ESM build re-exports the CommonJS ones, so a provider made through `require` passes
// `instanceof` against the class from `import`, and back.
for (const [file, names] of [
  ['memory-lease-provider', 'MemoryLeaseProvider'],
  ['redis-lease-provider', 'RedisLeaseProvider'],
  // It loads the optional @opentelemetry/api with `require`.
  ['metrics', 'recordLeaseMetrics'],
  // The waiters of a provider live in one module, so the ESM pubsubs and `holdLease` find
  // those of the CommonJS provider classes (and one queue per provider, not one per build).
  ['wait', 'releaseWaiters, Waiters, waitersOf'],
  // One tracer: a call through an ESM pubsub over a CommonJS provider is traced once.
  ['diagnostics', 'ackChannel, deliverChannel, leaseChannel, nackChannel, publishChannel, traced'],
]) {
  writeFileSync(`dist/esm/${file}.js`, `export { ${names} } from '../cjs/${file}.js'\n`)
}
