// mastra-lease inside real Mastra (@mastra/core 1.71): Mastra must find *our* lease provider
// (not its NoopLeaseProvider fallback) on a `withLeases(...)` pubsub, also through its
// `mastra.pubsub` Proxy and inside a CachingPubSub; a real Agent thread run must hold the
// thread lease in our provider; and across processes the lease must make exactly one
// process own a thread.
//
// Where Mastra resolves and calls the provider (node_modules/@mastra/core/dist):
// - AgentThreadStreamRuntime#getLeaseProvider (storage-*.js): `pubsub.getLeaseProvider()`
//   if it is a function, else `isLeaseProvider(pubsub) ? pubsub : NoopLeaseProvider`. The
//   resolver is private and not exported, so these tests go through the runtime itself.
// - registerRun (every `agent.stream` with a memory thread) and sendSignal (idle wake)
//   acquire `resourceId + "\0" + threadId` with the runId as owner for 15 000 ms; run
//   completion releases it, or transfers it to the run that drains queued signals.
// - A process that loses the race publishes its signal to the owner's run over the pubsub.
// - Mastra's EventEmitterPubSub is itself a LeaseProvider (in-process leases) and
//   UnixSocketPubSub is not (NoopLeaseProvider): the tests check the lease lands in ours.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { fork, type ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { types } from 'node:util'

import { Mastra } from '@mastra/core'
import { Agent } from '@mastra/core/agent'
import { InMemoryServerCache } from '@mastra/core/cache'
import { CachingPubSub, EventEmitterPubSub, isLeaseProvider, PubSub, UnixSocketPubSub, type LeaseProvider } from '@mastra/core/events'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { leaseChannel, MemoryLeaseProvider, RedisLeaseProvider, withLeases, type LeaseCallContext, type LeasedPubSub, type RedisLeaseProviderOptions } from '../dist/esm/index.js'
import { createMockModel } from './fixtures/mock-model.mjs'
import { recordingLeases, type LeaseCall, type RecordingLeases } from './fixtures/recording-leases.mjs'
import { MASTRA_MIN_NODE, NODE, nodeAtLeast } from './helpers/mastra-node.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { startCluster } from './helpers/redis-cluster.js'
import { startSentinel } from './helpers/redis-sentinel.js'

process.env.MASTRA_TELEMETRY_DISABLED = '1'

/** Mastra's thread lease TTL (AGENT_THREAD_LEASE_TTL_MS, overridable by this env var). */
const THREAD_LEASE_TTL_MS = Number(process.env.MASTRA_AGENT_THREAD_LEASE_TTL_MS ?? 15_000)

type Thread = { resourceId: string; threadId: string }
const newThread = (): Thread => ({ resourceId: `resource-${randomUUID()}`, threadId: `thread-${randomUUID()}` })
/** The key Mastra leases for a thread (AGENT_THREAD_KEY_SEPARATOR is NUL). */
const threadKey = ({ resourceId, threadId }: Thread) => `${resourceId}\0${threadId}`

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms))

/** `p`, or a rejection naming `what` after `ms`. */
async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms)
  })
  try {
    return await Promise.race([p, timeout])
  } finally {
    clearTimeout(timer)
  }
}

/** Poll `read` until it returns `expected` (or `ms` pass); returns the last value read. */
async function pollFor<T>(read: () => Promise<T>, expected: T, ms = 3_000): Promise<T> {
  const deadline = Date.now() + ms
  let value = await read()
  while (value !== expected && Date.now() < deadline) {
    await sleep(20)
    value = await read()
  }
  return value
}

const leaseCalls = (calls: readonly LeaseCall[], method: LeaseCall['method']) => calls.filter((c) => c.method === method)
/**
 * A lease call's arguments without the trailing metadata arguments that carry none: withLeases
 * passes a holder's metadata on to its provider, `undefined` when Mastra gave none (`null`
 * once through a child process's JSON). A metadata Mastra did give stays.
 */
const givenArgs = (args: readonly unknown[]) => {
  const given = [...args]
  while (given.length > 0 && (given.at(-1) === undefined || given.at(-1) === null)) given.pop()
  return given
}

describe('mastra-lease inside Mastra', () => {
  it(`runs on Node >= ${MASTRA_MIN_NODE}, as Mastra requires`, () => {
    expect(nodeAtLeast(process.versions.node, MASTRA_MIN_NODE), `Node ${process.versions.node}`).toBe(true)
  })

  describe('structural detection', () => {
    let redis: RedisServer | undefined
    const closables: Array<{ close(): Promise<void> }> = []
    let dir: string | undefined
    /** A socket path nobody listens on: these UnixSocketPubSubs are never started. */
    const socketPath = () => path.join(dir!, `${randomUUID()}.sock`)
    beforeAll(async () => {
      redis = await startRedis()
      dir = mkdtempSync(path.join(os.tmpdir(), 'mld-'))
    })
    afterAll(async () => {
      await Promise.allSettled(closables.map((c) => c.close()))
      await redis?.stop()
      if (dir) rmSync(dir, { recursive: true, force: true })
    })

    it('isLeaseProvider is true for both native providers and for withLeases(...)', () => {
      const memory = new MemoryLeaseProvider()
      const redisProvider = new RedisLeaseProvider({ url: redis!.url })
      const onSocket = withLeases(new UnixSocketPubSub(socketPath()), new MemoryLeaseProvider())
      const onEmitter = withLeases(new EventEmitterPubSub(), new RedisLeaseProvider({ url: redis!.url }))
      closables.push(memory, redisProvider, onSocket, onEmitter)
      expect(isLeaseProvider(memory)).toBe(true)
      expect(isLeaseProvider(redisProvider)).toBe(true)
      expect(isLeaseProvider(onSocket)).toBe(true)
      expect(isLeaseProvider(onEmitter)).toBe(true)
      // UnixSocketPubSub alone cannot lease (Mastra would fall back to NoopLeaseProvider):
      // the capability comes from withLeases.
      expect(isLeaseProvider(new UnixSocketPubSub(socketPath()))).toBe(false)
    })

    it('new Mastra({ pubsub: withLeases(...) }) accepts it, typed as a PubSub and a LeaseProvider without a cast', () => {
      const leases = new MemoryLeaseProvider()
      const leased = withLeases(new EventEmitterPubSub(), leases)
      closables.push(leased)
      // Compile-time checks as much as runtime ones (tsc --noEmit -p . runs over __test__).
      const asPubSub: PubSub = leased
      const asLeaseProvider: LeaseProvider = leased
      const mastra = new Mastra({ pubsub: leased, logger: false })
      expect(asPubSub).toBeInstanceOf(PubSub)
      expect(isLeaseProvider(asLeaseProvider)).toBe(true)
      // Mastra hands its pubsub out through a Proxy whose get trap binds methods to the target.
      expect(types.isProxy(mastra.pubsub)).toBe(true)
      expect(isLeaseProvider(mastra.pubsub)).toBe(true)
      const unwrap: unknown = Reflect.get(mastra.pubsub, 'getLeaseProvider')
      expect(typeof unwrap).toBe('function')
      // The runtime prefers it to the pubsub's own methods: it answers the pubsub itself (the
      // Proxy's target), so Mastra's lease calls still pass through withLeases and are traced.
      expect((unwrap as () => unknown).call(mastra.pubsub)).toBe(leased)
    })

    it("CachingPubSub's getLeaseProvider() surfaces withLeases(...), and nothing for a transport that cannot lease", async () => {
      const leases = new MemoryLeaseProvider()
      const leased = withLeases(new UnixSocketPubSub(socketPath()), leases)
      closables.push(leased)
      const caching = new CachingPubSub(leased, new InMemoryServerCache())
      // CachingPubSub declares no lease methods itself: Mastra must unwrap it.
      expect(isLeaseProvider(caching)).toBe(false)
      const unwrapped = caching.getLeaseProvider()
      expect(unwrapped).toBe(leased)
      const key = threadKey(newThread())
      expect(await unwrapped!.acquireLease(key, 'run-1', 5_000)).toStrictEqual({ acquired: true, owner: 'run-1' })
      expect(await leases.getLeaseOwner(key)).toBe('run-1')
      // Without withLeases, Mastra's runtime gets undefined here and uses NoopLeaseProvider.
      expect(new CachingPubSub(new UnixSocketPubSub(socketPath()), new InMemoryServerCache()).getLeaseProvider()).toBeUndefined()
    })
  })

  describe('an Agent thread run on Mastra', () => {
    /** A mock model whose first answer waits until `open()`: the run stays in its turn meanwhile. */
    function heldModel() {
      let open!: () => void
      const opened = new Promise<void>((r) => (open = r))
      let enter!: () => void
      const entered = new Promise<void>((r) => (enter = r))
      const { model, calls } = createMockModel({
        reply: 'hello from the mock model',
        async beforeReply() {
          enter()
          await opened
        },
      })
      return { model, calls, entered, open }
    }

    type Start = (agent: Agent, thread: Thread) => Promise<{ runId: string; text: Promise<string> }>
    const starts: Record<string, Start> = {
      'agent.stream with a memory thread': async (agent, { resourceId, threadId }) => {
        const output = await agent.stream('hello', { memory: { resource: resourceId, thread: threadId } })
        return { runId: output.runId, text: output.text }
      },
      'agent.sendSignal waking the idle thread': async (agent, thread) => {
        const { accepted } = agent.sendSignal({ type: 'user-message', contents: 'hello' }, { ...thread, ifIdle: { behavior: 'wake' } })
        const result = await accepted
        if (result.action !== 'wake') throw new Error(`expected the signal to wake the idle thread, got ${result.action}`)
        return { runId: result.runId, text: result.output.text }
      },
    }
    const pubsubs: Record<string, (leased: LeasedPubSub) => PubSub> = {
      'withLeases(EventEmitterPubSub, MemoryLeaseProvider)': (leased) => leased,
      'the same inside a CachingPubSub': (leased) => new CachingPubSub(leased, new InMemoryServerCache()),
    }
    const cases = Object.keys(starts).flatMap((start) => Object.keys(pubsubs).map((pubsub) => [start, pubsub] as const))

    it.each(cases)(
      'a run started by %s on %s holds the thread lease in our provider, owned by its runId, and releases it when it completes',
      async (startName, pubsubName) => {
        const provider = new MemoryLeaseProvider()
        const recorder: RecordingLeases = recordingLeases(provider)
        const { model, calls: modelCalls, entered, open } = heldModel()
        const agent = new Agent({ id: 'assistant', name: 'assistant', instructions: 'Answer briefly.', model })
        // EventEmitterPubSub is itself a LeaseProvider (Mastra's in-process one): the lease
        // must land in ours instead.
        const transport = new EventEmitterPubSub()
        const mastra = new Mastra({
          agents: { assistant: agent },
          pubsub: pubsubs[pubsubName]!(withLeases(transport, recorder)),
          logger: false,
        })
        const thread = newThread()
        const key = threadKey(thread)
        try {
          const run = await starts[startName]!(mastra.getAgent('assistant'), thread)
          run.text.catch(() => {}) // awaited below; never an unhandled rejection meanwhile
          expect(run.runId).toEqual(expect.any(String))
          expect(run.runId).not.toBe('')
          await within(entered, 10_000, 'the mock model to be called')

          // Mid-turn: Mastra took the lease on resourceId + "\0" + threadId in our provider.
          const acquires = leaseCalls(recorder.calls, 'acquireLease')
          expect(acquires.length).toBeGreaterThan(0)
          for (const call of acquires) {
            expect(givenArgs(call.args)).toEqual([key, run.runId, THREAD_LEASE_TTL_MS])
            // Mastra's shape exactly: no token, which Mastra never asks for.
            expect(call.result).toStrictEqual({ acquired: true, owner: run.runId })
          }
          expect(await provider.getLeaseOwner(key)).toBe(run.runId)
          expect(await transport.getLeaseOwner(key)).toBeUndefined()
          // A real lease, not Mastra's always-win fallback: a competitor is refused and told the owner.
          expect(await provider.acquireLease(key, 'competitor', 1_000)).toStrictEqual({ acquired: false, owner: run.runId })
          expect(leaseCalls(recorder.calls, 'releaseLease')).toEqual([])

          open()
          expect(await within(run.text, 10_000, 'the run to finish')).toBe('hello from the mock model')
          expect(modelCalls.map((c) => c.userTexts)).toEqual([['hello']])

          // Completion releases it (Mastra does so fire-and-forget once the broadcast ends).
          expect(await pollFor(() => provider.getLeaseOwner(key), undefined)).toBeUndefined()
          expect(leaseCalls(recorder.calls, 'releaseLease').map((c) => givenArgs(c.args))).toEqual([[key, run.runId]])
          // Every lease call Mastra made was on this thread's key.
          expect([...new Set(recorder.calls.map((c) => c.args[0]))]).toEqual([key])
        } finally {
          open()
          await provider.close()
        }
      },
    )

    it('a subscriber to the mastra-lease:lease channel sees the run take the thread lease as its runId and release it, each call with its result', async () => {
      const provider = new MemoryLeaseProvider()
      const { model, open } = heldModel()
      open()
      const agent = new Agent({ id: 'assistant', name: 'assistant', instructions: 'Answer briefly.', model })
      const mastra = new Mastra({ agents: { assistant: agent }, pubsub: withLeases(new EventEmitterPubSub(), provider), logger: false })
      const seen: Array<LeaseCallContext & { event: string }> = []
      const subscribers = {
        start() {},
        end() {},
        asyncStart() {},
        asyncEnd: (context: LeaseCallContext) => void seen.push({ event: 'asyncEnd', ...context }),
        error: (context: LeaseCallContext) => void seen.push({ event: 'error', ...context }),
      }
      leaseChannel.subscribe(subscribers)
      const thread = newThread()
      try {
        const output = await mastra.getAgent('assistant').stream('hello', { memory: { resource: thread.resourceId, thread: thread.threadId } })
        expect(await within(output.text, 10_000, 'the run to finish')).toBe('hello from the mock model')
        await pollFor(() => provider.getLeaseOwner(threadKey(thread)), undefined)
        await pollFor(async () => seen.some((m) => m.operation === 'releaseLease'), true)
        const key = threadKey(thread)
        const acquired = seen.find((m) => m.operation === 'acquireLease')
        expect(acquired).toEqual({
          event: 'asyncEnd', operation: 'acquireLease', key, owner: output.runId, ttlMs: THREAD_LEASE_TTL_MS,
          result: { acquired: true, owner: output.runId },
        })
        expect(acquired!.result).toStrictEqual({ acquired: true, owner: output.runId })
        expect(seen.filter((m) => m.operation === 'releaseLease')).toEqual([{ event: 'asyncEnd', operation: 'releaseLease', key, owner: output.runId, result: undefined }])
        expect(seen.filter((m) => m.event === 'error')).toEqual([])
      } finally {
        leaseChannel.unsubscribe(subscribers)
        await provider.close()
      }
    })
  })

  describe('three processes signalling one thread at once', () => {
    const FIXTURE = path.join(__dirname, 'fixtures', 'thread-signal-process.mjs')
    const PROCESSES = 3
    const signalText = (index: number) => `signal from process ${index}`

    type ChildMessage = { index: number } & (
      | { type: 'ready'; isBroker: boolean }
      | { type: 'model-call'; userTexts: string[] }
      | { type: 'accepted'; action: string; runId?: string }
      | { type: 'settled' }
      | { type: 'report'; modelCalls: Array<{ userTexts: string[] }>; leaseCalls: LeaseCall[]; threadState: string }
      | { type: 'error'; message: string }
    )
    type Of<T extends ChildMessage['type']> = Extract<ChildMessage, { type: T }>

    interface Outcome {
      thread: Thread
      ready: Array<Of<'ready'>>
      accepted: Array<Of<'accepted'>>
      reports: Array<Of<'report'>>
    }

    let redis: RedisServer
    let observer: RedisLeaseProvider
    const live = new Set<ChildProcess>()
    const dirs: string[] = []

    beforeAll(async () => {
      redis = await startRedis()
      observer = new RedisLeaseProvider({ url: redis.url })
    })
    afterAll(async () => {
      for (const child of live) child.kill('SIGKILL')
      await observer?.close()
      await redis?.stop()
      for (const dir of dirs) rmSync(dir, { recursive: true, force: true })
    })

    /**
     * Starts PROCESSES children on one UnixSocketPubSub (with or without Redis leases), waits
     * until all are connected, tells them all to fire at once, and collects what each did.
     */
    async function race(leases: boolean, connection: RedisLeaseProviderOptions = { url: redis.url }): Promise<Outcome> {
      const dir = mkdtempSync(path.join(os.tmpdir(), 'mlx-'))
      dirs.push(dir)
      const thread = newThread()
      const messages: ChildMessage[] = []
      const stderr: string[] = Array.from({ length: PROCESSES }, () => '')
      let failure: Error | undefined
      let wake: () => void = () => {}
      const changed = () => wake()
      let exiting = false

      const children = Array.from({ length: PROCESSES }, (_, index) => {
        const config = { index, socketPath: path.join(dir, 'pubsub.sock'), connection, leases, ...thread }
        const child = fork(FIXTURE, [JSON.stringify(config)], {
          execPath: NODE,
          stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
          env: { ...process.env, MASTRA_TELEMETRY_DISABLED: '1' },
        })
        live.add(child)
        child.stderr?.on('data', (chunk: Buffer) => {
          stderr[index] = (stderr[index] + chunk.toString()).slice(-4_000)
        })
        child.on('message', (message: ChildMessage) => {
          messages.push(message)
          if (message.type === 'error') failure ??= new Error(`process ${index} failed: ${message.message}`)
          changed()
        })
        child.on('exit', (code, signal) => {
          live.delete(child)
          if (!exiting) failure ??= new Error(`process ${index} exited early (${code ?? signal}): ${stderr[index]}`)
          changed()
        })
        return child
      })

      const of = <T extends ChildMessage['type']>(type: T) => messages.filter((m): m is Of<T> => m.type === type)
      /** Resolves when `done()` holds; rejects on a child failure or after `ms`. */
      const until = (done: () => boolean, ms: number, what: string) =>
        new Promise<void>((resolve, reject) => {
          const timer = setTimeout(() => {
            wake = () => {}
            reject(new Error(`timed out after ${ms} ms waiting for ${what}; messages: ${JSON.stringify(messages)}; stderr: ${stderr.join('\n')}`))
          }, ms)
          wake = () => {
            if (failure) {
              clearTimeout(timer)
              wake = () => {}
              reject(failure)
            } else if (done()) {
              clearTimeout(timer)
              wake = () => {}
              resolve()
            }
          }
          wake()
        })
      const sendAll = (type: string) => {
        for (const child of children) child.send({ type })
      }

      try {
        // Barrier: every process connected (to the socket broker and, with leases, Redis).
        await until(() => of('ready').length === PROCESSES, 15_000, 'every process to be ready')
        sendAll('fire')
        // Each model holds its first answer until every process has either had its signal
        // accepted or reached its own model call (see the fixture).
        await until(
          () => Array.from({ length: PROCESSES }, (_, i) => i).every((i) => messages.some((m) => m.index === i && (m.type === 'accepted' || m.type === 'model-call'))),
          15_000,
          'every signal to be accepted or running',
        )
        sendAll('proceed')
        await until(() => of('settled').length === PROCESSES, 20_000, 'every process to see the thread idle')
        sendAll('report')
        await until(() => of('report').length === PROCESSES, 5_000, 'every report')
        const byIndex = <T extends ChildMessage>(list: T[]) => [...list].sort((a, b) => a.index - b.index)
        return { thread, ready: byIndex(of('ready')), accepted: byIndex(of('accepted')), reports: byIndex(of('report')) }
      } finally {
        exiting = true
        sendAll('exit')
        await Promise.all(
          children.map(
            (child) =>
              new Promise<void>((resolve) => {
                if (child.exitCode !== null || child.signalCode !== null) return resolve()
                const timer = setTimeout(() => child.kill('SIGKILL'), 3_000)
                child.once('exit', () => {
                  clearTimeout(timer)
                  resolve()
                })
              }),
          ),
        )
      }
    }

    /** The distinct signal texts a process's model was given. */
    const signalsRun = (report: Of<'report'>) => [...new Set(report.modelCalls.flatMap((c) => c.userTexts))].sort()

    /** Three processes race with leases in Redis at `connection`; exactly one may own the thread. */
    async function oneOwner(connection: RedisLeaseProviderOptions, observer: RedisLeaseProvider) {
      const { thread, ready, accepted, reports } = await race(true, connection)
      const key = threadKey(thread)
      // One shared transport: one broker, the others its clients.
      expect(ready.filter((r) => r.isBroker)).toHaveLength(1)

      const owners = accepted.filter((a) => a.action === 'wake')
      expect(owners, JSON.stringify(accepted)).toHaveLength(1)
      const owner = owners[0]!
      for (const other of accepted.filter((a) => a !== owner)) {
        expect(other).toMatchObject({ action: 'deliver', runId: owner.runId })
      }

      const allSignals = Array.from({ length: PROCESSES }, (_, i) => signalText(i)).sort()
      for (const report of reports) {
        if (report.index === owner.index) expect(signalsRun(report)).toEqual(allSignals)
        else expect(signalsRun(report), `process ${report.index} ran no signal`).toEqual([])
        expect(report.threadState).toBe('idle')
      }

      // The election happened in Redis, through our provider: the owner's run won the
      // thread key, every other process was refused and told that run's id.
      for (const report of reports) {
        const first = leaseCalls(report.leaseCalls, 'acquireLease').find((c) => c.args[0] === key)
        expect(first, `process ${report.index} raced for ${JSON.stringify(key)}`).toBeDefined()
        if (report.index === owner.index) {
          expect(givenArgs(first!.args)).toEqual([key, owner.runId, THREAD_LEASE_TTL_MS])
          expect(first!.result).toStrictEqual({ acquired: true, owner: owner.runId })
        } else {
          expect(first!.result).toStrictEqual({ acquired: false, owner: owner.runId })
          // ...and never held it afterwards.
          const won = report.leaseCalls.filter((c) => c.args[0] === key && (c.result as { acquired?: boolean } | undefined)?.acquired === true)
          expect(won).toEqual([])
        }
      }
      // Released at the end.
      expect(await pollFor(() => observer.getLeaseOwner(key), undefined)).toBeUndefined()
    }

    it('with withLeases(UnixSocketPubSub, RedisLeaseProvider), exactly one process owns the thread and runs all three signals, the others run none', async () => {
      await oneOwner({ url: redis.url }, observer)
    })

    it("the same under a key prefix of its own: Mastra's acquires are plain, so no fencing token was taken (no token key, no counter in Redis)", async () => {
      const keyPrefix = `plain-${randomUUID().slice(0, 8)}`
      const prefixed = new RedisLeaseProvider({ url: redis.url, keyPrefix })
      try {
        await oneOwner({ url: redis.url, keyPrefix }, prefixed)
      } finally {
        await prefixed.close()
      }
      // A fenced grant would have left its slot's counter, which never expires.
      expect(await redis.cli('KEYS', `${keyPrefix}:fence:*`)).toEqual([])
    })

    it.skipIf(EXTERNAL_REDIS)('the same with the leases on a Redis Cluster, and behind Sentinel', async () => {
      const cluster = await startCluster()
      try {
        const connection = { cluster: { nodes: cluster.urls } }
        const clusterObserver = new RedisLeaseProvider(connection)
        await oneOwner(connection, clusterObserver).finally(() => clusterObserver.close())
      } finally {
        await cluster.stop()
      }
      const sentinel = await startSentinel()
      try {
        const connection = { sentinel: { nodes: sentinel.sentinelUrls, masterName: sentinel.masterName } }
        const sentinelObserver = new RedisLeaseProvider(connection)
        await oneOwner(connection, sentinelObserver).finally(() => sentinelObserver.close())
      } finally {
        await sentinel.stop()
      }
    })

    it(
      "without leases (plain UnixSocketPubSub, Mastra's NoopLeaseProvider), more than one process takes the thread: the control showing the test above can fail",
      async () => {
        const { ready, accepted, reports } = await race(false)
        expect(ready.filter((r) => r.isBroker)).toHaveLength(1)
        const owners = accepted.filter((a) => a.action === 'wake')
        expect(owners.length, JSON.stringify(accepted)).toBeGreaterThan(1)
        expect(new Set(owners.map((o) => o.runId)).size).toBe(owners.length)
        const running = reports.filter((r) => signalsRun(r).length > 0)
        expect(running.length).toBeGreaterThan(1)
        // Nothing reached a lease provider of ours: there was none.
        expect(reports.flatMap((r) => r.leaseCalls)).toEqual([])
      },
    )
  })
})
