// The lease contract beyond one server: on a local Redis Cluster (3 masters, 3 replicas) and
// behind Redis Sentinel (a master, 2 replicas, 3 sentinels), for RedisLeaseProvider and for
// RedisStreamsPubSub's leases. On the cluster, a lease's three keys (the owner, its companion
// key holding its token and metadata, and the slot's counter) share one hash slot whatever the
// key holds (CLUSTER KEYSLOT says so), and a batch of calls on keys of many slots is answered call by call.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'

import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub } from '../dist/esm/index.js'
import { RedisLeaseProvider } from '../index.js'
import { describeLeaseContract } from './helpers/lease-contract.js'
import { expectRejection, leaseFailureWarnings } from './helpers/lease.js'
import { EXTERNAL_REDIS } from './helpers/redis-server.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { startSentinel, type RedisSentinel } from './helpers/redis-sentinel.js'

// A wrong password fails lease calls, which warn through process.emitWarning (no logger here).
const leaseWarnings = leaseFailureWarnings()

describe.skipIf(EXTERNAL_REDIS)('on a Redis Cluster', () => {
  let cluster: RedisCluster
  beforeAll(async () => {
    cluster = await startCluster()
  })
  afterAll(async () => {
    await cluster?.stop()
  })
  const cluster_ = () => ({ nodes: cluster.urls })

  describeLeaseContract(
    'RedisLeaseProvider',
    (limits) => new RedisLeaseProvider({ cluster: cluster_(), keyPrefix: `test:${randomUUID()}`, ...(limits as object) }),
  )
  describeLeaseContract(
    "RedisStreamsPubSub's leases",
    (limits) => new RedisStreamsPubSub({ cluster: cluster_(), keyPrefix: `test:${randomUUID()}`, ...(limits as object) }),
  )

  it("a lease's key, its companion key (token and metadata) and its slot's counter share one hash slot, whatever the key holds", async () => {
    const prefix = `slots:${randomUUID().slice(0, 8)}`
    const p = new RedisLeaseProvider({ cluster: cluster_(), keyPrefix: prefix })
    try {
      const key = fc.string({ unit: fc.constantFrom('a', '{', '}', '\0', 'é', ':', 'x'), minLength: 1, maxLength: 8 })
      await fc.assert(
        fc.asyncProperty(key, async (k) => {
          const grant = await p.acquireFencedLease(k, 'owner', 60_000, 'run-1')
          expect(grant).toStrictEqual({ acquired: true, owner: 'owner', token: expect.any(Number) })
          const leaseKey = `${prefix}:lease:${k}`
          const slot = await cluster.keySlot(leaseKey)
          // The keys the lease wrote, read from the node that serves its slot.
          const node = await cluster.masterOfSlot(slot)
          // No key of its own for the metadata: it is in the companion key.
          expect(await node.cli('KEYS', `${prefix}:lease-metadata:*`)).toEqual([])
          const fence = ((await node.cli('KEYS', `${prefix}:fence:*`)) as string[]).filter(
            (name) => name.endsWith(`}:${k}`) || !name.includes('}:'),
          )
          const token = fence.find((name) => name.endsWith(`}:${k}`))
          expect(token, JSON.stringify(k)).toBeDefined()
          const counter = token!.slice(0, token!.length - k.length - 1)
          expect(await cluster.keySlot(token!)).toBe(slot)
          expect(await cluster.keySlot(counter)).toBe(slot)
          // "<token>:<transfer id>:<holder's length>:<holder><metadata>"
          expect(await node.cli('GET', token!)).toBe(`${grant.token}::5:ownerrun-1`)
          expect(await p.getLeaseRecord(k)).toStrictEqual({ owner: 'owner', metadata: 'run-1' })
          await p.releaseLease(k, 'owner', 'run-1')
          expect(await node.cli('EXISTS', leaseKey, token!)).toBe(0)
        }),
        { numRuns: 60 },
      )
    } finally {
      await p.close()
    }
  })

  it("a plain transfer on Node's loop, which sends nothing again by itself, leaves the lease its key alone, as on one server; one that goes through the cluster client (the slot moved under it: MOVED), which may send it again unseen, keeps its id beside the lease for commandTimeoutMs, then the lease is its key alone", async () => {
    const prefix = `handover:${randomUUID().slice(0, 8)}`
    const p = new RedisLeaseProvider({ cluster: cluster_(), keyPrefix: prefix, commandTimeoutMs: 1_000 })
    try {
      const key = 'thread\0one'
      const leaseKey = `${prefix}:lease:${key}`
      const slot = await cluster.keySlot(leaseKey)
      const companion = async (node: { cli(...args: string[]): Promise<unknown> }) =>
        ((await node.cli('KEYS', `${prefix}:fence:*`)) as string[]).filter((name) => name.endsWith(`}:${key}`))
      expect(await p.acquireLease(key, 'A', 60_000)).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await p.transferLease(key, 'A', 'B', 60_000)).toBe(true)
      const from = await cluster.masterOfSlot(slot)
      expect(await companion(from)).toEqual([])
      // The slot moves: the next transfer meets MOVED on the old master's link and goes
      // through the cluster client, in the form that carries its id.
      const to = (await cluster.masters()).find((m) => m.port !== from.port)!
      expect(await cluster.migrateSlot(slot, to)).toBeGreaterThan(0)
      expect(await p.transferLease(key, 'B', 'C', 60_000)).toBe(true)
      const fence = await companion(to)
      expect(fence).toHaveLength(1)
      // "<token>:<transfer id>:<holder's length>:<holder><metadata>": no token, this
      // transfer's id, the new holder, no metadata.
      expect(await to.cli('GET', fence[0]!)).toMatch(/^:[^:]+:1:C$/)
      const pttl = Number(await to.cli('PTTL', fence[0]!))
      expect(pttl).toBeGreaterThan(0)
      expect(pttl).toBeLessThanOrEqual(1_000)
      expect(await p.renewLease(key, 'C', 60_000)).toBe(true)
      expect(Number(await to.cli('PTTL', fence[0]!)), 'a renewal does not keep the id alive').toBeLessThanOrEqual(1_000)
      await new Promise((resolve) => setTimeout(resolve, 1_100))
      expect(await to.cli('EXISTS', fence[0]!)).toBe(0)
      expect(await p.renewLease(key, 'C', 60_000)).toBe(true)
      expect(Number(await to.cli('PTTL', leaseKey))).toBeGreaterThan(59_000)
    } finally {
      await p.close()
    }
  })

  it('answers a batch of calls on keys in many slots call by call, in one turn', async () => {
    const p = new RedisLeaseProvider({ cluster: cluster_(), keyPrefix: `batch:${randomUUID().slice(0, 8)}` })
    try {
      const keys = Array.from({ length: 200 }, (_, i) => `key-${i}`)
      const grants = await Promise.all(keys.map((k, i) => p.acquireLease(k, `owner-${i}`, 60_000)))
      grants.forEach((g, i) => expect(g).toStrictEqual({ acquired: true, owner: `owner-${i}` }))
      const owners = await Promise.all(keys.map((k) => p.getLeaseOwner(k)))
      expect(owners).toEqual(keys.map((_, i) => `owner-${i}`))
      const slots = new Set(await Promise.all(keys.map((k) => cluster.keySlot(`batch-x:lease:${k}`))))
      expect(slots.size).toBeGreaterThan(100)
    } finally {
      await p.close()
    }
  })

  it('refuses a keyPrefix with a brace it does not close, which could split a lease over slots', () => {
    expect(() => new RedisLeaseProvider({ cluster: cluster_(), keyPrefix: 'app{' })).toThrow(
      expect.objectContaining({ code: 'ERR_LEASE_INVALID_OPTION' }),
    )
  })
})

describe.skipIf(EXTERNAL_REDIS)('behind Redis Sentinel', () => {
  let sentinel: RedisSentinel
  beforeAll(async () => {
    sentinel = await startSentinel()
  })
  afterAll(async () => {
    await sentinel?.stop()
  })
  const sentinel_ = () => ({ nodes: sentinel.sentinelUrls, masterName: sentinel.masterName })

  describeLeaseContract(
    'RedisLeaseProvider',
    (limits) => new RedisLeaseProvider({ sentinel: sentinel_(), keyPrefix: `test:${randomUUID()}`, ...(limits as object) }),
  )
  describeLeaseContract(
    "RedisStreamsPubSub's leases",
    (limits) => new RedisStreamsPubSub({ sentinel: sentinel_(), keyPrefix: `test:${randomUUID()}`, ...(limits as object) }),
  )
})

describe.skipIf(EXTERNAL_REDIS)('with passwords', () => {
  const SECRET = 'cluster-secret-42'

  it('on a password-protected cluster the password works from the option or the seed URLs, and a wrong one rejects with ERR_LEASE_AUTH without echoing it', async () => {
    const cluster = await startCluster({ password: SECRET })
    try {
      const inUrls = cluster.urls.map((u) => u.replace('redis://', `redis://:${SECRET}@`))
      for (const options of [{ cluster: { nodes: cluster.urls, password: SECRET } }, { cluster: { nodes: inUrls } }]) {
        const p = new RedisLeaseProvider({ ...options, keyPrefix: `auth:${randomUUID().slice(0, 8)}` })
        try {
          expect(await p.acquireLease('k', 'a', 10_000)).toStrictEqual({ acquired: true, owner: 'a' })
          expect(await p.acquireFencedLease('k', 'a', 10_000)).toStrictEqual({ acquired: true, owner: 'a', token: expect.any(Number) })
        } finally {
          await p.close()
        }
      }
      const wrong = new RedisLeaseProvider({ cluster: { nodes: cluster.urls, password: 'not-the-secret' } })
      try {
        const err = await expectRejection(() => wrong.acquireLease('k', 'b', 10_000), Error, 'ERR_LEASE_AUTH')
        expect(`${err.message} ${err.stack} ${String((err as { cause?: unknown }).cause)}`).not.toContain('not-the-secret')
        await leaseWarnings.warned('ERR_LEASE_AUTH')
      } finally {
        await wrong.close()
      }
    } finally {
      await cluster.stop()
    }
  })

  it("behind Sentinel the master's password works from sentinel.password, and a wrong one rejects with ERR_LEASE_AUTH without echoing it", async () => {
    const sentinel = await startSentinel({ password: SECRET })
    try {
      const nodes = sentinel.sentinelUrls
      const p = new RedisStreamsPubSub({ sentinel: { nodes, masterName: sentinel.masterName, password: SECRET }, keyPrefix: `auth:${randomUUID().slice(0, 8)}` })
      try {
        expect(await p.acquireLease('k', 'a', 10_000)).toStrictEqual({ acquired: true, owner: 'a' })
        expect(await p.acquireFencedLease!('k', 'a', 10_000)).toStrictEqual({ acquired: true, owner: 'a', token: expect.any(Number) })
      } finally {
        await p.close()
      }
      const wrong = new RedisLeaseProvider({ sentinel: { nodes, masterName: sentinel.masterName, password: 'not-the-secret' } })
      try {
        const err = await expectRejection(() => wrong.acquireLease('k', 'b', 10_000), Error, 'ERR_LEASE_AUTH')
        expect(`${err.message} ${err.stack} ${String((err as { cause?: unknown }).cause)}`).not.toContain('not-the-secret')
        await leaseWarnings.warned('ERR_LEASE_AUTH')
      } finally {
        await wrong.close()
      }
    } finally {
      await sentinel.stop()
    }
  })
})
