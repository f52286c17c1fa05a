import { RedisLeaseProvider as NativeRedisLeaseProvider } from '../../index.js'
import type { FencedLeaseGrant, LeaseGrant, LeaseRecord, LeaseState } from '../../index.js'
import { leaseChannel, tracesItself } from './diagnostics.js'
import { holdLease, type HeldLease, type HoldOptions } from './hold.js'

/** The binding's methods, which a traced call runs with the provider as `this`. */
const native = NativeRedisLeaseProvider.prototype

/**
 * Leases in Redis (see the native class it extends for every method and option), with each
 * lease call traced on the `mastra-lease:lease` diagnostics channel.
 */
export class RedisLeaseProvider extends NativeRedisLeaseProvider {
  override acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<LeaseGrant> {
    if (!leaseChannel.hasSubscribers) return super.acquireLease(key, owner, ttlMs, metadata)
    const context = { operation: 'acquireLease', key, owner, ttlMs, metadata } as const
    return leaseChannel.tracePromise(native.acquireLease, context, this, key, owner, ttlMs, metadata)
  }

  override acquireFencedLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<FencedLeaseGrant> {
    if (!leaseChannel.hasSubscribers) return super.acquireFencedLease(key, owner, ttlMs, metadata)
    const context = { operation: 'acquireFencedLease', key, owner, ttlMs, metadata } as const
    return leaseChannel.tracePromise(native.acquireFencedLease, context, this, key, owner, ttlMs, metadata)
  }

  override getLeaseOwner(key: string): Promise<string | undefined> {
    if (!leaseChannel.hasSubscribers) return super.getLeaseOwner(key)
    return leaseChannel.tracePromise(native.getLeaseOwner, { operation: 'getLeaseOwner', key }, this, key)
  }

  override getLeaseRecord(key: string): Promise<LeaseRecord | undefined> {
    if (!leaseChannel.hasSubscribers) return super.getLeaseRecord(key)
    return leaseChannel.tracePromise(native.getLeaseRecord, { operation: 'getLeaseRecord', key }, this, key)
  }

  override getLease(key: string): Promise<LeaseState | undefined> {
    if (!leaseChannel.hasSubscribers) return super.getLease(key)
    return leaseChannel.tracePromise(native.getLease, { operation: 'getLease', key }, this, key)
  }

  override releaseLease(key: string, owner: string, metadata?: string): Promise<void> {
    if (!leaseChannel.hasSubscribers) return super.releaseLease(key, owner, metadata)
    const context = { operation: 'releaseLease', key, owner, metadata } as const
    return leaseChannel.tracePromise(native.releaseLease, context, this, key, owner, metadata)
  }

  override renewLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean> {
    if (!leaseChannel.hasSubscribers) return super.renewLease(key, owner, ttlMs, metadata)
    const context = { operation: 'renewLease', key, owner, ttlMs, metadata } as const
    return leaseChannel.tracePromise(native.renewLease, context, this, key, owner, ttlMs, metadata)
  }

  override transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): Promise<boolean> {
    if (!leaseChannel.hasSubscribers) return super.transferLease(key, fromOwner, toOwner, ttlMs, fromMetadata, toMetadata)
    const context = { operation: 'transferLease', key, owner: fromOwner, toOwner, ttlMs, metadata: fromMetadata, toMetadata } as const
    return leaseChannel.tracePromise(native.transferLease, context, this, key, fromOwner, toOwner, ttlMs, fromMetadata, toMetadata)
  }

  /**
   * Acquires `key` for `owner` and keeps it, renewed every `ttlMs / 3`, until released, lost
   * or `options.signal` aborts; `lease.signal` aborts the moment it is lost (see `HeldLease`).
   * Rejects with `ERR_LEASE_HELD` when another owner holds it.
   */
  hold(key: string, owner: string, options: HoldOptions): Promise<HeldLease> {
    return holdLease(this, key, owner, options)
  }

  /** Its lease calls are traced here, not again by a pubsub delegating to it. */
  get [tracesItself](): true {
    return true
  }
}
