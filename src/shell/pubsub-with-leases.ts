import { PubSub } from '@mastra/core/events'
import type { LeaseProvider } from '@mastra/core/events'

import type { FencedLeaseGrant, LeaseGrant, LeaseRecord, LeaseState, LeaseStats } from './native.js'
import { traced } from './diagnostics.js'
import { coded } from './errors.js'
import { holdLease, type HeldLease, type HoldOptions } from './hold.js'
import { releaseWaiters, waitersOf, type Waiters } from './wait.js'

/** A lease provider of this package: Mastra's five methods and `getLeaseRecord`, fenced grants, `getLease`, `stats`, `ping`. */
type FencingLeaseProvider = LeaseProvider & {
  getLeaseRecord(key: string): Promise<LeaseRecord | undefined>
  acquireFencedLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<FencedLeaseGrant>
  getLease(key: string): Promise<LeaseState | undefined>
  stats(): LeaseStats
  ping(): Promise<number>
}

/** Mastra's five lease methods, with each holder's metadata (this package's lease records). */
type MetadataLeaseProvider = {
  acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<LeaseGrant>
  releaseLease(key: string, owner: string, metadata?: string): Promise<void>
  renewLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean>
  transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): Promise<boolean>
}

/** The error for a method only this package's lease providers have. */
function unsupported(method: string): TypeError {
  const error = new TypeError(`${method}: the lease provider has none (it is not a mastra-lease provider)`)
  return coded(error, 'ERR_LEASE_UNSUPPORTED')
}

/**
 * A Mastra `PubSub` that is also a `LeaseProvider`: the five lease methods (each holder's
 * metadata passed on), `getLease`, and `getLeaseProvider()` for wrappers such as Mastra's
 * `CachingPubSub`, all delegated to `leases`; `getLeaseRecord` and `acquireFencedLease` too
 * when `leases` has them, and only then, so that a structural detection (Mastra's, for the
 * five methods) takes it for what its provider is. They are found directly, through Mastra's
 * `Proxy`, and through wrappers. Fields are TypeScript-private, not
 * `#private`, so the object keeps working when called through a `Proxy`.
 *
 * Lease calls are traced on the `mastra-lease:lease` diagnostics channel, once: here, whatever
 * the provider (another library's, the one a `RedisStreamsPubSub` shares its connection with,
 * or one of this package's, which does not trace them again).
 */
export abstract class PubSubWithLeases extends PubSub implements LeaseProvider {
  protected readonly leases: LeaseProvider & MetadataLeaseProvider
  /**
   * Who holds the live lease on `key`, `{ owner, metadata? }`, or `undefined` (this
   * package's lease record): present only when the lease provider has it.
   */
  declare readonly getLeaseRecord?: (key: string) => Promise<LeaseRecord | undefined>
  /**
   * `acquireLease` with a fencing token, `{ acquired, owner, token }`: present only when the
   * lease provider has it (this package's do), so `hold()` takes a token where one is to be had.
   */
  declare readonly acquireFencedLease?: (key: string, owner: string, ttlMs: number, metadata?: string) => Promise<FencedLeaseGrant>

  protected constructor(leases: LeaseProvider) {
    super()
    this.leases = leases as LeaseProvider & MetadataLeaseProvider
    const ours = leases as Partial<FencingLeaseProvider>
    if (typeof ours.getLeaseRecord === 'function') {
      const getLeaseRecord = (key: string) => this.recordOf(ours as FencingLeaseProvider, key)
      Object.defineProperty(this, 'getLeaseRecord', { value: getLeaseRecord, configurable: true })
    }
    if (typeof ours.acquireFencedLease === 'function') {
      const acquireFencedLease = (key: string, owner: string, ttlMs: number, metadata?: string) =>
        this.fenced(ours as FencingLeaseProvider, key, owner, ttlMs, metadata)
      Object.defineProperty(this, 'acquireFencedLease', { value: acquireFencedLease, configurable: true })
    }
  }

  private recordOf(leases: FencingLeaseProvider, key: string): Promise<LeaseRecord | undefined> {
    return traced.getLeaseRecord(leases.getLeaseRecord, leases, key)
  }

  private fenced(leases: FencingLeaseProvider, key: string, owner: string, ttlMs: number, metadata?: string): Promise<FencedLeaseGrant> {
    return traced.acquireFencedLease(leases.acquireFencedLease, leases, key, owner, ttlMs, metadata)
  }

  acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<LeaseGrant> {
    const leases = this.leases
    return traced.acquireLease(leases.acquireLease, leases, key, owner, ttlMs, metadata)
  }

  /**
   * The live lease on `key` whole, `{ owner, token, ttlMs }` (`ttlMs` `null` for a key that
   * never expires), or `undefined`; rejects with `ERR_LEASE_UNSUPPORTED` when the lease
   * provider is not one of this package's.
   */
  getLease(key: string): Promise<LeaseState | undefined> {
    const leases = this.leases as Partial<FencingLeaseProvider>
    if (typeof leases.getLease !== 'function') return Promise.reject(unsupported('getLease'))
    return traced.getLease(leases.getLease, leases, key)
  }

  /**
   * A round trip to the lease provider's Redis, in milliseconds (0 in memory), settling
   * within `commandTimeoutMs`; rejects with `ERR_LEASE_UNSUPPORTED` when the provider is not
   * one of this package's.
   */
  ping(): Promise<number> {
    const leases = this.leases as Partial<FencingLeaseProvider>
    if (typeof leases.ping !== 'function') return Promise.reject(unsupported('ping'))
    return leases.ping()
  }

  /**
   * What the lease provider's calls came to since it was made (see `RedisLeaseProvider`'s
   * `stats()`); throws `ERR_LEASE_UNSUPPORTED` when it is not one of this package's.
   */
  stats(): LeaseStats {
    const leases = this.leases as Partial<FencingLeaseProvider>
    if (typeof leases.stats !== 'function') throw unsupported('stats')
    return leases.stats()
  }

  getLeaseOwner(key: string): Promise<string | undefined> {
    const leases = this.leases
    return traced.getLeaseOwner(leases.getLeaseOwner, leases, key)
  }

  releaseLease(key: string, owner: string, metadata?: string): Promise<void> {
    const leases = this.leases
    return traced.releaseLease(leases.releaseLease, leases, key, owner, metadata)
  }

  renewLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean> {
    const leases = this.leases
    return traced.renewLease(leases.renewLease, leases, key, owner, ttlMs, metadata)
  }

  transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): Promise<boolean> {
    const leases = this.leases
    return traced.transferLease(leases.transferLease, leases, key, fromOwner, toOwner, ttlMs, fromMetadata, toMetadata)
  }

  /**
   * Acquires `key` for `owner` and keeps it, renewed every `ttlMs / 3`, until released, lost
   * or `options.signal` aborts; `lease.signal` aborts the moment it is lost (see `HeldLease`).
   * Rejects with `ERR_LEASE_HELD` when another owner holds it.
   */
  hold(key: string, owner: string, options: HoldOptions): Promise<HeldLease> {
    return holdLease(this, key, owner, options)
  }

  /** The waiters of `hold(…, { wait: true })`: its provider's, when it can tell them about releases. */
  get [releaseWaiters](): Waiters | undefined {
    return waitersOf(this.leases)
  }

  /**
   * The lease provider Mastra's agent runtime asks for, preferring it to the pubsub's own
   * methods: this pubsub itself, so every lease call Mastra makes still goes through it (and
   * is traced here).
   */
  getLeaseProvider(): LeaseProvider {
    return this
  }
}
