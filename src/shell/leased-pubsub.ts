import type { Event, EventCallback, LeaseProvider, PubSub, PubSubDeliveryMode, SubscribeOptions } from '@mastra/core/events'

import { coded, described, missing, notLeaseProvider } from './errors.js'
import { PubSubWithLeases } from './pubsub-with-leases.js'
import type { TrimTopicOptions } from './redis-streams-pubsub.js'

/** A PubSub that can be closed: Mastra's transports have `close()`, the base class does not. */
type Closable = { close?: () => Promise<void> | void }
/** A PubSub of upstream Mastra's core (after 1.71), or ours: `trimTopic` is not in the installed base class. */
type Trimmable = { trimTopic?: (topic: string, options: TrimTopicOptions) => Promise<void> }

/**
 * A Mastra `PubSub` that carries events through another transport and leases through a
 * lease provider. Mastra's Signals runtime finds the five lease methods on it (and through
 * `getLeaseProvider()` when it is wrapped, e.g. by `CachingPubSub`), so thread ownership is
 * real instead of its single-process no-op fallback.
 *
 * Every PubSub member is delegated to `inner` unchanged; every lease method to `leases`.
 */
export class LeasedPubSub extends PubSubWithLeases {
  private readonly inner: PubSub

  constructor(inner: PubSub, leases: LeaseProvider) {
    super(leases)
    this.inner = inner
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

  /**
   * Removes one finished run's entries from the topic, when the transport can (its own
   * `trimTopic`); otherwise does nothing, as Mastra's base class does.
   */
  trimTopic(topic: string, options: TrimTopicOptions): Promise<void> {
    const inner = this.inner as PubSub & Trimmable
    return typeof inner.trimTopic === 'function' ? inner.trimTopic(topic, options) : Promise.resolve()
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
  // Checked here, not at the first publish or lease call: Mastra swallows the errors of many
  // lease calls, so a wrong argument would fail quietly, far from where it was given.
  const notPubSub = missing(inner, PUBSUB_METHODS)
  if (notPubSub.length > 0) {
    throw argumentError(`withLeases: the first argument must be a PubSub (with publish, subscribe, unsubscribe and flush methods), got ${described(inner, notPubSub)}`)
  }
  const notProvider = notLeaseProvider(leases, 'withLeases: the second argument')
  if (notProvider) throw notProvider
  return new LeasedPubSub(inner, leases)
}

const PUBSUB_METHODS = ['publish', 'subscribe', 'unsubscribe', 'flush'] as const

function argumentError(message: string): TypeError {
  return coded(new TypeError(message), 'ERR_LEASE_INVALID_ARGUMENT')
}
