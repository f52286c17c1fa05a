// RedisStreamsPubSub: an event is held until it is settled, nack and redelivery up to the
// attempt cap, a handler slower than the reclaim threshold, and a consumer that dies holding one.
//
// Layout (the one Mastra's own Redis Streams backend uses): a topic is the stream
// `<keyPrefix>:<topic>` whose entries carry one field, `event`, holding the event as JSON;
// a lease is the string `<keyPrefix>:lease:<key>` holding the owner, with a PX expiry.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import type { Event } from '@mastra/core/events'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { startRedis, type RedisServer } from './helpers/redis-server.js'
import { ev, Inbox, numberOf, recordingLogger, sleep, uniquePrefix } from './helpers/streams.js'
import { entries, pendingCount, range, streamsSuite } from './helpers/streams-suite.js'

let redis: RedisServer
beforeAll(async () => {
  redis = await startRedis()
})
afterAll(async () => {
  await redis?.stop()
})
const { open, holdingChild, children } = streamsSuite(() => redis)

describe('RedisStreamsPubSub', () => {
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
      const logger = recordingLogger()
      const pubsub = open({ keyPrefix: uniquePrefix('unlimited'), maxDeliveryAttempts: 0, logger })
      const inbox = new Inbox(async (event, ack, nack) => ((event.deliveryAttempt ?? 1) < 8 ? nack() : ack()))
      await pubsub.subscribe('again', inbox.cb, { group: 'g' })
      await pubsub.publish('again', ev(1))
      await inbox.count(8)
      expect(inbox.events.map((e) => e.deliveryAttempt)).toEqual(range(1, 8))
      // The back-compat notice for 0 went to the logger, and no event was dropped at a cap.
      expect(logger.warnings().map((l) => l.fields?.code)).toEqual(['MASTRA_LEASE_ZERO_DELIVERY_ATTEMPTS'])
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

    it('a fan-out subscriber that nacks after its callback returned gets the event again with deliveryAttempt + 1, up to the cap', async () => {
      const logger = recordingLogger()
      const prefix = uniquePrefix('fanout-late-nack')
      const pubsub = open({ keyPrefix: prefix, maxDeliveryAttempts: 3, logger })
      const inbox = new Inbox((_event, _ack, nack) => {
        // The callback returns first; the nack comes a little later.
        setTimeout(() => void nack(), 20)
      })
      await pubsub.subscribe('news', inbox.cb)
      await pubsub.publish('news', ev(1))
      await inbox.count(3)
      await sleep(300)
      expect(inbox.events.map((e) => e.deliveryAttempt)).toEqual([1, 2, 3])
      expect(new Set(inbox.events.map((e) => e.id)).size).toBe(1)
      expect(logger.warnings().filter((l) => /max delivery attempts/i.test(l.message))).toHaveLength(1)
      expect(await redis.cli('XLEN', `${prefix}:news`)).toBe(3)
    })

    for (const when of ['inside their callbacks', 'after their callbacks returned'] as const) {
      it(`fan-out subscribers of one process that all nack an event ${when} cause one redelivery, not one each`, async () => {
        const prefix = uniquePrefix('fanout-nack-shared')
        const pubsub = open({ keyPrefix: prefix })
        const settle = (event: Event, ack: () => Promise<void>, nack: () => Promise<void>) => {
          const how = () => void (event.deliveryAttempt === 1 ? nack() : ack())
          if (when === 'inside their callbacks') how()
          else setTimeout(how, 20)
        }
        const [a, b, c] = [new Inbox(settle), new Inbox(settle), new Inbox(settle)]
        await pubsub.subscribe('news', a.cb)
        await pubsub.subscribe('news', b.cb)
        await pubsub.subscribe('news', c.cb)
        await pubsub.publish('news', ev(1))
        for (const inbox of [a, b, c]) await inbox.count(2)
        await sleep(300)
        for (const inbox of [a, b, c]) expect(inbox.events.map((e) => e.deliveryAttempt)).toEqual([1, 2])
        expect(await redis.cli('XLEN', `${prefix}:news`)).toBe(2)
      })
    }

    it("a fan-out nack after the callback returned refreshes the stream's idle TTL, as Mastra's own test of a nack's republish asks", async () => {
      const prefix = uniquePrefix('fanout-late-nack-ttl')
      const pubsub = open({ keyPrefix: prefix, streamIdleTtlMs: 60_000, maxDeliveryAttempts: 3 })
      const key = `${prefix}:news`
      let attempts = 0
      await pubsub.subscribe('news', (_event, ack, nack) => {
        attempts += 1
        if (attempts === 1) void redis.cli('PEXPIRE', key, 1_000).then(() => nack?.())
        else void ack?.()
      })
      await pubsub.publish('news', ev(1))
      await expect.poll(() => attempts, { timeout: 5_000 }).toBeGreaterThanOrEqual(2)
      await expect.poll(async () => Number(await redis.cli('PTTL', key)), { timeout: 3_000 }).toBeGreaterThan(5_000)
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
})
