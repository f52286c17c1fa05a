import { memoryLeaseTable } from '../../index.js'
import type { FencedLeaseGrant, LeaseGrant, LeaseRecord, LeaseState, LeaseStats, MemoryLeaseProviderOptions } from '../../index.js'
import { leaseChannel, tracesItself } from './diagnostics.js'
import { holdLease, type HeldLease, type HoldOptions } from './hold.js'
import { releaseWaiters, Waiters } from './wait.js'

type Table = ReturnType<typeof memoryLeaseTable>

// The table answers synchronously or throws the coded error to reject with; these turn that
// into the promise the provider returns. Each has its own try/catch: a shared helper taking a
// closure measured 8% slower per call. They are plain functions, so a traced call hands them
// to the channel with their arguments, without a closure either.

function acquire(table: Table, key: string, owner: string, ttlMs: number, metadata?: string): Promise<LeaseGrant> {
  try {
    // A grant is answered with true, a refusal with the holder's owner.
    const answer = table.acquireLease(key, owner, ttlMs, metadata)
    return Promise.resolve(answer === true ? { acquired: true, owner } : { acquired: false, owner: answer })
  } catch (error) {
    return Promise.reject(error)
  }
}

function acquireFenced(table: Table, key: string, owner: string, ttlMs: number, metadata?: string): Promise<FencedLeaseGrant> {
  try {
    // A grant is answered with its token, a refusal with the holder's owner.
    const answer = table.acquireFencedLease(key, owner, ttlMs, metadata)
    return Promise.resolve(
      typeof answer === 'number' ? { acquired: true, owner, token: answer } : { acquired: false, owner: answer, token: undefined },
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

function recordOf(table: Table, key: string): Promise<LeaseRecord | undefined> {
  try {
    return Promise.resolve(table.getLeaseRecord(key))
  } catch (error) {
    return Promise.reject(error)
  }
}

function release(table: Table, key: string, owner: string, metadata?: string): Promise<void> {
  try {
    return Promise.resolve(table.releaseLease(key, owner, metadata))
  } catch (error) {
    return Promise.reject(error)
  }
}

function renew(table: Table, key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean> {
  try {
    return Promise.resolve(table.renewLease(key, owner, ttlMs, metadata))
  } catch (error) {
    return Promise.reject(error)
  }
}

function transfer(
  table: Table,
  key: string,
  fromOwner: string,
  toOwner: string,
  ttlMs: number,
  fromMetadata?: string,
  toMetadata?: string,
): Promise<boolean> {
  try {
    return Promise.resolve(table.transferLease(key, fromOwner, toOwner, ttlMs, fromMetadata, toMetadata))
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
   * Claims `key` for `owner` (holding with `metadata`, when given) for `ttlMs`, or refreshes
   * the TTL when that holder already holds it. Resolves `{ acquired: true, owner }`, or
   * `{ acquired: false, owner }` with the holder's owner (the caller's own, holding with other
   * metadata, refuses too). No fencing token: `acquireFencedLease` for one.
   */
  acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<LeaseGrant> {
    if (!leaseChannel.hasSubscribers) return acquire(this.table, key, owner, ttlMs, metadata)
    const context = { operation: 'acquireLease', key, owner, ttlMs, metadata } as const
    return leaseChannel.tracePromise(acquire, context, undefined, this.table, key, owner, ttlMs, metadata)
  }

  /**
   * `acquireLease` with a fencing token: `{ acquired: true, owner, token }` (`token` greater
   * than every token granted before for the key; a refresh keeps the lease's, or takes one if
   * it had none), or `{ acquired: false, owner, token: undefined }`.
   */
  acquireFencedLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<FencedLeaseGrant> {
    if (!leaseChannel.hasSubscribers) return acquireFenced(this.table, key, owner, ttlMs, metadata)
    const context = { operation: 'acquireFencedLease', key, owner, ttlMs, metadata } as const
    return leaseChannel.tracePromise(acquireFenced, context, undefined, this.table, key, owner, ttlMs, metadata)
  }

  /** The owner holding a live lease on `key`, or `undefined`. */
  getLeaseOwner(key: string): Promise<string | undefined> {
    if (!leaseChannel.hasSubscribers) return ownerOf(this.table, key)
    return leaseChannel.tracePromise(ownerOf, { operation: 'getLeaseOwner', key }, undefined, this.table, key)
  }

  /** Who holds the live lease on `key`: `{ owner, metadata? }`, or `undefined`. */
  getLeaseRecord(key: string): Promise<LeaseRecord | undefined> {
    if (!leaseChannel.hasSubscribers) return recordOf(this.table, key)
    return leaseChannel.tracePromise(recordOf, { operation: 'getLeaseRecord', key }, undefined, this.table, key)
  }

  /**
   * The live lease on `key` whole: `{ owner, token, ttlMs }`, or `undefined`. `ttlMs` is
   * never `null` here: every lease in memory has an expiry.
   */
  getLease(key: string): Promise<LeaseState | undefined> {
    if (!leaseChannel.hasSubscribers) return leaseOf(this.table, key)
    return leaseChannel.tracePromise(leaseOf, { operation: 'getLease', key }, undefined, this.table, key)
  }

  /** Releases the lease if `owner` holds it with `metadata` (none when left out); otherwise does nothing. */
  releaseLease(key: string, owner: string, metadata?: string): Promise<void> {
    const released = leaseChannel.hasSubscribers
      ? leaseChannel.tracePromise(release, { operation: 'releaseLease', key, owner, metadata } as const, undefined, this.table, key, owner, metadata)
      : release(this.table, key, owner, metadata)
    // The table answers at once, so the lease is free by now (or was not the holder's).
    this.waiters?.released(key)
    return released
  }

  /**
   * Extends the lease to `ttlMs` from now if `owner` still holds it with `metadata` (none
   * when left out): `true`; `false` when it was lost. Never brings an expired lease back.
   */
  renewLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean> {
    if (!leaseChannel.hasSubscribers) return renew(this.table, key, owner, ttlMs, metadata)
    const context = { operation: 'renewLease', key, owner, ttlMs, metadata } as const
    return leaseChannel.tracePromise(renew, context, undefined, this.table, key, owner, ttlMs, metadata)
  }

  /**
   * Hands the lease from `fromOwner` (holding with `fromMetadata`) to `toOwner` (with
   * `toMetadata`) with a fresh `ttlMs`, atomically and without the key ever being free:
   * `true`; `false` when the old holder no longer held it.
   */
  transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): Promise<boolean> {
    const moved = leaseChannel.hasSubscribers
      ? leaseChannel.tracePromise(
          transfer,
          { operation: 'transferLease', key, owner: fromOwner, toOwner, ttlMs, metadata: fromMetadata, toMetadata } as const,
          undefined,
          this.table,
          key,
          fromOwner,
          toOwner,
          ttlMs,
          fromMetadata,
          toMetadata,
        )
      : transfer(this.table, key, fromOwner, toOwner, ttlMs, fromMetadata, toMetadata)
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
