// RedisStreamsPubSub: a stream deleted or re-created under its readers (NOGROUP), clearTopic,
// unsubscribe, flush, close, and publishing and settling through an outage.
//
// Layout (the one Mastra's own Redis Streams backend uses): a topic is the stream
// `<keyPrefix>:<topic>` whose entries carry one field, `event`, holding the event as JSON;
// a lease is the string `<keyPrefix>:lease:<key>` holding the owner, with a PX expiry.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import type { Event } from '@mastra/core/events'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub } from '../dist/esm/index.js'
import { errorCode, settleWithin } from './helpers/lease.js'
import { EXTERNAL_REDIS, freePort, startRedis, type RedisServer } from './helpers/redis-server.js'
import { ev, Inbox, numberOf, recordingLogger, sleep, uniquePrefix } from './helpers/streams.js'
import { deliveryAfterSiblingClose, entries, pendingCount, publishRange, range, streamsSuite } from './helpers/streams-suite.js'

let redis: RedisServer
beforeAll(async () => {
  redis = await startRedis()
})
afterAll(async () => {
  await redis?.stop()
})
const { open, ownServer } = streamsSuite(() => redis)

describe('RedisStreamsPubSub', () => {
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

    // Redis ends a read blocked on a stream that is deleted with UNBLOCKED, Valkey with
    // NOGROUP (and both a read whose group is destroyed). Either way the group is gone, and
    // made again.
    it.each([
      ['the stream is deleted (DEL)', (key: string) => redis.cli('DEL', key)],
      ['its group is destroyed (XGROUP DESTROY)', (key: string) => redis.cli('XGROUP', 'DESTROY', key, 'g')],
    ])('a group subscriber whose blocked read ends because %s makes the group again without a warning', async (_what, remove) => {
      const prefix = uniquePrefix('nogroup-blocked')
      const logger = recordingLogger()
      const pubsub = open({ keyPrefix: prefix, blockMs: 5_000, logger })
      const inbox = new Inbox()
      await pubsub.subscribe('jobs', inbox.cb, { group: 'g' })
      await pubsub.publish('jobs', ev(1))
      await inbox.count(1)
      await sleep(200) // its next read is blocked
      expect(await remove(`${prefix}:jobs`)).toBe(1)
      await sleep(200)
      await pubsub.publish('jobs', ev(2))
      await inbox.count(2, 8_000)
      expect(inbox.numbers).toEqual([1, 2])
      expect(logger.warnings()).toEqual([])
      expect(logger.lines.map((l) => l.message)).toContain('mastra-lease streams: recreated consumer group after NOGROUP')
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

    it("an event published right after a group sibling's close() reaches the live sibling at once, not at the reclaim after reclaimIdleMs", async ({ annotate }) => {
      const RECLAIM_IDLE_MS = 3_000
      const options = { keyPrefix: uniquePrefix('close-sibling'), blockMs: 30_000, reclaimIdleMs: RECLAIM_IDLE_MS, reclaimIntervalMs: 500 }
      const delayMs = await deliveryAfterSiblingClose(open, options, RECLAIM_IDLE_MS * 2)
      await annotate(`one server: delivered ${delayMs.toFixed(0)} ms after the publish that followed a sibling's close (reclaimIdleMs ${RECLAIM_IDLE_MS})`)
      expect(delayMs).toBeLessThan(RECLAIM_IDLE_MS / 6)
    })

    it('with an ACL user refused CLIENT (no id, no unblock), close() waits for the blocked read to end, and what is published after it reaches the live sibling at once', async ({ annotate }) => {
      const server = await ownServer()
      await server.cli('ACL', 'SETUSER', 'app', 'on', '>app-pw', '~*', '&*', '+@all', '-client')
      const url = server.url.replace('redis://', 'redis://app:app-pw@')
      const BLOCK_MS = 1_000
      const RECLAIM_IDLE_MS = 3_000
      const options = { url, keyPrefix: uniquePrefix('close-acl'), blockMs: BLOCK_MS, reclaimIdleMs: RECLAIM_IDLE_MS, reclaimIntervalMs: 500 }
      const delayMs = await deliveryAfterSiblingClose(open, options, RECLAIM_IDLE_MS * 2)
      await annotate(`without CLIENT: delivered ${delayMs.toFixed(0)} ms after the publish that followed a sibling's close`)
      expect(delayMs).toBeLessThan(RECLAIM_IDLE_MS / 6)
    })

    it('close() of a consumer at maxInFlight, its reader waiting for room, resolves at once and leaves the events it never handed out to a sibling', async () => {
      const prefix = uniquePrefix('close-full')
      const closing = open({ keyPrefix: prefix, blockMs: 30_000, maxInFlight: 1 })
      const held = new Inbox(() => {}) // never settles
      await closing.subscribe('jobs', held.cb, { group: 'workers' })
      const publisher = open({ keyPrefix: prefix })
      await publisher.publish('jobs', ev(1))
      await held.count(1)
      await publisher.publish('jobs', ev(2))
      await sleep(200) // the reader waits for a place; event 2 stays in the stream
      const started = performance.now()
      await closing.close()
      expect(performance.now() - started).toBeLessThan(1_000)
      const sibling = new Inbox()
      await open({ keyPrefix: prefix }).subscribe('jobs', sibling.cb, { group: 'workers' })
      await sibling.count(1, 2_000)
      expect(sibling.numbers).toEqual([2])
    })

    it('close() while publishes run on it and on a sibling settles everything: its own later publishes reject with ERR_LEASE_CLOSED, and every event written reaches a consumer at once', async () => {
      const prefix = uniquePrefix('close-concurrent')
      const options = { keyPrefix: prefix, blockMs: 30_000, reclaimIdleMs: 60_000 }
      const closing = open(options)
      const sibling = open(options)
      const received = new Map<number, string>()
      const taker = (who: string) => (event: Event, ack?: () => Promise<void>) => {
        received.set(numberOf(event), who)
        return ack?.()
      }
      await closing.subscribe('jobs', taker('closing'), { group: 'workers' })
      await sibling.subscribe('jobs', taker('sibling'), { group: 'workers' })
      await closing.subscribe('news', new Inbox().cb)
      await sleep(200) // both readers blocked
      const outcomes: Array<{ n: number; on: 'closing' | 'sibling'; settled: Promise<PromiseSettledResult<void>> }> = []
      let n = 0
      let closed: Promise<PromiseSettledResult<void>> | undefined
      for (let turn = 0; turn < 40; turn++) {
        for (const [on, pubsub] of [['closing', closing], ['sibling', sibling]] as const) {
          for (let k = 0; k < 5; k++) {
            const number = ++n
            outcomes.push({ n: number, on, settled: settleWithin(pubsub.publish('jobs', ev(number)), 5_000) })
          }
        }
        if (turn === 20) closed = settleWithin(closing.close(), 5_000)
        await sleep(2)
      }
      expect((await closed!).status).toBe('fulfilled')
      const settled = await Promise.all(outcomes.map(async (o) => ({ ...o, result: await o.settled })))
      const written = settled.filter((o) => o.result.status === 'fulfilled').map((o) => o.n)
      const refused = settled.filter((o) => o.result.status === 'rejected')
      expect(refused.length).toBeGreaterThan(0)
      expect(refused.every((o) => o.on === 'closing')).toBe(true)
      for (const o of refused) if (o.result.status === 'rejected') expect(errorCode(o.result.reason)).toBe('ERR_LEASE_CLOSED')
      const deadline = Date.now() + 2_000
      while (written.some((w) => !received.has(w)) && Date.now() < deadline) await sleep(20)
      expect(written.filter((w) => !received.has(w)), 'events written but delivered to nobody within 2 s').toEqual([])
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
})
