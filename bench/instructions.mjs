// Instructions per lease call of Mastra's lifecycle (acquire, renew, getLeaseOwner, transfer,
// release; one call in flight), counted by valgrind's callgrind: the same count for the same
// build and input whatever else the machine does, where the throughput rows of bench/lease.mjs
// move by a third between runs on a noisy VM. Each contestant runs the lifecycle twice, for
// SHORT and LONG units, and the difference is divided by the calls between them, so start-up
// and warm-up cancel out. `--predictable` keeps V8's compiler and collector from timing their
// work by the clock.
//
//   node bench/instructions.mjs          in memory: ours and Mastra's EventEmitterPubSub
//   node bench/instructions.mjs redis    on Redis: this process's work per call (the kernel's
//                                        and redis-server's are not counted; redis-server runs
//                                        outside valgrind), ours (RedisLeaseProvider and
//                                        RedisStreamsPubSub) and Mastra's own backend's calls
//                                        on node-redis
//
// Needs valgrind on the PATH (and redis-server for `redis`); about 3 minutes each.
// BENCH_PACKAGE names another build of the package (its dist/cjs/index.js), as for lease.mjs.
import { spawn, spawnSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { createRequire } from 'node:module'
import { createServer } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'

const CALLS_PER_UNIT = 5
// `node instructions.mjs redis`, or one counted run on Redis (`run <who> <units> <url>`).
const ON_REDIS = process.argv[2] === 'redis' || process.argv[5] !== undefined
// A round trip costs far more than a call in memory: fewer units on Redis.
const [SHORT, LONG] = ON_REDIS ? [1_000, 4_000] : [20_000, 80_000]

/** The contestant `who`; on Redis at `url`, its keys under a prefix of its own. */
async function contestant(who, url) {
  const pkg = createRequire(import.meta.url)(process.env.BENCH_PACKAGE ?? '../dist/cjs/index.js')
  const keyPrefix = `instr-${randomUUID()}`
  switch (who) {
    case 'ours': return new pkg.MemoryLeaseProvider()
    case 'EventEmitterPubSub': return new (await import('@mastra/core/events')).EventEmitterPubSub()
    case 'RedisLeaseProvider': return new pkg.RedisLeaseProvider({ url, keyPrefix })
    case 'RedisStreamsPubSub': return new pkg.RedisStreamsPubSub({ url, keyPrefix })
    case "Mastra's on node-redis": {
      const { createClient } = await import('redis')
      const { MastraAlgorithm } = await import('./mastra-scripts.mjs')
      const client = createClient({ url })
      await client.connect()
      return new MastraAlgorithm(client, keyPrefix)
    }
  }
  throw new Error(`no contestant ${who}`)
}

if (process.argv[2] === 'run') {
  await import('@mastra/core/events') // loaded by every contestant alike
  const p = await contestant(process.argv[3], process.argv[5])
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
  let url, server
  if (ON_REDIS) {
    const port = await new Promise((res) => { const l = createServer().listen(0, '127.0.0.1', () => { const { port: p } = l.address(); l.close(() => res(p)) }) })
    server = spawn('redis-server', ['--port', String(port), '--save', '', '--appendonly', 'no'], { stdio: 'ignore' })
    process.on('exit', () => server.kill())
    url = `redis://127.0.0.1:${port}`
    const { createClient } = await import('redis')
    const admin = createClient({ url })
    admin.on('error', () => {})
    for (let tries = 0; ; tries++) {
      try { await admin.connect(); break } catch (e) { if (tries > 100) throw e; await sleep(100) }
    }
    await admin.close()
  }
  // Instructions of one whole run, as callgrind reports them on stderr.
  const count = (who, units) => {
    const { stderr, status } = spawnSync('valgrind', ['--tool=callgrind', '--callgrind-out-file=/dev/null',
      process.execPath, '--predictable', self, 'run', who, String(units), ...(url ? [url] : [])], { encoding: 'utf8' })
    if (status !== 0) throw new Error(`valgrind ${who} ${units}: exit ${status}\n${stderr}`)
    return Number(/Collected : (\d+)/.exec(stderr)?.[1] ?? NaN)
  }
  const who = ON_REDIS ? ['RedisLeaseProvider', 'RedisStreamsPubSub', "Mastra's on node-redis"] : ['ours', 'EventEmitterPubSub']
  const perCall = {}
  for (const w of who) {
    perCall[w] = (count(w, LONG) - count(w, SHORT)) / ((LONG - SHORT) * CALLS_PER_UNIT)
    console.log(`${w.padEnd(24)}${Math.round(perCall[w]).toLocaleString('en-US').padStart(8)} instructions per lease call`)
  }
  const peer = who[who.length - 1]
  for (const w of who.slice(0, -1)) console.log(`${w} / ${peer}: ${(perCall[w] / perCall[peer]).toFixed(2)}`)
  server?.kill()
}
