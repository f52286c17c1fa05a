// hold(): a lease that renews itself and says, through an AbortSignal, the moment it is lost.
// Works over any LeaseProvider; the providers and pubsubs of this package have it as a method.
import type { LeaseProvider } from '@mastra/core/events'

import { coded } from './errors.js'

/** Options of `hold(key, owner, options)` and `holdLease(leases, key, owner, options)`. */
export interface HoldOptions {
  /** The lease's TTL in milliseconds; it is renewed every third of it. */
  ttlMs: number
  /** Stops holding when aborted: the lease is released and `lease.signal` aborts with its reason. */
  signal?: AbortSignal
}

/** A held lease: renewed in the background until released, lost, or the caller's signal aborts. */
export interface HeldLease {
  readonly key: string
  readonly owner: string
  /** The fencing token of the grant (absent without fencing tokens or from another provider). */
  readonly token: number | undefined
  /**
   * Aborts the moment the lease is no longer held, with a coded reason: `ERR_LEASE_LOST` when
   * a renewal found it taken, or renewals kept failing until its TTL could have run out;
   * `ERR_LEASE_RELEASED` after `release()`; the caller's own reason when its signal aborted.
   */
  readonly signal: AbortSignal
  /** Stops renewing and releases the lease (if still held). Idempotent. */
  release(): Promise<void>
  /** `await using lease = await leases.hold(…)` releases it on leaving the scope. */
  [Symbol.asyncDispose](): Promise<void>
}

const HOLD_OPTIONS = new Set(['ttlMs', 'signal'])

/** Checks `options` before any I/O: unknown or unusable options throw ERR_LEASE_INVALID_OPTION. */
function checked(options: HoldOptions): HoldOptions {
  if (options === null || typeof options !== 'object') {
    throw coded(new TypeError('hold: options must be an object with ttlMs'), 'ERR_LEASE_INVALID_OPTION')
  }
  for (const name of Object.keys(options)) {
    if (!HOLD_OPTIONS.has(name)) {
      throw coded(new TypeError(`hold: unknown option ${name} (it takes ttlMs and signal)`), 'ERR_LEASE_INVALID_OPTION')
    }
  }
  const { ttlMs, signal } = options
  if (typeof ttlMs !== 'number') throw coded(new TypeError('hold: ttlMs must be a number'), 'ERR_LEASE_INVALID_OPTION')
  if (!Number.isSafeInteger(ttlMs) || ttlMs < 3) {
    throw coded(new RangeError(`hold: ttlMs must be a whole number of milliseconds, at least 3; got ${ttlMs}`), 'ERR_LEASE_INVALID_OPTION')
  }
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw coded(new TypeError('hold: signal must be an AbortSignal'), 'ERR_LEASE_INVALID_OPTION')
  }
  return { ttlMs, signal }
}

/**
 * Acquires `key` for `owner` through `leases` and keeps it: resolves once granted, rejects
 * with `ERR_LEASE_HELD` (the holder in `owner`) when another owner holds it, with the
 * acquire's own error, or with the caller's abort reason (releasing what was granted).
 * Renews every `ttlMs / 3`. Its timers never keep the process alive.
 */
export async function holdLease(leases: LeaseProvider, key: string, owner: string, options: HoldOptions): Promise<HeldLease> {
  const { ttlMs, signal } = checked(options)
  signal?.throwIfAborted()
  const sent = performance.now()
  const grant = (await leases.acquireLease(key, owner, ttlMs)) as { acquired: boolean; owner?: string; token?: number }
  if (!grant.acquired) {
    throw coded(new Error(`hold: ${JSON.stringify(key)} is held by ${JSON.stringify(grant.owner)}`), 'ERR_LEASE_HELD', { owner: grant.owner })
  }
  const lease = new Holding(leases, key, owner, ttlMs, grant.token, sent)
  if (signal?.aborted) {
    await lease.end(signal.reason)
    throw signal.reason
  }
  // Removed once the lease ends whichever way (the listener's own signal).
  signal?.addEventListener('abort', () => void lease.end(signal.reason).catch(() => {}), { once: true, signal: lease.signal })
  return lease
}

/** A lease being held: the renewal timer, and the deadline by which it is lost unless renewed. */
class Holding implements HeldLease {
  readonly signal: AbortSignal
  private readonly controller = new AbortController()
  private renewal: NodeJS.Timeout | undefined
  private deadline: NodeJS.Timeout | undefined
  /** The renewal in flight, if any: `release()` waits for it, so a release comes after it. */
  private renewing: Promise<void> | undefined
  private released: Promise<void> | undefined

  constructor(
    private readonly leases: LeaseProvider,
    readonly key: string,
    readonly owner: string,
    private readonly ttlMs: number,
    readonly token: number | undefined,
    grantedAt: number,
  ) {
    this.signal = this.controller.signal
    this.confirmed(grantedAt)
    this.schedule()
  }

  /** Held at least until `sentAt + ttlMs` (the call was sent then, so Redis applied it later). */
  private confirmed(sentAt: number): void {
    clearTimeout(this.deadline)
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
      const held = await this.leases.renewLease(this.key, this.owner, this.ttlMs)
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

  /** Stops holding: aborts the signal with `reason`, then releases, after any renewal in flight. */
  end(reason: unknown): Promise<void> {
    this.released ??= (async () => {
      const wasHeld = !this.signal.aborted
      this.stop()
      this.controller.abort(reason)
      await this.renewing
      if (wasHeld) await this.leases.releaseLease(this.key, this.owner)
    })()
    return this.released
  }

  release(): Promise<void> {
    return this.end(coded(new Error(`the lease on ${JSON.stringify(this.key)} was released`), 'ERR_LEASE_RELEASED'))
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.release()
  }
}
