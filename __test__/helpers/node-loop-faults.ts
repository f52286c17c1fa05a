// Faults of Node's own loop for the suites that drive lease calls on it: a loop kept busy
// (a synchronous stretch of JavaScript) right after a turn's calls were written, and the proxy
// of fixtures/reset-after-replies-proxy.mjs, in a process of its own so that it acts while
// this process's loop is busy. node-loop-faults.spec.ts and node-loop-torture.spec.ts use them.
import { spawn } from 'node:child_process'
import path from 'node:path'
import { createInterface } from 'node:readline'

import type { Line } from './json-lines-child.js'
import { closing } from './lease-runs.js'
import { NODE } from './mastra-node.js'
import type { RedisServer } from './redis-server.js'

const FIXTURES = path.join(__dirname, '..', 'fixtures')

/** Keeps Node's thread busy for `ms`: no I/O, no timer, no callback of libuv runs meanwhile. */
export function busyWait(ms: number) {
  const until = performance.now() + ms
  while (performance.now() < until) {
    // spinning
  }
}

/**
 * Blocks the loop for `ms` once the calls made so far in this turn were written: the addon
 * sends a turn's calls from the microtask its first call queued, so one queued after them
 * runs after that send. Answers when the block began and ended (process.hrtime.bigint(),
 * filled in once it has run).
 */
export function blockAfterThisTurn(ms: number): { from: bigint; to: bigint } {
  const blocked = { from: 0n, to: 0n }
  queueMicrotask(() => {
    blocked.from = process.hrtime.bigint()
    busyWait(ms)
    blocked.to = process.hrtime.bigint()
  })
  return blocked
}

/** Calls until one turn of them all succeeds: the first after a dropped connection may meet it broken. */
export async function warm(call: (i: number) => Promise<unknown>) {
  for (let attempt = 0; attempt < 20; attempt++) {
    const results = await Promise.allSettled(Array.from({ length: 8 }, (_, i) => call(i)))
    if (results.every((r) => r.status === 'fulfilled')) return
  }
  throw new Error('could not warm the connections: 20 turns of calls failed')
}

/** The proxy of fixtures/reset-after-replies-proxy.mjs, in a process of its own. */
export async function startResetProxy(target: RedisServer) {
  const script = path.join(FIXTURES, 'reset-after-replies-proxy.mjs')
  const child = spawn(NODE, [script, JSON.stringify({ host: target.host, port: target.port })], { stdio: ['pipe', 'pipe', 'pipe'] })
  closing({ close: async () => void child.kill('SIGKILL') })
  let stderr = ''
  child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d))
  const waiting = new Map<number | 'ready', (line: Line) => void>()
  createInterface({ input: child.stdout }).on('line', (text) => {
    const line = JSON.parse(text) as Line
    const key = line.type === 'ready' ? 'ready' : (line.id as number)
    waiting.get(key)?.(line)
    waiting.delete(key)
  })
  const answer = (key: number | 'ready') =>
    new Promise<Line>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the reset proxy did not answer within 5 s; stderr: ${stderr}`)), 5_000)
      waiting.set(key, (line) => {
        clearTimeout(timer)
        resolve(line)
      })
    })
  const { port } = (await answer('ready')) as Line & { port: number }
  let nextId = 0
  const request = async (cmd: string, fields: Record<string, unknown> = {}) => {
    const id = ++nextId
    const answered = answer(id)
    child.stdin.write(`${JSON.stringify({ cmd, id, ...fields })}\n`)
    return (await answered).value
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    /**
     * Each connection open now takes its next chunk of replies, holds it `delay` ms, forwards
     * its first `bytes` bytes and is reset; answers how many connections it armed.
     */
    arm: async (bytes: number, delay: number) => (await request('arm', { bytes, delay })) as number,
    disarm: () => request('disarm'),
    /** When each reset so far went (process.hrtime.bigint()). */
    resets: async () => ((await request('stats')) as { resets: Array<{ at: string }> }).resets.map((r) => BigInt(r.at)),
  }
}
export type ResetProxy = Awaited<ReturnType<typeof startResetProxy>>

