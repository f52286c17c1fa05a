// RedisStreamsPubSub: localOnly events (never written, redelivered in the process), and
// trimming streams without cutting what a group has not settled, and idle expiry.
//
// Layout (the one Mastra's own Redis Streams backend uses): a topic is the stream
// `<keyPrefix>:<topic>` whose entries carry one field, `event`, holding the event as JSON;
// a lease is the string `<keyPrefix>:lease:<key>` holding the owner, with a PX expiry.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { ev, Inbox, recordingLogger, sleep, uniquePrefix, type Publishable } from './helpers/streams.js'
import { entries, pendingCount, range, streamsSuite, UUID } from './helpers/streams-suite.js'

let redis: RedisServer
beforeAll(async () => {
  redis = await startRedis()
})
afterAll(async () => {
  await redis?.stop()
})
const { open, holdingChild } = streamsSuite(() => redis)

describe('RedisStreamsPubSub', () => {
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

    it("a group's members take turns across stream and localOnly events alike: each event goes to the member after the one the last event went to", async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('local-turns') })
      const order: string[] = []
      const first = new Inbox((_event, ack) => (order.push('first'), ack()))
      const second = new Inbox((_event, ack) => (order.push('second'), ack()))
      await pubsub.subscribe('turns', first.cb, { group: 'g' })
      await pubsub.subscribe('turns', second.cb, { group: 'g' })
      for (let n = 1; n <= 6; n++) {
        // Odd events through the stream, even ones localOnly; each delivered before the next.
        await pubsub.publish('turns', ev(n), n % 2 === 0 ? { localOnly: true } : undefined)
        for (let i = 0; i < 100 && order.length < n; i++) await sleep(10)
      }
      expect(order).toEqual(['first', 'second', 'first', 'second', 'first', 'second'])
      expect([...first.numbers, ...second.numbers].sort()).toEqual([1, 2, 3, 4, 5, 6])
    })

    it("as Mastra's run.watch() subscribes, without awaiting: a localOnly event published in the same turn reaches the fan-out subscriber and the group's member", async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('local-opening') })
      const fanned = new Inbox()
      const member = new Inbox()
      const subscribed = [pubsub.subscribe('run', fanned.cb), pubsub.subscribe('run', member.cb, { group: 'g' })]
      await pubsub.publish('run', ev(1), { localOnly: true })
      await Promise.all(subscribed)
      await pubsub.publish('run', ev(2), { localOnly: true })
      expect(fanned.numbers).toEqual([1, 2])
      expect(member.numbers).toEqual([1, 2])
    })

    it('an unsubscribe not yet awaited already takes the member out of the turns: every localOnly event goes to the member that stays, none is lost', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('local-leaving') })
      const leaving = new Inbox()
      const staying = new Inbox()
      await pubsub.subscribe('jobs', leaving.cb, { group: 'g' })
      await pubsub.subscribe('jobs', staying.cb, { group: 'g' })
      const left = pubsub.unsubscribe('jobs', leaving.cb)
      for (let n = 1; n <= 4; n++) await pubsub.publish('jobs', ev(n), { localOnly: true })
      await left
      await staying.count(4)
      expect(leaving.events).toEqual([])
      expect(staying.numbers).toEqual([1, 2, 3, 4])
    })

    it('a nacked localOnly group event goes to the next member in turn, and to nobody once every member left', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('local-renack') })
      const order: string[] = []
      const nacking = new Inbox((_event, _ack, nack) => (order.push('nacking'), nack()))
      const acking = new Inbox((_event, ack) => (order.push('acking'), ack()))
      await pubsub.subscribe('jobs', nacking.cb, { group: 'g' })
      await pubsub.subscribe('jobs', acking.cb, { group: 'g' })
      await pubsub.publish('jobs', ev(1), { localOnly: true })
      await acking.count(1)
      expect(order).toEqual(['nacking', 'acking'])
      expect(acking.events[0]!.deliveryAttempt).toBe(2)

      await pubsub.unsubscribe('jobs', acking.cb)
      await pubsub.publish('jobs', ev(2), { localOnly: true }) // to nacking; its redelivery to it again
      await pubsub.unsubscribe('jobs', nacking.cb)
      await pubsub.flush()
      await sleep(100)
      expect(nacking.numbers).toEqual([1, 2])
    })

    it('a bad topic is refused with ERR_STREAMS_INVALID_ARGUMENT before anyone is called, and a closed pubsub refuses as for any publish', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('local-refused') })
      const inbox = new Inbox()
      await pubsub.subscribe('t', inbox.cb)
      for (const topic of ['', 42, 'x'.repeat(100_000)]) {
        await expect(pubsub.publish(topic as string, ev(1), { localOnly: true })).rejects.toMatchObject({ code: 'ERR_STREAMS_INVALID_ARGUMENT' })
      }
      await pubsub.close()
      const refusals = await Promise.allSettled([pubsub.publish('t', ev(2), { localOnly: true }), pubsub.publish('t', ev(3))])
      const [local, stream] = refusals.map((r) => (r.status === 'rejected' ? (r.reason as { code?: string; message?: string }) : undefined))
      expect(local?.code).toBe(stream?.code)
      expect(local?.message).toBe(stream?.message)
      expect(inbox.events).toEqual([])
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
})
