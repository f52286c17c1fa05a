// What the lease fault suites share: clean-up hooks that never leave a provider open or a
// child process behind (least of all a SIGSTOPped one), monotonic timing, reading a lease
// straight from Redis, and a lease provider in a child process driven over stdin/stdout.
import { spawn, type ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { rmSync } from 'node:fs'
import path from 'node:path'
import { createInterface } from 'node:readline'

import { afterAll, afterEach } from 'vitest'

import { sleep } from './lease.js'
import { monotonicNow, type LeaseOperation } from './lease-history.js'
import { NODE } from './mastra-node.js'
import type { RedisServer } from './redis-server.js'

const CHILD = path.join(__dirname, '..', 'fixtures', 'lease-child.mjs')

/** Tells this run's keys apart from an earlier run's on a shared server. */
export const RUN = randomUUID().slice(0, 8)
export const msToNs = (ms: number) => BigInt(Math.round(ms * 1e6))
/** b - a, in ms. */
export const msBetween = (a: bigint, b: bigint) => Number(b - a) / 1e6
/** Sleep until the monotonic clock (process.hrtime.bigint(), shared by all processes) reaches `at`. */
export const untilMono = (at: bigint) => sleep(Math.max(0, msBetween(monotonicNow(), at)))

export type Grant = { acquired: boolean; owner?: string }

export interface Timed<T> {
  value: T
  /** Monotonic ns just before the call and just after it settled. */
  t0: bigint
  t1: bigint
}
export async function timed<T>(call: () => Promise<T>): Promise<Timed<T>> {
  const t0 = monotonicNow()
  const value = await call()
  return { value, t0, t1: monotonicNow() }
}

const servers: RedisServer[] = []
const closers: Array<() => Promise<unknown>> = []
const children = new Set<ChildProcess>()
/** Directories removed once the suite is done. */
export const tempDirs: string[] = []

/** Registers the suite's clean-up: call once, at the top of a spec file. */
export function leaseSuite() {
  afterEach(async () => {
    // Never leave a child behind, least of all a SIGSTOPped one.
    for (const child of children) {
      child.kill('SIGCONT')
      child.kill('SIGKILL')
    }
    children.clear()
    await Promise.all(closers.splice(0).map((close) => close().catch(() => undefined)))
  })
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop()))
    for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true })
  })
}

/** A server stopped once the suite is done. */
export function stopLater(server: RedisServer): RedisServer {
  servers.push(server)
  return server
}

/** A provider closed after the test, whatever happens. */
export function closing<P extends { close(): Promise<unknown> }>(provider: P): P {
  closers.push(() => provider.close())
  return provider
}

/** GET and PTTL of a lease key in one atomic step, straight from Redis. */
export async function leaseInRedis(server: RedisServer, fullKey: string): Promise<{ owner: string | null; pttl: number }> {
  const reply = await server.cli('EVAL', "return {redis.call('GET', KEYS[1]) or false, redis.call('PTTL', KEYS[1])}", 1, fullKey)
  const [owner, pttl] = reply as [string | null, number]
  return { owner, pttl }
}

export interface ChildEvent {
  type: string
  id?: number
  value?: unknown
  error?: string
  mono?: string
  [field: string]: unknown
}

/** A lease provider in a child process (fixtures/lease-child.mjs), driven over stdin/stdout. */
export class LeaseChild {
  readonly ops: LeaseOperation[] = []
  readonly events: ChildEvent[] = []
  private stderr = ''
  private nextId = 0
  private readonly waiters = new Set<{ match: (e: ChildEvent) => boolean; resolve: (e: ChildEvent) => void }>()

  private constructor(private readonly proc: ChildProcess) {}

  static async start(config: Record<string, unknown>, env: NodeJS.ProcessEnv = process.env): Promise<LeaseChild> {
    const proc = spawn(NODE, [CHILD, JSON.stringify(config)], { stdio: ['pipe', 'pipe', 'pipe'], env })
    children.add(proc)
    const child = new LeaseChild(proc)
    proc.stderr!.setEncoding('utf8').on('data', (d: string) => (child.stderr += d))
    createInterface({ input: proc.stdout! }).on('line', (line) => child.onLine(line))
    await child.waitFor((e) => e.type === 'ready', 15_000)
    return child
  }

  private onLine(line: string) {
    const event = JSON.parse(line) as ChildEvent
    if (event.type === 'op') {
      const { type: _type, ...op } = event
      this.ops.push({ ...(op as unknown as LeaseOperation), start: BigInt(String(event.start)), end: BigInt(String(event.end)) })
    }
    this.events.push(event)
    for (const w of this.waiters) {
      if (w.match(event)) {
        this.waiters.delete(w)
        w.resolve(event)
      }
    }
  }

  /** The first event (already seen or still to come) that matches. */
  waitFor(match: (e: ChildEvent) => boolean, timeoutMs: number): Promise<ChildEvent> {
    const seen = this.events.find(match)
    if (seen) return Promise.resolve(seen)
    return new Promise((resolve, reject) => {
      const waiter = {
        match,
        resolve: (e: ChildEvent) => {
          clearTimeout(timer)
          resolve(e)
        },
      }
      const timer = setTimeout(() => {
        this.waiters.delete(waiter)
        reject(new Error(`the lease child sent no awaited event within ${timeoutMs} ms; stderr: ${this.stderr}`))
      }, timeoutMs)
      this.waiters.add(waiter)
    })
  }

  request(command: Record<string, unknown>): Promise<ChildEvent> {
    const id = ++this.nextId
    this.proc.stdin!.write(`${JSON.stringify({ ...command, id })}\n`)
    return this.waitFor((e) => e.type === 'reply' && e.id === id, 10_000)
  }

  async call<T>(method: string, ...args: unknown[]): Promise<T> {
    const reply = await this.request({ cmd: 'call', method, args })
    if (reply.error !== undefined) throw new Error(`the child's ${method} rejected with ${reply.error}`)
    return reply.value as T
  }

  async clock(): Promise<{ wall: number; mono: bigint }> {
    const { value } = await this.request({ cmd: 'clock' })
    const { wall, mono } = value as { wall: number; mono: string }
    return { wall, mono: BigInt(mono) }
  }

  signal(sig: NodeJS.Signals) {
    this.proc.kill(sig)
  }

  /** Close stdin (the child closes its provider and exits); SIGKILL if it lingers. */
  async stop(): Promise<void> {
    const proc = this.proc
    if (proc.exitCode !== null || proc.signalCode !== null) return
    const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()))
    proc.kill('SIGCONT')
    proc.stdin!.end()
    const timer = setTimeout(() => proc.kill('SIGKILL'), 3_000)
    await exited
    clearTimeout(timer)
    children.delete(proc)
  }
}

