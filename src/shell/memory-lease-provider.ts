import { memoryLeaseTable } from '../../index.js'
import type { LeaseGrant, LeaseState, LeaseStats, MemoryLeaseProviderOptions } from '../../index.js'
import { leaseChannel, tracesItself } from './diagnostics.js'
import { holdLease, type HeldLease, type HoldOptions } from './hold.js'
import { releaseWaiters, Waiters } from './wait.js'

type Table = ReturnType<typeof memoryLeaseTable>

// The table answers synchronously or throws the coded error to reject with; these turn that
// into the promise the provider returns. Each has its own try/catch: a shared helper taking a
// closure measured 8% slower per call. They are plain functions, so a traced call hands them
// to the channel with their arguments, without a closure either.

function acquire(table: Table, key: string, owner: string, ttlMs: number): Promise<LeaseGrant> {
  try {
    // A grant is answered with its token, a refusal with the holder.
    const answer = table.acquireLease(key, owner, ttlMs)
    return Promise.resolve(
      typeof answer === 'number' ? { acquired: true, owner, token: answer } : { acquired: false, owner: answer },
    )
  } catch (error) {
    return Promise.reject(error)
  }
}

function ownerOf(table: Table, key: string): Promise<string | undefined> {
  try {
    return Promise.resolve(table.getLeaseOwner(key))
  } catch (error) {
    return Promise.reject(error)
  }
}

function leaseOf(table: Table, key: string): Promise<LeaseState | undefined> {
  try {
    return Promise.resolve(table.getLease(key))
  } catch (error) {
    return Promise.reject(error)
  }
}

function release(table: Table, key: string, owner: string): Promise<void> {
  try {
    return Promise.resolve(table.releaseLease(key, owner))
  } catch (error) {
    return Promise.reject(error)
  }
}

function renew(table: Table, key: string, owner: string, ttlMs: number): Promise<boolean> {
  try {
    return Promise.resolve(table.renewLease(key, owner, ttlMs))
  } catch (error) {
    return Promise.reject(error)
  }
}

function transfer(table: Table, key: string, fromOwner: string, toOwner: string, ttlMs: number): Promise<boolean> {
  try {
    return Promise.resolve(table.transferLease(key, fromOwner, toOwner, ttlMs))
  } catch (error) {
    return Promise.reject(error)
  }
}

/**
 * Leases in this process's memory: correct for one process (all its async callers), not
 * across processes. The embedded default.
 *
 * Same methods as `RedisLeaseProvider`; calls are answered on the spot by the native table,
 * with no thread hop. Time is a monotonic clock, so wall-clock changes never move a deadline.
 * Bad input and calls after `close()` reject with the same coded errors as on Redis. Every
 * lease call is traced on the `mastra-lease:lease` diagnostics channel.
 */
export class MemoryLeaseProvider {
  // TypeScript-private, not #private: the provider keeps working when called through a Proxy.
  private readonly table: Table
  /** Who waits for a lease in `hold(…, { wait: true })`, made by the first: releases and transfers wake them. */
  private waiters: Waiters | undefined

  /** Throws a `TypeError`/`RangeError` with code `ERR_LEASE_INVALID_OPTION` for bad options. */
  constructor(options?: MemoryLeaseProviderOptions | null) {
    this.table = memoryLeaseTable(options)
  }

  /**
   * Claims `key` for `owner` for `ttlMs`, or refreshes the TTL when `owner` already holds it.
   * Resolves `{ acquired: true, owner, token }` (`token`: the lease's fencing token), or
   * `{ acquired: false, owner: holder }`.
   */
  acquireLease(key: string, owner: string, ttlMs: number): Promise<LeaseGrant> {
    if (!leaseChannel.hasSubscribers) return acquire(this.table, key, owner, ttlMs)
    const context = { operation: 'acquireLease', key, owner, ttlMs } as const
    return leaseChannel.tracePromise(acquire, context, undefined, this.table, key, owner, ttlMs)
  }

  /** The owner holding a live lease on `key`, or `undefined`. */
  getLeaseOwner(key: string): Promise<string | undefined> {
    if (!leaseChannel.hasSubscribers) return ownerOf(this.table, key)
    return leaseChannel.tracePromise(ownerOf, { operation: 'getLeaseOwner', key }, undefined, this.table, key)
  }

  /**
   * The live lease on `key` whole: `{ owner, token, ttlMs }`, or `undefined`. `ttlMs` is
   * never `null` here: every lease in memory has an expiry.
   */
  getLease(key: string): Promise<LeaseState | undefined> {
    if (!leaseChannel.hasSubscribers) return leaseOf(this.table, key)
    return leaseChannel.tracePromise(leaseOf, { operation: 'getLease', key }, undefined, this.table, key)
  }

  /** Releases the lease if `owner` holds it; otherwise does nothing. */
  releaseLease(key: string, owner: string): Promise<void> {
    const released = leaseChannel.hasSubscribers
      ? leaseChannel.tracePromise(release, { operation: 'releaseLease', key, owner } as const, undefined, this.table, key, owner)
      : release(this.table, key, owner)
    // The table answers at once, so the lease is free by now (or was not the owner's).
    this.waiters?.released(key)
    return released
  }

  /**
   * Extends the lease to `ttlMs` from now if `owner` still holds it: `true`; `false` when it
   * was lost. Never brings an expired lease back.
   */
  renewLease(key: string, owner: string, ttlMs: number): Promise<boolean> {
    if (!leaseChannel.hasSubscribers) return renew(this.table, key, owner, ttlMs)
    const context = { operation: 'renewLease', key, owner, ttlMs } as const
    return leaseChannel.tracePromise(renew, context, undefined, this.table, key, owner, ttlMs)
  }

  /**
   * Hands the lease from `fromOwner` to `toOwner` with a fresh `ttlMs`, atomically and
   * without the key ever being free: `true`; `false` when `fromOwner` no longer held it.
   */
  transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number): Promise<boolean> {
    const moved = leaseChannel.hasSubscribers
      ? leaseChannel.tracePromise(
          transfer,
          { operation: 'transferLease', key, owner: fromOwner, toOwner, ttlMs } as const,
          undefined,
          this.table,
          key,
          fromOwner,
          toOwner,
          ttlMs,
        )
      : transfer(this.table, key, fromOwner, toOwner, ttlMs)
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

  /** Its lease calls are traced here, not again by a pubsub delegating to it. */
  get [tracesItself](): true {
    return true
  }
}
