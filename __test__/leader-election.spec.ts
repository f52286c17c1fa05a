// examples/leader-election.mjs in three real processes on one Redis: only the holder of the
// `scheduler` lease runs the Mastra workflow; killed with SIGKILL (no release), another
// replica takes over once its lease ran out, not before, with a greater fencing token; a
// SIGTERMed leader releases, so the next takes over at once.
import './helpers/mastra-node.js' // first: the example runs Mastra, which needs Node >= 22.13

import { spawn, type ChildProcess } from 'node:child_process'
import path from 'node:path'
import { createInterface } from 'node:readline'

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { leaseSuite, RUN, stopLater } from './helpers/lease-runs.js'
import { NODE } from './helpers/mastra-node.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()

const EXAMPLE = path.join(__dirname, '..', 'examples', 'leader-election.mjs')
const TTL_MS = 900

type Line = { replica: string; event: string; token?: number; line?: string; status?: string; at: number }

let server: RedisServer
const children: ChildProcess[] = []
beforeAll(async () => {
  server = stopLater(await startRedis())
})
afterAll(() => {
  for (const child of children) child.kill('SIGKILL')
})

function replica(name: string, lines: Line[]) {
  const child = spawn(NODE, [EXAMPLE, name], {
    cwd: path.join(__dirname, '..'),
    env: { ...process.env, REDIS_URL: server.url, TTL_MS: String(TTL_MS), EVERY_MS: '100', KEY_PREFIX: `election:${RUN}` },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  children.push(child)
  createInterface({ input: child.stdout! }).on('line', (text) => lines.push({ ...JSON.parse(text), at: performance.now() }))
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  return { child, exited }
}

async function until<T>(what: string, read: () => T | undefined, ms = 15_000): Promise<T> {
  const deadline = performance.now() + ms
  for (;;) {
    const value = read()
    if (value !== undefined) return value
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 20))
  }
}

describe('examples/leader-election.mjs', () => {
  it('one replica of three runs the workflow; killed, another takes over after the TTL, never before; stopped, it hands over at once', async () => {
    const lines: Line[] = []
    const replicas = Object.fromEntries(['r1', 'r2', 'r3'].map((name) => [name, replica(name, lines)]))
    const ranBy = (name: string) => lines.filter((l) => l.event === 'ran' && l.replica === name)

    const first = await until('a leader', () => lines.find((l) => l.event === 'leader'))
    await until('three runs of the workflow', () => (ranBy(first.replica).length >= 3 ? true : undefined))
    expect(lines.filter((l) => l.event === 'ran').every((l) => l.replica === first.replica)).toBe(true)
    expect(ranBy(first.replica)[0]).toMatchObject({ status: 'success', line: expect.stringContaining(`by ${first.replica}`) })

    // SIGKILL: no release. The lease lapses at most a TTL after the last renewal (every TTL/3).
    replicas[first.replica]!.child.kill('SIGKILL')
    const killedAt = performance.now()
    const second = await until('a new leader', () => lines.find((l) => l.event === 'leader' && l.replica !== first.replica))
    expect(second.at - killedAt).toBeGreaterThan(TTL_MS - TTL_MS / 3 - 100) // not before the lease could lapse
    expect(second.at - killedAt).toBeLessThan(TTL_MS + TTL_MS / 3 + 1_500) // a retry after it lapsed
    expect(second.token).toBeGreaterThan(first.token!)
    await until('runs by the new leader', () => (ranBy(second.replica).length >= 3 ? true : undefined))
    const third = ['r1', 'r2', 'r3'].find((n) => n !== first.replica && n !== second.replica)!
    expect(ranBy(third)).toEqual([])

    // SIGTERM: the leader releases on its way out, and the last replica takes over at once.
    replicas[second.replica]!.child.kill('SIGTERM')
    const stoppedAt = performance.now()
    expect(await replicas[second.replica]!.exited).toBe(0)
    const last = await until('the last leader', () => lines.find((l) => l.event === 'leader' && l.replica === third))
    expect(last.at - stoppedAt).toBeLessThan(TTL_MS / 3 + 1_000)
    await until('a run by the last leader', () => (ranBy(third).length >= 1 ? true : undefined))
    // Never two leaders running at once: each run's replica held the lease then.
    const runs = lines.filter((l) => l.event === 'ran')
    expect(runs.filter((l) => l.replica === second.replica).every((l) => l.at < stoppedAt + 50)).toBe(true)
    expect(runs.filter((l) => l.replica === first.replica).every((l) => l.at <= killedAt)).toBe(true)
    replicas[third]!.child.kill('SIGTERM')
    expect(await replicas[third]!.exited).toBe(0)
  }, 60_000)
})
