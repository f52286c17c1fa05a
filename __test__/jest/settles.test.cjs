// Every lease call settles under Jest's modern fake timers with their defaults, which fake
// queueMicrotask, setImmediate and process.nextTick besides the timers: a RedisLeaseProvider
// against the server jest.spec.ts started (REDIS_URL), and a MemoryLeaseProvider without the
// clock option. Each wait is bounded by a real timer, taken before anything is faked.
// afterEach, beforeEach, expect, jest and test are Jest's globals.
const { MemoryLeaseProvider, RedisLeaseProvider } = require('mastra-lease')

const realSetTimeout = setTimeout
const realClearTimeout = clearTimeout

/** Each call's value (or its rejection's code), or 'pending' for one not settled within `ms` of real time. */
async function settledWithin(calls, ms) {
  const outcomes = calls.map(() => 'pending')
  let timer
  await Promise.race([
    Promise.all(calls.map((call, i) => call.then((value) => (outcomes[i] = value), (error) => (outcomes[i] = error.code ?? String(error))))),
    new Promise((resolve) => (timer = realSetTimeout(resolve, ms))),
  ])
  realClearTimeout(timer)
  return outcomes
}

/** The lease lifecycle, each call made in the same turn, then after the first answered. */
async function lifecycle(leases) {
  const first = await settledWithin([leases.acquireLease('k', 'a', 10_000), leases.getLeaseOwner('k'), leases.renewLease('k', 'a', 10_000)], 3_000)
  const then = await settledWithin(
    [leases.transferLease('k', 'a', 'b', 10_000), leases.acquireFencedLease('f', 'a', 10_000), leases.getLease('k'), leases.releaseLease('k', 'b'), leases.getLeaseOwner('k'), leases.ping()],
    3_000,
  )
  return [...first, ...then.map((outcome) => (typeof outcome === 'object' && outcome !== null && 'ttlMs' in outcome ? { ...outcome, ttlMs: 'counted' } : outcome))]
}

const LIFECYCLE = [
  { acquired: true, owner: 'a' },
  'a',
  true,
  true,
  { acquired: true, owner: 'a', token: expect.any(Number) },
  { owner: 'b', token: undefined, ttlMs: 'counted' },
  undefined,
  undefined,
  expect.any(Number),
]

let leases
beforeEach(() => {
  jest.useFakeTimers()
})
afterEach(async () => {
  jest.useRealTimers()
  await leases?.close()
  leases = undefined
})

test("a RedisLeaseProvider's calls settle under Jest's default fake timers, made while they are installed", async () => {
  if (!process.env.REDIS_URL) throw new Error('REDIS_URL names the server to test against (jest.spec.ts starts one)')
  leases = new RedisLeaseProvider({ url: process.env.REDIS_URL, keyPrefix: `jest-settles:${process.pid}`, commandTimeoutMs: 2_000 })
  expect(await lifecycle(leases)).toEqual(LIFECYCLE)
})

test("a MemoryLeaseProvider's calls settle under Jest's default fake timers, without the clock option", async () => {
  leases = new MemoryLeaseProvider()
  expect(await lifecycle(leases)).toEqual(LIFECYCLE)
})
