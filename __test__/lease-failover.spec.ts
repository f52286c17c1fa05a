// Leases through a failover: a Redis Cluster master killed or a slot migrated while owners
// contend for keys, and a Sentinel master killed or switched (its demoted self then answers
// READONLY). With `minReplicas`, a grant is answered only once replicas hold it, so no failover
// can forget it: the history checker finds no two owners believing they hold one key, tokens
// only grow, and every call settles within commandTimeoutMs with a coded error at worst. The
// negative control cuts the replicas off and grants without `minReplicas`: after the failover a
// second owner takes the lease the first still believes it holds.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'

import { describe, expect, it } from 'vitest'

import { RedisStreamsPubSub, type RedisStreamsPubSubOptions } from '../dist/esm/index.js'
import { RedisLeaseProvider, type RedisLeaseProviderOptions } from '../index.js'
import { errorCode, sleep } from './helpers/lease.js'
import { checkLeaseHistory, describeOverlaps, monotonicNow, recordLeases, type LeaseOperation } from './helpers/lease-history.js'
import { closing, leaseSuite, msBetween, msToNs } from './helpers/lease-runs.js'
import { EXTERNAL_REDIS, type RedisServer } from './helpers/redis-server.js'
import { startCluster, startSentinel, type ClusterNode, type RedisCluster } from './helpers/redis-topologies.js'

leaseSuite()

const COMMAND_TIMEOUT = 1_500
const TTL = 2_000
/** What a call may reject with while a master is down or being replaced. */
const FAILOVER_CODES = ['ERR_LEASE_CONNECTION', 'ERR_LEASE_TIMEOUT', 'ERR_LEASE_REPLICATION']

type Where = Pick<RedisLeaseProviderOptions, 'cluster' | 'sentinel'>

interface Storm {
  ops: LeaseOperation[]
  /** Every grant's token, by key, in the order the grants returned. */
  tokens: Map<string, Array<{ owner: string; token: number }>>
  /** The longest any call took, in ms. */
  slowestMs: number
  /** Rejections without one of FAILOVER_CODES. */
  unexpected: unknown[]
  stop(): Promise<void>
}

/**
 * Owners contending for `keys`, one provider (one connection) each, calls sequential per owner:
 * acquire a random key; when granted, renew twice a tenth of the TTL apart, then release.
 */
function storm(where: Where, prefix: string, keys: string[], owners: number, options: Partial<RedisLeaseProviderOptions>): Storm {
  const ops: LeaseOperation[] = []
  const tokens = new Map<string, Array<{ owner: string; token: number }>>()
  let slowestMs = 0
  let stopped = false
  const unexpected: unknown[] = []
  const sink = (op: LeaseOperation) => {
    ops.push(op)
    slowestMs = Math.max(slowestMs, msBetween(op.start, op.end))
  }
  const loops = Array.from({ length: owners }, async (_, n) => {
    const owner = `owner-${n}`
    const leases = recordLeases(
      closing(new RedisLeaseProvider({ ...where, keyPrefix: prefix, commandTimeoutMs: COMMAND_TIMEOUT, ...options })),
      sink,
    )
    while (!stopped) {
      const key = keys[Math.floor(Math.random() * keys.length)]!
      try {
        const grant = (await leases.acquireLease(key, owner, TTL)) as { acquired: boolean; token?: number }
        if (grant.acquired) {
          const list = tokens.get(key) ?? []
          list.push({ owner, token: grant.token! })
          tokens.set(key, list)
          for (let r = 0; r < 2; r++) {
            await sleep(TTL / 10)
            if (!(await leases.renewLease(key, owner, TTL))) break
          }
          await leases.releaseLease(key, owner)
        }
      } catch (err) {
        if (!FAILOVER_CODES.includes(String(errorCode(err)))) unexpected.push(err)
        await sleep(20)
      }
      await sleep(Math.random() * 10)
    }
  })
  const all = Promise.all(loops)
  return {
    ops,
    tokens,
    unexpected,
    get slowestMs() {
      return slowestMs
    },
    async stop() {
      stopped = true
      await all
    },
  }
}

/** Failures of the token rule: per key, a grant to another owner must carry a greater token. */
function tokenRegressions(tokens: Storm['tokens']): string[] {
  const bad: string[] = []
  for (const [key, grants] of tokens) {
    for (let i = 1; i < grants.length; i++) {
      const [before, after] = [grants[i - 1]!, grants[i]!]
      const ok = after.owner === before.owner ? after.token >= before.token : after.token > before.token
      if (!ok) bad.push(`${key}: ${before.owner} had ${before.token}, then ${after.owner} got ${after.token}`)
    }
  }
  return bad
}

/** Checks a storm's history and answers the figures to report. */
function judge(run: Storm, since: bigint, keys: string[]) {
  expect(run.unexpected).toEqual([])
  const report = checkLeaseHistory(run.ops)
  expect(report.overlaps, describeOverlaps(report)).toEqual([])
  expect(report.lost, 'leases lost before their TTL ran out').toEqual([])
  expect(tokenRegressions(run.tokens)).toEqual([])
  // Every call settled within the command timeout (and a little for the event loop).
  expect(run.slowestMs).toBeLessThan(COMMAND_TIMEOUT + 500)
  const errors = run.ops.filter((o) => o.outcome === 'error')
  expect(errors.filter((o) => !FAILOVER_CODES.includes(String(o.error)))).toEqual([])
  const grantsAfter = run.ops.filter((o) => o.op === 'acquire' && o.outcome === 'ok' && o.start > since && keys.includes(o.key))
  expect(grantsAfter.length, 'grants on the failed-over keys after the fault').toBeGreaterThan(0)
  const firstAfter = grantsAfter.reduce((a, b) => (a.end < b.end ? a : b))
  const codes = [...new Set(errors.map((o) => o.error))].join(', ') || 'none'
  return `${run.ops.length} calls, ${report.grants} grants, 0 overlaps, 0 lost, ${errors.length} coded errors (${codes}), slowest call ${run.slowestMs.toFixed(0)} ms, first grant ${msBetween(since, firstAfter.end).toFixed(0)} ms after the fault`
}

/** Calls `grant` until no ERR_LEASE_REPLICATION (a replica still syncing) rejects it, for 10 s at most. */
async function untilConfirmed<T>(grant: () => Promise<T>): Promise<T> {
  const deadline = performance.now() + 10_000
  for (;;) {
    try {
      return await grant()
    } catch (err) {
      if (errorCode(err) !== 'ERR_LEASE_REPLICATION' || performance.now() > deadline) throw err
      await sleep(100)
    }
  }
}

/** `count` keys whose lease keys live on `master`'s slots. */
async function keysServedBy(cluster: RedisCluster, master: ClusterNode, prefix: string, count: number): Promise<string[]> {
  const keys: string[] = []
  for (let i = 0; keys.length < count; i++) {
    const key = `thread-${i}\u0000run`
    if ((await cluster.masterOfSlot(await cluster.keySlot(`${prefix}:lease:${key}`))) === master) keys.push(key)
  }
  return keys
}

/**
 * Cuts `master` off from its replicas: they are frozen first (so they cannot reconnect), then
 * the master drops their links. Nothing written after this reaches them.
 */
async function cutReplicas(master: RedisServer, replicas: RedisServer[]) {
  for (const r of replicas) r.freeze()
  await master.cli('CLIENT', 'KILL', 'TYPE', 'replica')
}

describe.skipIf(EXTERNAL_REDIS)('on a Redis Cluster', () => {
  it('a master killed mid-storm: with minReplicas 1 no two owners ever hold a key at once, tokens only grow, every call settles', async ({
    annotate,
  }) => {
    const cluster = await startCluster()
    try {
      const prefix = `failover:${randomUUID().slice(0, 8)}`
      const victim = (await cluster.masters())[0]!
      const keys = await keysServedBy(cluster, victim, prefix, 6)
      const run = storm({ cluster: { nodes: cluster.urls } }, prefix, keys, 6, { minReplicas: 1, replicaTimeoutMs: 500 })
      await sleep(1_000)
      const promotionMs = await cluster.killMasterAndWaitForPromotion(victim)
      // The helper times from the kill.
      const killedAt = monotonicNow() - msToNs(promotionMs)
      // Its one replica is master now, with no replica of its own: grants wait for the old
      // master to come back as one (minReplicas counts replicas that hold the write).
      await victim.restart()
      await cluster.waitHealthy(30_000)
      const rejoinedMs = msBetween(killedAt, monotonicNow())
      await sleep(1_000)
      await run.stop()
      await annotate(
        `cluster master killed: promoted in ${promotionMs.toFixed(0)} ms, back as a replica at ${rejoinedMs.toFixed(0)} ms; ${judge(run, killedAt, keys)}`,
      )
    } finally {
      await cluster.stop()
    }
  })

  it('a slot migrated to another master mid-storm: no two owners ever hold a key at once, every call settles', async ({ annotate }) => {
    const cluster = await startCluster()
    try {
      const prefix = `migrate:${randomUUID().slice(0, 8)}`
      // One hash tag: every lease key of the storm in one slot.
      const keys = Array.from({ length: 6 }, (_, i) => `{moving}-${i}`)
      const slot = await cluster.keySlot(`${prefix}:lease:${keys[0]}`)
      const run = storm({ cluster: { nodes: cluster.urls } }, prefix, keys, 6, {})
      await sleep(1_000)
      const from = await cluster.masterOfSlot(slot)
      const to = (await cluster.masters()).find((m) => m !== from)!
      const movedAt = monotonicNow()
      const moved = await cluster.migrateSlot(slot, to)
      const migrationMs = msBetween(movedAt, monotonicNow())
      await sleep(1_000)
      await run.stop()
      expect(await cluster.masterOfSlot(slot)).toBe(to)
      await annotate(`slot migrated (${moved} keys) in ${migrationMs.toFixed(0)} ms; ${judge(run, movedAt, keys)}`)
    } finally {
      await cluster.stop()
    }
  })

  it('with the replica cut off, minReplicas 1 refuses the grant, and without it the failover hands the key to a second owner (negative control)', async ({
    annotate,
  }) => {
    const outcomes: string[] = []
    for (const minReplicas of [1, 0]) {
      const cluster = await startCluster()
      try {
        const prefix = `cutoff:${randomUUID().slice(0, 8)}`
        const victim = (await cluster.masters())[0]!
        const [key] = await keysServedBy(cluster, victim, prefix, 1)
        const options = minReplicas > 0 ? { minReplicas, replicaTimeoutMs: 300 } : {}
        const ops: LeaseOperation[] = []
        const open = () =>
          recordLeases(
            closing(new RedisLeaseProvider({ cluster: { nodes: cluster.urls }, keyPrefix: prefix, commandTimeoutMs: COMMAND_TIMEOUT, ...options })),
            (op) => ops.push(op),
          )
        const [a, b] = [open(), open()]
        await a.getLeaseOwner(key!) // connected before the fault
        const replicas = await cluster.replicasOf(victim)
        await cutReplicas(victim, replicas)
        const first = await a.acquireLease(key!, 'a', 60_000).then(
          (g) => `granted ${JSON.stringify(g)}`,
          (err) => `rejected ${errorCode(err)}`,
        )
        await victim.kill()
        for (const r of replicas) r.thaw()
        await cluster.waitHealthy(30_000)
        // Back as the new master's replica, so a grant can be confirmed again.
        await victim.restart()
        await cluster.waitHealthy(30_000)
        const second = await untilConfirmed(() => b.acquireLease(key!, 'b', 60_000))
        // The first owner, still within its TTL, renews: refused if the failover forgot its grant.
        await a.renewLease(key!, 'a', 60_000)
        const report = checkLeaseHistory(ops)
        if (minReplicas > 0) {
          expect(first).toBe('rejected ERR_LEASE_REPLICATION')
          expect(report.overlaps).toEqual([])
          expect(report.lost).toEqual([])
        } else {
          // The grant lived on the dead master only: the promoted replica never saw it.
          expect(first).toMatch(/^granted .*"acquired":true/)
          expect(second.acquired).toBe(true)
          expect(report.overlaps.length).toBe(1)
          expect(report.lost.length).toBe(1)
        }
        outcomes.push(`minReplicas ${minReplicas}: first owner ${first.split(' {')[0]}, second owner acquired ${second.acquired}, ${report.overlaps.length} overlaps, ${report.lost.length} lost`)
      } finally {
        await cluster.stop()
      }
    }
    await annotate(outcomes.join('; '))
  })
})

describe.skipIf(EXTERNAL_REDIS)('behind Redis Sentinel', () => {
  const sentinelOf = (s: { sentinelUrls: string[]; masterName: string }) => ({ sentinel: { nodes: s.sentinelUrls, masterName: s.masterName } })
  const KEYS = Array.from({ length: 6 }, (_, i) => `thread-${i}\u0000run`)

  it('the master killed mid-storm: with minReplicas 1 no two owners ever hold a key at once, tokens only grow, every call settles', async ({
    annotate,
  }) => {
    const sentinel = await startSentinel()
    try {
      const run = storm(sentinelOf(sentinel), `failover:${randomUUID().slice(0, 8)}`, KEYS, 6, { minReplicas: 1, replicaTimeoutMs: 500 })
      await sleep(1_000)
      const failoverMs = await sentinel.killMasterAndWaitForFailover()
      const killedAt = monotonicNow() - msToNs(failoverMs)
      await sleep(2_000)
      await run.stop()
      await annotate(`sentinel master killed: replaced in ${failoverMs.toFixed(0)} ms; ${judge(run, killedAt, KEYS)}`)
    } finally {
      await sentinel.stop()
    }
  })

  it('SENTINEL FAILOVER mid-storm: calls follow the new master, the demoted one answering READONLY meanwhile', async ({ annotate }) => {
    const sentinel = await startSentinel()
    try {
      // Every replica: until the sentinels demote it, the old master takes writes and the
      // replica not promoted still confirms them, so a smaller number could lose them.
      const run = storm(sentinelOf(sentinel), `switch:${randomUUID().slice(0, 8)}`, KEYS, 6, { minReplicas: 2, replicaTimeoutMs: 500 })
      await sleep(1_000)
      const failoverMs = await sentinel.failover()
      const switchedAt = monotonicNow() - msToNs(failoverMs)
      // Until the sentinels reconfigure it, the old master still takes writes: wait for that.
      await sentinel.waitHealthy(30_000)
      await sleep(1_000)
      await run.stop()
      await annotate(`SENTINEL FAILOVER: switched in ${failoverMs.toFixed(0)} ms; ${judge(run, switchedAt, KEYS)}`)
    } finally {
      await sentinel.stop()
    }
  })

  it('after SENTINEL FAILOVER, grants reach the new master on the sentinels\' announcement (+switch-master), while the old one still takes writes', async ({
    annotate,
  }) => {
    const sentinel = await startSentinel()
    try {
      const prefix = `switch:${randomUUID().slice(0, 8)}`
      const leases = closing(new RedisLeaseProvider({ ...sentinelOf(sentinel), keyPrefix: prefix }))
      await leases.acquireLease('before', 'a', 60_000)
      const old = await sentinel.master()
      await sentinel.failover()
      const switchedAt = performance.now()
      const fresh = await sentinel.master()
      expect(fresh).not.toBe(old)
      // Fresh keys until one lands on the new master.
      let landedMs: number | undefined
      for (let i = 0; landedMs === undefined && performance.now() - switchedAt < 5_000; i++) {
        await leases.acquireLease(`after-${i}`, 'a', 60_000).catch(() => undefined)
        if ((await fresh.cli('GET', `${prefix}:lease:after-${i}`)) === 'a') landedMs = performance.now() - switchedAt
        else await sleep(20)
      }
      // Not the READONLY path: the old master had not been demoted yet.
      const oldRole = await old.role()
      expect(landedMs, 'a grant on the new master within 5 s of the switch').toBeDefined()
      expect(oldRole).toBe('master')
      await annotate(`a grant reached the new master ${landedMs!.toFixed(0)} ms after SENTINEL FAILOVER returned; the old master was still a ${oldRole}`)
    } finally {
      await sentinel.stop()
    }
  })

  it('with the replicas cut off, minReplicas 1 refuses the grant, and without it the failover hands the key to a second owner (negative control)', async ({
    annotate,
  }) => {
    const outcomes: string[] = []
    for (const minReplicas of [1, 0]) {
      const sentinel = await startSentinel()
      try {
        const key = KEYS[0]!
        const options = minReplicas > 0 ? { minReplicas, replicaTimeoutMs: 300 } : {}
        const ops: LeaseOperation[] = []
        const prefix = `cutoff:${randomUUID().slice(0, 8)}`
        const open = () =>
          recordLeases(
            closing(new RedisLeaseProvider({ ...sentinelOf(sentinel), keyPrefix: prefix, commandTimeoutMs: COMMAND_TIMEOUT, ...options })),
            (op) => ops.push(op),
          )
        const [a, b] = [open(), open()]
        await a.getLeaseOwner(key)
        const master = await sentinel.master()
        const replicas = sentinel.servers.filter((s) => s !== master)
        await cutReplicas(master, replicas)
        const first = await a.acquireLease(key, 'a', 60_000).then(
          (g) => `granted ${JSON.stringify(g)}`,
          (err) => `rejected ${errorCode(err)}`,
        )
        await master.kill()
        for (const r of replicas) r.thaw()
        await sentinel.waitHealthy(30_000)
        const second = await untilConfirmed(() => b.acquireLease(key, 'b', 60_000))
        // The first owner, still within its TTL, renews: refused if the failover forgot its grant.
        await a.renewLease(key, 'a', 60_000)
        const report = checkLeaseHistory(ops)
        if (minReplicas > 0) {
          expect(first).toBe('rejected ERR_LEASE_REPLICATION')
          expect(report.overlaps).toEqual([])
          expect(report.lost).toEqual([])
        } else {
          expect(first).toMatch(/^granted .*"acquired":true/)
          expect(second.acquired).toBe(true)
          expect(report.overlaps.length).toBe(1)
          expect(report.lost.length).toBe(1)
        }
        outcomes.push(`minReplicas ${minReplicas}: first owner ${first.split(' {')[0]}, second owner acquired ${second.acquired}, ${report.overlaps.length} overlaps, ${report.lost.length} lost`)
      } finally {
        await sentinel.stop()
      }
    }
    await annotate(outcomes.join('; '))
  })
})

describe.skipIf(EXTERNAL_REDIS)('ERR_LEASE_REPLICATION', () => {
  it.each([
    ['RedisLeaseProvider', (o: RedisLeaseProviderOptions) => new RedisLeaseProvider(o)],
    ["RedisStreamsPubSub's leases", (o: RedisLeaseProviderOptions) => new RedisStreamsPubSub(o as RedisStreamsPubSubOptions)],
  ] as const)(
    '%s: a grant no replica confirmed rejects in replicaTimeoutMs, stays on the master, and the same owner asking again is a refresh with the same token',
    async (_name, make) => {
      const sentinel = await startSentinel({ replicas: 1, downAfterMs: 5_000 })
      try {
        const options = { sentinel: { nodes: sentinel.sentinelUrls, masterName: sentinel.masterName }, keyPrefix: `unconfirmed:${randomUUID().slice(0, 8)}` }
        const [a, b] = [closing(make({ ...options, minReplicas: 1, replicaTimeoutMs: 300 })), closing(make(options))]
        const key = `thread\u0000${randomUUID().slice(0, 8)}`
        await a.getLeaseOwner(key)
        const master = await sentinel.master()
        const replica = sentinel.servers.find((s) => s !== master)!
        replica.freeze()
        try {
          const started = performance.now()
          const err = await a.acquireLease(key, 'a', 60_000).then(
            () => undefined,
            (e: unknown) => e,
          )
          const tookMs = performance.now() - started
          expect(errorCode(err)).toBe('ERR_LEASE_REPLICATION')
          expect(tookMs).toBeGreaterThanOrEqual(290)
          expect(tookMs).toBeLessThan(300 + 500)
          // The write ran on the master: the key is held by the caller, as documented.
          const held = await b.getLease(key)
          expect(held).toEqual({ owner: 'a', token: expect.any(Number), ttlMs: expect.any(Number) })
          expect(await master.cli('GET', `${options.keyPrefix}:lease:${key}`)).toBe('a')
          // Another owner is refused (a refusal writes nothing, so it waits for no replica).
          expect(await b.acquireLease(key, 'b', 60_000)).toEqual({ acquired: false, owner: 'a' })
          // Renewing it is a grant: unconfirmed, it rejects too.
          await expect(a.renewLease(key, 'a', 60_000)).rejects.toMatchObject({ code: 'ERR_LEASE_REPLICATION' })
        } finally {
          replica.thaw()
        }
        const held = (await b.getLease(key))!
        // The same owner asks again once the replica answers: the refresh is confirmed, same token.
        const again = await untilConfirmed(() => a.acquireLease(key, 'a', 60_000))
        expect(again).toEqual({ acquired: true, owner: 'a', token: held.token })
        // A release waits for no replica.
        replica.freeze()
        try {
          await a.releaseLease(key, 'a')
          expect(await b.getLeaseOwner(key)).toBeUndefined()
        } finally {
          replica.thaw()
        }
      } finally {
        await sentinel.stop()
      }
    },
  )
})
