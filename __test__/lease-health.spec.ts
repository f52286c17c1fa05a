// The health-check methods. stats(): what a provider's lease calls came to since it was made,
// counted the same way by every provider: calls per method (rejected ones included),
// rejections per error code, grants, refusals and lost leases. Closing does not reset it; a
// frozen Redis shows up as ERR_LEASE_TIMEOUT. ping(): a round trip, bounded like every call.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'

import { EventEmitterPubSub } from '@mastra/core/events'
import { beforeAll, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub, withLeases, type LeaseStats } from '../dist/esm/index.js'
import { expectRejection, leaseFailureWarnings } from './helpers/lease.js'
import { closing, leaseSuite, RUN, stopLater } from './helpers/lease-runs.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { startCluster } from './helpers/redis-cluster.js'
import { recordingLogger } from './helpers/streams.js'

leaseSuite()
// A frozen server fails lease calls, which warn through process.emitWarning (no logger here).
leaseFailureWarnings()

let server: RedisServer
beforeAll(async () => {
  server = stopLater(await startRedis())
})

type Counted = {
  acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<unknown>
  // Optional in the pubsubs' types: own properties exactly when their provider has them.
  acquireFencedLease?: (key: string, owner: string, ttlMs: number, metadata?: string) => Promise<unknown>
  getLeaseRecord?: (key: string) => Promise<unknown>
  getLeaseOwner(key: string): Promise<unknown>
  getLease(key: string): Promise<unknown>
  releaseLease(key: string, owner: string, metadata?: string): Promise<void>
  renewLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean>
  transferLease(key: string, from: string, to: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): Promise<boolean>
  stats(): LeaseStats
  ping(): Promise<number>
  close(): Promise<void>
}

const providers: Array<[string, () => Counted]> = [
  ['MemoryLeaseProvider', () => new MemoryLeaseProvider()],
  ['RedisLeaseProvider', () => new RedisLeaseProvider({ url: server.url, keyPrefix: `stats:${RUN}` })],
  ['RedisStreamsPubSub', () => new RedisStreamsPubSub({ url: server.url, keyPrefix: `stats-streams:${RUN}` })],
  ['withLeases(…, RedisLeaseProvider)', () => {
    const leases = new RedisLeaseProvider({ url: server.url, keyPrefix: `stats-with:${RUN}` })
    const pubsub = withLeases(new EventEmitterPubSub(), leases)
    const closeTransport = pubsub.close.bind(pubsub)
    return Object.assign(pubsub, { close: async () => { await closeTransport(); await leases.close() } })
  }],
]

const calls = (counts: Partial<LeaseStats['calls']>): LeaseStats['calls'] => ({
  acquireLease: 0,
  getLeaseOwner: 0,
  releaseLease: 0,
  renewLease: 0,
  transferLease: 0,
  acquireFencedLease: 0,
  getLease: 0,
  getLeaseRecord: 0,
  ...counts,
})

describe.each(providers)('%s', (_name, make) => {
  it('counts every call once, with how it ended, and keeps counting after close', async () => {
    const p = make()
    const key = `stats-${randomUUID().slice(0, 8)}\u0000thread`
    expect(p.stats()).toEqual({ calls: calls({}), errors: {}, granted: 0, refused: 0, lost: 0 })

    expect(typeof p.acquireFencedLease).toBe('function')
    expect(typeof p.getLeaseRecord).toBe('function')
    await p.acquireLease(key, 'A', 60_000) // granted
    await p.acquireLease(key, 'B', 60_000) // refused
    await p.acquireFencedLease!(key, 'A', 60_000) // granted: the holder's refresh, with a token
    await p.acquireFencedLease!(key, 'A', 60_000, 'run-2') // refused: A with other metadata is another holder
    await p.renewLease(key, 'A', 60_000)
    expect(await p.renewLease(key, 'B', 60_000)).toBe(false) // lost
    expect(await p.renewLease(key, 'A', 60_000, 'run-2')).toBe(false) // lost
    await p.getLeaseOwner(key)
    await p.getLease(key)
    await p.getLeaseRecord!(key)
    await p.transferLease(key, 'A', 'C', 60_000, undefined, 'run-c') // granted
    await p.releaseLease(key, 'C', 'run-c')
    await expectRejection(() => p.acquireLease('', 'A', 60_000), RangeError, 'ERR_LEASE_INVALID_KEY')
    await expectRejection(() => p.renewLease(key, 'A', -1), RangeError, 'ERR_LEASE_INVALID_TTL')
    await expectRejection(() => p.renewLease(key, 'A', 0.5), RangeError, 'ERR_LEASE_INVALID_TTL')
    await expectRejection(() => p.acquireFencedLease!(key, 'A', 60_000, ''), RangeError, 'ERR_LEASE_INVALID_METADATA')
    expect(p.stats()).toEqual({
      calls: calls({ acquireLease: 3, acquireFencedLease: 3, getLeaseOwner: 1, getLease: 1, getLeaseRecord: 1, releaseLease: 1, renewLease: 5, transferLease: 1 }),
      errors: { ERR_LEASE_INVALID_KEY: 1, ERR_LEASE_INVALID_TTL: 2, ERR_LEASE_INVALID_METADATA: 1 },
      granted: 3,
      refused: 2,
      lost: 2,
    })

    await p.close()
    await expectRejection(() => p.getLeaseOwner(key), Error, 'ERR_LEASE_CLOSED')
    const after = p.stats()
    expect(after.calls.getLeaseOwner).toBe(2)
    expect(after.errors).toEqual({ ERR_LEASE_INVALID_KEY: 1, ERR_LEASE_INVALID_TTL: 2, ERR_LEASE_INVALID_METADATA: 1, ERR_LEASE_CLOSED: 1 })
  })
})

describe.each(providers)('%s: ping()', (name, make) => {
  it('resolves the round trip in milliseconds, counts as no lease call, and rejects with ERR_LEASE_CLOSED once closed', async () => {
    const p = make()
    const took = await p.ping()
    expect(typeof took).toBe('number')
    if (name === 'MemoryLeaseProvider') expect(took).toBe(0)
    else expect(took).toBeGreaterThan(0)
    expect(took).toBeLessThan(2_000)
    expect(Object.values(p.stats().calls).every((n) => n === 0)).toBe(true)
    await p.close()
    await expectRejection(() => p.ping(), Error, 'ERR_LEASE_CLOSED')
  })
})

/** While `node` is frozen, `p.ping()` rejects with ERR_LEASE_TIMEOUT within about `timeoutMs`; once thawed, it answers again. */
async function pingThroughFreeze(p: RedisLeaseProvider, node: { freeze(): void; thaw(): void }, timeoutMs: number) {
  expect(await p.ping()).toBeGreaterThan(0)
  node.freeze()
  const started = performance.now()
  try {
    await expectRejection(() => p.ping(), Error, 'ERR_LEASE_TIMEOUT')
  } finally {
    node.thaw()
  }
  expect(performance.now() - started).toBeLessThan(timeoutMs + 700)
  expect(await p.ping()).toBeGreaterThan(0)
}

describe('where Redis fails', () => {
  it.skipIf(EXTERNAL_REDIS)('ping() on a frozen server rejects with ERR_LEASE_TIMEOUT within commandTimeoutMs, and answers again once thawed', async () => {
    const frozen = stopLater(await startRedis())
    const p = closing(new RedisLeaseProvider({ url: frozen.url, keyPrefix: `ping-frozen:${RUN}`, commandTimeoutMs: 300 }))
    await pingThroughFreeze(p, frozen, 300)
  })

  it('ping() to nothing listening rejects with ERR_LEASE_CONNECTION or ERR_LEASE_TIMEOUT, never resolves', async () => {
    const p = closing(new RedisLeaseProvider({ url: 'redis://127.0.0.1:1', commandTimeoutMs: 300, connectTimeoutMs: 200 }))
    const error = await p.ping().then(() => undefined, (err: { code?: string }) => err)
    expect(['ERR_LEASE_CONNECTION', 'ERR_LEASE_TIMEOUT']).toContain(error?.code)
  })

  it.skipIf(EXTERNAL_REDIS)('a frozen server: the calls that time out are counted under ERR_LEASE_TIMEOUT, never as refusals or lost leases', async () => {
    const frozen = stopLater(await startRedis())
    const p = closing(new RedisLeaseProvider({ url: frozen.url, keyPrefix: `stats-frozen:${RUN}`, commandTimeoutMs: 300 }))
    await p.acquireLease('k', 'A', 60_000)
    frozen.freeze()
    try {
      await Promise.all([
        expectRejection(() => p.renewLease('k', 'A', 60_000), Error, 'ERR_LEASE_TIMEOUT'),
        expectRejection(() => p.acquireLease('k', 'B', 60_000), Error, 'ERR_LEASE_TIMEOUT'),
      ])
    } finally {
      frozen.thaw()
    }
    expect(p.stats()).toEqual({
      calls: calls({ acquireLease: 2, renewLease: 1 }),
      errors: { ERR_LEASE_TIMEOUT: 2 },
      granted: 1,
      refused: 0,
      lost: 0,
    })
  })

  it.skipIf(EXTERNAL_REDIS)('a frozen server: failing lease calls warn the logger once with their code (failed acquires with a warning of their own, saying what Mastra makes of them), later failures of the burst are debug notes counting them; bad input and a closed provider are not reported', async () => {
    for (const make of [
      (url: string, logger: ReturnType<typeof recordingLogger>) => new RedisLeaseProvider({ url, keyPrefix: `warn-frozen:${RUN}`, commandTimeoutMs: 300, logger }),
      (url: string, logger: ReturnType<typeof recordingLogger>) => new RedisStreamsPubSub({ url, keyPrefix: `warn-frozen-streams:${RUN}`, commandTimeoutMs: 300, logger }),
    ]) {
      const frozen = stopLater(await startRedis())
      const logger = recordingLogger()
      const p = make(frozen.url, logger)
      const reported = () => logger.lines.filter((l) => l.message.includes('lease calls'))
      await p.acquireLease('k', 'A', 60_000)
      await expectRejection(() => p.acquireLease('', 'A', 60_000), RangeError, 'ERR_LEASE_INVALID_KEY')
      frozen.freeze()
      try {
        await expectRejection(() => p.renewLease('k', 'A', 60_000), Error, 'ERR_LEASE_TIMEOUT')
        await Promise.all([
          expectRejection(() => p.acquireLease('k', 'B', 60_000), Error, 'ERR_LEASE_TIMEOUT'),
          expectRejection(() => p.releaseLease('k', 'A'), Error, 'ERR_LEASE_TIMEOUT'),
        ])
      } finally {
        frozen.thaw()
      }
      expect(await p.getLeaseOwner('k')).toBe('A')
      await p.close()
      await expectRejection(() => p.getLeaseOwner('k'), Error, 'ERR_LEASE_CLOSED')
      expect(reported()).toEqual([
        {
          level: 'warn',
          message: expect.stringMatching(/^mastra-lease: lease calls are failing: until Redis answers again, they reject$/),
          fields: expect.objectContaining({ code: 'ERR_LEASE_TIMEOUT', operation: 'renewLease', key: 'k', failedCalls: 1 }),
        },
        {
          level: 'warn',
          message: expect.stringMatching(/lease calls are failing.*counts a failed acquireLease as acquired/),
          fields: expect.objectContaining({ code: 'ERR_LEASE_TIMEOUT', operation: 'acquireLease', key: 'k', failedCalls: 1 }),
        },
        {
          level: 'debug',
          message: expect.stringContaining('lease calls failed'),
          fields: expect.objectContaining({ code: 'ERR_LEASE_TIMEOUT', operation: 'releaseLease', failedCalls: 1 }),
        },
      ])
    }
  })

  it.skipIf(EXTERNAL_REDIS)('ping() on a Redis Cluster reaches every master: one master frozen is ERR_LEASE_TIMEOUT within commandTimeoutMs, and it answers again once thawed', async () => {
    const cluster = await startCluster()
    try {
      const p = closing(new RedisLeaseProvider({ cluster: { nodes: cluster.urls }, keyPrefix: `ping-cluster:${RUN}`, commandTimeoutMs: 400 }))
      const masters = await cluster.masters()
      await pingThroughFreeze(p, masters[masters.length - 1]!, 400)
    } finally {
      await cluster.stop()
    }
  })

  it("withLeases over a provider that is not this package's: stats() throws and ping() rejects with ERR_LEASE_UNSUPPORTED", async () => {
    const foreign = new EventEmitterPubSub()
    const pubsub = withLeases(new EventEmitterPubSub(), foreign as never)
    expect(() => pubsub.stats()).toThrow(TypeError)
    expect(() => pubsub.stats()).toThrow(expect.objectContaining({ code: 'ERR_LEASE_UNSUPPORTED' }))
    await expectRejection(() => pubsub.ping(), TypeError, 'ERR_LEASE_UNSUPPORTED')
  })
})
