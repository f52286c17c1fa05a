// Servers that lack a command: a managed service or a fork leaves it out, an operator renames
// it away, an ACL user may not run it. Each case runs against a real redis-server whose
// commands are renamed to nothing (`--rename-command X ""`) or an ACL user without them.
// Waiting falls back (classic PUBLISH/SUBSCRIBE, else the holder's TTL) with one warning;
// what cannot work without its command (EVALSHA) fails with a code naming it.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisLeaseProvider, RedisStreamsPubSub } from '../dist/esm/index.js'
import { CollectingLogger, expectRejection, pending, sleep } from './helpers/lease.js'
import { ev, Inbox, recordingLogger } from './helpers/streams.js'
import { closing, leaseSuite, stopLater } from './helpers/lease-runs.js'
import { EXTERNAL_REDIS, startRedis } from './helpers/redis-server.js'
import { keysOnEveryMaster, startCluster, type RedisCluster } from './helpers/redis-cluster.js'

leaseSuite()

/** A logger that keeps what it is told, and the warnings about how waiters listen. */
class Collect extends CollectingLogger {
  get wakeUps() {
    return this.warnings.filter((l) => l.fields?.code === 'MASTRA_LEASE_WAKE_UPS')
  }
}

/** A server of its own with each of `commands` renamed to nothing: the server has no such command. */
const serverWithout = async (...commands: string[]) =>
  stopLater(await startRedis({ args: commands.flatMap((command) => ['--rename-command', command, '']) }))

const newKey = () => `lacking-${randomUUID().slice(0, 8)}\u0000thread`


/** Holder and waiter on `url`, the waiter telling `logger`; `A` holds a fresh key for `ttlMs`. */
async function heldByA(url: string, ttlMs: number) {
  const logger = new Collect()
  const holder = closing(new RedisLeaseProvider({ url }))
  const waiter = closing(new RedisLeaseProvider({ url, logger }))
  const key = newKey()
  // Taken before the acquire is sent: the TTL runs from when Redis ran it, later.
  const granted = performance.now()
  await holder.acquireLease(key, 'A', ttlMs)
  return { logger, holder, waiter, key, granted }
}

/**
 * A waiter on `url` is woken by the holder's release within a fraction of the minute-long TTL,
 * twice (the second wait listens as the first did), with exactly one warning saying it listens
 * with SUBSCRIBE. Answers how long the first wake-up took.
 */
async function wokenThroughClassicChannels(url: string): Promise<number> {
  const { logger, holder, waiter, key } = await heldByA(url, 60_000)
  let first = 0
  for (const round of [1, 2]) {
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
    await sleep(200) // subscribed, refused, waiting
    expect(waiting.settled).toBe(false)
    const released = performance.now()
    await holder.releaseLease(key, 'A')
    await waiting.done
    expect(waiting.error).toBeUndefined()
    expect(waiting.lease).toMatchObject({ owner: 'B' })
    const took = waiting.at - released
    expect(took).toBeLessThan(2_000) // not the 60 s TTL
    if (round === 1) first = took
    await waiting.lease!.release()
    await holder.acquireLease(key, 'A', 60_000)
  }
  expect(logger.wakeUps).toHaveLength(1)
  expect(logger.wakeUps[0]!.message).toContain('SUBSCRIBE instead')
  return first
}

describe.skipIf(EXTERNAL_REDIS)('waiting on a server without shard channels', () => {
  it('without SSUBSCRIBE and SPUBLISH, a release wakes the waiter within milliseconds through PUBLISH and SUBSCRIBE, with one warning', async ({ annotate }) => {
    const server = await serverWithout('SSUBSCRIBE', 'SPUBLISH', 'SUNSUBSCRIBE')
    const took = await wokenThroughClassicChannels(server.url)
    await annotate(`release to grant through classic channels: ${took.toFixed(1)} ms (TTL 60 s)`)
  })

  it('an ACL user without SSUBSCRIBE and SPUBLISH but with SUBSCRIBE and PUBLISH waits the same way', async () => {
    const server = stopLater(await startRedis())
    await server.cli('ACL', 'SETUSER', 'classic', 'on', '>pw', '~*', '&*', '+@all', '-ssubscribe', '-spublish', '-sunsubscribe')
    const url = `redis://classic:pw@${server.host}:${server.port}`
    await wokenThroughClassicChannels(url)
  })

  it('a transfer wakes a waiter listening with SUBSCRIBE, which goes on waiting for the new holder', async () => {
    const server = await serverWithout('SSUBSCRIBE', 'SPUBLISH')
    const { holder, waiter, key } = await heldByA(server.url, 60_000)
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
    await sleep(200)
    expect(await holder.transferLease(key, 'A', 'C', 60_000)).toBe(true)
    await sleep(200)
    expect(waiting.settled).toBe(false)
    const released = performance.now()
    await holder.releaseLease(key, 'C')
    await waiting.done
    expect(waiting.lease).toMatchObject({ owner: 'B' })
    expect(waiting.at - released).toBeLessThan(2_000)
    await waiting.lease!.release()
  })

  it('without any subscription (SSUBSCRIBE and SUBSCRIBE gone), a wait takes the lease at the holder\'s TTL, not ERR_LEASE_REDIS, with one warning', async () => {
    const server = await serverWithout('SSUBSCRIBE', 'SUBSCRIBE', 'SPUBLISH', 'PUBLISH')
    const { logger, holder, waiter, key, granted } = await heldByA(server.url, 1_500)
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
    await sleep(200)
    await holder.releaseLease(key, 'A') // publishes nothing anyone hears
    await waiting.done
    expect(waiting.error).toBeUndefined()
    expect(waiting.lease).toMatchObject({ owner: 'B' })
    expect(waiting.at - granted).toBeGreaterThanOrEqual(1_490)
    await waiting.lease!.release()
    expect(logger.wakeUps).toHaveLength(1)
    expect(logger.wakeUps[0]!.message).toContain("TTL")
  })

  it('an ACL user allowed no channel waits until the holder\'s TTL the same way', async () => {
    const server = stopLater(await startRedis())
    await server.cli('ACL', 'SETUSER', 'nochannels', 'on', '>pw', '~*', 'resetchannels', '+@all')
    const url = `redis://nochannels:pw@${server.host}:${server.port}`
    const { logger, waiter, key, granted } = await heldByA(url, 1_500)
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
    await waiting.done
    expect(waiting.error).toBeUndefined()
    expect(waiting.lease).toMatchObject({ owner: 'B' })
    expect(waiting.at - granted).toBeGreaterThanOrEqual(1_490)
    await waiting.lease!.release()
    expect(logger.wakeUps).toHaveLength(1)
  })
})

describe.skipIf(EXTERNAL_REDIS)('waiting on a Redis Cluster without shard channels', () => {
  let cluster: RedisCluster
  beforeAll(async () => {
    cluster = await startCluster({ replicasPerMaster: 0 })
    for (const node of cluster.nodes) {
      await node.cli('ACL', 'SETUSER', 'classic', 'on', '>pw', '~*', '&*', '+@all', '-ssubscribe', '-spublish', '-sunsubscribe')
    }
  }, 60_000)
  afterAll(async () => {
    await cluster?.stop()
  })

  it('an ACL user without SSUBSCRIBE and SPUBLISH is woken on every master through PUBLISH and SUBSCRIBE, with one warning', async ({ annotate }) => {
    const logger = new Collect()
    const prefix = `lacking-cluster-${randomUUID().slice(0, 8)}`
    const options = { cluster: { nodes: cluster.urls, username: 'classic', password: 'pw' }, keyPrefix: prefix }
    const holder = closing(new RedisLeaseProvider(options))
    const waiter = closing(new RedisLeaseProvider({ ...options, logger }))
    const { keys, masters } = await keysOnEveryMaster(cluster, 4, newKey, (key) => `${prefix}:lease:${key}`)
    expect(masters).toBe(3) // the keys span every master
    await Promise.all(keys.map((key) => holder.acquireLease(key, 'A', 60_000)))
    const waits = keys.map((key) => pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true })))
    await sleep(300)
    for (const waiting of waits) expect(waiting.settled).toBe(false)
    const released = performance.now()
    await Promise.all(keys.map((key) => holder.releaseLease(key, 'A')))
    await Promise.all(waits.map((w) => w.done))
    const slowest = Math.max(...waits.map((w) => w.at - released))
    await annotate(`cluster, classic channels: 12 waiters granted within ${slowest.toFixed(1)} ms of the releases`)
    for (const waiting of waits) expect(waiting.lease).toMatchObject({ owner: 'B' })
    expect(slowest).toBeLessThan(2_000)
    expect(logger.wakeUps).toHaveLength(1)
    await Promise.all(waits.map((w) => w.lease!.release()))
  })
})

describe.skipIf(EXTERNAL_REDIS)('a server without EVALSHA', () => {
  it('fails every scripted lease call with ERR_LEASE_UNSUPPORTED_COMMAND naming EVALSHA; a plain claim or refusal (one SET) and getLeaseOwner still answer', async () => {
    const server = await serverWithout('EVALSHA')
    const logger = new Collect()
    const p = closing(new RedisLeaseProvider({ url: server.url, logger }))
    const key = newKey()
    const free = newKey()
    for (const call of [
      () => p.acquireFencedLease(free, 'A', 10_000),
      () => p.acquireLease(free, 'A', 10_000, 'run-1'),
      () => p.renewLease(key, 'A', 10_000),
      () => p.transferLease(key, 'A', 'B', 10_000),
      () => p.releaseLease(key, 'A'),
      () => p.getLeaseRecord(key),
    ]) {
      const error = await expectRejection(call, Error, 'ERR_LEASE_UNSUPPORTED_COMMAND')
      expect(error.message).toContain('EVALSHA')
    }
    expect(await p.getLeaseOwner(free)).toBeUndefined()
    // A plain acquire needs no script: a claim and a refusal are one SET NX GET each.
    expect(await p.acquireLease(key, 'A', 10_000)).toStrictEqual({ acquired: true, owner: 'A' })
    expect(await p.acquireLease(key, 'B', 10_000)).toStrictEqual({ acquired: false, owner: 'A' })
    expect(await p.getLeaseOwner(key)).toBe('A')
    // The holder asking again is a refresh, which the script decides (its metadata compared).
    await expectRejection(() => p.acquireLease(key, 'A', 10_000), Error, 'ERR_LEASE_UNSUPPORTED_COMMAND')
    // Mastra swallows these failures: the provider's warning about failing calls has the code.
    expect(logger.lines.find((l) => l.level === 'warn')?.fields).toMatchObject({ code: 'ERR_LEASE_UNSUPPORTED_COMMAND' })
  })
})

describe.skipIf(EXTERNAL_REDIS)('the streams transport on a server without XAUTOCLAIM', () => {
  it('delivers every event to its group, and a warning (not a flood) names XAUTOCLAIM and reclaimIntervalMs', async () => {
    const server = await serverWithout('XAUTOCLAIM')
    const logger = recordingLogger()
    const pubsub = closing(new RedisStreamsPubSub({ url: server.url, logger, blockMs: 100, reclaimIdleMs: 100, reclaimIntervalMs: 50 }))
    const inbox = new Inbox()
    await pubsub.subscribe('jobs', inbox.cb, { group: 'workers' })
    for (let n = 1; n <= 5; n++) await pubsub.publish('jobs', ev(n))
    await inbox.until((events) => events.length === 5, 5_000, 'five events')
    await sleep(1_000) // some twenty reclaim passes
    const reclaims = logger.lines.filter((l) => l.message.includes('reclaim'))
    expect(reclaims.length).toBeGreaterThan(1)
    const warnings = reclaims.filter((l) => l.level === 'warn')
    expect(warnings).toHaveLength(1) // then debug notes
    expect(warnings[0]!.fields).toMatchObject({ code: 'ERR_LEASE_UNSUPPORTED_COMMAND' })
    expect(String(warnings[0]!.fields?.err)).toMatch(/XAUTOCLAIM.*reclaimIntervalMs/)
    expect(inbox.numbers).toEqual([1, 2, 3, 4, 5])
  })
})
