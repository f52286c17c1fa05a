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
  owner?: string | undefined
  /** The owner a transfer hands the lease to. */
  toOwner?: string | undefined
  /** The metadata the owner holds with (`fromMetadata` of a transfer), when given. */
  metadata?: string | undefined
  /** The metadata a transfer stores with the new owner, when given. */
  toMetadata?: string | undefined
  ttlMs?: number | undefined
  result?: unknown
  error?: unknown
}

/** The channel every lease call of this package's providers is traced on. */
export const leaseChannel = tracingChannel<unknown, LeaseCallContext>('mastra-lease:lease')

/** A lease call as a provider answers it, called with its receiver as `this`. */
type Call<T, A extends unknown[], R> = (this: T, ...args: A) => Promise<R>

/**
 * Whether a lease call is being traced at this moment. The provider a pubsub delegates to is
 * called in that moment, so a call through a pubsub over a provider of this package is traced
 * once, by the pubsub, and a provider of someone else's is traced all the same.
 */
let tracing = false

/** Runs `call` traced as `context`, unless it is part of a call being traced already. */
function trace<T, A extends unknown[], R>(context: LeaseCallContext, call: Call<T, A, R>, self: T, ...args: A): Promise<R> {
  if (tracing) return call.apply(self, args)
  tracing = true
  try {
    return leaseChannel.tracePromise(call, context, self, ...args)
  } finally {
    tracing = false
  }
}

/**
 * The one place lease calls are traced: each of the providers' and pubsubs' lease methods
 * hands its untraced call (and its `this`) to the function of its operation here, which calls
 * it straight while nobody listens on `mastra-lease:lease`, and traces it, its arguments named
 * as `LeaseCallContext` names them, otherwise.
 */
export const traced = {
  acquireLease<T, R>(call: Call<T, [string, string, number, string?], R>, self: T, key: string, owner: string, ttlMs: number, metadata?: string): Promise<R> {
    if (!leaseChannel.hasSubscribers) return call.call(self, key, owner, ttlMs, metadata)
    return trace({ operation: 'acquireLease', key, owner, ttlMs, metadata }, call, self, key, owner, ttlMs, metadata)
  },
  acquireFencedLease<T, R>(call: Call<T, [string, string, number, string?], R>, self: T, key: string, owner: string, ttlMs: number, metadata?: string): Promise<R> {
    if (!leaseChannel.hasSubscribers) return call.call(self, key, owner, ttlMs, metadata)
    return trace({ operation: 'acquireFencedLease', key, owner, ttlMs, metadata }, call, self, key, owner, ttlMs, metadata)
  },
  renewLease<T>(call: Call<T, [string, string, number, string?], boolean>, self: T, key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean> {
    if (!leaseChannel.hasSubscribers) return call.call(self, key, owner, ttlMs, metadata)
    return trace({ operation: 'renewLease', key, owner, ttlMs, metadata }, call, self, key, owner, ttlMs, metadata)
  },
  releaseLease<T>(call: Call<T, [string, string, string?], void>, self: T, key: string, owner: string, metadata?: string): Promise<void> {
    if (!leaseChannel.hasSubscribers) return call.call(self, key, owner, metadata)
    return trace({ operation: 'releaseLease', key, owner, metadata }, call, self, key, owner, metadata)
  },
  transferLease<T>(
    call: Call<T, [string, string, string, number, string?, string?], boolean>,
    self: T,
    key: string,
    fromOwner: string,
    toOwner: string,
    ttlMs: number,
    fromMetadata?: string,
    toMetadata?: string,
  ): Promise<boolean> {
    if (!leaseChannel.hasSubscribers) return call.call(self, key, fromOwner, toOwner, ttlMs, fromMetadata, toMetadata)
    const context = { operation: 'transferLease', key, owner: fromOwner, toOwner, ttlMs, metadata: fromMetadata, toMetadata } as const
    return trace(context, call, self, key, fromOwner, toOwner, ttlMs, fromMetadata, toMetadata)
  },
  getLeaseOwner<T>(call: Call<T, [string], string | undefined>, self: T, key: string): Promise<string | undefined> {
    if (!leaseChannel.hasSubscribers) return call.call(self, key)
    return trace({ operation: 'getLeaseOwner', key }, call, self, key)
  },
  getLeaseRecord<T, R>(call: Call<T, [string], R>, self: T, key: string): Promise<R> {
    if (!leaseChannel.hasSubscribers) return call.call(self, key)
    return trace({ operation: 'getLeaseRecord', key }, call, self, key)
  },
  getLease<T, R>(call: Call<T, [string], R>, self: T, key: string): Promise<R> {
    if (!leaseChannel.hasSubscribers) return call.call(self, key)
    return trace({ operation: 'getLease', key }, call, self, key)
  },
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
