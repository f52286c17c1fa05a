// MemoryLeaseProvider's `clock` option under Jest's modern fake timers (every timer, Date,
// performance, nextTick and queueMicrotask faked), beside Mastra's EventEmitterPubSub in the
// same fake time. Run by jest.spec.ts.
// afterEach, beforeEach, describe, expect, jest and test are Jest's globals.
const { EventEmitterPubSub } = require('@mastra/core/events')
const { MemoryLeaseProvider } = require('mastra-lease')

const { besideMastra, fencingScript, LEASE_SCRIPT_ANSWERS } = require('../fixtures/fake-clock-script.cjs')

const providers = []
/** A provider whose leases follow `Date.now()`, the clock Jest's fake timers move. */
function followingDate() {
  const leases = new MemoryLeaseProvider({ clock: () => Date.now() })
  providers.push(leases)
  return leases
}

beforeEach(() => {
  jest.useFakeTimers()
})
afterEach(async () => {
  jest.useRealTimers()
  await Promise.all(providers.splice(0).map((leases) => leases.close()))
})

describe("MemoryLeaseProvider({ clock: () => Date.now() }) under Jest's modern fake timers", () => {
  test('a lease expires when jest.advanceTimersByTime passes its TTL and not before; renewals, refusals and transfers follow the fake clock, answering as EventEmitterPubSub does', async () => {
    const advance = (ms) => jest.advanceTimersByTime(ms)
    const { ours, mastras } = await besideMastra(followingDate(), new EventEmitterPubSub(), advance)
    expect(ours).toEqual(LEASE_SCRIPT_ANSWERS)
    expect(mastras).toEqual(LEASE_SCRIPT_ANSWERS)
  })

  test('jest.setSystemTime moves it the same way, with no timer run', async () => {
    const advance = (ms) => jest.setSystemTime(Date.now() + ms)
    const { ours, mastras } = await besideMastra(followingDate(), new EventEmitterPubSub(), advance)
    expect(ours).toEqual(LEASE_SCRIPT_ANSWERS)
    expect(mastras).toEqual(LEASE_SCRIPT_ANSWERS)
  })

  test('a fenced lease that expired in fake time goes to the next owner with a greater token', async () => {
    const fencing = await fencingScript(followingDate(), (ms) => jest.advanceTimersByTimeAsync(ms))
    expect(fencing).toMatchObject({ first: { acquired: true }, second: { acquired: true, owner: 'b' }, renewed: false, greater: true })
  })

  test('hold() keeps a lease through many TTLs of fake time, and a waiter gets it once the holder lets it expire', async () => {
    const leases = followingDate()
    const held = await leases.hold('k', 'a', { ttlMs: 3_000 })
    await jest.advanceTimersByTimeAsync(30_000)
    const kept = { owner: await leases.getLeaseOwner('k'), lost: held.signal.aborted }
    await leases.acquireLease('other', 'c', 5_000)
    const waiting = leases.hold('other', 'b', { ttlMs: 1_000, wait: true })
    await jest.advanceTimersByTimeAsync(5_001)
    const waited = await waiting
    expect({ kept, waited: waited.owner }).toEqual({ kept: { owner: 'a', lost: false }, waited: 'b' })
    await held.release()
    await waited.release()
  })
})
