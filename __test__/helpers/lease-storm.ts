// A lease storm of several processes (fixtures/lease-storm-worker.mjs): each hammers a few
// keys with random acquire/renew/transfer/release calls and, while it believes it holds a
// key, increments that key's shared counter file read-sleep-write. Their joint history goes
// to the history checker (helpers/lease-history.ts) and the counters to the lost-update check.
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'

import { afterAll } from 'vitest'

import type { RedisLeaseProviderOptions } from '../../index.js'
import { checkCounter, checkLeaseHistory, fileCounter, parseHistoryLines, type HistoryReport, type LeaseUse, type ParsedHistory } from './lease-history.js'

const WORKER = path.join(__dirname, '..', 'fixtures', 'lease-storm-worker.mjs')

/** The worker's margin (CRITICAL_MARGIN_MS in lease-storm-worker.mjs): it starts a critical
 * section of a few ms only with this much of its believed window left. */
export const STORM_MARGIN_MS = 100

/**
 * The critical sections that ran outside their owner's believed window although they took
 * less than the worker's margin: a worker bug. One that took longer was its process paused
 * mid-section (a loaded 2-vCPU machine can stall a process for 200 ms): the hazard no lease
 * can rule out, that fencing tokens exist for (docs/security.md), and no fault of the lease.
 */
export function unprotectedWithoutPause(report: HistoryReport): LeaseUse[] {
  return report.unprotectedUses.filter((u) => !pausedPastTheMargin(u))
}

/** A critical section that took longer than the worker's margin: its process was paused. */
const pausedPastTheMargin = (u: LeaseUse) => Number(u.end - u.start) / 1e6 > STORM_MARGIN_MS

/**
 * The counters that lost updates although no critical section on their key was paused past
 * the margin: a lease fault. A paused one, read before the pause and written after it, may
 * overwrite any number of increments made meanwhile, so a key with one is not counted.
 */
export function lostWithoutPause(report: HistoryReport, counters: StormResult['counters']): StormResult['counters'] {
  const paused = new Set(report.unprotectedUses.filter(pausedPastTheMargin).map((u) => u.key))
  return counters.filter((c) => c.lost !== 0 && !paused.has(c.key))
}

export interface StormConfig {
  workers: number
  /** The keys the workers contend for. */
  keys: string[]
  durationMs: number
  maxOps: number
  ttlMinMs: number
  ttlMaxMs: number
  paceMs: number
  /** Chance per step that a holder walks away and lets the lease expire. */
  walkAway: number
  /** Every acquire "succeeds" (a negative control). */
  broken: boolean
}

export interface StormResult {
  history: ParsedHistory
  report: HistoryReport
  /** Per key: what the shared counter says against the increments the workers made. */
  counters: Array<ReturnType<typeof checkCounter> & { key: string }>
}

const tempDirs: string[] = []
afterAll(() => {
  for (const dir of tempDirs.splice(0)) rmSync(dir, { recursive: true, force: true })
})

function runWorker(args: Record<string, unknown>, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [WORKER, JSON.stringify(args)], { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d))
    child.stderr.setEncoding('utf8').on('data', (d: string) => (err += d))
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`worker ${String(args.worker)} did not finish within ${timeoutMs} ms; stderr: ${err}`))
    }, timeoutMs)
    child.once('exit', (code, signal) => {
      clearTimeout(timer)
      if (code === 0) resolve(out)
      else reject(new Error(`worker ${String(args.worker)} exited with ${code ?? signal}; stderr: ${err}`))
    })
  })
}

/**
 * Runs `config.workers` processes whose providers take `connection` (where and how to reach
 * Redis) under `keyPrefix`, calls `during()` while they run (to inject a fault), and checks
 * their joint history.
 */
export async function leaseStorm(
  connection: RedisLeaseProviderOptions,
  keyPrefix: string,
  config: StormConfig,
  during: () => Promise<void> = async () => {},
): Promise<StormResult> {
  const counterDir = mkdtempSync(path.join(os.tmpdir(), 'mlr-counter-'))
  tempDirs.push(counterDir)
  const workers = Promise.all(
    Array.from({ length: config.workers }, (_, i) =>
      runWorker({ ...config, connection, keyPrefix, counterDir, worker: `w${i}` }, config.durationMs + 15_000),
    ),
  )
  const [outputs] = await Promise.all([workers, during()])
  const history = parseHistoryLines(outputs.join('\n'))
  const report = checkLeaseHistory(history.operations, history.uses)
  const counters = config.keys.map((key, i) => {
    const increments = history.summaries.reduce((n, s) => n + (s.increments[key] ?? 0), 0)
    return { key, ...checkCounter(fileCounter(path.join(counterDir, `counter-${i}`)).read(), increments) }
  })
  return { history, report, counters }
}
