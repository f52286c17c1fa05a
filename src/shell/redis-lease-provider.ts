import { RedisLeaseProvider as NativeRedisLeaseProvider } from './native.js'
import type { FencedLeaseGrant, LeaseGrant, LeaseRecord, LeaseState, RedisLeaseProviderOptions as NativeOptions } from './native.js'
import { readClient, type ClientOption } from './node-redis-client.js'
import { traced } from './diagnostics.js'
import { holdLease, type HeldLease, type HoldOptions } from './hold.js'

/** Options of `new RedisLeaseProvider(options?)`: the binding's, and `client`. */
export interface RedisLeaseProviderOptions extends NativeOptions, ClientOption {}

/** The binding's methods, which a traced call runs with the provider as `this`. */
const native = NativeRedisLeaseProvider.prototype

/**
 * Leases in Redis (see the native class it extends for every method and option), with each
 * lease call traced on the `mastra-lease:lease` diagnostics channel.
 */
export class RedisLeaseProvider extends NativeRedisLeaseProvider {
  /** Throws a `TypeError`/`RangeError` with code `ERR_LEASE_INVALID_OPTION` for bad options. */
  constructor(options?: RedisLeaseProviderOptions | null) {
    super(readClient(options))
  }

  override acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<LeaseGrant> {
    return traced.acquireLease(native.acquireLease, this, key, owner, ttlMs, metadata)
  }

  override acquireFencedLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<FencedLeaseGrant> {
    return traced.acquireFencedLease(native.acquireFencedLease, this, key, owner, ttlMs, metadata)
  }

  override getLeaseOwner(key: string): Promise<string | undefined> {
    return traced.getLeaseOwner(native.getLeaseOwner, this, key)
  }

  override getLeaseRecord(key: string): Promise<LeaseRecord | undefined> {
    return traced.getLeaseRecord(native.getLeaseRecord, this, key)
  }

  override getLease(key: string): Promise<LeaseState | undefined> {
    return traced.getLease(native.getLease, this, key)
  }

  override releaseLease(key: string, owner: string, metadata?: string): Promise<void> {
    return traced.releaseLease(native.releaseLease, this, key, owner, metadata)
  }

  override renewLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean> {
    return traced.renewLease(native.renewLease, this, key, owner, ttlMs, metadata)
  }

  override transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): Promise<boolean> {
    return traced.transferLease(native.transferLease, this, key, fromOwner, toOwner, ttlMs, fromMetadata, toMetadata)
  }

  /**
   * Acquires `key` for `owner` and keeps it, renewed every `ttlMs / 3`, until released, lost
   * or `options.signal` aborts; `lease.signal` aborts the moment it is lost (see `HeldLease`).
   * Rejects with `ERR_LEASE_HELD` when another owner holds it.
   */
  hold(key: string, owner: string, options: HoldOptions): Promise<HeldLease> {
    return holdLease(this, key, owner, options)
  }
}
