// Bun and Deno, the npm registry's builds, load the package and its addon and run the lease
// lifecycle (in memory and on Redis), a streams round trip and Mastra's isLeaseProvider:
// fixtures/runtime-smoke.mjs under each. `.ci/run` installs both into target/runtimes.
// Without Node's loop a call on a Cluster goes through redis-rs' cluster connection on the
// runtime's thread: a frozen master is met there too (fixtures/runtime-cluster-frozen.mjs).
import { spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { RUN } from './helpers/lease-runs.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

const root = path.resolve(__dirname, '..')
const modules = path.join(root, 'target', 'runtimes', 'node_modules')
const runtimes = [
  { name: 'Bun', binary: path.join(modules, '@oven', 'bun-linux-x64', 'bin', 'bun'), args: [] as string[] },
  { name: 'Deno', binary: path.join(modules, '@deno', 'linux-x64-glibc', 'deno'), args: ['run', '--allow-all'] },
]
const installed = runtimes.filter((r) => existsSync(r.binary))
const lifecycle = [true, true, 'a', true, 'b', null, null]
const FROZEN_CALL_TIMEOUT_MS = 250

let server: RedisServer
let cluster: RedisCluster
beforeAll(async () => {
  if (installed.length === 0) return
  server = await startRedis()
  // Failure detection well beyond the frozen test's length: its master stays a master.
  cluster = await startCluster({ replicasPerMaster: 0, nodeTimeoutMs: 15_000 })
}, 60_000)
afterAll(async () => {
  await Promise.all([server?.stop(), cluster?.stop()])
})

describe('other runtimes', () => {
  it.for(runtimes)('$name loads the package and runs the lease lifecycle, a streams round trip and isLeaseProvider', { timeout: 90_000 }, (runtime, { skip }) => {
    // Without them each test is skipped saying so (the run's summary lists the reason).
    skip(installed.length === 0, 'Bun and Deno are not in target/runtimes (.ci/run installs them)')
    expect(existsSync(runtime.binary), `${runtime.binary}: .ci/run installs it`).toBe(true)
    const run = spawnSync(runtime.binary, [...runtime.args, path.join(__dirname, 'fixtures', 'runtime-smoke.mjs')], {
      cwd: root,
      env: { ...process.env, REDIS_URL: server.url, NO_COLOR: '1', DENO_NO_UPDATE_CHECK: '1' },
      encoding: 'utf8',
      timeout: 60_000,
    })
    expect(run.error).toBeUndefined()
    expect(run.status, run.stderr).toBe(0)
    const seen = JSON.parse(run.stdout.trim().split('\n').pop()!) as Record<string, unknown>
    expect(seen).toEqual({ memory: lifecycle, redis: lifecycle, pubsub: lifecycle, isLeaseProvider: [true, true, true], delivered: { n: 42 } })
  })

  it.for(runtimes)('$name: a master frozen, the first seed named, once its call timed out, every call of another master answers true within the bound while it stays frozen, the connection it timed out on is replaced once it answers, and one made while it is frozen answers within a few bounds', { timeout: 90_000 }, async (runtime, { skip }) => {
    skip(installed.length === 0, 'Bun and Deno are not in target/runtimes (.ci/run installs them)')
    const stored = (key: string) => `runtime-frozen:${RUN}:lease:${key}`
    const masterOf = async (key: string) => cluster.masterOfSlot(await cluster.keySlot(stored(key)))
    const frozen = await masterOf('{f}')
    let elsewhere = 0
    while ((await masterOf(`{e${elsewhere}}`)).port === frozen.port) elsewhere++
    const nodes = [frozen.url, ...cluster.urls.filter((url) => url !== frozen.url)]
    const run = spawnSync(runtime.binary, [...runtime.args, path.join(__dirname, 'fixtures', 'runtime-cluster-frozen.mjs')], {
      cwd: root,
      env: {
        ...process.env, NO_COLOR: '1', DENO_NO_UPDATE_CHECK: '1',
        CLUSTER_NODES: nodes.join(','), KEY_PREFIX: `runtime-frozen:${RUN}`, FROZEN_KEY: '{f}', OTHER_KEY: `{e${elsewhere}}`,
        FROZEN_PID: String(frozen.pid), FROZEN_PORT: String(frozen.port), TIMEOUT_MS: String(FROZEN_CALL_TIMEOUT_MS),
      },
      encoding: 'utf8',
      timeout: 60_000,
    })
    if (frozen.pid !== undefined) process.kill(frozen.pid, 'SIGCONT') // the fixture thaws it unless it died first
    expect(run.error).toBeUndefined()
    expect(run.status, run.stderr).toBe(0)
    const seen = JSON.parse(run.stdout.trim().split('\n').pop()!) as Record<string, { slowestMs: number; connections: { before: number }; startedFrozen: { others: unknown[]; withinMs: number } }>
    for (const kind of ['RedisLeaseProvider', 'RedisStreamsPubSub']) {
      expect(seen[kind], kind).toEqual({
        acquired: [true, true], frozen: 'ERR_LEASE_TIMEOUT', other: Array(20).fill(true), slowestMs: seen[kind]!.slowestMs, thawed: true,
        // The cluster connection the call timed out on was replaced by a fresh one: a node's
        // connection gone silent (a host vanished) does not stay.
        connections: { before: seen[kind]!.connections.before, replaced: true }, renewedAfter: true,
        // Made while the seed is frozen: its first calls may run out of time while the cluster
        // connection opens without that seed, which goes on opening meanwhile.
        startedFrozen: { last: true, others: seen[kind]!.startedFrozen.others, withinMs: seen[kind]!.startedFrozen.withinMs },
      })
      expect(seen[kind]!.slowestMs, kind).toBeLessThan(FROZEN_CALL_TIMEOUT_MS)
      for (const other of seen[kind]!.startedFrozen.others) expect(other, kind).toBe('ERR_LEASE_TIMEOUT')
      expect(seen[kind]!.startedFrozen.withinMs, kind).toBeLessThan(8 * FROZEN_CALL_TIMEOUT_MS)
    }
  })
})
