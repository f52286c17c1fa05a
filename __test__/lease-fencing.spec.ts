// Fencing tokens: every fenced grant of a lease (acquireFencedLease) carries a token greater
// than every token granted before for its key (across expiry, release and re-acquire,
// transfer, plain grants in between, and a Redis restart with persistence), and a refresh by
// the holder keeps it. A plain acquireLease takes none, in one SET. `getLease` reads the lease
// whole. End to end: a resource that refuses writes carrying a lower token than the last it
// saw loses no write and takes no stale one when a holder frozen past its TTL resumes and writes.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'

import { EventEmitterPubSub } from '@mastra/core/events'
import { beforeAll, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub, withLeases, type LeaseState } from '../dist/esm/index.js'
import { expectThrow, sleep } from './helpers/lease.js'
import { closing, LeaseChild, leaseSuite, RUN, stopLater, type Grant } from './helpers/lease-runs.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()

let server: RedisServer
beforeAll(async () => {
  server = stopLater(await startRedis())
})

type Fenced = {
  acquireLease(key: string, owner: string, ttlMs: number): Promise<Grant>
  acquireFencedLease(key: string, owner: string, ttlMs: number): Promise<Grant & { token?: number }>
  releaseLease(key: string, owner: string): Promise<void>
  renewLease(key: string, owner: string, ttlMs: number): Promise<boolean>
  transferLease(key: string, from: string, to: string, ttlMs: number): Promise<boolean>
  getLease(key: string): Promise<LeaseState | undefined>
  close(): Promise<void>
}

/** `p`, failing unless it has fenced grants (optional in a pubsub's type: there when its provider has them). */
function fenced<P extends { acquireFencedLease?: unknown }>(p: P): P & Fenced {
  expect(typeof p.acquireFencedLease).toBe('function')
  return p as P & Fenced
}

const providers: Array<[string, (prefix: string) => Fenced]> = [
  ['MemoryLeaseProvider', () => closing(new MemoryLeaseProvider())],
  ['RedisLeaseProvider', (keyPrefix) => closing(new RedisLeaseProvider({ url: server.url, keyPrefix }))],
  ["RedisStreamsPubSub's leases", (keyPrefix) => fenced(closing(new RedisStreamsPubSub({ url: server.url, keyPrefix })))],
  ['withLeases(…, RedisLeaseProvider)', (keyPrefix) => fenced(closing(withLeases(new EventEmitterPubSub(), new RedisLeaseProvider({ url: server.url, keyPrefix }))))],
]

const uniqueKey = () => `fence-${randomUUID().slice(0, 8)}\u0000thread`

/** A resource guarded by fencing tokens: it refuses a write whose token is below the last it took. */
class FencedResource {
  last = 0
  readonly accepted: Array<{ token: number; value: string }> = []
  readonly refused: Array<{ token: number; value: string }> = []
  write(token: number, value: string): boolean {
    if (token < this.last) {
      this.refused.push({ token, value })
      return false
    }
    this.last = token
    this.accepted.push({ token, value })
    return true
  }
}

describe.each(providers)('%s', (_name, make) => {
  it('every fenced claim and every transfer takes a greater token; a refresh and a renew keep it', async () => {
    const p = make(`fence:${RUN}:${randomUUID().slice(0, 8)}`)
    const key = uniqueKey()
    const first = await p.acquireFencedLease(key, 'A', 60_000)
    expect(first).toStrictEqual({ acquired: true, owner: 'A', token: expect.any(Number) })
    expect(Number.isSafeInteger(first.token)).toBe(true)
    expect((await p.acquireFencedLease(key, 'A', 60_000)).token).toBe(first.token)
    expect(await p.renewLease(key, 'A', 60_000)).toBe(true)
    expect(await p.acquireFencedLease(key, 'B', 60_000)).toStrictEqual({ acquired: false, owner: 'A', token: undefined })
    const held = await p.getLease(key)
    expect(held).toEqual({ owner: 'A', token: first.token, ttlMs: expect.any(Number) })
    expect(held!.ttlMs).toBeGreaterThan(59_000)
    expect(held!.ttlMs).toBeLessThanOrEqual(60_000)

    expect(await p.transferLease(key, 'A', 'B', 60_000)).toBe(true)
    const moved = (await p.getLease(key))!
    expect(moved.owner).toBe('B')
    expect(moved.token).toBeGreaterThan(first.token!)

    await p.releaseLease(key, 'B')
    expect(await p.getLease(key)).toBeUndefined()
    const afterRelease = await p.acquireFencedLease(key, 'C', 60)
    expect(afterRelease.token).toBeGreaterThan(moved.token!)
    await sleep(120)
    expect(await p.getLease(key)).toBeUndefined()
    const afterExpiry = await p.acquireFencedLease(key, 'D', 60_000)
    expect(afterExpiry.token).toBeGreaterThan(afterRelease.token!)
  })

  it('a resource that checks tokens takes every write of the current holder and none of a holder that lost the lease', async () => {
    const p = make(`fence:${RUN}:${randomUUID().slice(0, 8)}`)
    const key = uniqueKey()
    const resource = new FencedResource()
    const a = await p.acquireFencedLease(key, 'A', 60_000)
    expect(resource.write(a.token!, 'A-1')).toBe(true)
    expect(await p.transferLease(key, 'A', 'B', 60_000)).toBe(true)
    const b = (await p.getLease(key))!
    expect(resource.write(b.token!, 'B-1')).toBe(true)
    // A, unaware it gave the lease away, writes late with its own token.
    expect(resource.write(a.token!, 'A-late')).toBe(false)
    expect(resource.accepted.map((w) => w.value)).toEqual(['A-1', 'B-1'])
  })
})

describe('tokens against Redis itself', () => {
  it('a lease another client wrote (Mastra’s own backend) reads with no token until its holder acquires it', async () => {
    const prefix = `fence-foreign:${RUN}`
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const key = uniqueKey()
    await server.cli('SET', `${prefix}:lease:${key}`, 'mastra-run', 'PX', 60_000)
    expect(await p.getLease(key)).toEqual({ owner: 'mastra-run', token: undefined, ttlMs: expect.any(Number) })
    // A plain refresh by its holder leaves it without one; a fenced one gives it one.
    expect(await p.acquireLease(key, 'mastra-run', 60_000)).toStrictEqual({ acquired: true, owner: 'mastra-run' })
    expect((await p.getLease(key))!.token).toBeUndefined()
    const grant = await p.acquireFencedLease(key, 'mastra-run', 60_000)
    expect(grant.token).toEqual(expect.any(Number))
    expect((await p.getLease(key))!.token).toBe(grant.token)
  })

  it('a lease another client wrote without an expiry reads with ttlMs null (through a provider, a pubsub and withLeases), until its holder gives it one', async () => {
    const prefix = `fence-no-expiry:${RUN}`
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const readers = [p, closing(new RedisStreamsPubSub({ url: server.url, keyPrefix: prefix })), closing(withLeases(new EventEmitterPubSub(), p))]
    const key = uniqueKey()
    await server.cli('SET', `${prefix}:lease:${key}`, 'tool')
    for (const reader of readers) expect(await reader.getLease(key)).toEqual({ owner: 'tool', token: undefined, ttlMs: null })
    expect(await p.renewLease(key, 'tool', 60_000)).toBe(true)
    const renewed = await p.getLease(key)
    expect(renewed!.ttlMs).toBeGreaterThan(59_000)
    expect(renewed!.ttlMs).toBeLessThanOrEqual(60_000)
  })

  it('a lease Mastra’s own backend moved or granted again never reads with the token of the grant before', async () => {
    const prefix = `fence-foreign-move:${RUN}`
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const key = uniqueKey()
    const leaseKey = `${prefix}:lease:${key}`
    const a = await p.acquireFencedLease(key, 'A', 60_000)
    // Mastra's backend transfers by overwriting the lease key alone: B must not read as
    // holding A's token, and B's fenced refresh through us takes a greater one.
    await server.cli('SET', leaseKey, 'B', 'PX', 60_000)
    expect(await p.getLease(key)).toEqual({ owner: 'B', token: undefined, ttlMs: expect.any(Number) })
    const b = await p.acquireFencedLease(key, 'B', 60_000)
    expect(b.token).toBeGreaterThan(a.token!)
    expect((await p.getLease(key))!.token).toBe(b.token)
    // Its release deletes the lease key alone; C then claims through it. C's lease has no
    // token (B's is left in its key), so our transfer of it gives D none, never B's.
    await server.cli('DEL', leaseKey)
    await server.cli('SET', leaseKey, 'C', 'PX', 60_000)
    expect(await p.getLease(key)).toEqual({ owner: 'C', token: undefined, ttlMs: expect.any(Number) })
    expect(await p.transferLease(key, 'C', 'D', 60_000)).toBe(true)
    expect(await p.getLease(key)).toEqual({ owner: 'D', token: undefined, ttlMs: expect.any(Number) })
    const d = await p.acquireFencedLease(key, 'D', 60_000)
    expect(d.token).toBeGreaterThan(b.token!)
    expect((await p.getLease(key))!.token).toBe(d.token)
  })

  // Mastra's own backend releases with a one-key compare-and-delete script (its text, as it
  // sends it with EVAL); an operator DELs the key. Either frees the lease key alone.
  const mastraRelease = 'if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0'
  for (const [who, release] of [
    ["Mastra's own backend (its release script, the lease key alone)", (leaseKey: string) => server.cli('EVAL', mastraRelease, '1', leaseKey, 'worker-A')],
    ["an operator's DEL (the lease key alone)", (leaseKey: string) => server.cli('DEL', leaseKey)],
  ] as const) {
    it(`a lease released by ${who} and claimed again by our plain acquireLease inherits neither the token nor the metadata of the grant before`, async () => {
      const prefix = `fence-foreign-release:${RUN}`
      const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
      const key = uniqueKey()
      const first = await p.acquireFencedLease(key, 'worker-A', 60_000, 'run-1')
      expect(first).toStrictEqual({ acquired: true, owner: 'worker-A', token: expect.any(Number) })
      expect(await release(`${prefix}:lease:${key}`)).toBe(1)
      expect(await p.acquireLease(key, 'worker-A', 60_000)).toStrictEqual({ acquired: true, owner: 'worker-A' })
      expect(await p.getLease(key)).toEqual({ owner: 'worker-A', token: undefined, ttlMs: expect.any(Number) })
      expect(await p.getLeaseRecord(key)).toEqual({ owner: 'worker-A' })
      // The plain holder renews and releases as one: no leftover metadata stands in its way.
      expect(await p.renewLease(key, 'worker-A', 60_000)).toBe(true)
      const fenced = await p.acquireFencedLease(key, 'worker-A', 60_000)
      expect(fenced.token).toBeGreaterThan(first.token!)
      expect((await p.getLease(key))!.token).toBe(fenced.token)
      await p.releaseLease(key, 'worker-A')
      expect(await p.getLeaseOwner(key)).toBeUndefined()
    })
  }

  it.skipIf(EXTERNAL_REDIS)('tokens keep growing across a kill -9 and restart with appendonly yes and appendfsync always', async () => {
    const durable = stopLater(await startRedis({ args: ['--appendonly', 'yes', '--appendfsync', 'always'] }))
    const prefix = `fence-durable:${RUN}`
    const p = closing(new RedisLeaseProvider({ url: durable.url, keyPrefix: prefix }))
    const key = uniqueKey()
    const before = await p.acquireFencedLease(key, 'A', 60_000)
    await p.releaseLease(key, 'A')
    await durable.restart()
    let after: Grant & { token?: number } | undefined
    for (let i = 0; i < 50 && after === undefined; i++) {
      after = await p.acquireFencedLease(key, 'B', 60_000).catch(() => undefined)
      if (after === undefined) await sleep(100)
    }
    expect(after).toStrictEqual({ acquired: true, owner: 'B', token: expect.any(Number) })
    expect(after!.token).toBeGreaterThan(before.token!)
  })
})

describe('plain acquires (acquireLease) beside fenced ones', () => {
  it.skipIf(EXTERNAL_REDIS)('a plain claim and a refusal are one plain SET each (with an EXISTS beside it), and only a refresh runs the acquire script', async () => {
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: `plain:${RUN}` }))
    const key = uniqueKey()
    const scriptsAndSets = async () => {
      const calls = await server.commandCalls()
      return { evalsha: calls.evalsha ?? 0, set: calls.set ?? 0, exists: calls.exists ?? 0 }
    }
    let before = await scriptsAndSets()
    const step = async <T>(call: () => Promise<T>, expected: { evalsha: number; set: number; exists: number }): Promise<T> => {
      const answer = await call()
      const after = await scriptsAndSets()
      expect({ evalsha: after.evalsha - before.evalsha, set: after.set - before.set, exists: after.exists - before.exists }).toEqual(expected)
      before = after
      return answer
    }
    // Beside each plain SET, an EXISTS of the lease's metadata and token keys (in the same
    // pipeline): none is there, so no script runs.
    expect(await step(() => p.acquireLease(key, 'A', 60_000), { evalsha: 0, set: 1, exists: 1 })).toStrictEqual({ acquired: true, owner: 'A' })
    expect(await step(() => p.acquireLease(key, 'B', 60_000), { evalsha: 0, set: 1, exists: 1 })).toStrictEqual({ acquired: false, owner: 'A' })
    // The plain SET found A holding: the script refreshes (its SET NX GET counts as a set).
    await server.cli('PEXPIRE', `plain:${RUN}:lease:${key}`, 1_000)
    expect(await step(() => p.acquireLease(key, 'A', 60_000), { evalsha: 1, set: 2, exists: 1 })).toStrictEqual({ acquired: true, owner: 'A' })
    expect(Number(await server.cli('PTTL', `plain:${RUN}:lease:${key}`))).toBeGreaterThan(59_000)
    expect(await p.getLease(key)).toEqual({ owner: 'A', token: undefined, ttlMs: expect.any(Number) })
    // Nothing but the lease key: no metadata key, no token key, no counter.
    expect(await server.cli('KEYS', `plain:${RUN}:*`)).toEqual([`plain:${RUN}:lease:${key}`])
  })

  it('a fleet mixing plain and fenced grants never shows one grant the token of another, and tokens only grow', async () => {
    const prefix = `mixed:${RUN}:${randomUUID().slice(0, 8)}`
    // Two processes' providers on one prefix: one asks for tokens, the other never does.
    const fencing = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const plain = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const key = uniqueKey()
    const first = await fencing.acquireFencedLease(key, 'A', 60_000)
    expect(first.token).toEqual(expect.any(Number))
    // A lease with a token keeps one through a plain transfer: B gets a greater one.
    expect(await plain.transferLease(key, 'A', 'B', 60_000)).toBe(true)
    const b = (await fencing.getLease(key))!
    expect(b.owner).toBe('B')
    expect(b.token).toBeGreaterThan(first.token!)
    // A plain refresh keeps B's token and does not tell it; the fenced one does.
    expect(await plain.acquireLease(key, 'B', 60_000)).toStrictEqual({ acquired: true, owner: 'B' })
    expect((await fencing.acquireFencedLease(key, 'B', 60_000)).token).toBe(b.token)
    // A plain release removes the token with the lease; a plain claim then has none.
    await plain.releaseLease(key, 'B')
    expect(await plain.acquireLease(key, 'C', 60_000)).toStrictEqual({ acquired: true, owner: 'C' })
    expect(await fencing.getLease(key)).toEqual({ owner: 'C', token: undefined, ttlMs: expect.any(Number) })
    // C's fenced refresh gives the lease a token, greater than B's.
    const c = await fencing.acquireFencedLease(key, 'C', 60_000)
    expect(c.token).toBeGreaterThan(b.token!)
    await plain.releaseLease(key, 'C')
    // A plain renew keeps the token for the renewed TTL: past the first one, it is still the lease's.
    const d = await fencing.acquireFencedLease(key, 'D', 300)
    expect(d.token).toBeGreaterThan(c.token!)
    expect(await plain.renewLease(key, 'D', 60_000)).toBe(true)
    await sleep(400)
    expect(await fencing.getLease(key)).toEqual({ owner: 'D', token: d.token, ttlMs: expect.any(Number) })
  })

  it("RedisStreamsPubSub's and withLeases' plain acquires take no token either, and their fenced ones do", async () => {
    const prefix = `plain-pubsubs:${RUN}`
    const pubsubs = [
      fenced(closing(new RedisStreamsPubSub({ url: server.url, keyPrefix: prefix }))),
      fenced(closing(withLeases(new EventEmitterPubSub(), closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))))),
    ]
    for (const p of pubsubs) {
      const key = uniqueKey()
      expect(await p.acquireLease(key, 'A', 60_000)).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await p.getLease(key)).toEqual({ owner: 'A', token: undefined, ttlMs: expect.any(Number) })
      expect(await p.acquireFencedLease(key, 'A', 60_000)).toStrictEqual({ acquired: true, owner: 'A', token: expect.any(Number) })
    }
  })

  it('the fencingTokens option is gone: passing it, true or false, throws ERR_LEASE_INVALID_OPTION saying acquireFencedLease replaces it', () => {
    for (const fencingTokens of [true, false]) {
      for (const make of [
        () => new RedisLeaseProvider({ url: server.url, fencingTokens } as never),
        () => new RedisStreamsPubSub({ url: server.url, fencingTokens } as never),
      ]) {
        const err = expectThrow(make, TypeError, 'ERR_LEASE_INVALID_OPTION')
        expect(err.message).toMatch(/unknown option fencingTokens; it is gone: .*acquireFencedLease/)
      }
    }
  })
})

describe.skipIf(EXTERNAL_REDIS)('a holder frozen past its TTL, with a resource that checks tokens', () => {
  it('loses no write of a current holder and takes no write of the holder that resumed', async ({ annotate }) => {
    const TTL = 500
    const prefix = `fence-frozen:${RUN}`
    const key = uniqueKey()
    const resource = new FencedResource()
    const child = await LeaseChild.start({ store: 'redis', url: server.url, keyPrefix: prefix })
    const peer = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    try {
      const held = await child.call<Grant & { token: number }>('acquireFencedLease', key, 'client', TTL)
      expect(held.acquired).toBe(true)
      // The holder writes with its token while it holds the lease.
      expect(resource.write(held.token, 'client-1')).toBe(true)
      child.signal('SIGSTOP')
      await sleep(TTL + 300)
      // The lease expired under the frozen holder; the peer takes it and writes.
      const taken = await peer.acquireFencedLease(key, 'peer', 60_000)
      expect(taken).toStrictEqual({ acquired: true, owner: 'peer', token: expect.any(Number) })
      expect(resource.write(taken.token!, 'peer-1')).toBe(true)
      child.signal('SIGCONT')
      // The resumed holder writes at once with the token it still believes in: refused.
      expect(resource.write(held.token, 'client-late')).toBe(false)
      // Its next renew tells it the lease is gone; the peer's writes keep landing.
      expect(await child.call<boolean>('renewLease', key, 'client', TTL)).toBe(false)
      expect(resource.write(taken.token!, 'peer-2')).toBe(true)
      expect(resource.accepted.map((w) => w.value)).toEqual(['client-1', 'peer-1', 'peer-2'])
      expect(resource.refused.map((w) => w.value)).toEqual(['client-late'])
      await annotate(`tokens: client ${held.token}, peer ${taken.token}; ${resource.accepted.length} writes taken, ${resource.refused.length} stale refused`)
    } finally {
      await child.stop()
    }
  })
})
