// Instructions per in-memory lease call, ours and Mastra's EventEmitterPubSub, counted by
// valgrind's callgrind: the same count for the same build and input whatever else the machine
// does, where the throughput rows of bench/lease.mjs move by a third between runs on a noisy
// VM. Each contestant runs the in-memory lifecycle of bench/lease.mjs (acquire, renew,
// getLeaseOwner, transfer, release; one call in flight) twice, for SHORT and LONG units, and
// the difference is divided by the calls between them, so start-up and warm-up cancel out.
// `--predictable` keeps V8's compiler and collector from timing their work by the clock.
//
//   node bench/instructions.mjs              (needs valgrind on the PATH; about 3 minutes)
//
// BENCH_PACKAGE names another build of the package (its dist/cjs/index.js), as for lease.mjs.
import { spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'

const SHORT = 20_000, LONG = 80_000, CALLS_PER_UNIT = 5

if (process.argv[2] === 'run') {
  const { EventEmitterPubSub } = await import('@mastra/core/events')
  const pkg = createRequire(import.meta.url)(process.env.BENCH_PACKAGE ?? '../dist/cjs/index.js')
  const p = process.argv[3] === 'ours' ? new pkg.MemoryLeaseProvider() : new EventEmitterPubSub()
  for (let i = 0, units = Number(process.argv[4]); i < units; i++) {
    const k = `l${i}`
    const r = await p.acquireLease(k, 'a0', 30_000)
    const renewed = await p.renewLease(k, 'a0', 30_000)
    const o = await p.getLeaseOwner(k)
    const moved = await p.transferLease(k, 'a0', 'b0', 30_000)
    await p.releaseLease(k, 'b0')
    if (r.acquired !== true || renewed !== true || o !== 'a0' || moved !== true) throw new Error(`wrong answer at ${i}`)
  }
  await p.close?.()
} else {
  const self = fileURLToPath(import.meta.url)
  // Instructions of one whole run, as callgrind reports them on stderr.
  const count = (who, units) => {
    const { stderr, status } = spawnSync('valgrind', ['--tool=callgrind', '--callgrind-out-file=/dev/null',
      process.execPath, '--predictable', self, 'run', who, String(units)], { encoding: 'utf8' })
    if (status !== 0) throw new Error(`valgrind ${who} ${units}: exit ${status}\n${stderr}`)
    return Number(/Collected : (\d+)/.exec(stderr)?.[1] ?? NaN)
  }
  const perCall = {}
  for (const who of ['ours', 'EventEmitterPubSub']) {
    perCall[who] = (count(who, LONG) - count(who, SHORT)) / ((LONG - SHORT) * CALLS_PER_UNIT)
    console.log(`${who.padEnd(20)}${Math.round(perCall[who]).toLocaleString('en-US').padStart(8)} instructions per lease call`)
  }
  console.log(`EventEmitterPubSub / ours: ${(perCall.EventEmitterPubSub / perCall.ours).toFixed(2)}`)
}
