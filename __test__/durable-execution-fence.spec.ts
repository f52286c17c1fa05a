// Mastra's newest lease caller, the durable-execution fence, driven in its own call pattern
// (fixtures/execution-fence.mjs: acquire polled every 100 ms up to 5 s, a takeover as
// getLeaseOwner then transferLease, renewLease as a heartbeat and as the verify before and
// after each step, retried once after 250 ms) over every provider and deployment, with faults:
// the holder SIGKILLed mid-step, the server frozen during a verify, takeovers racing the
// heartbeat, a Cluster failover. Every history is checked (helpers/fence-history.ts): no step
// commits under two owners at once, and once a run is taken over its old execution's verifies
// fail. Timings are Mastra's scaled down (TTL 1.2 s, heartbeat a third of it); the polling and
// the verify's retry delay are Mastra's own.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { randomUUID } from 'node:crypto'
import path from 'node:path'

import { EventEmitterPubSub, type LeaseProvider } from '@mastra/core/events'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { holdLease, MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub, withLeases } from '../dist/esm/index.js'
import { ExecutionFence, executionKey, FenceError, SUPERSEDED, UNVERIFIED, type FenceTiming } from './fixtures/execution-fence.mjs'
import { checkFenceHistory, figures, type FenceRecord } from './helpers/fence-history.js'
import { leaseFailureWarnings, sleep } from './helpers/lease.js'
import { jsonLinesChild, type Line } from './helpers/json-lines-child.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

// A frozen or killed server fails lease calls, which warn through process.emitWarning (no logger here).
leaseFailureWarnings()

const FENCE_PROCESS = path.join(__dirname, 'fixtures', 'fence-process.mjs')
const TIMING: FenceTiming = { ttlMs: 1_200, heartbeatMs: 400, pollMs: 100, claimWaitMs: 5_000, verifyRetryMs: 250, takeoverTries: 3 }
const VIAS = ['provider', 'pubsub', 'withLeases'] as const
type Via = (typeof VIAS)[number]

let redis: RedisServer
const closeAfter: Array<{ close(): Promise<void> }> = []
beforeAll(async () => {
  redis = await startRedis()
})
afterAll(async () => {
  await Promise.allSettled(closeAfter.map((c) => c.close()))
  await redis?.stop()
})

const newRun = (label: string) => executionKey(`agent-${label}`, `run-${randomUUID()}`)

/** A provider of this package's, the three ways Mastra gets one, closed after the suite. */
function leasesVia(via: Via, options: ConstructorParameters<typeof RedisLeaseProvider>[0]): LeaseProvider {
  const leases =
    via === 'pubsub'
      ? new RedisStreamsPubSub(options)
      : via === 'withLeases'
        ? withLeases(new EventEmitterPubSub(), new RedisLeaseProvider(options))
        : new RedisLeaseProvider(options)
  closeAfter.push(leases)
  return leases
}

/** A fence process (fixtures/fence-process.mjs): its records as they come, its end, a kill. */
function fenceProcess(config: { via: Via; connection: object; keyPrefix: string; key: string; mode: 'acquire' | 'takeover'; steps: number; stepMs: number; timing?: FenceTiming }) {
  const records: FenceRecord[] = []
  const child = jsonLinesChild(FENCE_PROCESS, { timing: TIMING, ...config }, (line) => {
    if (['claim', 'takeover', 'verify', 'step', 'lost'].includes(line.type)) records.push(line as unknown as FenceRecord)
  })
  const said = child.lines
  return {
    records,
    /** Resolves once a line of `type` (and passing `also`) came. */
    async saw(type: string, also: (line: Line) => boolean = () => true, ms = 10_000) {
      const deadline = Date.now() + ms
      while (!said.some((l) => l.type === type && also(l))) {
        if (Date.now() > deadline || child.child.exitCode !== null) throw new Error(`the fence process never said ${type}; stderr: ${child.stderr()}`)
        await sleep(10)
      }
    },
    /** How it ended: `done`'s outcome, or `killed`. */
    async outcome(): Promise<string> {
      const { code, signal } = await child.exited
      const done = said.find((l) => l.type === 'done')
      if (done) return done.outcome as string
      if (signal === 'SIGKILL') return 'killed'
      throw new Error(`the fence process exited ${code}; stderr: ${child.stderr()}`)
    },
    kill: child.kill,
  }
}

/** Checks a history, failing with its first violations, and answers its figures. */
function checked(records: FenceRecord[]) {
  const report = checkFenceHistory(records)
  expect(report.overlaps, 'committed steps under two owners').toEqual([])
  expect(report.lateVerifies, 'verifies that held after a takeover').toEqual([])
  return report
}

describe.skipIf(EXTERNAL_REDIS)("Mastra's durable-execution fence over RedisLeaseProvider, RedisStreamsPubSub and withLeases", () => {
  const on = (via: Via, keyPrefix: string) => ({ via, connection: { url: redis.url }, keyPrefix })

  for (const via of VIAS) {
    it(`(${via}) executions of one run claimed in four processes at once (acquire, polled every 100 ms) run one after another; no step commits under two owners`, async ({ annotate }) => {
      const key = newRun('race')
      const racers = Array.from({ length: 4 }, () => fenceProcess({ ...on(via, `fence-race:${via}`), key, mode: 'acquire', steps: 3, stepMs: 60 }))
      expect(await Promise.all(racers.map((r) => r.outcome()))).toEqual(['done', 'done', 'done', 'done'])
      const report = checked(racers.flatMap((r) => r.records))
      expect(report).toMatchObject({ claims: 4, steps: 12, committed: 12, takeovers: 0 })
      await annotate(`${via}: ${figures(report)}`)
    })

    it(`(${via}) takeovers (recover with force) racing the running execution's heartbeat supersede it: its next verify fails and it stops; no step commits under two owners`, async ({ annotate }) => {
      const key = newRun('takeover')
      const fast = { ...TIMING, heartbeatMs: 40 }
      const first = fenceProcess({ ...on(via, `fence-takeover:${via}`), key, mode: 'acquire', steps: 200, stepMs: 15, timing: fast })
      await first.saw('claimed')
      const rest = []
      for (let i = 0; i < 3; i++) {
        await sleep(60 + Math.random() * 120)
        const next = fenceProcess({ ...on(via, `fence-takeover:${via}`), key, mode: 'takeover', steps: i === 2 ? 3 : 200, stepMs: 15, timing: fast })
        rest.push(next)
        await next.saw('claimed')
      }
      const outcomes = await Promise.all([first, ...rest].map((p) => p.outcome()))
      expect(outcomes).toEqual([SUPERSEDED, SUPERSEDED, SUPERSEDED, 'done'])
      const report = checked([first, ...rest].flatMap((p) => p.records))
      expect(report.takeovers).toBe(3)
      expect(report.failedVerifies).toBeGreaterThanOrEqual(3)
      await annotate(`${via}: ${figures(report)}`)
    })
  }

  it('the holder SIGKILLed mid-step: an execution polling to acquire takes the run once the TTL its last verify gave ran out, a takeover takes it at once, and the killed step never commits', async ({ annotate }) => {
    const records: FenceRecord[] = []
    const record = (r: FenceRecord) => void records.push(r)
    const leases = leasesVia('provider', { url: redis.url, keyPrefix: 'fence-killed' })
    const lines: string[] = []
    for (const mode of ['acquire', 'takeover'] as const) {
      const key = newRun(`killed-${mode}`)
      const holder = fenceProcess({ ...on('provider', 'fence-killed'), key, mode: 'acquire', steps: 3, stepMs: 5_000 })
      await holder.saw('verify', (l) => l.why === 'verify' && l.outcome === 'ok')
      await sleep(100)
      holder.kill()
      expect(await holder.outcome()).toBe('killed')
      records.push(...holder.records)
      const lastVerified = Math.max(...holder.records.filter((r) => r.type === 'verify').map((r) => Number(BigInt((r as { received: string }).received) / 1_000_000n)))
      const fence = await ExecutionFence.claim(leases, key, mode, { timing: TIMING, record })
      const claimedAt = Number(process.hrtime.bigint() / 1_000_000n)
      await fence.step(1, () => sleep(20))
      await fence.settle()
      const after = claimedAt - lastVerified
      if (mode === 'acquire') {
        // Not before the TTL the last verify set (its reply came after the write), and within a poll or so of it.
        expect(after).toBeGreaterThanOrEqual(TIMING.ttlMs - 20)
        expect(after).toBeLessThan(TIMING.ttlMs + TIMING.heartbeatMs + TIMING.pollMs + 300)
      } else {
        expect(after).toBeLessThan(TIMING.ttlMs / 2)
      }
      lines.push(`${mode}: ran ${after} ms after the killed holder's last verify`)
    }
    const report = checked(records)
    expect(report).toMatchObject({ claims: 4, takeovers: 1, committed: 2 })
    expect(records.filter((r) => r.type === 'step' && !r.committed)).toEqual([])
    await annotate(`${lines.join('; ')}; ${figures(report)}`)
  })

  it("the server frozen during a step's verify: the verify times out, is sent once more after 250 ms, and the execution stops unverified without committing; a takeover after the thaw runs the run", async ({ annotate }) => {
    const own = await startRedis()
    try {
      const records: FenceRecord[] = []
      const record = (r: FenceRecord) => void records.push(r)
      const make = () => leasesVia('provider', { url: own.url, keyPrefix: 'fence-frozen', commandTimeoutMs: 300 })
      const key = newRun('frozen')
      const fence = await ExecutionFence.claim(make(), key, 'acquire', { timing: TIMING, record })
      await fence.step(1, () => sleep(10))
      const started = performance.now()
      const stopped = await fence
        .step(2, async () => {
          own.freeze()
          await sleep(20)
        })
        .then(() => undefined, (err: unknown) => err)
      const stoppedAfter = performance.now() - started
      own.thaw()
      expect(stopped).toBeInstanceOf(FenceError)
      expect((stopped as FenceError).id).toBe(UNVERIFIED)
      expect(fence.lost?.id).toBe(UNVERIFIED)
      // Two sends of 300 ms at most, 250 ms apart.
      expect(stoppedAfter).toBeGreaterThanOrEqual(2 * 300 + 250 - 50)
      expect(stoppedAfter).toBeLessThan(2_000)
      await fence.settle()
      const next = await ExecutionFence.claim(make(), key, 'takeover', { timing: TIMING, record })
      await next.step(1, () => sleep(10))
      await next.settle()
      const report = checked(records)
      expect(records.filter((r) => r.type === 'step').map((r) => [(r as { owner: string }).owner === fence.owner, (r as { committed: boolean }).committed])).toEqual([
        [true, true],
        [true, false],
        [false, true],
      ])
      await annotate(`stopped ${stoppedAfter.toFixed(0)} ms after the frozen verify began; ${figures(report)}`)
    } finally {
      await own.stop()
    }
  })
})

describe('over MemoryLeaseProvider, and Mastra’s EventEmitterPubSub through withLeases', () => {
  for (const [name, make] of [
    ['MemoryLeaseProvider', () => new MemoryLeaseProvider()],
    ['withLeases(EventEmitterPubSub, MemoryLeaseProvider)', () => withLeases(new EventEmitterPubSub(), new MemoryLeaseProvider())],
  ] as const) {
    it(`(${name}) executions contending and taking over in one process: none commits a step under two owners, and each one taken over stops at its next verify`, async ({ annotate }) => {
      const leases = make()
      closeAfter.push(leases)
      const records: FenceRecord[] = []
      const record = (r: FenceRecord) => void records.push(r)
      const timing = { ...TIMING, heartbeatMs: 20 }
      const key = newRun('memory')
      const run = async (mode: 'acquire' | 'takeover', steps: number) => {
        const fence = await ExecutionFence.claim(leases, key, mode, { timing, record })
        try {
          for (let n = 1; n <= steps; n++) await fence.step(n, () => sleep(5 + Math.random() * 10))
          return 'done'
        } catch (err) {
          return (err as FenceError).id
        } finally {
          await fence.settle()
        }
      }
      const runs = [run('acquire', 30), run('acquire', 5)]
      for (let i = 0; i < 4; i++) {
        await sleep(30 + Math.random() * 40)
        runs.push(run('takeover', i === 3 ? 5 : 30))
      }
      const outcomes = await Promise.all(runs)
      expect(outcomes.filter((o) => o === SUPERSEDED).length).toBeGreaterThanOrEqual(3)
      const report = checked(records)
      expect(report.takeovers).toBe(4)
      await annotate(`${name}: ${figures(report)}`)
    })
  }

  it('the checker finds what a provider whose renewLease always holds lets through: committed steps under two owners and verifies that held after a takeover', async () => {
    const memory = new MemoryLeaseProvider()
    closeAfter.push(memory)
    const broken: LeaseProvider = {
      acquireLease: (k, o, t) => memory.acquireLease(k, o, t),
      getLeaseOwner: (k) => memory.getLeaseOwner(k),
      releaseLease: (k, o) => memory.releaseLease(k, o),
      renewLease: async () => true,
      transferLease: (k, f, t, ttl) => memory.transferLease(k, f, t, ttl),
    }
    const records: FenceRecord[] = []
    const record = (r: FenceRecord) => void records.push(r)
    const key = newRun('broken')
    const first = await ExecutionFence.claim(broken, key, 'acquire', { timing: TIMING, record })
    const running = (async () => {
      for (let n = 1; n <= 10; n++) await first.step(n, () => sleep(10))
    })()
    await sleep(25)
    const second = await ExecutionFence.claim(broken, key, 'takeover', { timing: TIMING, record })
    for (let n = 1; n <= 5; n++) await second.step(n, () => sleep(10))
    await running
    await Promise.all([first.settle(), second.settle()])
    const report = checkFenceHistory(records)
    expect(report.overlaps.length).toBeGreaterThan(0)
    expect(report.lateVerifies.length).toBeGreaterThan(0)
  })
})

describe.skipIf(EXTERNAL_REDIS)("Mastra's durable-execution fence on a Redis Cluster", () => {
  let cluster: RedisCluster
  beforeAll(async () => {
    cluster = await startCluster({ replicasPerMaster: 1 })
  }, 60_000)
  afterAll(async () => {
    await cluster?.stop()
  })

  it('runs on every master, each claimed by three executions at once: one after another, no step under two owners', async ({ annotate }) => {
    const records: FenceRecord[] = []
    const record = (r: FenceRecord) => void records.push(r)
    const keys: string[] = []
    const masters = new Set<number>()
    while (masters.size < 3 || keys.length < 3) {
      const key = newRun('cluster')
      const port = (await cluster.masterOfSlot(await cluster.keySlot(`mastra:topic:lease:${key}`))).port
      if (masters.has(port)) continue
      masters.add(port)
      keys.push(key)
    }
    const execution = async (key: string) => {
      const fence = await ExecutionFence.claim(leasesVia('provider', { cluster: { nodes: cluster.urls } }), key, 'acquire', { timing: TIMING, record })
      for (let n = 1; n <= 3; n++) await fence.step(n, () => sleep(30))
      await fence.settle()
    }
    await Promise.all(keys.flatMap((key) => [execution(key), execution(key), execution(key)]))
    const report = checked(records)
    expect(report).toMatchObject({ claims: 9, committed: 27 })
    await annotate(`cluster, 3 masters: ${figures(report)}`)
  })

  it("the run's master killed and failed over under a running execution: it stops at a verify or goes on, and whoever runs the run next never commits a step beside it", async ({ annotate }) => {
    const records: FenceRecord[] = []
    const record = (r: FenceRecord) => void records.push(r)
    const options = { cluster: { nodes: cluster.urls }, commandTimeoutMs: 500 }
    const key = newRun('failover')
    const first = await ExecutionFence.claim(leasesVia('provider', options), key, 'acquire', { timing: TIMING, record })
    // Steps until it learns it lost the run: a verify that cannot be made, or one that fails.
    const running = (async () => {
      for (let n = 1; n <= 400; n++) await first.step(n, () => sleep(20))
    })().catch(() => {})
    await sleep(200)
    const master = await cluster.masterOfSlot(await cluster.keySlot(`mastra:topic:lease:${key}`))
    const failoverMs = await cluster.killMasterAndWaitForPromotion(master)
    // A second execution asks for the run as Mastra's recover() does once the first is gone
    // or stuck: polling, then by takeover.
    const second = await ExecutionFence.claim(leasesVia('provider', options), key, 'acquire', { timing: { ...TIMING, claimWaitMs: 3_000 }, record }).catch(() =>
      ExecutionFence.claim(leasesVia('provider', options), key, 'takeover', { timing: TIMING, record }),
    )
    for (let n = 1; n <= 5; n++) await second.step(n, () => sleep(20))
    await running
    await Promise.all([first.settle().catch(() => {}), second.settle()])
    const report = checked(records)
    expect(first.lost, 'the first execution learnt it lost the run').toBeDefined()
    await annotate(`failover ${failoverMs.toFixed(0)} ms; the first execution ended ${first.lost?.id}; ${figures(report)}`)
  })
})

describe.skipIf(EXTERNAL_REDIS)("what waiting saves over the fence's polling", () => {
  it('a run released by its holder goes to an execution waiting with hold({ wait: true }) within milliseconds, where polling every 100 ms takes about half a poll', async ({ annotate }) => {
    const leases = new RedisLeaseProvider({ url: redis.url, keyPrefix: 'fence-wait' })
    const holder = new RedisLeaseProvider({ url: redis.url, keyPrefix: 'fence-wait' })
    closeAfter.push(leases, holder)
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
    const rounds = 15
    const polled: number[] = []
    const waited: number[] = []
    for (let round = 0; round < rounds; round++) {
      for (const how of ['poll', 'wait'] as const) {
        const key = newRun('handover')
        await holder.acquireLease(key, 'old', 60_000)
        const taken =
          how === 'poll'
            ? (async () => {
                for (;;) {
                  if ((await leases.acquireLease(key, 'new', 60_000)).acquired) return performance.now()
                  await sleep(100)
                }
              })()
            : holdLease(leases, key, 'new', { ttlMs: 60_000, wait: true }).then(async (lease) => {
                const at = performance.now()
                await lease.release()
                return at
              })
        // The release comes at a random moment of the poll's cycle.
        await sleep(150 + Math.random() * 100)
        await holder.releaseLease(key, 'old')
        const releasedAt = performance.now()
        ;(how === 'poll' ? polled : waited).push((await taken) - releasedAt)
      }
    }
    expect(median(waited)).toBeLessThan(median(polled))
    await annotate(
      `release to the next execution's grant, median of ${rounds}: polling every 100 ms ${median(polled).toFixed(1)} ms, hold({ wait: true }) ${median(waited).toFixed(1)} ms`,
    )
  })
})
