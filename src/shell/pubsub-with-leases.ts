import { PubSub } from '@mastra/core/events'
import type { LeaseProvider } from '@mastra/core/events'

import type { LeaseGrant, LeaseState, LeaseStats } from '../../index.js'

/** A lease provider of this package: Mastra's five methods, fencing tokens, `getLease`, `stats`, `ping`. */
type FencingLeaseProvider = LeaseProvider & {
  getLease(key: string): Promise<LeaseState | undefined>
  stats(): LeaseStats
  ping(): Promise<number>
}

/** The error for a method only this package's lease providers have. */
function unsupported(method: string): TypeError {
  const error = new TypeError(`${method}: the lease provider has none (it is not a mastra-lease provider)`)
  return Object.assign(error, { code: 'ERR_LEASE_UNSUPPORTED' })
}

/**
 * A Mastra `PubSub` that is also a `LeaseProvider`: the five lease methods, `getLease`, and
 * `getLeaseProvider()` for wrappers such as Mastra's `CachingPubSub`, all delegated to
 * `leases`. Mastra's structural detection finds them directly, through its `Proxy`, and
 * through wrappers. Fields are TypeScript-private, not `#private`, so the object keeps
 * working when called through a `Proxy`.
 */
export abstract class PubSubWithLeases extends PubSub implements LeaseProvider {
  protected readonly leases: LeaseProvider

  protected constructor(leases: LeaseProvider) {
    super()
    this.leases = leases
  }

  acquireLease(key: string, owner: string, ttlMs: number): Promise<LeaseGrant> {
    return this.leases.acquireLease(key, owner, ttlMs)
  }

  /**
   * The live lease on `key` whole, `{ owner, token, ttlMs }`, or `undefined`; rejects with
   * `ERR_LEASE_UNSUPPORTED` when the lease provider is not one of this package's.
   */
  getLease(key: string): Promise<LeaseState | undefined> {
    const leases = this.leases as Partial<FencingLeaseProvider>
    if (typeof leases.getLease !== 'function') return Promise.reject(unsupported('getLease'))
    return leases.getLease(key)
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
    return this.leases.getLeaseOwner(key)
  }

  releaseLease(key: string, owner: string): Promise<void> {
    return this.leases.releaseLease(key, owner)
  }

  renewLease(key: string, owner: string, ttlMs: number): Promise<boolean> {
    return this.leases.renewLease(key, owner, ttlMs)
  }

  transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number): Promise<boolean> {
    return this.leases.transferLease(key, fromOwner, toOwner, ttlMs)
  }

  /** The lease provider, for wrappers that look for it the way Mastra's `CachingPubSub` does. */
  getLeaseProvider(): LeaseProvider {
    return this.leases
  }
}
