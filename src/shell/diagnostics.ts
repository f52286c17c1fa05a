// Lease calls as `node:diagnostics_channel` traces, for APMs, tests and ad-hoc debugging.
// While nobody subscribes, a call costs one `hasSubscribers` check more.
import { tracingChannel } from 'node:diagnostics_channel'

/** A lease method, as a trace names it. */
export type LeaseOperation = 'acquireLease' | 'getLeaseOwner' | 'getLease' | 'releaseLease' | 'renewLease' | 'transferLease'

/**
 * What subscribers of the `mastra-lease:lease` tracing channel get for each lease call:
 * `start` and `end` around the call, `asyncStart` and `asyncEnd` once it settles, `error`
 * when it rejects. `result` (what it resolved to) or `error` (with its `code`) is set once it
 * settled.
 */
export interface LeaseCallContext {
  operation: LeaseOperation
  key: string
  /** The owner the call is made for (`fromOwner` of a transfer); absent for reads. */
  owner?: string
  /** The owner a transfer hands the lease to. */
  toOwner?: string
  ttlMs?: number
  result?: unknown
  error?: unknown
}

/** The channel every lease call of this package's providers is traced on. */
export const leaseChannel = tracingChannel<unknown, LeaseCallContext>('mastra-lease:lease')

/**
 * Marks a provider class whose lease methods trace themselves, so a pubsub that delegates
 * to it does not trace the same call twice. A registered symbol: the ESM and CommonJS builds
 * agree on it.
 */
export const tracesItself: unique symbol = Symbol.for('mastra-lease.tracesItself')

/** Whether `provider` traces its own lease calls. */
export function isTracedProvider(provider: object): boolean {
  return (provider as { [tracesItself]?: boolean })[tracesItself] === true
}
