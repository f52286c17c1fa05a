// RedisStreamsPubSub's fourth callback argument, `extend()`: the heartbeat of a long handler.
// It pushes back `inFlightTimeoutMs` for its delivery, resets a group entry's idle time in
// Redis only while this consumer owns it, does nothing once the delivery is settled, and
// always resolves, within a bounded time even when the server answers nothing. Mastra 1.71's
// workers, which never call it, work as before.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import type { Event } from '@mastra/core/events'
import { PullTransport } from '@mastra/core/worker'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, withLeases, type ExtendableEventCallback } from '../dist/esm/index.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { ev, numberOf, recordingLogger, sleep, uniquePrefix } from './helpers/streams.js'
import { pendingCount, range, streamsSuite } from './helpers/streams-suite.js'

let redis: RedisServer
beforeAll(async () => {
  redis = await startRedis()
})
afterAll(async () => {
  await redis?.stop()
})
const { open, ownServer } = streamsSuite(() => redis)

type Settlers = { event: Event; ack: () => Promise<void>; nack: () => Promise<void>; extend: () => Promise<void> }

/** A callback that records each delivery with its ack, nack and extend, and settles nothing. */
function holding() {
  const held: Settlers[] = []
  const cb: ExtendableEventCallback = (event, ack, nack, extend) => {
    held.push({ event, ack: ack!, nack: nack!, extend: extend! })
  }
  const count = async (n: number, ms = 5_000) => {
    const deadline = Date.now() + ms
    while (held.length < n) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${n} deliveries; got ${held.length}`)
      await sleep(10)
    }
    return held
  }
  return { cb, held, count }
}

/** XPENDING's detail of a group's pending entries: [entry id, consumer, idle ms, deliveries]. */
async function pendingDetail(server: RedisServer, key: string, group: string) {
  return (await server.cli('XPENDING', key, group, '-', '+', 10)) as Array<[string, string, number, number]>
}

/** The consumer names of `group` on `key` (XINFO CONSUMERS). */
async function consumerNames(server: RedisServer, key: string, group: string): Promise<string[]> {
  const consumers = (await server.cli('XINFO', 'CONSUMERS', key, group)) as Array<Array<string | number>>
  return consumers.map((fields) => String(fields[fields.indexOf('name') + 1]))
}

describe('extend(), the fourth argument of an event callback', () => {
  describe('with inFlightTimeoutMs', () => {
    for (const kind of ['group', 'fan-out'] as const) {
      it(`a ${kind} handler with inFlightTimeoutMs 300 that calls extend() every 100 ms for 1 s is not nacked, and its ack settles the event once`, async ({ annotate }) => {
        const prefix = uniquePrefix(`extend-${kind}`)
        const logger = recordingLogger()
        const pubsub = open({ keyPrefix: prefix, inFlightTimeoutMs: 300, blockMs: 100, logger })
        const deliveries: Event[] = []
        let longestGap = 0
        const works: ExtendableEventCallback = async (event, ack, _nack, extend) => {
          deliveries.push(event)
          if (deliveries.length > 1) return // a redelivery: the check below fails on it
          // On a timer, as a heartbeat runs beside the work: one slow answer delays no call.
          let last = Date.now()
          const beats: Array<Promise<void>> = []
          const heartbeat = setInterval(() => {
            longestGap = Math.max(longestGap, Date.now() - last)
            last = Date.now()
            beats.push(extend!())
          }, 100)
          await sleep(1_000)
          clearInterval(heartbeat)
          await Promise.all(beats)
          await ack!()
        }
        await pubsub.subscribe('jobs', works, kind === 'group' ? { group: 'workers' } : undefined)
        await pubsub.publish('jobs', ev(1))
        for (let i = 0; i < 200 && deliveries.length === 0; i++) await sleep(10)
        await sleep(1_500) // the handler's second, and long enough for a redelivery to come
        annotate(`longest gap between two extend() calls: ${longestGap} ms`)
        expect(deliveries.map((e) => [numberOf(e), e.deliveryAttempt])).toEqual([[1, 1]])
        expect(logger.warnings().filter((l) => /inFlightTimeoutMs/.test(l.message))).toEqual([])
        expect(Number(await redis.cli('XLEN', `${prefix}:jobs`)), 'nothing was appended again').toBe(1)
        if (kind === 'group') expect(await pendingCount(redis, `${prefix}:jobs`, 'workers')).toBe(0)
      })
    }

    it('the control: the same handler without extend() is nacked at inFlightTimeoutMs 300 and delivered again with deliveryAttempt 2', async ({ annotate }) => {
      const prefix = uniquePrefix('extend-control')
      const logger = recordingLogger()
      const pubsub = open({ keyPrefix: prefix, inFlightTimeoutMs: 300, blockMs: 100, logger })
      const deliveries: Array<{ event: Event; at: number }> = []
      const works: ExtendableEventCallback = async (event, ack) => {
        deliveries.push({ event, at: Date.now() })
        if (event.deliveryAttempt !== 1) return ack!()
        await sleep(1_000)
        await ack!() // too late: the timeout nacked it; this changes nothing
      }
      await pubsub.subscribe('jobs', works, { group: 'workers' })
      await pubsub.publish('jobs', ev(1))
      for (let i = 0; i < 300 && deliveries.length < 2; i++) await sleep(10)
      expect(deliveries.map((d) => d.event.deliveryAttempt)).toEqual([1, 2])
      const nackedAfter = deliveries[1]!.at - deliveries[0]!.at
      annotate(`redelivered ${nackedAfter} ms after the first delivery`)
      expect(nackedAfter).toBeGreaterThanOrEqual(250)
      expect(nackedAfter).toBeLessThan(900)
      expect(logger.warnings().some((l) => /inFlightTimeoutMs/.test(l.message))).toBe(true)
    })
  })

  describe("a group entry's idle time in Redis", () => {
    it('extend() resets the idle time XPENDING reports while this consumer owns the entry', async ({ annotate }) => {
      const prefix = uniquePrefix('extend-idle')
      const key = `${prefix}:jobs`
      const pubsub = open({ keyPrefix: prefix, blockMs: 100 }) // reclaimIdleMs 60 s: the keeper keeps every 20 s
      const { cb, count } = holding()
      await pubsub.subscribe('jobs', cb, { group: 'workers' })
      await pubsub.publish('jobs', ev(1))
      const [delivery] = await count(1)
      await sleep(600)
      const [[, owner, before]] = (await pendingDetail(redis, key, 'workers')) as [[string, string, number, number]]
      await delivery!.extend()
      const [[, ownerAfter, after, deliveries]] = (await pendingDetail(redis, key, 'workers')) as [[string, string, number, number]]
      annotate(`XPENDING idle: ${before} ms before extend(), ${after} ms after`)
      expect(before).toBeGreaterThanOrEqual(550)
      expect(after).toBeLessThan(200)
      expect(ownerAfter).toBe(owner)
      expect(deliveries, 'a heartbeat is not a delivery').toBe(1)
      await delivery!.ack()
      expect(await pendingCount(redis, key, 'workers')).toBe(0)
    })

    it('after another consumer claimed the entry, extend() resolves and changes nothing there: the entry stays theirs, its idle time untouched', async () => {
      const prefix = uniquePrefix('extend-not-owned')
      const key = `${prefix}:jobs`
      const pubsub = open({ keyPrefix: prefix, blockMs: 100 })
      const { cb, count } = holding()
      await pubsub.subscribe('jobs', cb, { group: 'workers' })
      await pubsub.publish('jobs', ev(1))
      const [delivery] = await count(1)
      const [[entryId, mine]] = (await pendingDetail(redis, key, 'workers')) as [[string, string, number, number]]
      // A sibling's takeover, as its reclaim pass would do it once the entry sat idle.
      await redis.cli('XCLAIM', key, 'workers', 'sibling', 0, entryId, 'JUSTID')
      await sleep(400)
      await delivery!.extend()
      const [[, owner, idle]] = (await pendingDetail(redis, key, 'workers')) as [[string, string, number, number]]
      expect(owner).not.toBe(mine)
      expect(owner).toBe('sibling')
      expect(idle).toBeGreaterThanOrEqual(350)
      expect(await consumerNames(redis, key, 'workers')).toContain(mine)
    })

    it('extend() after ack resolves and sends nothing: no XPENDING or XCLAIM reaches the server, and the event stays settled', async () => {
      const prefix = uniquePrefix('extend-after-ack')
      const key = `${prefix}:jobs`
      const pubsub = open({ keyPrefix: prefix, blockMs: 100 })
      const { cb, count, held } = holding()
      await pubsub.subscribe('jobs', cb, { group: 'workers' })
      await pubsub.publish('jobs', ev(1))
      const [delivery] = await count(1)
      // The control: while held, extend() runs its ownership check (XPENDING) and its XCLAIM.
      const calls = async () => {
        const stats = await redis.commandCalls()
        return (stats.xpending ?? 0) + (stats.xclaim ?? 0)
      }
      const beforeHeld = await calls()
      await delivery!.extend()
      expect(await calls()).toBeGreaterThan(beforeHeld)
      await delivery!.ack()
      const beforeSettled = await calls()
      await delivery!.extend()
      await delivery!.extend()
      expect(await calls()).toBe(beforeSettled)
      expect(await pendingCount(redis, key, 'workers')).toBe(0)
      await sleep(300)
      expect(held).toHaveLength(1)
    })
  })

  it.skipIf(EXTERNAL_REDIS)('while the server is frozen (SIGSTOP), extend() still resolves within about commandTimeoutMs, and the ack lands after it thaws', async ({ annotate }) => {
    const server = await ownServer()
    const prefix = uniquePrefix('extend-frozen')
    const pubsub = open({ url: server.url, keyPrefix: prefix, blockMs: 100, commandTimeoutMs: 300 })
    const { cb, count } = holding()
    await pubsub.subscribe('jobs', cb, { group: 'workers' })
    await pubsub.publish('jobs', ev(1))
    const [delivery] = await count(1)
    server.freeze()
    const started = Date.now()
    const outcome = await Promise.race([
      delivery!.extend().then(() => 'resolved', () => 'rejected'),
      sleep(5_000).then(() => 'still pending'),
    ])
    const took = Date.now() - started
    server.thaw()
    annotate(`extend() on a frozen server settled in ${took} ms (commandTimeoutMs 300)`)
    expect(outcome).toBe('resolved')
    expect(took).toBeLessThan(1_500)
    await delivery!.ack()
    for (let i = 0; i < 100 && (await pendingCount(server, `${prefix}:jobs`, 'workers')) > 0; i++) await sleep(50)
    expect(await pendingCount(server, `${prefix}:jobs`, 'workers')).toBe(0)
  })

  it("through withLeases(...), the callback gets the transport's extend(), which resets the entry's idle time", async () => {
    const prefix = uniquePrefix('extend-with-leases')
    const key = `${prefix}:jobs`
    const pubsub = withLeases(open({ keyPrefix: prefix, blockMs: 100 }), new MemoryLeaseProvider())
    const { cb, count } = holding()
    await pubsub.subscribe('jobs', cb, { group: 'workers' })
    await pubsub.publish('jobs', ev(1))
    const [delivery] = await count(1)
    await sleep(400)
    await delivery!.extend()
    const [[, , idle]] = (await pendingDetail(redis, key, 'workers')) as [[string, string, number, number]]
    expect(idle).toBeLessThan(200)
    await delivery!.ack()
  })

  it('a localOnly event gets an extend() too, which resolves', async () => {
    const pubsub = open({ keyPrefix: uniquePrefix('extend-local') })
    const { cb, count } = holding()
    await pubsub.subscribe('jobs', cb, { group: 'workers' })
    await pubsub.publish('jobs', ev(1), { localOnly: true })
    const [delivery] = await count(1)
    expect(typeof delivery!.extend).toBe('function')
    await expect(delivery!.extend()).resolves.toBeUndefined()
    await delivery!.ack()
    await expect(delivery!.extend()).resolves.toBeUndefined()
  })

  it("Mastra 1.71's PullTransport, whose route takes event and ack and never extends, still handles each of 10 jobs once and acks them all", async () => {
    const prefix = uniquePrefix('extend-pull-transport')
    const pubsub = open({ keyPrefix: prefix, blockMs: 100, reclaimIdleMs: 300, reclaimIntervalMs: 100 })
    const transport = new PullTransport({ pubsub, group: 'mastra-orchestration' })
    const handled: number[] = []
    await transport.start({
      route: async (event: Event, ack?: () => Promise<void>) => {
        handled.push(numberOf(event))
        await sleep(400) // longer than reclaimIdleMs: kept claimed without any heartbeat
        await ack?.()
      },
    })
    try {
      await Promise.all(range(1, 10).map((n) => pubsub.publish('workflows', ev(n))))
      const key = `${prefix}:workflows`
      for (let i = 0; i < 200 && (handled.length < 10 || (await pendingCount(redis, key, 'mastra-orchestration')) > 0); i++) await sleep(50)
      await sleep(900) // a job handed out again would show by now
      expect([...handled].sort((a, b) => a - b)).toEqual(range(1, 10))
      expect(await pendingCount(redis, key, 'mastra-orchestration')).toBe(0)
    } finally {
      await transport.stop({ drainTimeout: 0 })
    }
  })
})
