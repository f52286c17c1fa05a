// The history checker of the durable-execution fence suite: what executions that claim runs as
// Mastra's durable agents do (fixtures/execution-fence.mjs) recorded, checked for the two
// properties the fence exists for.
//
// - No step commits under two owners at once. A step counts from the reply of the verify before
//   it to the sending of the verify after it, and commits when both verifies held. Two
//   committed steps of one run by different executions must not overlap: Mastra keeps the
//   output of a committed step only.
// - A takeover leaves the old owner nothing: once a transfer away from an execution has been
//   answered, no verify that execution sends afterwards holds.
//
// Times are monotonic nanoseconds (process.hrtime.bigint(), one clock for every process of
// this machine), as bigints or as their decimal text from a child's JSON line.

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
