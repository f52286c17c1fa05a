import { PubSub } from '@mastra/core/events'
import type { Event, EventCallback, LeaseProvider, PubSubDeliveryMode, SubscribeOptions } from '@mastra/core/events'

/** A PubSub that can be closed: Mastra's transports have `close()`, the base class does not. */
type Closable = { close?: () => Promise<void> | void }

/**
 * A Mastra `PubSub` that carries events through another transport and leases through a
 * lease provider. Mastra's Signals runtime finds the five lease methods on it (and through
 * `getLeaseProvider()` when it is wrapped, e.g. by `CachingPubSub`), so thread ownership is
 * real instead of its single-process no-op fallback.
 *
 * Every PubSub member is delegated to `inner` unchanged; every lease method to `leases`.
 * Fields are TypeScript-private, not `#private`, so the object keeps working when Mastra
 * calls it through a `Proxy`.
 */
export class LeasedPubSub extends PubSub implements LeaseProvider {
  private readonly inner: PubSub
  private readonly leases: LeaseProvider

  constructor(inner: PubSub, leases: LeaseProvider) {
    super()
    this.inner = inner
    this.leases = leases
  }

  publish(topic: string, event: Omit<Event, 'id' | 'createdAt'>, options?: { localOnly?: boolean }): Promise<void> {
    return this.inner.publish(topic, event, options)
  }

  subscribe(topic: string, cb: EventCallback, options?: SubscribeOptions): Promise<void> {
    return this.inner.subscribe(topic, cb, options)
  }

  unsubscribe(topic: string, cb: EventCallback): Promise<void> {
    return this.inner.unsubscribe(topic, cb)
  }

  flush(): Promise<void> {
    return this.inner.flush()
  }

  override clearTopic(topic: string): Promise<void> {
    return this.inner.clearTopic(topic)
  }

  override get supportedModes(): ReadonlyArray<PubSubDeliveryMode> {
    return this.inner.supportedModes
  }

  override get supportsNativeBatching(): boolean {
    return this.inner.supportsNativeBatching
  }

  override get supportsOffsets(): boolean {
    return this.inner.supportsOffsets
  }

  override getHistory(topic: string, offset?: number): Promise<Event[]> {
    return this.inner.getHistory(topic, offset)
  }

  override subscribeWithReplay(topic: string, cb: EventCallback): Promise<void> {
    return this.inner.subscribeWithReplay(topic, cb)
  }

  override subscribeFromOffset(topic: string, offset: number, cb: EventCallback): Promise<void> {
    return this.inner.subscribeFromOffset(topic, offset, cb)
  }

  /** Closes the transport, then the lease provider (both belong to this PubSub now). */
  async close(): Promise<void> {
    await (this.inner as PubSub & Closable).close?.()
    await (this.leases as LeaseProvider & Closable).close?.()
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

  /** The event transport underneath. */
  getInner(): PubSub {
    return this.inner
  }
}

/**
 * Gives a Mastra event transport real leases:
 * `new Mastra({ pubsub: withLeases(new UnixSocketPubSub(path), new RedisLeaseProvider({ url })) })`.
 */
export function withLeases(inner: PubSub, leases: LeaseProvider): LeasedPubSub {
  return new LeasedPubSub(inner, leases)
}
