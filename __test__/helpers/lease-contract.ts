// The lease contract as tests, for any provider: lease-contract.spec.ts runs it on the
// in-memory store and one redis-server (each also through withLeases), lease-topologies.spec.ts
// on a Redis Cluster and behind Sentinel (RedisLeaseProvider and RedisStreamsPubSub's leases).
// Mastra's LeaseProvider, with this package's lease records (metadata), and this
// package's fenced grants.
import { randomUUID } from 'node:crypto'

import { afterEach, beforeEach, describe, expect, it } from 'vitest'

import {
  complete,
  expectRejection,
  expectThrow,
  LEASE_METHODS,
  settleWithin,
  sleep,
  uniqueKey,
  untyped,
  type CompleteLeaseApi,
  type LeaseLimitsOptions,
  type LeaseRecordApi,
} from './lease.js'

export type MakeProvider = (limits?: LeaseLimitsOptions) => LeaseRecordApi

export interface ContractOptions {
  /**
   * Calls per command the provider's Redis has run (`INFO commandstats`), where the test can
   * read them (its own single server): bad input is then shown to send nothing at all.
   */
  commandCalls?: () => Promise<Record<string, number>>
}

const LONG = 60_000
const MISSING = Symbol('missing argument')
const utf8 = (s: string) => Buffer.byteLength(s, 'utf8')

/** Cut `s` to at most `max` UTF-8 bytes without splitting a code point. */
function cutToBytes(s: string, max: number): string {
  let out = ''
  for (const ch of s) {
    if (utf8(out + ch) > max) break
    out += ch
  }
  return out
}

interface BadCase {
  label: string
  value: unknown
  cls: typeof TypeError | typeof RangeError
  /** What a sloppy implementation might turn the value into (coercion, U+FFFD, truncation). */
  near?: string
}

/** Bad strings for a key or owner argument, derived from a valid `base` so near-misses are observable. */
function badStrings(base: string, maxBytes: number): BadCase[] {
  const tooLongAscii = base + 'x'.repeat(maxBytes + 1 - utf8(base))
  // 2-byte characters: fewer UTF-16 units than the cap, more UTF-8 bytes than the cap.
  const twoByte = 'é'.repeat(Math.floor(maxBytes / 2) + 1)
  return [
    { label: 'a number', value: 123, cls: TypeError, near: '123' },
    { label: 'undefined', value: undefined, cls: TypeError, near: 'undefined' },
    { label: 'the argument left out', value: MISSING, cls: TypeError, near: 'undefined' },
    { label: 'null', value: null, cls: TypeError, near: 'null' },
    { label: 'an object', value: { toString: () => base }, cls: TypeError, near: base },
    { label: 'an array', value: [base], cls: TypeError, near: base },
    { label: 'a boolean', value: true, cls: TypeError, near: 'true' },
    { label: 'a String object', value: new String(base), cls: TypeError, near: base },
    { label: 'a lone high surrogate', value: base + '\uD800', cls: TypeError, near: base + '\uFFFD' },
    { label: 'a lone low surrogate', value: base + '\uDC00x', cls: TypeError, near: base + '\uFFFDx' },
    { label: 'a surrogate pair in reverse order', value: base + '\uDE00\uD83D', cls: TypeError, near: base + '\uFFFD\uFFFD' },
    { label: 'the empty string', value: '', cls: RangeError },
    { label: `${maxBytes + 1} ASCII bytes`, value: tooLongAscii, cls: RangeError, near: cutToBytes(tooLongAscii, maxBytes) },
    {
      label: `${twoByte.length} two-byte characters (${utf8(twoByte)} UTF-8 bytes)`,
      value: twoByte,
      cls: RangeError,
      near: cutToBytes(twoByte, maxBytes),
    },
  ]
}

const BAD_TTLS: BadCase[] = [
  { label: "the string '100'", value: '100', cls: TypeError },
  { label: 'undefined', value: undefined, cls: TypeError },
  { label: 'the argument left out', value: MISSING, cls: TypeError },
  { label: 'the BigInt 100n', value: 100n, cls: TypeError },
  { label: 'null', value: null, cls: TypeError },
  { label: 'a boolean', value: true, cls: TypeError },
  { label: 'an object', value: { valueOf: () => 100 }, cls: TypeError },
  { label: '0', value: 0, cls: RangeError },
  { label: '-0', value: -0, cls: RangeError },
  { label: '-1', value: -1, cls: RangeError },
  { label: 'NaN', value: Number.NaN, cls: RangeError },
  { label: 'Infinity', value: Number.POSITIVE_INFINITY, cls: RangeError },
  { label: '-Infinity', value: Number.NEGATIVE_INFINITY, cls: RangeError },
  { label: '1.5', value: 1.5, cls: RangeError },
  { label: '2**53 (not a safe integer)', value: 2 ** 53, cls: RangeError },
  { label: '2**60', value: 2 ** 60, cls: RangeError },
  { label: 'maxTtlMs + 1 (86 400 001)', value: 86_400_001, cls: RangeError },
]

/**
 * Build an argument list. A MISSING last argument is dropped, so the call really has
 * fewer arguments; anywhere else it becomes undefined, so every other argument stays
 * valid and only the one under test is bad.
 */
function args(...list: unknown[]): unknown[] {
  if (list.at(-1) === MISSING) return list.slice(0, -1)
  return list.map((v) => (v === MISSING ? undefined : v))
}

/**
 * A fresh connection's own setup, sent once after its first call succeeded and without
 * delaying any, so it may land after a reading taken right after that call: the eviction-policy
 * check (`INFO memory`, `INFO` being the readings' own command too) and the connection name.
 */
const CONNECTION_SETUP = new Set(['info', 'client|setname'])

/** The commands that ran between two `INFO commandstats` readings, a connection's setup left out. */
function commandsBetween(before: Record<string, number>, after: Record<string, number>): string[] {
  return Object.keys(after)
    .filter((cmd) => !CONNECTION_SETUP.has(cmd) && after[cmd] !== (before[cmd] ?? 0))
    .map((cmd) => `${cmd}: ${(after[cmd] ?? 0) - (before[cmd] ?? 0)}`)
}

/**
 * Everything Mastra's LeaseProvider contract promises (`@mastra/core`'s
 * `dist/events/pubsub.d.ts`), and this package's lease records (metadata with each
 * holder), as tests of the provider `makeProvider` makes.
 */
export function describeLeaseContract(name: string, makeProvider: MakeProvider, { commandCalls }: ContractOptions = {}) {
  /** What a grant to `owner` resolves to: Mastra's shape exactly, no token (checked with toStrictEqual). */
  const granted = (owner: string) => ({ acquired: true, owner })
  describe(`${name} (LeaseProvider contract)`, () => {
    const opened: LeaseRecordApi[] = []
    const open = (limits?: LeaseLimitsOptions): CompleteLeaseApi => {
      const provider = makeProvider(limits)
      opened.push(provider)
      // Every provider here is a LeaseRecordProvider with fenced grants.
      return complete(provider)
    }
    let p: CompleteLeaseApi
    beforeEach(() => {
      p = open()
    })
    afterEach(async () => {
      await Promise.allSettled(opened.splice(0).map((x) => x.close()))
    })

    describe('acquire, owner, release, renew and transfer', () => {
      it('acquire on a free key grants it and getLeaseOwner reports the owner', async () => {
        const key = uniqueKey('free')
        expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual(granted('A'))
        expect(await p.getLeaseOwner(key)).toBe('A')
      })

      it('getLeaseOwner resolves undefined, not null, for a key nobody holds', async () => {
        const key = uniqueKey('nobody')
        const owner = await p.getLeaseOwner(key)
        expect(owner).toBeUndefined()
        expect(owner).not.toBeNull()
      })

      it('a second owner loses and is told who holds the lease', async () => {
        const key = uniqueKey('loser')
        await p.acquireLease(key, 'A', LONG)
        expect(await p.acquireLease(key, 'B', LONG)).toStrictEqual({ acquired: false, owner: 'A' })
        expect(await p.getLeaseOwner(key)).toBe('A')
      })

      it('owners are compared exactly, with no case folding, trimming or truncation at NUL', async () => {
        const key = uniqueKey('exact-owner')
        await p.acquireLease(key, 'owner', LONG)
        for (const other of ['Owner', 'owner ', ' owner', 'owner\0', 'owne', 'owner\0x']) {
          expect(await p.acquireLease(key, other, LONG)).toStrictEqual({ acquired: false, owner: 'owner' })
          expect(await p.renewLease(key, other, LONG)).toBe(false)
          await p.releaseLease(key, other)
          expect(await p.transferLease(key, other, 'thief', LONG)).toBe(false)
        }
        expect(await p.getLeaseOwner(key)).toBe('owner')
      })

      it('same-owner re-acquire succeeds and refreshes the TTL', async () => {
        const key = uniqueKey('reacquire')
        expect(await p.acquireLease(key, 'A', 150)).toStrictEqual(granted('A'))
        expect(await p.acquireLease(key, 'A', 5_000)).toStrictEqual(granted('A'))
        await sleep(350)
        expect(await p.getLeaseOwner(key)).toBe('A')
        expect(await p.acquireLease(key, 'B', LONG)).toStrictEqual({ acquired: false, owner: 'A' })
      })

      it('a lease is held until its TTL runs out, then anyone can take it', async () => {
        const key = uniqueKey('expiry')
        await p.acquireLease(key, 'A', 300)
        await sleep(100)
        expect(await p.getLeaseOwner(key)).toBe('A')
        expect(await p.acquireLease(key, 'B', LONG)).toStrictEqual({ acquired: false, owner: 'A' })
        await sleep(350)
        expect(await p.getLeaseOwner(key)).toBeUndefined()
        expect(await p.acquireLease(key, 'B', LONG)).toStrictEqual(granted('B'))
        expect(await p.getLeaseOwner(key)).toBe('B')
      })

      it('release by the holder frees the key for others', async () => {
        const key = uniqueKey('release')
        await p.acquireLease(key, 'A', LONG)
        expect(await p.releaseLease(key, 'A')).toBeUndefined()
        expect(await p.getLeaseOwner(key)).toBeUndefined()
        expect(await p.acquireLease(key, 'B', LONG)).toStrictEqual(granted('B'))
      })

      it('release by a non-owner is a no-op', async () => {
        const key = uniqueKey('release-non-owner')
        await p.acquireLease(key, 'A', LONG)
        expect(await p.releaseLease(key, 'B')).toBeUndefined()
        expect(await p.getLeaseOwner(key)).toBe('A')
        expect(await p.acquireLease(key, 'B', LONG)).toStrictEqual({ acquired: false, owner: 'A' })
      })

      it('release of a key nobody holds resolves and creates nothing', async () => {
        const key = uniqueKey('release-free')
        expect(await p.releaseLease(key, 'A')).toBeUndefined()
        expect(await p.getLeaseOwner(key)).toBeUndefined()
      })

      it('release after expiry does not release a lease another owner took since', async () => {
        const key = uniqueKey('release-stale')
        await p.acquireLease(key, 'A', 60)
        await sleep(100)
        expect(await p.acquireLease(key, 'B', LONG)).toStrictEqual(granted('B'))
        await p.releaseLease(key, 'A')
        expect(await p.getLeaseOwner(key)).toBe('B')
      })

      it('renew by the holder extends the lease past its original TTL', async () => {
        const key = uniqueKey('renew')
        await p.acquireLease(key, 'A', 250)
        await sleep(100)
        expect(await p.renewLease(key, 'A', 5_000)).toBe(true)
        await sleep(300)
        expect(await p.getLeaseOwner(key)).toBe('A')
        expect(await p.renewLease(key, 'A', 5_000)).toBe(true)
      })

      it('renew after expiry returns false and does not resurrect the lease', async () => {
        const key = uniqueKey('renew-expired')
        await p.acquireLease(key, 'A', 60)
        // Just past expiry, before any periodic sweep is likely to have reclaimed the entry.
        await sleep(100)
        expect(await p.renewLease(key, 'A', LONG)).toBe(false)
        expect(await p.getLeaseOwner(key)).toBeUndefined()
        await sleep(150)
        expect(await p.getLeaseOwner(key)).toBeUndefined()
        expect(await p.acquireLease(key, 'B', LONG)).toStrictEqual(granted('B'))
      })

      it('renew by a non-owner returns false and neither changes the holder nor extends its TTL', async () => {
        const key = uniqueKey('renew-non-owner')
        await p.acquireLease(key, 'A', 250)
        expect(await p.renewLease(key, 'B', LONG)).toBe(false)
        expect(await p.getLeaseOwner(key)).toBe('A')
        await sleep(400)
        expect(await p.getLeaseOwner(key)).toBeUndefined()
      })

      it('renew on a key nobody holds returns false and creates nothing', async () => {
        const key = uniqueKey('renew-free')
        expect(await p.renewLease(key, 'A', LONG)).toBe(false)
        expect(await p.getLeaseOwner(key)).toBeUndefined()
      })

      it('transfer hands the lease to the new owner with a fresh TTL', async () => {
        const key = uniqueKey('transfer')
        await p.acquireLease(key, 'A', 250)
        await sleep(100)
        expect(await p.transferLease(key, 'A', 'B', 5_000)).toBe(true)
        expect(await p.getLeaseOwner(key)).toBe('B')
        await sleep(300) // past A's original expiry
        expect(await p.getLeaseOwner(key)).toBe('B')
        // The old owner has lost every right over the lease.
        expect(await p.renewLease(key, 'A', LONG)).toBe(false)
        await p.releaseLease(key, 'A')
        expect(await p.transferLease(key, 'A', 'C', LONG)).toBe(false)
        expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: false, owner: 'B' })
        // The new one has them all.
        expect(await p.renewLease(key, 'B', LONG)).toBe(true)
        await p.releaseLease(key, 'B')
        expect(await p.getLeaseOwner(key)).toBeUndefined()
      })

      it('transfer gives the new owner the TTL it asks for, not the old one', async () => {
        const key = uniqueKey('transfer-ttl')
        await p.acquireLease(key, 'A', LONG)
        expect(await p.transferLease(key, 'A', 'B', 150)).toBe(true)
        await sleep(350)
        expect(await p.getLeaseOwner(key)).toBeUndefined()
      })

      it('transfer by a non-owner returns false and leaves the holder unchanged', async () => {
        const key = uniqueKey('transfer-non-owner')
        await p.acquireLease(key, 'A', LONG)
        expect(await p.transferLease(key, 'B', 'C', LONG)).toBe(false)
        expect(await p.getLeaseOwner(key)).toBe('A')
      })

      it('transfer after expiry returns false and does not resurrect the lease', async () => {
        const key = uniqueKey('transfer-expired')
        await p.acquireLease(key, 'A', 60)
        await sleep(100)
        expect(await p.transferLease(key, 'A', 'B', LONG)).toBe(false)
        expect(await p.getLeaseOwner(key)).toBeUndefined()
        await sleep(150)
        expect(await p.getLeaseOwner(key)).toBeUndefined()
        expect(await p.acquireLease(key, 'C', LONG)).toStrictEqual(granted('C'))
      })

      it('transfer of a key nobody holds returns false and grants nothing', async () => {
        const key = uniqueKey('transfer-free')
        expect(await p.transferLease(key, 'A', 'B', LONG)).toBe(false)
        expect(await p.getLeaseOwner(key)).toBeUndefined()
      })

      it('transfer never leaves the key empty: racing acquirers never win and readers never see it free', async () => {
        const key = uniqueKey('transfer-gap')
        await p.acquireLease(key, 'A', LONG)
        let done = false
        let racerWins = 0
        let sawEmpty = 0
        let racerCalls = 0
        const racer = async (id: number) => {
          while (!done) {
            // Let the event loop turn, so a provider that answers synchronously still interleaves.
            await new Promise((r) => setImmediate(r))
            const res = await p.acquireLease(key, `racer-${id}`, LONG)
            racerCalls++
            if (res.acquired) racerWins++
            if ((await p.getLeaseOwner(key)) === undefined) sawEmpty++
          }
        }
        const racers = [0, 1, 2, 3].map(racer)
        const results: boolean[] = []
        let from = 'A'
        for (let i = 0; i < 200; i++) {
          const to = from === 'A' ? 'B' : 'A'
          results.push(await p.transferLease(key, from, to, LONG))
          from = to
        }
        done = true
        await Promise.all(racers)
        expect(results.every(Boolean)).toBe(true)
        expect(racerCalls).toBeGreaterThan(0)
        expect(racerWins).toBe(0)
        expect(sawEmpty).toBe(0)
        expect(await p.getLeaseOwner(key)).toBe(from)
      })

      it('exactly one of 200 owners racing for one key wins, and every loser names the winner', async () => {
        const key = uniqueKey('race')
        const results = await Promise.all(
          Array.from({ length: 200 }, (_, i) => p.acquireLease(key, `owner-${i}`, LONG)),
        )
        const winners = results.filter((r) => r.acquired)
        expect(winners).toHaveLength(1)
        const winner = winners[0]!.owner
        expect(winner).toMatch(/^owner-\d+$/)
        for (const loser of results.filter((r) => !r.acquired)) expect(loser.owner).toBe(winner)
        expect(await p.getLeaseOwner(key)).toBe(winner)
      })

      it('leases on many distinct keys are independent', async () => {
        const keys = Array.from({ length: 100 }, (_, i) => uniqueKey(`many-${i}`))
        const granted = await Promise.all(keys.map((k, i) => p.acquireLease(k, `owner-${i}`, LONG)))
        expect(granted.every((r, i) => r.acquired && r.owner === `owner-${i}`)).toBe(true)
        // Release the even ones, renew the odd ones with a short TTL, transfer every fifth.
        await Promise.all(keys.map((k, i) => (i % 2 === 0 ? p.releaseLease(k, `owner-${i}`) : undefined)))
        await Promise.all(keys.map((k, i) => (i % 5 === 1 ? p.transferLease(k, `owner-${i}`, `next-${i}`, LONG) : undefined)))
        const owners = await Promise.all(keys.map((k) => p.getLeaseOwner(k)))
        owners.forEach((owner, i) => {
          const expected = i % 2 === 0 ? undefined : i % 5 === 1 ? `next-${i}` : `owner-${i}`
          expect(owner, `key #${i}`).toBe(expected)
        })
      })

      it('a Mastra thread lease (resource\\0thread key, UUID owners, 15 s TTL) behaves like any other', async () => {
        const key = `${uniqueKey('resource')}\0${randomUUID()}`
        const [a, b] = [randomUUID(), randomUUID()]
        expect(await p.acquireLease(key, a, 15_000)).toStrictEqual(granted(a))
        expect(await p.acquireLease(key, b, 15_000)).toStrictEqual({ acquired: false, owner: a })
        expect(await p.renewLease(key, a, 15_000)).toBe(true)
        expect(await p.transferLease(key, a, b, 15_000)).toBe(true)
        expect(await p.getLeaseOwner(key)).toBe(b)
      })
    })

    describe('keys and owners', () => {
      it("keys with NUL characters are distinct: 'res\\0thread', 'res' and 'res\\0'", async () => {
        const base = uniqueKey('res')
        const keys = [`${base}\0thread`, base, `${base}\0`, `${base}\0\0thread`, `${base}\0thread\0`]
        for (const [i, k] of keys.entries()) {
          expect(await p.acquireLease(k, `owner-${i}`, LONG), JSON.stringify(k)).toStrictEqual(granted(`owner-${i}`))
        }
        for (const [i, k] of keys.entries()) expect(await p.getLeaseOwner(k)).toBe(`owner-${i}`)
        await p.releaseLease(`${base}\0thread`, 'owner-0')
        expect(await p.getLeaseOwner(`${base}\0thread`)).toBeUndefined()
        expect(await p.getLeaseOwner(base)).toBe('owner-1')
        expect(await p.getLeaseOwner(`${base}\0`)).toBe('owner-2')
      })

      it('owners with NUL characters round-trip exactly', async () => {
        const key = uniqueKey('nul-owner')
        const owner = 'run\0with\0nul\0'
        expect(await p.acquireLease(key, owner, LONG)).toStrictEqual(granted(owner))
        expect(await p.acquireLease(key, 'other', LONG)).toStrictEqual({ acquired: false, owner })
        expect(await p.getLeaseOwner(key)).toBe(owner)
        expect(await p.transferLease(key, owner, 'x\0y', LONG)).toBe(true)
        expect(await p.getLeaseOwner(key)).toBe('x\0y')
      })

      it('astral Unicode and emoji keys and owners round-trip exactly', async () => {
        const key = `${uniqueKey('astral')}:🧵𝄞👩‍💻🏳️‍🌈`
        const owner = '𝒜𝓁𝒾𝒸𝑒-👨‍👩‍👧-run'
        expect(await p.acquireLease(key, owner, LONG)).toStrictEqual(granted(owner))
        expect(await p.getLeaseOwner(key)).toBe(owner)
        expect(await p.acquireLease(key, '😀', LONG)).toStrictEqual({ acquired: false, owner })
        expect(await p.renewLease(key, owner, LONG)).toBe(true)
        expect(await p.transferLease(key, owner, '😀', LONG)).toBe(true)
        expect(await p.getLeaseOwner(key)).toBe('😀')
        expect(await p.getLeaseOwner(`${uniqueKey('astral')}:🧵𝄞`)).toBeUndefined()
      })

      it('keys are not Unicode-normalised: precomposed and decomposed é are different keys', async () => {
        const base = uniqueKey('nfc')
        await p.acquireLease(`${base}:\u00e9`, 'precomposed', LONG)
        expect(await p.acquireLease(`${base}:e\u0301`, 'decomposed', LONG)).toStrictEqual(granted('decomposed'))
        expect(await p.getLeaseOwner(`${base}:\u00e9`)).toBe('precomposed')
      })

      it('a key of exactly 4096 UTF-8 bytes works and one byte more is rejected', async () => {
        const base = uniqueKey('long')
        const ascii = base + 'k'.repeat(4096 - utf8(base))
        const emoji = '😀'.repeat(1024) // 4096 bytes, 2048 UTF-16 units
        const twoByte = 'é'.repeat(2048) // 4096 bytes
        for (const key of [ascii, emoji, twoByte]) {
          expect(utf8(key)).toBe(4096)
          expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual(granted('A'))
          expect(await p.getLeaseOwner(key)).toBe('A')
          expect(await p.renewLease(key, 'A', LONG)).toBe(true)
          expect(await p.transferLease(key, 'A', 'B', LONG)).toBe(true)
          await p.releaseLease(key, 'B')
          expect(await p.getLeaseOwner(key)).toBeUndefined()
        }
        for (const key of [ascii + 'k', 'a' + emoji, twoByte + 'a']) {
          await expectRejection(() => p.acquireLease(key, 'A', LONG), RangeError, 'ERR_LEASE_INVALID_KEY')
          await expectRejection(() => p.getLeaseOwner(key), RangeError, 'ERR_LEASE_INVALID_KEY')
        }
      })

      it('an owner of exactly 1024 UTF-8 bytes works and one byte more is rejected', async () => {
        const key = uniqueKey('long-owner')
        const owner = '😀'.repeat(256)
        expect(utf8(owner)).toBe(1024)
        expect(await p.acquireLease(key, owner, LONG)).toStrictEqual(granted(owner))
        expect(await p.getLeaseOwner(key)).toBe(owner)
        const next = 'o'.repeat(1024)
        expect(await p.transferLease(key, owner, next, LONG)).toBe(true)
        expect(await p.getLeaseOwner(key)).toBe(next)
        await expectRejection(() => p.acquireLease(uniqueKey('long-owner'), next + 'o', LONG), RangeError, 'ERR_LEASE_INVALID_OWNER')
        await expectRejection(() => p.transferLease(key, next, 'x' + owner, LONG), RangeError, 'ERR_LEASE_INVALID_OWNER')
        expect(await p.getLeaseOwner(key)).toBe(next)
      })

      it('a TTL of exactly maxTtlMs (86 400 000) is accepted', async () => {
        const key = uniqueKey('max-ttl')
        expect(await p.acquireLease(key, 'A', 86_400_000)).toStrictEqual(granted('A'))
        expect(await p.renewLease(key, 'A', 86_400_000)).toBe(true)
        expect(await p.transferLease(key, 'A', 'B', 86_400_000)).toBe(true)
      })
    })

    describe('lease records with metadata', () => {
      const HOLDER = 'holder'

      it("two runs under one owner id are two holders: the second run, and the owner with no metadata, are refused and told the owner", async () => {
        const key = uniqueKey('two-runs')
        expect(await p.acquireLease(key, 'o', LONG, 'run-1')).toStrictEqual(granted('o'))
        expect(await p.acquireLease(key, 'o', LONG, 'run-2')).toStrictEqual({ acquired: false, owner: 'o' })
        expect(await p.acquireLease(key, 'o', LONG)).toStrictEqual({ acquired: false, owner: 'o' })
        expect(await p.acquireFencedLease(key, 'o', LONG, 'run-2')).toStrictEqual({ acquired: false, owner: 'o', token: undefined })
        expect(await p.acquireLease(key, 'other', LONG, 'run-1')).toStrictEqual({ acquired: false, owner: 'o' })
        expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'o', metadata: 'run-1' })
        expect(await p.getLeaseOwner(key)).toBe('o')
      })

      it('a lease held with no metadata is refused to the same owner with metadata, and renewed and released with none', async () => {
        const key = uniqueKey('no-metadata')
        expect(await p.acquireLease(key, 'o', LONG)).toStrictEqual(granted('o'))
        expect(await p.acquireLease(key, 'o', LONG, 'run-1')).toStrictEqual({ acquired: false, owner: 'o' })
        expect(await p.renewLease(key, 'o', LONG, 'run-1')).toBe(false)
        await p.releaseLease(key, 'o', 'run-1')
        expect(await p.transferLease(key, 'o', 'p', LONG, 'run-1')).toBe(false)
        expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'o' })
        expect(await p.renewLease(key, 'o', LONG)).toBe(true)
        await p.releaseLease(key, 'o')
        expect(await p.getLeaseRecord(key)).toBeUndefined()
      })

      it('the same owner and metadata asking again refresh the lease and its metadata together', async () => {
        const key = uniqueKey('refresh-metadata')
        expect(await p.acquireLease(key, 'o', 150, 'run-1')).toStrictEqual(granted('o'))
        expect(await p.acquireLease(key, 'o', 5_000, 'run-1')).toStrictEqual(granted('o'))
        await sleep(350)
        expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'o', metadata: 'run-1' })
        expect(await p.acquireLease(key, 'o', LONG, 'run-2')).toStrictEqual({ acquired: false, owner: 'o' })
      })

      it('renew, release and transfer with the wrong metadata or none are refused and change nothing, the TTL included', async () => {
        const key = uniqueKey('wrong-metadata')
        await p.acquireLease(key, 'o', 300, 'run-1')
        expect(await p.renewLease(key, 'o', LONG, 'run-2')).toBe(false)
        expect(await p.renewLease(key, 'o', LONG)).toBe(false)
        expect(await p.releaseLease(key, 'o', 'run-2')).toBeUndefined()
        expect(await p.releaseLease(key, 'o')).toBeUndefined()
        expect(await p.transferLease(key, 'o', 'p', LONG, 'run-2', 'run-3')).toBe(false)
        expect(await p.transferLease(key, 'o', 'p', LONG)).toBe(false)
        expect(await p.transferLease(key, 'o', 'o', LONG, undefined, 'run-1')).toBe(false)
        expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'o', metadata: 'run-1' })
        // None of the refused calls extended it: it expires at the TTL it was acquired with.
        await sleep(450)
        expect(await p.getLeaseRecord(key)).toBeUndefined()
        expect(await p.getLeaseOwner(key)).toBeUndefined()
      })

      it('the right metadata renews the lease and its metadata past the first TTL, and releases both', async () => {
        const key = uniqueKey('right-metadata')
        await p.acquireLease(key, 'o', 250, 'run-1')
        await sleep(100)
        expect(await p.renewLease(key, 'o', 5_000, 'run-1')).toBe(true)
        await sleep(300) // past the first TTL: the metadata must have been renewed with the lease
        expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'o', metadata: 'run-1' })
        expect(await p.releaseLease(key, 'o', 'run-1')).toBeUndefined()
        expect(await p.getLeaseRecord(key)).toBeUndefined()
        expect(await p.getLeaseOwner(key)).toBeUndefined()
        // Nothing of the old holder is left: the same owner takes it with no metadata, and has none.
        expect(await p.acquireLease(key, 'o', LONG)).toStrictEqual(granted('o'))
        expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'o' })
      })

      it('transfer stores toMetadata with the new owner (getLeaseRecord shows it), and a transfer to no metadata leaves none', async () => {
        const key = uniqueKey('transfer-metadata')
        await p.acquireLease(key, 'o', 250, 'run-1')
        expect(await p.transferLease(key, 'o', 'p', 5_000, 'run-1', 'run-2')).toBe(true)
        expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'p', metadata: 'run-2' })
        await sleep(350) // past the first TTL: the new metadata has the transfer's
        expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'p', metadata: 'run-2' })
        // The old holder has lost every right; the new one holds as (p, run-2) alone.
        expect(await p.renewLease(key, 'o', LONG, 'run-1')).toBe(false)
        expect(await p.renewLease(key, 'p', LONG)).toBe(false)
        expect(await p.acquireLease(key, 'p', LONG, 'run-1')).toStrictEqual({ acquired: false, owner: 'p' })
        expect(await p.renewLease(key, 'p', LONG, 'run-2')).toBe(true)
        // A hand-over between two runs of one owner id.
        expect(await p.transferLease(key, 'p', 'p', LONG, 'run-2', 'run-3')).toBe(true)
        expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'p', metadata: 'run-3' })
        expect(await p.transferLease(key, 'p', 'q', LONG, 'run-3')).toBe(true)
        expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'q' })
        expect(await p.acquireLease(key, 'q', LONG, 'run-3')).toStrictEqual({ acquired: false, owner: 'q' })
        expect(await p.renewLease(key, 'q', LONG)).toBe(true)
        await p.releaseLease(key, 'q')
        expect(await p.getLeaseRecord(key)).toBeUndefined()
      })

      it('getLeaseRecord of a key nobody holds resolves undefined, not null, and the metadata goes with an expired lease', async () => {
        const free = uniqueKey('record-free')
        const record = await p.getLeaseRecord(free)
        expect(record).toBeUndefined()
        expect(record).not.toBeNull()
        const key = uniqueKey('record-expired')
        await p.acquireLease(key, 'o', 60, 'run-1')
        await sleep(100)
        expect(await p.getLeaseRecord(key)).toBeUndefined()
        expect(await p.renewLease(key, 'o', LONG, 'run-1')).toBe(false)
        expect(await p.acquireLease(key, 'p', LONG)).toStrictEqual(granted('p'))
        expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'p' })
      })

      it('metadata round-trips exactly: NUL, astral characters, text that looks like JSON, and exactly 4096 UTF-8 bytes', async () => {
        const cases = ['run\0with\0nul', '𝒜𝓁𝒾𝒸𝑒-👨‍👩‍👧', JSON.stringify({ runId: 'r', n: 1 }), ' ', '😀'.repeat(1024), 'é'.repeat(2048)]
        for (const metadata of cases) {
          const key = uniqueKey('metadata-exact')
          expect(await p.acquireLease(key, 'o', LONG, metadata)).toStrictEqual(granted('o'))
          expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'o', metadata })
          // One character off is another holder (a code point off, so it stays well-formed).
          const off = [...metadata].slice(0, -1).join('') || metadata + metadata
          expect(await p.renewLease(key, 'o', LONG, off)).toBe(false)
          expect(await p.renewLease(key, 'o', LONG, metadata)).toBe(true)
          await p.releaseLease(key, 'o', metadata)
          expect(await p.getLeaseOwner(key)).toBeUndefined()
        }
        expect(utf8('😀'.repeat(1024))).toBe(4096)
        await expectRejection(() => p.acquireLease(uniqueKey('metadata-long'), 'o', LONG, 'a' + '😀'.repeat(1024)), RangeError, 'ERR_LEASE_INVALID_METADATA')
      })

      it('acquireLease answers exactly { acquired, owner }, never a token: claimed, refreshed or refused, with metadata or without', async () => {
        const key = uniqueKey('exact-answer')
        const answers = [
          await p.acquireLease(key, 'o', LONG),
          await p.acquireLease(key, 'o', LONG),
          await p.acquireLease(key, 'p', LONG),
        ]
        expect(answers).toStrictEqual([granted('o'), granted('o'), { acquired: false, owner: 'o' }])
        for (const answer of answers) expect(Object.keys(answer).sort()).toEqual(['acquired', 'owner'])
        // A fenced grant on the lease does not make later plain answers carry its token.
        expect((await p.acquireFencedLease(key, 'o', LONG)).token).toEqual(expect.any(Number))
        expect(await p.acquireLease(key, 'o', LONG)).toStrictEqual(granted('o'))
        const other = uniqueKey('exact-answer-metadata')
        expect(await p.acquireLease(other, 'o', LONG, 'run-1')).toStrictEqual(granted('o'))
        expect(await p.acquireLease(other, 'o', LONG, 'run-1')).toStrictEqual(granted('o'))
        expect(await p.acquireLease(other, 'o', LONG, 'run-2')).toStrictEqual({ acquired: false, owner: 'o' })
      })

      it('acquireFencedLease answers a token greater than every earlier one of the key, across plain grants, transfers, release and expiry', async () => {
        const key = uniqueKey('fenced')
        const tokens: number[] = []
        /** The token a fenced grant to `owner` answers, which getLease reads too. */
        const fenced = async (owner: string, metadata?: string, ttlMs = LONG) => {
          const grant = await p.acquireFencedLease(key, owner, ttlMs, metadata)
          expect(grant).toStrictEqual({ acquired: true, owner, token: expect.any(Number) })
          expect(Number.isSafeInteger(grant.token)).toBe(true)
          expect((await p.getLease(key))?.token).toBe(grant.token)
          return grant.token!
        }
        const newest = () => Math.max(...tokens)

        // A plain claim takes no token; the holder's fenced refresh takes one and keeps it.
        expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual(granted('A'))
        expect((await p.getLease(key))?.token).toBeUndefined()
        tokens.push(await fenced('A'))
        expect(await fenced('A')).toBe(newest())
        expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual(granted('A'))
        expect(await p.renewLease(key, 'A', LONG)).toBe(true)
        expect(await fenced('A')).toBe(newest())
        expect(await p.acquireFencedLease(key, 'B', LONG)).toStrictEqual({ acquired: false, owner: 'A', token: undefined })

        // A transfer of a lease with a token gives the new holder a greater one.
        expect(await p.transferLease(key, 'A', 'B', LONG, undefined, 'run-b')).toBe(true)
        const moved = (await p.getLease(key))!
        expect(moved.owner).toBe('B')
        expect(moved.token).toBeGreaterThan(newest())
        tokens.push(moved.token!)
        expect(await fenced('B', 'run-b')).toBe(newest())

        // Released: a plain claim has none, and a fenced refresh takes a greater one.
        await p.releaseLease(key, 'B', 'run-b')
        expect(await p.acquireLease(key, 'C', LONG)).toStrictEqual(granted('C'))
        expect((await p.getLease(key))?.token).toBeUndefined()
        const c = await fenced('C')
        expect(c).toBeGreaterThan(newest())
        tokens.push(c)

        // A lease without a token stays without through a transfer; its next fenced grant is greater still.
        await p.releaseLease(key, 'C')
        expect(await p.acquireLease(key, 'D', LONG)).toStrictEqual(granted('D'))
        expect(await p.transferLease(key, 'D', 'E', LONG)).toBe(true)
        expect(await p.getLease(key)).toEqual({ owner: 'E', token: undefined, ttlMs: expect.any(Number) })
        const e = await fenced('E')
        expect(e).toBeGreaterThan(newest())
        tokens.push(e)

        // Expired: a fenced claim by another owner is greater again.
        await p.releaseLease(key, 'E')
        tokens.push(await fenced('F', undefined, 60))
        expect(tokens.at(-1)).toBeGreaterThan(e)
        await sleep(100)
        expect(await p.getLease(key)).toBeUndefined()
        const g = await fenced('G')
        expect(g).toBeGreaterThan(newest())
        expect([...tokens].sort((a, b) => a - b)).toEqual(tokens)
      })

      describe('metadata argument (metadata, fromMetadata, toMetadata)', () => {
        // undefined and a left-out argument are no metadata, which is valid.
        const cases = badStrings('run-1', 4096).filter((c) => c.value !== undefined && c.value !== MISSING)
        for (const { label, value, cls, near } of cases) it(`every method rejects metadata that is ${label} with ERR_LEASE_INVALID_METADATA before any I/O, and what is held stays`, async () => {
          const u = untyped(p)
          // Held with the near-miss metadata the value could sloppily be turned into, so a
          // sloppy renew (to a TTL of 1 ms), release or transfer would show.
          const held = near ?? 'run-1'
          const key = uniqueKey('bad-metadata')
          const free = uniqueKey('bad-metadata-free')
          expect(await p.acquireLease(key, HOLDER, LONG, held)).toStrictEqual(granted(HOLDER))
          const before = await commandCalls?.()

          await expectRejection(() => u.acquireLease(free, 'intruder', LONG, value), cls, 'ERR_LEASE_INVALID_METADATA')
          await expectRejection(() => u.acquireFencedLease(free, 'intruder', LONG, value), cls, 'ERR_LEASE_INVALID_METADATA')
          await expectRejection(() => u.acquireLease(key, HOLDER, LONG, value), cls, 'ERR_LEASE_INVALID_METADATA')
          await expectRejection(() => u.acquireFencedLease(key, HOLDER, LONG, value), cls, 'ERR_LEASE_INVALID_METADATA')
          await expectRejection(() => u.renewLease(key, HOLDER, 1, value), cls, 'ERR_LEASE_INVALID_METADATA')
          await expectRejection(() => u.releaseLease(key, HOLDER, value), cls, 'ERR_LEASE_INVALID_METADATA')
          await expectRejection(() => u.transferLease(key, HOLDER, 'intruder', LONG, value), cls, 'ERR_LEASE_INVALID_METADATA')
          await expectRejection(() => u.transferLease(key, HOLDER, 'intruder', LONG, held, value), cls, 'ERR_LEASE_INVALID_METADATA')

          if (before) expect(commandsBetween(before, await commandCalls!()), 'commands that reached Redis').toEqual([])
          await sleep(5)
          expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: HOLDER, metadata: held })
          expect(await p.getLeaseOwner(free)).toBeUndefined()
        })
      })
    })

    describe('bad input is rejected with a coded TypeError or RangeError and changes nothing', () => {
      const HOLDER = 'holder'

      describe('key argument', () => {
        const cases = badStrings('bad-key', 4096)
        for (const { label, value, cls, near } of cases) it(`every method rejects a key that is ${label} with ERR_LEASE_INVALID_KEY`, async () => {
          const u = untyped(p)
          // Hold the near-miss key the value could sloppily be turned into (String(value),
          // U+FFFD for a lone surrogate, a cut to the cap), so a sloppy release or transfer
          // would show. Each provider has its own key space, so these plain keys are private.
          const held = near ?? uniqueKey('held')
          expect(await p.acquireLease(held, HOLDER, LONG)).toStrictEqual(granted(HOLDER))

          await expectRejection(() => u.acquireLease(...args(value, 'intruder', LONG)), cls, 'ERR_LEASE_INVALID_KEY')
          await expectRejection(() => u.acquireFencedLease(...args(value, 'intruder', LONG)), cls, 'ERR_LEASE_INVALID_KEY')
          await expectRejection(() => u.getLeaseOwner(...args(value)), cls, 'ERR_LEASE_INVALID_KEY')
          await expectRejection(() => u.getLease(...args(value)), cls, 'ERR_LEASE_INVALID_KEY')
          expect(typeof u.getLeaseRecord).toBe('function')
          await expectRejection(() => u.getLeaseRecord(...args(value)), cls, 'ERR_LEASE_INVALID_KEY')
          await expectRejection(() => u.releaseLease(...args(value, HOLDER)), cls, 'ERR_LEASE_INVALID_KEY')
          await expectRejection(() => u.renewLease(...args(value, HOLDER, LONG)), cls, 'ERR_LEASE_INVALID_KEY')
          await expectRejection(() => u.transferLease(...args(value, HOLDER, 'intruder', LONG)), cls, 'ERR_LEASE_INVALID_KEY')

          expect(await p.getLeaseOwner(held)).toBe(HOLDER)
          await p.releaseLease(held, HOLDER)
        })
      })

      describe('owner arguments (owner, fromOwner, toOwner)', () => {
        const cases = badStrings('bad-owner', 1024)
        // A left-out owner is only really missing when it is the last argument (releaseLease).
        const notLast = cases.filter((c) => c.value !== MISSING)
        for (const { label, value, cls } of notLast) it(`acquireLease and acquireFencedLease reject an owner that is ${label} with ERR_LEASE_INVALID_OWNER and take nothing`, async () => {
          const key = uniqueKey('bad-owner-acquire')
          await expectRejection(() => untyped(p).acquireLease(...args(key, value, LONG)), cls, 'ERR_LEASE_INVALID_OWNER')
          await expectRejection(() => untyped(p).acquireFencedLease(...args(key, value, LONG)), cls, 'ERR_LEASE_INVALID_OWNER')
          expect(await p.getLeaseOwner(key)).toBeUndefined()
        })

        for (const { label, value, cls, near } of cases) it(`releaseLease rejects an owner that is ${label} and the lease stays held`, async () => {
          const key = uniqueKey('bad-owner-release')
          const holder = near ?? HOLDER
          await p.acquireLease(key, holder, LONG)
          await expectRejection(() => untyped(p).releaseLease(...args(key, value)), cls, 'ERR_LEASE_INVALID_OWNER')
          expect(await p.getLeaseOwner(key)).toBe(holder)
        })

        for (const { label, value, cls, near } of notLast) it(`renewLease rejects an owner that is ${label} and the lease is unchanged`, async () => {
          const key = uniqueKey('bad-owner-renew')
          const holder = near ?? HOLDER
          await p.acquireLease(key, holder, LONG)
          await expectRejection(() => untyped(p).renewLease(...args(key, value, LONG)), cls, 'ERR_LEASE_INVALID_OWNER')
          expect(await p.getLeaseOwner(key)).toBe(holder)
        })

        for (const { label, value, cls, near } of notLast) it(`transferLease rejects a fromOwner that is ${label} and the lease stays with its holder`, async () => {
          const key = uniqueKey('bad-owner-from')
          const holder = near ?? HOLDER
          await p.acquireLease(key, holder, LONG)
          await expectRejection(() => untyped(p).transferLease(key, value, 'next', LONG), cls, 'ERR_LEASE_INVALID_OWNER')
          expect(await p.getLeaseOwner(key)).toBe(holder)
        })

        for (const { label, value, cls } of notLast) it(`transferLease rejects a toOwner that is ${label} and the lease stays with its holder`, async () => {
          const key = uniqueKey('bad-owner-to')
          await p.acquireLease(key, HOLDER, LONG)
          await expectRejection(() => untyped(p).transferLease(...args(key, HOLDER, value, LONG)), cls, 'ERR_LEASE_INVALID_OWNER')
          expect(await p.getLeaseOwner(key)).toBe(HOLDER)
        })
      })

      describe('ttlMs argument', () => {
        for (const { label, value, cls } of BAD_TTLS) it(`acquireLease and acquireFencedLease reject a TTL that is ${label} with ERR_LEASE_INVALID_TTL, on a free key and on a held one`, async () => {
          const free = uniqueKey('bad-ttl-free')
          await expectRejection(() => untyped(p).acquireLease(...args(free, 'A', value)), cls, 'ERR_LEASE_INVALID_TTL')
          await expectRejection(() => untyped(p).acquireFencedLease(...args(free, 'A', value)), cls, 'ERR_LEASE_INVALID_TTL')
          expect(await p.getLeaseOwner(free)).toBeUndefined()
          const held = uniqueKey('bad-ttl-held')
          await p.acquireLease(held, HOLDER, LONG)
          await expectRejection(() => untyped(p).acquireLease(...args(held, HOLDER, value)), cls, 'ERR_LEASE_INVALID_TTL')
          await expectRejection(() => untyped(p).acquireFencedLease(...args(held, HOLDER, value)), cls, 'ERR_LEASE_INVALID_TTL')
          await sleep(5)
          expect(await p.getLeaseOwner(held)).toBe(HOLDER)
        })

        for (const { label, value, cls } of BAD_TTLS) it(`renewLease rejects a TTL that is ${label} and the lease is unchanged`, async () => {
          const key = uniqueKey('bad-ttl-renew')
          await p.acquireLease(key, HOLDER, LONG)
          await expectRejection(() => untyped(p).renewLease(...args(key, HOLDER, value)), cls, 'ERR_LEASE_INVALID_TTL')
          await sleep(5)
          expect(await p.getLeaseOwner(key)).toBe(HOLDER)
        })

        for (const { label, value, cls } of BAD_TTLS) it(`transferLease rejects a TTL that is ${label} and the lease stays with its holder`, async () => {
          const key = uniqueKey('bad-ttl-transfer')
          await p.acquireLease(key, HOLDER, LONG)
          await expectRejection(() => untyped(p).transferLease(...args(key, HOLDER, 'next', value)), cls, 'ERR_LEASE_INVALID_TTL')
          await sleep(5)
          expect(await p.getLeaseOwner(key)).toBe(HOLDER)
        })
      })
    })

    describe('configurable limits', () => {
      it('maxKeyBytes, maxOwnerBytes, maxMetadataBytes and maxTtlMs can be lowered', async () => {
        const small = open({ maxKeyBytes: 8, maxOwnerBytes: 4, maxMetadataBytes: 8, maxTtlMs: 1_000 })
        // Unique keys are longer than 8 bytes, so use a short random one.
        const key = randomUUID().slice(0, 8)
        expect(await small.acquireLease(key, 'oooo', 1_000)).toStrictEqual(granted('oooo'))
        expect(await small.getLeaseOwner(key)).toBe('oooo')
        await expectRejection(() => small.acquireLease(key + 'k', 'oooo', 1_000), RangeError, 'ERR_LEASE_INVALID_KEY')
        await expectRejection(() => small.getLeaseOwner('€€€'), RangeError, 'ERR_LEASE_INVALID_KEY') // 9 bytes, 3 chars
        await expectRejection(() => small.acquireLease(key, 'ooooo', 1_000), RangeError, 'ERR_LEASE_INVALID_OWNER')
        await expectRejection(() => small.transferLease(key, 'oooo', 'ééé', 1_000), RangeError, 'ERR_LEASE_INVALID_OWNER')
        await expectRejection(() => small.renewLease(key, 'oooo', 1_001), RangeError, 'ERR_LEASE_INVALID_TTL')
        await expectRejection(() => small.acquireLease(key, 'oooo', 1_001), RangeError, 'ERR_LEASE_INVALID_TTL')
        await expectRejection(() => small.renewLease(key, 'oooo', 1_000, 'mmmmmmmmm'), RangeError, 'ERR_LEASE_INVALID_METADATA')
        await expectRejection(() => small.releaseLease(key, 'oooo', '€€€'), RangeError, 'ERR_LEASE_INVALID_METADATA') // 9 bytes, 3 chars
        expect(await small.renewLease(key, 'oooo', 1_000)).toBe(true)
        expect(await small.getLeaseOwner(key)).toBe('oooo')
        await small.releaseLease(key, 'oooo')
        expect(await small.acquireLease(key, 'oooo', 1_000, 'mmmmmmmm')).toStrictEqual(granted('oooo'))
        expect(await small.getLeaseRecord(key)).toStrictEqual({ owner: 'oooo', metadata: 'mmmmmmmm' })
        await small.releaseLease(key, 'oooo', 'mmmmmmmm')
      })

      it('maxKeyBytes, maxOwnerBytes, maxMetadataBytes and maxTtlMs can be raised above the defaults', async () => {
        const big = open({ maxKeyBytes: 8_192, maxOwnerBytes: 2_048, maxMetadataBytes: 16_384, maxTtlMs: 2 * 86_400_000 })
        const key = uniqueKey('big') + 'k'.repeat(6_000)
        const owner = 'o'.repeat(2_000)
        const metadata = 'm'.repeat(10_000)
        expect(await big.acquireLease(key, owner, 2 * 86_400_000, metadata)).toStrictEqual(granted(owner))
        expect(await big.getLeaseOwner(key)).toBe(owner)
        expect(await big.getLeaseRecord(key)).toStrictEqual({ owner, metadata })
        expect(await big.renewLease(key, owner, 100_000_000, metadata)).toBe(true)
        await big.releaseLease(key, owner, metadata)
        expect(await big.getLeaseOwner(key)).toBeUndefined()
      })

      it('the constructor throws ERR_LEASE_INVALID_OPTION for invalid limits', () => {
        for (const field of ['maxKeyBytes', 'maxOwnerBytes', 'maxMetadataBytes', 'maxTtlMs'] as const) {
          for (const bad of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 60]) {
            expectThrow(() => makeProvider({ [field]: bad }), RangeError, 'ERR_LEASE_INVALID_OPTION')
          }
          for (const bad of ['10', true, {}, 10n]) {
            expectThrow(() => makeProvider({ [field]: bad }), TypeError, 'ERR_LEASE_INVALID_OPTION')
          }
        }
      })

      it('the constructor accepts no options and an empty options object', async () => {
        for (const provider of [open(), open({})]) {
          const key = uniqueKey('defaults')
          expect(await provider.acquireLease(key, 'A', LONG)).toStrictEqual(granted('A'))
        }
      })
    })

    describe('close', () => {
      it('close is idempotent and every later call rejects with ERR_LEASE_CLOSED', async () => {
        const key = uniqueKey('close')
        await p.acquireLease(key, 'A', LONG)
        await expect(p.close()).resolves.toBeUndefined()
        await expect(p.close()).resolves.toBeUndefined()
        await expectRejection(() => p.acquireLease(key, 'A', LONG), Error, 'ERR_LEASE_CLOSED')
        await expectRejection(() => p.acquireFencedLease(key, 'A', LONG), Error, 'ERR_LEASE_CLOSED')
        await expectRejection(() => p.getLeaseOwner(key), Error, 'ERR_LEASE_CLOSED')
        await expectRejection(() => p.getLease(key), Error, 'ERR_LEASE_CLOSED')
        await expectRejection(() => p.getLeaseRecord(key), Error, 'ERR_LEASE_CLOSED')
        await expectRejection(() => p.releaseLease(key, 'A'), Error, 'ERR_LEASE_CLOSED')
        await expectRejection(() => p.renewLease(key, 'A', LONG, 'run-1'), Error, 'ERR_LEASE_CLOSED')
        await expectRejection(() => p.transferLease(key, 'A', 'B', LONG), Error, 'ERR_LEASE_CLOSED')
        await expect(p.close()).resolves.toBeUndefined()
      })

      it('concurrent close calls all resolve', async () => {
        await p.acquireLease(uniqueKey('close-concurrent'), 'A', LONG)
        const results = await Promise.allSettled([p.close(), p.close(), p.close()])
        expect(results.map((r) => r.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled'])
      })

      it('calls in flight when close is called still settle', async () => {
        const inFlight: Array<Promise<unknown>> = LEASE_METHODS.flatMap((m) =>
          Array.from({ length: 20 }, (_, i) => {
            const key = uniqueKey(`inflight-${i}`)
            switch (m) {
              case 'acquireLease':
                return p.acquireLease(key, 'A', LONG)
              case 'getLeaseOwner':
                return p.getLeaseOwner(key)
              case 'releaseLease':
                return p.releaseLease(key, 'A')
              case 'renewLease':
                return p.renewLease(key, 'A', LONG)
              case 'transferLease':
                return p.transferLease(key, 'A', 'B', LONG)
            }
          }),
        )
        for (let i = 0; i < 20; i++) {
          const key = uniqueKey(`inflight-more-${i}`)
          inFlight.push(p.acquireFencedLease(key, 'A', LONG, 'run-1'), p.getLease(key), p.getLeaseRecord(key))
        }
        const closing = p.close()
        const outcome = await settleWithin(Promise.allSettled([...inFlight, closing]), 5_000)
        expect(outcome.status).toBe('fulfilled')
        if (outcome.status === 'fulfilled') {
          for (const r of outcome.value) {
            // Unspecified which coded error an interrupted call gets; it must be one of ours.
            if (r.status === 'rejected') expect(String((r.reason as { code?: unknown }).code)).toMatch(/^ERR_LEASE_/)
          }
        }
      })

      it('closing one provider does not affect another', async () => {
        const other = open()
        const key = uniqueKey('close-other')
        await other.acquireLease(key, 'A', LONG)
        await p.close()
        expect(await other.getLeaseOwner(key)).toBe('A')
      })
    })
  })
}

