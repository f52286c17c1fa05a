// RedisStreamsPubSub, the contract Mastra's PubSub asks of it, through the public JS API
// against real redis-server processes: stamping, fan-out, competing consumers, late join,
// startFrom, nack / redelivery / the poison-message cap, reclaiming what a killed process
// left pending, NOGROUP recovery, clearTopic, unsubscribe, flush, close (also during an
// outage), publish failures, localOnly, MAXLEN trimming, the leases on the same connection,
// `new Mastra({ pubsub })`, and a process that exits by itself after close().
//
// Layout (the one Mastra's own Redis Streams backend uses): a topic is the stream
// `<keyPrefix>:<topic>` whose entries carry one field, `event`, holding the event as JSON;
// a lease is the string `<keyPrefix>:lease:<key>` holding the owner, with a PX expiry.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { spawn, type ChildProcess } from 'node:child_process'
import path from 'node:path'

import { Mastra } from '@mastra/core'
import { isLeaseProvider, PubSub, type LeaseProvider } from '@mastra/core/events'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub, type RedisStreamsPubSubOptions } from '../dist/esm/index.js'
import { startFaultProxy } from './helpers/fault-proxy.js'
import { expectThrow, settleWithin } from './helpers/lease.js'
import { NODE } from './helpers/mastra-node.js'
import { EXTERNAL_REDIS, freePort, startRedis, type RedisServer, type RespValue } from './helpers/redis-server.js'
import { ev, Inbox, numberOf, recordingLogger, sleep, uniquePrefix, type Publishable } from './helpers/streams.js'

const FIXTURE = path.join(__dirname, 'fixtures', 'streams-process.mjs')
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/

let redis: RedisServer
const opened: RedisStreamsPubSub[] = []
const servers: RedisServer[] = []
const children = new Set<ChildProcess>()

beforeAll(async () => {
  redis = await startRedis()
})
afterEach(async () => {
  await Promise.allSettled(opened.splice(0).map((p) => p.close()))
  // stop() thaws a frozen server first: nothing is ever left SIGSTOPped.
  await Promise.allSettled(servers.splice(0).map((s) => s.stop()))
})
afterAll(async () => {
  for (const child of children) child.kill('SIGKILL')
  await redis?.stop()
})

/** A RedisStreamsPubSub closed after the test; on the shared server unless `url` is given. */
function open(options: RedisStreamsPubSubOptions = {}): RedisStreamsPubSub {
  const pubsub = new RedisStreamsPubSub({ url: redis.url, ...options })
  opened.push(pubsub)
  return pubsub
}

/** A server of this test's own, which it may freeze, kill or restart. */
async function ownServer(): Promise<RedisServer> {
  const server = await startRedis()
  servers.push(server)
  return server
}

/** The stream's entries as [entry id, field/value list]. */
async function entries(server: RedisServer, key: string): Promise<Array<[string, string[]]>> {
  return (await server.cli('XRANGE', key, '-', '+')) as Array<[string, string[]]>
}

/** How many entries of `group` on `key` are read and not yet acked (XPENDING summary). */
async function pendingCount(server: RedisServer, key: string, group: string): Promise<number> {
  const summary = (await server.cli('XPENDING', key, group)) as RespValue[]
  return Number(summary[0])
}

/** Publishes events `from..to` one after the other. */
async function publishRange(pubsub: RedisStreamsPubSub, topic: string, from: number, to: number) {
  for (let n = from; n <= to; n++) await pubsub.publish(topic, ev(n))
}

/** Spawns the fixture in `hold` mode; resolves with its stdout lines as they come. */
function holdingChild(config: Record<string, unknown>) {
  const child = spawn(NODE, [FIXTURE, JSON.stringify({ mode: 'hold', ...config })], { stdio: ['ignore', 'pipe', 'pipe'] })
  children.add(child)
  child.once('exit', () => children.delete(child))
  const said: Array<Record<string, unknown>> = []
  let stderr = ''
  let buffer = ''
  child.stdout.on('data', (chunk: Buffer) => {
    buffer += chunk.toString()
    let i
    while ((i = buffer.indexOf('\n')) >= 0) {
      said.push(JSON.parse(buffer.slice(0, i)) as Record<string, unknown>)
      buffer = buffer.slice(i + 1)
    }
  })
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()))
  /** The first line of `type`, once it came. */
  const line = async (type: string, ms: number) => {
    const deadline = Date.now() + ms
    for (;;) {
      const found = said.find((l) => l.type === type)
      if (found) return found
      if (Date.now() > deadline || child.exitCode !== null) throw new Error(`child never said ${type}; stderr: ${stderr}`)
      await sleep(20)
    }
  }
  /** Resolves once `n` events were reported. */
  const events = async (n: number, ms: number) => {
    const deadline = Date.now() + ms
    while (said.filter((l) => l.type === 'event').length < n) {
      if (Date.now() > deadline || child.exitCode !== null) throw new Error(`child reported fewer than ${n} events; stderr: ${stderr}`)
      await sleep(20)
    }
  }
  const kill = () =>
    new Promise<void>((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) return resolve()
      child.once('exit', () => resolve())
      child.kill('SIGKILL')
    })
  return { child, line, events, kill }
}

const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i)
const errorCode = (err: unknown) => (err as { code?: unknown } | undefined)?.code

describe('RedisStreamsPubSub', () => {
  describe('construction', () => {
    it('is a Mastra PubSub in pull mode and a LeaseProvider that Mastra detects structurally', () => {
      const pubsub = open({ keyPrefix: uniquePrefix('shape') })
      expect(pubsub).toBeInstanceOf(PubSub)
      expect(pubsub.supportedModes).toEqual(['pull'])
      expect(isLeaseProvider(pubsub)).toBe(true)
      expect(isLeaseProvider(pubsub.getLeaseProvider())).toBe(true)
    })

    it.each<[string, Record<string, unknown>, typeof TypeError | typeof RangeError]>([
      ['an empty keyPrefix', { keyPrefix: '' }, RangeError],
      ['a url that is not a string', { url: 42 }, TypeError],
      ['a url that is not a Redis URL', { url: 'ftp://nope' }, RangeError],
      ['blockMs 0 (a read that could block forever)', { blockMs: 0 }, RangeError],
      ['batchCount 0', { batchCount: 0 }, RangeError],
      ['a negative maxDeliveryAttempts', { maxDeliveryAttempts: -1 }, RangeError],
      ['a fractional maxDeliveryAttempts', { maxDeliveryAttempts: 1.5 }, RangeError],
      ['maxDeliveryAttempts given as a string', { maxDeliveryAttempts: '5' }, TypeError],
      ['a NaN connectTimeoutMs', { connectTimeoutMs: NaN }, RangeError],
      ['commandTimeoutMs 0', { commandTimeoutMs: 0 }, RangeError],
      ['reclaimIdleMs 0', { reclaimIdleMs: 0 }, RangeError],
      ['a negative streamIdleTtlMs', { streamIdleTtlMs: -5 }, RangeError],
      ['a negative maxStreamLength', { maxStreamLength: -1 }, RangeError],
      ['a negative maxInFlight', { maxInFlight: -1 }, RangeError],
      ['a fractional maxInFlight', { maxInFlight: 2.5 }, RangeError],
      ['maxInFlight given as a string', { maxInFlight: '8' }, TypeError],
    ])('rejects %s synchronously with ERR_LEASE_INVALID_OPTION', (_what, options, cls) => {
      expectThrow(() => new RedisStreamsPubSub({ url: redis.url, ...options } as RedisStreamsPubSubOptions), cls, 'ERR_LEASE_INVALID_OPTION')
    })

    it('rejects a logger without warn, and options that are not an object, like every other option', () => {
      expectThrow(() => new RedisStreamsPubSub({ url: redis.url, logger: 'loud' } as unknown as RedisStreamsPubSubOptions), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(() => new RedisStreamsPubSub({ url: redis.url, logger: {} } as unknown as RedisStreamsPubSubOptions), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(() => new RedisStreamsPubSub(5 as unknown as RedisStreamsPubSubOptions), TypeError, 'ERR_LEASE_INVALID_OPTION')
      // null means "all defaults", as for RedisLeaseProvider (nothing connects in the constructor).
      const defaults = new RedisStreamsPubSub(null as unknown as RedisStreamsPubSubOptions)
      opened.push(defaults)
    })

    it('accepts 0 and Infinity as unlimited delivery attempts and events in flight, and 0 to turn off trimming and reclaiming', () => {
      for (const options of [{ maxDeliveryAttempts: 0 }, { maxDeliveryAttempts: Infinity }, { maxInFlight: 0 }, { maxInFlight: Infinity }, { maxStreamLength: 0 }, { reclaimIntervalMs: 0 }, { streamIdleTtlMs: 0 }]) {
        expect(() => open(options), JSON.stringify(options)).not.toThrow()
      }
    })
  })

  describe('publish', () => {
    it('stamps a fresh id, a createdAt Date and deliveryAttempt 1 on every event, and keeps the rest as published', async () => {
      const prefix = uniquePrefix('stamp')
      const pubsub = open({ keyPrefix: prefix })
      const inbox = new Inbox()
      await pubsub.subscribe('stamps', inbox.cb)
      const before = Date.now()
      await pubsub.publish('stamps', { type: 'workflow.step', runId: 'run-7', data: { n: 1, nested: { list: [1, 'two', null] } } })
      await pubsub.publish('stamps', ev(2))
      const after = Date.now()
      const [first, second] = await inbox.count(2)

      expect(first).toMatchObject({ type: 'workflow.step', runId: 'run-7', data: { n: 1, nested: { list: [1, 'two', null] } }, deliveryAttempt: 1 })
      expect(first!.id).toMatch(UUID)
      expect(second!.id).toMatch(UUID)
      expect(second!.id).not.toBe(first!.id)
      expect(first!.createdAt).toBeInstanceOf(Date)
      expect(first!.createdAt.getTime()).toBeGreaterThanOrEqual(before - 5)
      expect(first!.createdAt.getTime()).toBeLessThanOrEqual(after + 5)
    })

    it('createdAt follows the clock from one millisecond to the next, and every delivered event gets a Date of its own', async () => {
      const prefix = uniquePrefix('stamp-clock')
      const pubsub = open({ keyPrefix: prefix })
      const inbox = new Inbox()
      await pubsub.subscribe('clock', inbox.cb)
      const stamps: Array<[number, number]> = [] // [before, after] each publish
      for (let n = 1; n <= 6; n++) {
        const before = Date.now()
        await Promise.all([pubsub.publish('clock', ev(n * 10)), pubsub.publish('clock', ev(n * 10 + 1))])
        stamps.push([before, Date.now()])
        await sleep(3)
      }
      const events = await inbox.count(12)
      const written = (await entries(redis, `${prefix}:clock`)).map(([, f]) => (JSON.parse(f[1]!) as { createdAt: string }).createdAt)
      for (let i = 0; i < 12; i++) {
        const [before, after] = stamps[Math.floor(i / 2)]!
        const at = events[i]!.createdAt
        expect(at).toBeInstanceOf(Date)
        expect(written[i]).toBe(at.toISOString())
        expect(at.getTime()).toBeGreaterThanOrEqual(before)
        expect(at.getTime()).toBeLessThanOrEqual(after)
      }
      expect(new Set(events.map((e) => e.createdAt)).size, 'no Date object is shared').toBe(12)
      expect(new Set(written).size, 'six publish rounds, 3 ms apart').toBeGreaterThanOrEqual(6)
    })

    it("writes the stream <keyPrefix>:<topic> with one field, event, holding the stamped event's JSON", async () => {
      const prefix = uniquePrefix('layout')
      const pubsub = open({ keyPrefix: prefix })
      const inbox = new Inbox()
      await pubsub.subscribe('layout', inbox.cb)
      await pubsub.publish('layout', ev(1, 'run-layout'))
      const [delivered] = await inbox.count(1)

      const written = await entries(redis, `${prefix}:layout`)
      expect(written).toHaveLength(1)
      const [, fields] = written[0]!
      expect(fields).toHaveLength(2)
      expect(fields[0]).toBe('event')
      const json = JSON.parse(fields[1]!) as Record<string, unknown>
      expect(json).toEqual({
        type: 'test',
        runId: 'run-layout',
        data: { n: 1 },
        id: delivered!.id,
        createdAt: delivered!.createdAt.toISOString(),
        deliveryAttempt: 1,
      })
    })

    it('publishes made without awaiting land in the stream in call order (Mastra broadcasts fire-and-forget)', async () => {
      const prefix = uniquePrefix('order')
      const pubsub = open({ keyPrefix: prefix, maxStreamLength: 0 })
      await pubsub.publish('warm', ev(0))
      for (const count of [1, 2, 10, 50, 100, 300, 1_000]) {
        await Promise.all(range(1, count).map((n) => pubsub.publish(`order.${count}`, ev(n))))
        const written = await entries(redis, `${prefix}:order.${count}`)
        const order = written.map(([, fields]) => (JSON.parse(fields[1]!) as { data: { n: number } }).data.n)
        expect(order, `${count} publishes in one turn`).toEqual(range(1, count))
      }
    })

    it('keeps a deliveryAttempt the publisher set (a redelivery by a peer), as Mastra does', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('attempt') })
      const inbox = new Inbox()
      await pubsub.subscribe('attempts', inbox.cb)
      await pubsub.publish('attempts', { ...ev(1), deliveryAttempt: 3 })
      const [event] = await inbox.count(1)
      expect(event!.deliveryAttempt).toBe(3)
    })

    it('always assigns its own id and createdAt, and a deliveryAttempt that is not a positive integer becomes 1', async () => {
      const prefix = uniquePrefix('stamp')
      const pubsub = open({ keyPrefix: prefix })
      const inbox = new Inbox()
      await pubsub.subscribe('stamp', inbox.cb)
      const forged = { ...ev(1), id: 'forged', createdAt: new Date(0) } as unknown as Parameters<typeof pubsub.publish>[1]
      await pubsub.publish('stamp', forged)
      for (const deliveryAttempt of [0, -2, 1.5, '4', null]) {
        await pubsub.publish('stamp', { ...ev(2), deliveryAttempt } as unknown as Parameters<typeof pubsub.publish>[1])
      }
      const events = await inbox.count(6)
      expect(events[0]!.id).not.toBe('forged')
      expect(events[0]!.createdAt.getTime()).toBeGreaterThan(0)
      expect(events.map((e) => e.deliveryAttempt)).toEqual([1, 1, 1, 1, 1, 1])
      // One key each in the stored JSON: a stamp replaces, never duplicates.
      const [, fields] = (await entries(redis, `${prefix}:stamp`))[0]!
      expect(fields[1]!.match(/"id":/g)).toHaveLength(1)
      expect(fields[1]!.match(/"createdAt":/g)).toHaveLength(1)
    })

    it('rejects an event that is not an object with a coded TypeError, and writes nothing', async () => {
      const prefix = uniquePrefix('not-object')
      const pubsub = open({ keyPrefix: prefix })
      for (const bad of ['text', 42, null, [1, 2]]) {
        const err = await pubsub.publish('bad', bad as unknown as Parameters<typeof pubsub.publish>[1]).then(
          () => undefined,
          (e: unknown) => e as Error & { code?: string },
        )
        expect(err, JSON.stringify(bad)).toBeInstanceOf(TypeError)
        expect(err!.code).toBe('ERR_STREAMS_INVALID_ARGUMENT')
      }
      expect(await redis.cli('EXISTS', `${prefix}:bad`)).toBe(0)
    })
  })

  describe('delivery', () => {
    it('fans out: without a group, two subscribers (on two instances) each get every event, in order', async () => {
      const prefix = uniquePrefix('fanout')
      const a = open({ keyPrefix: prefix })
      const b = open({ keyPrefix: prefix })
      const first = new Inbox()
      const second = new Inbox()
      await a.subscribe('news', first.cb)
      await b.subscribe('news', second.cb)
      await publishRange(a, 'news', 1, 10)
      await first.count(10)
      await second.count(10)
      await sleep(300)
      expect(first.numbers).toEqual(range(1, 10))
      expect(second.numbers).toEqual(range(1, 10))
      // Same events, same ids: one stream entry each, read by both.
      expect(second.events.map((e) => e.id)).toEqual(first.events.map((e) => e.id))
    })

    it('two callbacks of one instance on one topic, without a group, both get every event', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('fanout-local') })
      const first = new Inbox()
      const second = new Inbox()
      await pubsub.subscribe('news', first.cb)
      await pubsub.subscribe('news', second.cb)
      await publishRange(pubsub, 'news', 1, 5)
      await first.count(5)
      await second.count(5)
      expect(first.numbers).toEqual(range(1, 5))
      expect(second.numbers).toEqual(range(1, 5))
    })

    it('competing consumers: two instances in one group each get a share, and every event reaches exactly one of them', async () => {
      const prefix = uniquePrefix('compete')
      const a = open({ keyPrefix: prefix })
      const b = open({ keyPrefix: prefix })
      const first = new Inbox()
      const second = new Inbox()
      await a.subscribe('work', first.cb, { group: 'workers' })
      await b.subscribe('work', second.cb, { group: 'workers' })
      for (let n = 1; n <= 40; n++) {
        await a.publish('work', ev(n))
        await sleep(5)
      }
      await first.until(() => first.events.length + second.events.length >= 40, 5_000, 'all 40 events in the group')
      await sleep(500) // nothing arrives twice later either
      const all = [...first.numbers, ...second.numbers].sort((x, y) => x - y)
      expect(all).toEqual(range(1, 40))
      expect(first.events.length, `shares ${first.events.length}/${second.events.length}`).toBeGreaterThan(0)
      expect(second.events.length, `shares ${first.events.length}/${second.events.length}`).toBeGreaterThan(0)
      expect(await pendingCount(redis, `${prefix}:work`, 'workers')).toBe(0)
    })

    it('a group subscriber that joins late gets the backlog published before it subscribed (startFrom defaults to earliest)', async () => {
      const prefix = uniquePrefix('late')
      const publisher = open({ keyPrefix: prefix })
      await publishRange(publisher, 'jobs', 1, 5)
      const late = open({ keyPrefix: prefix })
      const inbox = new Inbox()
      await late.subscribe('jobs', inbox.cb, { group: 'late-group' })
      await publisher.publish('jobs', ev(6))
      await inbox.count(6)
      expect(inbox.numbers).toEqual(range(1, 6))
    })

    it('a second subscriber joining an existing group continues from the group position, never replaying what the group acked', async () => {
      const prefix = uniquePrefix('existing-group')
      const a = open({ keyPrefix: prefix })
      const first = new Inbox()
      await a.subscribe('jobs', first.cb, { group: 'g' })
      await publishRange(a, 'jobs', 1, 3)
      await first.count(3)
      await a.unsubscribe('jobs', first.cb)
      await sleep(100)

      const b = open({ keyPrefix: prefix })
      const second = new Inbox()
      await b.subscribe('jobs', second.cb, { group: 'g' }) // startFrom earliest, but the group exists
      await a.publish('jobs', ev(4))
      await second.count(1)
      await sleep(300)
      expect(second.numbers).toEqual([4])
    })

    it("startFrom 'latest' skips the backlog, for a new group and for a fan-out subscription", async () => {
      const prefix = uniquePrefix('latest')
      const pubsub = open({ keyPrefix: prefix })
      await publishRange(pubsub, 'feed', 1, 3)
      const grouped = new Inbox()
      const fanned = new Inbox()
      await pubsub.subscribe('feed', grouped.cb, { group: 'newcomers', startFrom: 'latest' })
      await pubsub.subscribe('feed', fanned.cb, { startFrom: 'latest' })
      await publishRange(pubsub, 'feed', 4, 5)
      await grouped.count(2)
      await fanned.count(2)
      await sleep(300)
      expect(grouped.numbers).toEqual([4, 5])
      expect(fanned.numbers).toEqual([4, 5])
    })

    it('a fan-out subscription with the default startFrom also reads the backlog', async () => {
      const prefix = uniquePrefix('fanout-earliest')
      const pubsub = open({ keyPrefix: prefix })
      await publishRange(pubsub, 'feed', 1, 3)
      const inbox = new Inbox()
      await pubsub.subscribe('feed', inbox.cb)
      await inbox.count(3)
      expect(inbox.numbers).toEqual([1, 2, 3])
    })
  })

  describe('reading and acking in bulk', () => {
    it.skipIf(EXTERNAL_REDIS)('acks made in one turn reach Redis as one XACK per subscription, and each ack resolves once it has landed', async () => {
      const prefix = uniquePrefix('bulk-ack')
      const pubsub = open({ keyPrefix: prefix })
      const held: Array<() => Promise<void>> = []
      const hold = new Inbox((_event, ack) => void held.push(ack))
      const also = new Inbox((_event, ack) => void held.push(ack))
      await pubsub.subscribe('news', hold.cb, { group: 'g1' })
      await pubsub.subscribe('news', also.cb, { group: 'g2' })
      await Promise.all(range(1, 40).map((n) => pubsub.publish('news', ev(n))))
      await hold.count(40)
      await also.count(40)

      const before = (await redis.commandCalls()).xack ?? 0
      await Promise.all(held.splice(0).map((ack) => ack())) // 80 acks, all in this turn
      expect((await redis.commandCalls()).xack! - before).toBe(2)
      expect(await pendingCount(redis, `${prefix}:news`, 'g1')).toBe(0)
      expect(await pendingCount(redis, `${prefix}:news`, 'g2')).toBe(0)

      // The control: acks made in separate turns each go on their own.
      await Promise.all(range(41, 45).map((n) => pubsub.publish('news', ev(n))))
      await hold.count(45)
      await also.count(45)
      const apart = (await redis.commandCalls()).xack ?? 0
      for (const ack of held.splice(0)) await ack()
      expect((await redis.commandCalls()).xack! - apart).toBe(10)
      expect(await pendingCount(redis, `${prefix}:news`, 'g1')).toBe(0)
    })

    it('a group with a backlog is read several reads per round trip, at most batchCount entries each, every event exactly once', async () => {
      const prefix = uniquePrefix('read-ahead')
      const publisher = open({ keyPrefix: prefix })
      await Promise.all(range(1, 400).map((n) => publisher.publish('jobs', ev(n))))
      const proxy = await startFaultProxy({ host: redis.host, port: redis.port })
      try {
        const consumer = open({ url: proxy.url, keyPrefix: prefix, batchCount: 10 })
        const inbox = new Inbox()
        await consumer.subscribe('jobs', inbox.cb, { group: 'workers' })
        await inbox.count(400)
        await sleep(200) // nothing arrives twice later either
        expect([...inbox.numbers].sort((x, y) => x - y)).toEqual(range(1, 400))
        const { mostInOneChunk } = proxy.stats()
        // The reader never sends a read before the previous one answered, unless it reads ahead.
        expect(mostInOneChunk.XREADGROUP, JSON.stringify(mostInOneChunk)).toBeGreaterThan(1)
        expect(mostInOneChunk.XREADGROUP).toBeLessThanOrEqual(8)
        expect(await pendingCount(redis, `${prefix}:jobs`, 'workers')).toBe(0)
      } finally {
        await proxy.close()
      }
    })

    it('without a backlog the reader sends one blocking read at a time', async () => {
      const prefix = uniquePrefix('no-read-ahead')
      const proxy = await startFaultProxy({ host: redis.host, port: redis.port })
      try {
        const consumer = open({ url: proxy.url, keyPrefix: prefix, batchCount: 10, blockMs: 100 })
        const inbox = new Inbox()
        await consumer.subscribe('jobs', inbox.cb, { group: 'workers' })
        for (let n = 1; n <= 20; n++) {
          await consumer.publish('jobs', ev(n))
          await inbox.count(n)
        }
        await sleep(300) // a few empty blocking reads time out meanwhile
        expect(proxy.stats().mostInOneChunk.XREADGROUP).toBe(1)
      } finally {
        await proxy.close()
      }
    })
  })

  describe('nack, redelivery and the poison-message cap', () => {
    const failures: Array<[string, (nack: () => Promise<void>) => void | Promise<void>]> = [
      ['calls nack()', (nack) => nack()],
      ['throws', () => {
        throw new Error('handler failed')
      }],
      ['returns a rejected promise', () => Promise.reject(new Error('handler failed'))],
    ]

    it.each(failures)(
      'a group subscriber that %s gets the event again with deliveryAttempt + 1, and after maxDeliveryAttempts it is dropped with a logger.warn',
      async (_how, fail) => {
        const prefix = uniquePrefix('poison')
        const logger = recordingLogger()
        const pubsub = open({ keyPrefix: prefix, maxDeliveryAttempts: 3, logger })
        const inbox = new Inbox((_event, _ack, nack) => fail(nack))
        await pubsub.subscribe('poison', inbox.cb, { group: 'g' })
        await pubsub.publish('poison', ev(1))
        await inbox.count(3)
        await sleep(700) // no fourth attempt
        expect(inbox.events.map((e) => e.deliveryAttempt)).toEqual([1, 2, 3])
        // The same event each time: same id, same createdAt, same payload.
        expect(new Set(inbox.events.map((e) => e.id)).size).toBe(1)
        expect(new Set(inbox.events.map((e) => e.createdAt.getTime())).size).toBe(1)
        expect(inbox.numbers).toEqual([1, 1, 1])

        const dropped = logger.warnings().filter((l) => /max delivery attempts/i.test(l.message))
        expect(dropped, JSON.stringify(logger.lines)).toHaveLength(1)
        expect(dropped[0]!.fields).toMatchObject({ topic: 'poison', eventId: inbox.events[0]!.id, eventType: 'test' })
        // Nothing is left pending in the group.
        expect(await pendingCount(redis, `${prefix}:poison`, 'g')).toBe(0)
      },
    )

    it('an event that fails twice and then succeeds is acked on its third attempt and not delivered again', async () => {
      const prefix = uniquePrefix('recover')
      const logger = recordingLogger()
      const pubsub = open({ keyPrefix: prefix, maxDeliveryAttempts: 5, logger })
      const inbox = new Inbox(async (event, ack, nack) => ((event.deliveryAttempt ?? 1) < 3 ? nack() : ack()))
      await pubsub.subscribe('flaky', inbox.cb, { group: 'g' })
      await pubsub.publish('flaky', ev(1))
      await inbox.count(3)
      await sleep(500)
      expect(inbox.events.map((e) => e.deliveryAttempt)).toEqual([1, 2, 3])
      expect(logger.warnings()).toEqual([])
      expect(await pendingCount(redis, `${prefix}:flaky`, 'g')).toBe(0)
    })

    it('maxDeliveryAttempts 0 means unlimited: a nacked event keeps coming back past the default cap of 5', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('unlimited'), maxDeliveryAttempts: 0 })
      const inbox = new Inbox(async (event, ack, nack) => ((event.deliveryAttempt ?? 1) < 8 ? nack() : ack()))
      await pubsub.subscribe('again', inbox.cb, { group: 'g' })
      await pubsub.publish('again', ev(1))
      await inbox.count(8)
      expect(inbox.events.map((e) => e.deliveryAttempt)).toEqual(range(1, 8))
    })

    it('the default cap is 5 attempts', async () => {
      const logger = recordingLogger()
      const pubsub = open({ keyPrefix: uniquePrefix('default-cap'), logger })
      const inbox = new Inbox((_event, _ack, nack) => nack())
      await pubsub.subscribe('poison', inbox.cb, { group: 'g' })
      await pubsub.publish('poison', ev(1))
      await inbox.count(5)
      await sleep(700)
      expect(inbox.events.map((e) => e.deliveryAttempt)).toEqual([1, 2, 3, 4, 5])
      expect(logger.warnings().filter((l) => /max delivery attempts/i.test(l.message))).toHaveLength(1)
    })

    it('a fan-out subscriber that nacks gets the event again with deliveryAttempt + 1, up to the cap', async () => {
      const logger = recordingLogger()
      const pubsub = open({ keyPrefix: uniquePrefix('fanout-nack'), maxDeliveryAttempts: 2, logger })
      const inbox = new Inbox((_event, _ack, nack) => nack())
      await pubsub.subscribe('news', inbox.cb)
      await pubsub.publish('news', ev(1))
      await inbox.count(2)
      await sleep(500)
      expect(inbox.events.map((e) => e.deliveryAttempt)).toEqual([1, 2])
      expect(logger.warnings().filter((l) => /max delivery attempts/i.test(l.message))).toHaveLength(1)
    })

    it('ack then nack of one delivery: the first settlement counts, the event is not redelivered', async () => {
      const prefix = uniquePrefix('settle-once')
      const pubsub = open({ keyPrefix: prefix })
      const inbox = new Inbox(async (_event, ack, nack) => {
        await ack()
        await nack()
        await ack()
      })
      await pubsub.subscribe('once', inbox.cb, { group: 'g' })
      await pubsub.publish('once', ev(1))
      await inbox.count(1)
      await sleep(500)
      expect(inbox.events).toHaveLength(1)
      expect(await pendingCount(redis, `${prefix}:once`, 'g')).toBe(0)
    })
  })

  describe('maxInFlight', () => {
    /** Pending entries of `group` per consumer (XPENDING summary), as counts. */
    async function perConsumer(key: string, group: string): Promise<number[]> {
      const summary = (await redis.cli('XPENDING', key, group)) as RespValue[]
      return ((summary[3] ?? []) as Array<[string, string]>).map(([, n]) => Number(n))
    }

    /** A consumer whose callbacks wait for `release()`, then ack. */
    function holding() {
      let release = () => {}
      const gate = new Promise<void>((resolve) => (release = resolve))
      const inbox = new Inbox(async (_event, ack) => {
        await gate
        await ack()
      })
      return { inbox, release: () => release() }
    }

    it('with slow handlers a consumer holds at most maxInFlight events, and the rest of the backlog goes to its siblings; every event is handled once', async () => {
      const prefix = uniquePrefix('in-flight')
      const publisher = open({ keyPrefix: prefix })
      await Promise.all(range(1, 20).map((n) => publisher.publish('jobs', ev(n))))
      const a = holding()
      const b = holding()
      await open({ keyPrefix: prefix, maxInFlight: 3 }).subscribe('jobs', a.inbox.cb, { group: 'workers' })
      await a.inbox.count(3)
      await sleep(300) // two more blocking-read periods: nothing more is read
      expect(a.inbox.events).toHaveLength(3)
      expect(await perConsumer(`${prefix}:jobs`, 'workers')).toEqual([3])

      await open({ keyPrefix: prefix, maxInFlight: 3 }).subscribe('jobs', b.inbox.cb, { group: 'workers' })
      await b.inbox.count(3)
      await sleep(300)
      expect(b.inbox.events).toHaveLength(3)
      expect(await perConsumer(`${prefix}:jobs`, 'workers')).toEqual([3, 3])

      a.release()
      b.release()
      await a.inbox.until(() => a.inbox.events.length + b.inbox.events.length >= 20, 5_000, 'all 20 events')
      await sleep(200)
      expect([...a.inbox.numbers, ...b.inbox.numbers].sort((x, y) => x - y)).toEqual(range(1, 20))
      for (let i = 0; i < 50 && (await pendingCount(redis, `${prefix}:jobs`, 'workers')) > 0; i++) await sleep(20)
      expect(await pendingCount(redis, `${prefix}:jobs`, 'workers')).toBe(0)
    })

    it('without a limit (maxInFlight 0), the first consumer takes the whole backlog: the control for the test above', async () => {
      const prefix = uniquePrefix('in-flight-off')
      const publisher = open({ keyPrefix: prefix })
      await Promise.all(range(1, 20).map((n) => publisher.publish('jobs', ev(n))))
      const a = holding()
      await open({ keyPrefix: prefix, maxInFlight: 0 }).subscribe('jobs', a.inbox.cb, { group: 'workers' })
      await a.inbox.count(20)
      expect(await perConsumer(`${prefix}:jobs`, 'workers')).toEqual([20])
      a.release()
    })

    it("a group callback that returns without ack or nack keeps its place until it settles; a fan-out one gives it back, and a fan-out subscription is bounded too", async () => {
      const prefix = uniquePrefix('in-flight-place')
      const publisher = open({ keyPrefix: prefix })
      await Promise.all(range(1, 5).map((n) => publisher.publish('jobs', ev(n))))
      const consumer = open({ keyPrefix: prefix, maxInFlight: 1 })
      const acks: Array<() => Promise<void>> = []
      const later = new Inbox((_event, ack) => void acks.push(ack)) // returns at once, acks later
      await consumer.subscribe('jobs', later.cb, { group: 'workers' })
      await later.count(1)
      await sleep(300)
      expect(later.numbers, 'held: the one place stays taken').toEqual([1])
      for (let n = 2; n <= 5; n++) {
        await acks[n - 2]!()
        await later.count(n)
      }
      expect(later.numbers).toEqual(range(1, 5))

      const forgetful = new Inbox(async () => {}) // a fan-out callback that returns, never settles
      await consumer.subscribe('jobs', forgetful.cb)
      await forgetful.count(5)
      expect(forgetful.numbers).toEqual(range(1, 5))
      const fanned = holding()
      await consumer.subscribe('jobs', fanned.inbox.cb)
      await fanned.inbox.count(1)
      await sleep(300)
      expect(fanned.inbox.numbers).toEqual([1])
      fanned.release()
      await fanned.inbox.count(5)
      expect(fanned.inbox.numbers).toEqual(range(1, 5))
    })
  })

  describe('held until settled', () => {
    it('a group delivery whose callback returned is held until its late ack: not reclaimed, not handed out again, and the ack settles it', async () => {
      const prefix = uniquePrefix('held')
      const tuning = { keyPrefix: prefix, reclaimIdleMs: 300, reclaimIntervalMs: 100, blockMs: 100 }
      const holder = open(tuning)
      const acks: Array<() => Promise<void>> = []
      const returnsAtOnce = new Inbox((_event, ack) => void acks.push(ack))
      await holder.subscribe('jobs', returnsAtOnce.cb, { group: 'workers' })
      await holder.publish('jobs', ev(1))
      await returnsAtOnce.count(1)
      const sibling = new Inbox()
      await open(tuning).subscribe('jobs', sibling.cb, { group: 'workers' })
      await sleep(1_500) // five times reclaimIdleMs: a dozen reclaim passes on each side
      expect(sibling.events).toEqual([])
      expect(returnsAtOnce.events).toHaveLength(1)
      expect(await pendingCount(redis, `${prefix}:jobs`, 'workers')).toBe(1)
      await acks[0]!()
      expect(await pendingCount(redis, `${prefix}:jobs`, 'workers')).toBe(0)
      await sleep(400)
      expect(sibling.events).toEqual([])
      expect(returnsAtOnce.events).toHaveLength(1)
    })

    it('with inFlightTimeoutMs, a delivery its handler never settles is nacked on its behalf with a warning: redelivered with deliveryAttempt 2, and the late ack changes nothing', async () => {
      const prefix = uniquePrefix('in-flight-timeout')
      const logger = recordingLogger()
      const pubsub = open({ keyPrefix: prefix, inFlightTimeoutMs: 300, logger })
      const acks: Array<() => Promise<void>> = []
      const stalls = new Inbox((event, ack) => {
        if (event.deliveryAttempt === 1) acks.push(ack) // stalls: never settles
        else return ack()
      })
      await pubsub.subscribe('jobs', stalls.cb, { group: 'workers' })
      const started = Date.now()
      await pubsub.publish('jobs', ev(1))
      const [first, again] = await stalls.count(2, 3_000)
      expect(Date.now() - started).toBeGreaterThanOrEqual(250)
      expect(again!.id).toBe(first!.id)
      expect([first!.deliveryAttempt, again!.deliveryAttempt]).toEqual([1, 2])
      const warning = logger.warnings().find((l) => /inFlightTimeoutMs/.test(l.message))
      expect(warning?.fields).toMatchObject({ topic: 'jobs', eventId: first!.id, attempt: 1 })
      for (let i = 0; i < 50 && (await pendingCount(redis, `${prefix}:jobs`, 'workers')) > 0; i++) await sleep(20)
      await acks[0]!() // the stalled handler wakes up: its ack resolves and does nothing
      expect(await pendingCount(redis, `${prefix}:jobs`, 'workers')).toBe(0)
      expect(Number(await redis.cli('XLEN', `${prefix}:jobs`))).toBe(2)
      await sleep(400)
      expect(stalls.events).toHaveLength(2)
    })
  })

  describe('a handler slower than reclaimIdleMs', () => {
    /** XPENDING's detail of the group's pending entries: [entry id, consumer, idle ms, deliveries]. */
    async function pendingDetail(key: string, group: string): Promise<Array<[string, string, number, number]>> {
      return (await redis.cli('XPENDING', key, group, '-', '+', 10)) as Array<[string, string, number, number]>
    }

    it('keeps its event while it runs: no sibling reclaims it, its deliveryAttempt stays 1, and its ack settles it once', async () => {
      const prefix = uniquePrefix('slow-handler')
      const tuning = { keyPrefix: prefix, reclaimIdleMs: 300, reclaimIntervalMs: 100, blockMs: 100 }
      const slow = open(tuning)
      let release = () => {}
      const held = new Promise<void>((resolve) => (release = resolve))
      const running = new Inbox(async (_event, ack) => {
        await held
        await ack()
      })
      await slow.subscribe('jobs', running.cb, { group: 'workers' })
      await slow.publish('jobs', ev(1))
      await running.count(1)
      const sibling = new Inbox()
      await open(tuning).subscribe('jobs', sibling.cb, { group: 'workers' })

      await sleep(1_500) // five times reclaimIdleMs, fifteen sibling reclaim passes
      const [entry, ...others] = await pendingDetail(`${prefix}:jobs`, 'workers')
      expect(others).toEqual([])
      expect(Number(entry![3]), 'deliveries counted by Redis').toBe(1)
      expect(Number(entry![2]), 'idle ms').toBeLessThan(300)
      expect(sibling.events).toEqual([])

      release()
      for (let i = 0; i < 50 && (await pendingCount(redis, `${prefix}:jobs`, 'workers')) > 0; i++) await sleep(20)
      expect(await pendingCount(redis, `${prefix}:jobs`, 'workers')).toBe(0)
      await sleep(400)
      expect(sibling.events).toEqual([])
      expect(running.events).toHaveLength(1)
    })
  })

  describe('a consumer process that dies holding an event', () => {
    it('after kill -9, a live consumer of the group gets the event it never settled once reclaimIdleMs has passed (XAUTOCLAIM)', async () => {
      const prefix = uniquePrefix('reclaim')
      const key = `${prefix}:jobs`
      const holder = holdingChild({ url: redis.url, keyPrefix: prefix, topic: 'jobs', group: 'workers' })
      await holder.line('ready', 10_000)
      const publisher = open({ keyPrefix: prefix })
      await publisher.publish('jobs', ev(1))
      const held = await holder.line('event', 5_000)
      const heldAt = Date.now()
      await holder.kill()
      expect(await pendingCount(redis, key, 'workers')).toBe(1)

      const RECLAIM_IDLE_MS = 800
      const survivor = open({ keyPrefix: prefix, reclaimIdleMs: RECLAIM_IDLE_MS, reclaimIntervalMs: 100 })
      const inbox = new Inbox()
      await survivor.subscribe('jobs', inbox.cb, { group: 'workers' })
      const [reclaimed] = await inbox.count(1, 5_000)
      const waited = Date.now() - heldAt
      expect(reclaimed!.id).toBe(held.id)
      expect(numberOf(reclaimed!)).toBe(1)
      // Not before the entry sat idle for reclaimIdleMs (a slow but live consumer keeps it).
      expect(waited).toBeGreaterThanOrEqual(RECLAIM_IDLE_MS - 50)
      // Acked by the survivor: nothing pending any more, and it is not handed out again.
      await sleep(500)
      expect(inbox.events).toHaveLength(1)
      expect(await pendingCount(redis, key, 'workers')).toBe(0)
    })

    it('a message that kills every consumer reading it is reclaimed with a rising deliveryAttempt and, past maxDeliveryAttempts, dropped with the warning instead of circulating for ever', async () => {
      const prefix = uniquePrefix('poison-crash')
      const key = `${prefix}:jobs`
      const MAX = 3
      // Short reclaim settings, so each new consumer takes the entry over soon after the last
      // one died; the children reclaim (XAUTOCLAIM) the first time as soon as they subscribe.
      const options = { maxDeliveryAttempts: MAX, reclaimIdleMs: 300, reclaimIntervalMs: 100 }
      const publisher = open({ keyPrefix: prefix })
      const seen: Array<Record<string, unknown>> = []
      for (let attempt = 1; attempt <= MAX; attempt++) {
        const victim = holdingChild({ mode: 'die-on', url: redis.url, keyPrefix: prefix, topic: 'jobs', group: 'workers', options })
        await victim.line('ready', 10_000)
        if (attempt === 1) await publisher.publish('jobs', { type: 'test', runId: 'run-1', data: { n: 1, poison: true } })
        seen.push(await victim.line('event', 10_000))
        await new Promise<void>((resolve) => (victim.child.signalCode !== null ? resolve() : victim.child.once('exit', () => resolve())))
        expect(victim.child.signalCode).toBe('SIGKILL') // it died handling the event
      }
      expect(seen.map((l) => l.deliveryAttempt)).toEqual([1, 2, 3])
      expect(new Set(seen.map((l) => l.id)).size).toBe(1)

      // A healthy consumer of the group: the fourth delivery would exceed the cap, so it never
      // gets the event; the event is dropped with the nack cap's warning and leaves the group.
      const logger = recordingLogger()
      const healthy = open({ keyPrefix: prefix, logger, ...options })
      const inbox = new Inbox()
      await healthy.subscribe('jobs', inbox.cb, { group: 'workers' })
      await publisher.publish('jobs', ev(2))
      await inbox.count(1)
      const deadline = Date.now() + 5_000
      while (!logger.warnings().some((l) => /max delivery attempts/i.test(l.message)) && Date.now() < deadline) await sleep(50)
      await sleep(500) // later reclaim passes find nothing more
      expect(inbox.numbers).toEqual([2])
      const dropped = logger.warnings().filter((l) => /max delivery attempts/i.test(l.message))
      expect(dropped, JSON.stringify(logger.lines)).toHaveLength(1)
      expect(dropped[0]!.fields).toMatchObject({ topic: 'jobs', eventId: seen[0]!.id, attempt: MAX + 1, max: MAX, reason: 'reclaimed' })
      expect(await pendingCount(redis, key, 'workers')).toBe(0)
    })

    it('with reclaiming off (reclaimIntervalMs 0), the event a killed consumer held stays pending and no live consumer gets it', async () => {
      const prefix = uniquePrefix('no-reclaim')
      const holder = holdingChild({ url: redis.url, keyPrefix: prefix, topic: 'jobs', group: 'workers' })
      await holder.line('ready', 10_000)
      const publisher = open({ keyPrefix: prefix })
      await publisher.publish('jobs', ev(1))
      await holder.line('event', 5_000)
      await holder.kill()

      const survivor = open({ keyPrefix: prefix, reclaimIdleMs: 100, reclaimIntervalMs: 0 })
      const inbox = new Inbox()
      await survivor.subscribe('jobs', inbox.cb, { group: 'workers' })
      await publisher.publish('jobs', ev(2))
      await inbox.count(1)
      await sleep(1_000)
      expect(inbox.numbers).toEqual([2])
      expect(await pendingCount(redis, `${prefix}:jobs`, 'workers')).toBe(1)
    })
  })

  describe('NOGROUP recovery', () => {
    it('after the stream is deleted under a group subscriber (DEL), delivery resumes with the next publish', async () => {
      const prefix = uniquePrefix('nogroup-del')
      const pubsub = open({ keyPrefix: prefix })
      const inbox = new Inbox()
      await pubsub.subscribe('jobs', inbox.cb, { group: 'g' })
      await pubsub.publish('jobs', ev(1))
      await inbox.count(1)
      expect(await redis.cli('DEL', `${prefix}:jobs`)).toBe(1)
      await sleep(200)
      await pubsub.publish('jobs', ev(2))
      await pubsub.publish('jobs', ev(3))
      await inbox.count(3, 8_000)
      expect(inbox.numbers).toEqual([1, 2, 3])
    })

    it('after the group is destroyed (XGROUP DESTROY), delivery resumes with the next publish', async () => {
      const prefix = uniquePrefix('nogroup-destroy')
      const pubsub = open({ keyPrefix: prefix })
      const inbox = new Inbox()
      await pubsub.subscribe('jobs', inbox.cb, { group: 'g' })
      await pubsub.publish('jobs', ev(1))
      await inbox.count(1)
      expect(await redis.cli('XGROUP', 'DESTROY', `${prefix}:jobs`, 'g')).toBe(1)
      await sleep(200)
      await pubsub.publish('jobs', ev(2))
      await inbox.count(2, 8_000)
      await sleep(300)
      expect(inbox.numbers).toEqual([1, 2])
    })

    it('a fan-out subscriber carries on after its stream is deleted', async () => {
      const prefix = uniquePrefix('fanout-del')
      const pubsub = open({ keyPrefix: prefix })
      const inbox = new Inbox()
      await pubsub.subscribe('news', inbox.cb)
      await pubsub.publish('news', ev(1))
      await inbox.count(1)
      await redis.cli('DEL', `${prefix}:news`)
      await sleep(5) // a later millisecond: see the next test for the same one
      await pubsub.publish('news', ev(2))
      await inbox.count(2, 8_000)
      expect(inbox.numbers).toEqual([1, 2])
    })

    /**
     * Another process deletes the stream and re-creates it within the millisecond of the last
     * entry the subscribers read: the new stream's first entry has an id at or below that
     * entry's (written explicitly here, so the test does not depend on the clock), then `n`
     * is published normally.
     */
    async function recreateWithinTheSameMillisecond(key: string, n: number) {
      const [[lastId]] = (await entries(redis, key)) as [[string, string[]]]
      const lastMs = lastId.split('-')[0]!
      await redis.cli('DEL', key)
      const peerEvent = { type: 'test', runId: 'run-1', data: { n }, id: `peer-${n}`, createdAt: new Date().toISOString(), deliveryAttempt: 1 }
      expect(await redis.cli('XADD', key, `${lastMs}-0`, 'event', JSON.stringify(peerEvent))).toBe(`${lastMs}-0`)
    }

    it('after the stream is deleted and re-created within the same millisecond, a group subscriber still gets the first entries of the new stream', async () => {
      const prefix = uniquePrefix('recreated-group')
      const key = `${prefix}:jobs`
      const pubsub = open({ keyPrefix: prefix })
      const grouped = new Inbox()
      await pubsub.subscribe('jobs', grouped.cb, { group: 'g' })
      await pubsub.publish('jobs', ev(1))
      await grouped.count(1)
      await recreateWithinTheSameMillisecond(key, 2)
      await sleep(300)
      await pubsub.publish('jobs', ev(3))
      await grouped.until((events) => events.some((e) => numberOf(e) === 3), 5_000, 'event 3 in the group')
      await sleep(200)
      expect(grouped.numbers).toEqual([1, 2, 3])
      expect(await pendingCount(redis, key, 'g')).toBe(0)
    })

    // Known limitation: a fan-out reader resumes after the last id it read (as Mastra's own
    // backend does), and XREAD says nothing about which stream it read, so a stream deleted
    // and re-created by another process within that same millisecond loses the new stream's
    // first entries for fan-out subscribers. Detecting it would cost a command per read (see
    // docs/streams.md). Expected to fail: it passes, and so flags, once the limit is lifted.
    it.fails('after the stream is deleted and re-created within the same millisecond, the first entries of the new stream still reach fan-out subscribers', async () => {
      const prefix = uniquePrefix('recreated')
      const key = `${prefix}:news`
      const pubsub = open({ keyPrefix: prefix })
      const fanned = new Inbox()
      await pubsub.subscribe('news', fanned.cb)
      await pubsub.publish('news', ev(1))
      await fanned.count(1)
      await recreateWithinTheSameMillisecond(key, 2)
      await sleep(300)
      await pubsub.publish('news', ev(3))
      await fanned.until((events) => events.some((e) => numberOf(e) === 3), 2_000, 'event 3 fanned out')
      await sleep(200)
      expect(fanned.numbers).toEqual([1, 2, 3])
    })
  })

  describe('clearTopic, unsubscribe, flush', () => {
    it('clearTopic deletes the stream and its groups, and subscribers carry on with what is published next', async () => {
      const prefix = uniquePrefix('clear')
      const key = `${prefix}:run.42`
      const pubsub = open({ keyPrefix: prefix })
      const grouped = new Inbox()
      const fanned = new Inbox()
      await pubsub.subscribe('run.42', grouped.cb, { group: 'g' })
      await pubsub.subscribe('run.42', fanned.cb)
      await publishRange(pubsub, 'run.42', 1, 3)
      await grouped.count(3)
      await fanned.count(3)
      expect(await redis.cli('EXISTS', key)).toBe(1)

      await pubsub.clearTopic('run.42')
      // The stream is gone, or at most re-created empty by a reader's group recovery.
      expect(await redis.cli('XLEN', key)).toBe(0)

      await pubsub.publish('run.42', ev(4))
      await grouped.count(4, 8_000)
      await fanned.count(4, 8_000)
      await sleep(300)
      expect(grouped.numbers).toEqual([1, 2, 3, 4])
      expect(fanned.numbers).toEqual([1, 2, 3, 4])
    })

    it('clearTopic of a topic that never existed resolves', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('clear-missing') })
      await expect(pubsub.clearTopic('never-published')).resolves.toBeUndefined()
    })

    it.skipIf(EXTERNAL_REDIS)('clearTopic never rejects: not while Redis is frozen, not when it is unreachable, not after close', async () => {
      const server = await ownServer()
      const frozen = open({ url: server.url, keyPrefix: uniquePrefix('clear-frozen'), commandTimeoutMs: 300 })
      await frozen.publish('t', ev(1))
      server.freeze()
      try {
        const r = await settleWithin(frozen.clearTopic('t'), 2_000)
        expect(r.status).toBe('fulfilled')
      } finally {
        server.thaw()
      }
      const unreachable = open({ url: `redis://127.0.0.1:${await freePort()}`, connectTimeoutMs: 200, commandTimeoutMs: 300 })
      expect((await settleWithin(unreachable.clearTopic('t'), 2_000)).status).toBe('fulfilled')
      await unreachable.close()
      expect((await settleWithin(unreachable.clearTopic('t'), 2_000)).status).toBe('fulfilled')
    })

    it('unsubscribe stops delivery to that callback only; the other callback of the topic keeps receiving', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('unsubscribe') })
      const leaving = new Inbox()
      const staying = new Inbox()
      await pubsub.subscribe('news', leaving.cb)
      await pubsub.subscribe('news', staying.cb)
      await pubsub.publish('news', ev(1))
      await leaving.count(1)
      await staying.count(1)
      await pubsub.unsubscribe('news', leaving.cb)
      await publishRange(pubsub, 'news', 2, 3)
      await staying.count(3)
      await sleep(500)
      expect(leaving.numbers).toEqual([1])
      expect(staying.numbers).toEqual([1, 2, 3])
    })

    it('after a group member unsubscribes, what is published next goes to the remaining member, none to the one that left', async () => {
      // The departing member's blocking read may still be open on the server when
      // unsubscribe() resolves; an entry it takes then sits in its pending list until some
      // reclaim pass (reclaimIdleMs, 60 s by default). A few rounds, each with fresh members.
      for (let round = 1; round <= 10; round++) {
        const prefix = uniquePrefix(`unsubscribe-group-${round}`)
        const a = open({ keyPrefix: prefix })
        const b = open({ keyPrefix: prefix })
        const leaving = new Inbox()
        const staying = new Inbox()
        await a.subscribe('work', leaving.cb, { group: 'g' })
        await b.subscribe('work', staying.cb, { group: 'g' })
        await a.unsubscribe('work', leaving.cb)
        await publishRange(a, 'work', 1, 5)
        await staying.until((events) => events.length >= 5, 2_000, `round ${round}: all 5 events at the remaining member`)
        expect(leaving.events).toEqual([])
        expect(staying.numbers).toEqual(range(1, 5))
        // Once the remaining member's acks land, nothing is pending for anyone.
        let pending = await pendingCount(redis, `${prefix}:work`, 'g')
        for (let i = 0; i < 50 && pending > 0; i++) {
          await sleep(10)
          pending = await pendingCount(redis, `${prefix}:work`, 'g')
        }
        expect(pending).toBe(0)
      }
    })

    it('unsubscribe of a callback that was never subscribed resolves and changes nothing', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('unsubscribe-unknown') })
      const inbox = new Inbox()
      await pubsub.subscribe('news', inbox.cb)
      await expect(pubsub.unsubscribe('news', () => {})).resolves.toBeUndefined()
      await expect(pubsub.unsubscribe('other', inbox.cb)).resolves.toBeUndefined()
      await pubsub.publish('news', ev(1))
      await inbox.count(1)
    })

    it('subscribing the same callback twice to a topic delivers each event once, and one unsubscribe stops it (as Mastra’s own pubsubs do)', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('subscribe-twice') })
      const inbox = new Inbox()
      await pubsub.subscribe('news', inbox.cb)
      await pubsub.subscribe('news', inbox.cb)
      await pubsub.publish('news', ev(1))
      await inbox.count(1)
      await sleep(300)
      expect(inbox.numbers).toEqual([1])
      await pubsub.unsubscribe('news', inbox.cb)
      await pubsub.publish('news', ev(2))
      await sleep(500)
      expect(inbox.numbers).toEqual([1])
    })

    it('flush resolves only once every publish made before it (in the same turn) is written to the stream', async () => {
      // Mastra's PullTransport.stop() publishes, then awaits flush() before the process may
      // close: nothing published before flush may still be on its way. The race this checks
      // is narrow (about 1 round in 100 loses it when it exists), so it runs many cheap rounds.
      const prefix = uniquePrefix('flush')
      const pubsub = open({ keyPrefix: prefix, maxStreamLength: 0 })
      const ROUNDS = 3_000
      const PER_ROUND = 50
      let written = 0
      for (let round = 1; round <= ROUNDS; round++) {
        const publishes = range(1, PER_ROUND).map((n) => pubsub.publish('bulk', ev(n)))
        await pubsub.flush()
        written = Number(await redis.cli('XLEN', `${prefix}:bulk`))
        expect(written, `round ${round}: flush resolved with ${round * PER_ROUND - written} publish(es) not yet written`).toBe(round * PER_ROUND)
        await Promise.all(publishes)
      }
    })

    it('flush with nothing in flight resolves at once', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('flush-idle') })
      const r = await settleWithin(pubsub.flush(), 1_000)
      expect(r.status).toBe('fulfilled')
      expect(r.elapsed).toBeLessThan(200)
    })
  })

  describe('close', () => {
    it('is idempotent; afterwards publish, subscribe and the lease methods reject with ERR_LEASE_CLOSED and nothing more is delivered', async () => {
      const prefix = uniquePrefix('close')
      const pubsub = open({ keyPrefix: prefix })
      const peer = open({ keyPrefix: prefix })
      const inbox = new Inbox()
      await pubsub.subscribe('news', inbox.cb)
      await pubsub.publish('news', ev(1))
      await inbox.count(1)

      await expect(pubsub.close()).resolves.toBeUndefined()
      await expect(pubsub.close()).resolves.toBeUndefined()
      await Promise.all([pubsub.close(), pubsub.close()])

      await peer.publish('news', ev(2))
      await sleep(500)
      expect(inbox.numbers).toEqual([1])

      const closed: Array<[string, () => Promise<unknown>]> = [
        ['publish', () => pubsub.publish('news', ev(3))],
        ['subscribe', () => pubsub.subscribe('news', () => {})],
        ['acquireLease', () => pubsub.acquireLease('k', 'o', 1_000)],
        ['getLeaseOwner', () => pubsub.getLeaseOwner('k')],
        ['releaseLease', () => pubsub.releaseLease('k', 'o')],
        ['renewLease', () => pubsub.renewLease('k', 'o', 1_000)],
        ['transferLease', () => pubsub.transferLease('k', 'o', 'p', 1_000)],
      ]
      for (const [name, call] of closed) {
        const error = await call().then(
          () => undefined,
          (err: unknown) => err,
        )
        expect(errorCode(error), name).toBe('ERR_LEASE_CLOSED')
      }
      // The stream got only what the open instances wrote.
      expect(await redis.cli('XLEN', `${prefix}:news`)).toBe(2)
    })

    it('drains: publishes made just before close() (in the same turn) are written, not rejected', async () => {
      // Mastra publishes fire-and-forget (run-completed, signal-enqueued, ...) and may close
      // right after. The tasks race, so this runs a few rounds, each with a fresh instance.
      for (let round = 1; round <= 30; round++) {
        const prefix = uniquePrefix(`close-drain-${round}`)
        const pubsub = new RedisStreamsPubSub({ url: redis.url, keyPrefix: prefix })
        if (round % 2 === 0) await pubsub.publish('warm', ev(0)) // half of them on a warm connection
        const publishes = range(1, 20).map((n) => pubsub.publish('drain', ev(n)))
        await pubsub.close()
        const outcomes = await Promise.allSettled(publishes)
        const rejected = outcomes.flatMap((o) => (o.status === 'rejected' ? [errorCode(o.reason)] : []))
        expect(rejected, `round ${round}: publishes made before close() were rejected`).toEqual([])
        expect(await redis.cli('XLEN', `${prefix}:drain`)).toBe(20)
      }
    })

    it.skipIf(EXTERNAL_REDIS)('settles within about commandTimeoutMs while the server is frozen (SIGSTOP), with subscriptions and a publish in flight', async () => {
      const server = await ownServer()
      const COMMAND_TIMEOUT_MS = 500
      const prefix = uniquePrefix('close-outage')
      const pubsub = open({ url: server.url, keyPrefix: prefix, commandTimeoutMs: COMMAND_TIMEOUT_MS, connectTimeoutMs: 300, blockMs: 200 })
      const inbox = new Inbox()
      await pubsub.subscribe('news', inbox.cb)
      await pubsub.subscribe('jobs', inbox.cb, { group: 'g' })
      await pubsub.acquireLease('thread', 'run', 10_000)
      await pubsub.publish('news', ev(1))
      await inbox.count(1)

      server.freeze()
      try {
        const inFlight = pubsub.publish('news', ev(2))
        inFlight.catch(() => {})
        const started = performance.now()
        const r = await settleWithin(pubsub.close(), COMMAND_TIMEOUT_MS * 2 + 1_500)
        expect(r.status).toBe('fulfilled')
        expect(performance.now() - started).toBeLessThan(COMMAND_TIMEOUT_MS * 2 + 500)
        // The publish in flight settled too, as a coded failure (never silently dropped).
        const outcome = await settleWithin(inFlight, COMMAND_TIMEOUT_MS * 2)
        expect(outcome.status).toBe('rejected')
        if (outcome.status === 'rejected') expect(errorCode(outcome.reason)).toMatch(/^ERR_LEASE_(TIMEOUT|CONNECTION|CLOSED)$/)
      } finally {
        server.thaw()
      }
    })

    it.skipIf(EXTERNAL_REDIS)('settles quickly when the server is gone (killed)', async () => {
      const server = await ownServer()
      const pubsub = open({ url: server.url, keyPrefix: uniquePrefix('close-killed'), commandTimeoutMs: 500, connectTimeoutMs: 300, blockMs: 200 })
      const inbox = new Inbox()
      await pubsub.subscribe('news', inbox.cb, { group: 'g' })
      await server.kill()
      const r = await settleWithin(pubsub.close(), 2_000)
      expect(r.status).toBe('fulfilled')
    })
  })

  describe('an outage', () => {
    it.skipIf(EXTERNAL_REDIS)('a publish while the server is frozen rejects with ERR_LEASE_TIMEOUT within about commandTimeoutMs, and publishing works again after', async () => {
      const server = await ownServer()
      const prefix = uniquePrefix('outage-frozen')
      const pubsub = open({ url: server.url, keyPrefix: prefix, commandTimeoutMs: 400, connectTimeoutMs: 300, blockMs: 200 })
      const inbox = new Inbox()
      await pubsub.subscribe('news', inbox.cb, { group: 'g' })
      await pubsub.publish('news', ev(1))
      await inbox.count(1)

      server.freeze()
      let outcome
      try {
        outcome = await settleWithin(pubsub.publish('news', ev(2)), 2_000)
      } finally {
        server.thaw()
      }
      expect(outcome.status).toBe('rejected')
      if (outcome.status === 'rejected') {
        expect(outcome.reason).toBeInstanceOf(Error)
        expect(errorCode(outcome.reason)).toBe('ERR_LEASE_TIMEOUT')
      }
      expect(outcome.elapsed).toBeLessThan(400 + 600)

      // Back: publishing works and the subscriber receives again.
      const deadline = Date.now() + 5_000
      for (;;) {
        try {
          await pubsub.publish('news', ev(3))
          break
        } catch (err) {
          if (Date.now() > deadline) throw err
          await sleep(100)
        }
      }
      await inbox.until((events) => events.some((e) => numberOf(e) === 3), 8_000, 'event 3 after the thaw')
    })

    it.skipIf(EXTERNAL_REDIS)('a publish while the server is down rejects with ERR_LEASE_CONNECTION or ERR_LEASE_TIMEOUT; after a restart readers reconnect and delivery resumes', async () => {
      const server = await ownServer()
      const logger = recordingLogger()
      const prefix = uniquePrefix('outage-down')
      const pubsub = open({ url: server.url, keyPrefix: prefix, commandTimeoutMs: 400, connectTimeoutMs: 300, blockMs: 200, logger })
      const grouped = new Inbox()
      const fanned = new Inbox()
      await pubsub.subscribe('news', grouped.cb, { group: 'g' })
      await pubsub.subscribe('news', fanned.cb)
      await pubsub.publish('news', ev(1))
      await grouped.count(1)
      await fanned.count(1)
      // The ack of event 1 has landed (no ack in flight when the server dies).
      for (let i = 0; i < 50 && (await pendingCount(server, `${prefix}:news`, 'g')) > 0; i++) await sleep(20)

      await server.kill()
      const outcome = await settleWithin(pubsub.publish('news', ev(2)), 3_000)
      expect(outcome.status).toBe('rejected')
      if (outcome.status === 'rejected') expect(errorCode(outcome.reason)).toMatch(/^ERR_LEASE_(CONNECTION|TIMEOUT)$/)
      await sleep(1_500) // readers keep failing meanwhile

      // Connection trouble reaches the logger at warn at most once per reader per interval
      // (two readers here), the rest at debug.
      const warned = logger.warnings()
      expect(warned.length, JSON.stringify(logger.lines)).toBeGreaterThan(0)
      expect(warned.length, JSON.stringify(warned)).toBeLessThanOrEqual(2)

      await server.restart() // empty: no persistence
      const deadline = Date.now() + 5_000
      for (;;) {
        try {
          await pubsub.publish('news', ev(3))
          break
        } catch (err) {
          if (Date.now() > deadline) throw err
          await sleep(100)
        }
      }
      await grouped.until((events) => events.some((e) => numberOf(e) === 3), 8_000, 'event 3 in the group after the restart')
      await fanned.until((events) => events.some((e) => numberOf(e) === 3), 8_000, 'event 3 fanned out after the restart')
    })

    it('subscribe to an unreachable server rejects with a coded error instead of subscribing deaf', async () => {
      const pubsub = open({ url: `redis://127.0.0.1:${await freePort()}`, connectTimeoutMs: 200, commandTimeoutMs: 300 })
      const r = await settleWithin(pubsub.subscribe('news', () => {}, { group: 'g' }), 3_000)
      expect(r.status).toBe('rejected')
      if (r.status === 'rejected') expect(errorCode(r.reason)).toMatch(/^ERR_LEASE_(CONNECTION|TIMEOUT)$/)
      const p = await settleWithin(pubsub.publish('news', ev(1)), 3_000)
      expect(p.status).toBe('rejected')
      if (p.status === 'rejected') expect(errorCode(p.reason)).toMatch(/^ERR_LEASE_(CONNECTION|TIMEOUT)$/)
    })
  })

  describe('localOnly', () => {
    it("hands this process's subscribers the event with its live values (same data object), writes nothing, and another instance gets nothing", async () => {
      const prefix = uniquePrefix('local')
      const pubsub = open({ keyPrefix: prefix })
      const other = open({ keyPrefix: prefix })
      const local = new Inbox()
      const remote = new Inbox()
      await pubsub.subscribe('run.local', local.cb)
      await other.subscribe('run.local', remote.cb)

      const controller = new AbortController()
      const data = { n: 1, signal: controller.signal, callback: () => 'live', big: 10n }
      const published: Publishable = { type: 'step', runId: 'run-local', data }
      await pubsub.publish('run.local', published, { localOnly: true })
      const [event] = await local.count(1)
      expect(event!.data).toBe(data) // the very object: functions, AbortSignals and BigInts survive
      expect((event!.data as typeof data).callback()).toBe('live')
      expect(event).toMatchObject({ type: 'step', runId: 'run-local', deliveryAttempt: 1 })
      expect(event!.id).toMatch(UUID)
      expect(event!.createdAt).toBeInstanceOf(Date)

      await sleep(500)
      expect(remote.events).toEqual([])
      expect(await redis.cli('EXISTS', `${prefix}:run.local`)).toBe(0)
    })

    it('goes to one member of a group, not to every member, and to every fan-out subscriber', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('local-group') })
      const first = new Inbox()
      const second = new Inbox()
      const fanned = new Inbox()
      await pubsub.subscribe('workflows', first.cb, { group: 'orchestration' })
      await pubsub.subscribe('workflows', second.cb, { group: 'orchestration' })
      await pubsub.subscribe('workflows', fanned.cb)
      for (let n = 1; n <= 4; n++) await pubsub.publish('workflows', ev(n), { localOnly: true })
      await fanned.count(4)
      await sleep(200)
      expect([...first.numbers, ...second.numbers].sort()).toEqual([1, 2, 3, 4])
      expect(fanned.numbers).toEqual([1, 2, 3, 4])
    })

    it('a nacked localOnly event is redelivered in this process with deliveryAttempt + 1 and the same live data, and after maxDeliveryAttempts dropped with the warning (as Mastra’s in-process pubsubs redeliver)', async () => {
      const prefix = uniquePrefix('local-nack')
      const logger = recordingLogger()
      const pubsub = open({ keyPrefix: prefix, maxDeliveryAttempts: 3, logger })
      const fanned = new Inbox((_event, _ack, nack) => nack())
      const grouped = new Inbox(() => {
        throw new Error('handler failed') // a throw counts as a nack
      })
      const flaky = new Inbox(async (event, ack, nack) => ((event.deliveryAttempt ?? 1) < 2 ? nack() : ack()))
      await pubsub.subscribe('local', fanned.cb)
      await pubsub.subscribe('local', grouped.cb, { group: 'g' })
      await pubsub.subscribe('flaky', flaky.cb)
      const data = { n: 1, callback: () => 'live' }
      await pubsub.publish('local', { type: 'test', runId: 'run-1', data }, { localOnly: true })
      await pubsub.publish('flaky', ev(2), { localOnly: true })
      await fanned.count(3)
      await grouped.count(3)
      await flaky.count(2)
      await pubsub.flush()
      await sleep(300) // no fourth attempt, and no third for the one acked on its second
      for (const inbox of [fanned, grouped]) {
        expect(inbox.events.map((e) => e.deliveryAttempt)).toEqual([1, 2, 3])
        expect(new Set(inbox.events.map((e) => e.id)).size).toBe(1)
        for (const event of inbox.events) expect(event.data).toBe(data) // never serialised
      }
      expect(flaky.events.map((e) => e.deliveryAttempt)).toEqual([1, 2])
      const dropped = logger.warnings().filter((l) => /max delivery attempts/i.test(l.message))
      expect(dropped, JSON.stringify(logger.lines)).toHaveLength(2)
      for (const line of dropped) expect(line.fields).toMatchObject({ topic: 'local', eventId: fanned.events[0]!.id, attempt: 3, max: 3 })
      expect(await redis.cli('XLEN', `${prefix}:local`)).toBe(0) // still never written (the group made the stream)
    })

    it('reaches no subscriber of another topic and no unsubscribed callback', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('local-scope') })
      const elsewhere = new Inbox()
      const gone = new Inbox()
      await pubsub.subscribe('other', elsewhere.cb)
      await pubsub.subscribe('mine', gone.cb)
      await pubsub.unsubscribe('mine', gone.cb)
      await pubsub.publish('mine', ev(1), { localOnly: true })
      await sleep(200)
      expect(elsewhere.events).toEqual([])
      expect(gone.events).toEqual([])
    })
  })

  describe('trimming and expiry', () => {
    it('trims each stream to about maxStreamLength entries, and keeps everything with maxStreamLength 0', async () => {
      const prefix = uniquePrefix('maxlen')
      const trimmed = open({ keyPrefix: prefix, maxStreamLength: 50 })
      const untrimmed = open({ keyPrefix: prefix, maxStreamLength: 0 })
      // In chunks of 50, so the order of the writes is the order of the calls (see the test
      // on call order for bigger batches).
      for (let from = 1; from <= 600; from += 50) {
        await Promise.all(range(from, from + 49).map((n) => trimmed.publish('capped', ev(n))))
        await Promise.all(range(from, from + 49).map((n) => untrimmed.publish('uncapped', ev(n))))
      }
      // Trimming runs beside the publishes, a round per so many of them, to within a tenth.
      for (let i = 0; i < 100 && Number(await redis.cli('XLEN', `${prefix}:capped`)) > 55; i++) await sleep(20)
      const capped = Number(await redis.cli('XLEN', `${prefix}:capped`))
      expect(capped).toBeGreaterThanOrEqual(50)
      expect(capped).toBeLessThanOrEqual(55)
      expect(await redis.cli('XLEN', `${prefix}:uncapped`)).toBe(600)
      // What is kept is the newest: the oldest events are gone, the last one published is there.
      const kept = (await entries(redis, `${prefix}:capped`)).map(([, fields]) => (JSON.parse(fields[1]!) as { data: { n: number } }).data.n)
      expect(kept[0]).toBeGreaterThan(1)
      expect(kept[kept.length - 1]).toBe(600)
    })

    it.skipIf(EXTERNAL_REDIS)('a consumer killed holding 30 entries loses none of them to trimming: 300 publishes later, a sibling reclaims all 30', async () => {
      const prefix = uniquePrefix('trim-dead')
      const key = `${prefix}:jobs`
      const holder = holdingChild({ url: redis.url, keyPrefix: prefix, topic: 'jobs', group: 'workers' })
      await holder.line('ready', 10_000)
      const publisher = open({ keyPrefix: prefix, maxStreamLength: 50 })
      for (let n = 1; n <= 30; n++) await publisher.publish('jobs', ev(n))
      await holder.events(30, 5_000)
      await holder.kill()
      expect(await pendingCount(redis, key, 'workers')).toBe(30)
      for (let from = 31; from <= 330; from += 50) {
        await Promise.all(range(from, Math.min(from + 49, 330)).map((n) => publisher.publish('jobs', ev(n))))
      }
      await sleep(200)
      const len = Number(await redis.cli('XLEN', key))
      expect(len, 'what the dead consumer holds and what nobody read yet').toBe(330)

      const survivor = open({ keyPrefix: prefix, maxStreamLength: 50, reclaimIdleMs: 300, reclaimIntervalMs: 100 })
      const inbox = new Inbox()
      await survivor.subscribe('jobs', inbox.cb, { group: 'workers' })
      await inbox.count(330, 10_000)
      expect([...inbox.numbers].sort((x, y) => x - y)).toEqual(range(1, 330))
      for (let i = 0; i < 50 && (await pendingCount(redis, key, 'workers')) > 0; i++) await sleep(20)
      expect(await pendingCount(redis, key, 'workers')).toBe(0)
      // Settled, it is trimmed at last, by the next publishes.
      for (let n = 331; n <= 340; n++) await publisher.publish('jobs', ev(n))
      await inbox.count(340)
      for (let i = 0; i < 100 && Number(await redis.cli('XLEN', key)) > 55; i++) await sleep(20)
      expect(Number(await redis.cli('XLEN', key))).toBeLessThanOrEqual(55)
    })

    it('a slow consumer holding 30 entries while 300 more are published settles every one of them: trimming waits for it', async () => {
      const prefix = uniquePrefix('trim-slow')
      const key = `${prefix}:jobs`
      const pubsub = open({ keyPrefix: prefix, maxStreamLength: 50, maxInFlight: 30 })
      const acks: Array<() => Promise<void>> = []
      const slow = new Inbox((_event, ack) => void acks.push(ack))
      await pubsub.subscribe('jobs', slow.cb, { group: 'workers' })
      for (let from = 1; from <= 330; from += 50) {
        await Promise.all(range(from, Math.min(from + 49, 330)).map((n) => pubsub.publish('jobs', ev(n))))
      }
      await slow.count(30)
      await sleep(200)
      expect(Number(await redis.cli('XLEN', key))).toBe(330)
      // It settles at last; the rest of the backlog follows and is acked as it comes.
      while (slow.events.length < 330 || acks.length > 0) {
        const ack = acks.shift()
        if (ack) await ack()
        else await sleep(10)
      }
      expect([...slow.numbers].sort((x, y) => x - y)).toEqual(range(1, 330))
      for (let i = 0; i < 50 && (await pendingCount(redis, key, 'workers')) > 0; i++) await sleep(20)
      expect(await pendingCount(redis, key, 'workers')).toBe(0)
    })

    it('past hardMaxStreamLength, trimming cuts unsettled entries after all and warns with how many were lost', async () => {
      const prefix = uniquePrefix('trim-hard')
      const key = `${prefix}:jobs`
      const logger = recordingLogger()
      const pubsub = open({ keyPrefix: prefix, maxStreamLength: 20, hardMaxStreamLength: 100, logger })
      // A group nobody reads any more: everything published is undelivered to it.
      await redis.cli('XGROUP', 'CREATE', key, 'abandoned', '0', 'MKSTREAM')
      for (let from = 1; from <= 150; from += 50) {
        await Promise.all(range(from, from + 49).map((n) => pubsub.publish('jobs', ev(n))))
      }
      const lost = () =>
        logger
          .warnings()
          .filter((l) => /hardMaxStreamLength/.test(l.message))
          .reduce((sum, l) => sum + Number(l.fields?.lost), 0)
      for (let i = 0; i < 100 && lost() < 50; i++) await sleep(20)
      expect(lost()).toBe(50)
      expect(Number(await redis.cli('XLEN', key))).toBe(100)
      expect(logger.warnings().find((l) => /hardMaxStreamLength/.test(l.message))?.fields).toMatchObject({ topic: 'jobs', hardMaxStreamLength: 100 })
    })

    it('with streamIdleTtlMs, a stream expires once idle and each publish refreshes the expiry', async () => {
      const prefix = uniquePrefix('idle-ttl')
      const pubsub = open({ keyPrefix: prefix, streamIdleTtlMs: 600 })
      await pubsub.publish('short', ev(1))
      const ttl = Number(await redis.cli('PTTL', `${prefix}:short`))
      expect(ttl).toBeGreaterThan(0)
      expect(ttl).toBeLessThanOrEqual(600)
      await sleep(400)
      await pubsub.publish('short', ev(2))
      expect(Number(await redis.cli('PTTL', `${prefix}:short`))).toBeGreaterThan(400)
      await sleep(900)
      expect(await redis.cli('EXISTS', `${prefix}:short`)).toBe(0)

      const durable = open({ keyPrefix: prefix })
      await durable.publish('long', ev(1))
      expect(await redis.cli('PTTL', `${prefix}:long`)).toBe(-1)
    })
  })

  describe('leases on the same connection', () => {
    it("acquire / owner / renew / transfer / release work, stored at <keyPrefix>:lease:<key> as Mastra's backend stores them", async () => {
      const prefix = uniquePrefix('lease')
      const a = open({ keyPrefix: prefix })
      const b = open({ keyPrefix: prefix })
      const key = 'resource-1\0thread-1'
      const leaseKey = `${prefix}:lease:${key}`

      expect(await a.acquireLease(key, 'run-a', 10_000)).toEqual({ acquired: true, owner: 'run-a' })
      expect(await redis.cli('GET', leaseKey)).toBe('run-a')
      const ttl = Number(await redis.cli('PTTL', leaseKey))
      expect(ttl).toBeGreaterThan(9_000)
      expect(ttl).toBeLessThanOrEqual(10_000)

      expect(await b.acquireLease(key, 'run-b', 10_000)).toEqual({ acquired: false, owner: 'run-a' })
      expect(await b.getLeaseOwner(key)).toBe('run-a')
      expect(await b.renewLease(key, 'run-b', 10_000)).toBe(false)
      expect(await a.renewLease(key, 'run-a', 20_000)).toBe(true)
      expect(Number(await redis.cli('PTTL', leaseKey))).toBeGreaterThan(19_000)
      expect(await a.transferLease(key, 'run-a', 'run-a2', 10_000)).toBe(true)
      expect(await b.getLeaseOwner(key)).toBe('run-a2')
      expect(await a.transferLease(key, 'run-a', 'run-x', 10_000)).toBe(false)
      await b.releaseLease(key, 'run-a') // not the owner: a no-op
      expect(await a.getLeaseOwner(key)).toBe('run-a2')
      await a.releaseLease(key, 'run-a2')
      expect(await b.getLeaseOwner(key)).toBeUndefined()
      expect(await redis.cli('EXISTS', leaseKey)).toBe(0)

      // A lease written by someone else in that layout (Mastra's backend: SET NX PX) is seen.
      await redis.cli('SET', `${prefix}:lease:foreign`, 'their-run', 'PX', 10_000, 'NX')
      expect(await a.getLeaseOwner('foreign')).toBe('their-run')
      expect(await a.acquireLease('foreign', 'our-run', 1_000)).toEqual({ acquired: false, owner: 'their-run' })
    })

    it('getLeaseProvider() answers from the same store, and lease keys never collide with topic streams', async () => {
      const prefix = uniquePrefix('lease-provider')
      const pubsub = open({ keyPrefix: prefix })
      const provider: LeaseProvider = pubsub.getLeaseProvider()
      expect(await provider.acquireLease('k', 'owner-1', 5_000)).toEqual({ acquired: true, owner: 'owner-1' })
      expect(await pubsub.getLeaseOwner('k')).toBe('owner-1')
      // A topic named like a lease lives at <prefix>:<topic>, a lease at <prefix>:lease:<key>.
      await pubsub.publish('lease', ev(1))
      expect(await redis.cli('TYPE', `${prefix}:lease`)).toBe('stream')
      expect(await redis.cli('TYPE', `${prefix}:lease:k`)).toBe('string')
    })

    it('lease input errors are coded rejections, as for RedisLeaseProvider', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('lease-input'), maxTtlMs: 1_000 })
      const codes = await Promise.all([
        pubsub.acquireLease('', 'o', 100).catch(errorCode),
        pubsub.acquireLease('k', '', 100).catch(errorCode),
        pubsub.renewLease('k', 'o', 0).catch(errorCode),
        pubsub.acquireLease('k', 'o', 5_000).catch(errorCode),
      ])
      expect(codes).toEqual(['ERR_LEASE_INVALID_KEY', 'ERR_LEASE_INVALID_OWNER', 'ERR_LEASE_INVALID_TTL', 'ERR_LEASE_INVALID_TTL'])
    })
  })

  describe('with Mastra', () => {
    it('new Mastra({ pubsub: new RedisStreamsPubSub(...) }) type-checks without a cast, and Mastra sees a LeaseProvider through its proxy', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('mastra') })
      // Compile-time checks as much as runtime ones (tsc --noEmit -p . runs over __test__).
      const asPubSub: PubSub = pubsub
      const asLeaseProvider: LeaseProvider = pubsub
      const mastra = new Mastra({ pubsub, logger: false })
      expect(asPubSub).toBe(pubsub)
      expect(isLeaseProvider(asLeaseProvider)).toBe(true)
      expect(isLeaseProvider(mastra.pubsub)).toBe(true)
      const unwrap = Reflect.get(mastra.pubsub, 'getLeaseProvider') as () => LeaseProvider
      const provider = unwrap.call(mastra.pubsub)
      expect(isLeaseProvider(provider)).toBe(true)
      // Through the proxy, methods are bound to our object: a lease taken there is ours.
      expect(await mastra.pubsub.publish('via-proxy', ev(1))).toBeUndefined()
      expect(await provider.acquireLease('proxy\0thread', 'run', 5_000)).toEqual({ acquired: true, owner: 'run' })
      expect(await pubsub.getLeaseOwner('proxy\0thread')).toBe('run')
    })

    it("startWorkers() runs Mastra's OrchestrationWorker on it: a consumer group reads the workflows stream", async () => {
      const prefix = uniquePrefix('mastra-workers')
      const pubsub = open({ keyPrefix: prefix })
      const mastra = new Mastra({ pubsub, logger: false })
      await mastra.startWorkers()
      try {
        const groups = (await redis.cli('XINFO', 'GROUPS', `${prefix}:workflows`)) as RespValue[][]
        expect(groups.length).toBeGreaterThan(0)
        // The worker reads what lands on the stream: the group moves past an event written there.
        await pubsub.publish('workflows', { type: 'mastra-lease.test.noop', runId: 'no-such-run', data: {} })
        const [[entryId]] = (await entries(redis, `${prefix}:workflows`)) as [[string, string[]]]
        const atOrAfter = (id: string, than: string) => {
          const [a, b] = id.split('-').map(BigInt) as [bigint, bigint]
          const [c, d] = than.split('-').map(BigInt) as [bigint, bigint]
          return a > c || (a === c && b >= d)
        }
        let delivered = '0-0'
        for (let i = 0; i < 100 && !atOrAfter(delivered, entryId); i++) {
          const [group] = (await redis.cli('XINFO', 'GROUPS', `${prefix}:workflows`)) as RespValue[][]
          delivered = String(group![group!.indexOf('last-delivered-id') + 1])
          if (!atOrAfter(delivered, entryId)) await sleep(20)
        }
        expect(atOrAfter(delivered, entryId), `last-delivered-id ${delivered}, event ${entryId}`).toBe(true)
      } finally {
        await mastra.stopWorkers()
      }
    })
  })

  describe('a process using it', () => {
    /** Runs the fixture without IPC; resolves with its exit code and output, or kills it after `ms`. */
    function runChild(mode: 'close' | 'no-close', ms: number, prefix: string) {
      const config = { mode, url: redis.url, keyPrefix: prefix, topic: 'child', group: 'child-group' }
      const child = spawn(NODE, [FIXTURE, JSON.stringify(config)], { stdio: ['ignore', 'pipe', 'pipe'] })
      children.add(child)
      let out = ''
      let err = ''
      child.stdout.on('data', (d: Buffer) => (out += d.toString()))
      child.stderr.on('data', (d: Buffer) => (err += d.toString()))
      return new Promise<{ exited: boolean; code: number | null; out: string; err: string }>((resolve) => {
        const timer = setTimeout(() => {
          child.kill('SIGKILL')
        }, ms)
        child.once('exit', (code, signal) => {
          clearTimeout(timer)
          children.delete(child)
          resolve({ exited: signal === null, code, out, err })
        })
      })
    }

    it('exits by itself after close(), with subscriptions (group and fan-out) and a lease taken before', async () => {
      const prefix = uniquePrefix('child-exit')
      const started = Date.now()
      const r = await runChild('close', 10_000, prefix)
      expect(r.exited, `the child was still running after 10 s (a handle left open); stderr: ${r.err}`).toBe(true)
      expect(r.code, r.err).toBe(0)
      expect(JSON.parse(r.out.trim())).toEqual({
        type: 'done',
        grouped: { n: 1 },
        fanned: { n: 1 },
        lease: { acquired: true, owner: 'child-run' },
      })
      expect(Date.now() - started).toBeLessThan(10_000)
      expect(await redis.cli('GET', `${prefix}:lease:child\0thread`)).toBe('child-run')
    })

    it('without close(), a live subscription keeps the process running (the control for the test above)', async () => {
      const r = await runChild('no-close', 2_500, uniquePrefix('child-alive'))
      expect(r.out, r.err).toContain('"type":"done"')
      expect(r.exited, 'the child exited although it still had live subscriptions').toBe(false)
    })
  })
})

