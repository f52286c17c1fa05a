// hold(): a lease that renews itself and says, through an AbortSignal, the moment it is lost.
// Works over any LeaseProvider; the providers and pubsubs of this package have it as a method.
import type { LeaseProvider } from '@mastra/core/events'

import { coded, notLeaseProvider } from './errors.js'
import { waitersOf, type Place } from './wait.js'

/** Options of `hold(key, owner, options)` and `holdLease(leases, key, owner, options)`. */
export interface HoldOptions {
  /** The lease's TTL in milliseconds; it is renewed every third of it. */
  ttlMs: number
  /**
   * Stops waiting or holding when aborted: `hold()` rejects with its reason, or the lease is
   * released and `lease.signal` aborts with it. A release that cannot reach Redis is tried
   * again until it lands or the TTL could have run out; `lease.release()` tells how it went.
   */
  signal?: AbortSignal | undefined
  /**
   * When another owner holds the lease, wait for it instead of rejecting: woken when it is
   * released or transferred (a Redis publish, or in memory the call itself), and at the
   * latest when its TTL runs out; never a polling loop. A lease without an expiry (written
   * by another client without one) is looked at again every `ttlMs`, since its deletion or a
   * `PEXPIRE` by that client publishes nothing. Waiters in one process take turns in arrival
   * order. Default `false`.
   */
  wait?: boolean | undefined
  /** With `wait`: reject with `ERR_LEASE_HELD` when still held after this many milliseconds. Default: no limit. */
  waitTimeoutMs?: number | undefined
  /**
   * The metadata to hold the lease with (Mastra passes a run's identity): the holder is the
   * owner with it, so the same owner id holding for another run is another holder. Every
   * acquire, renewal and release of the hold carries it. Default: none.
   */
  metadata?: string | undefined
}

/** A held lease: renewed in the background until released, lost, or the caller's signal aborts. */
export interface HeldLease {
  readonly key: string
  readonly owner: string
  /** The metadata it is held with, if any. */
  readonly metadata: string | undefined
  /**
   * The fencing token of the grant: the provider's `acquireFencedLease` takes it (absent
   * from a provider without one, not this package's).
   */
  readonly token: number | undefined
  /**
   * Aborts the moment the lease is no longer held, with a coded reason: `ERR_LEASE_LOST` when
   * a renewal found it taken, or renewals kept failing until its TTL could have run out;
   * `ERR_LEASE_RELEASED` after `release()`; the caller's own reason when its signal aborted.
   */
  readonly signal: AbortSignal
  /**
   * Stops renewing and releases the lease (if still held): resolves once the release reached
   * Redis, or when there was nothing to release (lost, or released already: a release that
   * landed is not sent again). Rejects with the call's error when it could not reach Redis
   * (`ERR_LEASE_TIMEOUT`, `ERR_LEASE_CONNECTION`): the lease is still held until its TTL runs
   * out, and a later `release()` sends the release again. After the caller's signal aborted,
   * the lease is released in the background, tried again until Redis answers or its TTL could
   * have run out; `release()` then answers how that went, rejecting with the last attempt's
   * error if none landed in time.
   */
  release(): Promise<void>
  /** `await using lease = await leases.hold(…)` releases it on leaving the scope. */
  [Symbol.asyncDispose](): Promise<void>
}

const HOLD_OPTIONS = new Set(['ttlMs', 'signal', 'wait', 'waitTimeoutMs', 'metadata'])

/**
 * Checks `options` before any I/O: unknown or unusable options throw ERR_LEASE_INVALID_OPTION;
 * a `ttlMs` or `metadata` that is not one throws the code a lease method gives it
 * (ERR_LEASE_INVALID_TTL, ERR_LEASE_INVALID_METADATA), as do their ranges, which the provider
 * checks.
 */
function checked(options: HoldOptions): HoldOptions {
  if (options === null || typeof options !== 'object') {
    throw coded(new TypeError('hold: options must be an object with ttlMs'), 'ERR_LEASE_INVALID_OPTION')
  }
  let names: string[]
  let read: HoldOptions
  try {
    names = Object.keys(options)
    read = {
      ttlMs: options.ttlMs,
      signal: options.signal,
      wait: options.wait,
      waitTimeoutMs: options.waitTimeoutMs,
      metadata: options.metadata,
    }
  } catch (err) {
    const message = `hold: reading the options threw: ${err instanceof Error ? err.message : String(err)}`
    throw coded(new TypeError(message, { cause: err }), 'ERR_LEASE_INVALID_OPTION')
  }
  for (const name of names) {
    if (!HOLD_OPTIONS.has(name)) {
      throw coded(new TypeError(`hold: unknown option ${name} (it takes ttlMs, signal, wait, waitTimeoutMs and metadata)`), 'ERR_LEASE_INVALID_OPTION')
    }
  }
  const { ttlMs, signal, wait, waitTimeoutMs, metadata } = read
  if (typeof ttlMs !== 'number') throw coded(new TypeError('hold: ttlMs must be a number'), 'ERR_LEASE_INVALID_TTL')
  if (!Number.isSafeInteger(ttlMs) || ttlMs < 3) {
    throw coded(new RangeError(`hold: ttlMs must be a whole number of milliseconds, at least 3; got ${ttlMs}`), 'ERR_LEASE_INVALID_TTL')
  }
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw coded(new TypeError('hold: signal must be an AbortSignal'), 'ERR_LEASE_INVALID_OPTION')
  }
  if (wait !== undefined && typeof wait !== 'boolean') {
    throw coded(new TypeError('hold: wait must be a boolean'), 'ERR_LEASE_INVALID_OPTION')
  }
  if (waitTimeoutMs !== undefined) {
    if (wait !== true) {
      throw coded(new TypeError('hold: waitTimeoutMs is for waiting: set wait: true as well'), 'ERR_LEASE_INVALID_OPTION')
    }
    if (typeof waitTimeoutMs !== 'number') {
      throw coded(new TypeError('hold: waitTimeoutMs must be a number'), 'ERR_LEASE_INVALID_OPTION')
    }
    if (!Number.isSafeInteger(waitTimeoutMs) || waitTimeoutMs < 0) {
      throw coded(new RangeError(`hold: waitTimeoutMs must be a whole number of milliseconds, 0 or more; got ${waitTimeoutMs}`), 'ERR_LEASE_INVALID_OPTION')
    }
  }
  // Its size and content are the provider's to check, as for any metadata it is given.
  if (metadata !== undefined && typeof metadata !== 'string') {
    throw coded(new TypeError('hold: metadata must be a string'), 'ERR_LEASE_INVALID_METADATA')
  }
  return { ttlMs, signal, wait, waitTimeoutMs, metadata }
}

/** A grant as this package's providers answer it (a fenced one with its token). */
type Grant = { acquired: boolean; owner?: string; token?: number }

/** Mastra's lease methods, with each holder's metadata (this package's lease records). */
type Holdable = LeaseProvider & {
  acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<Grant>
  acquireFencedLease?(key: string, owner: string, ttlMs: number, metadata?: string): Promise<Grant>
  renewLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean>
  releaseLease(key: string, owner: string, metadata?: string): Promise<void>
}

/** A provider that can say how long a lease has left (this package's providers and pubsubs). */
type Readable = Holdable & { getLease(key: string): Promise<{ ttlMs: number | null } | undefined> }

/** One acquire of a hold: fenced where the provider can (this package's), plain otherwise. */
function acquire(leases: Holdable, key: string, owner: string, options: HoldOptions): Promise<Grant> {
  const { ttlMs, metadata } = options
  // A method call on the provider itself, so `this` is right through a Proxy too.
  return typeof leases.acquireFencedLease === 'function'
    ? leases.acquireFencedLease(key, owner, ttlMs, metadata)
    : leases.acquireLease(key, owner, ttlMs, metadata)
}

/** The error for a lease another owner holds. */
function held(key: string, holder: string | undefined, after?: number): Error {
  const waited = after === undefined ? '' : ` (still, after waiting ${after} ms)`
  return coded(new Error(`hold: ${JSON.stringify(key)} is held by ${JSON.stringify(holder)}${waited}`), 'ERR_LEASE_HELD', { owner: holder })
}

/**
 * Acquires `key` for `owner`, waiting while another owner holds it: in `place`'s turn, again
 * at each wake-up of the key and when the holder's TTL runs out. Resolves the grant and when
 * its acquire was sent; rejects with `ERR_LEASE_HELD` after `waitTimeoutMs`, or with the
 * signal's reason or a call's error.
 */
async function acquireWaiting(
  leases: Readable,
  place: Place,
  key: string,
  owner: string,
  options: HoldOptions,
): Promise<{ grant: Grant; sent: number }> {
  const { ttlMs, signal, waitTimeoutMs } = options
  const deadline = waitTimeoutMs === undefined ? Infinity : performance.now() + waitTimeoutMs
  for (;;) {
    const left = deadline - performance.now()
    // Past the deadline, one last look even out of turn: the refusal names the holder.
    if (left > 0) await place.turn(left, signal)
    const wakes = place.wakes
    const sent = performance.now()
    const grant = await acquire(leases, key, owner, options)
    if (grant.acquired) return { grant, sent }
    if (performance.now() >= deadline) throw held(key, grant.owner, waitTimeoutMs)
    const lease = await leases.getLease(key)
    // Freed, or woken, since the refusal: look again at once.
    if (lease === undefined || place.wakes !== wakes) continue
    // Its TTL rounded down to the millisecond: one more and it has surely run out. A lease
    // without an expiry ends only by a release, which publishes, or by another client's DEL
    // or PEXPIRE, which does not: so look again every `ttlMs` of our own, as cheap as a holder.
    const look = lease.ttlMs === null ? ttlMs : lease.ttlMs + 1
    await place.until(Math.min(look, deadline - performance.now()), signal)
  }
}

/**
 * What `holdLease` takes: a lease provider, or a pubsub that hands one out through
 * `getLeaseProvider()` (Mastra's `CachingPubSub`, say), resolved as Mastra resolves it.
 */
export type LeaseSource = LeaseProvider | { getLeaseProvider(): LeaseProvider | undefined }

/**
 * The provider Mastra would use: `getLeaseProvider()`'s answer when there is one, else the
 * value itself (Mastra's `resolveLeaseProvider`, without its no-op fallback).
 */
function leaseProviderOf(source: unknown): unknown {
  const get = (source as { getLeaseProvider?: unknown } | null | undefined)?.getLeaseProvider
  return (typeof get === 'function' ? (get.call(source) as unknown) : undefined) ?? source
}

/**
 * Acquires `key` for `owner` through `source` (see `LeaseSource`) and keeps it: resolves once granted, rejects
 * with `ERR_LEASE_HELD` (the holder in `owner`) when another owner holds it, with the
 * acquire's own error, or with the caller's abort reason (releasing what was granted).
 * With `wait`, waits for the lease instead (see `HoldOptions.wait`); a provider that cannot
 * tell waiters about releases (not one of this package's) rejects with
 * `ERR_LEASE_UNSUPPORTED` before any call. Renews every `ttlMs / 3`. The renewal timers never
 * keep the process alive; a wait's do, as the caller awaits it.
 */
export async function holdLease(source: LeaseSource, key: string, owner: string, options: HoldOptions): Promise<HeldLease> {
  const leases = leaseProviderOf(source) as LeaseProvider
  const notProvider = notLeaseProvider(leases, 'hold: leases')
  if (notProvider) throw notProvider
  const checkedOptions = checked(options)
  const { ttlMs, signal, wait } = checkedOptions
  const waiters = wait === true ? waitersOf(leases) : undefined
  if (wait === true && waiters === undefined) {
    const error = new TypeError('hold: wait needs a provider that tells waiters about releases (one of this package\'s)')
    throw coded(error, 'ERR_LEASE_UNSUPPORTED')
  }
  signal?.throwIfAborted()
  let grant: Grant
  let sent: number
  if (waiters === undefined) {
    sent = performance.now()
    grant = await acquire(leases as Holdable, key, owner, checkedOptions)
    if (!grant.acquired) throw held(key, grant.owner)
  } else {
    const place = await waiters.join(key)
    try {
      ;({ grant, sent } = await acquireWaiting(leases as Readable, place, key, owner, checkedOptions))
    } finally {
      place.leave()
    }
  }
  const lease = new Holding(leases as Holdable, key, owner, ttlMs, checkedOptions.metadata, grant.token, sent)
  if (signal?.aborted) {
    await lease.abandon(signal.reason)
    throw signal.reason
  }
  // Removed once the lease ends whichever way (the listener's own signal).
  signal?.addEventListener('abort', () => void lease.abandon(signal.reason), { once: true, signal: lease.signal })
  return lease
}

/** Pauses between the attempts of a release the caller's signal asked for. */
const RETRY_MIN_MS = 100
const RETRY_MAX_MS = 1_000

/** A lease being held: the renewal timer, and the deadline by which it is lost unless renewed. */
class Holding implements HeldLease {
  readonly signal: AbortSignal
  private readonly controller = new AbortController()
  private renewal: NodeJS.Timeout | undefined
  private deadline: NodeJS.Timeout | undefined
  /** The renewal in flight, if any: `release()` waits for it, so a release comes after it. */
  private renewing: Promise<void> | undefined
  /** Until a release landed: the lease may still be held under this owner. */
  private owed = false
  /** The release call in flight, shared by the callers that meanwhile ask for one. */
  private releasing: Promise<void> | undefined
  /** The signal's release, tried again until it lands or the TTL could have run out. */
  private retrying: Promise<void> | undefined
  /**
   * Until when the last grant or renewal that landed holds the lease at least (Redis counts
   * the TTL from when it ran the call, a little later): past it, the TTL could have run out.
   */
  private heldUntil: number

  constructor(
    private readonly leases: Holdable,
    readonly key: string,
    readonly owner: string,
    private readonly ttlMs: number,
    readonly metadata: string | undefined,
    readonly token: number | undefined,
    grantedAt: number,
  ) {
    this.signal = this.controller.signal
    this.heldUntil = grantedAt + ttlMs
    this.confirmed(grantedAt)
    this.schedule()
  }

  /** Held at least until `sentAt + ttlMs` (the call was sent then, so Redis applied it later). */
  private confirmed(sentAt: number): void {
    clearTimeout(this.deadline)
    this.heldUntil = sentAt + this.ttlMs
    const left = sentAt + this.ttlMs - performance.now()
    this.deadline = setTimeout(() => this.lost('renewals failed until its TTL could have run out'), Math.max(0, left)).unref()
  }

  private schedule(): void {
    this.renewal = setTimeout(() => {
      this.renewing = this.renew().finally(() => (this.renewing = undefined))
    }, Math.max(1, Math.floor(this.ttlMs / 3))).unref()
  }

  private async renew(): Promise<void> {
    if (this.signal.aborted) return
    const sent = performance.now()
    try {
      const held = await this.leases.renewLease(this.key, this.owner, this.ttlMs, this.metadata)
      if (this.signal.aborted) return
      if (!held) return this.lost('a renewal found it taken')
      this.confirmed(sent)
    } catch {
      // A failed renewal is retried on schedule; the deadline says when the lease is lost.
      if (this.signal.aborted) return
    }
    this.schedule()
  }

  private lost(why: string): void {
    if (this.signal.aborted) return
    this.stop()
    const reason = coded(new Error(`the lease on ${JSON.stringify(this.key)} is lost: ${why}`), 'ERR_LEASE_LOST')
    this.controller.abort(reason)
  }

  private stop(): void {
    clearTimeout(this.renewal)
    clearTimeout(this.deadline)
  }

  /** Stops holding: aborts the signal with `reason`; a lease still held is owed a release. */
  private end(reason: unknown): void {
    if (this.signal.aborted) return
    this.owed = true
    this.stop()
    this.controller.abort(reason)
  }

  /**
   * One release call, after any renewal in flight; callers meanwhile share it. Once one
   * landed, nothing is sent again; one that failed leaves the release owed.
   */
  private send(): Promise<void> {
    if (!this.owed) return Promise.resolve()
    this.releasing ??= (async () => {
      try {
        await this.renewing
        await this.leases.releaseLease(this.key, this.owner, this.metadata)
        this.owed = false
      } finally {
        this.releasing = undefined
      }
    })()
    return this.releasing
  }

  /**
   * Ends the hold for the caller's signal, whom no error can reach: releases, and while
   * Redis does not answer, tries again with backoff until it does or the TTL could have run
   * out (Redis then expires the lease by itself). Resolves after the first attempt, whatever
   * came of it; `release()` tells the rest. Its timers never keep the process alive.
   */
  abandon(reason: unknown): Promise<void> {
    this.end(reason)
    if (this.retrying) return this.retrying.catch(() => {})
    const first = this.send()
    const retrying = (async () => {
      let pause = RETRY_MIN_MS
      for (let attempt: Promise<void> = first; ; attempt = this.send()) {
        try {
          return await attempt
        } catch (err) {
          if (performance.now() + pause >= this.heldUntil) throw err
        }
        await new Promise((resolve) => setTimeout(resolve, pause).unref())
        pause = Math.min(pause * 2, RETRY_MAX_MS)
      }
    })()
    // Its outcome is release()'s to tell; once known, a later release() sends anew if owed.
    this.retrying = retrying
    retrying.then(
      () => (this.retrying = undefined),
      () => (this.retrying = undefined),
    )
    return first.catch(() => {})
  }

  release(): Promise<void> {
    this.end(coded(new Error(`the lease on ${JSON.stringify(this.key)} was released`), 'ERR_LEASE_RELEASED'))
    return this.retrying ?? this.send()
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.release()
  }
}
