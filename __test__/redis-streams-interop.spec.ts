// Interoperability: a fleet can mix processes running RedisStreamsPubSub with processes
// running a node-redis backend of the same layout (Mastra's own Redis Streams backend is one).
// The peer here is written from the layout alone, with node-redis:
//   topic  -> stream `<keyPrefix>:<topic>`, one entry per event, one field `event` = JSON
//             with `id`, `createdAt` (ISO 8601) and `deliveryAttempt` stamped by the publisher
//   groups -> XGROUP CREATE ... MKSTREAM, XREADGROUP '>', XACK
//   nack   -> XADD the event again with deliveryAttempt + 1, then XACK the original
//   lease  -> `<keyPrefix>:lease:<key>` = owner, SET NX PX
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { randomUUID } from 'node:crypto'

import { createClient } from 'redis'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub, type RedisStreamsPubSubOptions } from '../dist/esm/index.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'
import { ev, Inbox, numberOf, recordingLogger, sleep, uniquePrefix, type Publishable } from './helpers/streams.js'

type Peer = ReturnType<typeof createClient>

let redis: RedisServer
let peer: Peer
const opened: RedisStreamsPubSub[] = []

beforeAll(async () => {
  redis = await startRedis()
  peer = createClient({ url: redis.url })
  peer.on('error', () => {})
  await peer.connect()
})
afterEach(async () => {
  await Promise.allSettled(opened.splice(0).map((p) => p.close()))
})
afterAll(async () => {
  await peer?.quit().catch(() => {})
  await redis?.stop()
})

function open(options: RedisStreamsPubSubOptions = {}): RedisStreamsPubSub {
  const pubsub = new RedisStreamsPubSub({ url: redis.url, ...options })
  opened.push(pubsub)
  return pubsub
}

// ---------------------------------------------------------------------------
// The peer: a node-redis implementation of the layout, nothing borrowed from ours
// ---------------------------------------------------------------------------

interface WireEvent {
  type: string
  runId: string
  data: unknown
  id: string
  createdAt: string
  deliveryAttempt?: number
}

/** The peer's publish: stamps the event as the layout says and appends it. */
async function peerPublish(prefix: string, topic: string, event: Publishable, stamp: Partial<WireEvent> = {}): Promise<WireEvent> {
  const wire: WireEvent = { ...event, id: randomUUID(), createdAt: new Date().toISOString(), deliveryAttempt: 1, ...stamp }
  await peer.xAdd(`${prefix}:${topic}`, '*', { event: JSON.stringify(wire) })
  return wire
}

type RawEntries = Array<[string, string[]]>

/** The peer's grouped read: XREADGROUP ... STREAMS key '>' (raw, so the shape is the wire's). */
async function peerReadGroup(key: string, group: string, consumer: string, blockMs = 100, client: Peer = peer): Promise<Array<{ entryId: string; event: WireEvent }>> {
  const reply = (await client.sendCommand(['XREADGROUP', 'GROUP', group, consumer, 'COUNT', '100', 'BLOCK', String(blockMs), 'STREAMS', key, '>'])) as Array<[string, RawEntries]> | null
  if (!reply) return []
  return reply.flatMap(([, entries]) => entries.map(([entryId, fields]) => ({ entryId, event: parseFields(fields) })))
}

/** The `event` field of an entry's field list, parsed. */
function parseFields(fields: string[]): WireEvent {
  const at = fields.indexOf('event')
  if (at < 0 || at % 2 !== 0) throw new Error(`entry without an event field: ${JSON.stringify(fields)}`)
  return JSON.parse(fields[at + 1]!) as WireEvent
}

async function peerCreateGroup(key: string, group: string, from = '0') {
  await peer.xGroupCreate(key, group, from, { MKSTREAM: true })
}

/** Reads until `n` events arrived or `ms` passed, acking each. */
async function peerReadGroupUntil(key: string, group: string, consumer: string, n: number, ms = 5_000) {
  const got: Array<{ entryId: string; event: WireEvent }> = []
  const deadline = Date.now() + ms
  while (got.length < n && Date.now() < deadline) {
    const batch = await peerReadGroup(key, group, consumer)
    for (const item of batch) await peer.xAck(key, group, item.entryId)
    got.push(...batch)
  }
  return got
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/
const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/

describe('RedisStreamsPubSub alongside a node-redis peer of the same layout', () => {
  it('events the peer publishes reach our fan-out and group subscribers, with the peer’s id and createdAt as a Date', async () => {
    const prefix = uniquePrefix('peer-to-us')
    const ours = open({ keyPrefix: prefix })
    const fanned = new Inbox()
    const grouped = new Inbox()
    await ours.subscribe('jobs', fanned.cb)
    await ours.subscribe('jobs', grouped.cb, { group: 'workers' })
    const sent = [
      await peerPublish(prefix, 'jobs', { type: 'job', runId: 'peer-run', data: { n: 1, text: 'héllo \u0000 ✓' } }),
      await peerPublish(prefix, 'jobs', ev(2, 'peer-run')),
    ]
    await fanned.count(2)
    await grouped.count(2)
    for (const inbox of [fanned, grouped]) {
      expect(inbox.events.map((e) => e.id)).toEqual(sent.map((s) => s.id))
      const [first] = inbox.events
      expect(first).toMatchObject({ type: 'job', runId: 'peer-run', data: { n: 1, text: 'héllo \u0000 ✓' }, deliveryAttempt: 1 })
      expect(first!.createdAt).toBeInstanceOf(Date)
      expect(first!.createdAt.toISOString()).toBe(sent[0]!.createdAt)
    }
    // Our group acked what it handled: nothing is left pending for the peer to reclaim. The
    // callbacks' acks are still on their way when the events arrive, so allow them a moment.
    let pending = Infinity
    for (const deadline = Date.now() + 3_000; pending !== 0 && Date.now() < deadline; ) {
      const reply = (await peer.sendCommand(['XPENDING', `${prefix}:jobs`, 'workers'])) as [number, ...unknown[]]
      pending = Number(reply[0])
      if (pending !== 0) await new Promise((r) => setTimeout(r, 20))
    }
    expect(pending).toBe(0)
  })

  it('events we publish are readable by the peer with XREADGROUP and XRANGE, and parse into the stamped event', async () => {
    const prefix = uniquePrefix('us-to-peer')
    const key = `${prefix}:jobs`
    await peerCreateGroup(key, 'peer-workers')
    const ours = open({ keyPrefix: prefix })
    const before = Date.now()
    await ours.publish('jobs', { type: 'job', runId: 'our-run', data: { n: 1, nested: { ok: true } } })
    await ours.publish('jobs', ev(2, 'our-run'))

    const read = await peerReadGroupUntil(key, 'peer-workers', 'peer-1', 2)
    expect(read.map((r) => (r.event.data as { n: number }).n)).toEqual([1, 2])
    const [first] = read
    expect(first!.event).toEqual({
      type: 'job',
      runId: 'our-run',
      data: { n: 1, nested: { ok: true } },
      id: expect.stringMatching(UUID),
      createdAt: expect.stringMatching(ISO),
      deliveryAttempt: 1,
    })
    const createdAt = new Date(first!.event.createdAt).getTime()
    expect(createdAt).toBeGreaterThanOrEqual(before - 5)
    expect(createdAt).toBeLessThanOrEqual(Date.now() + 5)

    // XRANGE sees the same two entries, each with exactly one field.
    const range = await peer.xRange(key, '-', '+')
    expect(range.map((entry) => Object.keys(entry.message))).toEqual([['event'], ['event']])
    expect(range.map((entry) => (JSON.parse(entry.message.event!) as WireEvent).id)).toEqual(read.map((r) => r.event.id))
  })

  it('a peer consumer and ours in one group share the work: every event is handled exactly once', async () => {
    const prefix = uniquePrefix('mixed-group')
    const key = `${prefix}:work`
    const ours = open({ keyPrefix: prefix })
    const inbox = new Inbox()
    await ours.subscribe('work', inbox.cb, { group: 'fleet' }) // creates the group (or joins it)
    // The peer's consumer blocks on its own connection, as a real consumer does.
    const reader: Peer = peer.duplicate()
    reader.on('error', () => {})
    await reader.connect()
    const peerGot: number[] = []
    let stop = false
    const peerLoop = (async () => {
      while (!stop) {
        for (const { entryId, event } of await peerReadGroup(key, 'fleet', 'peer-1', 50, reader)) {
          peerGot.push((event.data as { n: number }).n)
          await peer.xAck(key, 'fleet', entryId)
        }
      }
    })()
    try {
      for (let n = 1; n <= 40; n++) {
        await (n % 2 ? ours.publish('work', ev(n)) : peerPublish(prefix, 'work', ev(n)))
        await sleep(5)
      }
      const deadline = Date.now() + 5_000
      while (inbox.events.length + peerGot.length < 40 && Date.now() < deadline) await sleep(20)
      await sleep(300)
    } finally {
      stop = true
      await peerLoop
      await reader.quit().catch(() => {})
    }
    const all = [...inbox.numbers, ...peerGot].sort((a, b) => a - b)
    expect(all).toEqual(Array.from({ length: 40 }, (_, i) => i + 1))
    expect(inbox.events.length, `ours ${inbox.events.length}, peer ${peerGot.length}`).toBeGreaterThan(0)
    expect(peerGot.length, `ours ${inbox.events.length}, peer ${peerGot.length}`).toBeGreaterThan(0)
  })

  it('a redelivery the peer writes (deliveryAttempt + 1) reaches us with that attempt, and our nack of it reaches the peer with the next one', async () => {
    const prefix = uniquePrefix('attempts')
    const key = `${prefix}:jobs`
    const ours = open({ keyPrefix: prefix, maxDeliveryAttempts: 5 })
    const inbox = new Inbox(async (event, ack, nack) => ((event.deliveryAttempt ?? 1) === 2 ? nack() : ack()))
    await ours.subscribe('jobs', inbox.cb, { group: 'ours' })
    await peerCreateGroup(key, 'watchers')
    const original = await peerPublish(prefix, 'jobs', ev(1), { deliveryAttempt: 2 })
    await inbox.count(2)
    expect(inbox.events.map((e) => e.deliveryAttempt)).toEqual([2, 3])
    expect(inbox.events.map((e) => e.id)).toEqual([original.id, original.id])
    // The watchers group (the peer) sees both entries: the peer's and our redelivery.
    const seen = await peerReadGroupUntil(key, 'watchers', 'peer-1', 2)
    expect(seen.map((s) => [s.event.id, s.event.deliveryAttempt])).toEqual([
      [original.id, 2],
      [original.id, 3],
    ])
  })

  it('an event written without deliveryAttempt counts as the first attempt', async () => {
    const prefix = uniquePrefix('no-attempt')
    const ours = open({ keyPrefix: prefix })
    const inbox = new Inbox(async (event, ack, nack) => ((event.deliveryAttempt ?? 1) === 1 ? nack() : ack()))
    await ours.subscribe('jobs', inbox.cb, { group: 'g' })
    const wire = { ...ev(1), id: randomUUID(), createdAt: new Date().toISOString() }
    await peer.xAdd(`${prefix}:jobs`, '*', { event: JSON.stringify(wire) })
    await inbox.count(2)
    expect(inbox.events.map((e) => e.deliveryAttempt ?? 1)).toEqual([1, 2])
  })

  it("an event another writer stamped with a deliveryAttempt that is not a whole number of at least 1 ('x', -1, 1.5) counts as its first attempt: a nack writes it back as attempt 2", async () => {
    const prefix = uniquePrefix('odd-attempt')
    const ours = open({ keyPrefix: prefix, maxDeliveryAttempts: 2 })
    const inbox = new Inbox(async (event, ack, nack) => (event.deliveryAttempt === 2 ? ack() : nack()))
    await ours.subscribe('jobs', inbox.cb, { group: 'g' })
    for (const deliveryAttempt of ['x', -1, 1.5]) {
      const wire = { ...ev(1), id: randomUUID(), createdAt: new Date().toISOString(), deliveryAttempt }
      await peer.xAdd(`${prefix}:jobs`, '*', { event: JSON.stringify(wire) })
    }
    await inbox.count(6)
    expect(inbox.events.map((e) => e.deliveryAttempt).sort()).toEqual([-1, 1.5, 2, 2, 2, 'x'].sort())
  })

  it('an entry that is not an event (no event field, or not JSON) is dropped with a warning, and the events after it still arrive', async () => {
    const prefix = uniquePrefix('malformed')
    const key = `${prefix}:jobs`
    const logger = recordingLogger()
    const ours = open({ keyPrefix: prefix, logger })
    const inbox = new Inbox()
    await ours.subscribe('jobs', inbox.cb, { group: 'g' })
    await peer.xAdd(key, '*', { other: 'field' })
    await peer.xAdd(key, '*', { event: '{not json' })
    await peerPublish(prefix, 'jobs', ev(3))
    await inbox.count(1)
    await sleep(300)
    expect(inbox.numbers).toEqual([3])
    expect(logger.warnings().length).toBeGreaterThanOrEqual(1)
    // None of the three is left pending in the group.
    const pending = (await peer.sendCommand(['XPENDING', key, 'g'])) as [number, ...unknown[]]
    expect(Number(pending[0])).toBe(0)
  })

  it('leases are shared with the peer: its SET NX PX is seen by us, and ours is a plain string with a PX expiry it can read', async () => {
    const prefix = uniquePrefix('lease-interop')
    const ours = open({ keyPrefix: prefix })
    const theirs = `${prefix}:lease:resource\0thread-a`
    expect(await peer.set(theirs, 'peer-run', { condition: 'NX', expiration: { type: 'PX', value: 10_000 } })).toBe('OK')
    expect(await ours.getLeaseOwner('resource\0thread-a')).toBe('peer-run')
    expect(await ours.acquireLease('resource\0thread-a', 'our-run', 10_000)).toEqual({ acquired: false, owner: 'peer-run' })

    expect(await ours.acquireLease('resource\0thread-b', 'our-run', 10_000)).toStrictEqual({ acquired: true, owner: 'our-run' })
    expect(await peer.get(`${prefix}:lease:resource\0thread-b`)).toBe('our-run')
    const ttl = await peer.pTTL(`${prefix}:lease:resource\0thread-b`)
    expect(ttl).toBeGreaterThan(9_000)
    expect(ttl).toBeLessThanOrEqual(10_000)
    // The peer's SET NX on our lease fails, as it must.
    expect(await peer.set(`${prefix}:lease:resource\0thread-b`, 'peer-run', { condition: 'NX', expiration: { type: 'PX', value: 10_000 } })).toBeNull()
  })

  it('numbers keep their order end to end across both publishers (one stream, one order)', async () => {
    const prefix = uniquePrefix('order')
    const ours = open({ keyPrefix: prefix })
    const inbox = new Inbox()
    await ours.subscribe('feed', inbox.cb)
    for (let n = 1; n <= 10; n++) await (n % 3 ? ours.publish('feed', ev(n)) : peerPublish(prefix, 'feed', ev(n)))
    await inbox.count(10)
    expect(inbox.events.map(numberOf)).toEqual(Array.from({ length: 10 }, (_, i) => i + 1))
  })
})
