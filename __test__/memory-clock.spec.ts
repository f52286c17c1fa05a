// MemoryLeaseProvider's `clock` option under vitest's fake timers: leases, renewals, fencing
// tokens, hold() and waiting, and the sweep follow the test's clock, as Mastra's own in-memory
// leases (EventEmitterPubSub's, which read Date.now()) do; what a clock set back or a clock
// that fails does. The same under Jest: jest.spec.ts.
import { EventEmitterPubSub } from '@mastra/core/events'
import { afterEach, describe, expect, it, vi } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub } from '../dist/esm/index.js'
import { besideMastra, fencingScript, LEASE_SCRIPT_ANSWERS } from './fixtures/fake-clock-script.cjs'
import { closing, leaseSuite } from './helpers/lease-runs.js'

leaseSuite()
afterEach(() => {
  vi.useRealTimers()
})

/** A provider whose leases follow `Date.now()`, the clock vitest's fake timers move. */
const followingDate = () => closing(new MemoryLeaseProvider({ clock: () => Date.now() }))

const YEAR_MS = 365 * 24 * 3600 * 1000

/** Whether `promise` has settled by now (after the microtasks queued so far). */
async function settled(promise: Promise<unknown>): Promise<boolean> {
  let done = false
  promise.then(
    () => (done = true),
    () => (done = true),
  )
  await Promise.resolve()
  await Promise.resolve()
  return done
}

describe('MemoryLeaseProvider({ clock: () => Date.now() }) under vitest’s fake timers', () => {
  it('a lease expires when vi.advanceTimersByTime passes its TTL and not before; renewals, refusals and transfers follow the fake clock, answering as Mastra’s EventEmitterPubSub does', async () => {
    vi.useFakeTimers()
    const advance = (ms: number) => vi.advanceTimersByTimeAsync(ms)
    const { ours, mastras } = await besideMastra(followingDate(), new EventEmitterPubSub(), advance)
    expect(ours).toEqual(LEASE_SCRIPT_ANSWERS)
    expect(mastras).toEqual(LEASE_SCRIPT_ANSWERS)
  })

  it('vi.setSystemTime moves it the same way, with no timer run', async () => {
    vi.useFakeTimers()
    const advance = (ms: number) => vi.setSystemTime(Date.now() + ms)
    const { ours, mastras } = await besideMastra(followingDate(), new EventEmitterPubSub(), advance)
    expect(ours).toEqual(LEASE_SCRIPT_ANSWERS)
    expect(mastras).toEqual(LEASE_SCRIPT_ANSWERS)
  })

  it('a fenced lease that expired in fake time goes to the next owner with a greater token, and the old holder’s renewal finds it lost', async () => {
    vi.useFakeTimers()
    const fencing = await fencingScript(followingDate(), (ms) => vi.advanceTimersByTimeAsync(ms))
    expect(fencing).toMatchObject({ first: { acquired: true }, second: { acquired: true, owner: 'b' }, renewed: false, greater: true })
  })

  it('getLease’s ttlMs counts down with the fake clock', async () => {
    vi.useFakeTimers()
    const leases = followingDate()
    await leases.acquireLease('k', 'a', 10_000)
    await vi.advanceTimersByTimeAsync(2_500)
    expect(await leases.getLease('k')).toEqual({ owner: 'a', token: undefined, ttlMs: 7_500 })
  })

  it('without the clock option a provider keeps its own monotonic time: an hour of fake time expires nothing', async () => {
    vi.useFakeTimers()
    const leases = closing(new MemoryLeaseProvider())
    await leases.acquireLease('k', 'a', 60_000)
    await vi.advanceTimersByTimeAsync(3_600_000)
    vi.setSystemTime(Date.now() + YEAR_MS)
    expect(await leases.getLeaseOwner('k')).toBe('a')
  })

  it('hold() keeps a lease through many TTLs of fake time, renewed by its timers, and stops renewing once released', async () => {
    vi.useFakeTimers()
    const leases = followingDate()
    const held = await leases.hold('k', 'a', { ttlMs: 3_000 })
    await vi.advanceTimersByTimeAsync(30_000)
    expect({ owner: await leases.getLeaseOwner('k'), lost: held.signal.aborted }).toEqual({ owner: 'a', lost: false })
    await held.release()
    await leases.acquireLease('other', 'a', 3_000)
    await vi.advanceTimersByTimeAsync(3_000)
    expect(await leases.getLeaseOwner('other')).toBeUndefined()
  })

  it('a waiting hold() gets the lease once its holder’s TTL has run out in fake time, and not before', async () => {
    vi.useFakeTimers()
    const leases = followingDate()
    await leases.acquireLease('k', 'a', 5_000)
    const waiting = leases.hold('k', 'b', { ttlMs: 1_000, wait: true })
    await vi.advanceTimersByTimeAsync(4_999)
    const early = await settled(waiting)
    await vi.advanceTimersByTimeAsync(2)
    const held = await waiting
    expect({ early, owner: held.owner, holder: await leases.getLeaseOwner('k') }).toEqual({ early: false, owner: 'b', holder: 'b' })
    await held.release()
  })

  it('a waiting hold() gives up with ERR_LEASE_HELD when waitTimeoutMs of fake time pass', async () => {
    vi.useFakeTimers()
    const leases = followingDate()
    await leases.acquireLease('k', 'a', 60_000)
    const waiting = leases.hold('k', 'b', { ttlMs: 1_000, wait: true, waitTimeoutMs: 2_000 })
    const outcome = waiting.then(
      () => 'granted',
      (error: { code?: string }) => error.code,
    )
    await vi.advanceTimersByTimeAsync(2_000)
    expect(await outcome).toBe('ERR_LEASE_HELD')
  })

  it('the sweep reclaims leases that expired by the fake clock', async () => {
    vi.useFakeTimers()
    const leases = followingDate()
    for (let i = 0; i < 100; i++) await leases.acquireLease(`k${i}`, 'a', 1_000)
    await vi.advanceTimersByTimeAsync(999)
    const before = leases.size
    // The sweep runs on the (fake) interval timer, and reads the fake clock.
    await vi.advanceTimersByTimeAsync(1_000)
    expect({ before, after: leases.size }).toEqual({ before: 100, after: 0 })
  })

  it('a clock set back a year neither expires a lease nor keeps it beyond its TTL of forward movement, and an expired lease never comes back', async () => {
    vi.useFakeTimers()
    const leases = followingDate()
    await leases.acquireLease('held', 'a', 1_000)
    await leases.acquireLease('expired', 'b', 500)
    await vi.advanceTimersByTimeAsync(500)
    vi.setSystemTime(Date.now() - YEAR_MS)
    const afterTheJump = { held: await leases.getLeaseOwner('held'), expired: await leases.getLeaseOwner('expired') }
    await vi.advanceTimersByTimeAsync(499)
    const justBefore = await leases.getLeaseOwner('held')
    await vi.advanceTimersByTimeAsync(1)
    const atTtl = await leases.getLeaseOwner('held')
    const renewed = await leases.renewLease('expired', 'b', 1_000)
    expect({ afterTheJump, justBefore, atTtl, renewed }).toEqual({
      afterTheJump: { held: 'a', expired: undefined },
      justBefore: 'a',
      atTtl: undefined,
      renewed: false,
    })
  })
})

describe('the clock option’s bad values', () => {
  it('a clock that is not a function is refused with a TypeError coded ERR_LEASE_INVALID_OPTION', () => {
    for (const clock of [1, 'Date.now', {}, null, Date]) {
      const made = () => new MemoryLeaseProvider({ clock: clock as unknown as () => number })
      if (typeof clock === 'function') {
        // Date itself is a function, answering a string: refused at its first reading.
        expect(made).toThrow(expect.objectContaining({ name: 'TypeError', code: 'ERR_LEASE_INVALID_OPTION', message: expect.stringMatching(/answer a number/) }))
      } else {
        expect(made).toThrow(expect.objectContaining({ name: 'TypeError', code: 'ERR_LEASE_INVALID_OPTION', message: expect.stringMatching(/clock must be a function/) }))
      }
    }
  })

  it('a clock that throws, or answers no finite number, is refused when the provider is made', () => {
    const thrown = new Error('no clock here')
    const cases: Array<[() => number, string, RegExp]> = [
      [() => { throw thrown }, 'TypeError', /the clock threw: no clock here/],
      [() => '12' as unknown as number, 'TypeError', /answer a number of milliseconds, got string/],
      [() => NaN, 'RangeError', /finite number of milliseconds, got NaN/],
      [() => Infinity, 'RangeError', /finite number of milliseconds, got Infinity/],
    ]
    for (const [clock, name, message] of cases) {
      expect(() => new MemoryLeaseProvider({ clock })).toThrow(expect.objectContaining({ name, code: 'ERR_LEASE_INVALID_OPTION', message: expect.stringMatching(message) }))
    }
    try {
      new MemoryLeaseProvider({ clock: cases[0]![0] })
    } catch (error) {
      expect((error as Error).cause).toBe(thrown)
    }
  })

  it('a call whose clock reading fails rejects with ERR_LEASE_INVALID_OPTION and changes nothing; the next good reading carries on from the last', async () => {
    let reading: unknown = 0
    const thrown = new Error('clock broke')
    const leases = closing(
      new MemoryLeaseProvider({
        clock: () => {
          if (reading === thrown) throw thrown
          return reading as number
        },
      }),
    )
    await leases.acquireLease('k', 'a', 1_000)
    const failures = []
    for (const bad of [NaN, -Infinity, 'later', thrown]) {
      reading = bad
      failures.push(await leases.acquireLease('k', 'b', 1_000).then(
        () => 'granted',
        (error: Error & { code?: string }) => [error.name, error.code, error.cause === thrown],
      ))
    }
    reading = 999
    const owner = await leases.getLeaseOwner('k')
    reading = 1_000
    expect({ failures, owner, after: await leases.getLeaseOwner('k'), errors: leases.stats().errors }).toEqual({
      failures: [
        ['RangeError', 'ERR_LEASE_INVALID_OPTION', false],
        ['RangeError', 'ERR_LEASE_INVALID_OPTION', false],
        ['TypeError', 'ERR_LEASE_INVALID_OPTION', false],
        ['TypeError', 'ERR_LEASE_INVALID_OPTION', true],
      ],
      owner: 'a',
      after: undefined,
      errors: { ERR_LEASE_INVALID_OPTION: 4 },
    })
  })

  it('a clock that fails during a sweep leaves the sweep to a later round and the process running', async () => {
    vi.useFakeTimers()
    let broken = false
    const leases = closing(
      new MemoryLeaseProvider({
        clock: () => {
          if (broken) throw new Error('clock broke')
          return Date.now()
        },
      }),
    )
    await leases.acquireLease('k', 'a', 100)
    broken = true
    // Four sweeps run meanwhile; an exception out of one would fail this test as uncaught.
    await vi.advanceTimersByTimeAsync(1_000)
    const resident = leases.size
    broken = false
    await vi.advanceTimersByTimeAsync(250)
    expect({ resident, after: leases.size }).toEqual({ resident: 1, after: 0 })
  })

  it('after close() the clock is no longer read and calls reject with ERR_LEASE_CLOSED', async () => {
    let readings = 0
    const leases = new MemoryLeaseProvider({ clock: () => ++readings })
    await leases.acquireLease('k', 'a', 1_000)
    await leases.close()
    const before = readings
    const code = await leases.getLeaseOwner('k').catch((error: { code?: string }) => error.code)
    expect({ code, read: readings - before }).toEqual({ code: 'ERR_LEASE_CLOSED', read: 0 })
  })

  it('RedisLeaseProvider and RedisStreamsPubSub refuse clock: Redis keeps their leases’ time', () => {
    const clock = () => Date.now()
    const refused = expect.objectContaining({ code: 'ERR_LEASE_INVALID_OPTION', message: expect.stringMatching(/unknown option clock; it is an option of MemoryLeaseProvider/) })
    expect(() => new RedisLeaseProvider({ url: 'redis://127.0.0.1:1', clock } as never)).toThrow(refused)
    expect(() => new RedisStreamsPubSub({ url: 'redis://127.0.0.1:1', clock } as never)).toThrow(refused)
  })
})
