import { AsyncResource } from 'node:async_hooks'
import { randomUUID } from 'node:crypto'

import type { Event, EventCallback, PubSubDeliveryMode, SubscribeOptions } from '@mastra/core/events'

import { RedisStreamsTransport } from './native.js'
import type { RedisLeaseProvider, RedisStreamsOptions } from './native.js'
import { ackChannel, deliverChannel, nackChannel, publishChannel, type DeliveryMessage } from './diagnostics.js'
import { coded } from './errors.js'
import { readClient, type ClientOption } from './node-redis-client.js'
import { PubSubWithLeases } from './pubsub-with-leases.js'

/** A logger: `warn` for warnings and, if it has one, `debug` for notes (Mastra's logger fits). */
export interface StreamsLogger {
  warn(message: string, fields?: Record<string, unknown>): void
  debug?(message: string, fields?: Record<string, unknown>): void
}

/** Options of `new RedisStreamsPubSub(options?)`; every field has a default. */
export interface RedisStreamsPubSubOptions extends Omit<RedisStreamsOptions, 'logger'>, ClientOption {
  /**
   * Receives dropped-event warnings, connection trouble (at most once per 30 s), events held
   * unusually long, and the warning when Redis's eviction policy could evict leases (once per
   * policy); debug notes when it has `debug`. Without it, the eviction-policy warning goes to
   * `process.emitWarning` (code `MASTRA_LEASE_EVICTION_POLICY`).
   */
  logger?: StreamsLogger | undefined
}

type Publishable = Omit<Event, 'id' | 'createdAt'>

/**
 * A subscriber as `subscribe` calls it: `extend()` fourth, the heartbeat of a long handler
 * (upstream Mastra's core passes it; 1.71's `EventCallback` has three arguments, and a callback
 * of this type is one, so `subscribe` takes it as it is). `extend()` always resolves; see
 * `subscribe`.
 */
export type ExtendableEventCallback = (
  event: Event,
  ack?: () => Promise<void>,
  nack?: () => Promise<void>,
  extend?: () => Promise<void>,
) => void | Promise<void>

/**
 * Mastra's PubSub over Redis Streams, and its LeaseProvider, in one object:
 * `new Mastra({ pubsub: new RedisStreamsPubSub({ url: process.env.REDIS_URL }) })`.
 *
 * Each topic is the stream `<keyPrefix>:<topic>` with one field `event` holding the JSON
 * event, the layout of Mastra's own Redis backend. The transport (reads, acks, redelivery,
 * reclaiming) runs in Rust; this class turns its JSON into Mastra events and callbacks.
 */
export class RedisStreamsPubSub extends PubSubWithLeases {
  private readonly transport: RedisStreamsTransport
  private readonly ownLeases: RedisLeaseProvider
  /** Subscriptions by topic and callback: the transport's id, and the group if any. */
  private readonly subscriptions = new Map<string, Map<EventCallback, Subscribed>>()
  /** The same subscriptions by the transport's id: whom a `localOnly` event is handed to. */
  private readonly byId = new Map<number, { cb: EventCallback; group: string | undefined }>()
  /** `localOnly` redeliveries scheduled after a nack; each settles once it has run. */
  private readonly localRetries = new Map<ReturnType<typeof setTimeout>, { ran: Promise<void>; done: () => void }>()

  constructor(options: RedisStreamsPubSubOptions | null = {}) {
    // Every option, the logger included, is checked natively: a bad or unknown one throws.
    const transport = new RedisStreamsTransport(readClient(options))
    const leases = transport.leaseProvider()
    super(leases)
    this.transport = transport
    this.ownLeases = leases
  }

  override get supportedModes(): ReadonlyArray<PubSubDeliveryMode> {
    return ['pull']
  }

  /**
   * Appends the event to the topic's stream, stamped with `id`, `createdAt` and
   * `deliveryAttempt`. With `localOnly`, the event never leaves this process: this process's
   * subscribers of the topic get the very object (live values survive), nothing is written.
   * Who gets it follows the rules of every delivery (each fan-out subscriber, one member of
   * each group in turn), and a nacked one is redelivered in this process, as Mastra's
   * in-process pubsubs do, with `deliveryAttempt + 1` up to `maxDeliveryAttempts`, then
   * dropped with a warning.
   */
  publish(topic: string, event: Publishable, options?: PublishOptions): Promise<void> {
    // Stamped here, where the object is at hand: the native side writes the text as it is.
    const id = randomUUID()
    const localOnly = localOnlyOf(options)
    if (!publishChannel.hasSubscribers) return this.publishAs(id, topic, event, localOnly)
    const context = { topic, id, type: event?.type, localOnly: localOnly === true }
    return publishChannel.tracePromise(this.publishAs, context, this, id, topic, event, localOnly)
  }

  /** `publish` with the event's id chosen and its options read (or why they were refused). */
  private publishAs(id: string, topic: string, event: Publishable, localOnly: boolean | TypeError): Promise<void> {
    // Not an async function: the native promise is handed back as it is, one hop fewer per
    // publish; anything thrown on the way still comes back as a rejection.
    try {
      if (localOnly instanceof TypeError) throw localOnly
      if (typeof event !== 'object' || event === null || Array.isArray(event)) {
        throw argumentError('event must be an object')
      }
      const deliveryAttempt = attemptOf(readEvent(() => event.deliveryAttempt))
      if (localOnly) {
        const stamped: Event = readEvent(() => ({ ...event, id, createdAt: new Date(), deliveryAttempt }))
        // The transport picks the recipients (and refuses a bad topic or a closed transport).
        for (const subscription of this.transport.localRecipients(topic)) this.deliverLocal(topic, stamped, subscription)
        return Promise.resolve()
      }
      // The same text a Date would give (its toJSON is toISOString), but JSON.stringify of an
      // object holding a Date leaves V8's fast path.
      const json = readEvent(() => JSON.stringify({ ...event, id, createdAt: isoNow(), deliveryAttempt }))
      return this.transport.publish(topic, json)
    } catch (err) {
      return Promise.reject(err)
    }
  }

  /**
   * Delivers the topic's events to `cb(event, ack, nack, extend)`. With `group`, subscribers
   * of the group share the events; without, every subscriber gets every event. A new group
   * starts at the stream's beginning (`startFrom: 'latest'` for new events only). A callback
   * that throws or rejects nacks its event: redelivered with `deliveryAttempt + 1`, up to
   * `maxDeliveryAttempts`. A group's event stays claimed until it is acked or nacked,
   * however long after the callback returned that is, while this process lives (see
   * `inFlightTimeoutMs` for a handler that never settles); once the process is gone, a
   * sibling reclaims it after `reclaimIdleMs`. A fan-out event gives its place back when
   * its callback returns, and may still be nacked afterwards.
   *
   * `extend()` says the handler is alive: `inFlightTimeoutMs`, if set, counts again from
   * then, and a group's entry has its idle time in Redis reset if this consumer still owns
   * it (never taken back from a sibling). It always resolves, within `commandTimeoutMs`
   * even when Redis cannot be reached, and does nothing once the event is settled. Without
   * `inFlightTimeoutMs` it is never needed: held events are kept claimed anyway.
   */
  async subscribe(topic: string, cb: EventCallback, options?: SubscribeOptions): Promise<void> {
    if (typeof cb !== 'function') throw argumentError(`the callback must be a function, got ${typeof cb}`)
    const { group, startFrom } = subscribeOptions(options)
    // Events are handed over from the addon's thread-safe function, whose async context Node
    // 22 takes from where it was made and Node 24 does not: bound here, callbacks run in the
    // subscriber's context (its AsyncLocalStorage stores) on every Node.
    const onEvents = AsyncResource.bind((batch: Array<number | string>) => {
      for (let i = 0; i + 1 < batch.length; i += 2) {
        this.deliver(topic, batch[i] as number, batch[i + 1] as string, cb, group)
      }
    })
    let byCallback = this.subscriptions.get(topic)
    const existing = byCallback?.get(cb)
    if (existing) {
      // As Mastra's own pubsubs: a callback subscribed twice still gets each event once.
      await existing.opened
      return
    }
    const [id, opened] = this.transport.subscribe(topic, group, startFrom, onEvents)
    if (!byCallback) this.subscriptions.set(topic, (byCallback = new Map()))
    byCallback.set(cb, { id, opened, group })
    this.byId.set(id, { cb, group })
    try {
      await opened
    } catch (err) {
      byCallback.delete(cb)
      if (byCallback.size === 0) this.subscriptions.delete(topic)
      this.byId.delete(id)
      throw err
    }
  }

  async unsubscribe(topic: string, cb: EventCallback): Promise<void> {
    const byCallback = this.subscriptions.get(topic)
    const subscribed = byCallback?.get(cb)
    if (!byCallback || !subscribed) return
    byCallback.delete(cb)
    if (byCallback.size === 0) this.subscriptions.delete(topic)
    this.byId.delete(subscribed.id)
    await this.transport.unsubscribe(subscribed.id)
  }

  /**
   * Resolves once every publish, ack and nack made so far has reached Redis (a settle that
   * cannot goes on being retried in the background), and every `localOnly` redelivery
   * already scheduled has been handed to its subscriber.
   */
  async flush(): Promise<void> {
    const retries = [...this.localRetries.values()].map((r) => r.ran)
    await Promise.all([this.transport.flush(), ...retries])
  }

  /** Deletes the topic's stream and its groups. Never rejects. */
  override async clearTopic(topic: string): Promise<void> {
    await this.transport.clearTopic(topic).catch(() => {})
  }

  /**
   * Removes one finished run's entries from a topic several runs share: those whose `runId`
   * is `options.runId` and, with `producedBefore` (epoch milliseconds or a `Date`), whose
   * `data.producedAt` is no later. An entry a consumer group holds unsettled stays, as does
   * every other run's. Best effort, as Mastra documents it: a Redis failure is logged and
   * this resolves; only bad arguments reject (`ERR_STREAMS_INVALID_ARGUMENT`), before any I/O.
   */
  async trimTopic(topic: string, options: TrimTopicOptions): Promise<void> {
    const { runId, producedBefore } = trimTopicOptions(options)
    await this.transport.trimTopic(topic, runId, producedBefore).catch((err: unknown) => {
      if ((err as { code?: unknown } | null)?.code === 'ERR_STREAMS_INVALID_ARGUMENT') throw err
    })
  }

  /**
   * Stops every subscription, closes the leases and every connection. Every publish, ack and
   * nack made before it (in the same turn too, unawaited) has reached Redis when it resolves,
   * or failed for good and been logged; events still held stay pending for a sibling.
   * Lease calls made once it was called reject with `ERR_LEASE_CLOSED` at once. Idempotent.
   */
  async close(): Promise<void> {
    // The lease side closes first, before any await: a lease call made while the transport
    // still drains is refused at once and never reaches Redis. That closes no connection: the
    // one the leases share is the transport's, closed once what was published before is written.
    const leasesClosed = this.ownLeases.close()
    this.subscriptions.clear()
    this.byId.clear()
    for (const [timer, { done }] of this.localRetries) {
      clearTimeout(timer)
      done() // a flush waiting for it resolves
    }
    this.localRetries.clear()
    await this.transport.close()
    await leasesClosed
  }

  /**
   * Hands a `localOnly` event to the subscription numbered `subscription`. A nack (or a
   * throw, or a rejection) redelivers it on a later turn of the event loop with
   * `deliveryAttempt + 1` (same id, same live data), to whom the transport names: the same
   * callback for fan-out, the member whose turn it is for a group, while there is one. At
   * `maxDeliveryAttempts` the transport drops it with the warning a stream event gets.
   */
  private deliverLocal(topic: string, event: Event, subscription: number): void {
    const to = this.byId.get(subscription)
    if (!to) return
    const { cb, group } = to
    let settled = false
    const ack = async () => {
      if (!settled && ackChannel.hasSubscribers) ackChannel.publish(delivered(topic, group, event, true))
      settled = true
    }
    const nack = async () => {
      if (settled) return
      settled = true
      if (nackChannel.hasSubscribers) nackChannel.publish(delivered(topic, group, event, true))
      const attempt = this.transport.localNacked(topic, event.id, String(event.type), event.deliveryAttempt ?? 1)
      if (attempt === null) return
      let done = () => {}
      const ran = new Promise<void>((resolve) => (done = resolve))
      const timer = setTimeout(() => {
        this.localRetries.delete(timer)
        done()
        const next = this.transport.localRedelivery(topic, group, subscription)
        if (next !== null) this.deliverLocal(topic, { ...event, deliveryAttempt: attempt }, next)
      }, 0)
      this.localRetries.set(timer, { ran, done })
    }
    if (deliverChannel.hasSubscribers) deliverChannel.publish(delivered(topic, group, event, true))
    // Nothing times a localOnly event out, and nothing of it is in Redis: nothing to extend.
    invoke(cb, event, ack, nack, resolvedExtend)
  }

  private deliver(topic: string, delivery: number, json: string, cb: EventCallback, group: string | undefined): void {
    let event: Event
    try {
      event = JSON.parse(json) as Event
      event.createdAt = dateOf(event.createdAt as unknown as string)
    } catch {
      // Not an event: settle it so it does not come back forever.
      void this.transport.ack(delivery)
      return
    }
    let settled = false
    let returned = false
    const settle = (how: 'ack' | 'nack') => (): Promise<void> => {
      if (settled) return Promise.resolve()
      settled = true
      const told = how === 'ack' ? ackChannel : nackChannel
      if (told.hasSubscribers) told.publish(delivered(topic, group, event, false))
      if (how === 'ack' && group === undefined) {
        // A fan-out event holds nothing in Redis: acking it ends its hold here and now, as
        // its callback's return does (`done` below), without a promise of the addon's.
        if (!returned) this.transport.returned(delivery)
        return Promise.resolve()
      }
      if (!returned) return this.transport[how](delivery)
      // A fan-out event whose callback returned is no longer held: a late nack hands the
      // event back as it came, to be appended again.
      return this.transport.nackReturned(topic, json)
    }
    const extend = (): Promise<void> => (settled || returned ? Promise.resolve() : this.transport.extend(delivery))
    // A group's event stays held (kept claimed) until it is acked or nacked, however long
    // after the callback returns that is: Mastra's workers return at once and ack when the
    // step ends. A fan-out event, which holds nothing in Redis, is done once its callback
    // returned, and may still be nacked afterwards.
    const done =
      group === undefined
        ? () => {
            returned = true
            if (!settled) this.transport.returned(delivery)
          }
        : undefined
    if (deliverChannel.hasSubscribers) deliverChannel.publish(delivered(topic, group, event, false))
    invoke(cb, event, settle('ack'), settle('nack'), extend, done)
  }
}

/** What the deliver, ack and nack channels say about `event`. */
function delivered(topic: string, group: string | undefined, event: Event, localOnly: boolean): DeliveryMessage {
  return { topic, group, id: event.id, type: event.type, deliveryAttempt: event.deliveryAttempt ?? 1, localOnly }
}

interface Subscribed {
  id: number
  /** Resolves once the subscription's starting point is fixed. */
  opened: Promise<void>
  group: string | undefined
}

// Events published or read together mostly share their millisecond: the last conversion
// either way is kept, so most events skip formatting or parsing a date.
let lastMs = Number.NaN
let lastIso = ''
let lastRead: string | undefined
let lastReadMs = Number.NaN

/** `new Date().toISOString()`, formatted once per millisecond. */
function isoNow(): string {
  const ms = Date.now()
  if (ms !== lastMs) {
    lastMs = ms
    lastIso = new Date(ms).toISOString()
  }
  return lastIso
}

/** `new Date(text)`, a fresh object each time, parsing `text` only when it changed. */
function dateOf(text: string): Date {
  if (text !== lastRead) {
    lastRead = text
    lastReadMs = new Date(text).getTime()
  }
  return new Date(lastReadMs)
}

/** The same coded error the native argument checks give. */
function argumentError(message: string, cause?: unknown): TypeError {
  return coded(new TypeError(message, cause === undefined ? undefined : { cause }), 'ERR_STREAMS_INVALID_ARGUMENT')
}

/**
 * What `read` makes of the caller's event; what reading it throws (a BigInt or a cycle JSON
 * cannot write, a throwing `toJSON`, a Proxy's trap) becomes a coded error, with what was
 * thrown as `cause`.
 */
function readEvent<T>(read: () => T): T {
  try {
    return read()
  } catch (err) {
    throw argumentError(`event cannot be written as JSON: ${err instanceof Error ? err.message : String(err)}`, err)
  }
}

/**
 * The `deliveryAttempt` a publish stamps: 1, or the one the caller set (a redelivery), which
 * must be a whole number of at least 1. An event read from a stream is read tolerantly
 * instead (see docs/streams.md): another process wrote it.
 */
function attemptOf(attempt: unknown): number {
  if (attempt === undefined) return 1
  if (typeof attempt !== 'number') {
    throw argumentError(`event.deliveryAttempt must be a number, got ${attempt === null ? 'null' : typeof attempt}`)
  }
  if (!Number.isSafeInteger(attempt) || attempt < 1) {
    throw coded(new RangeError(`event.deliveryAttempt must be a whole number of at least 1, got ${attempt}`), 'ERR_STREAMS_INVALID_ARGUMENT')
  }
  return attempt
}

/** `publish`'s options. */
export interface PublishOptions {
  /** Deliver to this process's subscribers only; nothing is written to Redis. */
  localOnly?: boolean | undefined
}

/**
 * Whether `publish`'s options ask for `localOnly`, or the coded error that refuses them: an
 * option other than `localOnly` (`{ localonly: true }` must not quietly write to Redis), a
 * `localOnly` that is not a boolean, or options whose reading throws (a Proxy's trap), with
 * what was thrown as `cause`. Answered, not thrown, so the publish's trace sees the rejection.
 */
function localOnlyOf(options: PublishOptions | undefined | null): boolean | TypeError {
  if (options === undefined || options === null) return false
  if (typeof options !== 'object' || Array.isArray(options)) {
    return argumentError(`publish options must be an object, got ${Array.isArray(options) ? 'an array' : typeof options}`)
  }
  let names: string[]
  let localOnly: unknown
  try {
    names = Object.keys(options)
    localOnly = options.localOnly
  } catch (err) {
    return argumentError(`reading the publish options threw: ${err instanceof Error ? err.message : String(err)}`, err)
  }
  for (const name of names) {
    if (name !== 'localOnly') return argumentError(`unknown publish option ${JSON.stringify(name)} (publish takes localOnly)`)
  }
  if (localOnly !== undefined && typeof localOnly !== 'boolean') {
    return argumentError(`publish option localOnly must be a boolean, got ${localOnly === null ? 'null' : typeof localOnly}`)
  }
  return localOnly === true
}

/** `trimTopic`'s options: the run, and optionally how recent its entries may be. */
export interface TrimTopicOptions {
  /** The run whose entries are removed (each event's `runId`). */
  runId: string
  /** Only entries whose `data.producedAt` (epoch milliseconds) is no later than this. */
  producedBefore?: number | Date | undefined
}

/**
 * `trimTopic`'s options read once, a `Date` made a number; the native side checks the values.
 * An option other than `runId` and `producedBefore` is refused: `{ producedBfore: 2000 }` must
 * not quietly trim the whole run.
 */
function trimTopicOptions(options: TrimTopicOptions): { runId: string; producedBefore: number | undefined } {
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    const got = options === null ? 'null' : Array.isArray(options) ? 'an array' : typeof options
    throw argumentError(`trimTopic options must be an object with a runId, got ${got}`)
  }
  let names: string[]
  let read: { runId: string; producedBefore: number | Date | undefined }
  try {
    names = Object.keys(options)
    read = { runId: options.runId, producedBefore: options.producedBefore }
  } catch (err) {
    throw argumentError(`reading the trimTopic options threw: ${err instanceof Error ? err.message : String(err)}`, err)
  }
  for (const name of names) {
    if (name !== 'runId' && name !== 'producedBefore') {
      throw argumentError(`unknown trimTopic option ${JSON.stringify(name)} (trimTopic takes runId and producedBefore)`)
    }
  }
  // As typed for the caller; what a JavaScript caller really passed is checked natively.
  const { runId, producedBefore } = read
  return { runId, producedBefore: producedBefore instanceof Date ? producedBefore.getTime() : producedBefore }
}

/**
 * `subscribe`'s options: `group` and `startFrom` (checked natively), and `batch`, which a pubsub
 * without native batching delivers unbatched, as Mastra's own `CachingPubSub` documents. Any
 * other field is refused: `{ grup: 'workers' }` must not quietly become a fan-out subscription,
 * where every process handles every event.
 */
function subscribeOptions(options: SubscribeOptions | undefined | null): {
  group: string | undefined
  startFrom: SubscribeOptions['startFrom']
} {
  if (options === undefined || options === null) return { group: undefined, startFrom: undefined }
  if (typeof options !== 'object' || Array.isArray(options)) {
    throw argumentError(`subscribe options must be an object, got ${Array.isArray(options) ? 'an array' : typeof options}`)
  }
  let names: string[]
  let read: { group: string | undefined; startFrom: SubscribeOptions['startFrom'] }
  try {
    names = Object.keys(options)
    read = { group: options.group, startFrom: options.startFrom }
  } catch (err) {
    throw argumentError(`reading the subscribe options threw: ${err instanceof Error ? err.message : String(err)}`, err)
  }
  for (const name of names) {
    if (name !== 'group' && name !== 'startFrom' && name !== 'batch') {
      throw argumentError(`unknown subscribe option ${JSON.stringify(name)} (subscribe takes group, startFrom and batch)`)
    }
  }
  return read
}

const resolvedExtend = (): Promise<void> => Promise.resolve()

/**
 * Calls a subscriber with `extend` fourth (a callback of three arguments ignores it); a throw
 * or a rejection nacks the event, a return calls `done`.
 */
function invoke(
  cb: EventCallback | ExtendableEventCallback,
  event: Event,
  ack: () => Promise<void>,
  nack: () => Promise<void>,
  extend: () => Promise<void>,
  done: () => unknown = () => {},
): void {
  const failed = () => void nack().catch(() => {})
  try {
    const result = (cb as ExtendableEventCallback)(event, ack, nack, extend)
    if (result && typeof (result as Promise<void>).then === 'function') (result as Promise<void>).then(done, failed)
    else done()
  } catch {
    failed()
  }
}
