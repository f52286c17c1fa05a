// RedisStreamsPubSub: construction, publishing and stamping, fan-out and competing consumers,
// where a subscription starts, acks in bulk, and maxInFlight.
//
// Layout (the one Mastra's own Redis Streams backend uses): a topic is the stream
// `<keyPrefix>:<topic>` whose entries carry one field, `event`, holding the event as JSON;
// a lease is the string `<keyPrefix>:lease:<key>` holding the owner, with a PX expiry.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { isLeaseProvider, PubSub } from '@mastra/core/events'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub, type RedisStreamsPubSubOptions } from '../dist/esm/index.js'
import { startFaultProxy } from './helpers/fault-proxy.js'
import { expectThrow } from './helpers/lease.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer, type RespValue } from './helpers/redis-server.js'
import { ev, Inbox, recordingLogger, sleep, uniquePrefix } from './helpers/streams.js'
import { entries, pendingCount, publishRange, range, streamsSuite, UUID } from './helpers/streams-suite.js'

let redis: RedisServer
beforeAll(async () => {
  redis = await startRedis()
})
afterAll(async () => {
  await redis?.stop()
})
const { open } = streamsSuite(() => redis)

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

    it('rejects a logger without warn, and options that are not an object, like every other option', async () => {
      expectThrow(() => new RedisStreamsPubSub({ url: redis.url, logger: 'loud' } as unknown as RedisStreamsPubSubOptions), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(() => new RedisStreamsPubSub({ url: redis.url, logger: {} } as unknown as RedisStreamsPubSubOptions), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(() => new RedisStreamsPubSub(5 as unknown as RedisStreamsPubSubOptions), TypeError, 'ERR_LEASE_INVALID_OPTION')
      // null means "all defaults", as for RedisLeaseProvider (nothing connects in the constructor).
      const defaults = new RedisStreamsPubSub(null as unknown as RedisStreamsPubSubOptions)
      await defaults.close()
    })

    it('accepts 0 and Infinity as unlimited delivery attempts and events in flight, and 0 to turn off trimming and reclaiming', () => {
      const logger = recordingLogger()
      for (const options of [{ maxDeliveryAttempts: 0 }, { maxDeliveryAttempts: Infinity }, { maxInFlight: 0 }, { maxInFlight: Infinity }, { maxStreamLength: 0 }, { reclaimIntervalMs: 0 }, { streamIdleTtlMs: 0 }]) {
        expect(() => open({ ...options, logger }), JSON.stringify(options)).not.toThrow()
      }
      // 0 delivery attempts is the one that says how it is taken (as Infinity, for back-compat).
      expect(logger.warnings().map((l) => l.fields?.code)).toEqual(['MASTRA_LEASE_ZERO_DELIVERY_ATTEMPTS'])
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

    it('always assigns its own id and createdAt, and deliveryAttempt 1 to an event without one', async () => {
      const prefix = uniquePrefix('stamp')
      const pubsub = open({ keyPrefix: prefix })
      const inbox = new Inbox()
      await pubsub.subscribe('stamp', inbox.cb)
      const forged = { ...ev(1), id: 'forged', createdAt: new Date(0) } as unknown as Parameters<typeof pubsub.publish>[1]
      await pubsub.publish('stamp', forged)
      const events = await inbox.count(1)
      expect(events[0]!.id).not.toBe('forged')
      expect(events[0]!.createdAt.getTime()).toBeGreaterThan(0)
      expect(events.map((e) => e.deliveryAttempt)).toEqual([1])
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
    it('rejects an event JSON cannot write (a BigInt, a cycle, a throwing toJSON, a Proxy whose trap throws) with a coded TypeError naming the problem (cause: what was thrown), and writes nothing', async () => {
      const prefix = uniquePrefix('not-json')
      const pubsub = open({ keyPrefix: prefix })
      const cycle: Record<string, unknown> = { type: 'x', runId: 'r' }
      cycle.data = cycle
      const thrown = new Error('no JSON today')
      const trap = new Proxy({ type: 'x', runId: 'r', data: {} }, { ownKeys: () => { throw thrown } })
      const bad: Array<[unknown, RegExp]> = [
        [{ type: 'x', runId: 'r', data: { n: 1n } }, /BigInt/],
        [cycle, /circular/],
        [{ type: 'x', runId: 'r', data: { toJSON: () => { throw thrown } } }, /no JSON today/],
        [trap, /no JSON today/],
        [new Proxy({ type: 'x', runId: 'r', data: {} }, { get: () => { throw thrown } }), /no JSON today/],
        [{ type: 'x', runId: 'r', data: { toJSON: () => { throw Object.assign(new Error('coded inside'), { code: 'EINSIDE' }) } } }, /coded inside/],
      ]
      // A localOnly event is never written (live values survive): only the Proxy fails it.
      const cases = [...bad.map(([event, problem]) => [event, problem, undefined] as const), [trap, /no JSON today/, { localOnly: true }] as const]
      for (const [event, problem, options] of cases) {
        const err = await pubsub.publish('bad', event as never, options).then(
          () => undefined,
          (e: unknown) => e as Error & { code?: string; cause?: unknown },
        )
        expect(err, String(problem)).toBeInstanceOf(TypeError)
        expect(err!.code).toBe('ERR_STREAMS_INVALID_ARGUMENT')
        expect(err!.message).toMatch(/^event /)
        expect(err!.message).toMatch(problem)
        expect(err!.cause).toBeInstanceOf(Error)
      }
      expect(await redis.cli('EXISTS', `${prefix}:bad`)).toBe(0)
    })

    it('refuses options other than a boolean localOnly (a misspelt localonly must not write to Redis), and options whose reading throws, with a coded error, and writes nothing', async () => {
      const prefix = uniquePrefix('bad-publish-options')
      const pubsub = open({ keyPrefix: prefix })
      const local = new Inbox()
      await pubsub.subscribe('bad', local.cb)
      const thrown = new Error('no options today')
      const bad: Array<[unknown, RegExp, unknown?]> = [
        [{ localonly: true }, /unknown publish option "localonly"/],
        [{ localOnly: true, ttl: 5 }, /unknown publish option "ttl"/],
        [{ localOnly: 'yes' }, /localOnly must be a boolean/],
        [{ localOnly: 1 }, /localOnly must be a boolean/],
        ['localOnly', /must be an object/],
        [[true], /must be an object/],
        [new Proxy({ localOnly: true }, { ownKeys: () => { throw thrown } }), /no options today/, thrown],
        [new Proxy({ localOnly: true }, { get: () => { throw thrown } }), /no options today/, thrown],
      ]
      for (const [options, problem, cause] of bad) {
        const err = await pubsub.publish('bad', ev(1), options as never).then(
          () => undefined,
          (e: unknown) => e as Error & { code?: string; cause?: unknown },
        )
        expect(err, String(problem)).toBeInstanceOf(TypeError)
        expect(err!.code).toBe('ERR_STREAMS_INVALID_ARGUMENT')
        expect(err!.message).toMatch(problem)
        expect(err!.cause).toBe(cause)
      }
      await pubsub.publish('bad', ev(2), { localOnly: undefined })
      await pubsub.publish('bad', ev(3), { localOnly: false })
      await pubsub.publish('bad', ev(4), null as never)
      await local.count(3)
      expect(local.numbers).toEqual([2, 3, 4])
      expect(await redis.cli('XLEN', `${prefix}:bad`)).toBe(3)
    })

    it("rejects a deliveryAttempt that is not a whole number of at least 1 ('x', -1, 0, NaN, 1.5, 2^60) with a coded error, and writes nothing", async () => {
      const prefix = uniquePrefix('bad-attempt')
      const pubsub = open({ keyPrefix: prefix })
      const bad: Array<[unknown, typeof TypeError | typeof RangeError]> = [
        ['x', TypeError],
        [null, TypeError],
        [-1, RangeError],
        [0, RangeError],
        [Number.NaN, RangeError],
        [1.5, RangeError],
        [2 ** 60, RangeError],
      ]
      for (const [deliveryAttempt, cls] of bad) {
        for (const options of [undefined, { localOnly: true }]) {
          const err = await pubsub.publish('bad', { ...ev(1), deliveryAttempt } as never, options).then(
            () => undefined,
            (e: unknown) => e as Error & { code?: string },
          )
          expect(err, String(deliveryAttempt)).toBeInstanceOf(cls)
          expect(err!.code).toBe('ERR_STREAMS_INVALID_ARGUMENT')
          expect(err!.message).toContain('deliveryAttempt')
        }
      }
      expect(await redis.cli('EXISTS', `${prefix}:bad`)).toBe(0)
      await pubsub.publish('good', { ...ev(1), deliveryAttempt: 3 } as never)
      const [, fields] = (await entries(redis, `${prefix}:good`))[0]!
      expect(JSON.parse(fields[1]!)).toMatchObject({ deliveryAttempt: 3 })
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

    it('a fan-out subscriber at maxInFlight whose callbacks ack and never return gets every event: each ack gives its place back', async () => {
      const prefix = uniquePrefix('in-flight-fanout')
      const never = new Promise<void>(() => {})
      const acking = new Inbox(async (_event, ack) => {
        await ack()
        await never
      })
      const holding = new Inbox(() => never) // the control: neither acks nor returns
      // Each in a pubsub of its own: one process's fan-out subscriptions share a reader,
      // which reads for none while one of them is at its limit.
      await open({ keyPrefix: prefix, maxInFlight: 2 }).subscribe('news', acking.cb)
      await open({ keyPrefix: prefix, maxInFlight: 2 }).subscribe('news', holding.cb)
      const publisher = open({ keyPrefix: prefix })
      for (const n of range(1, 10)) await publisher.publish('news', ev(n))
      await acking.count(10)
      await sleep(300) // two more blocking-read periods
      expect(acking.numbers).toEqual(range(1, 10))
      expect(holding.numbers).toEqual([1, 2])
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
})
