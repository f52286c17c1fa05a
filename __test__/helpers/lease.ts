import { randomUUID } from 'node:crypto'
import { afterAll, beforeEach, expect } from 'vitest'

import type { HeldLease } from '../../dist/esm/index.js'

/** The surface both native providers share (what Mastra sees, plus close()). */
export interface LeaseApi {
  acquireLease(key: string, owner: string, ttlMs: number): Promise<{ acquired: boolean; owner?: string }>
  getLeaseOwner(key: string): Promise<string | undefined>
  releaseLease(key: string, owner: string): Promise<void>
  renewLease(key: string, owner: string, ttlMs: number): Promise<boolean>
  transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number): Promise<boolean>
  close(): Promise<void>
}

/** Who holds a lease, as `getLeaseRecord` answers it (this package's lease record). */
export interface LeaseRecordLike {
  owner: string
  metadata?: string
}

/**
 * The providers of this package: Mastra's five methods with this package's metadata (the
 * holder is the owner and its metadata together), `getLeaseRecord`, fenced grants and
 * `getLease`. `acquireFencedLease` and `getLeaseRecord` are optional in the pubsubs' types:
 * they have them as own properties exactly when their lease provider has them.
 */
export interface LeaseRecordApi extends LeaseApi {
  acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<{ acquired: boolean; owner?: string }>
  releaseLease(key: string, owner: string, metadata?: string): Promise<void>
  renewLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean>
  transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): Promise<boolean>
  getLease(key: string): Promise<{ owner: string; token?: number; ttlMs: number | null } | undefined>
  acquireFencedLease?: (key: string, owner: string, ttlMs: number, metadata?: string) => Promise<{ acquired: boolean; owner?: string; token?: number }>
  getLeaseRecord?: (key: string) => Promise<LeaseRecordLike | undefined>
}

/** A `LeaseRecordApi` that has `acquireFencedLease` and `getLeaseRecord` (checked by `complete`). */
export type CompleteLeaseApi = LeaseRecordApi & Required<Pick<LeaseRecordApi, 'acquireFencedLease' | 'getLeaseRecord'>>

/** `provider`, failing unless it has `acquireFencedLease` and `getLeaseRecord` (optional in a pubsub's type). */
export function complete(provider: LeaseRecordApi): CompleteLeaseApi {
  expect(typeof provider.acquireFencedLease, 'acquireFencedLease').toBe('function')
  expect(typeof provider.getLeaseRecord, 'getLeaseRecord').toBe('function')
  return provider as CompleteLeaseApi
}

export interface LeaseLimitsOptions {
  maxKeyBytes?: unknown
  maxOwnerBytes?: unknown
  maxMetadataBytes?: unknown
  maxTtlMs?: unknown
}

export const LEASE_METHODS = ['acquireLease', 'getLeaseOwner', 'releaseLease', 'renewLease', 'transferLease'] as const
export type LeaseMethod = (typeof LEASE_METHODS)[number]
/** The lease methods this package's providers have beyond Mastra's five. */
export const EXTRA_LEASE_METHODS = ['acquireFencedLease', 'getLease', 'getLeaseRecord'] as const

/** The provider seen without its types, to pass what TypeScript would refuse. */
export type Untyped = Record<LeaseMethod | (typeof EXTRA_LEASE_METHODS)[number] | 'close', (...args: unknown[]) => unknown>
export const untyped = (p: LeaseApi): Untyped => p as unknown as Untyped

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms))

/** Every method once, against `key`, as thunks (so each is a fresh call). */
export function everyCall(p: LeaseApi, key: string, ttlMs = 60_000): Array<[string, () => Promise<unknown>]> {
  return [
    ['acquireLease', () => p.acquireLease(key, 'A', ttlMs)],
    ['getLeaseOwner', () => p.getLeaseOwner(key)],
    ['releaseLease', () => p.releaseLease(key, 'A')],
    ['renewLease', () => p.renewLease(key, 'A', ttlMs)],
    ['transferLease', () => p.transferLease(key, 'A', 'B', ttlMs)],
  ]
}

const run = randomUUID().slice(0, 8)
let counter = 0
/** A key no other test (or earlier run against a shared REDIS_URL) uses. */
export const uniqueKey = (label: string) => `test:${run}:${++counter}:${label}`

type ErrorClass = typeof TypeError | typeof RangeError | typeof Error

/**
 * Call `fn` and check it returns a promise (no synchronous throw) that rejects with
 * `cls` and `code`. Returns the error for further checks.
 */
export async function expectRejection(fn: () => unknown, cls: ErrorClass, code: string): Promise<Error & { code?: unknown }> {
  let result: unknown
  try {
    result = fn()
  } catch (err) {
    throw new Error(`expected a rejected promise, but the call threw synchronously: ${String(err)}`)
  }
  expect(result, 'the call must return a promise').toBeInstanceOf(Promise)
  let error: unknown
  const outcome = await (result as Promise<unknown>).then(
    (value) => ({ settled: 'resolved' as const, value }),
    (err: unknown) => {
      error = err
      return { settled: 'rejected' as const }
    },
  )
  expect(outcome, `expected rejection with ${code}`).toEqual({ settled: 'rejected' })
  expect(error).toBeInstanceOf(cls)
  expect((error as { code?: unknown }).code).toBe(code)
  return error as Error & { code?: unknown }
}

/** Run a synchronous constructor call and check it throws `cls` with `code`. */
/** Call `fn` and check it throws `cls` with `code`. Returns the error for further checks. */
export function expectThrow(fn: () => unknown, cls: ErrorClass | ErrorClass[], code: string): Error & { code?: unknown } {
  let error: unknown
  try {
    fn()
  } catch (err) {
    error = err
  }
  expect(error, `expected a synchronous throw with ${code}`).toBeDefined()
  const classes = Array.isArray(cls) ? cls : [cls]
  expect(
    classes.some((c) => error instanceof c),
    `expected ${classes.map((c) => c.name).join(' or ')}, got ${String(error)}`,
  ).toBe(true)
  expect((error as { code?: unknown }).code).toBe(code)
  return error as Error & { code?: unknown }
}

/** Await `p`, failing if it has not settled within `ms`. Returns the outcome and elapsed time. */
export async function settleWithin<T>(
  p: Promise<T>,
  ms: number,
): Promise<{ status: 'fulfilled'; value: T; elapsed: number } | { status: 'rejected'; reason: unknown; elapsed: number }> {
  const start = performance.now()
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<'timeout'>((r) => {
    timer = setTimeout(() => r('timeout'), ms)
  })
  const outcome = await Promise.race([
    p.then(
      (value) => ({ status: 'fulfilled' as const, value }),
      (reason: unknown) => ({ status: 'rejected' as const, reason }),
    ),
    timeout,
  ])
  clearTimeout(timer)
  if (outcome === 'timeout') throw new Error(`call did not settle within ${ms} ms`)
  return { ...outcome, elapsed: performance.now() - start }
}

export const errorCode = (err: unknown): unknown => (err as { code?: unknown } | undefined)?.code

/** A hold() in flight, with when it settled. */
export function pending(hold: Promise<HeldLease>) {
  const state = { settled: false, at: 0, lease: undefined as HeldLease | undefined, error: undefined as unknown }
  const done = hold.then(
    (lease) => Object.assign(state, { settled: true, at: performance.now(), lease }),
    (error: unknown) => Object.assign(state, { settled: true, at: performance.now(), error }),
  )
  return Object.assign(state, { done })
}

/** Mastra's logger shape, as a class (its methods need `this`), keeping what it is told. */
export class CollectingLogger {
  readonly lines: Array<{ level: 'warn' | 'debug'; message: string; fields: Record<string, unknown> | undefined }> = []
  warn(message: string, fields?: Record<string, unknown>): void {
    this.lines.push({ level: 'warn', message, fields })
  }
  debug(message: string, fields?: Record<string, unknown>): void {
    this.lines.push({ level: 'debug', message, fields })
  }
  get warnings() {
    return this.lines.filter((l) => l.level === 'warn')
  }
}

/** What a provider without a logger warns when its lease calls fail (through `process.emitWarning`). */
const LEASE_CALLS_FAILING = 'mastra-lease: lease calls are failing'

/**
 * For a spec file whose tests make lease calls fail on purpose (a server frozen, killed or cut
 * off from its replicas, a wrong password) through providers given no logger. Without a
 * logger the library warns through `process.emitWarning`, which Node prints to stderr, among
 * the passing results; those warnings are kept here instead, for the tests to check. Any
 * other process warning goes to Node as before. Call once at the file's top level, before
 * any provider is made: a provider without a logger takes `process.emitWarning` when it is
 * made. `seen` holds the current test's (it is emptied before each test).
 */
export function leaseFailureWarnings() {
  const seen: Array<{ message: string; code: string | undefined }> = []
  const emitWarning = process.emitWarning
  process.emitWarning = function (warning: string | Error, ...rest: unknown[]) {
    const message = typeof warning === 'string' ? warning : warning.message
    if (!message.startsWith(LEASE_CALLS_FAILING)) return Reflect.apply(emitWarning, process, [warning, ...rest])
    const options = rest[0]
    seen.push({ message, code: typeof options === 'object' && options !== null ? (options as { code?: string }).code : undefined })
  } as typeof process.emitWarning
  beforeEach(() => {
    seen.length = 0
  })
  afterAll(() => {
    process.emitWarning = emitWarning
  })
  return {
    seen,
    /** Resolves once a warning with `code` was seen (warnings arrive a turn or more after the failed call). */
    async warned(code: string, ms = 5_000): Promise<void> {
      const deadline = performance.now() + ms
      while (!seen.some((w) => w.code === code)) {
        if (performance.now() > deadline) throw new Error(`no "${LEASE_CALLS_FAILING}" warning with code ${code} within ${ms} ms; seen: ${JSON.stringify(seen)}`)
        await sleep(20)
      }
    },
  }
}

/**
 * Runs `fn` with process warnings still emitted, so a 'warning' listener the test adds inside
 * `fn` sees them as before, but not printed: the listeners there were (Node's, which writes
 * each one to stderr, among the passing results) are off meanwhile. For a test of the path a
 * warning takes without a logger.
 */
export async function unprintedWarnings<T>(fn: () => Promise<T>): Promise<T> {
  const printers = process.listeners('warning')
  for (const listener of printers) process.off('warning', listener)
  try {
    return await fn()
  } finally {
    for (const listener of printers) process.on('warning', listener)
  }
}
