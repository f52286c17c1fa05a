// A lease-interval history checker, in the spirit of Jepsen's lock checks.
//
// Every process on this machine reads the same monotonic clock (process.hrtime.bigint() is
// CLOCK_MONOTONIC on Linux), so operations recorded in different processes can be put on one
// time line. For each successful acquire, renew or transfer-to, the owner *believes* it holds
// the lease over [call returned, call started + ttl]: the lease cannot have started before the
// reply, and the server's TTL cannot have started before the call. The belief ends early at
//   - its own release or transfer-away (at the call's start: the owner stops acting first),
//   - a `false` renew or an `acquired: false` (at the call's return: that is when it learns).
// A call that rejects changes no belief. Per key, believed windows of different owners must
// never overlap; `checkLeaseHistory` returns every overlap it finds, with details.
//
// The lost-update counter is the same property seen from the data: while a worker believes it
// holds the lease it reads a shared value, sleeps a few ms, and writes value + 1. If two
// holders ever overlap, increments get lost and the final value falls short of the count.
import type { LeaseLike, LeaseOperation } from '../fixtures/lease-recorder.mjs'

export type { FencedLeaseLike, FileCounter, LeaseLike, LeaseOperation, LeaseOpKind, RecordedLeases } from '../fixtures/lease-recorder.mjs'
export { alwaysAcquired, fileCounter, monotonicNow, recordLeases } from '../fixtures/lease-recorder.mjs'

/** One critical section (a counter increment) run while the owner believed it held `key`. */
export interface LeaseUse {
  key: string
  owner: string
  start: bigint
  end: bigint
}

/** An interval over which `owner` believed it held `key` (monotonic ns). */
export interface BelievedWindow {
  key: string
  owner: string
  from: bigint
  to: bigint
  /** The operation that opened the window, and what (if anything) cut it short. */
  openedBy: LeaseOperation
  endedBy?: LeaseOperation
}

export interface Overlap {
  key: string
  first: BelievedWindow
  second: BelievedWindow
  /** How long both owners believed they held the key at once. */
  overlapMs: number
  /** One human-readable line, for assertion messages. */
  description: string
}

export interface HistoryReport {
  /** Lease operations checked (every call, whatever its outcome). */
  operations: number
  /** Operations that opened a believed window (acquire/renew ok, transfer ok). */
  grants: number
  /** Of those, first-time acquisitions (acquire ok). */
  acquisitions: number
  /** Calls that rejected (they open or close nothing). */
  errors: number
  windows: BelievedWindow[]
  overlaps: Overlap[]
  /**
   * Lost leases: an acquire or renew refused to an owner whose lease still had TTL left by
   * its believed window (it vanished early: a failover forgot it, or an eviction took it).
   */
  lost: LeaseOperation[]
  /** Critical sections not inside a believed window of their own owner (a worker bug). */
  unprotectedUses: LeaseUse[]
}

const NS_PER_MS = 1_000_000n
const ms = (ns: bigint) => Number(ns) / 1e6

function describeWindow(w: BelievedWindow, origin: bigint): string {
  const end = w.endedBy ? `, ended by ${w.endedBy.op} ${w.endedBy.outcome}` : ''
  return `${JSON.stringify(w.owner)} [${ms(w.from - origin).toFixed(3)}, ${ms(w.to - origin).toFixed(3)}] ms (opened by ${w.openedBy.op} ttl ${w.openedBy.ttlMs}${end})`
}

export function checkLeaseHistory(operations: readonly LeaseOperation[], uses: readonly LeaseUse[] = []): HistoryReport {
  // Ordered by start. An owner may have several calls on a key in flight at once (a transfer
  // to B racing B's own release): their order in Redis is unknown, so a grant that overlaps in
  // time a call by which its owner gave the key up (a release, a transfer away, a refusal)
  // opens no window. The owner cannot know it holds the key, so it must not act on it.
  const ops = [...operations].sort((a, b) => (a.start < b.start ? -1 : a.start > b.start ? 1 : 0))
  const windows: BelievedWindow[] = []
  const byHolder = new Map<string, BelievedWindow[]>()
  const endersOf = new Map<string, LeaseOperation[]>()
  const holder = (key: string, owner: string) => `${key}\u0000${owner}`
  const open = (key: string, owner: string, op: LeaseOperation) => {
    // A renew (or re-acquire) *replaces* the TTL, it does not extend the longest one: the
    // earlier grants count until this call took effect, which is by its return at the latest.
    end(key, owner, op.end, op)
    const w: BelievedWindow = { key, owner, from: op.end, to: op.start + BigInt(op.ttlMs) * NS_PER_MS, openedBy: op }
    // A call giving the key up that started earlier and was still in flight when this one
    // started: which ran first is unknown.
    const racing = (endersOf.get(holder(key, owner)) ?? []).find((e) => e.end > op.start)
    if (racing) {
      w.to = w.from
      w.endedBy = racing
    }
    windows.push(w)
    const list = byHolder.get(holder(key, owner)) ?? []
    list.push(w)
    byHolder.set(holder(key, owner), list)
  }
  function end(key: string, owner: string, at: bigint, op: LeaseOperation) {
    for (const w of byHolder.get(holder(key, owner)) ?? []) {
      if (w.to > at) {
        w.to = at > w.from ? at : w.from
        w.endedBy = op
      }
    }
  }
  /** `op` gave the key up for `owner` from `at` on. */
  function giveUp(key: string, owner: string, at: bigint, op: LeaseOperation) {
    end(key, owner, at, op)
    const list = endersOf.get(holder(key, owner)) ?? []
    list.push(op)
    endersOf.set(holder(key, owner), list)
  }

  let grants = 0
  let acquisitions = 0
  let errors = 0
  const lost: LeaseOperation[] = []
  for (const op of ops) {
    if (op.outcome === 'error') errors++
    switch (op.op) {
      case 'acquire':
      case 'renew':
        if (op.outcome === 'ok') {
          grants++
          if (op.op === 'acquire') acquisitions++
          open(op.key, op.owner, op)
        } else if (op.outcome === 'refused') {
          // Lost: refused while a window of its own was open (one a racing give-up cut to
          // nothing never was).
          if ((byHolder.get(holder(op.key, op.owner)) ?? []).some((w) => w.to > w.from && w.to > op.start)) lost.push(op)
          giveUp(op.key, op.owner, op.end, op)
        } else {
          // Rejected, it may still have run (written on the master, unconfirmed by replicas):
          // its TTL, counted from its start, may have replaced a longer one.
          end(op.key, op.owner, op.start + BigInt(op.ttlMs) * NS_PER_MS, op)
        }
        break
      case 'transfer':
        giveUp(op.key, op.owner, op.start, op)
        if (op.outcome === 'ok') {
          if (op.to === undefined) throw new Error('a transfer operation without `to`')
          grants++
          open(op.key, op.to, op)
        }
        break
      case 'release':
        giveUp(op.key, op.owner, op.start, op)
        break
    }
  }

  const live = windows.filter((w) => w.to > w.from)
  const origin = ops[0]?.start ?? 0n
  const overlaps: Overlap[] = []
  const byKey = new Map<string, BelievedWindow[]>()
  for (const w of live) {
    const list = byKey.get(w.key) ?? []
    list.push(w)
    byKey.set(w.key, list)
  }
  for (const [key, list] of byKey) {
    list.sort((a, b) => (a.from < b.from ? -1 : a.from > b.from ? 1 : 0))
    let active: BelievedWindow[] = []
    for (const w of list) {
      active = active.filter((a) => a.to > w.from)
      for (const a of active) {
        if (a.owner === w.owner) continue
        const overlapEnd = a.to < w.to ? a.to : w.to
        const overlapMs = ms(overlapEnd - w.from)
        overlaps.push({
          key,
          first: a,
          second: w,
          overlapMs,
          description: `key ${JSON.stringify(key)}: ${describeWindow(a, origin)} overlaps ${describeWindow(w, origin)} by ${overlapMs.toFixed(3)} ms`,
        })
      }
      active.push(w)
    }
  }

  const unprotectedUses = uses.filter(
    (u) => !(byHolder.get(holder(u.key, u.owner)) ?? []).some((w) => w.from <= u.start && u.end <= w.to),
  )

  return { operations: ops.length, grants, acquisitions, errors, windows, overlaps, lost, unprotectedUses }
}

export interface CounterCheck {
  /** Increments the workers performed (and believed protected). */
  increments: number
  /** The shared value at the end. */
  value: number
  /** increments - value: > 0 means some read-sleep-write cycles overwrote each other. */
  lost: number
}

export function checkCounter(value: number, increments: number): CounterCheck {
  return { increments, value, lost: increments - value }
}

// ---------------------------------------------------------------------------
// Worker output: JSON lines with bigint times written as decimal strings
// ---------------------------------------------------------------------------

/** JSON.stringify that writes bigints as decimal strings (undone by `parseHistoryLines`). */
export const toJsonLine = (value: unknown): string =>
  JSON.stringify(value, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v))

export interface WorkerSummary {
  worker: string
  operations: number
  /** Increments per key. */
  increments: Record<string, number>
}

export interface ParsedHistory {
  operations: LeaseOperation[]
  uses: LeaseUse[]
  summaries: WorkerSummary[]
}

/** Parse worker lines: {type:'op', ...LeaseOperation}, {type:'use', ...LeaseUse}, {type:'done', ...WorkerSummary}. */
export function parseHistoryLines(text: string): ParsedHistory {
  const out: ParsedHistory = { operations: [], uses: [], summaries: [] }
  for (const line of text.split('\n')) {
    if (!line.trim()) continue
    const record = JSON.parse(line) as { type: string; start?: string; end?: string } & Record<string, unknown>
    if (record.type === 'op' || record.type === 'use') {
      const { type, ...rest } = record
      const times = { start: BigInt(record.start ?? ''), end: BigInt(record.end ?? '') }
      if (type === 'op') out.operations.push({ ...(rest as unknown as LeaseOperation), ...times })
      else out.uses.push({ ...(rest as unknown as LeaseUse), ...times })
    } else if (record.type === 'done') {
      const { type: _type, ...rest } = record
      out.summaries.push(rest as unknown as WorkerSummary)
    } else {
      throw new Error(`unexpected worker line: ${line}`)
    }
  }
  return out
}

/** The first `n` overlaps a report found, one description per line: a failure message. */
export const describeOverlaps = (report: HistoryReport, n = 5): string =>
  report.overlaps
    .slice(0, n)
    .map((o) => o.description)
    .join('\n')

/** A provider's lease methods as plain functions, for a test to replace one of them. */
export function bindLeases(p: LeaseLike): LeaseLike {
  return {
    acquireLease: (k, o, t) => p.acquireLease(k, o, t),
    getLeaseOwner: (k) => p.getLeaseOwner(k),
    releaseLease: (k, o) => p.releaseLease(k, o),
    renewLease: (k, o, t) => p.renewLease(k, o, t),
    transferLease: (k, f, t, ttl) => p.transferLease(k, f, t, ttl),
    close: () => p.close(),
  }
}
