// What the Redis provider keeps in Redis and sends there: the wire layout Mastra's own Redis
// backend uses (a lease is the plain owner string at `<prefix>:lease:<key>` with a PX expiry,
// so either side reads and respects the other's leases), a key of another type where a lease
// would be, bad input that never reaches Redis, and one connection shared by every call.
import { randomUUID } from 'node:crypto'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisLeaseProvider } from '../index.js'
import { everyCall, expectRejection, leaseFailureWarnings, settleWithin, sleep, uniqueKey, untyped } from './helpers/lease.js'
import { perTest } from './helpers/per-test.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

const LONG = 60_000

const { provider, ownServer } = perTest()
// A key of the wrong type fails lease calls, which warn through process.emitWarning (no logger here).
const leaseWarnings = leaseFailureWarnings()

describe('RedisLeaseProvider', () => {
  describe('wire layout (compatible with Mastra’s own Redis backend)', () => {
    let server: RedisServer
    beforeAll(async () => {
      server = await startRedis()
    })
    afterAll(async () => {
      await server?.stop()
    })

    it('stores a lease at mastra:topic:lease:<key> as the plain owner string with a PX expiry', async () => {
      const p = provider({ url: server.url })
      const key = `${uniqueKey('wire')}\0thread`
      const redisKey = `mastra:topic:lease:${key}`
      await p.acquireLease(key, 'owner-1', 10_000)
      expect(await server.cli('TYPE', redisKey)).toBe('string')
      expect(await server.cli('GET', redisKey)).toBe('owner-1')
      const pttl = Number(await server.cli('PTTL', redisKey))
      expect(pttl).toBeGreaterThan(9_000)
      expect(pttl).toBeLessThanOrEqual(10_000)

      expect(await p.renewLease(key, 'owner-1', 30_000)).toBe(true)
      expect(Number(await server.cli('PTTL', redisKey))).toBeGreaterThan(29_000)

      await p.acquireLease(key, 'owner-1', 40_000) // same-owner re-acquire refreshes the TTL
      expect(Number(await server.cli('PTTL', redisKey))).toBeGreaterThan(39_000)

      expect(await p.transferLease(key, 'owner-1', 'owner-2', 20_000)).toBe(true)
      expect(await server.cli('GET', redisKey)).toBe('owner-2')
      const after = Number(await server.cli('PTTL', redisKey))
      expect(after).toBeGreaterThan(19_000)
      expect(after).toBeLessThanOrEqual(20_000)

      await p.releaseLease(key, 'owner-2')
      expect(await server.cli('EXISTS', redisKey)).toBe(0)
    })

    it('uses a custom keyPrefix verbatim', async () => {
      const prefix = `custom:${randomUUID()}`
      const p = provider({ url: server.url, keyPrefix: prefix })
      const key = uniqueKey('prefixed')
      await p.acquireLease(key, 'A', 10_000)
      expect(await server.cli('GET', `${prefix}:lease:${key}`)).toBe('A')
      expect(await server.cli('EXISTS', `mastra:topic:lease:${key}`)).toBe(0)
      // A provider with the default prefix does not see it.
      const other = provider({ url: server.url })
      expect(await other.getLeaseOwner(key)).toBeUndefined()
    })

    it('respects a lease written by a plain SET ... PX, as Mastra’s own backend writes them', async () => {
      const prefix = `interop:${randomUUID()}`
      const p = provider({ url: server.url, keyPrefix: prefix })
      const key = `${uniqueKey('interop')}\0thread`
      const redisKey = `${prefix}:lease:${key}`
      expect(await server.cli('SET', redisKey, 'their-owner', 'PX', 10_000)).toBe('OK')
      expect(await p.getLeaseOwner(key)).toBe('their-owner')
      expect(await p.acquireLease(key, 'us', LONG)).toEqual({ acquired: false, owner: 'their-owner' })
      expect(await p.renewLease(key, 'us', LONG)).toBe(false)
      await p.releaseLease(key, 'us')
      expect(await server.cli('GET', redisKey)).toBe('their-owner')
      // The same owner, from another process using this package, can carry on.
      expect(await p.renewLease(key, 'their-owner', 30_000)).toBe(true)
      expect(Number(await server.cli('PTTL', redisKey))).toBeGreaterThan(29_000)
      expect(await p.transferLease(key, 'their-owner', 'us', 30_000)).toBe(true)
      expect(await server.cli('GET', redisKey)).toBe('us')
      await p.releaseLease(key, 'us')
      expect(await server.cli('EXISTS', redisKey)).toBe(0)
    })

    it('writes only the lease key through a lifecycle as Mastra calls it, a transfer included, and publishes nothing, as Mastra’s own backend does', async () => {
      const prefix = `lifecycle:${randomUUID()}`
      const p = provider({ url: server.url, keyPrefix: prefix })
      const key = `${uniqueKey('lifecycle')}\0thread`
      const keys = async () => ((await server.cli('KEYS', `${prefix}:*`)) as string[]).sort()
      // Nobody waits for the lease: its transfer and release wake nobody (docs/waiting.md).
      const publishes = async () => {
        const calls = await server.commandCalls()
        return (calls['spublish'] ?? 0) + (calls['publish'] ?? 0)
      }
      const published = await publishes()
      expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await p.renewLease(key, 'A', LONG)).toBe(true)
      expect(await p.transferLease(key, 'A', 'B', LONG)).toBe(true)
      // On one server only this client sends a transfer again, and says so: no id is kept.
      expect(await keys()).toEqual([`${prefix}:lease:${key}`])
      expect(await p.renewLease(key, 'B', LONG)).toBe(true)
      expect(await keys()).toEqual([`${prefix}:lease:${key}`])
      await p.releaseLease(key, 'B')
      expect(await keys()).toEqual([])
      // (Another suite may publish on a shared external server meanwhile.)
      if (!EXTERNAL_REDIS) expect(await publishes()).toBe(published)
    })

    it('sees a lease expire when Redis expires it', async () => {
      const p = provider({ url: server.url })
      const key = uniqueKey('px')
      await server.cli('SET', `mastra:topic:lease:${key}`, 'A', 'PX', 100)
      expect(await p.getLeaseOwner(key)).toBe('A')
      await sleep(250)
      expect(await p.getLeaseOwner(key)).toBeUndefined()
      expect(await p.renewLease(key, 'A', LONG)).toBe(false)
      expect(await server.cli('EXISTS', `mastra:topic:lease:${key}`)).toBe(0)
    })

    it('two providers on one server coordinate: 200 owners racing through 4 providers, one winner', async () => {
      const ps = Array.from({ length: 4 }, () => provider({ url: server.url }))
      const key = uniqueKey('distributed')
      const results = await Promise.all(
        Array.from({ length: 200 }, (_, i) => ps[i % 4]!.acquireLease(key, `owner-${i}`, LONG)),
      )
      const winners = results.filter((r) => r.acquired)
      expect(winners).toHaveLength(1)
      for (const r of results) expect(r.owner).toBe(winners[0]!.owner)
      for (const q of ps) expect(await q.getLeaseOwner(key)).toBe(winners[0]!.owner)
      expect(await server.cli('GET', `mastra:topic:lease:${key}`)).toBe(winners[0]!.owner)
    })

    it('renewLease(key, owner, 0) rejects with a RangeError and the lease is still there', async () => {
      const p = provider({ url: server.url })
      const key = uniqueKey('renew-zero')
      const redisKey = `mastra:topic:lease:${key}`
      await p.acquireLease(key, 'A', 10_000)
      await expectRejection(() => p.renewLease(key, 'A', 0), RangeError, 'ERR_LEASE_INVALID_TTL')
      expect(await server.cli('GET', redisKey)).toBe('A')
      expect(Number(await server.cli('PTTL', redisKey))).toBeGreaterThan(9_000)
      expect(await p.getLeaseOwner(key)).toBe('A')
    })

    it('a Redis error (WRONGTYPE) rejects every call with ERR_LEASE_REDIS and leaves the key alone', async () => {
      const p = provider({ url: server.url })
      const key = uniqueKey('wrongtype')
      const redisKey = `mastra:topic:lease:${key}`
      await server.cli('HSET', redisKey, 'field', 'value')
      for (const [name, call] of everyCall(p, key)) {
        const err = await expectRejection(call, Error, 'ERR_LEASE_REDIS').catch((e: unknown) => {
          throw new Error(`${name}: ${String(e)}`)
        })
        expect(err.message).toMatch(/WRONGTYPE/)
      }
      expect(await server.cli('TYPE', redisKey)).toBe('hash')
      expect(await server.cli('HGET', redisKey, 'field')).toBe('value')
      // Redis errors are failures too: reported (without a logger, as a process warning).
      await leaseWarnings.warned('ERR_LEASE_REDIS')
    })
  })

  describe('bad input and connections', () => {
    it.skipIf(EXTERNAL_REDIS)('bad input sends no command to Redis', async () => {
      const server = await ownServer()
      const p = provider({ url: server.url })
      const key = uniqueKey('no-io')
      await p.acquireLease(key, 'A', LONG) // connected and scripts loaded
      const before = await server.commandCalls()
      const u = untyped(p)
      const bad: Array<() => unknown> = [
        () => u.acquireLease('', 'A', LONG),
        () => u.acquireLease(key, 'A', 0),
        () => u.acquireLease(key, 'A', '100'),
        () => u.acquireLease(key, '\uD800', LONG),
        () => u.acquireLease('k'.repeat(4097), 'A', LONG),
        () => u.getLeaseOwner(null),
        () => u.getLeaseOwner(key + '\uDC00'),
        () => u.releaseLease(key, ''),
        () => u.releaseLease(key, 'o'.repeat(1025)),
        () => u.renewLease(key, 'A', 0),
        () => u.renewLease(key, 'A', 1.5),
        () => u.renewLease(key, 'A', 100n),
        () => u.transferLease(key, 'A', '', LONG),
        () => u.transferLease(key, 'A', 'B', Number.NaN),
        () => u.transferLease(key, 123, 'B', LONG),
      ]
      for (const call of bad) {
        const r = await settleWithin(Promise.resolve().then(call), 2_000)
        expect(r.status).toBe('rejected')
      }
      const after = await server.commandCalls()
      // INFO (ours, and the eviction-policy check's) and CLIENT SETNAME come from the set-up
      // task a fresh connection runs after its first call succeeded, at a time of its own.
      const setUp = ['info', 'client|setname']
      const changed = Object.keys(after).filter((cmd) => !setUp.includes(cmd) && after[cmd] !== (before[cmd] ?? 0))
      expect(changed, 'commands sent for bad input').toEqual([])
      expect(await server.cli('GET', `mastra:topic:lease:${key}`)).toBe('A')
    })

    it.skipIf(EXTERNAL_REDIS)('the calls share two connections, a key’s calls on the one its calls in flight are on, in the order made across turns; close() drops them', async () => {
      const server = await ownServer()
      const clients = async () => Number((await server.info('clients')).connected_clients)
      const baseline = await clients()
      const p = provider({ url: server.url })
      const key = uniqueKey('two-conns')
      const calls = Array.from({ length: 30 }, (_, i) => everyCall(p, `${key}:${i % 3}`)[i % 5]![1]())
      await Promise.all(calls)
      // Each opens on first use: the three keys' calls may all have gone on one.
      expect([baseline + 1, baseline + 2]).toContain(await clients())
      // Steady use on many keys opens the second, and no more.
      await Promise.all(Array.from({ length: 100 }, (_, i) => p.acquireLease(`${key}:more:${i}`, 'A', LONG)))
      expect(await clients()).toBe(baseline + 2)
      // A key's calls made in turns one after another, none awaited, take effect in that
      // order: on another connection, B's acquire could overtake A's release.
      const turn = () => new Promise((resolve) => setImmediate(resolve))
      const keys = Array.from({ length: 64 }, (_, i) => `${key}:order:${i}`)
      const first = keys.map((k) => p.acquireLease(k, 'A', LONG))
      await turn()
      const released = keys.map((k) => p.releaseLease(k, 'A'))
      await turn()
      const second = keys.map((k) => p.acquireLease(k, 'B', LONG))
      await Promise.all([...first, ...released])
      expect(await Promise.all(second)).toEqual(keys.map(() => ({ acquired: true, owner: 'B' })))
      await p.close()
      const deadline = Date.now() + 2_000
      while ((await clients()) !== baseline && Date.now() < deadline) await sleep(20)
      expect(await clients()).toBe(baseline)
    })

    it.skipIf(EXTERNAL_REDIS)('64 callers each awaiting its call before the next, as agents do: a turn’s calls go whole on one connection, so Redis reads them 24 or more at a time (spread by key turn after turn, the batches shrank to a few calls)', async ({ annotate }) => {
      const server = await ownServer()
      const p = provider({ url: server.url })
      const key = uniqueKey('turns')
      const lifecycles = async (units: number) => {
        let next = 0
        await Promise.all(Array.from({ length: 64 }, async (_, w) => {
          for (let i; (i = next++) < units;) {
            const k = `${key}:${i}`
            expect(await p.acquireLease(k, `a${w}`, LONG)).toEqual({ acquired: true, owner: `a${w}` })
            expect(await p.renewLease(k, `a${w}`, LONG)).toBe(true)
            expect(await p.getLeaseOwner(k)).toBe(`a${w}`)
            expect(await p.transferLease(k, `a${w}`, `b${w}`, LONG)).toBe(true)
            await p.releaseLease(k, `b${w}`)
          }
        }))
      }
      await lifecycles(256) // both connections open
      const reads = async () => Number((await server.info('stats')).total_reads_processed)
      const before = await reads()
      await lifecycles(1_000)
      // The test's own INFO is one read more.
      const perCall = (await reads() - before - 1) / 5_000
      await annotate(`Redis's reads per call: ${perCall.toFixed(3)} (one per ${Math.round(1 / perCall)} calls)`)
      expect(perCall).toBeLessThan(1 / 24)
    })
  })
})
