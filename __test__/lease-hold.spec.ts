// hold(): a lease that renews itself every third of its TTL and aborts its signal the moment
// it is known lost: a renewal that finds it taken (a direct write to Redis steals it), or
// renewals failing until the TTL could have run out (a frozen server). Released by release(),
// by `await using`, or by the caller's signal; its timers never keep a process alive.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { execFile } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import path from 'node:path'
import { promisify } from 'node:util'

import { InMemoryServerCache } from '@mastra/core/cache'
import { CachingPubSub, EventEmitterPubSub } from '@mastra/core/events'
import { beforeAll, describe, expect, it } from 'vitest'

import { holdLease, MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub, type HeldLease, type HoldOptions } from '../dist/esm/index.js'
import { expectRejection, leaseFailureWarnings, sleep } from './helpers/lease.js'
import { closing, leaseSuite, RUN, stopLater } from './helpers/lease-runs.js'
import { NODE } from './helpers/mastra-node.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()
// A frozen server fails lease calls, which warn through process.emitWarning (no logger here).
const leaseWarnings = leaseFailureWarnings()

let server: RedisServer
beforeAll(async () => {
  server = stopLater(await startRedis())
})

type Holder = {
  hold(key: string, owner: string, options: HoldOptions): Promise<HeldLease>
  getLeaseOwner(key: string): Promise<string | undefined>
  acquireLease(key: string, owner: string, ttlMs: number): Promise<{ acquired: boolean; owner?: string }>
  close(): Promise<void>
}

const holders: Array<[string, () => Holder]> = [
  ['MemoryLeaseProvider', () => new MemoryLeaseProvider()],
  ['RedisLeaseProvider', () => new RedisLeaseProvider({ url: server.url, keyPrefix: `hold:${RUN}` })],
  ['RedisStreamsPubSub', () => new RedisStreamsPubSub({ url: server.url, keyPrefix: `hold-streams:${RUN}` })],
]
const newKey = () => `hold-${randomUUID().slice(0, 8)}\u0000thread`
/** Resolves with the signal's reason once it aborts, or `undefined` after `ms`. */
const abortedWithin = (signal: AbortSignal, ms: number) =>
  new Promise<unknown>((resolve) => {
    if (signal.aborted) return resolve(signal.reason)
    const timer = setTimeout(() => resolve(undefined), ms)
    signal.addEventListener('abort', () => (clearTimeout(timer), resolve(signal.reason)), { once: true })
  })

describe.each(holders)('%s.hold', (_name, make) => {
  it('holds the lease past its TTL by renewing it, with its token, until release() frees it and aborts the signal with ERR_LEASE_RELEASED', async () => {
    const p = closing(make())
    const key = newKey()
    const lease = await p.hold(key, 'A', { ttlMs: 300 })
    expect(lease).toMatchObject({ key, owner: 'A', token: expect.any(Number) })
    await sleep(1_000) // more than three TTLs
    expect(await p.getLeaseOwner(key)).toBe('A')
    expect(await p.acquireLease(key, 'B', 300)).toEqual({ acquired: false, owner: 'A' })
    expect(lease.signal.aborted).toBe(false)
    await lease.release()
    expect(lease.signal.reason).toMatchObject({ code: 'ERR_LEASE_RELEASED' })
    expect(await p.getLeaseOwner(key)).toBeUndefined()
    await lease.release() // idempotent
  })

  it('rejects with ERR_LEASE_HELD, naming the holder, when another owner holds the key', async () => {
    const p = closing(make())
    const key = newKey()
    await p.acquireLease(key, 'B', 60_000)
    const error = await expectRejection(() => p.hold(key, 'A', { ttlMs: 1_000 }), Error, 'ERR_LEASE_HELD')
    expect(error).toMatchObject({ owner: 'B' })
  })

  it('refuses unknown and unusable options, and options whose Proxy traps throw, with ERR_LEASE_INVALID_OPTION before taking anything', async () => {
    const p = closing(make())
    const key = newKey()
    await expectRejection(() => p.hold(key, 'A', { ttlMs: 1_000, wiat: true } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    await expectRejection(() => p.hold(key, 'A', { ttl: 1_000 } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    await expectRejection(() => p.hold(key, 'A', { ttlMs: 1_000, signal: {} as never }), TypeError, 'ERR_LEASE_INVALID_OPTION')
    const thrown = new Error('trapped')
    for (const trap of [new Proxy({ ttlMs: 1_000 }, { ownKeys: () => { throw thrown } }), new Proxy({ ttlMs: 1_000 }, { get: () => { throw thrown } })]) {
      const error = await expectRejection(() => p.hold(key, 'A', trap), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expect((error as Error & { cause?: unknown }).cause).toBe(thrown)
    }
    await expectRejection(() => p.hold('', 'A', { ttlMs: 1_000 }), RangeError, 'ERR_LEASE_INVALID_KEY')
    expect(await p.getLeaseOwner(key)).toBeUndefined()
  })

  it("refuses a ttlMs or metadata it cannot use with the code a lease method gives it (ERR_LEASE_INVALID_TTL, ERR_LEASE_INVALID_METADATA), waiting or not, and leaves what is held alone", async () => {
    const p = closing(make())
    const key = newKey()
    const held = await p.hold(key, 'A', { ttlMs: 60_000 })
    for (const wait of [false, true]) {
      await expectRejection(() => p.hold(key, 'B', { ttlMs: 'soon' as never, wait }), TypeError, 'ERR_LEASE_INVALID_TTL')
      await expectRejection(() => p.hold(key, 'B', { ttlMs: 0.5, wait }), RangeError, 'ERR_LEASE_INVALID_TTL')
      await expectRejection(() => p.hold(key, 'B', { ttlMs: 2, wait }), RangeError, 'ERR_LEASE_INVALID_TTL')
      await expectRejection(() => p.hold(key, 'B', { ttlMs: 1e12, wait }), RangeError, 'ERR_LEASE_INVALID_TTL')
      await expectRejection(() => p.hold(key, 'B', { ttlMs: 1_000, metadata: 7 as never, wait }), TypeError, 'ERR_LEASE_INVALID_METADATA')
      await expectRejection(() => p.hold(key, 'B', { ttlMs: 1_000, metadata: '', wait }), RangeError, 'ERR_LEASE_INVALID_METADATA')
    }
    expect(await p.getLeaseOwner(key)).toBe('A')
    expect(held.signal.aborted).toBe(false)
    await held.release()
  })

  it("the caller's signal ends the hold: the lease is released and its signal aborts with the caller's reason", async () => {
    const p = closing(make())
    const key = newKey()
    const caller = new AbortController()
    const lease = await p.hold(key, 'A', { ttlMs: 1_000, signal: caller.signal })
    caller.abort(new Error('shutting down'))
    expect(await abortedWithin(lease.signal, 100)).toMatchObject({ message: 'shutting down' })
    await lease.release()
    expect(await p.getLeaseOwner(key)).toBeUndefined()
    await expect(p.hold(key, 'A', { ttlMs: 1_000, signal: AbortSignal.abort('already') })).rejects.toBe('already')
    expect(await p.getLeaseOwner(key)).toBeUndefined()
  })

  it('`await using` releases the lease on leaving the scope', async () => {
    const p = closing(make())
    const key = newKey()
    {
      await using lease = await p.hold(key, 'A', { ttlMs: 1_000 })
      expect(await p.getLeaseOwner(key)).toBe(lease.owner)
    }
    expect(await p.getLeaseOwner(key)).toBeUndefined()
  })
})

describe('holdLease', () => {
  it('refuses what is not a lease provider ({}, null, an object with some of the five methods, a wrapper handing out nothing or such an object) with ERR_LEASE_INVALID_ARGUMENT', async () => {
    const partial = { acquireLease: async () => ({ acquired: true }), getLeaseOwner: async () => undefined }
    const wrappers = [{ getLeaseProvider: () => undefined }, { getLeaseProvider: () => partial }]
    for (const leases of [{}, null, undefined, 'redis://', partial, ...wrappers]) {
      const error = await expectRejection(() => holdLease(leases as never, `hold-${randomUUID()}`, 'A', { ttlMs: 1_000 }), TypeError, 'ERR_LEASE_INVALID_ARGUMENT')
      expect(error.message).toMatch(/^hold: leases must be a lease provider/)
    }
  })

  it("holds through the provider Mastra's CachingPubSub hands out (getLeaseProvider()), as Mastra resolves it", async () => {
    const pubsub = closing(new RedisStreamsPubSub({ url: server.url, keyPrefix: `hold-caching:${RUN}` }))
    const caching = new CachingPubSub(pubsub, new InMemoryServerCache())
    const key = newKey()
    const lease = await holdLease(caching, key, 'A', { ttlMs: 600, wait: true })
    expect(await pubsub.getLeaseOwner(key)).toBe('A')
    await sleep(700) // renewed past its TTL through the pubsub inside
    expect(await pubsub.getLeaseOwner(key)).toBe('A')
    await lease.release()
    expect(await pubsub.getLeaseOwner(key)).toBeUndefined()
  })
})

describe('when the lease is lost', () => {
  it('a direct write that steals the key aborts the signal with ERR_LEASE_LOST at the next renewal (within a third of the TTL)', async () => {
    const prefix = `hold-stolen:${RUN}`
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const key = newKey()
    const lease = await p.hold(key, 'A', { ttlMs: 600 })
    await server.cli('SET', `${prefix}:lease:${key}`, 'thief', 'PX', 60_000)
    const started = performance.now()
    expect(await abortedWithin(lease.signal, 2_000)).toMatchObject({ code: 'ERR_LEASE_LOST', message: expect.stringContaining('taken') })
    expect(performance.now() - started).toBeLessThan(600 / 3 + 300)
    await lease.release() // nothing to release: the thief keeps it
    expect(await p.getLeaseOwner(key)).toBe('thief')
  })

  it.skipIf(EXTERNAL_REDIS)('a server frozen past the TTL aborts the signal with ERR_LEASE_LOST when the TTL could have run out, not later', async () => {
    const frozen = stopLater(await startRedis())
    const p = closing(new RedisLeaseProvider({ url: frozen.url, keyPrefix: `hold-frozen:${RUN}`, commandTimeoutMs: 2_000 }))
    const ttlMs = 600
    const lease = await p.hold(newKey(), 'A', { ttlMs })
    const heldSince = performance.now()
    frozen.freeze()
    try {
      // The renewals in flight hang for commandTimeoutMs; the deadline does not wait for them.
      expect(await abortedWithin(lease.signal, 3_000)).toMatchObject({ code: 'ERR_LEASE_LOST', message: expect.stringContaining('TTL') })
      expect(performance.now() - heldSince).toBeLessThan(ttlMs + 100)
    } finally {
      frozen.thaw()
    }
  })

  it('holdLease works over any LeaseProvider, Mastra\'s own in-process leases included', async () => {
    const mastraLeases = new EventEmitterPubSub()
    const key = newKey()
    const lease = await holdLease(mastraLeases, key, 'A', { ttlMs: 300 })
    expect(lease.token).toBeUndefined()
    await sleep(700)
    expect(await mastraLeases.getLeaseOwner(key)).toBe('A')
    // Mastra's leases taken over by another owner: the next renewal finds it so.
    await mastraLeases.releaseLease(key, 'A')
    await mastraLeases.acquireLease(key, 'B', 60_000)
    expect(await abortedWithin(lease.signal, 1_000)).toMatchObject({ code: 'ERR_LEASE_LOST' })
  })
})

describe.skipIf(EXTERNAL_REDIS)('releasing through an outage', () => {
  /** A server of the test's own, which it freezes, and a provider on it that gives up fast. */
  async function frozenLater(commandTimeoutMs: number) {
    const own = stopLater(await startRedis())
    const p = closing(new RedisLeaseProvider({ url: own.url, keyPrefix: `hold-outage:${RUN}`, commandTimeoutMs, connectTimeoutMs: commandTimeoutMs }))
    return { own, p }
  }
  /** The scripts Redis ran (a release is one EVALSHA). */
  const scripts = async (on: RedisServer) => (await on.commandCalls()).evalsha ?? 0

  it('a release() that failed while the server was frozen is sent again by the next release(), which frees the lease; once one landed, release() sends nothing', async () => {
    const { own, p } = await frozenLater(500)
    const key = newKey()
    const lease = await p.hold(key, 'A', { ttlMs: 10_000 })
    own.freeze()
    try {
      const error = await lease.release().then(
        () => undefined,
        (err: unknown) => err,
      )
      expect(error).toMatchObject({ code: expect.stringMatching(/^ERR_LEASE_(TIMEOUT|CONNECTION)$/) })
      // The failed release was reported, with its code.
      await leaseWarnings.warned((error as { code: string }).code)
    } finally {
      own.thaw()
    }
    expect(lease.signal.reason).toMatchObject({ code: 'ERR_LEASE_RELEASED' })
    await sleep(200) // what the frozen server had buffered has run
    const before = await scripts(own)
    await lease.release()
    // Sent (once more if the connection it went out on had broken meanwhile).
    const sent = await scripts(own)
    expect(sent).toBeGreaterThan(before)
    expect(await p.getLeaseOwner(key)).toBeUndefined()
    await Promise.all([lease.release(), lease.release()])
    expect(await scripts(own)).toBe(sent)
  })

  it("the caller's signal aborting while the server is frozen releases the lease once the server answers again, and release() resolves when it has", async ({ annotate }) => {
    const { own, p } = await frozenLater(500)
    const key = newKey()
    const caller = new AbortController()
    const lease = await p.hold(key, 'A', { ttlMs: 10_000, signal: caller.signal })
    own.freeze()
    let thawedAt: number
    try {
      caller.abort(new Error('shutting down'))
      expect(lease.signal.reason).toMatchObject({ message: 'shutting down' })
      await sleep(2_000)
    } finally {
      own.thaw()
      thawedAt = performance.now()
    }
    await lease.release()
    const releasedMs = performance.now() - thawedAt
    await annotate(`the signal's release landed ${releasedMs.toFixed(0)} ms after a 2 s freeze ended (TTL 10 s)`)
    expect(await p.getLeaseOwner(key)).toBeUndefined()
    expect(releasedMs).toBeLessThan(2_000)
  })

  it("when the server stays frozen until the TTL could have run out, the signal's release stops trying then, and release() rejects with the last attempt's error", async () => {
    const { own, p } = await frozenLater(300)
    const ttlMs = 1_500
    const caller = new AbortController()
    const lease = await p.hold(newKey(), 'A', { ttlMs, signal: caller.signal })
    own.freeze()
    try {
      const abortedAt = performance.now()
      caller.abort(new Error('shutting down'))
      const error = await lease.release().then(
        () => undefined,
        (err: unknown) => err,
      )
      const rejectedMs = performance.now() - abortedAt
      expect(error).toMatchObject({ code: expect.stringMatching(/^ERR_LEASE_(TIMEOUT|CONNECTION)$/) })
      // The last renewal was sent at most a third of the TTL before the freeze.
      expect(rejectedMs).toBeGreaterThan((ttlMs * 2) / 3 - 50)
      expect(rejectedMs).toBeLessThan(ttlMs + 1_000)
    } finally {
      own.thaw()
    }
  })
})

describe('timers', () => {
  it('never keep a process alive: a child that holds a lease and returns exits by itself', async () => {
    const script = `
      const { MemoryLeaseProvider } = require(${JSON.stringify(path.resolve(__dirname, '..', 'dist', 'cjs', 'index.js'))});
      new MemoryLeaseProvider().hold('k', 'child', { ttlMs: 300 }).then((lease) => console.log(lease.owner));
    `
    const started = performance.now()
    const { stdout } = await promisify(execFile)(NODE, ['-e', script], { timeout: 10_000 })
    expect(stdout.trim()).toBe('child')
    expect(performance.now() - started).toBeLessThan(5_000)
  })
})
