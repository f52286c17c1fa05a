import { memoryLeaseTable } from './native.js'
import type { FencedLeaseGrant, LeaseGrant, LeaseRecord, LeaseState, LeaseStats, MemoryLeaseProviderOptions } from './native.js'
import { traced } from './diagnostics.js'
import { holdLease, type HeldLease, type HoldOptions } from './hold.js'
import { releaseWaiters, Waiters } from './wait.js'

type Table = ReturnType<typeof memoryLeaseTable>

/** How often expired leases nobody touches are swept out of the table. */
const SWEEP_EVERY_MS = 250

/**
 * Sweeps `table` every `SWEEP_EVERY_MS` on this thread, where its calls run too (so it needs
 * no lock); a round that leaves more due is followed by another once other work has run.
 * Holds the table weakly, so a provider dropped without `close()` is still collected. Keeps
 * the process alive only while a backlog is being swept: an unref'd immediate would wait
 * for the loop's next timer.
 */
function sweepEvery(table: Table): ReturnType<typeof setInterval> {
  const weak = new WeakRef(table)
  const sweep = (): void => {
    const live = weak.deref()
    if (live === undefined) clearInterval(timer)
    else if (live.sweep()) setImmediate(sweep)
  }
  const timer = setInterval(sweep, SWEEP_EVERY_MS).unref()
  return timer
}

// The table answers synchronously or throws the coded error to reject with; these turn that
// into the promise the provider returns. Each has its own try/catch: a shared helper taking a
// closure is slower per call. They take the table as `this`, so the tracer calls them as it
// calls any provider's methods, without a closure either.

// A settled promise never changes, so the answers that carry no object (a renewal's or a
// transfer's boolean, a release's nothing) share one each instead of making a promise per call
// (docs/benchmarks.md, "sixth round").
const settled = { true: Promise.resolve(true), false: Promise.resolve(false), nothing: Promise.resolve() } as const

/**
 * The grant of an acquire as the table answers it, granted (`true`, or a fenced acquire's
 * token) or refused (the holder's owner): the one place the shell makes one. A fenced grant
 * always has `token`, a plain one never.
 */
function grant(answer: true | number | string, owner: string, fenced: boolean): FencedLeaseGrant {
  if (typeof answer === 'string') return fenced ? { acquired: false, owner: answer, token: undefined } : { acquired: false, owner: answer }
  return fenced ? { acquired: true, owner, token: answer as number } : { acquired: true, owner }
}

function acquire(this: Table, key: string, owner: string, ttlMs: number, metadata?: string): Promise<LeaseGrant> {
  try {
    return Promise.resolve(grant(this.acquireLease(key, owner, ttlMs, metadata), owner, false))
  } catch (error) {
    return Promise.reject(error)
  }
}

function acquireFenced(this: Table, key: string, owner: string, ttlMs: number, metadata?: string): Promise<FencedLeaseGrant> {
  try {
    return Promise.resolve(grant(this.acquireFencedLease(key, owner, ttlMs, metadata), owner, true))
  } catch (error) {
    return Promise.reject(error)
  }
}

function ownerOf(this: Table, key: string): Promise<string | undefined> {
  try {
    return Promise.resolve(this.getLeaseOwner(key))
  } catch (error) {
    return Promise.reject(error)
  }
}

function leaseOf(this: Table, key: string): Promise<LeaseState | undefined> {
  try {
    return Promise.resolve(this.getLease(key))
  } catch (error) {
    return Promise.reject(error)
  }
}

function recordOf(this: Table, key: string): Promise<LeaseRecord | undefined> {
  try {
    return Promise.resolve(this.getLeaseRecord(key))
  } catch (error) {
    return Promise.reject(error)
  }
}

function release(this: Table, key: string, owner: string, metadata?: string): Promise<void> {
  try {
    this.releaseLease(key, owner, metadata)
    return settled.nothing
  } catch (error) {
    return Promise.reject(error)
  }
}

function renew(this: Table, key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean> {
  try {
    return this.renewLease(key, owner, ttlMs, metadata) ? settled.true : settled.false
  } catch (error) {
    return Promise.reject(error)
  }
}

function transfer(
  this: Table,
  key: string,
  fromOwner: string,
  toOwner: string,
  ttlMs: number,
  fromMetadata?: string,
  toMetadata?: string,
): Promise<boolean> {
  try {
    return this.transferLease(key, fromOwner, toOwner, ttlMs, fromMetadata, toMetadata) ? settled.true : settled.false
  } catch (error) {
    return Promise.reject(error)
  }
}

/**
 * Leases in this process's memory: correct for one process (all its async callers), not
 * across processes. The embedded default.
 *
 * Same methods as `RedisLeaseProvider`; calls are answered on the spot by the native table,
 * with no thread hop. Time is a monotonic clock, so wall-clock changes never move a deadline;
 * or, with `options.clock` (`() => Date.now()`), the clock a test's fake timers move, so a
 * lease expires as the test advances it (docs/testing.md).
 * Bad input and calls after `close()` reject with the same coded errors as on Redis. Every
 * lease call is traced on the `mastra-lease:lease` diagnostics channel.
 */
export class MemoryLeaseProvider {
  // TypeScript-private, not #private: the provider keeps working when called through a Proxy.
  private readonly table: Table
  /** Who waits for a lease in `hold(…, { wait: true })`, made by the first: releases and transfers wake them. */
  private waiters: Waiters | undefined
  private readonly sweeping: ReturnType<typeof setInterval>

  /** Throws a `TypeError`/`RangeError` with code `ERR_LEASE_INVALID_OPTION` for bad options. */
  constructor(options?: MemoryLeaseProviderOptions | null) {
    this.table = memoryLeaseTable(options)
    this.sweeping = sweepEvery(this.table)
  }

  /**
   * Claims `key` for `owner` (holding with `metadata`, when given) for `ttlMs`, or refreshes
   * the TTL when that holder already holds it. Resolves `{ acquired: true, owner }`, or
   * `{ acquired: false, owner }` with the holder's owner (the caller's own, holding with other
   * metadata, refuses too). No fencing token: `acquireFencedLease` for one.
   */
  acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<LeaseGrant> {
    return traced.acquireLease(acquire, this.table, key, owner, ttlMs, metadata)
  }

  /**
   * `acquireLease` with a fencing token: `{ acquired: true, owner, token }` (`token` greater
   * than every token granted before for the key; a refresh keeps the lease's, or takes one if
   * it had none), or `{ acquired: false, owner, token: undefined }`.
   */
  acquireFencedLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<FencedLeaseGrant> {
    return traced.acquireFencedLease(acquireFenced, this.table, key, owner, ttlMs, metadata)
  }

  /** The owner holding a live lease on `key`, or `undefined`. */
  getLeaseOwner(key: string): Promise<string | undefined> {
    return traced.getLeaseOwner(ownerOf, this.table, key)
  }

  /** Who holds the live lease on `key`: `{ owner, metadata? }`, or `undefined`. */
  getLeaseRecord(key: string): Promise<LeaseRecord | undefined> {
    return traced.getLeaseRecord(recordOf, this.table, key)
  }

  /**
   * The live lease on `key` whole: `{ owner, token, ttlMs }`, or `undefined`. `ttlMs` is
   * never `null` here: every lease in memory has an expiry.
   */
  getLease(key: string): Promise<LeaseState | undefined> {
    return traced.getLease(leaseOf, this.table, key)
  }

  /** Releases the lease if `owner` holds it with `metadata` (none when left out); otherwise does nothing. */
  releaseLease(key: string, owner: string, metadata?: string): Promise<void> {
    const released = traced.releaseLease(release, this.table, key, owner, metadata)
    // The table answers at once, so the lease is free by now (or was not the holder's).
    this.waiters?.released(key)
    return released
  }

  /**
   * Extends the lease to `ttlMs` from now if `owner` still holds it with `metadata` (none
   * when left out): `true`; `false` when it was lost. Never brings an expired lease back.
   */
  renewLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean> {
    return traced.renewLease(renew, this.table, key, owner, ttlMs, metadata)
  }

  /**
   * Hands the lease from `fromOwner` (holding with `fromMetadata`) to `toOwner` (with
   * `toMetadata`) with a fresh `ttlMs`, atomically and without the key ever being free:
   * `true`; `false` when the old holder no longer held it.
   */
  transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): Promise<boolean> {
    const moved = traced.transferLease(transfer, this.table, key, fromOwner, toOwner, ttlMs, fromMetadata, toMetadata)
    this.waiters?.released(key)
    return moved
  }

  /**
   * What this provider's lease calls came to since it was made (closed or not); see
   * `LeaseStats`.
   */
  stats(): LeaseStats {
    return this.table.stats()
  }

  /**
   * Resolves 0 (milliseconds: there is no server to reach), or rejects with
   * `ERR_LEASE_CLOSED` once closed; the same health check as `RedisLeaseProvider`'s.
   */
  ping(): Promise<number> {
    try {
      return Promise.resolve(this.table.ping())
    } catch (error) {
      return Promise.reject(error)
    }
  }

  /** Leases resident in memory, expired ones not yet swept included (0 once closed). */
  get size(): number {
    return this.table.size()
  }

  /** Drops every lease and stops taking calls; later calls reject with `ERR_LEASE_CLOSED`. Idempotent. */
  close(): Promise<void> {
    clearInterval(this.sweeping)
    this.table.close()
    this.waiters?.closed()
    return Promise.resolve()
  }

  /**
   * Acquires `key` for `owner` and keeps it, renewed every `ttlMs / 3`, until released, lost
   * or `options.signal` aborts; `lease.signal` aborts the moment it is lost (see `HeldLease`).
   * Rejects with `ERR_LEASE_HELD` when another owner holds it.
   */
  hold(key: string, owner: string, options: HoldOptions): Promise<HeldLease> {
    return holdLease(this, key, owner, options)
  }

  /** The waiters of `hold(…, { wait: true })`, woken by this provider's releases and transfers. */
  get [releaseWaiters](): Waiters {
    return (this.waiters ??= new Waiters())
  }
}
