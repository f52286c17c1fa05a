// The history checkers of Mastra's fences. First the durable-execution fence's: what executions
// that claim runs as Mastra's durable agents do (fixtures/execution-fence.mjs) recorded, checked
// for the two properties the fence exists for.
//
// - No step commits under two owners at once. A step counts from the reply of the verify before
//   it to the sending of the verify after it, and commits when both verifies held. Two
//   committed steps of one run by different executions must not overlap: Mastra keeps the
//   output of a committed step only.
// - A takeover leaves the old owner nothing: once a transfer away from an execution has been
//   answered, no verify that execution sends afterwards holds.
//
// Then the evented step fence's (`checkStepFenceHistory`, fixtures/lease-callers.mjs): two
// deliveries of one step never both run while both hold the fence.
//
// Times are monotonic nanoseconds (process.hrtime.bigint(), one clock for every process of
// this machine), as bigints or as their decimal text from a child's JSON line.

import { checkLeaseHistory, type LeaseOperation } from './lease-history.js'

type Time = bigint | string

export type FenceRecord =
  | { type: 'claim'; key: string; owner: string; mode: string; at: Time; claimed: boolean; holder?: string }
  | { type: 'takeover'; key: string; owner: string; from: string; sent: Time; received: Time; ok: boolean }
  | { type: 'verify'; key: string; owner: string; why: string; sent: Time; received: Time; outcome: 'ok' | 'superseded' | 'error'; error?: string }
  | { type: 'step'; key: string; owner: string; n: number; start: Time; end: Time; committed: boolean }
  | { type: 'lost'; key: string; owner: string; at: Time; id: string }

export interface FenceReport {
  /** Executions that claimed a run. */
  claims: number
  /** Steps run, and of those committed. */
  steps: number
  committed: number
  /** Transfers that took a run over. */
  takeovers: number
  /** Verifies that did not hold (superseded, or an error). */
  failedVerifies: number
  /** Committed steps of different owners that overlap, one line each. */
  overlaps: string[]
  /** Verifies that held after a takeover away from their execution, one line each. */
  lateVerifies: string[]
}

const ns = (t: Time) => BigInt(t)
const ms = (t: bigint, origin: bigint) => (Number(t - origin) / 1e6).toFixed(3)

export function checkFenceHistory(records: readonly FenceRecord[]): FenceReport {
  const of = <T extends FenceRecord['type']>(type: T) => records.filter((r): r is Extract<FenceRecord, { type: T }> => r.type === type)
  const steps = of('step')
  const verifies = of('verify')
  const takeovers = of('takeover').filter((t) => t.ok)
  const origin = records.reduce((min, r) => {
    const t = ns('at' in r ? r.at : 'sent' in r ? r.sent : r.start)
    return t < min ? t : min
  }, BigInt(Number.MAX_SAFE_INTEGER) * 1_000_000n)
  const committed = steps.filter((s) => s.committed)
  const overlaps: string[] = []
  for (let i = 0; i < committed.length; i++) {
    for (let j = i + 1; j < committed.length; j++) {
      const [a, b] = [committed[i]!, committed[j]!]
      if (a.key !== b.key || a.owner === b.owner) continue
      if (ns(a.start) < ns(b.end) && ns(b.start) < ns(a.end)) {
        overlaps.push(
          `${a.key}: step ${a.n} of ${a.owner} [${ms(ns(a.start), origin)}, ${ms(ns(a.end), origin)}] ms and step ${b.n} of ${b.owner} [${ms(ns(b.start), origin)}, ${ms(ns(b.end), origin)}] ms`,
        )
      }
    }
  }
  const lateVerifies: string[] = []
  for (const takeover of takeovers) {
    for (const verify of verifies) {
      if (verify.key === takeover.key && verify.owner === takeover.from && verify.outcome === 'ok' && ns(verify.sent) > ns(takeover.received)) {
        lateVerifies.push(
          `${takeover.key}: ${takeover.from}'s ${verify.why} sent at ${ms(ns(verify.sent), origin)} ms held, after ${takeover.owner} took the run over at ${ms(ns(takeover.received), origin)} ms`,
        )
      }
    }
  }
  return {
    claims: of('claim').filter((c) => c.claimed).length,
    steps: steps.length,
    committed: committed.length,
    takeovers: takeovers.length,
    failedVerifies: verifies.filter((v) => v.outcome !== 'ok').length,
    overlaps,
    lateVerifies,
  }
}

/** A report as one line of figures. */
export const figures = (r: FenceReport) =>
  `${r.claims} executions, ${r.takeovers} takeovers, ${r.committed} of ${r.steps} steps committed, ${r.failedVerifies} verifies failed; ${r.overlaps.length} overlaps, ${r.lateVerifies.length} late verifies`

/** What the evented step fence (`handleStepRun`, fixtures/lease-callers.mjs) reports of each delivery. */
export type StepRecord =
  | { type: 'run-start'; key: string; owner: string; eventId: string; attempt: number; fenced: boolean; at: Time }
  | { type: 'run-end'; key: string; owner: string; at: Time; ok: boolean }
  | { type: 'drop'; key: string; owner: string; eventId: string; attempt: number; at: Time }
  | { type: 'warn'; key: string; owner: string; message: string; error?: string }

export interface StepFenceReport {
  /** Deliveries handled: run (fenced or not) or dropped as duplicates. */
  deliveries: number
  runs: number
  /** Runs whose acquire threw: the step ran anyway, under no fence. */
  unfenced: number
  dropped: number
  /** Pairs of runs of one step that ran at once, whether or not both held the fence. */
  concurrent: number
  /** Fenced runs that ended after their fence had lapsed (lost while the step ran). */
  pastFence: number
  /** Two runs of one step that ran while both held the fence, one line each: must be none. */
  bothHeld: string[]
  /** Holds of one fence by two owners at once (the lease history's overlaps): must be none. */
  leaseOverlaps: string[]
}

const NEVER = BigInt(Number.MAX_SAFE_INTEGER) * 1_000_000n

/**
 * Checks a step fence's history: `operations` are its lease calls (recorded with
 * `recordLeases`), from which the lease checker (helpers/lease-history.ts) derives when each
 * owner believed it held the fence; `records` the deliveries. A run lasts from `run-start` to
 * its `run-end` (forever for a process killed mid-step, whose hold ends where its last grant's
 * TTL does).
 */
export function checkStepFenceHistory(operations: readonly LeaseOperation[], records: readonly StepRecord[]): StepFenceReport {
  const lease = checkLeaseHistory(operations)
  const id = (key: string, owner: string) => `${key}\u0000${owner}`
  const holds = new Map<string, Array<[bigint, bigint]>>()
  for (const w of lease.windows) {
    if (w.to <= w.from) continue
    const list = holds.get(id(w.key, w.owner)) ?? []
    list.push([w.from, w.to])
    holds.set(id(w.key, w.owner), list)
  }
  const ends = new Map<string, bigint>()
  for (const r of records) if (r.type === 'run-end') ends.set(id(r.key, r.owner), ns(r.at))
  const runs = records
    .filter((r): r is Extract<StepRecord, { type: 'run-start' }> => r.type === 'run-start')
    .map((r) => {
      const start = ns(r.at)
      const end = ends.get(id(r.key, r.owner)) ?? NEVER
      // The parts of the run during which its owner held the fence.
      const held = (holds.get(id(r.key, r.owner)) ?? [])
        .map(([from, to]): [bigint, bigint] => [from > start ? from : start, to < end ? to : end])
        .filter(([from, to]) => to > from)
      return { ...r, start, end, held }
    })
  const origin = runs.reduce((min, r) => (r.start < min ? r.start : min), NEVER)
  const at = (t: bigint) => (t === NEVER ? 'never' : ms(t, origin))

  let concurrent = 0
  const bothHeld: string[] = []
  for (let i = 0; i < runs.length; i++) {
    for (let j = i + 1; j < runs.length; j++) {
      const [a, b] = [runs[i]!, runs[j]!]
      if (a.key !== b.key || a.owner === b.owner) continue
      if (a.start < b.end && b.start < a.end) concurrent++
      for (const [af, at_] of a.held) {
        for (const [bf, bt] of b.held) {
          if (af < bt && bf < at_) {
            bothHeld.push(
              `${a.key}: delivery ${a.attempt} (${a.owner}) held and ran over [${at(af)}, ${at(at_)}] ms, delivery ${b.attempt} (${b.owner}) over [${at(bf)}, ${at(bt)}] ms`,
            )
          }
        }
      }
    }
  }
  const lastHold = (r: (typeof runs)[number]) => (holds.get(id(r.key, r.owner)) ?? []).reduce((max, [, to]) => (to > max ? to : max), 0n)
  return {
    deliveries: runs.length + records.filter((r) => r.type === 'drop').length,
    runs: runs.length,
    unfenced: runs.filter((r) => !r.fenced).length,
    dropped: records.filter((r) => r.type === 'drop').length,
    concurrent,
    pastFence: runs.filter((r) => r.fenced && r.end !== NEVER && r.end > lastHold(r)).length,
    bothHeld,
    leaseOverlaps: lease.overlaps.map((o) => o.description),
  }
}

/** A step fence report as one line of figures. */
export const stepFigures = (r: StepFenceReport) =>
  `${r.deliveries} deliveries: ${r.runs} ran (${r.unfenced} unfenced), ${r.dropped} dropped as duplicates; ${r.concurrent} pairs ran at once, ${r.pastFence} ran past their fence; ${r.bothHeld.length} ran while both held it`
