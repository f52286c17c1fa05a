// trimTopic(topic, { runId, producedBefore? }): one finished run's entries removed from a topic
// several runs share, in pages, never an entry a consumer group holds unsettled, never another
// run's; best effort (logged, resolved) except for bad arguments. On one server and on a Cluster.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { performance } from 'node:perf_hooks'

import { EventEmitterPubSub } from '@mastra/core/events'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, RedisStreamsPubSub, withLeases, type RedisStreamsPubSubOptions } from '../dist/esm/index.js'
import { errorCode, settleWithin } from './helpers/lease.js'
import { EXTERNAL_REDIS, freePort, startRedis, type RedisServer } from './helpers/redis-server.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { ev, Inbox, recordingLogger, uniquePrefix, type Publishable } from './helpers/streams.js'
import { entries, pendingCount } from './helpers/streams-suite.js'

/** What a stream holds, as `runId:n` (or `runId:n@producedAt`) in stream order. */
async function held(server: RedisServer, key: string): Promise<string[]> {
  return (await entries(server, key)).map(([, fields]) => {
    const event = JSON.parse(fields[1]!) as { runId: string; data: { n: number; producedAt?: number } }
    return `${event.runId}:${event.data.n}`
  })
}

/** Event `n` of `runId`, produced at `producedAt` when given. */
const produced = (n: number, runId: string, producedAt?: number): Publishable => ({
  type: 'test',
  runId,
  data: producedAt === undefined ? { n } : { n, producedAt },
})

/** `count` events alternating between `runs`, numbered from 0, published together. */
async function interleaved(pubsub: RedisStreamsPubSub, topic: string, count: number, runs: string[]): Promise<void> {
  for (let from = 0; from < count; from += 1_000) {
    const batch = []
    for (let n = from; n < Math.min(count, from + 1_000); n++) batch.push(pubsub.publish(topic, ev(n, runs[n % runs.length])))
    await Promise.all(batch)
  }
}

const each = (count: number, runs: string[], run: string) =>
  Array.from({ length: count }, (_, n) => n)
    .filter((n) => runs[n % runs.length] === run)
    .map((n) => `${run}:${n}`)

describe('trimTopic on one server', () => {
  let redis: RedisServer
  const pubsubs: RedisStreamsPubSub[] = []
  const own: RedisServer[] = []
  beforeAll(async () => {
    redis = await startRedis()
  })
  afterAll(async () => {
    await Promise.all(pubsubs.map((p) => p.close()))
    await Promise.all(own.map((s) => s.stop()))
    await redis.stop()
  })
  const open = (options: RedisStreamsPubSubOptions = {}) => {
    const pubsub = new RedisStreamsPubSub({ url: redis.url, ...options })
    pubsubs.push(pubsub)
    return pubsub
  }

  it("two runs interleaved on one topic: trimming one leaves exactly the other's entries, in order", async () => {
    const prefix = uniquePrefix('trim-two-runs')
    const pubsub = open({ keyPrefix: prefix })
    await interleaved(pubsub, 'shared', 40, ['run-a', 'run-b'])
    await pubsub.trimTopic('shared', { runId: 'run-a' })
    expect(await held(redis, `${prefix}:shared`)).toEqual(each(40, ['run-a', 'run-b'], 'run-b'))
    await pubsub.trimTopic('shared', { runId: 'run-b' })
    expect(await redis.cli('XLEN', `${prefix}:shared`)).toBe(0)
  })

  it("with producedBefore, only the run's entries whose data.producedAt is no later go; a Date works as its milliseconds", async () => {
    const prefix = uniquePrefix('trim-produced-before')
    const pubsub = open({ keyPrefix: prefix })
    for (let n = 0; n < 6; n++) await pubsub.publish('shared', produced(n, 'run-a', 1_000 + n))
    await pubsub.publish('shared', produced(6, 'run-a'))
    await pubsub.publish('shared', produced(7, 'run-b', 0))
    await pubsub.trimTopic('shared', { runId: 'run-a', producedBefore: 1_002 })
    expect(await held(redis, `${prefix}:shared`)).toEqual(['run-a:3', 'run-a:4', 'run-a:5', 'run-a:6', 'run-b:7'])
    await pubsub.trimTopic('shared', { runId: 'run-a', producedBefore: new Date(1_004) })
    expect(await held(redis, `${prefix}:shared`)).toEqual(['run-a:5', 'run-a:6', 'run-b:7'])
  })

  it("with producedBefore, a run's pinned entries (its start, an approval prompt) survive the trims made while it runs, as Mastra's own backend keeps them; the trim of the whole run removes them", async () => {
    const prefix = uniquePrefix('trim-pinned')
    const pubsub = open({ keyPrefix: prefix })
    const pinned = (n: number, producedAt: number, pin: unknown): Publishable => ({ type: 'test', runId: 'run-a', data: { n, producedAt, pinned: pin } })
    await pubsub.publish('shared', pinned(0, 1_000, true)) // the run's start
    await pubsub.publish('shared', produced(1, 'run-a', 1_001))
    await pubsub.publish('shared', pinned(2, 1_002, { reason: 'approval' })) // truthy, as JavaScript reads it
    await pubsub.publish('shared', pinned(3, 1_003, false))
    await pubsub.publish('shared', pinned(4, 1_004, 0))
    await pubsub.publish('shared', produced(5, 'run-a', 1_005))
    // Each message save trims what was produced before it.
    await pubsub.trimTopic('shared', { runId: 'run-a', producedBefore: 1_004 })
    expect(await held(redis, `${prefix}:shared`)).toEqual(['run-a:0', 'run-a:2', 'run-a:5'])
    await pubsub.trimTopic('shared', { runId: 'run-a', producedBefore: 2_000 })
    expect(await held(redis, `${prefix}:shared`)).toEqual(['run-a:0', 'run-a:2'])
    // The run is saved: all of it goes.
    await pubsub.trimTopic('shared', { runId: 'run-a' })
    expect(await held(redis, `${prefix}:shared`)).toEqual([])
  })

  it('an entry delivered to a group and not yet acked survives the trim, and its late ack still settles it', async () => {
    const prefix = uniquePrefix('trim-pending')
    const logger = recordingLogger()
    const pubsub = open({ keyPrefix: prefix, blockMs: 100, logger })
    let release: (() => Promise<void>) | undefined
    const inbox = new Inbox((event, ack) => {
      if ((event.data as { n: number }).n === 1) release = ack
      else return ack()
    })
    await pubsub.subscribe('shared', inbox.cb, { group: 'workers' })
    for (let n = 0; n < 4; n++) await pubsub.publish('shared', ev(n, 'run-a'))
    await inbox.count(4)
    const key = `${prefix}:shared`
    await expect.poll(() => pendingCount(redis, key, 'workers')).toBe(1)
    await pubsub.trimTopic('shared', { runId: 'run-a' })
    expect(await held(redis, key)).toEqual(['run-a:1'])
    const note = logger.lines.find((l) => l.message.includes('trimTopic'))
    expect(note?.fields).toMatchObject({ deleted: 3, spared: 1 })
    await release!()
    expect(await pendingCount(redis, key, 'workers')).toBe(0)
    await pubsub.trimTopic('shared', { runId: 'run-a' })
    expect(await redis.cli('XLEN', key)).toBe(0)
  })

  it('a topic of 10 000 entries is trimmed in pages of a bounded size, to the end', async ({ annotate }) => {
    const prefix = uniquePrefix('trim-pages')
    const logger = recordingLogger()
    const pubsub = open({ keyPrefix: prefix, logger, maxStreamLength: 0 })
    const runs = ['run-a', 'run-a', 'run-a', 'run-b']
    await interleaved(pubsub, 'shared', 10_000, runs)
    const start = performance.now()
    await pubsub.trimTopic('shared', { runId: 'run-a' })
    const ms = performance.now() - start
    await annotate(`trimTopic of 10 000 entries (7 500 of the run): ${ms.toFixed(0)} ms`)
    const note = logger.lines.find((l) => l.message.includes('trimTopic'))
    const { pages, pageSize, deleted } = note!.fields as { pages: number; pageSize: number; deleted: number }
    expect(deleted).toBe(7_500)
    expect(pageSize).toBeLessThanOrEqual(1_000)
    expect(pages).toBeGreaterThanOrEqual(10_000 / pageSize)
    expect(await held(redis, `${prefix}:shared`)).toEqual(each(10_000, runs, 'run-b'))
  })

  it('trimming a topic that does not exist, or a run with no entries, resolves and changes nothing', async () => {
    const prefix = uniquePrefix('trim-nothing')
    const pubsub = open({ keyPrefix: prefix })
    await expect(pubsub.trimTopic('never-published', { runId: 'run-a' })).resolves.toBeUndefined()
    await pubsub.publish('shared', ev(1, 'run-b'))
    await pubsub.trimTopic('shared', { runId: 'run-a' })
    expect(await held(redis, `${prefix}:shared`)).toEqual(['run-b:1'])
  })

  it.skipIf(EXTERNAL_REDIS)('with the server frozen, trimTopic resolves within a bounded time and logs a warning', async () => {
    const server = await startRedis()
    own.push(server)
    const logger = recordingLogger()
    const pubsub = open({ url: server.url, keyPrefix: uniquePrefix('trim-frozen'), commandTimeoutMs: 300, logger })
    await pubsub.publish('shared', ev(1, 'run-a'))
    server.freeze()
    try {
      const settled = await settleWithin(pubsub.trimTopic('shared', { runId: 'run-a' }), 3_000)
      expect(settled.status).toBe('fulfilled')
    } finally {
      server.thaw()
    }
    // The warning comes from the runtime's thread, the answer too: either may reach
    // JavaScript first.
    await expect.poll(() => logger.warnings().some((l) => l.message.includes('trimTopic failed')), { timeout: 1_000 }).toBe(true)
  })

  it('bad arguments reject with ERR_STREAMS_INVALID_ARGUMENT before any I/O', async () => {
    // Nothing listens there: a call that reached for Redis would take the connect timeout.
    const pubsub = open({ url: `redis://127.0.0.1:${await freePort()}`, connectTimeoutMs: 5_000 })
    const bad: Array<[unknown, unknown, ErrorConstructor]> = [
      ['', { runId: 'r' }, RangeError],
      [7, { runId: 'r' }, TypeError],
      ['t', undefined, TypeError],
      ['t', null, TypeError],
      ['t', {}, TypeError],
      ['t', [], TypeError],
      ['t', { runId: '' }, RangeError],
      ['t', { runId: 42 }, TypeError],
      ['t', { runId: 'r', producedBefore: Number.NaN }, RangeError],
      ['t', { runId: 'r', producedBefore: Number.POSITIVE_INFINITY }, RangeError],
      ['t', { runId: 'r', producedBefore: new Date('not a date') }, RangeError],
      ['t', { runId: 'r', producedBefore: '2024-01-01' }, TypeError],
      // A misspelt option must not quietly trim the whole run.
      ['t', { runId: 'r', producedBfore: 2_000 }, TypeError],
      ['t', { runId: 'r', before: 2_000 }, TypeError],
    ]
    for (const [topic, options, kind] of bad) {
      const settled = await settleWithin(pubsub.trimTopic(topic as string, options as { runId: string }), 1_000)
      expect(settled.status, JSON.stringify([topic, options])).toBe('rejected')
      const reason = (settled as { reason: unknown }).reason
      expect(reason, JSON.stringify([topic, options])).toBeInstanceOf(kind)
      expect(errorCode(reason)).toBe('ERR_STREAMS_INVALID_ARGUMENT')
      expect(settled.elapsed).toBeLessThan(1_000)
    }
    const thrown = new Error('no options today')
    for (const trap of [{ get: () => { throw thrown } }, { ownKeys: () => { throw thrown } }]) {
      const err = await pubsub.trimTopic('t', new Proxy({ runId: 'r' }, trap)).catch((e: unknown) => e as Error)
      expect(err).toBeInstanceOf(TypeError)
      expect(errorCode(err)).toBe('ERR_STREAMS_INVALID_ARGUMENT')
      expect((err as Error).cause).toBe(thrown)
    }
  })

  it("through withLeases, trimTopic reaches a transport that has it, and resolves doing nothing on one that has not", async () => {
    const prefix = uniquePrefix('trim-leased')
    const transport = open({ keyPrefix: prefix })
    const leased = withLeases(transport, new MemoryLeaseProvider())
    await interleaved(transport, 'shared', 6, ['run-a', 'run-b'])
    await leased.trimTopic('shared', { runId: 'run-b' })
    expect(await held(redis, `${prefix}:shared`)).toEqual(['run-a:0', 'run-a:2', 'run-a:4'])
    const plain = withLeases(new EventEmitterPubSub(), new MemoryLeaseProvider())
    await expect(plain.trimTopic('shared', { runId: 'run-a' })).resolves.toBeUndefined()
  })
})

describe.skipIf(EXTERNAL_REDIS)('trimTopic on a Redis Cluster', () => {
  let cluster: RedisCluster
  const pubsubs: RedisStreamsPubSub[] = []
  beforeAll(async () => {
    cluster = await startCluster({ replicasPerMaster: 0 })
  }, 60_000)
  afterAll(async () => {
    await Promise.all(pubsubs.map((p) => p.close()))
    await cluster?.stop()
  })

  it("topics on every master: each trim leaves exactly the other run's entries and the entry a group holds, on the topic's own node", async () => {
    const prefix = uniquePrefix('trim-cluster')
    const pubsub = new RedisStreamsPubSub({ cluster: { nodes: cluster.urls }, keyPrefix: prefix, blockMs: 100 })
    pubsubs.push(pubsub)
    const topics = Array.from({ length: 9 }, (_, i) => `topic-${i}`)
    const nodeOf = async (topic: string) => cluster.masterOfSlot(await cluster.keySlot(`${prefix}:${topic}`))
    const nodes = new Set(await Promise.all(topics.map(async (t) => (await nodeOf(t)).port)))
    expect(nodes.size).toBe(3)
    let release: (() => Promise<void>) | undefined
    const inbox = new Inbox((event, ack) => {
      if (event.runId === 'run-a' && (event.data as { n: number }).n === 0) release = ack
      else return ack()
    })
    await pubsub.subscribe('topic-0', inbox.cb, { group: 'workers' })
    for (const topic of topics) await interleaved(pubsub, topic, 1_200, ['run-a', 'run-b'])
    await inbox.count(1_200, 20_000)
    await Promise.all(topics.map((t) => pubsub.trimTopic(t, { runId: 'run-a' })))
    for (const topic of topics) {
      const node = await nodeOf(topic)
      const left = await held(node, `${prefix}:${topic}`)
      const expected = each(1_200, ['run-a', 'run-b'], 'run-b')
      expect(left).toEqual(topic === 'topic-0' ? ['run-a:0', ...expected] : expected)
    }
    await release!()
    expect(await pendingCount(await nodeOf('topic-0'), `${prefix}:topic-0`, 'workers')).toBe(0)
  })
})
