// The Redis Cluster and Redis Sentinel harness (helpers/redis-cluster.ts and
// helpers/redis-sentinel.ts) on its own: both topologies start healthy on free ports, a
// SIGKILLed master is replaced, a slot moves with its keys, and stop() leaves no process and
// no temp dir behind. The timings go to the run's figures.
import { existsSync } from 'node:fs'
import path from 'node:path'
import { performance } from 'node:perf_hooks'

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { connectClient, EXTERNAL_REDIS, type RespValue } from './helpers/redis-server.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { startSentinel, type RedisSentinel } from './helpers/redis-sentinel.js'
import type { TopologyNode } from './helpers/redis-process.js'

const ms = (n: number) => `${Math.round(n)} ms`

function processGone(pid: number | undefined): boolean {
  if (pid === undefined) return true
  try {
    process.kill(pid, 0)
    return false
  } catch {
    return true
  }
}

async function expectStoppedClean(nodes: TopologyNode[], stop: () => Promise<void>) {
  const pids = nodes.map((n) => n.pid)
  const root = path.dirname(nodes[0]!.dir)
  expect(existsSync(root)).toBe(true)
  await stop()
  for (const pid of pids) expect(processGone(pid), `process ${pid}`).toBe(true)
  expect(existsSync(root)).toBe(false)
  for (const node of nodes) expect(node.running).toBe(false)
  await stop() // idempotent
}

describe.skipIf(EXTERNAL_REDIS)('a password-protected Redis Cluster of 3 masters with one replica each', () => {
  const password = 'cluster-secret'
  let cluster: RedisCluster
  let startMs = 0

  beforeAll(async () => {
    const t0 = performance.now()
    cluster = await startCluster({ password })
    startMs = performance.now() - t0
  })
  afterAll(() => cluster?.stop())

  it('starts with cluster_state ok on every node, three masters and three replicas whose links are up', async ({ annotate }) => {
    await annotate(`cluster of ${cluster.nodes.length} nodes started in ${ms(startMs)}`)
    expect(cluster.nodes).toHaveLength(6)
    expect(cluster.urls).toEqual(cluster.nodes.map((n) => `redis://127.0.0.1:${n.port}`))
    for (const node of cluster.nodes) {
      expect(node.port).not.toBe(6379)
      expect(String(await node.cli('CLUSTER', 'INFO'))).toContain('cluster_state:ok')
    }
    const masters = await cluster.masters()
    const replicas = await cluster.replicas()
    expect(masters).toHaveLength(3)
    expect(replicas).toHaveLength(3)
    for (const replica of replicas) expect((await replica.info('replication'))['master_link_status']).toBe('up')
    for (const master of masters) expect(await cluster.replicasOf(master)).toHaveLength(1)
    expect(await cluster.health()).toBeUndefined()
  })

  it('refuses a client that does not authenticate', async () => {
    const anonymous = await connectClient({ host: '127.0.0.1', port: cluster.nodes[0]!.port })
    try {
      await expect(anonymous.ping()).rejects.toThrow(/NOAUTH/)
    } finally {
      anonymous.destroy()
    }
  })

  it('moves a slot with its keys to another master, which then owns the slot and serves the keys', async ({ annotate }) => {
    const keys = ['{moving}a', '{moving}b', '{moving}c']
    const slot = await cluster.keySlot(keys[0]!)
    expect(slot).toBe(Number(await cluster.nodes[3]!.cli('CLUSTER', 'KEYSLOT', '{moving}zzz')))
    const from = await cluster.masterOfSlot(slot)
    for (const key of keys) await from.cli('SET', key, `value of ${key}`)
    const to = (await cluster.masters()).find((m) => m !== from)!

    const t0 = performance.now()
    const moved = await cluster.migrateSlot(slot, to)
    await annotate(`slot ${slot} with ${moved} keys moved in ${ms(performance.now() - t0)}`)

    expect(moved).toBe(keys.length)
    expect(await cluster.masterOfSlot(slot)).toBe(to)
    for (const key of keys) expect(await to.cli('GET', key)).toBe(`value of ${key}`)
    expect(Number(await from.cli('CLUSTER', 'COUNTKEYSINSLOT', slot))).toBe(0)
    await expect(from.cli('GET', keys[0]!)).rejects.toThrow(`MOVED ${slot} 127.0.0.1:${to.port}`)
    for (const node of cluster.nodes) {
      const owner = ((await node.cli('CLUSTER', 'SLOTS')) as RespValue[][]).find((r) => Number(r[0]) <= slot && slot <= Number(r[1]))
      expect(Number((owner![2] as RespValue[])[1]), node.name).toBe(to.port)
    }
  })

  it('promotes the replica of a SIGKILLed master with the acknowledged writes, and takes the old master back as a replica after restart', async ({ annotate }) => {
    const key = '{promotion}k'
    const slot = await cluster.keySlot(key)
    const master = await cluster.masterOfSlot(slot)
    const [replica] = await cluster.replicasOf(master)
    await master.cli('SET', key, 'kept')
    expect(await master.cli('WAIT', 1, 2000)).toBe(1)

    const promotionMs = await cluster.killMasterAndWaitForPromotion(master)
    await annotate(`replica promoted and cluster_state ok ${ms(promotionMs)} after SIGKILL of the master (cluster-node-timeout 1000 ms)`)

    expect(master.running).toBe(false)
    expect(await cluster.masterOfSlot(slot)).toBe(replica)
    expect(await replica!.role()).toBe('master')
    expect(await replica!.cli('GET', key)).toBe('kept')
    expect(await cluster.masters()).toHaveLength(3)

    const t0 = performance.now()
    await master.restart()
    await cluster.waitHealthy()
    await annotate(`old master back as a replica, cluster healthy, ${ms(performance.now() - t0)} after restart`)
    expect(await cluster.replicasOf(replica!)).toEqual([master])
  })

  it('fails back on CLUSTER FAILOVER from the replica', async ({ annotate }) => {
    const [replica] = await cluster.replicas()
    const failoverMs = await cluster.failover(replica!)
    await annotate(`CLUSTER FAILOVER done in ${ms(failoverMs)}`)
    expect(await replica!.role()).toBe('master')
  })

  it('stops every node and removes the temp dir', async () => {
    await expectStoppedClean(cluster.nodes, () => cluster.stop())
  })
})

describe.skipIf(EXTERNAL_REDIS)('a Redis master with two replicas watched by three sentinels', () => {
  let sentinel: RedisSentinel
  let startMs = 0

  beforeAll(async () => {
    const t0 = performance.now()
    sentinel = await startSentinel()
    startMs = performance.now() - t0
  })
  afterAll(() => sentinel?.stop())

  it('starts with every sentinel reporting the master and knowing the replicas and the other sentinels', async ({ annotate }) => {
    await annotate(`master, 2 replicas and 3 sentinels started in ${ms(startMs)}`)
    expect(sentinel.masterName).toBe('mymaster')
    expect(sentinel.servers).toHaveLength(3)
    expect(sentinel.sentinels).toHaveLength(3)
    expect(sentinel.sentinelUrls).toEqual(sentinel.sentinels.map((s) => `redis://127.0.0.1:${s.port}`))
    const master = await sentinel.master()
    expect(master).toBe(sentinel.servers[0])
    expect(await master.role()).toBe('master')
    for (const s of sentinel.sentinels) {
      expect(await s.role()).toBe('sentinel')
      expect(await s.cli('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', 'mymaster')).toEqual(['127.0.0.1', String(master.port)])
      expect(await s.cli('SENTINEL', 'REPLICAS', 'mymaster')).toHaveLength(2)
      expect(await s.cli('SENTINEL', 'SENTINELS', 'mymaster')).toHaveLength(2)
      expect(String(await s.cli('SENTINEL', 'CKQUORUM', 'mymaster'))).toMatch(/^OK/)
    }
  })

  it('fails over to a replica when the master is SIGKILLed, and every sentinel reports the new master', async ({ annotate }) => {
    const before = await sentinel.master()
    await before.cli('SET', 'sentinel-key', 'kept')
    expect(await before.cli('WAIT', 2, 2000)).toBe(2)

    const failoverMs = await sentinel.killMasterAndWaitForFailover()
    await annotate(`sentinels switched to a new master ${ms(failoverMs)} after SIGKILL (down-after 1000 ms)`)

    const after = await sentinel.master()
    expect(after).not.toBe(before)
    expect(before.running).toBe(false)
    expect(await after.role()).toBe('master')
    expect(await after.cli('GET', 'sentinel-key')).toBe('kept')
    for (const s of sentinel.sentinels) {
      expect(await s.cli('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', 'mymaster')).toEqual(['127.0.0.1', String(after.port)])
    }
    const t0 = performance.now()
    await sentinel.waitHealthy()
    await annotate(`the other replica follows the new master ${ms(performance.now() - t0)} after the switch`)
    const [other] = sentinel.servers.filter((s) => s !== before && s !== after)
    expect((await other!.info('replication'))['master_port']).toBe(String(after.port))
  })


  it('switches the master again on SENTINEL FAILOVER', async ({ annotate }) => {
    const before = await sentinel.master()
    const failoverMs = await sentinel.failover()
    await annotate(`SENTINEL FAILOVER switched the master in ${ms(failoverMs)}`)
    const after = await sentinel.master()
    expect(after).not.toBe(before)
    expect(await after.role()).toBe('master')
    expect(await after.cli('GET', 'sentinel-key')).toBe('kept')
  })

  it('stops every process and removes the temp dir', async () => {
    await expectStoppedClean([...sentinel.servers, ...sentinel.sentinels], () => sentinel.stop())
  })
})
