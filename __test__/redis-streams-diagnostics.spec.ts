// RedisStreamsPubSub on the diagnostics channels: every publish traced on
// mastra-lease:streams:publish (with the id it stamps), and each event handed to a callback,
// acked and nacked told on mastra-lease:streams:deliver, :ack and :nack; for stream events and
// for localOnly ones alike.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import type { Event } from '@mastra/core/events'
import { afterEach, beforeAll, describe, expect, it } from 'vitest'

import { ackChannel, deliverChannel, nackChannel, publishChannel, RedisStreamsPubSub, type DeliveryMessage } from '../dist/esm/index.js'
import { closing, leaseSuite, stopLater } from './helpers/lease-runs.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'
import { ev, uniquePrefix } from './helpers/streams.js'

leaseSuite()

let server: RedisServer
beforeAll(async () => {
  server = stopLater(await startRedis())
})

type Told = { channel: string } & Partial<DeliveryMessage> & { result?: unknown; error?: unknown }
const undo: Array<() => void> = []
afterEach(() => {
  for (const u of undo.splice(0)) u()
})
function record(): Told[] {
  const seen: Told[] = []
  const publish = {
    start: (c: object) => void seen.push({ channel: 'publish:start', ...c }),
    end() {},
    asyncStart() {},
    asyncEnd: (c: object) => void seen.push({ channel: 'publish:asyncEnd', ...c }),
    error() {},
  }
  publishChannel.subscribe(publish)
  undo.push(() => publishChannel.unsubscribe(publish))
  for (const [name, channel] of [['deliver', deliverChannel], ['ack', ackChannel], ['nack', nackChannel]] as const) {
    const on = (message: unknown) => void seen.push({ channel: name, ...(message as DeliveryMessage) })
    channel.subscribe(on)
    undo.push(() => channel.unsubscribe(on))
  }
  return seen
}
const until = async (what: string, ok: () => boolean) => {
  const deadline = Date.now() + 10_000
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 10))
  }
}

describe.each([false, true])('localOnly %s', (localOnly) => {
  it('a subscriber sees the publish with its id, then the delivery, the nack, the redelivery with deliveryAttempt 2 and the ack', async () => {
    const pubsub = closing(new RedisStreamsPubSub({ url: server.url, keyPrefix: uniquePrefix('diag') }))
    const handled: Event[] = []
    await pubsub.subscribe('jobs', (event, ack, nack) => {
      handled.push(event)
      void (handled.length === 1 ? nack!() : ack!())
    }, { group: 'workers' })
    const seen = record()
    await pubsub.publish('jobs', ev(1), { localOnly })
    await until('the ack', () => seen.some((m) => m.channel === 'ack'))

    const id = handled[0]!.id
    const told = { topic: 'jobs', group: 'workers', id, type: 'test', localOnly }
    // A localOnly event is delivered within the publish call, a stream event after it.
    const published = seen.filter((m) => m.channel.startsWith('publish'))
    expect(published).toEqual([
      { channel: 'publish:start', topic: 'jobs', id, type: 'test', localOnly },
      { channel: 'publish:asyncEnd', topic: 'jobs', id, type: 'test', localOnly, result: undefined },
    ])
    expect(seen.filter((m) => !m.channel.startsWith('publish'))).toEqual([
      { channel: 'deliver', ...told, deliveryAttempt: 1 },
      { channel: 'nack', ...told, deliveryAttempt: 1 },
      { channel: 'deliver', ...told, deliveryAttempt: 2 },
      { channel: 'ack', ...told, deliveryAttempt: 2 },
    ])
  })
})

describe('RedisStreamsPubSub channels', () => {
  it('a callback that throws is told as a nack; a publish that rejects is traced with its error code', async () => {
    const pubsub = closing(new RedisStreamsPubSub({ url: server.url, keyPrefix: uniquePrefix('diag-throw'), maxDeliveryAttempts: 1 }))
    await pubsub.subscribe('t', () => {
      throw new Error('boom')
    })
    const seen = record()
    await pubsub.publish('t', ev(1))
    await until('the nack', () => seen.some((m) => m.channel === 'nack'))
    expect(seen.filter((m) => m.channel === 'nack')).toEqual([expect.objectContaining({ topic: 't', group: undefined, deliveryAttempt: 1 })])
    await expect(pubsub.publish('t', 'not an event' as never)).rejects.toMatchObject({ code: 'ERR_STREAMS_INVALID_ARGUMENT' })
    expect(seen.at(-1)).toEqual(expect.objectContaining({ channel: 'publish:asyncEnd', topic: 't', error: expect.objectContaining({ code: 'ERR_STREAMS_INVALID_ARGUMENT' }) }))
  })
})
