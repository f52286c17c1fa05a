// How many Redis connections RedisStreamsPubSub holds. Mastra opens subscriptions per run
// (workflow watchers, abort listeners, thread streams), so they must not each cost a
// connection: fan-out subscriptions of every topic share one reader, a consumer group is one
// reader per topic and group, the transport's own commands (creating groups, reclaims,
// trims) go on one more, and publishes, acks, nacks and lease calls on two of their own, on
// Node's loop, each opened by its first call (a lease key's calls go on one of them; on one
// server at a redis:// URL; elsewhere they all share the transport's one). Counted with
// CLIENT LIST on a server of each test's own, by the connection name.
import { randomUUID } from 'node:crypto'

import { afterEach, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub, type RedisStreamsPubSubOptions } from '../dist/esm/index.js'
import { monitor, startRedis, type RedisServer } from './helpers/redis-server.js'
import { ev, Inbox, sleep } from './helpers/streams.js'

const servers: RedisServer[] = []
const opened: RedisStreamsPubSub[] = []

afterEach(async () => {
  await Promise.allSettled(opened.splice(0).map((p) => p.close()))
  await Promise.allSettled(servers.splice(0).map((s) => s.stop()))
})

async function server(): Promise<RedisServer> {
  const started = await startRedis()
  servers.push(started)
  return started
}

/** A pubsub whose connections are named `name`. */
function open(on: RedisServer, name: string, options: RedisStreamsPubSubOptions = {}): RedisStreamsPubSub {
  const pubsub = new RedisStreamsPubSub({ url: on.url, connectionName: name, keyPrefix: name, blockMs: 200, ...options })
  opened.push(pubsub)
  return pubsub
}

/** The connections named `name`, from CLIENT LIST. */
async function connections(on: RedisServer, name: string): Promise<number> {
  const list = String(await on.cli('CLIENT', 'LIST'))
  return list.split('\n').filter((line) => line.includes(` name=${name} `)).length
}

/** Waits until the connections named `name` number `count`; answers the last count seen. */
async function settleAt(on: RedisServer, name: string, count: number, ms = 2_000): Promise<number> {
  const deadline = Date.now() + ms
  let seen = await connections(on, name)
  while (seen !== count && Date.now() < deadline) {
    await sleep(20)
    seen = await connections(on, name)
  }
  return seen
}

const uniqueName = () => `ml-${randomUUID().slice(0, 8)}`

/** The connection publishes and lease calls add once made: their own on Node's loop, on one server at a redis:// or rediss:// URL. */
const loopConnection = (on: RedisServer) => (/^rediss?:\/\//.test(on.url) ? 1 : 0)
/** Lease calls on many keys: spread over two connections of their own by key, where they have their own. */
const leaseCallsOnManyKeys = (pubsub: RedisStreamsPubSub) => Promise.all(Array.from({ length: 16 }, (_, i) => pubsub.getLeaseOwner(`thread-${i}`)))

describe('connections of RedisStreamsPubSub', () => {
  it('200 fan-out subscriptions over 20 topics, and 5 consumer groups, hold 7 connections: one shared, one fan-out reader, one per group (within the documented 25); publishes and lease calls add their own', async () => {
    const redis = await server()
    const name = uniqueName()
    const pubsub = open(redis, name)
    const inboxes: Inbox[] = []
    for (let topic = 0; topic < 20; topic++) {
      for (let k = 0; k < 10; k++) {
        const inbox = new Inbox()
        inboxes.push(inbox)
        await pubsub.subscribe(`topic-${topic}`, inbox.cb)
      }
    }
    expect(await settleAt(redis, name, 2)).toBe(2)
    const workers = [0, 1, 2, 3, 4].map(() => new Inbox())
    for (const [i, inbox] of workers.entries()) await pubsub.subscribe(`jobs-${i}`, inbox.cb, { group: 'workers' })
    // A second subscription of a group this process already reads shares its consumer.
    await pubsub.subscribe('jobs-0', new Inbox().cb, { group: 'workers' })
    expect(await settleAt(redis, name, 7)).toBe(7)
    // And every one of them is served: an event on each topic reaches its ten subscribers.
    await Promise.all(Array.from({ length: 20 }, (_, topic) => pubsub.publish(`topic-${topic}`, ev(topic))))
    await Promise.all(inboxes.map((inbox) => inbox.count(1)))
    expect(inboxes.every((inbox) => inbox.events.length === 1)).toBe(true)
    expect(await settleAt(redis, name, 7 + loopConnection(redis))).toBe(7 + loopConnection(redis))
    await pubsub.acquireLease('thread', 'run', 10_000)
    expect(await settleAt(redis, name, 7 + loopConnection(redis))).toBe(7 + loopConnection(redis))
    // On many keys, lease calls open a second, and no more.
    await leaseCallsOnManyKeys(pubsub)
    await leaseCallsOnManyKeys(pubsub)
    expect(await settleAt(redis, name, 7 + 2 * loopConnection(redis))).toBe(7 + 2 * loopConnection(redis))
  })

  it('unsubscribing the last callback of a topic stops reading it; the last fan-out subscription gone, its reader closes its connection', async () => {
    const redis = await server()
    const name = uniqueName()
    const pubsub = open(redis, name)
    const a = [new Inbox(), new Inbox()]
    const b = new Inbox()
    for (const inbox of a) await pubsub.subscribe('a', inbox.cb)
    await pubsub.subscribe('b', b.cb)
    const readsBoth = await monitor(redis, 500)
    expect(readsBoth.some((line) => /"XREAD".*"STREAMS" "\S+:a" "\S+:b"|"XREAD".*"STREAMS" "\S+:b" "\S+:a"/.test(line))).toBe(true)

    await pubsub.unsubscribe('a', a[0]!.cb)
    await pubsub.unsubscribe('a', a[1]!.cb)
    await sleep(300) // the read in flight ends
    const readsB = (await monitor(redis, 500)).filter((line) => line.includes('"XREAD"'))
    expect(readsB.length).toBeGreaterThan(0)
    expect(readsB.every((line) => !line.includes(`"${name}:a"`))).toBe(true)

    await pubsub.unsubscribe('b', b.cb)
    expect(await settleAt(redis, name, 1)).toBe(1)
    await pubsub.publish('a', ev(1))
    await sleep(300)
    expect([...a, b].every((inbox) => inbox.events.length === 0)).toBe(true)
  })

  it("unsubscribing a group's last callback on a topic closes that group's reader", async () => {
    const redis = await server()
    const name = uniqueName()
    const pubsub = open(redis, name)
    const first = new Inbox()
    const second = new Inbox()
    await pubsub.subscribe('jobs', first.cb, { group: 'workers' })
    await pubsub.subscribe('jobs', second.cb, { group: 'workers' })
    expect(await settleAt(redis, name, 2)).toBe(2)
    await pubsub.unsubscribe('jobs', first.cb)
    await pubsub.publish('jobs', ev(1))
    await second.count(1)
    expect(await settleAt(redis, name, 2 + loopConnection(redis))).toBe(2 + loopConnection(redis))
    await pubsub.unsubscribe('jobs', second.cb)
    expect(await settleAt(redis, name, 1 + loopConnection(redis))).toBe(1 + loopConnection(redis))
  })

  it('close() has closed every connection when it resolves: shared, fan-out reader, group readers, lease calls’', async () => {
    const redis = await server()
    const name = uniqueName()
    const pubsub = open(redis, name)
    await pubsub.subscribe('a', new Inbox().cb)
    await pubsub.subscribe('jobs', new Inbox().cb, { group: 'workers' })
    await pubsub.subscribe('jobs', new Inbox().cb, { group: 'others' })
    await pubsub.acquireLease('thread', 'run', 10_000)
    await leaseCallsOnManyKeys(pubsub)
    expect(await settleAt(redis, name, 4 + 2 * loopConnection(redis))).toBe(4 + 2 * loopConnection(redis))
    await pubsub.close()
    // The server takes a moment to notice a closed socket; nothing is open on our side.
    expect(await settleAt(redis, name, 0, 500)).toBe(0)
  })

  it('with blockMs 30 s, close() leaves no read of its own blocked when it resolves, and none of its connections a moment later', async ({ annotate }) => {
    const redis = await server()
    const name = uniqueName()
    const pubsub = open(redis, name, { blockMs: 30_000 })
    await pubsub.subscribe('a', new Inbox().cb)
    await pubsub.subscribe('jobs', new Inbox().cb, { group: 'workers' })
    await pubsub.subscribe('jobs', new Inbox().cb, { group: 'others' })
    await pubsub.subscribe('more', new Inbox().cb, { group: 'workers' })
    await pubsub.acquireLease('thread', 'run', 10_000)
    expect(await settleAt(redis, name, 5 + loopConnection(redis))).toBe(5 + loopConnection(redis))
    await sleep(100) // every reader blocked
    const started = performance.now()
    await pubsub.close()
    const closeMs = performance.now() - started
    const blocked = String(await redis.cli('CLIENT', 'LIST'))
      .split('\n')
      .filter((line) => line.includes(` name=${name} `) && /flags=\S*b/.test(line))
    await annotate(`close() with 4 readers blocked for 30 s took ${closeMs.toFixed(0)} ms`)
    expect(blocked).toEqual([])
    expect(closeMs).toBeLessThan(1_000)
    expect(await settleAt(redis, name, 0, 500)).toBe(0)
  })

  it('an ACL user without CLIENT (no name, no id, no unblock) gets every event all the same; a topic added is read within blockMs', async () => {
    const redis = await server()
    await redis.cli('ACL', 'SETUSER', 'app', 'on', '>app-pw', '~*', '&*', '+@all', '-client')
    const url = redis.url.replace('redis://', 'redis://app:app-pw@')
    const pubsub = new RedisStreamsPubSub({ url, keyPrefix: uniqueName(), blockMs: 200 })
    opened.push(pubsub)
    const a = new Inbox()
    const b = new Inbox()
    await pubsub.subscribe('a', a.cb)
    await pubsub.publish('a', ev(1))
    await a.count(1)
    await pubsub.subscribe('b', b.cb)
    await pubsub.subscribe('jobs', a.cb, { group: 'workers' })
    await pubsub.publish('b', ev(2))
    await pubsub.publish('jobs', ev(3))
    await b.count(1, 2_000)
    await a.count(2, 2_000)
    const denied = ((await redis.cli('ACL', 'LOG')) as unknown[][]).map((entry) => String(entry[entry.indexOf('object') + 1]))
    // Besides, on a server that has it (Redis 7.2 and later, Valkey), the CLIENT SETINFO
    // redis-rs sends as it connects, its answer ignored.
    expect(new Set(denied.filter((object) => object !== 'client|setinfo'))).toEqual(new Set(['client|setname', 'client|id']))
  })

  it('lease calls and publishes never wait behind a blocking read', async () => {
    const redis = await server()
    const name = uniqueName()
    const pubsub = open(redis, name, { blockMs: 5_000 })
    await pubsub.subscribe('quiet', new Inbox().cb)
    await pubsub.subscribe('jobs', new Inbox().cb, { group: 'workers' })
    await sleep(100) // both readers are now blocked for up to 5 s
    const started = Date.now()
    await pubsub.acquireLease('thread', 'run', 10_000)
    await pubsub.publish('elsewhere', ev(1))
    expect(Date.now() - started).toBeLessThan(500)
  })
})
