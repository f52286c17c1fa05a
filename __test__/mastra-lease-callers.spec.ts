// Upstream Mastra's newer lease callers besides the step fence (mastra-step-fence.spec.ts), driven
// through this package's providers in their own call patterns (fixtures/lease-callers.mjs;
// docs/mastra-callers.md):
// - the thread claim lease (`thread-claim:` + the thread key, the process's source id, 15 s
//   renewed every 5 s): claimed, refused, yielded, lost, and renewed under a frozen server;
// - a signal provider's poll lease (`signal-provider:${id}:${externalResourceId}`, TTL
//   max(pollInterval × 2, 1000), released on stop()), on 1.71's own SignalProvider, Agent and
//   Mastra;
// - getLeaseProvider(), which upstream's resolver tries before isLeaseProvider: Mastra's
//   CachingPubSub around ours, and 1.71's own thread runtime unwrapping it.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { randomUUID } from 'node:crypto'

import { Mastra } from '@mastra/core'
import { Agent } from '@mastra/core/agent'
import { InMemoryServerCache } from '@mastra/core/cache'
import { CachingPubSub, EventEmitterPubSub, isLeaseProvider, NoopLeaseProvider, type LeaseProvider, type PubSub } from '@mastra/core/events'
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub, withLeases } from '../dist/esm/index.js'
import {
  claimThread,
  handleStepRun,
  leaseProviderOf,
  PollLeaseSignalProvider,
  stepRunEvent,
  stepTaking,
  pollLeaseKey,
  threadClaimKey,
  THREAD_CLAIM_TIMING,
  type ClaimTick,
  type ClaimTiming,
  type StepResult,
} from './fixtures/lease-callers.mjs'
import { recordLeases, type LeaseOperation } from './fixtures/lease-recorder.mjs'
import { createMockModel } from './fixtures/mock-model.mjs'
import { leaseFailureWarnings, sleep, type LeaseApi, type LeaseRecordApi } from './helpers/lease.js'
import { perTest } from './helpers/per-test.js'
import { PROVIDER_KINDS, providerFleet, type ProviderKind } from './helpers/provider-fleet.js'
import { until } from './helpers/redis-process.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { uniquePrefix } from './helpers/streams.js'

process.env.MASTRA_TELEMETRY_DISABLED = '1'
// A frozen server fails lease calls, which warn through process.emitWarning.
leaseFailureWarnings()

let redis: RedisServer
const { providers, ownServer } = perTest()
const stopAfter: Array<{ stop(): unknown }> = []
beforeAll(async () => {
  redis = await startRedis()
})
afterEach(async () => {
  await Promise.allSettled(stopAfter.splice(0).map(async (s) => s.stop()))
})
afterAll(async () => {
  await redis?.stop()
})

/** `value`, closed after the test. */
const closing = <T extends LeaseApi>(value: T): T => {
  providers.push(value)
  return value
}

/** `n` processes' providers of one kind sharing one store (helpers/provider-fleet.ts). */
const fleet = (kind: ProviderKind, n: number) => providerFleet(kind, n, redis.url, providers)

/** `leases` whose calls can be held up: `pause()` until `resume()`, as a paused process's would be. */
function pausable(leases: LeaseProvider) {
  let gate = Promise.resolve()
  let resume = () => {}
  const through =
    <A extends unknown[], R>(call: (...args: A) => Promise<R>) =>
    async (...args: A): Promise<R> => {
      await gate
      return call(...args)
    }
  return {
    leases: {
      acquireLease: through(leases.acquireLease.bind(leases)),
      getLeaseOwner: through(leases.getLeaseOwner.bind(leases)),
      releaseLease: through(leases.releaseLease.bind(leases)),
      renewLease: through(leases.renewLease.bind(leases)),
      transferLease: through(leases.transferLease.bind(leases)),
    } satisfies LeaseProvider,
    pause() {
      gate = new Promise((r) => (resume = r))
    },
    resume: () => resume(),
  }
}

/** Mastra's thread key: resource and thread joined by NUL. */
const newThreadKey = () => `resource-${randomUUID()}\0thread-${randomUUID()}`
/** Mastra's thread lease timings scaled down, in proportion. */
const FAST: ClaimTiming = { ttlMs: 1_200, renewMs: 400 }

describe('the thread claim lease', () => {
  for (const kind of PROVIDER_KINDS) {
    it(`(${kind}) two sources claim one thread: the first claims it, the second is refused with the first's source id; once the first unsubscribes, the second claims it`, async () => {
      const [a, b] = fleet(kind, 2) as [LeaseRecordApi, LeaseRecordApi]
      const thread = newThreadKey()
      const first = await claimThread(a, thread, 'source-a', { timing: FAST })
      const second = await claimThread(b, thread, 'source-b', { timing: FAST })
      expect(first).toMatchObject({ claimed: true, holder: 'source-a' })
      expect(second).toMatchObject({ claimed: false, holder: 'source-a' })
      expect(await b.getLeaseOwner(threadClaimKey(thread))).toBe('source-a')
      first.unsubscribe() // releases without awaiting, as Mastra does
      await until('the release', 2_000, async () => ((await b.getLeaseOwner(threadClaimKey(thread))) === undefined ? undefined : 'still held'), 10)
      const third = await claimThread(b, thread, 'source-b', { timing: FAST })
      expect(third).toMatchObject({ claimed: true, holder: 'source-b' })
      third.unsubscribe()
    })

    it(`(${kind}) a holder that yields transfers the claim to the claimant, whose acquire then takes it as its own; the holder's unsubscribe releases nothing of the claimant's`, async () => {
      const [a, b] = fleet(kind, 2) as [LeaseRecordApi, LeaseRecordApi]
      const operations: LeaseOperation[] = []
      const thread = newThreadKey()
      const holder = await claimThread(recordLeases(a, (op) => operations.push(op)), thread, 'source-a', { timing: FAST })
      const claimant = await claimThread(recordLeases(b, (op) => operations.push(op)), thread, 'source-b', {
        timing: FAST,
        askHolder: async (who) => {
          expect(who).toBe('source-a')
          expect(await holder.yieldTo('source-b')).toBe(true)
        },
      })
      expect(claimant).toMatchObject({ claimed: true, holder: 'source-b' })
      await until("the holder's release", 2_000, async () => (operations.some((op) => op.op === 'release') ? undefined : 'not sent'), 10)
      await sleep(50)
      expect(await a.getLeaseOwner(threadClaimKey(thread))).toBe('source-b')
      expect(operations.map((op) => [op.op, op.owner, op.outcome])).toEqual([
        ['acquire', 'source-a', 'ok'],
        ['acquire', 'source-b', 'refused'],
        ['transfer', 'source-a', 'ok'],
        expect.anything(), // the holder's release and the claimant's second acquire, in either order
        expect.anything(),
      ])
      expect(operations.slice(3).map((op) => [op.op, op.owner, op.outcome]).sort()).toEqual([
        ['acquire', 'source-b', 'ok'],
        ['release', 'source-a', 'ok'],
      ])
      claimant.unsubscribe()
    })

    it(`(${kind}) a source whose calls were held up past the claim's TTL (a paused process) loses the claim: another source claims the lapsed thread, the paused one's renewal answers false, its acquire is refused, and it calls onOwnershipLost, its release leaving the new holder's claim in place`, async () => {
      const [a, b] = fleet(kind, 2) as [LeaseRecordApi, LeaseRecordApi]
      const operations: LeaseOperation[] = []
      const source = pausable(recordLeases(a, (op) => operations.push(op)))
      const thread = newThreadKey()
      let lost = 0
      const claim = await claimThread(source.leases, thread, 'source-a', { timing: FAST, onOwnershipLost: () => lost++ })
      expect(claim.claimed).toBe(true)
      source.pause()
      await sleep(FAST.ttlMs + 300)
      const other = await claimThread(b, thread, 'source-b', { timing: FAST })
      expect(other).toMatchObject({ claimed: true, holder: 'source-b' })
      source.resume()
      await until('onOwnershipLost', 3_000, async () => (lost === 1 ? undefined : `${lost} calls`), 10)
      await until("the lost claim's release", 2_000, async () => (operations.some((op) => op.op === 'release') ? undefined : 'not sent'), 10)
      expect(await b.getLeaseOwner(threadClaimKey(thread))).toBe('source-b')
      expect(operations.map((op) => [op.op, op.outcome])).toEqual([
        ['acquire', 'ok'],
        ['renew', 'refused'],
        ['acquire', 'refused'],
        ['release', 'ok'],
      ])
      other.unsubscribe()
    })
  }
})

describe.skipIf(EXTERNAL_REDIS)('the thread claim lease when its calls do not answer', () => {
  it("at Mastra's own timings (15 s, renewed every 5 s) and the default commandTimeoutMs, a server frozen across one renewal costs the claim nothing: that renewal rejects within 2 s, the next ones hold, no tick is skipped, and the claim outlives its TTL", async ({
    annotate,
  }) => {
    const own = await ownServer()
    const operations: LeaseOperation[] = []
    const ticks: ClaimTick[] = []
    const pubsub = closing(new RedisStreamsPubSub({ url: own.url, keyPrefix: uniquePrefix('claim-frozen') }))
    const thread = newThreadKey()
    let lost = 0
    const claim = await claimThread(recordLeases(pubsub, (op) => operations.push(op)), thread, 'source-a', {
      onOwnershipLost: () => lost++,
      record: (tick) => void ticks.push(tick),
    })
    const claimedAt = performance.now()
    await sleep(3_000)
    own.freeze() // across the renewal at 5 s
    await sleep(4_500)
    own.thaw()
    const renewals = () => operations.filter((op) => op.op === 'renew')
    await until('the renewals at 10 s and 15 s', 12_000, async () => (renewals().length >= 3 ? undefined : `${renewals().length} renewals`), 50)
    expect(performance.now() - claimedAt).toBeGreaterThan(THREAD_CLAIM_TIMING.ttlMs)
    expect(await pubsub.getLeaseOwner(threadClaimKey(thread))).toBe('source-a')
    const [frozen] = renewals()
    expect(renewals().map((op) => op.outcome)).toEqual(['error', 'ok', 'ok'])
    expect(frozen!.error).toBe('ERR_LEASE_TIMEOUT')
    const frozenMs = Number(frozen!.end - frozen!.start) / 1e6
    expect(frozenMs).toBeLessThan(3_000)
    expect(ticks.filter((t) => t.skipped)).toEqual([])
    expect(lost).toBe(0)
    claim.unsubscribe()
    await annotate(`the renewal sent to the frozen server rejected after ${frozenMs.toFixed(0)} ms; renewals ${renewals().map((op) => op.outcome).join(', ')}`)
  }, 30_000)

  it('a negative control: a provider whose renewal never settles jams the claim (every later tick is skipped while it hangs), the claim lapses at its TTL with no onOwnershipLost, and another source claims the thread', async () => {
    const memory = closing(new MemoryLeaseProvider())
    const hanging: LeaseProvider = {
      acquireLease: (...args) => memory.acquireLease(...args),
      getLeaseOwner: (...args) => memory.getLeaseOwner(...args),
      releaseLease: (...args) => memory.releaseLease(...args),
      renewLease: () => new Promise<boolean>(() => {}),
      transferLease: (...args) => memory.transferLease(...args),
    }
    const ticks: ClaimTick[] = []
    const thread = newThreadKey()
    let lost = 0
    const jammed = await claimThread(hanging, thread, 'source-a', { timing: FAST, onOwnershipLost: () => lost++, record: (tick) => void ticks.push(tick) })
    await sleep(FAST.ttlMs + 2 * FAST.renewMs)
    expect(ticks.filter((t) => !t.skipped).length).toBe(1)
    expect(ticks.filter((t) => t.skipped).length).toBeGreaterThanOrEqual(2)
    expect(await memory.getLeaseOwner(threadClaimKey(thread))).toBeUndefined()
    const other = await claimThread(memory, thread, 'source-b', { timing: FAST })
    expect(other.claimed).toBe(true)
    expect(lost).toBe(0)
    jammed.unsubscribe()
    other.unsubscribe()
  })
})

describe("a signal provider's poll lease, on 1.71's own SignalProvider, Agent and Mastra", () => {
  /** An app: Mastra on `pubsub`, with one agent whose signal providers are `providers`. */
  function app(pubsub: PubSub, ...providers: PollLeaseSignalProvider[]) {
    const agent = new Agent({ id: 'watcher', name: 'watcher', instructions: 'Watch.', model: createMockModel().model, signals: providers })
    stopAfter.push(...providers)
    return new Mastra({ agents: { watcher: agent }, pubsub, logger: false })
  }
  const target = (n: number) => ({ resourceId: 'resource-1', threadId: `thread-${n}` })
  const RESOURCES = ['github:acme/app#1', 'github:acme/app#2', 'github:acme/app#3']

  /** `n` apps' pubsubs of one kind sharing one lease store. */
  function pubsubs(kind: ProviderKind, n: number): Array<PubSub & LeaseRecordApi> {
    const keyPrefix = uniquePrefix('signals')
    const shared = kind === 'MemoryLeaseProvider' ? new MemoryLeaseProvider() : undefined
    return Array.from({ length: n }, () =>
      closing(
        kind === 'MemoryLeaseProvider'
          ? withLeases(new EventEmitterPubSub(), shared!)
          : kind === 'RedisLeaseProvider'
            ? withLeases(new EventEmitterPubSub(), new RedisLeaseProvider({ url: redis.url, keyPrefix }))
            : new RedisStreamsPubSub({ url: redis.url, keyPrefix }),
      ),
    )
  }

  type Poll = { by: string; resource: string; at: number }
  const pollers = (polls: Poll[], resource: string, since = 0) => new Set(polls.filter((p) => p.resource === resource && p.at >= since).map((p) => p.by))

  for (const kind of PROVIDER_KINDS) {
    it(`(${kind}) two apps' providers of one id polling the same three resources every 100 ms: each resource is polled by one of them, under a lease of the 1000 ms floor renewed every cycle; once the holder stops, its leases released, the other polls each of them at its next cycle, well within the TTL`, async ({
      annotate,
    }) => {
      const polls: Poll[] = []
      const make = (by: string) => new PollLeaseSignalProvider({ id: 'github', pollInterval: 100, pollResource: async (resource) => void polls.push({ by, resource, at: performance.now() }) })
      const [pa, pb] = pubsubs(kind, 2) as [PubSub & LeaseRecordApi, PubSub & LeaseRecordApi]
      const providers: Record<string, PollLeaseSignalProvider> = { a: make('a'), b: make('b') }
      app(pa, providers.a!)
      app(pb, providers.b!)
      for (const provider of Object.values(providers)) RESOURCES.forEach((resource, i) => provider.watch(target(i), resource))
      await sleep(800)
      for (const resource of RESOURCES) {
        expect(pollers(polls, resource).size, `providers that polled ${resource}`).toBe(1)
        expect(polls.filter((p) => p.resource === resource).length).toBeGreaterThanOrEqual(3)
      }
      const lease = await pa.getLease(pollLeaseKey('github', RESOURCES[0]!))
      expect(lease!.ttlMs).toBeLessThanOrEqual(1_000)
      expect(lease!.ttlMs).toBeGreaterThan(700)

      const holderName = [...pollers(polls, RESOURCES[0]!)][0]!
      const takerName = holderName === 'a' ? 'b' : 'a'
      const [holder, taker] = [providers[holderName]!, providers[takerName]!]
      const held = RESOURCES.filter((r) => pollers(polls, r).has(holderName))
      // Upstream's stop() does not wait for a cycle in flight, which may take a lease again
      // after stop() released it: let the last cycle end first.
      holder.stopPolling()
      await sleep(100)
      const stoppedAt = performance.now()
      await holder.stop()
      await until('the other provider to poll what the stopped one held', 3_000, async () =>
        held.every((r) => pollers(polls, r, stoppedAt).has(takerName)) ? undefined : 'not yet',
      10)
      const takeoverMs = Math.max(...held.map((r) => polls.find((p) => p.resource === r && p.by === takerName && p.at >= stoppedAt)!.at - stoppedAt))
      expect(takeoverMs, 'well within the 1000 ms TTL').toBeLessThan(500)
      expect(polls.filter((p) => p.by === holderName && p.at >= stoppedAt)).toEqual([])
      expect((await pa.getLease(pollLeaseKey('github', held[0]!)))!.owner).toBe(taker.pollOwner)
      await annotate(`${kind}: ${held.length} of 3 resources polled by the stopped provider, all polled by the other ${takeoverMs.toFixed(0)} ms after stop()`)
    })
  }

  it('the lease lives max(2 × pollInterval, 1000) ms: 1000 at a 100 ms interval (the floor), 1400 at 700 ms', async () => {
    const pubsub = closing(new RedisStreamsPubSub({ url: redis.url, keyPrefix: uniquePrefix('signals-ttl') }))
    const polled = new Set<string>()
    const provider = (id: string, pollInterval: number) => new PollLeaseSignalProvider({ id, pollInterval, pollResource: async () => void polled.add(id) })
    const [fast, slow] = [provider('fast', 100), provider('slow', 700)]
    app(pubsub, fast, slow)
    fast.watch(target(1), 'github:acme/app#1')
    slow.watch(target(1), 'github:acme/app#1')
    await until('both providers to poll', 3_000, async () => (polled.size === 2 ? undefined : [...polled].join()), 5)
    const [f, s] = await Promise.all([pubsub.getLease(pollLeaseKey('fast', 'github:acme/app#1')), pubsub.getLease(pollLeaseKey('slow', 'github:acme/app#1'))])
    expect(f!.ttlMs).toBeLessThanOrEqual(1_000)
    expect(f!.ttlMs).toBeGreaterThan(700)
    expect(s!.ttlMs).toBeLessThanOrEqual(1_400)
    expect(s!.ttlMs).toBeGreaterThan(1_100)
  })

  it.skipIf(EXTERNAL_REDIS)("the server frozen: each cycle's lease call rejects within commandTimeoutMs, and the cycle is logged as failed ('poll failed') and polls nothing, where the step fence runs its step anyway; after the thaw the lease is taken again and polling resumes", async ({
    annotate,
  }) => {
    const own = await ownServer()
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => {})
    try {
      const pubsub = closing(new RedisStreamsPubSub({ url: own.url, keyPrefix: uniquePrefix('signals-frozen'), commandTimeoutMs: 300 }))
      const polls: number[] = []
      const provider = new PollLeaseSignalProvider({ id: 'github', pollInterval: 100, pollResource: async () => void polls.push(performance.now()) })
      app(pubsub, provider)
      provider.watch(target(1), 'github:acme/app#1')
      await until('polling', 3_000, async () => (polls.length >= 3 ? undefined : `${polls.length} polls`), 10)
      own.freeze()
      const frozenAt = performance.now()
      await sleep(1_500)
      own.thaw()
      const thawedAt = performance.now()
      await until('polling to resume', 4_000, async () => (polls.some((t) => t > thawedAt) ? undefined : 'not yet'), 10)
      expect(polls.filter((t) => t > frozenAt + 100 && t < thawedAt)).toEqual([])
      const failures = warn.mock.calls.filter(([message]) => message === '[github] poll failed:')
      expect(failures.length).toBeGreaterThanOrEqual(2)
      expect(failures.map(([, error]) => (error as { code?: string }).code)).toContain('ERR_LEASE_TIMEOUT')
      await annotate(`${failures.length} cycles failed while frozen; polling resumed ${(polls.find((t) => t > thawedAt)! - thawedAt).toFixed(0)} ms after the thaw`)
    } finally {
      warn.mockRestore()
    }
  })

  it("takes the agent's pubsub by isLeaseProvider alone: Mastra's Proxy of RedisStreamsPubSub is one, so its leases land in Redis; Mastra's CachingPubSub around it is not, so it falls back to the no-op, where the resolver of the thread claim and the step fence unwraps getLeaseProvider() to ours", async () => {
    const keyPrefix = uniquePrefix('signals-resolve')
    const direct = closing(new RedisStreamsPubSub({ url: redis.url, keyPrefix }))
    const onDirect = new PollLeaseSignalProvider({ id: 'github', pollInterval: 60_000, pollResource: async () => {} })
    const plain = app(direct, onDirect)
    expect(isLeaseProvider(plain.getAgent('watcher').getPubSub())).toBe(true)
    const leases = onDirect.leaseProvider()
    expect(leases).not.toBe(NoopLeaseProvider)
    expect(await leases.acquireLease('signal-provider:github:r', onDirect.pollOwner, 5_000)).toStrictEqual({ acquired: true, owner: onDirect.pollOwner })
    expect(await direct.getLeaseOwner('signal-provider:github:r')).toBe(onDirect.pollOwner)

    const inner = closing(new RedisStreamsPubSub({ url: redis.url, keyPrefix }))
    const onCached = new PollLeaseSignalProvider({ id: 'github', pollInterval: 60_000, pollResource: async () => {} })
    const cached = app(new CachingPubSub(inner, new InMemoryServerCache()), onCached)
    expect(isLeaseProvider(cached.getAgent('watcher').getPubSub())).toBe(false)
    expect(onCached.leaseProvider()).toBe(NoopLeaseProvider)
    expect(leaseProviderOf(cached.getAgent('watcher').getPubSub()).provider).toBe(inner)
  })
})

describe('getLeaseProvider(), which resolvers try before isLeaseProvider', () => {
  const inners = {
    RedisStreamsPubSub: (keyPrefix: string) => closing(new RedisStreamsPubSub({ url: redis.url, keyPrefix })),
    'withLeases(EventEmitterPubSub, RedisLeaseProvider)': (keyPrefix: string) => closing(withLeases(new EventEmitterPubSub(), new RedisLeaseProvider({ url: redis.url, keyPrefix }))),
  }
  for (const [name, make] of Object.entries(inners)) {
    it(`Mastra's CachingPubSub around ${name} hands it out through getLeaseProvider() (it finds the five methods there), so upstream's resolver takes ours, not the no-op: a step's duplicate delivery is dropped and a second source is refused the thread claim`, async () => {
      const inner = make(uniquePrefix('caching'))
      const caching = new CachingPubSub(inner, new InMemoryServerCache())
      expect(isLeaseProvider(caching)).toBe(false)
      const { provider, isFallback } = leaseProviderOf(caching)
      expect(provider).toBe(inner)
      expect(isFallback).toBe(false)

      let steps = 0
      const step = async (): Promise<StepResult> => {
        steps++
        return stepTaking(200)()
      }
      const [runId, eventId] = [`run-${randomUUID()}`, randomUUID()]
      await Promise.all([1, 2].map((attempt) => handleStepRun(caching, stepRunEvent(runId, eventId, attempt), step, { ttlMs: 5_000 })))
      expect(steps).toBe(1)

      const thread = newThreadKey()
      const [a, b] = [await claimThread(provider, thread, 'source-a'), await claimThread(provider, thread, 'source-b')]
      expect([a.claimed, b.claimed]).toEqual([true, false])
      expect(await inner.getLeaseOwner(threadClaimKey(thread))).toBe('source-a')
      a.unsubscribe()
    })
  }

  it("1.71's own thread runtime unwraps it as well: an agent's run on a memory thread, on Mastra with CachingPubSub(RedisStreamsPubSub), holds the thread lease in Redis under its runId until it ends", async () => {
    const inner = closing(new RedisStreamsPubSub({ url: redis.url, keyPrefix: uniquePrefix('caching-thread') }))
    let open!: () => void
    const opened = new Promise<void>((r) => (open = r))
    let enter!: () => void
    const entered = new Promise<void>((r) => (enter = r))
    const { model } = createMockModel({
      reply: 'hello',
      async beforeReply() {
        enter()
        await opened
      },
    })
    const agent = new Agent({ id: 'assistant', name: 'assistant', instructions: 'Answer briefly.', model })
    const mastra = new Mastra({ agents: { assistant: agent }, pubsub: new CachingPubSub(inner, new InMemoryServerCache()), logger: false })
    const [resource, thread] = [`resource-${randomUUID()}`, `thread-${randomUUID()}`]
    const output = await mastra.getAgent('assistant').stream('hello', { memory: { resource, thread } })
    const text = output.text
    text.catch(() => {}) // awaited below; never an unhandled rejection meanwhile
    await Promise.race([entered, sleep(10_000).then(() => Promise.reject(new Error('the model was never called')))])
    expect(await inner.getLeaseOwner(`${resource}\0${thread}`)).toBe(output.runId)
    open()
    expect(await text).toBe('hello')
    await until('the thread lease to be released', 5_000, async () => ((await inner.getLeaseOwner(`${resource}\0${thread}`)) === undefined ? undefined : 'still held'), 20)
  })

  it('ours answer getLeaseProvider() with themselves, never undefined (which a resolver reads as "cannot lease"), and need it for nothing else: with it hidden, isLeaseProvider still holds and the resolver takes the pubsub itself', () => {
    for (const pubsub of [closing(new RedisStreamsPubSub({ url: redis.url })), closing(withLeases(new EventEmitterPubSub(), new MemoryLeaseProvider()))]) {
      expect(pubsub.getLeaseProvider()).toBe(pubsub)
      expect(leaseProviderOf(pubsub).provider).toBe(pubsub)
      const hidden = new Proxy(pubsub, { get: (target, prop) => (prop === 'getLeaseProvider' ? undefined : Reflect.get(target, prop, target)) })
      expect(isLeaseProvider(hidden)).toBe(true)
      expect(leaseProviderOf(hidden).provider).toBe(hidden)
    }
  })
})
