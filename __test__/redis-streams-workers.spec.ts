// RedisStreamsPubSub driven the way Mastra's workers drive a pubsub: the real PullTransport of
// @mastra/core/worker, whose callback returns at once and acks (or nacks, without a catch)
// when the step ends, seconds or minutes later, and a real evented workflow run by Mastra's
// OrchestrationWorker in two processes. Every job must be handled once, however long its step
// runs; ack() and nack() must never reject, whatever Redis does.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'

import type { Event } from '@mastra/core/events'
import { PullTransport } from '@mastra/core/worker'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub, type RedisStreamsPubSubOptions } from '../dist/esm/index.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer, type RespValue } from './helpers/redis-server.js'
import { NODE } from './helpers/mastra-node.js'
import { ev, Inbox, numberOf, recordingLogger, sleep, uniquePrefix } from './helpers/streams.js'

const WORKFLOW_FIXTURE = path.join(__dirname, 'fixtures', 'evented-workflow-process.mjs')

let redis: RedisServer
const opened: RedisStreamsPubSub[] = []
const transports: PullTransport[] = []
const children = new Set<ChildProcess>()

beforeAll(async () => {
  redis = await startRedis()
})
afterEach(async () => {
  await Promise.allSettled(transports.splice(0).map((t) => t.stop({ drainTimeout: 0 })))
  await Promise.allSettled(opened.splice(0).map((p) => p.close()))
})
afterAll(async () => {
  for (const c of children) c.kill('SIGKILL')
  await redis?.stop()
})

function open(server: RedisServer, options: RedisStreamsPubSubOptions = {}): RedisStreamsPubSub {
  const pubsub = new RedisStreamsPubSub({ url: server.url, ...options })
  opened.push(pubsub)
  return pubsub
}

async function pendingCount(server: RedisServer, key: string, group: string): Promise<number> {
  const summary = (await server.cli('XPENDING', key, group)) as RespValue[]
  return Number(summary[0])
}

const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i)

const RECLAIM_IDLE_MS = 300
/** Short reclaim settings, so a job handed out twice would show within the test. */
const tuning = { reclaimIdleMs: RECLAIM_IDLE_MS, reclaimIntervalMs: 100, blockMs: 100 }

/**
 * Runs `jobs` jobs through `consumers` processes' worth of RedisStreamsPubSub + PullTransport
 * in one group, each job's step taking `stepMs` before its ack. Answers how often each job was
 * handled, and by which consumer.
 */
async function runJobs(consumers: number, jobs: number, stepMs: number, options: RedisStreamsPubSubOptions = {}) {
  const prefix = uniquePrefix('pull-transport')
  const handled = new Map<number, Array<{ consumer: number; attempt: number }>>()
  for (let c = 0; c < consumers; c++) {
    const pubsub = open(redis, { keyPrefix: prefix, ...tuning, ...options })
    const transport = new PullTransport({ pubsub, group: 'mastra-orchestration' })
    transports.push(transport)
    await transport.start({
      route: async (event: Event, ack?: () => Promise<void>) => {
        const n = numberOf(event)
        handled.set(n, [...(handled.get(n) ?? []), { consumer: c, attempt: event.deliveryAttempt ?? 1 }])
        await sleep(stepMs)
        await ack?.()
      },
    })
  }
  const publisher = open(redis, { keyPrefix: prefix })
  await Promise.all(range(1, jobs).map((n) => publisher.publish('workflows', ev(n))))
  const key = `${prefix}:workflows`
  const deadline = Date.now() + 20_000
  while (handled.size < jobs || (await pendingCount(redis, key, 'mastra-orchestration')) > 0) {
    if (Date.now() > deadline) break
    await sleep(50)
  }
  // Long enough for any second hand-out to happen: several reclaim idle periods.
  await sleep(4 * RECLAIM_IDLE_MS)
  return { handled, pending: await pendingCount(redis, key, 'mastra-orchestration') }
}

describe("Mastra's PullTransport on RedisStreamsPubSub", () => {
  it('with one consumer, a step that acks 3 × reclaimIdleMs after its callback returned is handled exactly once', async () => {
    const { handled, pending } = await runJobs(1, 20, 3 * RECLAIM_IDLE_MS)
    expect([...handled.keys()].sort((a, b) => a - b)).toEqual(range(1, 20))
    const twice = [...handled].filter(([, runs]) => runs.length > 1)
    expect(twice, JSON.stringify(twice)).toEqual([])
    expect([...handled.values()].flat().every((run) => run.attempt === 1)).toBe(true)
    expect(pending).toBe(0)
  })

  it('with two consumers of the group, every job is handled exactly once, by one of them', async () => {
    // maxInFlight 5: each takes at most five jobs at a time, so both get some.
    const { handled, pending } = await runJobs(2, 20, 3 * RECLAIM_IDLE_MS, { maxInFlight: 5 })
    expect([...handled.keys()].sort((a, b) => a - b)).toEqual(range(1, 20))
    const twice = [...handled].filter(([, runs]) => runs.length > 1)
    expect(twice, JSON.stringify(twice)).toEqual([])
    const byConsumer = new Set([...handled.values()].flat().map((run) => run.consumer))
    expect(byConsumer.size, 'both consumers took jobs').toBe(2)
    expect(pending).toBe(0)
  })

  it('the control: with inFlightTimeoutMs shorter than the step, jobs are handed out again, as the checks above would see', async () => {
    const logger = recordingLogger()
    const { handled } = await runJobs(2, 5, 3 * RECLAIM_IDLE_MS, { inFlightTimeoutMs: RECLAIM_IDLE_MS, logger })
    const twice = [...handled].filter(([, runs]) => runs.length > 1)
    expect(twice.length).toBeGreaterThan(0)
    expect(twice.every(([, runs]) => runs.map((r) => r.attempt).join() === range(1, runs.length).join())).toBe(true)
    expect(logger.warnings().some((l) => /inFlightTimeoutMs/.test(l.message))).toBe(true)
  })
})

describe('ack() and nack() never reject', () => {
  it.skipIf(EXTERNAL_REDIS)(
    'while Redis pauses writes (CLIENT PAUSE WRITE, 1.5 s), 20 acks and 20 nacks all resolve within commandTimeoutMs, and land once the pause ends',
    async () => {
      const server = await startRedis()
      try {
        const prefix = uniquePrefix('settle-outage')
        const key = `${prefix}:jobs`
        const logger = recordingLogger()
        const pubsub = open(server, { keyPrefix: prefix, commandTimeoutMs: 300, logger, ...tuning })
        const held: Array<{ event: Event; ack: () => Promise<void>; nack: () => Promise<void> }> = []
        const inbox = new Inbox((event, ack, nack) => {
          if (event.deliveryAttempt === 1) held.push({ event, ack, nack })
          else return ack()
        })
        await pubsub.subscribe('jobs', inbox.cb, { group: 'workers' })
        await Promise.all(range(1, 40).map((n) => pubsub.publish('jobs', ev(n))))
        await inbox.count(40)

        await server.cli('CLIENT', 'PAUSE', 1_500, 'WRITE')
        const started = Date.now()
        const outcomes = await Promise.allSettled(held.map(({ event, ack, nack }) => (numberOf(event) % 2 ? ack() : nack())))
        const took = Date.now() - started
        expect(outcomes.filter((o) => o.status === 'rejected')).toEqual([])
        expect(took, 'bounded by commandTimeoutMs').toBeLessThan(1_200)
        // Logged where the settle failed (on Node's loop, for one server at a redis:// URL),
        // through the logger's own queue: it may reach JavaScript after the answers.
        const warning = () => logger.warnings().find((l) => /could not settle/.test(l.message))
        await expect.poll(() => warning()?.fields?.code, { timeout: 1_000 }).toBe('ERR_LEASE_TIMEOUT')

        // Once writes resume, every settle lands: the acked are gone, the nacked come back
        // once each with deliveryAttempt 2 (and are acked then).
        await inbox.until((events) => events.length >= 60, 10_000, 'the 20 nacked events again')
        for (let i = 0; i < 100 && (await pendingCount(server, key, 'workers')) > 0; i++) await sleep(50)
        expect(await pendingCount(server, key, 'workers')).toBe(0)
        const again = inbox.events.slice(40)
        expect(again.map(numberOf).sort((a, b) => a - b)).toEqual(range(1, 40).filter((n) => n % 2 === 0))
        expect(again.every((e) => e.deliveryAttempt === 2)).toBe(true)
        await sleep(500)
        expect(inbox.events).toHaveLength(60)
      } finally {
        await server.stop()
      }
    },
  )

  it.skipIf(EXTERNAL_REDIS)('while Redis is down, ack and nack resolve, and after it is back nothing is lost or handled twice', async () => {
    const server = await startRedis({ args: ['--appendonly', 'yes', '--appendfsync', 'always'] })
    try {
      const prefix = uniquePrefix('settle-down')
      const key = `${prefix}:jobs`
      const pubsub = open(server, { keyPrefix: prefix, commandTimeoutMs: 300, ...tuning })
      const held: Array<{ event: Event; ack: () => Promise<void>; nack: () => Promise<void> }> = []
      const inbox = new Inbox((event, ack, nack) => {
        if (event.deliveryAttempt === 1) held.push({ event, ack, nack })
        else return ack()
      })
      await pubsub.subscribe('jobs', inbox.cb, { group: 'workers' })
      await Promise.all(range(1, 10).map((n) => pubsub.publish('jobs', ev(n))))
      await inbox.count(10)
      await server.kill()
      const outcomes = await Promise.allSettled(held.map(({ event, ack, nack }) => (numberOf(event) % 2 ? ack() : nack())))
      expect(outcomes.filter((o) => o.status === 'rejected')).toEqual([])
      await server.restart() // with its append-only file: the stream, the group and the pending entries
      await inbox.until((events) => events.length >= 15, 15_000, 'the 5 nacked events again')
      for (let i = 0; i < 100 && (await pendingCount(server, key, 'workers')) > 0; i++) await sleep(50)
      expect(await pendingCount(server, key, 'workers')).toBe(0)
      await sleep(4 * RECLAIM_IDLE_MS)
      expect(inbox.events.slice(10).map(numberOf).sort((a, b) => a - b)).toEqual([2, 4, 6, 8, 10])
    } finally {
      await server.stop()
    }
  })
})

describe('a Mastra evented workflow in two processes', () => {
  it('whose steps each take 3 × reclaimIdleMs runs every step of every run exactly once (its side effects counted)', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'evented-'))
    const counterFile = path.join(dir, 'steps.log')
    writeFileSync(counterFile, '')
    const base = { url: redis.url, keyPrefix: uniquePrefix('evented'), stepMs: 3 * RECLAIM_IDLE_MS, reclaimIdleMs: RECLAIM_IDLE_MS, counterFile }
    const worker = child({ ...base, role: 'worker' })
    try {
      await worker.line('ready', 20_000)
      const starter = child({ ...base, role: 'starter', runs: 4 })
      const { results } = (await starter.line('results', 60_000)) as { results: Array<{ runId: string; status: string; n: number }> }
      expect(results.map((r) => [r.status, r.n])).toEqual(Array(4).fill(['success', 2]))
      await sleep(4 * RECLAIM_IDLE_MS) // a step handed out again would run by now
      const ran = readFileSync(counterFile, 'utf8').trim().split('\n').map((line) => line.split(' ') as [string, string, string])
      const perStep = new Map<string, number>()
      for (const [, stepId, runId] of ran) perStep.set(`${runId} ${stepId}`, (perStep.get(`${runId} ${stepId}`) ?? 0) + 1)
      expect(perStep.size).toBe(8)
      expect([...perStep.values()].every((count) => count === 1), JSON.stringify([...perStep])).toBe(true)
      expect(new Set(ran.map(([pid]) => pid)).size, 'steps ran in both processes').toBe(2)
    } finally {
      worker.child.stdin?.end()
      rmSync(dir, { recursive: true, force: true })
    }
  }, 90_000)
})

/** A child process of the evented-workflow fixture; its stdout lines as they come. */
function child(config: Record<string, unknown>) {
  const process_ = spawn(NODE, [WORKFLOW_FIXTURE, JSON.stringify(config)], { stdio: ['pipe', 'pipe', 'pipe'] })
  children.add(process_)
  process_.once('exit', () => children.delete(process_))
  const said: Array<Record<string, unknown>> = []
  let stderr = ''
  let buffer = ''
  process_.stdout.on('data', (chunk: Buffer) => {
    buffer += chunk.toString()
    let i
    while ((i = buffer.indexOf('\n')) >= 0) {
      said.push(JSON.parse(buffer.slice(0, i)) as Record<string, unknown>)
      buffer = buffer.slice(i + 1)
    }
  })
  process_.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()))
  const line = async (type: string, ms: number) => {
    const deadline = Date.now() + ms
    for (;;) {
      const found = said.find((l) => l.type === type)
      if (found) return found
      if (Date.now() > deadline || process_.exitCode !== null) throw new Error(`child never said ${type}; stderr: ${stderr}`)
      await sleep(20)
    }
  }
  return { child: process_, line }
}
