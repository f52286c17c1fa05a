// streamIdleTtlMs is a sliding expiry: every write that appends to a topic's stream, or makes
// it, sets the stream's PTTL again, as Mastra's own backend does. A nacked event appended again
// to a stream about to expire keeps it alive, and a stream a subscribed group's reader makes
// again after clearTopic expires too instead of lingering forever.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub, type RedisStreamsPubSubOptions } from '../dist/esm/index.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'
import { ev, Inbox, sleep, uniquePrefix } from './helpers/streams.js'

const TTL_MS = 60_000
/** What the stream is left with before the write under test: about to expire. */
const ALMOST_GONE_MS = 3_000

let redis: RedisServer
const opened: RedisStreamsPubSub[] = []
beforeAll(async () => {
  redis = await startRedis()
})
afterEach(async () => {
  await Promise.allSettled(opened.splice(0).map((p) => p.close()))
})
afterAll(async () => {
  await redis?.stop()
})

function open(options: RedisStreamsPubSubOptions): RedisStreamsPubSub {
  const pubsub = new RedisStreamsPubSub({ url: redis.url, streamIdleTtlMs: TTL_MS, ...options })
  opened.push(pubsub)
  return pubsub
}

const pttl = async (key: string) => Number(await redis.cli('PTTL', key))

describe('streamIdleTtlMs', () => {
  it.each([
    ['a group', { group: 'workers' }],
    ['a fan-out subscriber', undefined],
  ] as const)('a nack by %s appends the event again and sets the idle TTL again, as a publish does', async (_who, options) => {
    const prefix = uniquePrefix('ttl-nack')
    const key = `${prefix}:jobs`
    const pubsub = open({ keyPrefix: prefix })
    const inbox = new Inbox(async (event, ack, nack) => {
      if (event.deliveryAttempt !== 1) return ack()
      await redis.cli('PEXPIRE', key, ALMOST_GONE_MS)
      await nack()
    })
    await pubsub.subscribe('jobs', inbox.cb, options)
    await pubsub.publish('jobs', ev(1))
    await inbox.count(2)
    expect(inbox.events.map((e) => e.deliveryAttempt)).toEqual([1, 2])
    const left = await pttl(key)
    expect(left, 'PTTL after the nack').toBeGreaterThan(TTL_MS - 10_000)
    expect(left, 'PTTL after the nack').toBeLessThanOrEqual(TTL_MS)
  })

  it("a stream a subscribed group's reader makes again after clearTopic gets the idle TTL, and still delivers", async () => {
    const prefix = uniquePrefix('ttl-remade')
    const key = `${prefix}:jobs`
    const consumer = open({ keyPrefix: prefix, blockMs: 100 })
    const inbox = new Inbox()
    await consumer.subscribe('jobs', inbox.cb, { group: 'workers' })
    expect(await pttl(key), 'PTTL of the stream the subscribe made').toBeGreaterThan(TTL_MS - 10_000)

    // Another process ends the topic; the subscriber is still there and makes it again.
    const other = open({ keyPrefix: prefix })
    await other.clearTopic('jobs')
    const deadline = Date.now() + 5_000
    while ((await redis.cli('EXISTS', key)) === 0) {
      if (Date.now() > deadline) throw new Error('the reader did not make the stream again within 5 s')
      await sleep(20)
    }
    const left = await pttl(key)
    expect(left, 'PTTL of the stream made again (-1: none, it would never expire)').toBeGreaterThan(TTL_MS - 10_000)
    expect(left).toBeLessThanOrEqual(TTL_MS)

    await other.publish('jobs', ev(1))
    await inbox.count(1)
  })
})
