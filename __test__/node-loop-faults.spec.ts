// Faults of the lease calls that run on Node's own event loop (node-loop.spec.ts has how they
// run there): what must still hold when that loop is not free to run when they need it.
//
// - A loop blocked (a synchronous stretch of JavaScript) past `commandTimeoutMs` while the
//   replies already sit in the socket: what Redis granted resolves granted. Mastra counts a
//   rejected acquire as acquired, so a false ERR_LEASE_TIMEOUT means two owners. The same for
//   a provider's first connection, whose handshake replies are read on that loop.
// - Replies and a connection reset (RST) arriving together while the loop is busy: every call
//   settles at once, granted or with a connection error, never at the timeout. The fault
//   comes from a proxy in a process of its own (fixtures/reset-after-replies-proxy.mjs): the
//   in-process fault proxy would be blocked with the loop.
// - `queueMicrotask` faked (as Jest's modern fake timers do) when a thread makes its first
//   call, in a process of its own (fixtures/fake-microtask-process.mjs): a thread's first call
//   is where the addon once took the function it kept for good. node-loop-fake-timers.spec.ts
//   has vitest's own fakes.
// - RedisStreamsPubSub: a lease call made once close() was called is refused, while close()
//   still drains the publishes made before it.
//
// Every test starts its own redis-server (and proxy or child); the file skips under
// REDIS_URL, since these paths need a plain redis:// server the tests start.
import './helpers/mastra-node.js' // first: the streams pubsub loads Mastra, which needs Node >= 22.13

import path from 'node:path'

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisLeaseProvider, RedisStreamsPubSub } from '../dist/esm/index.js'
import { jsonLinesChild } from './helpers/json-lines-child.js'
import { errorCode, leaseFailureWarnings, sleep } from './helpers/lease.js'
import { closing, leaseSuite, RUN, stopLater } from './helpers/lease-runs.js'
import { blockAfterThisTurn, startResetProxy, warm, type ResetProxy } from './helpers/node-loop-faults.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { startSentinel, type RedisSentinel } from './helpers/redis-sentinel.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()
// The resets fail lease calls, which warn through process.emitWarning (no logger here).
leaseFailureWarnings()

const FIXTURES = path.join(__dirname, 'fixtures')

let server: RedisServer
beforeAll(async () => {
  if (!EXTERNAL_REDIS) server = stopLater(await startRedis())
})

/** How a call settled, `ms` after `since` (performance.now()). */
type Outcome = { ms: number } & ({ value: unknown; code?: undefined } | { code: unknown; value?: undefined })

function outcomes(calls: Promise<unknown>[], since: number): Promise<Outcome[]> {
  return Promise.all(
    calls.map((call) =>
      call.then(
        (value) => ({ value, ms: performance.now() - since }),
        (error: unknown) => ({ code: errorCode(error) ?? String(error), ms: performance.now() - since }),
      ),
    ),
  )
}

/** `{ code: n, ... }` of the outcomes: 'granted' for a value, the error's code otherwise. */
function tally(results: Outcome[], granted: (value: unknown) => boolean = () => true): Record<string, number> {
  const counts: Record<string, number> = {}
  for (const result of results) {
    const kind = result.code === undefined ? (granted(result.value) ? 'granted' : `answered ${JSON.stringify(result.value)}`) : String(result.code)
    counts[kind] = (counts[kind] ?? 0) + 1
  }
  return counts
}

const isGrant = (value: unknown) => (value as { acquired?: unknown } | undefined)?.acquired === true
const slowest = (results: Outcome[]) => Math.round(Math.max(...results.map((r) => r.ms)))

/** The lease keys of `keys` that Redis holds for `owner`, read where `ownerOf` reads a stored key. */
async function heldInRedis(keyPrefix: string, keys: string[], owner: string, ownerOf: (stored: string) => Promise<unknown> = (stored) => server.cli('GET', stored)): Promise<number> {
  const owners = await Promise.all(keys.map((key) => ownerOf(`${keyPrefix}:lease:${key}`)))
  return owners.filter((o) => o === owner).length
}

/**
 * Three rounds of 20 acquires on fresh keys from the provider `ready` answers, Node's loop
 * blocked for 1.5 s once they were written: each round's answers, tallied, and how many of the
 * leases Redis holds.
 */
async function blockedRounds(keyPrefix: string, ready: () => Promise<RedisLeaseProvider>, ownerOf?: (stored: string) => Promise<unknown>) {
  const rounds: Array<{ tally: Record<string, number>; held: number }> = []
  for (let round = 0; round < 3; round++) {
    const provider = await ready()
    const keys = Array.from({ length: 20 }, (_, i) => `round${round}:${i}`)
    const since = performance.now()
    const calls = keys.map((key) => provider.acquireLease(key, 'owner', 60_000))
    blockAfterThisTurn(1_500)
    const results = await outcomes(calls, since)
    rounds.push({ tally: tally(results, isGrant), held: await heldInRedis(keyPrefix, keys, 'owner', ownerOf) })
  }
  return rounds
}

describe.skipIf(EXTERNAL_REDIS)('lease calls on Node’s loop while that loop is blocked', () => {
  it('a loop blocked past commandTimeoutMs once 20 acquires were written: every one Redis granted resolves granted, none rejects ERR_LEASE_TIMEOUT', async ({ annotate }) => {
    const keyPrefix = `node-loop-faults:blocked:${RUN}`
    const provider = closing(new RedisLeaseProvider({ url: server.url, keyPrefix, commandTimeoutMs: 500 }))
    const rounds = await blockedRounds(keyPrefix, async () => {
      // Connected (both connections the calls are spread over) before the loop is blocked,
      // again after a round whose failures dropped them.
      await warm((i) => provider.getLeaseOwner(`warm:${i}`))
      return provider
    })
    await annotate(rounds.map((r, i) => `round ${i + 1}: ${JSON.stringify(r.tally)}, ${r.held}/20 held in Redis`).join('; '))
    // Redis holds every lease: only the answers can be wrong.
    expect(rounds.map((r) => r.held)).toEqual([20, 20, 20])
    expect(rounds.map((r) => r.tally)).toEqual([{ granted: 20 }, { granted: 20 }, { granted: 20 }])
  }, 20_000)

  it('a fresh provider’s first calls, the loop blocked past connectTimeoutMs and commandTimeoutMs while it connects to a server that was there all along: granted, not rejected for time', async ({ annotate }) => {
    const keyPrefix = `node-loop-faults:first:${RUN}`
    const rounds = await blockedRounds(keyPrefix, async () =>
      closing(new RedisLeaseProvider({ url: server.url, keyPrefix, connectTimeoutMs: 500, commandTimeoutMs: 500 })),
    )
    await annotate(rounds.map((r, i) => `round ${i + 1}: ${JSON.stringify(r.tally)}, ${r.held}/20 held in Redis`).join('; '))
    expect(rounds.map((r) => r.tally)).toEqual([{ granted: 20 }, { granted: 20 }, { granted: 20 }])
    expect(rounds.map((r) => r.held)).toEqual([20, 20, 20])
  }, 20_000)
})

describe.skipIf(EXTERNAL_REDIS)('lease calls on Node’s loop while that loop is blocked, on a Cluster and behind Sentinel', () => {
  let cluster: RedisCluster
  let sentinel: RedisSentinel
  beforeAll(async () => {
    ;[cluster, sentinel] = await Promise.all([startCluster(), startSentinel({ replicas: 1 })])
  })
  afterAll(async () => {
    await Promise.all([cluster?.stop(), sentinel?.stop()])
  })
  const deployments: [string, () => Pick<ConstructorParameters<typeof RedisLeaseProvider>[0] & {}, 'cluster' | 'sentinel'>, (stored: string) => Promise<unknown>][] = [
    ['a Cluster (each call to its slot’s master)', () => ({ cluster: { nodes: cluster.urls } }), async (stored) => (await cluster.masterOfSlot(await cluster.keySlot(stored))).cli('GET', stored)],
    ['behind Sentinel', () => ({ sentinel: { nodes: sentinel.sentinelUrls, masterName: sentinel.masterName } }), async (stored) => (await sentinel.master()).cli('GET', stored)],
  ]

  it.for(deployments)('%s: a loop blocked past commandTimeoutMs once 20 acquires were written: every one Redis granted resolves granted, none rejects ERR_LEASE_TIMEOUT', { timeout: 30_000 }, async ([, deployment, ownerOf], { annotate }) => {
    const keyPrefix = `node-loop-faults:blocked-deployed:${RUN}:${Object.keys(deployment())[0]}`
    const provider = closing(new RedisLeaseProvider({ ...deployment(), keyPrefix, commandTimeoutMs: 500 }))
    const rounds = await blockedRounds(keyPrefix, async () => {
      await warm((i) => provider.getLeaseOwner(`warm:${i}`))
      return provider
    }, ownerOf)
    await annotate(rounds.map((r, i) => `round ${i + 1}: ${JSON.stringify(r.tally)}, ${r.held}/20 held in Redis`).join('; '))
    expect(rounds.map((r) => r.held)).toEqual([20, 20, 20])
    expect(rounds.map((r) => r.tally)).toEqual([{ granted: 20 }, { granted: 20 }, { granted: 20 }])
  })
})

/** Settled within this of being made, the fault notwithstanding (the timeout is 2,000 ms). */
const PROMPT_MS = 1_000
/** How long the loop stays busy once a turn's calls were written. */
const BUSY_MS = 200
/**
 * How long the proxy holds the replies before sending them and the RST: long enough that
 * both land once the loop is surely blocked (a reset that came while the turn still ran was
 * seen by the next write), and well within BUSY_MS.
 */
const HOLD_MS = 20
/** How much of the chunk of replies reaches the client: less than one reply. */
const FORWARDED_BYTES = 16

interface ResetRound {
  tally: Record<string, number>
  slowest: number
  /** Calls settled after PROMPT_MS. */
  late: number
  /** Connections reset, and how many of those resets went while the loop was blocked. */
  resets: number
  resetsWhileBlocked: number
}

/**
 * One round: the connections warmed and quiet, the proxy armed, `makeCalls()` in one turn,
 * then the loop blocked for BUSY_MS while the proxy's replies and resets arrive.
 */
async function resetRound(proxy: ResetProxy, warmCall: (i: number) => Promise<unknown>, makeCalls: () => Promise<unknown>[], granted?: (value: unknown) => boolean): Promise<ResetRound> {
  await proxy.disarm()
  await warm(warmCall)
  // What a connection sends once after its first success (its name, the eviction policy)
  // has been answered: the next replies are the calls'.
  await sleep(100)
  const before = (await proxy.resets()).length
  expect(await proxy.arm(FORWARDED_BYTES, HOLD_MS)).toBeGreaterThanOrEqual(1)
  const since = performance.now()
  const calls = makeCalls()
  const blocked = blockAfterThisTurn(BUSY_MS)
  const results = await outcomes(calls, since)
  const resets = (await proxy.resets()).slice(before)
  return {
    tally: tally(results, granted),
    slowest: slowest(results),
    late: results.filter((r) => r.ms > PROMPT_MS).length,
    resets: resets.length,
    resetsWhileBlocked: resets.filter((at) => at > blocked.from && at < blocked.to).length,
  }
}

const describeRounds = (rounds: ResetRound[]) =>
  rounds
    .map((r, i) => `round ${i + 1}: ${JSON.stringify(r.tally)}, ${r.late} settled after ${PROMPT_MS} ms (slowest ${r.slowest} ms), ${r.resetsWhileBlocked}/${r.resets} resets while blocked`)
    .join('; ')
const failedRounds = (rounds: ResetRound[]) => rounds.filter((r) => r.late > 0 || r.tally.ERR_LEASE_TIMEOUT !== undefined).length

describe.skipIf(EXTERNAL_REDIS)('replies and a connection reset arriving while Node’s loop is busy', () => {
  it('1,000 acquires in one turn, their connections reset right after a partial reply while the loop is blocked: every call settles at once, granted or ERR_LEASE_CONNECTION, never ERR_LEASE_TIMEOUT (10 rounds)', async ({ annotate }) => {
    const proxy = await startResetProxy(server)
    const keyPrefix = `node-loop-faults:reset:${RUN}`
    const provider = closing(new RedisLeaseProvider({ url: proxy.url, keyPrefix, commandTimeoutMs: 2_000, connectTimeoutMs: 2_000 }))
    const rounds: ResetRound[] = []
    for (let round = 0; round < 10; round++) {
      rounds.push(
        await resetRound(
          proxy,
          (i) => provider.getLeaseOwner(`warm:${i}`),
          () => Array.from({ length: 1_000 }, (_, i) => provider.acquireLease(`round${round}:${i}`, 'owner', 60_000)),
          isGrant,
        ),
      )
    }
    await annotate(describeRounds(rounds))
    await annotate(`${failedRounds(rounds)} of ${rounds.length} rounds had a call settle late or time out`)
    // The fault landed as meant in every round: a connection reset while the loop was blocked.
    expect(rounds.map((r) => r.resetsWhileBlocked >= 1)).toEqual(rounds.map(() => true))
    expect(failedRounds(rounds)).toBe(0)
    for (const r of rounds) expect(Object.keys(r.tally).filter((kind) => kind !== 'granted' && kind !== 'ERR_LEASE_CONNECTION')).toEqual([])
  }, 90_000)

  it('RedisStreamsPubSub: 20 publishes in one turn, their connection reset right after a partial reply while the loop is blocked: every publish settles at once, never at the timeout (10 rounds)', async ({ annotate }) => {
    const proxy = await startResetProxy(server)
    const keyPrefix = `node-loop-faults:reset-publish:${RUN}`
    const pubsub = closing(new RedisStreamsPubSub({ url: proxy.url, keyPrefix, commandTimeoutMs: 2_000, connectTimeoutMs: 2_000 }))
    const rounds: ResetRound[] = []
    for (let round = 0; round < 10; round++) {
      rounds.push(
        await resetRound(
          proxy,
          () => pubsub.publish('warm', { type: 't', runId: 'r', data: {} }),
          () => Array.from({ length: 20 }, (_, i) => pubsub.publish('topic', { type: 't', runId: 'r', data: { round, i } })),
        ),
      )
    }
    await annotate(describeRounds(rounds))
    await annotate(`${failedRounds(rounds)} of ${rounds.length} rounds had a publish settle late or time out`)
    expect(rounds.map((r) => r.resetsWhileBlocked >= 1)).toEqual(rounds.map(() => true))
    expect(failedRounds(rounds)).toBe(0)
  }, 90_000)
})

describe.skipIf(EXTERNAL_REDIS)('a faked queueMicrotask', () => {
  it('a process whose first lease call is made while queueMicrotask only queues (Jest’s fake timers): its calls settle, and so do a new provider’s once the real one is back', async ({ annotate }) => {
    const settleMs = 3_000
    const child = jsonLinesChild(path.join(FIXTURES, 'fake-microtask-process.mjs'), { url: server.url, keyPrefix: `node-loop-faults:fake:${RUN}`, settleMs })
    closing({ close: async () => void child.kill() })
    const ended = await Promise.race([child.exited, new Promise((resolve) => setTimeout(resolve, 5 * settleMs + 5_000))])
    child.kill()
    const phases = Object.fromEntries(child.lines.filter((l) => l.type === 'phase').map((l) => [l.phase as string, l]))
    await annotate(
      Object.values(phases)
        .map((p) => `${String(p.phase)}: ${p.settled ? `settled in ${String(p.ms)} ms` : `not settled within ${settleMs} ms`} ${JSON.stringify(p.outcomes)}`)
        .join('; '),
    )
    expect(ended, `the child did not finish; stderr: ${child.stderr()}`).toBeDefined()
    expect(child.lines.at(-1)?.type, child.stderr()).toBe('done')
    expect(phases['memory-faked']).toMatchObject({ settled: true, outcomes: [{ value: { acquired: true, owner: 'owner' } }, { value: 'owner' }] })
    expect(phases['redis-faked']).toMatchObject({ settled: true, outcomes: [{ value: { acquired: true, owner: 'owner' } }, { value: 'owner' }] })
    expect(phases['redis-restored']).toMatchObject({ settled: true, outcomes: [{ value: { acquired: true, owner: 'owner' } }, { value: 'owner' }] })
  })
})

describe.skipIf(EXTERNAL_REDIS)('RedisStreamsPubSub closing', () => {
  it('lease calls made once close() was called, while close() still drains 200 publishes, reject ERR_LEASE_CLOSED and write nothing; the publishes still reach Redis', async ({ annotate }) => {
    const keyPrefix = `node-loop-faults:close:${RUN}`
    const pubsub = closing(new RedisStreamsPubSub({ url: server.url, keyPrefix, commandTimeoutMs: 2_000 }))
    // Keys on both connections the lease calls are spread over, each open: a call is then
    // written at once, not after a connect that close() may overtake.
    const keys = Array.from({ length: 10 }, (_, i) => `after-close:${i}`)
    await Promise.all(keys.map((key) => pubsub.getLeaseOwner(key)))
    await pubsub.publish('topic', { type: 't', runId: 'r', data: {} })
    const published = Array.from({ length: 200 }, (_, i) => pubsub.publish('topic', { type: 't', runId: 'r', data: { i } }))
    const closed = pubsub.close()
    const since = performance.now()
    const results = await outcomes(
      keys.map((key) => pubsub.acquireLease(key, 'owner', 60_000)),
      since,
    )
    await closed
    await Promise.all(published)
    const written = (await server.cli('EXISTS', ...keys.map((key) => `${keyPrefix}:lease:${key}`))) as number
    await annotate(`after close(): ${JSON.stringify(tally(results, isGrant))}, ${written}/${keys.length} leases written to Redis`)
    expect(tally(results, isGrant)).toEqual({ ERR_LEASE_CLOSED: keys.length })
    expect(written).toBe(0)
    expect(await server.cli('XLEN', `${keyPrefix}:topic`)).toBe(201)
  })
})
