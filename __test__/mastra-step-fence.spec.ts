// Upstream Mastra's evented step fence (after @mastra/core 1.71; docs/mastra-callers.md), driven
// through this package's providers in its own call pattern (fixtures/lease-callers.mjs): each
// delivery of a `workflow.step.run` acquires `workflow-step-run:${runId}:${eventId}` under a fresh
// random owner for 30 s (scaled down here, with its heartbeat at a third), a delivery that
// cannot is dropped as a duplicate, an acquire that throws runs the step anyway. In one process
// over MemoryLeaseProvider, RedisLeaseProvider and RedisStreamsPubSub; in worker processes
// behind Mastra's own PullTransport on RedisStreamsPubSub, whose redeliveries (a delivery is
// held until it settles; `inFlightTimeoutMs`; a dead worker's reclaimed) are what the fence
// meets in production. Every history is checked (helpers/fence-history.ts): two deliveries of
// one step never both run while both hold the fence.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { randomUUID } from 'node:crypto'
import path from 'node:path'

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub } from '../dist/esm/index.js'
import { handleStepRun, stepFenceKey, stepRunEvent, stepTaking, type StepResult } from './fixtures/lease-callers.mjs'
import { alwaysAcquired, recordLeases, type LeaseOperation } from './fixtures/lease-recorder.mjs'
import { checkStepFenceHistory, stepFigures, type StepRecord } from './helpers/fence-history.js'
import { jsonLinesChild } from './helpers/json-lines-child.js'
import { leaseFailureWarnings, sleep, type LeaseApi } from './helpers/lease.js'
import { perTest } from './helpers/per-test.js'
import { PROVIDER_KINDS, providerFleet, type ProviderKind } from './helpers/provider-fleet.js'
import { until } from './helpers/redis-process.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { pendingCount } from './helpers/streams-suite.js'
import { uniquePrefix } from './helpers/streams.js'

// A stopped or frozen server fails lease calls, which warn through process.emitWarning.
leaseFailureWarnings()

const WORKER = path.join(__dirname, 'fixtures', 'step-fence-worker.mjs')
/** The fence's TTL scaled down from Mastra's 30 s; its heartbeat renews every third. */
const TTL_MS = 1_200

let redis: RedisServer
const { providers, ownServer } = perTest()
const workers: Array<{ kill(): void }> = []
beforeAll(async () => {
  redis = await startRedis()
})
afterEach(() => {
  for (const w of workers.splice(0)) w.kill()
})
afterAll(async () => {
  await redis?.stop()
})

/** `n` handlers' providers of one kind sharing one store (helpers/provider-fleet.ts). */
const fleet = (kind: ProviderKind, n: number, url = redis.url) => providerFleet(kind, n, url, providers)

/** A history being recorded: the lease calls of every provider `leases()` wraps, and the deliveries. */
function stepHistory() {
  const operations: LeaseOperation[] = []
  const records: StepRecord[] = []
  return {
    operations,
    records,
    leases: (provider: LeaseApi) => recordLeases(provider, (op) => operations.push(op)),
    record: (r: StepRecord) => void records.push(r),
  }
}

/** Checks a history, failing with its first violations, and answers its figures. */
function checked(operations: LeaseOperation[], records: StepRecord[]) {
  const report = checkStepFenceHistory(operations, records)
  expect(report.bothHeld, 'two deliveries ran while both held the fence').toEqual([])
  expect(report.leaseOverlaps, 'two owners held the fence at once').toEqual([])
  return report
}

const warnings = (records: StepRecord[]) => records.flatMap((r) => (r.type === 'warn' ? [r.message] : []))

describe('the evented step fence in one process', () => {
  for (const kind of PROVIDER_KINDS) {
    it(`(${kind}) a step's delivery and three redeliveries at once, each on its own connection: one runs, three are dropped as duplicates; after the step succeeded a duplicate is dropped until the fence's TTL and runs the step again after it; history-checked`, async ({
      annotate,
    }) => {
      const h = stepHistory()
      const handlers = fleet(kind, 4).map(h.leases)
      const [runId, eventId] = [`run-${randomUUID()}`, randomUUID()]
      let steps = 0
      const step = async (): Promise<StepResult> => {
        steps++
        await sleep(600) // a heartbeat renews meanwhile
        return { ok: true }
      }
      const deliver = (handler: number, attempt: number) => handleStepRun(handlers[handler]!, stepRunEvent(runId, eventId, attempt), step, { ttlMs: TTL_MS, record: h.record })

      expect(await Promise.all([0, 1, 2, 3].map((i) => deliver(i, i + 1)))).toEqual([{ ok: true }, { ok: true }, { ok: true }, { ok: true }])
      expect(steps).toBe(1)
      expect(await deliver(1, 5)).toEqual({ ok: true })
      expect(steps, 'a duplicate while the fence lives').toBe(1)
      await sleep(TTL_MS + 300)
      await deliver(2, 6)
      expect(steps, 'a duplicate after the fence expired').toBe(2)

      const report = checked(h.operations, h.records)
      expect(report).toMatchObject({ runs: 2, dropped: 4, unfenced: 0, concurrent: 0, pastFence: 0 })
      expect(h.operations.filter((op) => op.op === 'renew' && op.outcome === 'ok').length, 'heartbeat renewals').toBeGreaterThanOrEqual(2)
      expect(new Set(h.operations.map((op) => op.key))).toEqual(new Set([stepFenceKey(runId, eventId)]))
      await annotate(`${kind}: ${stepFigures(report)}`)
    })

    it(`(${kind}) a step that fails releases its fence at once, so the transport's retry runs it without waiting out the TTL`, async () => {
      const h = stepHistory()
      const [first, retry] = fleet(kind, 2).map(h.leases)
      const [runId, eventId] = [`run-${randomUUID()}`, randomUUID()]
      const outcomes: StepResult[] = [{ ok: false, retry: true }, { ok: true }]
      const step = async () => outcomes.shift()!
      const options = { ttlMs: 60_000, record: h.record }
      expect(await handleStepRun(first!, stepRunEvent(runId, eventId, 1), step, options)).toEqual({ ok: false, retry: true })
      const retriedAt = performance.now()
      expect(await handleStepRun(retry!, stepRunEvent(runId, eventId, 2), step, options)).toEqual({ ok: true })
      expect(performance.now() - retriedAt).toBeLessThan(2_000)
      expect(outcomes).toEqual([])
      expect(h.operations.filter((op) => op.op === 'release').length).toBe(1)
      expect(checked(h.operations, h.records)).toMatchObject({ runs: 2, dropped: 0 })
    })
  }

  it("the checker finds what a provider that grants every acquire lets through: two deliveries of one step running while both hold the fence", async () => {
    const h = stepHistory()
    const memory = new MemoryLeaseProvider()
    providers.push(memory)
    const broken = h.leases(alwaysAcquired(memory))
    const [runId, eventId] = [`run-${randomUUID()}`, randomUUID()]
    await Promise.all([1, 2].map((attempt) => handleStepRun(broken, stepRunEvent(runId, eventId, attempt), stepTaking(100), { ttlMs: TTL_MS, record: h.record })))
    const report = checkStepFenceHistory(h.operations, h.records)
    expect(report.bothHeld.length).toBeGreaterThan(0)
    expect(report.leaseOverlaps.length).toBeGreaterThan(0)
  })
})

describe.skipIf(EXTERNAL_REDIS)('the evented step fence when its server fails', () => {
  it('the server stopped: each acquire rejects and its step runs anyway, unfenced, so two deliveries of one step run at once; a delivery once the server is back takes the fence and runs beside them', async ({
    annotate,
  }) => {
    const own = await ownServer()
    const h = stepHistory()
    const handlers = fleet('RedisLeaseProvider', 3, own.url).map(h.leases)
    const [runId, eventId] = [`run-${randomUUID()}`, randomUUID()]
    await handlers[0]!.getLeaseOwner('warm') // the connection is open before the server goes
    let running = 0
    let most = 0
    const step = async (): Promise<StepResult> => {
      most = Math.max(most, ++running)
      await sleep(1_500)
      running--
      return { ok: true }
    }
    await own.kill()
    const deliver = (handler: number, attempt: number) => handleStepRun(handlers[handler]!, stepRunEvent(runId, eventId, attempt), step, { ttlMs: TTL_MS, record: h.record })
    const unfenced = [deliver(0, 1), deliver(1, 2)]
    await sleep(200)
    await own.restart()
    const fenced = deliver(2, 3)
    expect(await Promise.all([...unfenced, fenced])).toEqual([{ ok: true }, { ok: true }, { ok: true }])

    expect(most, 'steps running at once').toBe(3)
    const report = checked(h.operations, h.records)
    expect(report).toMatchObject({ runs: 3, unfenced: 2, dropped: 0, concurrent: 3 })
    expect(warnings(h.records).filter((m) => m === 'failed to acquire step fence').length).toBe(2)
    const failed = h.operations.filter((op) => op.op === 'acquire' && op.outcome === 'error')
    expect(failed.map((op) => op.error)).toEqual([expect.stringMatching(/^ERR_LEASE_/), expect.stringMatching(/^ERR_LEASE_/)])
    await annotate(`acquires failed with ${failed.map((op) => `${op.error} after ${(Number(op.end - op.start) / 1e6).toFixed(0)} ms`).join(', ')}; ${stepFigures(report)}`)
  })

  it("the server frozen past the fence's TTL under a running step: the heartbeat's renewals reject, then one answers false and the heartbeat stops (the fence is lost, the step runs on); a redelivery after the thaw runs beside it, the two never both holding the fence", async ({
    annotate,
  }) => {
    const own = await ownServer()
    const h = stepHistory()
    const keyPrefix = uniquePrefix('step-fence-frozen')
    const [first, second] = [0, 1].map(() => {
      const provider = new RedisLeaseProvider({ url: own.url, keyPrefix, commandTimeoutMs: 300 })
      providers.push(provider)
      return h.leases(provider)
    })
    const [runId, eventId] = [`run-${randomUUID()}`, randomUUID()]
    const long = handleStepRun(first!, stepRunEvent(runId, eventId, 1), stepTaking(4_000), { ttlMs: TTL_MS, record: h.record })
    await sleep(500) // the heartbeat renewed once
    own.freeze()
    await sleep(TTL_MS + 800)
    own.thaw()
    await until('the heartbeat to learn the fence was lost', 3_000, async () => (warnings(h.records).includes('lost step fence') ? undefined : warnings(h.records).join(', ')), 20)
    const redelivered = await handleStepRun(second!, stepRunEvent(runId, eventId, 2), stepTaking(300), { ttlMs: TTL_MS, record: h.record })
    expect(redelivered).toEqual({ ok: true })
    expect(await long).toEqual({ ok: true })

    const seen = warnings(h.records)
    expect(seen).toContain('failed to renew step fence')
    expect(seen.filter((m) => m === 'lost step fence').length).toBe(1)
    // After the false answer the heartbeat sent nothing more.
    const lostAt = h.operations.find((op) => op.op === 'renew' && op.outcome === 'refused')!.end
    const firstOwner = of(h.records, 'run-start')[0]!.owner
    expect(h.operations.filter((op) => op.op === 'renew' && op.owner === firstOwner && op.start > lostAt)).toEqual([])
    const report = checked(h.operations, h.records)
    expect(report).toMatchObject({ runs: 2, concurrent: 1, pastFence: 1 })
    await annotate(stepFigures(report))
  })
})

/** A worker process (fixtures/step-fence-worker.mjs): its lease calls and records as they come. */
function stepWorker(config: { keyPrefix: string; stepMs: number; ttlMs: number; streams: Record<string, unknown> }) {
  const operations: LeaseOperation[] = []
  const records: StepRecord[] = []
  const warned: string[] = []
  const child = jsonLinesChild(WORKER, { url: redis.url, ...config }, (line) => {
    if (line.type === 'op') operations.push({ ...(line as unknown as LeaseOperation), start: BigInt(line.start as string), end: BigInt(line.end as string) })
    else if (line.type === 'streams-warn') warned.push(line.message as string)
    else if (line.type !== 'ready') records.push(line as unknown as StepRecord)
  })
  const worker = {
    operations,
    records,
    warned,
    pid: () => child.child.pid,
    async ready() {
      const deadline = Date.now() + 10_000
      while (!child.lines.some((l) => l.type === 'ready')) {
        if (Date.now() > deadline || child.child.exitCode !== null) throw new Error(`the worker never got ready; stderr: ${child.stderr()}`)
        await sleep(10)
      }
    },
    /** SIGTERM, and its exit. */
    async stop() {
      child.child.kill('SIGTERM')
      const { code } = await child.exited
      if (code !== 0) throw new Error(`the worker exited ${code}; stderr: ${child.stderr()}`)
    },
    kill: child.kill,
    exited: child.exited,
  }
  workers.push(worker)
  return worker
}

const of = <T extends StepRecord['type']>(records: StepRecord[], type: T) => records.filter((r): r is Extract<StepRecord, { type: T }> => r.type === type)

describe.skipIf(EXTERNAL_REDIS)("the evented step fence in worker processes behind Mastra's PullTransport on RedisStreamsPubSub", () => {
  it('steps that outlast inFlightTimeoutMs in three workers: each step is nacked on its stalled handler\'s behalf and redelivered (same id, deliveryAttempt 2), the redelivery is dropped by the fence, and every step runs once; history-checked', async ({
    annotate,
  }) => {
    const keyPrefix = uniquePrefix('step-fence-in-flight')
    const config = { keyPrefix, stepMs: 2_000, ttlMs: TTL_MS, streams: { inFlightTimeoutMs: 600, blockMs: 100, maxInFlight: 1 } }
    const fleet = [stepWorker(config), stepWorker(config), stepWorker(config)]
    await Promise.all(fleet.map((w) => w.ready()))
    const publisher = new RedisStreamsPubSub({ url: redis.url, keyPrefix })
    providers.push(publisher)
    const runId = `run-${randomUUID()}`
    await Promise.all([1, 2, 3, 4].map((n) => publisher.publish('workflows', { type: 'workflow.step.run', runId, data: { n } })))

    const records = () => fleet.flatMap((w) => w.records)
    await until('four steps run and their redeliveries dropped', 15_000, async () =>
      of(records(), 'run-end').length === 4 && of(records(), 'drop').length >= 4 ? undefined : `${of(records(), 'run-end').length} run, ${of(records(), 'drop').length} dropped`,
    )
    await sleep(300) // nothing more comes
    await Promise.all(fleet.map((w) => w.stop()))

    const all = records()
    const runs = of(all, 'run-start')
    const drops = of(all, 'drop')
    expect(runs.map((r) => r.attempt)).toEqual([1, 1, 1, 1])
    expect(new Set(runs.map((r) => r.eventId)).size).toBe(4)
    expect(drops.map((d) => d.attempt)).toEqual([2, 2, 2, 2])
    expect(new Set(drops.map((d) => d.eventId))).toEqual(new Set(runs.map((r) => r.eventId)))
    expect(fleet.flatMap((w) => w.warned).filter((m) => /inFlightTimeoutMs/.test(m)).length, "nacks on a stalled handler's behalf").toBe(4)
    const report = checked(
      fleet.flatMap((w) => w.operations),
      all,
    )
    expect(report).toMatchObject({ runs: 4, dropped: 4, unfenced: 0, concurrent: 0 })
    expect(await pendingCount(redis, `${keyPrefix}:workflows`, 'mastra-orchestration')).toBe(0)
    await annotate(stepFigures(report))
  })

  /** One step run by a worker killed mid-step, and a sibling that reclaims the delivery after `reclaimIdleMs`. */
  async function killedMidStep(reclaimIdleMs: number, ttlMs: number, waitMs: number) {
    const keyPrefix = uniquePrefix('step-fence-killed')
    const config = { keyPrefix, stepMs: 2_500, ttlMs, streams: { reclaimIdleMs, reclaimIntervalMs: 100, blockMs: 100 } }
    const first = stepWorker(config)
    await first.ready()
    const publisher = new RedisStreamsPubSub({ url: redis.url, keyPrefix })
    providers.push(publisher)
    await publisher.publish('workflows', { type: 'workflow.step.run', runId: `run-${randomUUID()}`, data: {} })
    await until('the first worker to start the step', 10_000, async () => (of(first.records, 'run-start').length === 1 ? undefined : 'not started'), 10)
    const sibling = stepWorker(config)
    await sibling.ready()
    await sleep(200)
    first.kill()
    await first.exited
    const killedAt = process.hrtime.bigint()
    // Its step ended with its process, at the latest.
    const [started] = of(first.records, 'run-start')
    first.records.push({ type: 'run-end', key: started!.key, owner: started!.owner, at: killedAt, ok: false })
    await until("the sibling's delivery", waitMs, async () => (of(sibling.records, 'run-end').length + of(sibling.records, 'drop').length === 1 ? undefined : 'not yet'), 20)
    await sleep(300)
    await sibling.stop()
    return { first, sibling, killedAt, pending: await pendingCount(redis, `${keyPrefix}:workflows`, 'mastra-orchestration') }
  }

  it("a worker SIGKILLed mid-step: with reclaimIdleMs above 1.5 times the fence's TTL, a sibling reclaims the delivery after the dead worker's fence lapsed and runs the step; history-checked", async ({
    annotate,
  }) => {
    const { first, sibling, killedAt } = await killedMidStep(2_000, TTL_MS, 10_000)
    const [killed] = of(first.records, 'run-start')
    const [rerun] = of(sibling.records, 'run-start')
    expect(rerun).toMatchObject({ eventId: killed!.eventId, attempt: 2, fenced: true })
    expect(of(sibling.records, 'run-end')).toMatchObject([{ ok: true }])
    const report = checked([...first.operations, ...sibling.operations], [...first.records, ...sibling.records])
    expect(report).toMatchObject({ runs: 2, dropped: 0, concurrent: 0 })
    const lastGrant = first.operations.filter((op) => op.outcome === 'ok').at(-1)!
    const lapsedMs = (Number(BigInt(rerun!.at as string) - lastGrant.start) / 1e6 - TTL_MS).toFixed(0)
    await annotate(`rerun ${(Number(BigInt(rerun!.at as string) - killedAt) / 1e6).toFixed(0)} ms after the kill, ${lapsedMs} ms after the dead worker's fence lapsed; ${stepFigures(report)}`)
  })

  it("with reclaimIdleMs under the fence's TTL, a killed worker's reclaimed delivery finds the dead worker's fence still live and is dropped as a duplicate (acked): the step never runs again", async ({
    annotate,
  }) => {
    const { first, sibling, pending } = await killedMidStep(600, 3_000, 5_000)
    const [killed] = of(first.records, 'run-start')
    expect(of(sibling.records, 'drop')).toMatchObject([{ eventId: killed!.eventId, attempt: 2 }])
    expect(of(sibling.records, 'run-start')).toEqual([])
    expect(pending, 'nothing left to redeliver').toBe(0)
    await annotate(stepFigures(checked([...first.operations, ...sibling.operations], [...first.records, ...sibling.records])))
  })
})
