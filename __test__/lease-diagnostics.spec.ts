// Lease calls on the `mastra-lease:lease` diagnostics channel: a subscriber sees each call
// once, start and end, then its settling, with the operation, key, owners and TTL, and its
// result or its error with the code. Whoever the call goes through: a provider of this
// package, a pubsub over one, RedisStreamsPubSub, a pubsub over someone else's provider.
// The subscriber docs/deployment.md shows, run as a user pastes it.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { spawnSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { tracingChannel } from 'node:diagnostics_channel'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import path from 'node:path'

import { EventEmitterPubSub } from '@mastra/core/events'
import ts from 'typescript'
import { afterEach, beforeAll, describe, expect, it } from 'vitest'

import { leaseChannel, MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub, withLeases, type LeaseCallContext } from '../dist/esm/index.js'
import { closing, leaseSuite, RUN, stopLater } from './helpers/lease-runs.js'
import { NODE } from './helpers/mastra-node.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()

let server: RedisServer
beforeAll(async () => {
  server = stopLater(await startRedis())
})

type Traced = {
  acquireLease(key: string, owner: string, ttlMs: number): Promise<unknown>
  getLeaseOwner(key: string): Promise<unknown>
  renewLease(key: string, owner: string, ttlMs: number): Promise<boolean>
  transferLease(key: string, from: string, to: string, ttlMs: number): Promise<boolean>
  releaseLease(key: string, owner: string): Promise<void>
  close(): Promise<void>
}

/** Every message of the channel, in order: which channel, and the context as it was then. */
function record() {
  const seen: Array<{ event: string } & LeaseCallContext> = []
  const on = (event: string) => (context: object) => {
    const { error, ...rest } = context as LeaseCallContext
    const code = (error as { code?: unknown } | undefined)?.code
    seen.push({ event, ...rest, ...(error === undefined ? {} : { error: code }) })
  }
  const subscribers = { start: on('start'), end: on('end'), asyncStart: on('asyncStart'), asyncEnd: on('asyncEnd'), error: on('error') }
  leaseChannel.subscribe(subscribers)
  subscribed.push(() => leaseChannel.unsubscribe(subscribers))
  return seen
}
const subscribed: Array<() => void> = []
afterEach(() => {
  for (const unsubscribe of subscribed.splice(0)) unsubscribe()
})

const cases: Array<[string, () => Traced]> = [
  ['MemoryLeaseProvider', () => new MemoryLeaseProvider()],
  ['RedisLeaseProvider', () => new RedisLeaseProvider({ url: server.url, keyPrefix: `trace:${RUN}` })],
  ['RedisStreamsPubSub', () => new RedisStreamsPubSub({ url: server.url, keyPrefix: `trace-streams:${RUN}` })],
  ['withLeases(…, RedisLeaseProvider)', () => {
    const leases = new RedisLeaseProvider({ url: server.url, keyPrefix: `trace-with:${RUN}` })
    const pubsub = withLeases(new EventEmitterPubSub(), leases)
    return Object.assign(pubsub, { close: async () => leases.close() })
  }],
  ["withLeases(…, Mastra's EventEmitterPubSub leases)", () => withLeases(new EventEmitterPubSub(), new EventEmitterPubSub())],
]

describe.each(cases)('%s', (_name, make) => {
  it('a subscriber sees every call once: start and end, then asyncStart and asyncEnd, with its operation, key, owners, TTL and result', async () => {
    const p = closing(make())
    const key = `trace-${randomUUID().slice(0, 8)}\u0000thread`
    const seen = record()
    const granted = await p.acquireLease(key, 'A', 60_000)
    await p.acquireLease(key, 'B', 60_000)
    await p.renewLease(key, 'A', 60_000)
    await p.getLeaseOwner(key)
    await p.transferLease(key, 'A', 'B', 60_000)
    await p.releaseLease(key, 'B')

    const calls = [
      { operation: 'acquireLease', key, owner: 'A', ttlMs: 60_000, result: granted },
      { operation: 'acquireLease', key, owner: 'B', ttlMs: 60_000, result: expect.objectContaining({ acquired: false, owner: 'A' }) },
      { operation: 'renewLease', key, owner: 'A', ttlMs: 60_000, result: true },
      { operation: 'getLeaseOwner', key, result: 'A' },
      { operation: 'transferLease', key, owner: 'A', toOwner: 'B', ttlMs: 60_000, result: true },
      { operation: 'releaseLease', key, owner: 'B', result: undefined },
    ]
    // Each call is awaited before the next: its four messages come together, in order.
    expect(seen.map((m) => m.event)).toEqual(calls.flatMap(() => ['start', 'end', 'asyncStart', 'asyncEnd']))
    calls.forEach((call, i) => {
      const { result, ...asked } = call
      const [start, end, asyncStart, asyncEnd] = seen.slice(i * 4, i * 4 + 4)
      expect(start).toEqual({ event: 'start', ...asked })
      expect(end).toEqual({ event: 'end', ...asked })
      expect(asyncStart).toEqual({ event: 'asyncStart', ...asked, result })
      expect(asyncEnd).toEqual({ event: 'asyncEnd', ...asked, result })
    })
  })
})

type TracedRecords = Traced & {
  acquireFencedLease?: (key: string, owner: string, ttlMs: number, metadata?: string) => Promise<unknown>
  getLeaseRecord?: (key: string) => Promise<unknown>
  renewLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean>
  transferLease(key: string, from: string, to: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): Promise<boolean>
  releaseLease(key: string, owner: string, metadata?: string): Promise<void>
}

// This package's providers (Mastra's EventEmitterPubSub has neither fenced grants nor records).
describe.each(cases.slice(0, 4))('%s: fenced grants and lease records', (_name, make) => {
  it('acquireFencedLease and getLeaseRecord are traced too, and a call given metadata carries it (a transfer its toMetadata as well)', async () => {
    const p = closing(make()) as TracedRecords
    expect(typeof p.acquireFencedLease).toBe('function')
    expect(typeof p.getLeaseRecord).toBe('function')
    const key = `trace-records-${randomUUID().slice(0, 8)}\u0000thread`
    const seen = record()
    const fenced = await p.acquireFencedLease!(key, 'A', 60_000, 'run-a')
    await p.getLeaseRecord!(key)
    await p.renewLease(key, 'A', 60_000, 'run-a')
    await p.transferLease(key, 'A', 'B', 60_000, 'run-a', 'run-b')
    await p.releaseLease(key, 'B', 'run-b')
    // Each call once: its four messages, the last with its result.
    expect(seen).toHaveLength(5 * 4)
    expect(seen.filter((m) => m.event === 'asyncEnd')).toEqual([
      { event: 'asyncEnd', operation: 'acquireFencedLease', key, owner: 'A', ttlMs: 60_000, metadata: 'run-a', result: fenced },
      { event: 'asyncEnd', operation: 'getLeaseRecord', key, result: { owner: 'A', metadata: 'run-a' } },
      { event: 'asyncEnd', operation: 'renewLease', key, owner: 'A', ttlMs: 60_000, metadata: 'run-a', result: true },
      { event: 'asyncEnd', operation: 'transferLease', key, owner: 'A', toOwner: 'B', ttlMs: 60_000, metadata: 'run-a', toMetadata: 'run-b', result: true },
      { event: 'asyncEnd', operation: 'releaseLease', key, owner: 'B', metadata: 'run-b', result: undefined },
    ])
    expect(fenced).toStrictEqual({ acquired: true, owner: 'A', token: expect.any(Number) })
  })
})

describe.each(cases.slice(2))('%s, through getLeaseProvider() as Mastra calls it', (_name, make) => {
  it('each call is traced once', async () => {
    const pubsub = closing(make()) as Traced & { getLeaseProvider(): Traced }
    const seen = record()
    const key = `trace-${randomUUID().slice(0, 8)}`
    const leases = pubsub.getLeaseProvider()
    await leases.acquireLease(key, 'A', 60_000)
    await leases.releaseLease(key, 'A')
    expect(seen.filter((m) => m.event === 'asyncEnd').map((m) => [m.operation, m.owner])).toEqual([
      ['acquireLease', 'A'],
      ['releaseLease', 'A'],
    ])
  })
})

describe.each(cases.slice(0, 4))('%s, a call that rejects', (_name, make) => {
  it('publishes error and asyncEnd with the error, whose code the subscriber reads', async () => {
    const p = closing(make())
    const seen = record()
    await expect(p.renewLease('', 'A', 60_000)).rejects.toMatchObject({ code: 'ERR_LEASE_INVALID_KEY' })
    await p.close()
    await expect(p.getLeaseOwner('k')).rejects.toMatchObject({ code: 'ERR_LEASE_CLOSED' })
    expect(seen.map((m) => [m.event, m.operation, m.error])).toEqual([
      ['start', 'renewLease', undefined],
      ['end', 'renewLease', undefined],
      ['error', 'renewLease', 'ERR_LEASE_INVALID_KEY'],
      ['asyncStart', 'renewLease', 'ERR_LEASE_INVALID_KEY'],
      ['asyncEnd', 'renewLease', 'ERR_LEASE_INVALID_KEY'],
      ['start', 'getLeaseOwner', undefined],
      ['end', 'getLeaseOwner', undefined],
      ['error', 'getLeaseOwner', 'ERR_LEASE_CLOSED'],
      ['asyncStart', 'getLeaseOwner', 'ERR_LEASE_CLOSED'],
      ['asyncEnd', 'getLeaseOwner', 'ERR_LEASE_CLOSED'],
    ])
  })
})

describe('the lease channel', () => {
  it('is the one named mastra-lease:lease, the same from import and from require, and is silent once unsubscribed', async () => {
    const cjs = createRequire(__filename)('../dist/cjs/index.js') as { leaseChannel: typeof leaseChannel; MemoryLeaseProvider: typeof MemoryLeaseProvider }
    const p = new MemoryLeaseProvider()
    const seen: string[] = []
    const byName = tracingChannel('mastra-lease:lease')
    const subscribers = { start: () => seen.push('start'), end() {}, asyncStart() {}, asyncEnd() {}, error() {} }
    byName.subscribe(subscribers)
    expect(leaseChannel.hasSubscribers && cjs.leaseChannel.hasSubscribers).toBe(true)
    await p.acquireLease('k', 'A', 1000)
    await new cjs.MemoryLeaseProvider().acquireLease('k', 'A', 1000)
    byName.unsubscribe(subscribers)
    expect(leaseChannel.hasSubscribers).toBe(false)
    await p.getLeaseOwner('k')
    expect(seen).toEqual(['start', 'start'])
  })
})

describe("docs/deployment.md's subscriber", () => {
  it('logs each call once, as a user pastes it: a granted acquire on stdout, a rejected renew on stderr with its code', () => {
    const page = readFileSync(path.join(__dirname, '..', 'docs', 'deployment.md'), 'utf8')
    const code = /^```ts\n([\s\S]*?)^```/m.exec(page.slice(page.indexOf('### The diagnostics channel')))![1]!
    // Inside the package, so `import … from 'mastra-lease'` finds this build by the package's name.
    const dir = path.join(__dirname, '..', 'target', 'diagnostics-example')
    mkdirSync(dir, { recursive: true })
    const file = path.join(dir, `subscriber-${RUN}.mjs`)
    writeFileSync(file, ts.transpileModule(code, { compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext } }).outputText)
    const run = spawnSync(NODE, [file], { encoding: 'utf8', timeout: 20_000 })
    expect(run.status, run.stderr).toBe(0)
    expect(run.stdout).toBe("acquireLease job-1 worker-1 { acquired: true, owner: 'worker-1' }\n")
    expect(run.stderr).toBe('renewLease job-1 ERR_LEASE_INVALID_TTL\n')
  })
})
