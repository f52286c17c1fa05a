import { PubSub } from '@mastra/core/events'
import type { LeaseProvider } from '@mastra/core/events'

/**
 * A Mastra `PubSub` that is also a `LeaseProvider`: the five lease methods, and
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

  acquireLease(key: string, owner: string, ttlMs: number): Promise<{ acquired: boolean; owner?: string }> {
    return this.leases.acquireLease(key, owner, ttlMs)
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
