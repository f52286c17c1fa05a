// Issue #5, rows 2, 3, 9, 12 and 13 of the fault matrix: the TTL boundary, concurrent calls
// judged against every serial order, a restart with an append-only file, a client process
// frozen longer than its TTL, and wall-clock jumps on the client. Where owners' calls are
// sequential, the lease-interval history checker (helpers/lease-history.ts) judges the run
// too. Rows 2, 3, 12 and 13 carry negative controls: a store with the fault in question,
// run through the same checks, which must flag it. Row 9's counterpart, a restart without
// persistence, is the negative control in lease-faults.spec.ts.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { spawn, type ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub } from '../dist/esm/index.js'
import { MemoryLeaseProvider, RedisLeaseProvider } from '../index.js'
import { sleep } from './helpers/lease.js'
import { checkLeaseHistory, monotonicNow, recordLeases, type HistoryReport, type LeaseLike, type LeaseOperation } from './helpers/lease-history.js'
import { NODE } from './helpers/mastra-node.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

const CHILD = path.join(__dirname, 'fixtures', 'lease-child.mjs')
const RUN = randomUUID().slice(0, 8)
const msToNs = (ms: number) => BigInt(Math.round(ms * 1e6))
/** b - a, in ms. */
const msBetween = (a: bigint, b: bigint) => Number(b - a) / 1e6
/** Sleep until the monotonic clock (process.hrtime.bigint(), shared by all processes) reaches `at`. */
const untilMono = (at: bigint) => sleep(Math.max(0, msBetween(monotonicNow(), at)))

type Grant = { acquired: boolean; owner?: string }

interface Timed<T> {
  value: T
  /** Monotonic ns just before the call and just after it settled. */
  t0: bigint
  t1: bigint
}
async function timed<T>(call: () => Promise<T>): Promise<Timed<T>> {
  const t0 = monotonicNow()
  const value = await call()
  return { value, t0, t1: monotonicNow() }
}

const servers: RedisServer[] = []
const closers: Array<() => Promise<unknown>> = []
const tempDirs: string[] = []
const children = new Set<ChildProcess>()

afterEach(async () => {
  // Never leave a child behind, least of all a SIGSTOPped one.
  for (const child of children) {
    child.kill('SIGCONT')
    child.kill('SIGKILL')
  }
  children.clear()
  await Promise.all(closers.splice(0).map((close) => close().catch(() => undefined)))
})

afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop()))
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true })
})

/** A provider closed after the test, whatever happens. */
function closing<P extends { close(): Promise<unknown> }>(provider: P): P {
  closers.push(() => provider.close())
  return provider
}

/** GET and PTTL of a lease key in one atomic step, straight from Redis. */
async function leaseInRedis(server: RedisServer, fullKey: string): Promise<{ owner: string | null; pttl: number }> {
  const reply = await server.cli('EVAL', "return {redis.call('GET', KEYS[1]) or false, redis.call('PTTL', KEYS[1])}", 1, fullKey)
  const [owner, pttl] = reply as [string | null, number]
  return { owner, pttl }
}

const describeOverlaps = (report: HistoryReport) =>
  report.overlaps
    .slice(0, 3)
    .map((o) => o.description)
    .join('\n')

// ---------------------------------------------------------------------------
// Row 2: the TTL boundary
// ---------------------------------------------------------------------------

const LEASE_MS = 50
const RENEW_TTL_MS = 2_000

interface BoundaryRun {
  renews: number
  renewedTrue: number
  renewedFalse: number
  contested: number
  rivalWins: number
  holderWinsContested: number
  inspections: number
  violations: string[]
}

/**
 * Per key and iteration: `holder` takes a 50 ms lease, then renews it (with a 2 s TTL) aimed
 * at the expiry, from 12 ms before to 8 ms after (timers fire late on a busy machine, never
 * early). Every other iteration a rival's acquire is fired in the same tick as the renew.
 * Judged, with the times each call started and returned:
 * - renew true only if the lease may still have been live when the renew started,
 *   renew false only if it may have expired by the time the renew returned;
 * - never both the renew and the rival's acquire;
 * - the store afterwards holds what the results imply: the renewer, the rival, or nobody
 *   (so a false renew never re-created the key), with a TTL of about the new 2 s.
 */
async function ttlBoundary(o: {
  holder: LeaseLike
  rival: LeaseLike
  keys: string[]
  iterations: number
  /** The lease straight from the server; without it the store is asked, twice. */
  inspect?: (key: string) => Promise<{ owner: string | null; pttl: number }>
}): Promise<BoundaryRun> {
  const run: BoundaryRun = {
    renews: 0,
    renewedTrue: 0,
    renewedFalse: 0,
    contested: 0,
    rivalWins: 0,
    holderWinsContested: 0,
    inspections: 0,
    violations: [],
  }
  await Promise.all(
    o.keys.map(async (key, k) => {
      const flag = (i: number, what: string) => run.violations.push(`${JSON.stringify(key)} #${i}: ${what}`)
      for (let i = 0; i < o.iterations; i++) {
        const contested = (i + k) % 2 === 1
        const acq = await timed(() => o.holder.acquireLease(key, 'holder', LEASE_MS))
        if (!acq.value.acquired) {
          flag(i, `the acquire of a free key was refused in favour of ${acq.value.owner}`)
          continue
        }
        await untilMono(acq.t0 + msToNs(LEASE_MS + Math.random() * 20 - 12))
        const rivalFirst = contested && Math.random() < 0.5
        const rivalEarly = rivalFirst ? timed(() => o.rival.acquireLease(key, 'rival', RENEW_TTL_MS)) : undefined
        const renewing = timed(() => o.holder.renewLease(key, 'holder', RENEW_TTL_MS))
        const rivalLate = contested && !rivalFirst ? timed(() => o.rival.acquireLease(key, 'rival', RENEW_TTL_MS)) : undefined
        const [renew, rival] = await Promise.all([renewing, rivalEarly ?? rivalLate])

        run.renews++
        // The server set the 50 ms TTL somewhere in [acq.t0, acq.t1]; Redis counts whole ms.
        if (renew.value) {
          run.renewedTrue++
          if (renew.t0 > acq.t1 + msToNs(LEASE_MS + 1)) {
            flag(i, `renew returned true although it started ${msBetween(acq.t1, renew.t0).toFixed(2)} ms after the acquire returned: the expired lease was resurrected`)
          }
        } else {
          run.renewedFalse++
          if (renew.t1 < acq.t0 + msToNs(LEASE_MS)) {
            flag(i, `renew returned false only ${msBetween(acq.t0, renew.t1).toFixed(2)} ms after the acquire started, before the lease could expire`)
          }
        }
        let expected: string | null = renew.value ? 'holder' : null
        let grantedAt = renew.t0
        if (rival) {
          run.contested++
          if (rival.value.acquired) {
            run.rivalWins++
            expected = 'rival'
            grantedAt = rival.t0
            if (renew.value) flag(i, 'both the renew and the rival’s acquire succeeded')
          } else {
            if (rival.value.owner !== 'holder') flag(i, `the rival was refused in favour of ${rival.value.owner}`)
            if (renew.value) run.holderWinsContested++
          }
        }

        if (o.inspect) {
          const seen = await timed(() => o.inspect!(key))
          run.inspections++
          const { owner, pttl } = seen.value
          if (owner !== expected) flag(i, `the server holds ${owner} after renew ${renew.value} / rival ${rival?.value.acquired}; expected ${expected}`)
          if (expected === null && pttl !== -2) flag(i, `PTTL ${pttl} on a key that must be absent`)
          if (expected !== null) {
            const lowest = RENEW_TTL_MS - msBetween(grantedAt, seen.t1) - 2
            if (pttl > RENEW_TTL_MS || pttl < lowest) flag(i, `PTTL ${pttl} after a ${RENEW_TTL_MS} ms grant, expected in [${lowest.toFixed(0)}, ${RENEW_TTL_MS}]`)
          }
        } else {
          const owner = (await o.holder.getLeaseOwner(key)) ?? null
          if (owner !== expected) flag(i, `the store holds ${owner} after renew ${renew.value} / rival ${rival?.value.acquired}; expected ${expected}`)
          if (expected !== null) {
            // Once the 50 ms lease has surely run out, a renew that kept the old deadline shows.
            await untilMono(acq.t1 + msToNs(LEASE_MS + 10))
            const later = (await o.holder.getLeaseOwner(key)) ?? null
            if (later !== expected) flag(i, `${expected} lost the lease within ${LEASE_MS + 10} ms of a ${RENEW_TTL_MS} ms grant`)
          }
          run.inspections++
        }
        await Promise.all([o.holder.releaseLease(key, 'holder'), o.rival.releaseLease(key, 'rival')])
      }
    }),
  )
  return run
}

/** A broken renew that re-takes an expired lease (a SET where a GET-compare belongs). */
function resurrectingRenew(p: LeaseLike): LeaseLike {
  return { ...bind(p), renewLease: async (k, o, t) => (await p.renewLease(k, o, t)) || (await p.acquireLease(k, o, t)).acquired }
}
/** A broken renew that reports the loss but re-created the key anyway. */
function recreatingRenew(p: LeaseLike): LeaseLike {
  return {
    ...bind(p),
    renewLease: async (k, o, t) => {
      const renewed = await p.renewLease(k, o, t)
      if (!renewed) await p.acquireLease(k, o, t)
      return renewed
    },
  }
}
function bind(p: LeaseLike): LeaseLike {
  return {
    acquireLease: (k, o, t) => p.acquireLease(k, o, t),
    getLeaseOwner: (k) => p.getLeaseOwner(k),
    releaseLease: (k, o) => p.releaseLease(k, o),
    renewLease: (k, o, t) => p.renewLease(k, o, t),
    transferLease: (k, f, t, ttl) => p.transferLease(k, f, t, ttl),
    close: () => p.close(),
  }
}

describe('row 2: renewing 50 ms leases right at their expiry', () => {
  let server: RedisServer
  beforeAll(async () => {
    server = await startRedis()
    servers.push(server)
  })

  const keysFor = (label: string, n: number) => Array.from({ length: n }, (_, i) => `${label}:${RUN}:${i}\u0000thread`)

  function summarize(label: string, run: BoundaryRun, report: HistoryReport) {
    console.log(
      `row 2 ${label}: ${run.renews} boundary renews (${run.renewedTrue} true, ${run.renewedFalse} false), ` +
        `${run.contested} contested (rival won ${run.rivalWins}, holder won ${run.holderWinsContested}), ` +
        `${run.inspections} store inspections, ${report.operations} operations checked, ${report.overlaps.length} overlaps, ` +
        `${run.violations.length} violations`,
    )
  }

  function expectClean(run: BoundaryRun, report: HistoryReport) {
    // Not vacuous: the renews really straddled the expiry, and rivals won and lost.
    expect(run.renews).toBeGreaterThanOrEqual(500)
    expect(run.renewedTrue, 'renews that beat the expiry').toBeGreaterThanOrEqual(run.renews * 0.05)
    expect(run.renewedFalse, 'renews that came too late').toBeGreaterThanOrEqual(run.renews * 0.05)
    expect(run.rivalWins).toBeGreaterThan(0)
    expect(run.holderWinsContested).toBeGreaterThan(0)
    expect(run.violations.slice(0, 5)).toEqual([])
    expect(report.errors, 'no call failed').toBe(0)
    expect(report.overlaps, describeOverlaps(report)).toEqual([])
  }

  it('MemoryLeaseProvider: a renew at expiry is true only while the lease lived, a false renew never re-creates it, and no renew wins after a rival acquired', async () => {
    const store = closing(new MemoryLeaseProvider())
    const ops: LeaseOperation[] = []
    const leases = recordLeases(store, (op) => ops.push(op))
    const run = await ttlBoundary({ holder: leases, rival: leases, keys: keysFor('boundary-mem', 32), iterations: 24 })
    const report = checkLeaseHistory(ops)
    summarize('memory', run, report)
    expectClean(run, report)
  })

  it('RedisLeaseProvider: the same, with the key and its PTTL read straight from Redis after every renew', async () => {
    const prefix = `boundary:${RUN}`
    const ops: LeaseOperation[] = []
    const holder = recordLeases(closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })), (op) => ops.push(op))
    const rival = recordLeases(closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })), (op) => ops.push(op))
    const run = await ttlBoundary({
      holder,
      rival,
      keys: keysFor('boundary-redis', 32),
      iterations: 24,
      inspect: (key) => leaseInRedis(server, `${prefix}:lease:${key}`),
    })
    const report = checkLeaseHistory(ops)
    summarize('redis', run, report)
    expectClean(run, report)
  })

  it('the boundary check flags a renew that re-takes an expired lease, and one that re-creates the key while returning false (negative controls)', async () => {
    const memory = closing(new MemoryLeaseProvider())
    const resurrected = await ttlBoundary({ holder: resurrectingRenew(memory), rival: memory, keys: keysFor('boundary-neg-mem', 8), iterations: 6 })
    const prefix = `boundary-neg:${RUN}`
    const redis = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const recreated = await ttlBoundary({
      holder: recreatingRenew(redis),
      rival: redis,
      keys: keysFor('boundary-neg-redis', 8),
      iterations: 6,
      inspect: (key) => leaseInRedis(server, `${prefix}:lease:${key}`),
    })
    console.log(
      `row 2 negative controls: resurrecting renew ${resurrected.violations.length} violations ` +
        `(${resurrected.violations[0]}); re-creating renew ${recreated.violations.length} violations (${recreated.violations[0]})`,
    )
    expect(resurrected.violations.some((v) => v.includes('resurrected'))).toBe(true)
    expect(recreated.violations.some((v) => v.includes('the server holds holder') && v.includes('expected null'))).toBe(true)
  })
})

// ---------------------------------------------------------------------------
// Row 3: concurrent release / renew / transfer / acquire
// ---------------------------------------------------------------------------

type Kind = 'acquire' | 'renew' | 'release' | 'transfer' | 'owner'
interface Step {
  kind: Kind
  /** The caller (the `from` of a transfer). */
  owner: string
  to?: string
}
interface Done extends Step {
  start: bigint
  end: bigint
  result?: unknown
  error?: string
}

const ROUND_TTL_MS = 30_000

/** The lease model: what one call does to the owner, and what it answers. */
function apply(state: string | undefined, s: Step): { state: string | undefined; result: unknown } {
  switch (s.kind) {
    case 'acquire':
      return state === undefined || state === s.owner
        ? { state: s.owner, result: { acquired: true, owner: s.owner } }
        : { state, result: { acquired: false, owner: state } }
    case 'renew':
      return { state, result: state === s.owner }
    case 'release':
      return { state: state === s.owner ? undefined : state, result: undefined }
    case 'transfer':
      return state === s.owner ? { state: s.to, result: true } : { state, result: false }
    case 'owner':
      return { state, result: state }
  }
}

function sameResult(kind: Kind, seen: unknown, model: unknown): boolean {
  if (kind === 'acquire') {
    const a = seen as Grant | undefined
    const b = model as Grant
    return a?.acquired === b.acquired && a.owner === b.owner
  }
  return seen === model
}

/**
 * Every owner that some serial order of `done` ends with. A serial order must give each call
 * the result it actually returned, and must respect real time: a call that returned before
 * another started comes first. An empty set: no serial order explains what the calls returned.
 */
function serialFinals(initial: string | undefined, done: readonly Done[]): Set<string | undefined> {
  const finals = new Set<string | undefined>()
  const seen = new Set<string>()
  const all = (1 << done.length) - 1
  const walk = (mask: number, state: string | undefined) => {
    const memo = `${mask}:${state ?? '\u0001'}`
    if (seen.has(memo)) return
    seen.add(memo)
    if (mask === all) {
      finals.add(state)
      return
    }
    for (let i = 0; i < done.length; i++) {
      if (mask & (1 << i)) continue
      const op = done[i]!
      const blocked = done.some((other, j) => j !== i && !(mask & (1 << j)) && other.end < op.start)
      if (blocked) continue
      const next = apply(state, op)
      if (sameResult(op.kind, op.result, next.result)) walk(mask | (1 << i), next.state)
    }
  }
  walk(0, initial)
  return finals
}

const pick = <T>(items: readonly T[]): T => items[Math.floor(Math.random() * items.length)]!

/** Same owner: up to 7 calls, all by A, with two competing transfers away half the time. */
function sameOwnerBatch(): Step[] {
  const pool: Step[] = [
    { kind: 'acquire', owner: 'A' },
    { kind: 'renew', owner: 'A' },
    { kind: 'release', owner: 'A' },
    { kind: 'transfer', owner: 'A', to: 'X' },
    { kind: 'transfer', owner: 'A', to: 'Y' },
    { kind: 'owner', owner: 'A' },
  ]
  const steps: Step[] = Math.random() < 0.5 ? [pool[3]!, pool[4]!] : []
  const n = 4 + Math.floor(Math.random() * 4)
  while (steps.length < n) steps.push(pick(pool))
  return steps
}

/** Different owners: A, B, C and X make one call each (so each owner's calls stay sequential), plus a read. */
function differentOwnerBatch(): Step[] {
  const steps: Step[] = ['A', 'B', 'C', 'X'].map((owner) => {
    const kind = pick<Kind>(['acquire', 'renew', 'release', 'transfer', 'transfer'])
    const to = Math.random() < 0.5 ? pick(['Y', 'Z']) : pick(['A', 'B', 'C', 'X'].filter((o) => o !== owner))
    return kind === 'transfer' ? { kind, owner, to } : { kind, owner }
  })
  steps.push({ kind: 'owner', owner: 'reader' })
  return steps.sort(() => Math.random() - 0.5)
}

function invoke(p: LeaseLike, key: string, s: Step): Promise<unknown> {
  switch (s.kind) {
    case 'acquire':
      return p.acquireLease(key, s.owner, ROUND_TTL_MS)
    case 'renew':
      return p.renewLease(key, s.owner, ROUND_TTL_MS)
    case 'release':
      return p.releaseLease(key, s.owner)
    case 'transfer':
      return p.transferLease(key, s.owner, s.to!, ROUND_TTL_MS)
    case 'owner':
      return p.getLeaseOwner(key)
  }
}

/** Fire `fn` now, or after a microtask, an immediate, or a timer of 0 to 2 ms. */
function somewhen(fn: () => void) {
  switch (Math.floor(Math.random() * 6)) {
    case 0:
      return fn()
    case 1:
      return queueMicrotask(fn)
    case 2:
      return void setImmediate(fn)
    default:
      return void setTimeout(fn, Math.floor(Math.random() * 3))
  }
}

interface ConcurrencyRun {
  rounds: number
  calls: number
  transfersWon: number
  /** Rounds with two or more competing transfers away from the holder. */
  transferRaces: number
  violations: string[]
  /**
   * Recorded operations for the history checker: of the different-owner rounds in which no
   * transfer goes to an owner that also calls. The checker assumes each owner's history is
   * sequential, and a transfer to B racing B's own release is not.
   */
  ops: LeaseOperation[]
}

/**
 * Rounds on fresh keys: an initial owner (or none), then a batch of calls fired in the same
 * tick or spread over a few ticks, through `providers` picked at random per call. No call may
 * reject; some serial order must explain every result; the owner the store reports afterwards
 * must be where such an order ends.
 */
async function concurrentRounds(o: {
  providers: LeaseLike[]
  rounds: number
  label: string
  readOwner: (key: string) => Promise<string | undefined>
}): Promise<ConcurrencyRun> {
  const run: ConcurrencyRun = { rounds: 0, calls: 0, transfersWon: 0, transferRaces: 0, violations: [], ops: [] }
  for (let r = 0; r < o.rounds; r++) {
    const sameOwner = r % 2 === 0
    const acrossTicks = r % 4 >= 2
    const key = `${o.label}:${RUN}:${r}\u0000thread`
    const roundOps: LeaseOperation[] = []
    const recorded = o.providers.map((p) => recordLeases(p, (op) => roundOps.push(op)))
    const initial = sameOwner ? pick([undefined, 'A', 'A']) : pick([undefined, 'A', 'B', 'X'])
    if (initial) await recorded[0]!.acquireLease(key, initial, ROUND_TTL_MS)
    const steps = sameOwner ? sameOwnerBatch() : differentOwnerBatch()
    const launch = (s: Step): Promise<Done> => {
      const start = monotonicNow()
      return invoke(pick(recorded), key, s).then(
        (result) => ({ ...s, start, end: monotonicNow(), result }),
        (err: unknown) => ({ ...s, start, end: monotonicNow(), error: String((err as { code?: unknown })?.code ?? err) }),
      )
    }
    const pending = acrossTicks
      ? steps.map((s) => new Promise<Done>((resolve) => somewhen(() => resolve(launch(s)))))
      : steps.map(launch)
    const done = await Promise.all(pending)
    const final = await o.readOwner(key)

    run.rounds++
    run.calls += done.length
    const where = `${o.label} round ${r} (${sameOwner ? 'same owner' : 'different owners'}, ${acrossTicks ? 'across ticks' : 'same tick'}, initial ${initial})`
    const calls = done.map((d) => `${d.kind} ${d.owner}${d.to ? `→${d.to}` : ''} = ${JSON.stringify(d.result ?? d.error ?? null)}`).join('; ')
    for (const d of done) if (d.error) run.violations.push(`${where}: ${d.kind} by ${d.owner} rejected with ${d.error}`)
    const finals = serialFinals(initial, done)
    if (finals.size === 0) run.violations.push(`${where}: no serial order explains ${calls}`)
    else if (!finals.has(final)) run.violations.push(`${where}: the store says ${final} afterwards, serial orders end at ${[...finals].join('/')}; ${calls}`)
    const transfersFromA = done.filter((d) => d.kind === 'transfer' && d.owner === 'A')
    const won = transfersFromA.filter((d) => d.result === true).length
    run.transfersWon += done.filter((d) => d.kind === 'transfer' && d.result === true).length
    if (sameOwner && transfersFromA.length >= 2) run.transferRaces++
    if (sameOwner && won > 1) run.violations.push(`${where}: ${won} transfers away from A all won; ${calls}`)
    const targetCalls = steps.some((s) => s.kind === 'transfer' && steps.some((c) => c.owner === s.to))
    if (!sameOwner && !targetCalls) run.ops.push(...roundOps)
  }
  return run
}

/** The textbook non-atomic transfer: check, release, acquire, in three steps. */
function nonAtomicTransfer(p: LeaseLike): LeaseLike {
  return {
    ...bind(p),
    transferLease: async (key, from, to, ttl) => {
      if ((await p.getLeaseOwner(key)) !== from) return false
      await p.releaseLease(key, from)
      await p.acquireLease(key, to, ttl)
      return true
    },
  }
}

describe('row 3: release, renew, transfer and acquire fired together', () => {
  let server: RedisServer
  beforeAll(async () => {
    server = await startRedis()
    servers.push(server)
  })
  const ROUNDS = 160

  function check(label: string, run: ConcurrencyRun) {
    const report = checkLeaseHistory(run.ops)
    console.log(
      `row 3 ${label}: ${run.rounds} rounds, ${run.calls} concurrent calls checked against every serial order, ` +
        `${run.transfersWon} transfers won, ${run.transferRaces} transfer races, ${run.violations.length} violations; ` +
        `history checker: ${report.operations} operations, ${report.overlaps.length} overlaps`,
    )
    expect(run.rounds).toBe(ROUNDS)
    expect(run.transferRaces).toBeGreaterThanOrEqual(20)
    expect(run.transfersWon).toBeGreaterThanOrEqual(20)
    expect(run.violations.slice(0, 5)).toEqual([])
    expect(report.operations).toBeGreaterThanOrEqual(ROUNDS / 2)
    expect(report.errors).toBe(0)
    expect(report.overlaps, describeOverlaps(report)).toEqual([])
  }

  const redisOwner = (prefix: string) => async (key: string) => ((await server.cli('GET', `${prefix}:lease:${key}`)) as string | null) ?? undefined

  it('MemoryLeaseProvider: no call rejects, and every round matches a serial order and the owner left behind', async () => {
    const store = closing(new MemoryLeaseProvider())
    check('memory', await concurrentRounds({ providers: [store], rounds: ROUNDS, label: 'concurrent-mem', readOwner: (k) => store.getLeaseOwner(k) }))
  })

  it('RedisLeaseProvider (two connections): no call rejects, and every round matches a serial order and the owner in Redis', async () => {
    const prefix = `concurrent:${RUN}`
    const providers = [0, 1].map(() => closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })))
    check('redis', await concurrentRounds({ providers, rounds: ROUNDS, label: 'concurrent-redis', readOwner: redisOwner(prefix) }))
  })

  it('RedisStreamsPubSub’s lease methods (two instances): the same', async () => {
    const prefix = `concurrent-streams:${RUN}`
    const providers = [0, 1].map(() => closing(new RedisStreamsPubSub({ url: server.url, keyPrefix: prefix })))
    check('streams pubsub', await concurrentRounds({ providers, rounds: ROUNDS, label: 'concurrent-streams', readOwner: redisOwner(prefix) }))
  })

  it('the serial-order check flags a transfer done as check, release, acquire in three steps (negative control)', async () => {
    const store = closing(new MemoryLeaseProvider())
    const run = await concurrentRounds({ providers: [nonAtomicTransfer(store)], rounds: 40, label: 'concurrent-neg', readOwner: (k) => store.getLeaseOwner(k) })
    console.log(`row 3 negative control: ${run.rounds} rounds, ${run.violations.length} flagged; first: ${run.violations[0]}`)
    expect(run.violations.some((v) => v.includes('no serial order') || v.includes('all won'))).toBe(true)
  })
})

// ---------------------------------------------------------------------------
// Row 9: restart with appendonly yes + appendfsync always
// ---------------------------------------------------------------------------

describe.skipIf(EXTERNAL_REDIS)('row 9: kill -9 and restart of a server with appendonly yes and appendfsync always', () => {
  it('leases survive with the same owner, their TTL keeps running through the restart, and the providers recover by themselves', async () => {
    const TTL = 3_000
    const server = await startRedis({ args: ['--appendonly', 'yes', '--appendfsync', 'always'] })
    servers.push(server)
    expect(await server.cli('CONFIG', 'GET', 'appendfsync')).toEqual(['appendfsync', 'always'])
    const prefix = `aof:${RUN}`
    const fullKey = (key: string) => `${prefix}:lease:${key}`
    const ops: LeaseOperation[] = []
    const holder = recordLeases(closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })), (op) => ops.push(op))
    const other = recordLeases(closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })), (op) => ops.push(op))
    const renewed = Array.from({ length: 3 }, (_, i) => `aof-renewed-${i}\u0000thread`)
    const left = Array.from({ length: 3 }, (_, i) => `aof-left-${i}\u0000thread`)

    const grants = new Map<string, Timed<Grant>>()
    for (const key of [...renewed, ...left]) grants.set(key, await timed(() => holder.acquireLease(key, 'holder', TTL)))
    for (const [key, g] of grants) expect(g.value, key).toEqual({ acquired: true, owner: 'holder' })
    const lastGrant = grants.get(left[left.length - 1]!)!
    const firstGrant = grants.get(renewed[0]!)!

    await server.kill()
    await sleep(300)
    await server.restart()

    // Straight from the restarted server: same owner, and the time spent down is gone from the TTL.
    for (const [key, g] of grants) {
      const seen = await timed(() => leaseInRedis(server, fullKey(key)))
      expect(seen.value.owner, key).toBe('holder')
      const most = TTL - msBetween(g.value.acquired ? g.t1 : g.t0, seen.t0) + 1
      expect(seen.value.pttl, `${key}: PTTL after the restart`).toBeGreaterThan(0)
      expect(seen.value.pttl, `${key}: PTTL after the restart`).toBeLessThanOrEqual(most)
    }

    // The same provider objects, not new ones: calls may reject while they reconnect.
    const reconnectErrors: unknown[] = []
    const settled = async <T>(call: () => Promise<T>): Promise<T> => {
      const deadline = Date.now() + 5_000
      for (;;) {
        try {
          return await call()
        } catch (err) {
          reconnectErrors.push((err as { code?: unknown })?.code ?? err)
          if (Date.now() > deadline) throw err
          await sleep(50)
        }
      }
    }
    for (const key of renewed) {
      const r = await timed(() => settled(() => holder.renewLease(key, 'holder', TTL)))
      expect(r.t1 < firstGrant.t0 + msToNs(TTL), 'the check ran before the lease could expire').toBe(true)
      expect(r.value, `${key}: renew by the holder after the restart`).toBe(true)
    }
    for (const key of left) {
      const r = await timed(() => settled(() => other.acquireLease(key, 'other', TTL)))
      expect(r.t1 < grants.get(key)!.t0 + msToNs(TTL), 'the check ran before the lease could expire').toBe(true)
      expect(r.value, `${key}: another owner before the TTL ran out`).toEqual({ acquired: false, owner: 'holder' })
    }

    // On time: still held shortly before the original TTL ends, free right after it.
    await untilMono(lastGrant.t0 + msToNs(TTL - 500))
    for (const key of left) {
      const r = await timed(() => other.acquireLease(key, 'other', TTL))
      expect(r.t1 < grants.get(key)!.t0 + msToNs(TTL), 'the check ran before the lease could expire').toBe(true)
      expect(r.value, `${key}: held up to the end of its TTL`).toEqual({ acquired: false, owner: 'holder' })
    }
    await untilMono(lastGrant.t1 + msToNs(TTL + 250))
    for (const key of left) expect(await other.acquireLease(key, 'other', TTL), `${key}: expired on time`).toEqual({ acquired: true, owner: 'other' })
    // The renewed ones run on their new TTL.
    for (const key of renewed) expect(await other.acquireLease(key, 'other', TTL), `${key}: renewed after the restart`).toEqual({ acquired: false, owner: 'holder' })

    const report = checkLeaseHistory(ops)
    console.log(
      `row 9: 1 kill -9 + restart, ${grants.size} leases survived, ${reconnectErrors.length} calls rejected while reconnecting ` +
        `(${reconnectErrors.join(', ')}), ` +
        `${report.operations} operations checked, ${report.overlaps.length} overlaps`,
    )
    for (const code of reconnectErrors) expect(['ERR_LEASE_CONNECTION', 'ERR_LEASE_TIMEOUT'], 'a call during the reconnect rejects with a coded error').toContain(code)
    expect(report.overlaps, describeOverlaps(report)).toEqual([])
  })
})

// ---------------------------------------------------------------------------
// A lease provider in a child process (rows 12 and 13)
// ---------------------------------------------------------------------------

interface ChildEvent {
  type: string
  id?: number
  value?: unknown
  error?: string
  mono?: string
  [field: string]: unknown
}

class LeaseChild {
  readonly ops: LeaseOperation[] = []
  readonly events: ChildEvent[] = []
  private stderr = ''
  private nextId = 0
  private readonly waiters = new Set<{ match: (e: ChildEvent) => boolean; resolve: (e: ChildEvent) => void }>()

  private constructor(private readonly proc: ChildProcess) {}

  static async start(config: Record<string, unknown>, env: NodeJS.ProcessEnv = process.env): Promise<LeaseChild> {
    const proc = spawn(NODE, [CHILD, JSON.stringify(config)], { stdio: ['pipe', 'pipe', 'pipe'], env })
    children.add(proc)
    const child = new LeaseChild(proc)
    proc.stderr!.setEncoding('utf8').on('data', (d: string) => (child.stderr += d))
    createInterface({ input: proc.stdout! }).on('line', (line) => child.onLine(line))
    await child.waitFor((e) => e.type === 'ready', 15_000)
    return child
  }

  private onLine(line: string) {
    const event = JSON.parse(line) as ChildEvent
    if (event.type === 'op') {
      const { type: _type, ...op } = event
      this.ops.push({ ...(op as unknown as LeaseOperation), start: BigInt(String(event.start)), end: BigInt(String(event.end)) })
    }
    this.events.push(event)
    for (const w of this.waiters) {
      if (w.match(event)) {
        this.waiters.delete(w)
        w.resolve(event)
      }
    }
  }

  /** The first event (already seen or still to come) that matches. */
  waitFor(match: (e: ChildEvent) => boolean, timeoutMs: number): Promise<ChildEvent> {
    const seen = this.events.find(match)
    if (seen) return Promise.resolve(seen)
    return new Promise((resolve, reject) => {
      const waiter = {
        match,
        resolve: (e: ChildEvent) => {
          clearTimeout(timer)
          resolve(e)
        },
      }
      const timer = setTimeout(() => {
        this.waiters.delete(waiter)
        reject(new Error(`the lease child sent no awaited event within ${timeoutMs} ms; stderr: ${this.stderr}`))
      }, timeoutMs)
      this.waiters.add(waiter)
    })
  }

  request(command: Record<string, unknown>): Promise<ChildEvent> {
    const id = ++this.nextId
    this.proc.stdin!.write(`${JSON.stringify({ ...command, id })}\n`)
    return this.waitFor((e) => e.type === 'reply' && e.id === id, 10_000)
  }

  async call<T>(method: string, ...args: unknown[]): Promise<T> {
    const reply = await this.request({ cmd: 'call', method, args })
    if (reply.error !== undefined) throw new Error(`the child's ${method} rejected with ${reply.error}`)
    return reply.value as T
  }

  async clock(): Promise<{ wall: number; mono: bigint }> {
    const { value } = await this.request({ cmd: 'clock' })
    const { wall, mono } = value as { wall: number; mono: string }
    return { wall, mono: BigInt(mono) }
  }

  signal(sig: NodeJS.Signals) {
    this.proc.kill(sig)
  }

  /** Close stdin (the child closes its provider and exits); SIGKILL if it lingers. */
  async stop(): Promise<void> {
    const proc = this.proc
    if (proc.exitCode !== null || proc.signalCode !== null) return
    const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()))
    proc.kill('SIGCONT')
    proc.stdin!.end()
    const timer = setTimeout(() => proc.kill('SIGKILL'), 3_000)
    await exited
    clearTimeout(timer)
    children.delete(proc)
  }
}

// ---------------------------------------------------------------------------
// Row 12: the client process frozen longer than the TTL
// ---------------------------------------------------------------------------

interface FrozenRun {
  violations: string[]
  report: HistoryReport
  renewsBeforeFreeze: number
  frozenMs: number
  /** The first renew the resumed client started. */
  firstRenewAfter?: LeaseOperation
  ownerSeenByClient?: string
}

async function frozenClient(server: RedisServer, lieOnRenew: boolean): Promise<FrozenRun> {
  const TTL = 600
  const EVERY = 200
  const FREEZE = 1_600
  const PEER_TTL = 5_000
  const prefix = `frozen:${RUN}`
  const key = `frozen-${randomUUID().slice(0, 8)}\u0000thread`
  const violations: string[] = []
  const child = await LeaseChild.start({ store: 'redis', url: server.url, keyPrefix: prefix, lieOnRenew })
  const peerOps: LeaseOperation[] = []
  const peer = recordLeases(closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })), (op) => peerOps.push(op))
  try {
    const first = await child.call<Grant>('acquireLease', key, 'client', TTL)
    if (!first.acquired) violations.push(`the client could not take a free key: ${JSON.stringify(first)}`)
    await child.request({ cmd: 'autoRenew', key, owner: 'client', ttlMs: TTL, everyMs: EVERY })
    const okRenews = () => child.ops.filter((o) => o.op === 'renew' && o.outcome === 'ok').length
    await child.waitFor(() => okRenews() >= 2, 5_000)
    const renewsBeforeFreeze = okRenews()

    const frozenAt = monotonicNow()
    child.signal('SIGSTOP')
    // The peer asks until the frozen client's lease runs out.
    let grant: Grant = { acquired: false }
    while (!grant.acquired && monotonicNow() < frozenAt + msToNs(FREEZE - 200)) {
      grant = await peer.acquireLease(key, 'peer', PEER_TTL)
      if (!grant.acquired) await sleep(20)
    }
    if (!grant.acquired) violations.push(`the peer never acquired while the client was frozen (holder ${grant.owner})`)
    await untilMono(frozenAt + msToNs(FREEZE))
    const thawedAt = monotonicNow()
    child.signal('SIGCONT')

    const renewAfter = (e: ChildEvent) => e.type === 'op' && e.op === 'renew' && BigInt(String(e.start)) >= thawedAt
    await child.waitFor(renewAfter, 5_000)
    if (!lieOnRenew) await child.waitFor((e) => e.type === 'lost', 5_000).catch(() => violations.push('the client never reported the loss'))
    await sleep(3 * EVERY) // room for renews it should not make any more
    const firstRenewAfter = child.ops.find((o) => o.op === 'renew' && o.start >= thawedAt)
    if (firstRenewAfter?.outcome !== 'refused') violations.push(`the resumed client's next renew was ${firstRenewAfter?.outcome}, not false`)
    const lost = child.events.find((e) => e.type === 'lost')
    if (lost) {
      const lostAt = BigInt(String(lost.mono))
      const later = child.ops.filter((o) => o.start > lostAt)
      if (later.length) violations.push(`after reporting the loss the client still called ${later.map((o) => o.op).join(', ')}`)
    }
    if (child.ops.filter((o) => o.op === 'acquire').length !== 1) violations.push('the client re-took the lease')

    const ownerSeenByClient = await child.call<string | undefined>('getLeaseOwner', key)
    if (ownerSeenByClient !== 'peer') violations.push(`the client sees ${ownerSeenByClient} as the owner, not the peer`)
    const peerGrant = peerOps.find((o) => o.op === 'acquire' && o.outcome === 'ok')
    const inRedis = await timed(() => leaseInRedis(server, `${prefix}:lease:${key}`))
    if (inRedis.value.owner !== 'peer') violations.push(`Redis holds ${inRedis.value.owner}, not the peer`)
    if (peerGrant) {
      const lowest = PEER_TTL - msBetween(peerGrant.start, inRedis.t1) - 2
      if (inRedis.value.pttl < lowest) violations.push(`the peer's TTL was cut to ${inRedis.value.pttl} ms (at least ${lowest.toFixed(0)} expected)`)
    }

    const report = checkLeaseHistory([...child.ops, ...peerOps])
    return { violations, report, renewsBeforeFreeze, frozenMs: msBetween(frozenAt, thawedAt), firstRenewAfter, ownerSeenByClient }
  } finally {
    await child.stop()
  }
}

describe('row 12: the client process frozen (SIGSTOP) for longer than its lease', () => {
  let server: RedisServer
  beforeAll(async () => {
    server = await startRedis()
    servers.push(server)
  })

  it('a peer acquires meanwhile; the resumed client’s next renew is false, it reports the loss without re-taking, and sees the peer as the owner', async () => {
    const run = await frozenClient(server, false)
    console.log(
      `row 12: client renewed ${run.renewsBeforeFreeze} times, frozen ${run.frozenMs.toFixed(0)} ms (TTL 600 ms), ` +
        `first renew after SIGCONT ${run.firstRenewAfter?.outcome}, owner seen ${run.ownerSeenByClient}; ` +
        `${run.report.operations} operations checked, ${run.report.overlaps.length} overlaps`,
    )
    expect(run.renewsBeforeFreeze).toBeGreaterThanOrEqual(2)
    expect(run.frozenMs).toBeGreaterThan(600)
    expect(run.violations).toEqual([])
    expect(run.report.errors).toBe(0)
    expect(run.report.overlaps, describeOverlaps(run.report)).toEqual([])
  })

  it('a client whose provider claims every renew succeeded is caught, by the same checks and by the history checker (negative control)', async () => {
    const run = await frozenClient(server, true)
    console.log(`row 12 negative control: ${run.violations.length} violations (${run.violations[0]}), ${run.report.overlaps.length} overlaps`)
    expect(run.violations.some((v) => v.includes('next renew was ok'))).toBe(true)
    expect(run.report.overlaps.length).toBeGreaterThanOrEqual(1)
    expect(new Set(run.report.overlaps.flatMap((o) => [o.first.owner, o.second.owner]))).toEqual(new Set(['client', 'peer']))
  })
})

// ---------------------------------------------------------------------------
// Row 13: wall-clock jumps on the client
// ---------------------------------------------------------------------------

const FAKETIME_LIB = [
  '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1',
  '/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1',
  '/usr/lib/faketime/libfaketime.so.1',
  '/usr/local/lib/faketime/libfaketime.so.1',
].find((p) => existsSync(p))
if (!FAKETIME_LIB) console.warn('row 13 (clock jumps) is skipped: libfaketime.so.1 is not installed (apt-get install faketime)')

interface ClockRun {
  violations: string[]
  /** How far Date.now() in the child moved at each jump, beyond the monotonic time that passed (ms). */
  jumps: number[]
  checks: number
}

/**
 * In a child whose wall clock the test moves (libfaketime reads FAKETIME_TIMESTAMP_FILE on
 * every call; CLOCK_MONOTONIC is left alone): k1 is taken at real time, then the clock jumps
 * +1 h; k2 is taken, then the clock jumps back -1 h. Both 2 s leases must stay held across the
 * jumps and up to shortly before their TTL ends by the monotonic clock, and be free right after.
 */
async function clockJumps(child: LeaseChild, clockFile: string, inspect?: (key: string) => Promise<{ owner: string | null; pttl: number }>): Promise<ClockRun> {
  const TTL = 2_000
  const run: ClockRun = { violations: [], jumps: [], checks: 0 }
  const [k1, k2] = ['before-jumps', 'during-jumps'].map((label) => `clock:${RUN}:${randomUUID().slice(0, 8)}:${label}\u0000thread`) as [string, string]

  const jump = async (offset: string) => {
    const before = await child.clock()
    writeFileSync(clockFile, offset)
    const after = await child.clock()
    run.jumps.push(after.wall - before.wall - msBetween(before.mono, after.mono))
  }
  const acquire = async (key: string) => {
    const g = await timed(() => child.call<Grant>('acquireLease', key, 'holder', TTL))
    if (!g.value.acquired) run.violations.push(`${key}: the holder could not take a free key`)
    return g
  }
  const held = async (key: string, granted: Timed<Grant>, when: string) => {
    const owner = await timed(() => child.call<string | undefined>('getLeaseOwner', key))
    const rival = await timed(() => child.call<Grant>('acquireLease', key, 'rival', TTL))
    run.checks++
    if (rival.t1 >= granted.t0 + msToNs(TTL)) {
      run.violations.push(`${key}: the check ${when} came too late to judge (the machine stalled)`)
      return
    }
    if (owner.value !== 'holder') run.violations.push(`${key}: not held ${when} (owner ${owner.value})`)
    if (rival.value.acquired) run.violations.push(`${key}: a rival acquired it ${when}`)
    if (inspect) {
      const seen = await timed(() => inspect(key))
      const most = TTL - msBetween(granted.t1, seen.t0) + 1
      if (seen.value.owner === 'holder' && (seen.value.pttl <= 0 || seen.value.pttl > most)) {
        run.violations.push(`${key}: PTTL ${seen.value.pttl} ${when}, expected in (0, ${most.toFixed(0)}]`)
      }
    }
  }
  const expired = async (key: string, when: string) => {
    const owner = await child.call<string | undefined>('getLeaseOwner', key)
    const rival = await child.call<Grant>('acquireLease', key, 'rival', TTL)
    run.checks++
    if (owner !== undefined) run.violations.push(`${key}: still held by ${owner} ${when}`)
    if (!rival.acquired) run.violations.push(`${key}: a rival was refused ${when}`)
  }

  writeFileSync(clockFile, '+0')
  const g1 = await acquire(k1)
  await jump('+3600') // one hour ahead
  await held(k1, g1, 'after a +1 h jump')
  const g2 = await acquire(k2)
  await jump('+0') // one hour back
  await held(k1, g1, 'after a -1 h jump')
  await held(k2, g2, 'after a -1 h jump')
  await untilMono(g1.t0 + msToNs(TTL - 400))
  await held(k1, g1, '400 ms before its TTL ends')
  await untilMono(g2.t0 + msToNs(TTL - 400))
  await held(k2, g2, '400 ms before its TTL ends')
  await untilMono(g1.t1 + msToNs(TTL + 300))
  await expired(k1, '300 ms after its TTL ended')
  await untilMono(g2.t1 + msToNs(TTL + 300))
  await expired(k2, '300 ms after its TTL ended')
  return run
}

describe.skipIf(!FAKETIME_LIB)('row 13: wall-clock jumps on the client (libfaketime, CLOCK_MONOTONIC untouched)', () => {
  let server: RedisServer
  let dir: string
  beforeAll(async () => {
    server = await startRedis()
    servers.push(server)
    dir = mkdtempSync(path.join(os.tmpdir(), 'mlr-clock-'))
    tempDirs.push(dir)
  })

  async function underFaketime(config: Record<string, unknown>) {
    const clockFile = path.join(dir, `clock-${randomUUID().slice(0, 8)}`)
    writeFileSync(clockFile, '+0')
    const env = {
      ...process.env,
      LD_PRELOAD: [FAKETIME_LIB, process.env.LD_PRELOAD].filter(Boolean).join(' '),
      FAKETIME_TIMESTAMP_FILE: clockFile,
      FAKETIME_NO_CACHE: '1',
      FAKETIME_DONT_FAKE_MONOTONIC: '1',
      DONT_FAKE_MONOTONIC: '1', // the name before libfaketime 0.9.8
    }
    const child = await LeaseChild.start(config, env)
    // The child's monotonic clock is the test's own: it reads between our two readings.
    const before = monotonicNow()
    const { mono } = await child.clock()
    const after = monotonicNow()
    expect(mono >= before && mono <= after, 'CLOCK_MONOTONIC in the child is not faked').toBe(true)
    return { child, clockFile }
  }

  function expectJumped(run: ClockRun) {
    // The fault really happened: Date.now() in the child jumped an hour each way.
    expect(run.jumps).toHaveLength(2)
    expect(Math.abs(run.jumps[0]! - 3_600_000), `Date.now() jumped ${run.jumps[0]} ms`).toBeLessThan(1_000)
    expect(Math.abs(run.jumps[1]! + 3_600_000), `Date.now() jumped ${run.jumps[1]} ms`).toBeLessThan(1_000)
  }

  async function heldThroughJumps(label: string, config: Record<string, unknown>, prefix?: string) {
    const { child, clockFile } = await underFaketime(config)
    try {
      const run = await clockJumps(child, clockFile, prefix ? (key) => leaseInRedis(server, `${prefix}:lease:${key}`) : undefined)
      console.log(`row 13 ${label}: jumps ${run.jumps.map((j) => j.toFixed(0)).join(' / ')} ms, ${run.checks} checks, ${run.violations.length} violations`)
      expectJumped(run)
      expect(run.checks).toBe(7)
      expect(run.violations).toEqual([])
    } finally {
      await child.stop()
    }
  }

  it('MemoryLeaseProvider: a 2 s lease stays held across a +1 h and a -1 h jump, and expires on time by the monotonic clock', async () => {
    await heldThroughJumps('memory', { store: 'memory' })
  })

  it('RedisLeaseProvider: the same, with the PTTL in Redis counting down through both jumps', async () => {
    const prefix = `clock:${RUN}`
    await heldThroughJumps('redis', { store: 'redis', url: server.url, keyPrefix: prefix }, prefix)
  })

  it('a store that keeps deadlines on Date.now() fails the same checks under the same jumps (negative control)', async () => {
    const { child, clockFile } = await underFaketime({ store: 'wallclock' })
    try {
      const run = await clockJumps(child, clockFile)
      console.log(`row 13 negative control: ${run.violations.length} violations: ${run.violations.join(' | ')}`)
      expectJumped(run)
      expect(run.violations.some((v) => v.includes('not held after a +1 h jump'))).toBe(true)
      expect(run.violations.some((v) => v.includes('still held by holder 300 ms after its TTL ended'))).toBe(true)
    } finally {
      await child.stop()
    }
  })
})
