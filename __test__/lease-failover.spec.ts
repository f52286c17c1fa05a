// Leases through a failover: a Redis Cluster master killed or a slot migrated while four
// processes contend for keys (helpers/lease-storm.ts), and a Sentinel master killed or
// switched. With `minReplicas`, a grant is answered only once replicas hold it, so no failover
// can forget it: the history checker finds no two owners believing they hold one key and no
// lease lost before its TTL, no counter update is lost, tokens only grow, and every call
// settles within commandTimeoutMs, with a coded error at worst. The negative control cuts the
// replicas off and grants without `minReplicas`: after the failover a second owner takes the
// lease the first still believes it holds.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'

import { describe, expect, it } from 'vitest'

import { RedisStreamsPubSub, type RedisStreamsPubSubOptions } from '../dist/esm/index.js'
import { RedisLeaseProvider, type RedisLeaseProviderOptions } from '../index.js'
import { errorCode, leaseFailureWarnings, sleep } from './helpers/lease.js'
import { checkLeaseHistory, describeOverlaps, monotonicNow, recordLeases, type LeaseOperation } from './helpers/lease-history.js'
import { leaseStorm, lostWithoutPause, unprotectedWithoutPause, type StormResult } from './helpers/lease-storm.js'
import { closing, leaseSuite, msBetween, msToNs } from './helpers/lease-runs.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { startCluster, type ClusterNode, type RedisCluster } from './helpers/redis-cluster.js'
import { startSentinel } from './helpers/redis-sentinel.js'

leaseSuite()
// Calls failing across a failover warn through process.emitWarning (no logger here).
const leaseWarnings = leaseFailureWarnings()

const COMMAND_TIMEOUT = 1_500
/**
 * What a call may reject with while a master is down or being replaced. A call whose
 * connection broke after it was sent may be told its outcome is unknown (a transfer sent again
 * on one server, through Sentinel, whose lease moved on): a true answer, checked by the history.
 */
const FAILOVER_CODES = ['ERR_LEASE_CONNECTION', 'ERR_LEASE_TIMEOUT', 'ERR_LEASE_REPLICATION', 'ERR_LEASE_OUTCOME_UNKNOWN']

/**
 * Four processes contending for `keys` for `durationMs`, while `fault()` runs: acquire,
 * renew, transfer, release and walk away at random, with a read-sleep-write increment of the
 * key's counter while a process believes it holds the key.
 */
function storm(connection: RedisLeaseProviderOptions, keys: string[], durationMs: number, fault: () => Promise<void>): Promise<StormResult> {
  return leaseStorm(
    { commandTimeoutMs: COMMAND_TIMEOUT, ...connection },
    `storm:${randomUUID().slice(0, 8)}`,
    { workers: 4, keys, durationMs, maxOps: 1_000_000, ttlMinMs: 300, ttlMaxMs: 900, paceMs: 8, walkAway: 0.02, broken: false },
    fault,
  )
}

/**
 * Failures of the token rule: per key, a grant to another owner carries a greater token. The
 * grants are the fenced acquires and the transfers whose new holder read its token (the
 * storm's workers do both), each to its holder (a transfer's `to`).
 */
function tokenRegressions(ops: LeaseOperation[]): string[] {
  const bad: string[] = []
  const last = new Map<string, { holder: string; token: number }>()
  const grants = ops
    .filter((o) => o.outcome === 'ok' && (o.op === 'acquire' || (o.op === 'transfer' && o.token !== undefined)))
    .sort((a, b) => (a.end < b.end ? -1 : 1))
  for (const grant of grants) {
    const holder = grant.op === 'transfer' ? grant.to! : grant.owner
    const before = last.get(grant.key)
    last.set(grant.key, { holder, token: grant.token! })
    if (!before) continue
    const ok = holder === before.holder ? grant.token! >= before.token : grant.token! > before.token
    if (!ok) bad.push(`${grant.key}: ${before.holder} had ${before.token}, then ${holder} got ${grant.token} (${grant.op})`)
  }
  return bad
}

/** Checks a storm and answers the figures to report: `since` is when the fault began. */
function judge({ history, report, counters }: StormResult, since: bigint, keys: string[]) {
  const ops = history.operations
  expect(history.summaries).toHaveLength(4)
  expect(report.overlaps, describeOverlaps(report)).toEqual([])
  expect(report.lost, 'leases lost before their TTL ran out').toEqual([])
  expect(unprotectedWithoutPause(report)).toEqual([])
  expect(lostWithoutPause(report, counters), 'no update lost but where a section was paused past the margin').toEqual([])
  expect(tokenRegressions(ops)).toEqual([])
  expect(ops.filter((o) => o.op === 'acquire' && o.outcome === 'ok').every((o) => Number.isSafeInteger(o.token))).toBe(true)
  // The transfers' tokens were read, so they were checked too (a read can fail in a failover).
  const transfers = ops.filter((o) => o.op === 'transfer' && o.outcome === 'ok')
  expect(transfers.filter((o) => Number.isSafeInteger(o.token)).length).toBeGreaterThan(transfers.length / 2)
  // Every call settled within the command timeout (and a little for the event loop).
  const slowestMs = Math.max(...ops.map((o) => msBetween(o.start, o.end)))
  expect(slowestMs).toBeLessThan(COMMAND_TIMEOUT + 500)
  const errors = ops.filter((o) => o.outcome === 'error')
  expect(errors.filter((o) => !FAILOVER_CODES.includes(String(o.error)))).toEqual([])
  const grantsAfter = ops.filter((o) => o.op === 'acquire' && o.outcome === 'ok' && o.start > since && keys.includes(o.key))
  expect(grantsAfter.length, 'grants on the failed-over keys after the fault').toBeGreaterThan(0)
  const firstAfter = grantsAfter.reduce((a, b) => (a.end < b.end ? a : b))
  const codes = [...new Set(errors.map((o) => o.error))].join(', ') || 'none'
  const lastError = errors.reduce((at, o) => (o.end > at ? o.end : at), since)
  const increments = counters.reduce((n, c) => n + c.increments, 0)
  return (
    `${ops.length} calls from 4 processes, ${report.grants} grants, 0 overlaps, 0 lost leases, ${increments} increments and 0 lost, ` +
    `${errors.length} coded errors (${codes}), the last ${msBetween(since, lastError).toFixed(0)} ms after the fault, slowest call ${slowestMs.toFixed(0)} ms, ` +
    `first grant on its keys ${msBetween(since, firstAfter.end).toFixed(0)} ms after the fault`
  )
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

/**
 * `count` keys whose leases live on `master`'s slots. Each key carries a hash tag, so its
 * slot is the tag's under any key prefix.
 */
async function keysServedBy(cluster: RedisCluster, master: ClusterNode, count: number): Promise<string[]> {
  const keys: string[] = []
  for (let i = 0; keys.length < count; i++) {
    if ((await cluster.masterOfSlot(await cluster.keySlot(`{${i}}`))) === master) keys.push(`{${i}}thread\u0000run`)
  }
  return keys
}

/** A topology set up for the cut-off control: a key, the master serving it and its replicas. */
interface CutOff {
  connection: RedisLeaseProviderOptions
  key: string
  master: RedisServer
  replicas: RedisServer[]
  /** After the master died and its replicas thawed: until a promoted master serves the key. */
  recover(): Promise<void>
  stop(): Promise<void>
}

/**
 * The negative control and its counterpart, each on a fresh topology: the replicas cut off,
 * owner a is granted (minReplicas 0) or refused (minReplicas 1) the key, the master dies, and
 * after the failover owner b asks for the key and a renews. Answers the figures to report.
 */
async function cutOffControl(setUp: () => Promise<CutOff>): Promise<string> {
  const outcomes: string[] = []
  for (const minReplicas of [1, 0]) {
    const t = await setUp()
    try {
      const options = minReplicas > 0 ? { minReplicas, replicaTimeoutMs: 300 } : {}
      const ops: LeaseOperation[] = []
      const prefix = `cutoff:${randomUUID().slice(0, 8)}`
      const open = () =>
        recordLeases(
          closing(new RedisLeaseProvider({ ...t.connection, keyPrefix: prefix, commandTimeoutMs: COMMAND_TIMEOUT, ...options })),
          (op) => ops.push(op),
        )
      const [a, b] = [open(), open()]
      await a.getLeaseOwner(t.key) // connected before the fault
      await cutReplicas(t.master, t.replicas)
      const first = await a.acquireLease(t.key, 'a', 60_000).then(
        (g) => `granted ${JSON.stringify(g)}`,
        (err) => `rejected ${errorCode(err)}`,
      )
      await t.master.kill()
      for (const r of t.replicas) r.thaw()
      await t.recover()
      const second = await untilConfirmed(() => b.acquireLease(t.key, 'b', 60_000))
      // The first owner, still within its TTL, renews: refused if the failover forgot its grant.
      await a.renewLease(t.key, 'a', 60_000)
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
      await t.stop()
    }
  }
  return outcomes.join('; ')
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
      const victim = (await cluster.masters())[0]!
      const keys = await keysServedBy(cluster, victim, 4)
      let killedAt = 0n
      let figures = ''
      const run = await storm({ cluster: { nodes: cluster.urls }, minReplicas: 1, replicaTimeoutMs: 500 }, keys, 7_000, async () => {
        await sleep(1_500)
        const promotionMs = await cluster.killMasterAndWaitForPromotion(victim)
        // The helper times from the kill.
        killedAt = monotonicNow() - msToNs(promotionMs)
        // Its one replica is master now, with no replica of its own: grants wait for the old
        // master to come back as one (minReplicas counts replicas that hold the write).
        await victim.restart()
        await cluster.waitHealthy(30_000)
        figures = `promoted in ${promotionMs.toFixed(0)} ms, back as a replica at ${msBetween(killedAt, monotonicNow()).toFixed(0)} ms`
      })
      await annotate(`cluster master killed: ${figures}; ${judge(run, killedAt, keys)}`)
    } finally {
      await cluster.stop()
    }
  })

  it('a slot migrated to another master mid-storm: no two owners ever hold a key at once, every call settles', async ({ annotate }) => {
    const cluster = await startCluster()
    try {
      // One hash tag: every lease key of the storm in one slot.
      const keys = Array.from({ length: 4 }, (_, i) => `{moving}-${i}`)
      const slot = await cluster.keySlot('{moving}')
      let movedAt = 0n
      let figures = ''
      let to: ClusterNode | undefined
      const run = await storm({ cluster: { nodes: cluster.urls } }, keys, 4_000, async () => {
        await sleep(1_500)
        const from = await cluster.masterOfSlot(slot)
        to = (await cluster.masters()).find((m) => m !== from)!
        movedAt = monotonicNow()
        const moved = await cluster.migrateSlot(slot, to)
        figures = `slot migrated (${moved} keys) in ${msBetween(movedAt, monotonicNow()).toFixed(0)} ms`
      })
      expect(await cluster.masterOfSlot(slot)).toBe(to)
      await annotate(`${figures}; ${judge(run, movedAt, keys)}`)
    } finally {
      await cluster.stop()
    }
  })

  it('with the replica cut off, minReplicas 1 refuses the grant, and without it the failover hands the key to a second owner (negative control)', async ({
    annotate,
  }) => {
    const outcomes = await cutOffControl(async () => {
      const cluster = await startCluster()
      const victim = (await cluster.masters())[0]!
      const [key] = await keysServedBy(cluster, victim, 1)
      return {
        connection: { cluster: { nodes: cluster.urls } },
        key: key!,
        master: victim,
        replicas: await cluster.replicasOf(victim),
        async recover() {
          await cluster.waitHealthy(30_000)
          // Back as the new master's replica, so a grant can be confirmed again.
          await victim.restart()
          await cluster.waitHealthy(30_000)
        },
        stop: () => cluster.stop(),
      }
    })
    await annotate(outcomes)
  })
})

describe.skipIf(EXTERNAL_REDIS)('behind Redis Sentinel', () => {
  const sentinelOf = (s: { sentinelUrls: string[]; masterName: string }) => ({ sentinel: { nodes: s.sentinelUrls, masterName: s.masterName } })
  const KEYS = Array.from({ length: 4 }, (_, i) => `thread-${i}\u0000run`)

  it('the master killed mid-storm: with minReplicas 1 no two owners ever hold a key at once, tokens only grow, every call settles', async ({
    annotate,
  }) => {
    const sentinel = await startSentinel()
    try {
      let killedAt = 0n
      let failoverMs = 0
      const run = await storm({ ...sentinelOf(sentinel), minReplicas: 1, replicaTimeoutMs: 500 }, KEYS, 6_000, async () => {
        await sleep(1_500)
        failoverMs = await sentinel.killMasterAndWaitForFailover()
        killedAt = monotonicNow() - msToNs(failoverMs)
      })
      await annotate(`sentinel master killed: replaced in ${failoverMs.toFixed(0)} ms; ${judge(run, killedAt, KEYS)}`)
    } finally {
      await sentinel.stop()
    }
  })

  it('SENTINEL FAILOVER mid-storm: with minReplicas 2 no two owners ever hold a key at once, tokens only grow, and calls follow the new master', async ({
    annotate,
  }) => {
    const sentinel = await startSentinel()
    try {
      let switchedAt = 0n
      let failoverMs = 0
      // Every replica: until the sentinels demote it, the old master takes writes and the
      // replica not promoted still confirms them, so a smaller number could lose them.
      const run = await storm({ ...sentinelOf(sentinel), minReplicas: 2, replicaTimeoutMs: 500 }, KEYS, 16_000, async () => {
        await sleep(1_500)
        failoverMs = await sentinel.failover()
        switchedAt = monotonicNow() - msToNs(failoverMs)
      })
      await annotate(`SENTINEL FAILOVER: switched in ${failoverMs.toFixed(0)} ms; ${judge(run, switchedAt, KEYS)}`)
    } finally {
      await sentinel.stop()
    }
  })

  it('after SENTINEL FAILOVER, grants reach the new master on the sentinels\' announcement (+switch-master), on every connection of the provider, while the old one still takes writes', async ({
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
      // Every connection of the provider follows the one announcement: keys spread over both
      // of its connections all land on the new master.
      for (let i = 0; i < 20; i++) {
        expect(await leases.acquireLease(`spread-${i}`, 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
        expect(await fresh.cli('GET', `${prefix}:lease:spread-${i}`), `spread-${i} on the new master`).toBe('a')
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

  it('a master demoted behind the sentinels\' back answers READONLY: calls reject coded, none is granted by a replica, and they succeed again once it is master again', async () => {
    const sentinel = await startSentinel()
    try {
      const prefix = `demoted:${randomUUID().slice(0, 8)}`
      const leases = closing(new RedisLeaseProvider({ ...sentinelOf(sentinel), keyPrefix: prefix, commandTimeoutMs: COMMAND_TIMEOUT }))
      expect((await leases.acquireLease('before', 'a', 60_000)).acquired).toBe(true)
      const master = await sentinel.master()
      // Demoted without a failover (to replicate a server of its own): the sentinels still
      // name it, and announce nothing.
      const elsewhere = await startRedis()
      await master.cli('REPLICAOF', elsewhere.host, elsewhere.port)
      try {
        const during = await Promise.allSettled([leases.acquireLease('during', 'a', 60_000), leases.renewLease('before', 'a', 60_000)])
        expect(during.map((r) => (r.status === 'rejected' ? errorCode(r.reason) : r.value))).toEqual(['ERR_LEASE_CONNECTION', 'ERR_LEASE_CONNECTION'])
        expect(await master.cli('EXISTS', `${prefix}:lease:during`)).toBe(0)
        await leaseWarnings.warned('ERR_LEASE_CONNECTION')
      } finally {
        await master.cli('REPLICAOF', 'NO', 'ONE')
        await elsewhere.stop()
      }
      const deadline = performance.now() + 5_000
      let after: unknown
      while (after === undefined && performance.now() < deadline) {
        after = await leases.acquireLease('after', 'a', 60_000).catch(() => sleep(50).then(() => undefined))
      }
      expect(after).toMatchObject({ acquired: true })
    } finally {
      await sentinel.stop()
    }
  })

  it('with the replicas cut off, minReplicas 1 refuses the grant, and without it the failover hands the key to a second owner (negative control)', async ({
    annotate,
  }) => {
    const outcomes = await cutOffControl(async () => {
      const sentinel = await startSentinel()
      const master = await sentinel.master()
      return {
        connection: sentinelOf(sentinel),
        key: KEYS[0]!,
        master,
        replicas: sentinel.servers.filter((s) => s !== master),
        recover: () => sentinel.waitHealthy(30_000),
        stop: () => sentinel.stop(),
      }
    })
    await annotate(outcomes)
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
          const err = await a.acquireFencedLease!(key, 'a', 60_000).then(
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
          expect(await b.acquireLease(key, 'b', 60_000)).toStrictEqual({ acquired: false, owner: 'a' })
          // Renewing it is a grant: unconfirmed, it rejects too.
          await expect(a.renewLease(key, 'a', 60_000)).rejects.toMatchObject({ code: 'ERR_LEASE_REPLICATION' })
          await leaseWarnings.warned('ERR_LEASE_REPLICATION')
        } finally {
          replica.thaw()
        }
        const held = (await b.getLease(key))!
        // The same owner asks again once the replica answers: the refresh is confirmed, same token.
        const again = await untilConfirmed(() => a.acquireFencedLease!(key, 'a', 60_000))
        expect(held.token).toEqual(expect.any(Number))
        expect(again).toStrictEqual({ acquired: true, owner: 'a', token: held.token })
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
