// The lease contract as tests, for any provider: lease-contract.spec.ts runs it on the
// in-memory store and one redis-server, lease-topologies.spec.ts on a Redis Cluster and
// behind Sentinel.
import { randomUUID } from 'node:crypto'

import { afterEach, beforeEach, describe, expect, it } from 'vitest'

import {
  expectRejection,
  expectThrow,
  LEASE_METHODS,
  settleWithin,
  sleep,
  uniqueKey,
  untyped,
  type LeaseApi,
  type LeaseLimitsOptions,
} from './lease.js'

export type MakeProvider = (limits?: LeaseLimitsOptions) => LeaseApi

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
 * Everything Mastra's LeaseProvider contract promises (`@mastra/core`'s
 * `dist/events/pubsub.d.ts`), as tests of the provider `makeProvider` makes.
 */
export function describeLeaseContract(name: string, makeProvider: MakeProvider, { tokens = true } = {}) {
  /** What a grant to `owner` resolves to: with its fencing token when the provider gives them. */
  const granted = (owner: string) => (tokens ? { acquired: true, owner, token: expect.any(Number) } : { acquired: true, owner })
  describe(`${name} (LeaseProvider contract)`, () => {
    const opened: LeaseApi[] = []
    const open = (limits?: LeaseLimitsOptions): LeaseApi => {
      const provider = makeProvider(limits)
      opened.push(provider)
      return provider
    }
    let p: LeaseApi
    beforeEach(() => {
      p = open()
    })
    afterEach(async () => {
      await Promise.allSettled(opened.splice(0).map((x) => x.close()))
    })

    describe('acquire, owner, release, renew and transfer', () => {
      it('acquire on a free key grants it and getLeaseOwner reports the owner', async () => {
        const key = uniqueKey('free')
        expect(await p.acquireLease(key, 'A', LONG)).toEqual(granted('A'))
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
        expect(await p.acquireLease(key, 'B', LONG)).toEqual({ acquired: false, owner: 'A' })
        expect(await p.getLeaseOwner(key)).toBe('A')
      })

      it('owners are compared exactly, with no case folding, trimming or truncation at NUL', async () => {
        const key = uniqueKey('exact-owner')
        await p.acquireLease(key, 'owner', LONG)
        for (const other of ['Owner', 'owner ', ' owner', 'owner\0', 'owne', 'owner\0x']) {
          expect(await p.acquireLease(key, other, LONG)).toEqual({ acquired: false, owner: 'owner' })
          expect(await p.renewLease(key, other, LONG)).toBe(false)
          await p.releaseLease(key, other)
          expect(await p.transferLease(key, other, 'thief', LONG)).toBe(false)
        }
        expect(await p.getLeaseOwner(key)).toBe('owner')
      })

      it('same-owner re-acquire succeeds and refreshes the TTL', async () => {
        const key = uniqueKey('reacquire')
        expect(await p.acquireLease(key, 'A', 150)).toEqual(granted('A'))
        expect(await p.acquireLease(key, 'A', 5_000)).toEqual(granted('A'))
        await sleep(350)
        expect(await p.getLeaseOwner(key)).toBe('A')
        expect(await p.acquireLease(key, 'B', LONG)).toEqual({ acquired: false, owner: 'A' })
      })

      it('a lease is held until its TTL runs out, then anyone can take it', async () => {
        const key = uniqueKey('expiry')
        await p.acquireLease(key, 'A', 300)
        await sleep(100)
        expect(await p.getLeaseOwner(key)).toBe('A')
        expect(await p.acquireLease(key, 'B', LONG)).toEqual({ acquired: false, owner: 'A' })
        await sleep(350)
        expect(await p.getLeaseOwner(key)).toBeUndefined()
        expect(await p.acquireLease(key, 'B', LONG)).toEqual(granted('B'))
        expect(await p.getLeaseOwner(key)).toBe('B')
      })

      it('release by the holder frees the key for others', async () => {
        const key = uniqueKey('release')
        await p.acquireLease(key, 'A', LONG)
        expect(await p.releaseLease(key, 'A')).toBeUndefined()
        expect(await p.getLeaseOwner(key)).toBeUndefined()
        expect(await p.acquireLease(key, 'B', LONG)).toEqual(granted('B'))
      })

      it('release by a non-owner is a no-op', async () => {
        const key = uniqueKey('release-non-owner')
        await p.acquireLease(key, 'A', LONG)
        expect(await p.releaseLease(key, 'B')).toBeUndefined()
        expect(await p.getLeaseOwner(key)).toBe('A')
        expect(await p.acquireLease(key, 'B', LONG)).toEqual({ acquired: false, owner: 'A' })
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
        expect(await p.acquireLease(key, 'B', LONG)).toEqual(granted('B'))
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
        expect(await p.acquireLease(key, 'B', LONG)).toEqual(granted('B'))
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
        expect(await p.acquireLease(key, 'A', LONG)).toEqual({ acquired: false, owner: 'B' })
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
        expect(await p.acquireLease(key, 'C', LONG)).toEqual(granted('C'))
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
        expect(await p.acquireLease(key, a, 15_000)).toEqual(granted(a))
        expect(await p.acquireLease(key, b, 15_000)).toEqual({ acquired: false, owner: a })
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
          expect(await p.acquireLease(k, `owner-${i}`, LONG), JSON.stringify(k)).toEqual(granted(`owner-${i}`))
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
        expect(await p.acquireLease(key, owner, LONG)).toEqual(granted(owner))
        expect(await p.acquireLease(key, 'other', LONG)).toEqual({ acquired: false, owner })
        expect(await p.getLeaseOwner(key)).toBe(owner)
        expect(await p.transferLease(key, owner, 'x\0y', LONG)).toBe(true)
        expect(await p.getLeaseOwner(key)).toBe('x\0y')
      })

      it('astral Unicode and emoji keys and owners round-trip exactly', async () => {
        const key = `${uniqueKey('astral')}:🧵𝄞👩‍💻🏳️‍🌈`
        const owner = '𝒜𝓁𝒾𝒸𝑒-👨‍👩‍👧-run'
        expect(await p.acquireLease(key, owner, LONG)).toEqual(granted(owner))
        expect(await p.getLeaseOwner(key)).toBe(owner)
        expect(await p.acquireLease(key, '😀', LONG)).toEqual({ acquired: false, owner })
        expect(await p.renewLease(key, owner, LONG)).toBe(true)
        expect(await p.transferLease(key, owner, '😀', LONG)).toBe(true)
        expect(await p.getLeaseOwner(key)).toBe('😀')
        expect(await p.getLeaseOwner(`${uniqueKey('astral')}:🧵𝄞`)).toBeUndefined()
      })

      it('keys are not Unicode-normalised: precomposed and decomposed é are different keys', async () => {
        const base = uniqueKey('nfc')
        await p.acquireLease(`${base}:\u00e9`, 'precomposed', LONG)
        expect(await p.acquireLease(`${base}:e\u0301`, 'decomposed', LONG)).toEqual(granted('decomposed'))
        expect(await p.getLeaseOwner(`${base}:\u00e9`)).toBe('precomposed')
      })

      it('a key of exactly 4096 UTF-8 bytes works and one byte more is rejected', async () => {
        const base = uniqueKey('long')
        const ascii = base + 'k'.repeat(4096 - utf8(base))
        const emoji = '😀'.repeat(1024) // 4096 bytes, 2048 UTF-16 units
        const twoByte = 'é'.repeat(2048) // 4096 bytes
        for (const key of [ascii, emoji, twoByte]) {
          expect(utf8(key)).toBe(4096)
          expect(await p.acquireLease(key, 'A', LONG)).toEqual(granted('A'))
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
        expect(await p.acquireLease(key, owner, LONG)).toEqual(granted(owner))
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
        expect(await p.acquireLease(key, 'A', 86_400_000)).toEqual(granted('A'))
        expect(await p.renewLease(key, 'A', 86_400_000)).toBe(true)
        expect(await p.transferLease(key, 'A', 'B', 86_400_000)).toBe(true)
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
          expect(await p.acquireLease(held, HOLDER, LONG)).toEqual(granted(HOLDER))

          await expectRejection(() => u.acquireLease(...args(value, 'intruder', LONG)), cls, 'ERR_LEASE_INVALID_KEY')
          await expectRejection(() => u.getLeaseOwner(...args(value)), cls, 'ERR_LEASE_INVALID_KEY')
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
        for (const { label, value, cls } of notLast) it(`acquireLease rejects an owner that is ${label} with ERR_LEASE_INVALID_OWNER and takes nothing`, async () => {
          const key = uniqueKey('bad-owner-acquire')
          await expectRejection(() => untyped(p).acquireLease(...args(key, value, LONG)), cls, 'ERR_LEASE_INVALID_OWNER')
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
        for (const { label, value, cls } of BAD_TTLS) it(`acquireLease rejects a TTL that is ${label} with ERR_LEASE_INVALID_TTL, on a free key and on a held one`, async () => {
          const free = uniqueKey('bad-ttl-free')
          await expectRejection(() => untyped(p).acquireLease(...args(free, 'A', value)), cls, 'ERR_LEASE_INVALID_TTL')
          expect(await p.getLeaseOwner(free)).toBeUndefined()
          const held = uniqueKey('bad-ttl-held')
          await p.acquireLease(held, HOLDER, LONG)
          await expectRejection(() => untyped(p).acquireLease(...args(held, HOLDER, value)), cls, 'ERR_LEASE_INVALID_TTL')
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
      it('maxKeyBytes, maxOwnerBytes and maxTtlMs can be lowered', async () => {
        const small = open({ maxKeyBytes: 8, maxOwnerBytes: 4, maxTtlMs: 1_000 })
        // Unique keys are longer than 8 bytes, so use a short random one.
        const key = randomUUID().slice(0, 8)
        expect(await small.acquireLease(key, 'oooo', 1_000)).toEqual(granted('oooo'))
        expect(await small.getLeaseOwner(key)).toBe('oooo')
        await expectRejection(() => small.acquireLease(key + 'k', 'oooo', 1_000), RangeError, 'ERR_LEASE_INVALID_KEY')
        await expectRejection(() => small.getLeaseOwner('€€€'), RangeError, 'ERR_LEASE_INVALID_KEY') // 9 bytes, 3 chars
        await expectRejection(() => small.acquireLease(key, 'ooooo', 1_000), RangeError, 'ERR_LEASE_INVALID_OWNER')
        await expectRejection(() => small.transferLease(key, 'oooo', 'ééé', 1_000), RangeError, 'ERR_LEASE_INVALID_OWNER')
        await expectRejection(() => small.renewLease(key, 'oooo', 1_001), RangeError, 'ERR_LEASE_INVALID_TTL')
        await expectRejection(() => small.acquireLease(key, 'oooo', 1_001), RangeError, 'ERR_LEASE_INVALID_TTL')
        expect(await small.renewLease(key, 'oooo', 1_000)).toBe(true)
        expect(await small.getLeaseOwner(key)).toBe('oooo')
        await small.releaseLease(key, 'oooo')
      })

      it('maxKeyBytes, maxOwnerBytes and maxTtlMs can be raised above the defaults', async () => {
        const big = open({ maxKeyBytes: 8_192, maxOwnerBytes: 2_048, maxTtlMs: 2 * 86_400_000 })
        const key = uniqueKey('big') + 'k'.repeat(6_000)
        const owner = 'o'.repeat(2_000)
        expect(await big.acquireLease(key, owner, 2 * 86_400_000)).toEqual(granted(owner))
        expect(await big.getLeaseOwner(key)).toBe(owner)
        expect(await big.renewLease(key, owner, 100_000_000)).toBe(true)
        await big.releaseLease(key, owner)
      })

      it('the constructor throws ERR_LEASE_INVALID_OPTION for invalid limits', () => {
        for (const field of ['maxKeyBytes', 'maxOwnerBytes', 'maxTtlMs'] as const) {
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
          expect(await provider.acquireLease(key, 'A', LONG)).toEqual(granted('A'))
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
        await expectRejection(() => p.getLeaseOwner(key), Error, 'ERR_LEASE_CLOSED')
        await expectRejection(() => p.releaseLease(key, 'A'), Error, 'ERR_LEASE_CLOSED')
        await expectRejection(() => p.renewLease(key, 'A', LONG), Error, 'ERR_LEASE_CLOSED')
        await expectRejection(() => p.transferLease(key, 'A', 'B', LONG), Error, 'ERR_LEASE_CLOSED')
        await expect(p.close()).resolves.toBeUndefined()
      })

      it('concurrent close calls all resolve', async () => {
        await p.acquireLease(uniqueKey('close-concurrent'), 'A', LONG)
        const results = await Promise.allSettled([p.close(), p.close(), p.close()])
        expect(results.map((r) => r.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled'])
      })

      it('calls in flight when close is called still settle', async () => {
        const inFlight = LEASE_METHODS.flatMap((m) =>
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

