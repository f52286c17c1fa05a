// Lease calls and stream events as `node:diagnostics_channel` messages, for APMs, tests and
// ad-hoc debugging. While nobody subscribes, a call costs one `hasSubscribers` check more.
import { channel, tracingChannel } from 'node:diagnostics_channel'

/** A lease method, as a trace names it. */
export type LeaseOperation =
  | 'acquireLease'
  | 'getLeaseOwner'
  | 'releaseLease'
  | 'renewLease'
  | 'transferLease'
  | 'getLeaseRecord'
  | 'acquireFencedLease'
  | 'getLease'

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
  /** The metadata the owner holds with (`fromMetadata` of a transfer), when given. */
  metadata?: string
  /** The metadata a transfer stores with the new owner, when given. */
  toMetadata?: string
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

/** What subscribers of `mastra-lease:streams:publish` (a tracing channel) get per publish. */
export interface PublishContext {
  topic: string
  /** The id the event is stamped with. */
  id: string
  /** The event's `type`. */
  type: unknown
  /** Whether it stays in this process (`localOnly`). */
  localOnly: boolean
  result?: unknown
  error?: unknown
}

/**
 * What `mastra-lease:streams:deliver`, `:ack` and `:nack` publish: an event handed to a
 * subscriber's callback, and that callback settling it (a callback that throws or rejects
 * nacks). `group` is `undefined` for a fan-out subscription.
 */
export interface DeliveryMessage {
  topic: string
  group: string | undefined
  id: string
  type: unknown
  deliveryAttempt: number
  localOnly: boolean
}

/** Every publish of a `RedisStreamsPubSub`, traced like a lease call. */
export const publishChannel = tracingChannel<unknown, PublishContext>('mastra-lease:streams:publish')
/** Each event handed to a subscriber's callback. */
export const deliverChannel = channel('mastra-lease:streams:deliver')
/** Each event a callback acked. */
export const ackChannel = channel('mastra-lease:streams:ack')
/** Each event a callback nacked (or threw on, or rejected). */
export const nackChannel = channel('mastra-lease:streams:nack')
