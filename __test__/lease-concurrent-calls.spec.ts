// Release, renew, transfer and acquire fired together on one key: every round is judged
// against every serial order of its calls and the owner left behind; a transfer done in
// three steps is the negative control.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { beforeAll, describe, expect, it, type TestContext } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub } from '../dist/esm/index.js'
import { bindLeases, checkLeaseHistory, describeOverlaps, monotonicNow, recordLeases, type LeaseLike, type LeaseOperation } from './helpers/lease-history.js'
import { closing, leaseSuite, RUN, stopLater, type Grant } from './helpers/lease-runs.js'
import { sleep } from './helpers/lease.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { startCluster } from './helpers/redis-cluster.js'

leaseSuite()

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
    const a = seen as (Grant & { token?: unknown }) | undefined
    const b = model as Grant
    // A fenced answer carries a token exactly when it granted (the shapes: lease-contract.ts).
    const token = a !== undefined && 'token' in a ? (a.acquired ? typeof a.token === 'number' : a.token === undefined) : true
    return a?.acquired === b.acquired && a.owner === b.owner && token
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
  /** Recorded operations of the different-owner rounds, for the history checker. */
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
    if (!sameOwner) run.ops.push(...roundOps)
  }
  return run
}

/** `p` with every acquire fenced (acquireFencedLease: the acquire script each time, a token with each grant). */
function fencedAcquires(p: LeaseLike & { acquireFencedLease?: LeaseLike['acquireLease'] }): LeaseLike {
  expect(typeof p.acquireFencedLease).toBe('function')
  return { ...bindLeases(p), acquireLease: (key, owner, ttl) => p.acquireFencedLease!(key, owner, ttl) }
}

/** The textbook non-atomic transfer: check, release, acquire, in three steps. */
function nonAtomicTransfer(p: LeaseLike): LeaseLike {
  return {
    ...bindLeases(p),
    transferLease: async (key, from, to, ttl) => {
      if ((await p.getLeaseOwner(key)) !== from) return false
      await p.releaseLease(key, from)
      await p.acquireLease(key, to, ttl)
      return true
    },
  }
}

describe('release, renew, transfer and acquire fired together', () => {
  let server: RedisServer
  beforeAll(async () => {
    server = await startRedis()
    stopLater(server)
  })
  const ROUNDS = 160

  async function check(annotate: TestContext['annotate'], run: ConcurrencyRun) {
    const report = checkLeaseHistory(run.ops)
    await annotate(
      `${run.rounds} rounds, ${run.calls} concurrent calls checked against every serial order, ` +
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

  it('MemoryLeaseProvider: no call rejects, and every round matches a serial order and the owner left behind', async ({ annotate }) => {
    const store = closing(new MemoryLeaseProvider())
    await check(annotate, await concurrentRounds({ providers: [store], rounds: ROUNDS, label: 'concurrent-mem', readOwner: (k) => store.getLeaseOwner(k) }))
  })

  it('RedisLeaseProvider (two connections; plain SET NX acquires, refreshes sent again as the script): no call rejects, and every round matches a serial order and the owner in Redis', async ({ annotate }) => {
    const prefix = `concurrent:${RUN}`
    const providers = [0, 1].map(() => closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })))
    await check(annotate, await concurrentRounds({ providers, rounds: ROUNDS, label: 'concurrent-redis', readOwner: redisOwner(prefix) }))
  })

  it('RedisLeaseProvider with fenced acquires (acquireFencedLease: the acquire script every time): the same', async ({ annotate }) => {
    const prefix = `concurrent-fenced:${RUN}`
    const providers = [0, 1].map(() => fencedAcquires(closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))))
    await check(annotate, await concurrentRounds({ providers, rounds: ROUNDS, label: 'concurrent-fenced', readOwner: redisOwner(prefix) }))
  })

  it('RedisStreamsPubSub’s lease methods (two instances): the same', async ({ annotate }) => {
    const prefix = `concurrent-streams:${RUN}`
    const providers = [0, 1].map(() => closing(new RedisStreamsPubSub({ url: server.url, keyPrefix: prefix })))
    await check(annotate, await concurrentRounds({ providers, rounds: ROUNDS, label: 'concurrent-streams', readOwner: redisOwner(prefix) }))
  })

  it('the serial-order check flags a transfer done as check, release, acquire in three steps (negative control)', async ({ annotate }) => {
    const store = closing(new MemoryLeaseProvider())
    const run = await concurrentRounds({ providers: [nonAtomicTransfer(store)], rounds: 40, label: 'concurrent-neg', readOwner: (k) => store.getLeaseOwner(k) })
    await annotate(`${run.rounds} rounds, ${run.violations.length} flagged; first: ${run.violations[0]}`)
    expect(run.violations.some((v) => v.includes('no serial order') || v.includes('all won'))).toBe(true)
  })
})

/** Pairs of calls one owner makes in one turn, as Mastra's owner does (a refresh, then a release). */
const PAIRS: Array<{ name: string; steps: Step[] }> = [
  { name: 'refresh then release', steps: [{ kind: 'acquire', owner: 'A' }, { kind: 'release', owner: 'A' }] },
  { name: 'refresh then transfer', steps: [{ kind: 'acquire', owner: 'A' }, { kind: 'transfer', owner: 'A', to: 'B' }] },
  { name: 'renew then release', steps: [{ kind: 'renew', owner: 'A' }, { kind: 'release', owner: 'A' }] },
  { name: 'release then acquire', steps: [{ kind: 'release', owner: 'A' }, { kind: 'acquire', owner: 'B' }] },
  { name: 'release then refresh', steps: [{ kind: 'release', owner: 'A' }, { kind: 'acquire', owner: 'A' }] },
  { name: 'transfer then release by the new owner', steps: [{ kind: 'transfer', owner: 'A', to: 'B' }, { kind: 'release', owner: 'B' }] },
  { name: 'read, refresh, read, release, read', steps: [{ kind: 'owner', owner: 'A' }, { kind: 'acquire', owner: 'A' }, { kind: 'owner', owner: 'A' }, { kind: 'release', owner: 'A' }, { kind: 'owner', owner: 'A' }] },
]

/**
 * Each pair, `rounds` times, on a fresh key held by A: its calls made in one turn, each
 * answer and the owner left behind compared with the calls run one after another in the
 * order they were made. `before` runs between the set-up and the turn (a script flush).
 */
async function inCallOrder(p: LeaseLike, label: string, readOwner: (key: string) => Promise<string | undefined>, rounds: number, before?: () => Promise<unknown>) {
  const violations: string[] = []
  let turns = 0
  for (let r = 0; r < rounds; r++) {
    for (const [i, pair] of PAIRS.entries()) {
      const key = `${label}:${RUN}:order:${r}:${i}\u0000thread`
      await p.acquireLease(key, 'A', ROUND_TTL_MS)
      await before?.()
      const seen = await Promise.all(pair.steps.map((s) => invoke(p, key, s).catch((err: unknown) => ({ error: String((err as { code?: unknown })?.code ?? err) }))))
      let state: string | undefined = 'A'
      const wanted = pair.steps.map((s) => {
        const next = apply(state, s)
        state = next.state
        return next.result
      })
      const final = await readOwner(key)
      turns++
      const bad = pair.steps.some((s, j) => !sameResult(s.kind, seen[j], wanted[j]))
      if (bad || final !== state) violations.push(`${pair.name}: answered ${JSON.stringify(seen)}, owner ${final} left; in call order: ${JSON.stringify(wanted)}, owner ${state}`)
    }
  }
  return { turns, violations }
}

describe('calls of one turn take effect in the order they were made', () => {
  let server: RedisServer
  beforeAll(async () => {
    server = await startRedis()
    stopLater(server)
  })
  const ROUNDS = 8
  const redisOwner = (prefix: string) => async (key: string) => ((await server.cli('GET', `${prefix}:lease:${key}`)) as string | null) ?? undefined

  const check = async (annotate: TestContext['annotate'], run: { turns: number; violations: string[] }) => {
    await annotate(`${run.turns} turns of ${PAIRS.length} kinds, ${run.violations.length} out of call order`)
    expect(run.turns).toBe(ROUNDS * PAIRS.length)
    expect(run.violations.slice(0, 5)).toEqual([])
  }

  it('MemoryLeaseProvider', async ({ annotate }) => {
    const store = closing(new MemoryLeaseProvider())
    await check(annotate, await inCallOrder(store, 'order-mem', (k) => store.getLeaseOwner(k), ROUNDS))
  })

  /** The provider as the turns call it: its acquires plain (acquireLease) or fenced (acquireFencedLease). */
  const asCalled = (p: RedisLeaseProvider, fenced: boolean): LeaseLike => (fenced ? fencedAcquires(p) : p)

  for (const fenced of [true, false]) {
    const acquires = fenced ? 'with fenced acquires' : 'with plain acquires'
    it(`RedisLeaseProvider ${acquires}`, async ({ annotate }) => {
      const prefix = `order-${fenced}:${RUN}`
      const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
      await check(annotate, await inCallOrder(asCalled(p, fenced), prefix, redisOwner(prefix), ROUNDS))
    })

    it(`RedisLeaseProvider ${acquires}, the script cache flushed before every turn`, async ({ annotate }) => {
      const prefix = `order-cold-${fenced}:${RUN}`
      const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
      await check(annotate, await inCallOrder(asCalled(p, fenced), prefix, redisOwner(prefix), ROUNDS, () => server.flushScripts()))
    })

    it(`RedisLeaseProvider ${acquires}, the cache flushed and only the release script loaded again`, async ({ annotate }) => {
      const prefix = `order-half-${fenced}:${RUN}`
      const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
      const scratch = `${prefix}:scratch`
      // A release loads release.lua alone: the next turn finds some scripts known and others not.
      const halfCold = async () => {
        await server.flushScripts()
        await p.releaseLease(scratch, 'nobody')
      }
      await check(annotate, await inCallOrder(asCalled(p, fenced), prefix, redisOwner(prefix), ROUNDS, halfCold))
    })
  }

  it('RedisStreamsPubSub’s lease methods', async ({ annotate }) => {
    const prefix = `order-streams:${RUN}`
    const p = closing(new RedisStreamsPubSub({ url: server.url, keyPrefix: prefix }))
    await check(annotate, await inCallOrder(p, prefix, redisOwner(prefix), ROUNDS))
  })

  it.skipIf(EXTERNAL_REDIS)('RedisLeaseProvider with minReplicas 1 (grants confirmed on a link of their own, the rest on the shared one), with fenced and plain acquires', async ({ annotate }) => {
    const master = await startRedis()
    const replica = await startRedis({ args: ['--replicaof', '127.0.0.1', String(master.port)] })
    try {
      while ((await replica.info('replication'))['master_link_status'] !== 'up') await sleep(20)
      const owner = (prefix: string) => async (key: string) => ((await master.cli('GET', `${prefix}:lease:${key}`)) as string | null) ?? undefined
      for (const fenced of [true, false]) {
        const prefix = `order-replicas-${fenced}:${RUN}`
        const p = closing(new RedisLeaseProvider({ url: master.url, keyPrefix: prefix, minReplicas: 1 }))
        await check(annotate, await inCallOrder(asCalled(p, fenced), prefix, owner(prefix), ROUNDS))
      }
    } finally {
      await replica.stop()
      await master.stop()
    }
  })

  it.skipIf(EXTERNAL_REDIS)('a Cluster (one pipeline per slot), with fenced and plain acquires, warm and with the scripts flushed on every master', async ({ annotate }) => {
    const cluster = await startCluster({ masters: 3, replicasPerMaster: 0 })
    try {
      const owner = (prefix: string) => async (key: string) => {
        const slot = await cluster.keySlot(`${prefix}:lease:${key}`)
        return ((await (await cluster.masterOfSlot(slot)).cli('GET', `${prefix}:lease:${key}`)) as string | null) ?? undefined
      }
      const flush = async () => Promise.all((await cluster.masters()).map((m) => m.flushScripts()))
      for (const fenced of [true, false]) {
        for (const before of [undefined, flush]) {
          const prefix = `order-cluster-${fenced}-${before ? 'cold' : 'warm'}:${RUN}`
          const p = closing(new RedisLeaseProvider({ cluster: { nodes: cluster.urls }, keyPrefix: prefix }))
          await check(annotate, await inCallOrder(asCalled(p, fenced), prefix, owner(prefix), ROUNDS, before))
        }
      }
    } finally {
      await cluster.stop()
    }
  }, 60_000)
})
