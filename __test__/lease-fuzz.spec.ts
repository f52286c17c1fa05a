// Bad-input fuzz, property-based (fast-check). For the three lease
// surfaces (MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub's lease methods),
// each with the default caps and with lowered ones:
//
// - every method, given arguments where one or more are invalid (wrong types, empty strings,
//   lone surrogates anywhere, over-cap UTF-8 lengths, bad TTLs, left-out arguments), returns
//   a promise (never throws synchronously, as the contract suite expects) that rejects with
//   the TypeError or RangeError and the stable `code` the README lists for one of the bad
//   arguments;
// - across the whole run, not one command reaches Redis (INFO commandstats before and
//   after), and the leases held beforehand keep their owner and their PTTL;
// - valid but odd input (NUL, astral characters, keys and owners of exactly the cap) goes
//   through acquire, getLeaseOwner, renew, transfer and release byte for byte, and a key
//   stays distinct from its own prefixes.
//
// The contract suite (lease-contract.spec.ts) holds the hand-picked cases; this file throws
// thousands of generated ones at the same rules.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads @mastra/core

import { randomUUID } from 'node:crypto'

import fc from 'fast-check'
import { afterEach, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub } from '../dist/esm/index.js'
import type { LeaseApi } from './helpers/lease.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

interface Caps {
  maxKeyBytes: number
  maxOwnerBytes: number
  maxTtlMs: number
}
const DEFAULT_CAPS: Caps = { maxKeyBytes: 4096, maxOwnerBytes: 1024, maxTtlMs: 86_400_000 }
// Lowered caps: over-cap strings are short, so the generators reach them often. maxTtlMs
// stays above the run's length so the held leases outlive it.
const SMALL_CAPS: Caps = { maxKeyBytes: 16, maxOwnerBytes: 8, maxTtlMs: 600_000 }

const utf8 = (s: string) => Buffer.byteLength(s, 'utf8')
/** No lone surrogate (a `u` regex sees a well-formed pair as one code point). */
const wellFormed = (s: string) => !/\p{Cs}/u.test(s)

// Leases held through the bad-input run. The second pair is what a lossy conversion of a
// lone surrogate appended to the first would produce, so a sloppy store would hit it.
const HELD: ReadonlyArray<readonly [key: string, owner: string]> = [
  ['h', 'o'],
  ['h\uFFFD', 'o\uFFFD'],
]

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

type Kind = 'key' | 'owner' | 'ttl'
type ErrorClass = typeof TypeError | typeof RangeError
interface Bad {
  value: unknown
  cls: ErrorClass
  /** A short category name, for the tally in the report. */
  what: string
}

const CODES: Record<Kind, string> = {
  key: 'ERR_LEASE_INVALID_KEY',
  owner: 'ERR_LEASE_INVALID_OWNER',
  ttl: 'ERR_LEASE_INVALID_TTL',
}

/** Characters of every UTF-8 width, NUL and BOM included, and any code point. */
const oddChar = fc.oneof(
  fc.constantFrom('\0', 'a', 'é', '€', '\uFEFF', '\uFFFF', '😀', '𝄞', '\u{10FFFF}'),
  fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }),
)
/** Well-formed text of 0..`max` code points, odd characters likely. */
const oddText = (max: number) => fc.array(oddChar, { maxLength: max }).map((cs) => cs.join(''))

/** Cut to at most `max` UTF-8 bytes on a code point boundary. */
function cutToBytes(s: string, max: number): string {
  let out = ''
  let bytes = 0
  for (const ch of s) {
    const n = utf8(ch)
    if (bytes + n > max) break
    out += ch
    bytes += n
  }
  return out
}

/** Pad `s` with `filler` characters (then ASCII) to exactly `bytes` UTF-8 bytes; `s` must fit. */
function padToBytes(s: string, bytes: number, filler: string): string {
  const room = bytes - utf8(s)
  const step = utf8(filler)
  return s + filler.repeat(Math.floor(room / step)) + 'x'.repeat(room % step)
}

/** A valid key or owner under a cap: non-empty, sometimes exactly the cap. */
const validText = (cap: number) =>
  fc.oneof(
    oddText(12)
      .map((s) => cutToBytes(s, cap))
      .filter((s) => s.length > 0),
    fc.tuple(oddText(6), fc.constantFrom('x', 'é', '€', '😀')).map(([s, f]) => padToBytes(cutToBytes(s, cap), cap, f)),
  )

/** Values that are not strings at all; `near` is a valid string they could be coerced to. */
const notAString = (near: string): fc.Arbitrary<Bad> =>
  fc.oneof(
    fc.oneof(fc.integer(), fc.double(), fc.constant(Number.NaN)).map((value) => ({ value, cls: TypeError, what: 'number' })),
    fc.bigInt().map((value) => ({ value, cls: TypeError, what: 'bigint' })),
    fc.boolean().map((value) => ({ value, cls: TypeError, what: 'boolean' })),
    fc.constantFrom(null, undefined).map((value) => ({ value, cls: TypeError, what: String(value) })),
    fc.string().map((d) => ({ value: Symbol(d), cls: TypeError, what: 'symbol' })),
    fc.constantFrom(
      () => ({ toString: () => near }),
      () => ({ valueOf: () => near }),
      () => [near],
      () => new String(near),
      () => ({}),
      () => [],
      () => () => near,
      () => new Date(0),
      () => Buffer.from(near),
      () => new Uint8Array(1),
    ).map((make) => ({ value: make(), cls: TypeError, what: 'object' })),
    fc.anything().filter((v) => typeof v !== 'string').map((value) => ({ value, cls: TypeError, what: 'anything' })),
  )

/** Strings with one or more lone surrogates anywhere (start, middle, end, reversed pairs). */
const loneSurrogate = (near: string): fc.Arbitrary<Bad> => {
  const lone = fc.oneof(
    fc.integer({ min: 0xd800, max: 0xdfff }).map((u) => String.fromCharCode(u)),
    fc
      .tuple(fc.integer({ min: 0xdc00, max: 0xdfff }), fc.integer({ min: 0xd800, max: 0xdbff }))
      .map(([lo, hi]) => String.fromCharCode(lo, hi)),
  )
  return fc
    .tuple(
      // A long head puts the surrogate past the glue's 255-unit stack buffer.
      fc.oneof(fc.constant(''), fc.constant(near), oddText(4), fc.constant('x'.repeat(300))),
      fc.array(fc.tuple(lone, oddText(3)), { minLength: 1, maxLength: 3 }),
    )
    .map(([head, rest]) => head + rest.map(([l, text]) => l + text).join(''))
    .filter((s) => !wellFormed(s))
    .map((value) => ({ value, cls: TypeError, what: 'lone surrogate' }))
}

/** Well-formed strings of cap+1 to cap+40 UTF-8 bytes, in characters of every width. */
const overCap = (cap: number, near: string): fc.Arbitrary<Bad> =>
  fc
    .tuple(fc.oneof(fc.constant(near), oddText(6)), fc.constantFrom('x', 'é', '€', '😀', '\0'), fc.integer({ min: 1, max: 40 }))
    .map(([head, filler, extra]) => padToBytes(cutToBytes(head, cap), cap + extra, filler))
    .map((value) => ({ value, cls: RangeError, what: 'over the cap' }))

const badText = (cap: number, near: string): fc.Arbitrary<Bad> =>
  fc.oneof(
    { weight: 3, arbitrary: notAString(near) },
    { weight: 1, arbitrary: fc.constant({ value: '', cls: RangeError, what: 'empty' }) },
    { weight: 3, arbitrary: loneSurrogate(near) },
    { weight: 3, arbitrary: overCap(cap, near) },
  )

const badTtl = (maxTtlMs: number): fc.Arbitrary<Bad> => {
  const range = (what: string) => (value: number) => ({ value, cls: RangeError, what })
  return fc.oneof(
    fc.constantFrom(0, -0).map(range('0')),
    fc.oneof(fc.integer({ max: -1 }), fc.double({ max: -Number.MIN_VALUE, noNaN: true })).map(range('negative')),
    fc.constant(Number.NaN).map(range('NaN')),
    fc.constantFrom(Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY).map(range('infinite')),
    fc
      .double({ min: Number.MIN_VALUE, max: maxTtlMs, noNaN: true })
      .filter((d) => !Number.isInteger(d))
      .map(range('fraction')),
    fc.integer({ min: maxTtlMs + 1, max: 2 ** 31 }).map(range('over maxTtlMs')),
    fc.constantFrom(maxTtlMs + 1, 2 ** 53 - 1, 2 ** 53, 2 ** 53 + 2, 2 ** 60, Number.MAX_VALUE).map(range('huge')),
    fc
      .oneof(fc.integer({ min: 1, max: maxTtlMs }).map(String), fc.string())
      .map((value) => ({ value, cls: TypeError, what: 'string' })),
    fc.bigInt({ min: 1n, max: BigInt(maxTtlMs) }).map((value) => ({ value, cls: TypeError, what: 'bigint' })),
    fc
      .constantFrom(null, undefined, true, false, { valueOf: () => 1000 }, [1000], new Number(1000), new Date(1000))
      .map((value) => ({ value, cls: TypeError, what: 'other type' })),
    fc.string().map((d) => ({ value: Symbol(d), cls: TypeError, what: 'symbol' })),
  )
}

const METHODS = {
  acquireLease: ['key', 'owner', 'ttl'],
  getLeaseOwner: ['key'],
  releaseLease: ['key', 'owner'],
  renewLease: ['key', 'owner', 'ttl'],
  transferLease: ['key', 'owner', 'owner', 'ttl'],
} as const satisfies Record<string, readonly Kind[]>
type Method = keyof typeof METHODS

interface BadCall {
  method: Method
  args: unknown[]
  /** The (class, code) pairs the rejection may carry: one per bad or missing argument. */
  allowed: Array<{ cls: ErrorClass; code: string }>
  what: string[]
}

/**
 * A call with at least one bad argument. The other arguments are valid, mostly the held
 * lease's key and owner, so a call that slipped through would show on the held lease.
 * Sometimes trailing arguments are left out (the call really has fewer arguments).
 */
function badCall(caps: Caps): fc.Arbitrary<BadCall> {
  const [heldKey, holder] = HELD[0]!
  const good: Record<Kind, fc.Arbitrary<unknown>> = {
    key: fc.oneof(fc.constantFrom(...HELD.map(([k]) => k)), validText(caps.maxKeyBytes)),
    owner: fc.oneof(fc.constantFrom(...HELD.map(([, o]) => o)), validText(caps.maxOwnerBytes)),
    ttl: fc.oneof(fc.constantFrom(1, caps.maxTtlMs), fc.integer({ min: 1, max: caps.maxTtlMs })),
  }
  const bad: Record<Kind, fc.Arbitrary<Bad>> = {
    key: badText(caps.maxKeyBytes, heldKey),
    owner: badText(caps.maxOwnerBytes, holder),
    ttl: badTtl(caps.maxTtlMs),
  }
  return fc.constantFrom(...(Object.keys(METHODS) as Method[])).chain((method) => {
    const kinds = METHODS[method]
    const n = kinds.length
    return fc
      .tuple(
        fc.integer({ min: 0, max: n - 1 }), // the argument that is surely bad
        // Now and then another argument is bad too: any one of their codes is right.
        fc.array(fc.integer({ min: 0, max: 4 }).map((x) => x === 0), { minLength: n, maxLength: n }),
        // One call in six leaves out its arguments from some position on.
        fc.oneof({ weight: 5, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.integer({ min: 0, max: n - 1 }) }),
      )
      .chain(([sure, extra, cut]) => {
        const badAt = kinds.map((_, i) => i === sure || extra[i]!)
        return fc.tuple(...kinds.map((kind, i) => (badAt[i] ? bad[kind] : good[kind].map((value) => ({ value }))))).map((values) => {
          const allowed: BadCall['allowed'] = []
          const what: string[] = []
          const args: unknown[] = []
          kinds.forEach((kind, i) => {
            if (cut !== null && i >= cut) {
              allowed.push({ cls: TypeError, code: CODES[kind] })
              what.push(`${kind}: left out`)
              return
            }
            const v = values[i] as { value: unknown } | Bad
            args.push(v.value)
            if ('cls' in v) {
              allowed.push({ cls: v.cls, code: CODES[kind] })
              what.push(`${kind}: ${v.what}`)
            }
          })
          return { method, args, allowed, what }
        })
      })
  })
}

// ---------------------------------------------------------------------------
// Targets
// ---------------------------------------------------------------------------

interface Target {
  name: string
  leases: LeaseApi
  caps: Caps
  /** The Redis key of a lease key, for targets backed by Redis. */
  redisKey?: (key: string) => string
}

const cleanups: Array<() => Promise<void>> = []
afterEach(async () => {
  for (const clean of cleanups.splice(0).reverse()) await clean().catch(() => undefined)
})

async function ownRedis(): Promise<RedisServer> {
  const server = await startRedis()
  cleanups.push(() => server.stop())
  return server
}

function memoryTargets(): Target[] {
  return [DEFAULT_CAPS, SMALL_CAPS].map((caps) => {
    const leases = new MemoryLeaseProvider(caps)
    cleanups.push(() => leases.close())
    return { name: `MemoryLeaseProvider ${JSON.stringify(caps)}`, leases, caps }
  })
}

function redisTargets(server: RedisServer, kind: 'provider' | 'pubsub'): Target[] {
  return [DEFAULT_CAPS, SMALL_CAPS].map((caps) => {
    const keyPrefix = `fuzz:${randomUUID()}`
    const leases: LeaseApi =
      kind === 'provider'
        ? new RedisLeaseProvider({ url: server.url, keyPrefix, ...caps })
        : new RedisStreamsPubSub({ url: server.url, keyPrefix, reclaimIntervalMs: 0, ...caps })
    cleanups.push(() => leases.close())
    const name = kind === 'provider' ? 'RedisLeaseProvider' : 'RedisStreamsPubSub'
    return { name: `${name} ${JSON.stringify(caps)}`, leases, caps, redisKey: (key) => `${keyPrefix}:lease:${key}` }
  })
}

// ---------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------

const NUM_RUNS = 5_000
const VALID_RUNS = 500

interface Tally {
  calls: number
  arguments: Map<string, number>
}

/** Call and classify: the outcome must be a rejected promise carrying an allowed class and code. */
async function expectCodedRejection(target: Target, call: BadCall): Promise<void> {
  const fn = (target.leases as unknown as Record<Method, (...a: unknown[]) => unknown>)[call.method]
  let result: unknown
  try {
    result = fn.apply(target.leases, call.args)
  } catch (err) {
    throw new Error(`${call.method} threw synchronously instead of rejecting: ${String(err)}`)
  }
  expect(result, `${call.method} must return a promise`).toBeInstanceOf(Promise)
  const outcome = await (result as Promise<unknown>).then(
    (value) => ({ rejected: false as const, value }),
    (error: unknown) => ({ rejected: true as const, error }),
  )
  if (!outcome.rejected) throw new Error(`${call.method} resolved ${String(outcome.value)} for ${call.what.join(', ')}`)
  const err = outcome.error as Error & { code?: unknown }
  const fits = call.allowed.some(({ cls, code }) => err instanceof cls && err.code === code)
  if (!fits) {
    const want = call.allowed.map(({ cls, code }) => `${cls.name} ${code}`).join(' or ')
    throw new Error(`${call.method} (${call.what.join(', ')}) rejected with ${err?.name} ${String(err?.code)}, expected ${want}`)
  }
}

interface HeldState {
  owners: Array<string | undefined>
  /** [PTTL, sent at, answered at] per held lease (performance.now() ms), for Redis targets. */
  pttl: Array<[number, number, number]>
}

async function holdLeases(target: Target): Promise<void> {
  for (const [key, owner] of HELD) {
    expect(await target.leases.acquireLease(key, owner, target.caps.maxTtlMs)).toStrictEqual({ acquired: true, owner })
  }
}

async function heldState(target: Target, server?: RedisServer): Promise<HeldState> {
  const owners = await Promise.all(HELD.map(([key]) => target.leases.getLeaseOwner(key)))
  const pttl: HeldState['pttl'] = []
  if (server && target.redisKey) {
    for (const [key] of HELD) {
      const sent = performance.now()
      const ttl = Number(await server.cli('PTTL', target.redisKey(key)))
      pttl.push([ttl, sent, performance.now()])
    }
  }
  return { owners, pttl }
}

function expectHeldUnchanged(before: HeldState, after: HeldState) {
  expect(after.owners).toEqual(HELD.map(([, owner]) => owner))
  expect(before.owners).toEqual(after.owners)
  before.pttl.forEach(([ttl0, sent0, answered0], i) => {
    const [ttl1, sent1, answered1] = after.pttl[i]!
    // Neither refreshed nor cut (as a coerced TTL would): it only ran down with the clock,
    // by the time between the two PTTL reads (bounded by when each was sent and answered).
    const slack = 5
    expect(ttl1, 'PTTL of a held lease').toBeLessThanOrEqual(ttl0 - (sent1 - answered0) + slack)
    expect(ttl1, 'PTTL of a held lease').toBeGreaterThanOrEqual(ttl0 - (answered1 - sent0) - slack)
  })
}

async function fuzzBadInput(targets: Target[], server?: RedisServer): Promise<Tally> {
  const tally: Tally = { calls: 0, arguments: new Map() }
  for (const t of targets) await holdLeases(t)
  // Every provider is connected and its scripts loaded before the snapshot.
  const before = await Promise.all(targets.map((t) => heldState(t, server)))
  const callsBefore = await server?.commandCalls()

  await fc.assert(
    fc.asyncProperty(
      fc.integer({ min: 0, max: targets.length - 1 }).chain((i) => badCall(targets[i]!.caps).map((call) => ({ i, call }))),
      async ({ i, call }) => {
        tally.calls++
        for (const w of call.what) tally.arguments.set(w, (tally.arguments.get(w) ?? 0) + 1)
        await expectCodedRejection(targets[i]!, call)
      },
    ),
    { numRuns: NUM_RUNS },
  )

  if (server && callsBefore) {
    const callsAfter = await server.commandCalls()
    const sent = Object.keys(callsAfter).filter((cmd) => cmd !== 'info' && callsAfter[cmd] !== (callsBefore[cmd] ?? 0))
    expect(
      sent.map((cmd) => `${cmd}: ${(callsAfter[cmd] ?? 0) - (callsBefore[cmd] ?? 0)}`),
      'commands that reached Redis during the bad-input run',
    ).toEqual([])
  }
  const after = await Promise.all(targets.map((t) => heldState(t, server)))
  targets.forEach((_, i) => expectHeldUnchanged(before[i]!, after[i]!))
  return tally
}

/** What a bad-input run tried, for the report. */
function figures(tally: Tally): string {
  const top = [...tally.arguments.entries()].sort((a, b) => b[1] - a[1])
  return `${tally.calls} bad calls; arguments by kind: ${top.map(([w, n]) => `${w} ${n}`).join(', ')}`
}

/** Acquire, read, renew, transfer and release odd but valid keys and owners, byte for byte. */
async function fuzzValidInput(targets: Target[], server?: RedisServer): Promise<number> {
  let runs = 0
  const input = fc.integer({ min: 0, max: targets.length - 1 }).chain((i) => {
    const caps = targets[i]!.caps
    return fc.record({
      i: fc.constant(i),
      key: validText(caps.maxKeyBytes),
      owner: validText(caps.maxOwnerBytes),
      next: validText(caps.maxOwnerBytes),
      ttl: fc.integer({ min: 5_000, max: caps.maxTtlMs }),
    })
  })
  await fc.assert(
    fc.asyncProperty(input, async ({ i, key, owner, next, ttl }) => {
      runs++
      const t = targets[i]!
      const p = t.leases
      expect(wellFormed(key) && wellFormed(owner)).toBe(true)
      expect(await p.acquireLease(key, owner, ttl)).toStrictEqual({ acquired: true, owner })
      expect(await p.getLeaseOwner(key)).toBe(owner)
      if (server && t.redisKey) expect(await server.cli('GET', t.redisKey(key))).toBe(owner)

      // Proper prefixes on code point boundaries (the shortest, the longest, and every one
      // that ends just before or at a NUL, Mastra's resource/thread boundary), and the key
      // with a NUL appended, are other leases: free, and taking one leaves the key's alone.
      const points = [...key]
      const cuts = new Set([1, 2, points.length - 2, points.length - 1])
      points.forEach((ch, n) => ch === '\0' && cuts.add(n).add(n + 1))
      const relatives = [...cuts].filter((n) => n > 0 && n < points.length).map((n) => points.slice(0, n).join(''))
      if (utf8(key) < t.caps.maxKeyBytes) relatives.push(`${key}\0`)
      for (const other of relatives) {
        expect(await p.getLeaseOwner(other), JSON.stringify(other)).toBeUndefined()
      }
      const [other] = relatives
      if (other !== undefined && other !== key) {
        expect(await p.acquireLease(other, next, ttl)).toStrictEqual({ acquired: true, owner: next })
        expect(await p.getLeaseOwner(key)).toBe(owner)
        await p.releaseLease(other, next)
      }

      expect(await p.renewLease(key, owner, ttl)).toBe(true)
      const moved = await p.transferLease(key, owner, next, ttl)
      expect(moved).toBe(true)
      expect(await p.getLeaseOwner(key)).toBe(next)
      await p.releaseLease(key, next)
      expect(await p.getLeaseOwner(key)).toBeUndefined()
      if (server && t.redisKey) expect(await server.cli('EXISTS', t.redisKey(key))).toBe(0)
    }),
    { numRuns: VALID_RUNS },
  )
  return runs
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

describe('bad input, generated: every invalid argument is a coded rejection that changes nothing', () => {
  it('MemoryLeaseProvider rejects every generated bad call with the documented class and code, and the held leases stay', async ({ annotate }) => {
    const tally = await fuzzBadInput(memoryTargets())
    await annotate(figures(tally))
    expect(tally.calls).toBe(NUM_RUNS)
  })

  it.skipIf(EXTERNAL_REDIS)(
    'RedisLeaseProvider rejects every generated bad call with the documented class and code, and not one command reaches Redis',
    async ({ annotate }) => {
      const server = await ownRedis()
      const tally = await fuzzBadInput(redisTargets(server, 'provider'), server)
      await annotate(figures(tally))
      expect(tally.calls).toBe(NUM_RUNS)
    },
  )

  it.skipIf(EXTERNAL_REDIS)(
    "RedisStreamsPubSub's lease methods reject every generated bad call the same way, and not one command reaches Redis",
    async ({ annotate }) => {
      const server = await ownRedis()
      const tally = await fuzzBadInput(redisTargets(server, 'pubsub'), server)
      await annotate(figures(tally))
      expect(tally.calls).toBe(NUM_RUNS)
    },
  )
})

describe('odd but valid input, generated: NUL, astral characters and exactly-the-cap lengths round-trip', () => {
  it('MemoryLeaseProvider takes, reads, renews, transfers and releases them exactly, and a key stays distinct from its prefixes', async () => {
    expect(await fuzzValidInput(memoryTargets())).toBe(VALID_RUNS)
  })

  it('RedisLeaseProvider and RedisStreamsPubSub store them byte for byte under their prefix, distinct from the key\'s prefixes', async () => {
    const server = await ownRedis()
    const targets = [...redisTargets(server, 'provider'), ...redisTargets(server, 'pubsub')]
    expect(await fuzzValidInput(targets, server)).toBe(VALID_RUNS)
  })
})
