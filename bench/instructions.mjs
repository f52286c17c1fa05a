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
//   node bench/instructions.mjs cluster  on a 3-master Redis Cluster, 64 lifecycles in flight:
//                                        RedisLeaseProvider against Mastra's calls on
//                                        node-redis' cluster client
//
// Needs valgrind on the PATH (and redis-server, redis-cli on Redis); about 3 minutes each.
// BENCH_PACKAGE names another build of the package (its dist/cjs/index.js), as for lease.mjs.
import { spawn, spawnSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { createRequire } from 'node:module'
import { mkdtempSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'

const CALLS_PER_UNIT = 5
// `node instructions.mjs redis|cluster`, or one counted run on Redis (`run <who> <units> <urls>`:
// a cluster's seed URLs joined by commas).
const MODE = process.argv[2] === 'run' ? (process.argv[5]?.includes(',') ? 'cluster' : process.argv[5] ? 'redis' : 'memory') : (process.argv[2] ?? 'memory')
if (!['memory', 'redis', 'cluster'].includes(MODE)) throw new Error(`usage: node bench/instructions.mjs [redis|cluster]`)
// Lifecycles in flight at once: Mastra's agents on a Cluster are many.
const IN_FLIGHT = MODE === 'cluster' ? 64 : 1
// A round trip costs far more than a call in memory: fewer units on Redis.
const [SHORT, LONG] = { memory: [20_000, 80_000], redis: [1_000, 4_000], cluster: [6_400, 25_600] }[MODE]

/** The contestant `who`; on Redis at `url` (seed URLs joined by commas for a cluster), its keys under a prefix of its own. */
async function contestant(who, url) {
  const pkg = createRequire(import.meta.url)(process.env.BENCH_PACKAGE ?? '../dist/cjs/index.js')
  const keyPrefix = `instr-${randomUUID()}`
  const where = MODE === 'cluster' ? { cluster: { nodes: url.split(',') } } : { url }
  switch (who) {
    case 'ours': return new pkg.MemoryLeaseProvider()
    case 'EventEmitterPubSub': return new (await import('@mastra/core/events')).EventEmitterPubSub()
    case 'RedisLeaseProvider': return new pkg.RedisLeaseProvider({ ...where, keyPrefix })
    case 'RedisStreamsPubSub': return new pkg.RedisStreamsPubSub({ ...where, keyPrefix })
    case "Mastra's on node-redis": {
      const { createClient, createCluster } = await import('redis')
      const { MastraAlgorithm } = await import('./mastra-scripts.mjs')
      const client = MODE === 'cluster' ? createCluster({ rootNodes: url.split(',').map((u) => ({ url: u })) }) : createClient({ url })
      await client.connect()
      return new MastraAlgorithm(client, keyPrefix)
    }
  }
  throw new Error(`no contestant ${who}`)
}

/** Lifecycles `from`, `from + step`, ... below `units`, one at a time. */
async function lifecycles(p, from, step, units) {
  for (let i = from; i < units; i += step) {
    const k = `l${i}`
    const r = await p.acquireLease(k, 'a0', 30_000)
    const renewed = await p.renewLease(k, 'a0', 30_000)
    const o = await p.getLeaseOwner(k)
    const moved = await p.transferLease(k, 'a0', 'b0', 30_000)
    await p.releaseLease(k, 'b0')
    if (r.acquired !== true || renewed !== true || o !== 'a0' || moved !== true) throw new Error(`wrong answer at ${i}`)
  }
}

if (process.argv[2] === 'run') {
  await import('@mastra/core/events') // loaded by every contestant alike
  const p = await contestant(process.argv[3], process.argv[5])
  const units = Number(process.argv[4])
  await Promise.all(Array.from({ length: IN_FLIGHT }, (_, w) => lifecycles(p, w, IN_FLIGHT, units)))
  await p.close?.()
} else {
  const self = fileURLToPath(import.meta.url)
  let url
  const servers = []
  process.on('exit', () => servers.forEach((server) => server.kill()))
  /** A redis-server of its own on a free port, once it answers; its URL. */
  const redisServer = async (...args) => {
    const port = await new Promise((res) => { const l = createServer().listen(0, '127.0.0.1', () => { const { port: p } = l.address(); l.close(() => res(p)) }) })
    const dir = mkdtempSync(join(tmpdir(), 'instructions-'))
    servers.push(spawn('redis-server', ['--port', String(port), '--save', '', '--appendonly', 'no', '--dir', dir, ...args], { stdio: 'ignore' }))
    const { createClient } = await import('redis')
    const admin = createClient({ url: `redis://127.0.0.1:${port}` })
    admin.on('error', () => {})
    for (let tries = 0; ; tries++) {
      try { await admin.connect(); break } catch (e) { if (tries > 100) throw e; await sleep(100) }
    }
    await admin.close()
    return `redis://127.0.0.1:${port}`
  }
  if (MODE === 'redis') url = await redisServer()
  if (MODE === 'cluster') {
    const nodes = []
    for (let i = 0; i < 3; i++) nodes.push(await redisServer('--cluster-enabled', 'yes'))
    spawnSync('redis-cli', ['--cluster', 'create', ...nodes.map((u) => u.slice('redis://'.length)), '--cluster-yes'], { stdio: 'ignore' })
    const { createCluster } = await import('redis')
    for (let tries = 0; ; tries++) {
      const cluster = createCluster({ rootNodes: [{ url: nodes[0] }] })
      cluster.on('error', () => {})
      // Until every slot is served: a client made before may wait for a slot map for good.
      const ready = (async () => { await cluster.connect(); await cluster.set('ready', '1'); await cluster.close() })()
      ready.catch(() => {})
      let timer
      const late = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error('the cluster did not answer within 2 s')), 2_000) })
      try { await Promise.race([ready, late]); break } catch (e) { cluster.destroy(); if (tries > 100) throw e; await sleep(100) } finally { clearTimeout(timer) }
    }
    url = nodes.join(',')
  }
  // Instructions of one whole run, as callgrind reports them on stderr.
  const count = (who, units) => {
    const { stderr, status } = spawnSync('valgrind', ['--tool=callgrind', '--callgrind-out-file=/dev/null',
      process.execPath, '--predictable', self, 'run', who, String(units), ...(url ? [url] : [])], { encoding: 'utf8', timeout: 20 * 60_000 })
    if (status !== 0) throw new Error(`valgrind ${who} ${units}: exit ${status}\n${stderr}`)
    return Number(/Collected : (\d+)/.exec(stderr)?.[1] ?? NaN)
  }
  const who = { memory: ['ours', 'EventEmitterPubSub'], redis: ['RedisLeaseProvider', 'RedisStreamsPubSub', "Mastra's on node-redis"], cluster: ['RedisLeaseProvider', "Mastra's on node-redis"] }[MODE]
  const perCall = {}
  for (const w of who) {
    perCall[w] = (count(w, LONG) - count(w, SHORT)) / ((LONG - SHORT) * CALLS_PER_UNIT)
    console.log(`${w.padEnd(24)}${Math.round(perCall[w]).toLocaleString('en-US').padStart(8)} instructions per lease call`)
  }
  const peer = who[who.length - 1]
  for (const w of who.slice(0, -1)) console.log(`${w} / ${peer}: ${(perCall[w] / perCall[peer]).toFixed(2)}`)
  servers.forEach((server) => server.kill())
}
