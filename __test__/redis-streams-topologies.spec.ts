// RedisStreamsPubSub beyond one server. On a local Redis Cluster (3 masters, 3 replicas) each
// topic is its own stream key, so topics spread over the masters: groups, fan-out, deliveries
// held until settled (Mastra's own PullTransport too), reclaim and clearTopic work on every
// node, blocking reads never hold up lease calls, and delivery resumes after a master dies.
// Behind Sentinel, subscriptions follow the master through a failover.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import type { Event } from '@mastra/core/events'
import { PullTransport } from '@mastra/core/worker'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub, type RedisStreamsPubSubOptions } from '../dist/esm/index.js'
import { EXTERNAL_REDIS } from './helpers/redis-server.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { startSentinel } from './helpers/redis-sentinel.js'
import { ev, Inbox, numberOf, sleep, uniquePrefix } from './helpers/streams.js'
import { deliveryAfterSiblingClose, pendingCount, streamsSuite } from './helpers/streams-suite.js'

const opened: RedisStreamsPubSub[] = []
afterEach(async () => {
  await Promise.allSettled(opened.splice(0).map((p) => p.close()))
})
const { holdingChild } = streamsSuite(() => {
  throw new Error('these suites open their pubsubs on a cluster or behind Sentinel')
})

/** Per topic, the numbers delivered, in delivery order. */
function byTopic(events: Event[], topicOf: (e: Event) => string): Map<string, number[]> {
  const out = new Map<string, number[]>()
  for (const e of events) out.set(topicOf(e), [...(out.get(topicOf(e)) ?? []), numberOf(e)])
  return out
}

/**
 * A group and a fan-out subscriber of topic `jobs` and a publisher, on `where`; `failover()`
 * (answering its ms) runs once both got an event. Then publishes (again while the client still
 * learns the new master, a coded rejection each time) until one lands, and waits for both
 * subscribers to get it. Answers the figures to report.
 */
async function throughFailover(where: RedisStreamsPubSubOptions, failover: () => Promise<number>): Promise<string> {
  const options = { ...where, blockMs: 200, commandTimeoutMs: 1_000 }
  const consumer = new RedisStreamsPubSub(options)
  const publisher = new RedisStreamsPubSub(options)
  opened.push(consumer, publisher)
  const [grouped, fanned] = [new Inbox(), new Inbox()]
  await consumer.subscribe('jobs', grouped.cb, { group: 'workers' })
  await consumer.subscribe('jobs', fanned.cb)
  await publisher.publish('jobs', ev(0))
  await grouped.count(1)
  await fanned.count(1)
  const failoverMs = await failover()
  const startedAt = performance.now()
  let published = false
  while (!published) {
    published = await publisher.publish('jobs', ev(1)).then(
      () => true,
      (err: { code?: string }) => {
        expect(['ERR_LEASE_CONNECTION', 'ERR_LEASE_TIMEOUT']).toContain(err.code)
        return false
      },
    )
    if (performance.now() - startedAt > 10_000) throw new Error('no publish succeeded within 10 s of the failover')
  }
  const publishedMs = performance.now() - startedAt
  await grouped.until((events) => events.some((e) => numberOf(e) === 1), 10_000, 'the group delivery after the failover')
  await fanned.until((events) => events.some((e) => numberOf(e) === 1), 10_000, 'the fan-out delivery after the failover')
  const deliveredMs = performance.now() - startedAt
  return `${failoverMs.toFixed(0)} ms; first publish after it took ${publishedMs.toFixed(0)} ms, delivered to group and fan-out by ${deliveredMs.toFixed(0)} ms`
}

describe.skipIf(EXTERNAL_REDIS)('RedisStreamsPubSub on a Redis Cluster', () => {
  let cluster: RedisCluster
  beforeAll(async () => {
    cluster = await startCluster()
  })
  afterAll(async () => {
    await cluster?.stop()
  })
  const open = (options: RedisStreamsPubSubOptions = {}) => {
    const pubsub = new RedisStreamsPubSub({ cluster: { nodes: cluster.urls }, ...options })
    opened.push(pubsub)
    return pubsub
  }
  /** The master serving a topic's stream. */
  const nodeOf = async (prefix: string, topic: string) => cluster.masterOfSlot(await cluster.keySlot(`${prefix}:${topic}`))

  it("30 topics spread over every master: each event reaches the fan-out subscriber and exactly one of the group's consumers, in order per topic", async () => {
    const prefix = uniquePrefix('spread')
    const topics = Array.from({ length: 30 }, (_, i) => `topic-${i}`)
    const nodes = new Set(await Promise.all(topics.map((t) => nodeOf(prefix, t))))
    expect(nodes.size).toBe(3)
    const [a, b, fan] = [open({ keyPrefix: prefix }), open({ keyPrefix: prefix }), open({ keyPrefix: prefix })]
    const [groupA, groupB, fanned] = [new Inbox(), new Inbox(), new Inbox()]
    for (const topic of topics) {
      await a.subscribe(topic, groupA.cb, { group: 'workers' })
      await b.subscribe(topic, groupB.cb, { group: 'workers' })
      await fan.subscribe(topic, fanned.cb)
    }
    const publisher = open({ keyPrefix: prefix })
    for (let n = 0; n < 10; n++) await Promise.all(topics.map((t) => publisher.publish(t, { ...ev(n), runId: t })))
    await fanned.count(300, 15_000)
    await groupA.until((_) => groupA.events.length + groupB.events.length >= 300, 15_000, '300 group deliveries')
    await sleep(300)
    const grouped = [...groupA.events, ...groupB.events].map((e) => `${e.runId}/${numberOf(e)}`)
    expect(new Set(grouped).size).toBe(300)
    expect(grouped).toHaveLength(300)
    expect(groupA.events.length * groupB.events.length).toBeGreaterThan(0)
    for (const [topic, numbers] of byTopic(fanned.events, (e) => e.runId)) expect(numbers, topic).toEqual([...Array(10).keys()])
  })

  it('with streamIdleTtlMs, publishes of one turn to topics on every master resolve with their ids, each stream holds its events once and expires, and a group made on a fresh topic expires too', async () => {
    const prefix = uniquePrefix('idle-ttl')
    const topics = Array.from({ length: 12 }, (_, i) => `ttl-${i}`)
    expect(new Set(await Promise.all(topics.map((t) => nodeOf(prefix, t)))).size).toBe(3)
    const pubsub = open({ keyPrefix: prefix, streamIdleTtlMs: 60_000 })
    const grouped = new Inbox()
    await pubsub.subscribe('fresh', grouped.cb, { group: 'workers' })
    const fresh = await nodeOf(prefix, 'fresh')
    expect(Number(await fresh.cli('PTTL', `${prefix}:fresh`))).toBeGreaterThan(0)
    // A turn's publishes: one pipeline per slot, each event in its own MULTI with its PEXPIRE.
    await Promise.all(topics.map((t, n) => pubsub.publish(t, { ...ev(n), runId: t })))
    await Promise.all(topics.map((t) => pubsub.publish(t, { ...ev(100), runId: t })))
    for (const topic of topics) {
      const node = await nodeOf(prefix, topic)
      expect(Number(await node.cli('XLEN', `${prefix}:${topic}`)), topic).toBe(2)
      const ttl = Number(await node.cli('PTTL', `${prefix}:${topic}`))
      expect(ttl, topic).toBeGreaterThan(50_000)
      expect(ttl, topic).toBeLessThanOrEqual(60_000)
    }
    await pubsub.publish('fresh', ev(1))
    await grouped.count(1)
  })

  /** One topic per master. */
  async function topicsOnEveryMaster(prefix: string): Promise<string[]> {
    const topics: string[] = []
    const seen = new Set<unknown>()
    for (let i = 0; topics.length < 3; i++) {
      const node = await nodeOf(prefix, `jobs-${i}`)
      if (!seen.has(node)) (seen.add(node), topics.push(`jobs-${i}`))
    }
    return topics
  }

  it('deliveries held past reclaimIdleMs on every master stay claimed: no sibling gets them, and the late acks settle them', async () => {
    const prefix = uniquePrefix('held')
    const topics = await topicsOnEveryMaster(prefix)
    const tuning = { keyPrefix: prefix, reclaimIdleMs: 300, reclaimIntervalMs: 100, blockMs: 100 }
    const holder = open(tuning)
    const acks: Array<() => Promise<void>> = []
    const returnsAtOnce = new Inbox((_event, ack) => void acks.push(ack))
    for (const t of topics) await holder.subscribe(t, returnsAtOnce.cb, { group: 'workers' })
    const publisher = open({ keyPrefix: prefix })
    await Promise.all(topics.map((t, i) => publisher.publish(t, ev(i))))
    await returnsAtOnce.count(3)
    const sibling = new Inbox()
    const siblingPubsub = open(tuning)
    for (const t of topics) await siblingPubsub.subscribe(t, sibling.cb, { group: 'workers' })
    await sleep(1_500) // five times reclaimIdleMs
    expect(sibling.events).toEqual([])
    for (const t of topics) expect(await pendingCount(await nodeOf(prefix, t), `${prefix}:${t}`, 'workers')).toBe(1)
    await Promise.all(acks.map((ack) => ack()))
    for (const t of topics) expect(await pendingCount(await nodeOf(prefix, t), `${prefix}:${t}`, 'workers')).toBe(0)
    await sleep(300)
    expect(sibling.events).toEqual([])
  })

  it('consumers killed holding events on three masters: a live consumer reclaims each of them', async () => {
    const prefix = uniquePrefix('reclaim')
    const topics = await topicsOnEveryMaster(prefix)
    const holders = topics.map((topic) =>
      holdingChild({ keyPrefix: prefix, topic, group: 'workers', options: { cluster: { nodes: cluster.urls } } }),
    )
    await Promise.all(holders.map((h) => h.line('ready', 15_000)))
    const publisher = open({ keyPrefix: prefix })
    await Promise.all(topics.map((t, i) => publisher.publish(t, ev(i))))
    await Promise.all(holders.map((h) => h.line('event', 5_000)))
    await Promise.all(holders.map((h) => h.kill()))
    for (const t of topics) expect(await pendingCount(await nodeOf(prefix, t), `${prefix}:${t}`, 'workers')).toBe(1)

    const survivor = open({ keyPrefix: prefix, reclaimIdleMs: 500, reclaimIntervalMs: 100 })
    const inbox = new Inbox()
    for (const t of topics) await survivor.subscribe(t, inbox.cb, { group: 'workers' })
    await inbox.count(3, 10_000)
    expect(inbox.numbers.sort()).toEqual([0, 1, 2])
    await sleep(300)
    for (const t of topics) expect(await pendingCount(await nodeOf(prefix, t), `${prefix}:${t}`, 'workers')).toBe(0)
  })

  it("Mastra's node-redis shape, { rootNodes: [{ url }], defaults: { username, password } }, publishes, delivers and leases as that user", async () => {
    const user = `mastra-${uniquePrefix('').slice(-8).replace(/\W/g, '')}`
    for (const node of cluster.nodes) await node.cli('ACL', 'SETUSER', user, 'on', '>shape-secret', '~*', '&*', '+@all')
    const prefix = uniquePrefix('shape')
    const mastraShaped = { rootNodes: cluster.urls.map((url) => ({ url })), defaults: { username: user, password: 'shape-secret' } }
    const topics = await topicsOnEveryMaster(prefix)
    const [consumer, publisher] = [0, 1].map(() => {
      const pubsub = new RedisStreamsPubSub({ cluster: mastraShaped, keyPrefix: prefix })
      opened.push(pubsub)
      return pubsub
    }) as [RedisStreamsPubSub, RedisStreamsPubSub]
    const [grouped, fanned] = [new Inbox(), new Inbox()]
    for (const t of topics) {
      await consumer.subscribe(t, grouped.cb, { group: 'workers' })
      await consumer.subscribe(t, fanned.cb)
    }
    await Promise.all(topics.map((t, i) => publisher.publish(t, ev(i))))
    await grouped.count(3)
    await fanned.count(3)
    expect(grouped.numbers.sort()).toEqual([0, 1, 2])
    expect(fanned.numbers.sort()).toEqual([0, 1, 2])
    // Each ack leaves as its callback returns, unawaited: the first opens the connection acks
    // take (on Node's loop, to each master), so it lands a moment after the delivery.
    for (const t of topics) {
      await expect.poll(async () => pendingCount(await nodeOf(prefix, t), `${prefix}:${t}`, 'workers'), { timeout: 2_000 }).toBe(0)
    }

    expect(await publisher.acquireLease('thread', 'A', 10_000)).toMatchObject({ acquired: true, owner: 'A' })
    expect(await consumer.acquireLease('thread', 'B', 10_000)).toEqual({ acquired: false, owner: 'A' })
    expect(await consumer.getLeaseOwner('thread')).toBe('A')
    expect(await publisher.transferLease('thread', 'A', 'B', 10_000)).toBe(true)
    expect(await consumer.renewLease('thread', 'B', 10_000)).toBe(true)
    await consumer.releaseLease('thread', 'B')
    expect(await publisher.getLeaseOwner('thread')).toBeUndefined()
    const leaseNode = await nodeOf(prefix, 'lease:thread')
    expect(String(await leaseNode.cli('CLIENT', 'LIST')), 'connected as the defaults user').toContain(`user=${user} `)
  })

  it("clearTopic deletes a topic's stream on its node; its subscribers get what is published after (the group made again)", async () => {
    const prefix = uniquePrefix('clear')
    const pubsub = open({ keyPrefix: prefix, blockMs: 200 })
    const [grouped, fanned] = [new Inbox(), new Inbox()]
    await pubsub.subscribe('jobs', grouped.cb, { group: 'workers' })
    await pubsub.subscribe('jobs', fanned.cb)
    await pubsub.publish('jobs', ev(1))
    await grouped.count(1)
    await fanned.count(1)
    await pubsub.clearTopic('jobs')
    const node = await nodeOf(prefix, 'jobs')
    // The stream is gone, or at most made again, empty, by the group's recovery: the deletion
    // ends the group's blocked read, which starts it at once.
    expect(await node.cli('XLEN', `${prefix}:jobs`)).toBe(0)
    await pubsub.publish('jobs', ev(2))
    await grouped.count(2, 5_000)
    await fanned.count(2, 5_000)
    expect(grouped.numbers).toEqual([1, 2])
    expect(fanned.numbers).toEqual([1, 2])
  })

  it('blocking reads on every master never hold up lease calls on the same pubsub', async () => {
    const prefix = uniquePrefix('block')
    const BLOCK_MS = 2_000
    const pubsub = open({ keyPrefix: prefix, blockMs: BLOCK_MS })
    const inbox = new Inbox()
    for (let i = 0; i < 20; i++) {
      await pubsub.subscribe(`quiet-${i}`, inbox.cb, { group: 'workers' })
      await pubsub.subscribe(`quiet-fan-${i}`, inbox.cb)
    }
    await sleep(300) // every reader now blocks on its node
    let slowest = 0
    for (let i = 0; i < 100; i++) {
      const started = performance.now()
      await pubsub.acquireLease(`thread-${i}`, 'owner', 10_000)
      await pubsub.getLeaseOwner(`thread-${i}`)
      slowest = Math.max(slowest, performance.now() - started)
    }
    expect(slowest).toBeLessThan(BLOCK_MS / 4)
    expect(inbox.events).toEqual([])
  })

  it("an event published right after a group sibling's close() reaches the live sibling at once, not at the reclaim after reclaimIdleMs", async ({ annotate }) => {
    const RECLAIM_IDLE_MS = 3_000
    const options = { keyPrefix: uniquePrefix('close-sibling'), blockMs: 30_000, reclaimIdleMs: RECLAIM_IDLE_MS, reclaimIntervalMs: 500 }
    const delayMs = await deliveryAfterSiblingClose(open, options, RECLAIM_IDLE_MS * 2)
    await annotate(`cluster: delivered ${delayMs.toFixed(0)} ms after the publish that followed a sibling's close (reclaimIdleMs ${RECLAIM_IDLE_MS})`)
    expect(delayMs).toBeLessThan(RECLAIM_IDLE_MS / 6)
  })

  it("Mastra's PullTransport, two consumers of one group: each job whose step acks 3 × reclaimIdleMs after its callback returned is handled exactly once", async () => {
    const prefix = uniquePrefix('pull-transport')
    const tuning = { keyPrefix: prefix, reclaimIdleMs: 300, reclaimIntervalMs: 100, blockMs: 100, maxInFlight: 5 }
    const handled = new Map<number, number[]>()
    const transports: PullTransport[] = []
    try {
      for (let c = 0; c < 2; c++) {
        const transport = new PullTransport({ pubsub: open(tuning), group: 'mastra-orchestration' })
        transports.push(transport)
        await transport.start({
          route: async (event: Event, ack?: () => Promise<void>) => {
            handled.set(numberOf(event), [...(handled.get(numberOf(event)) ?? []), c])
            await sleep(900)
            await ack?.()
          },
        })
      }
      const publisher = open({ keyPrefix: prefix })
      await Promise.all(Array.from({ length: 20 }, (_, i) => publisher.publish('workflows', ev(i + 1))))
      const node = await nodeOf(prefix, 'workflows')
      const deadline = Date.now() + 20_000
      while ((handled.size < 20 || (await pendingCount(node, `${prefix}:workflows`, 'mastra-orchestration')) > 0) && Date.now() < deadline) await sleep(50)
      await sleep(1_200) // four reclaim idle periods: time for any second hand-out
      expect([...handled.keys()].sort((a, b) => a - b)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1))
      expect([...handled].filter(([, by]) => by.length > 1)).toEqual([])
      expect(new Set([...handled.values()].flat()).size, 'both consumers took jobs').toBe(2)
      expect(await pendingCount(node, `${prefix}:workflows`, 'mastra-orchestration')).toBe(0)
    } finally {
      await Promise.allSettled(transports.map((t) => t.stop({ drainTimeout: 0 })))
    }
  })

  it('a master killed: publishing and both kinds of delivery resume once its replica is promoted', async ({ annotate }) => {
    const own = await startCluster()
    try {
      const prefix = uniquePrefix('promote')
      const victim = await own.masterOfSlot(await own.keySlot(`${prefix}:jobs`))
      const figures = await throughFailover({ cluster: { nodes: own.urls }, keyPrefix: prefix }, () => own.killMasterAndWaitForPromotion(victim))
      await annotate(`streams on a cluster: promoted in ${figures}`)
    } finally {
      await own.stop()
    }
  })
})

describe.skipIf(EXTERNAL_REDIS)('RedisStreamsPubSub behind Redis Sentinel', () => {
  it('the master killed: subscriptions follow the new master, and what is published after reaches group and fan-out subscribers', async ({ annotate }) => {
    const sentinel = await startSentinel()
    try {
      const sentinel_ = { nodes: sentinel.sentinelUrls, masterName: sentinel.masterName }
      const figures = await throughFailover({ sentinel: sentinel_, keyPrefix: uniquePrefix('sentinel') }, () => sentinel.killMasterAndWaitForFailover())
      await annotate(`streams behind Sentinel: failover in ${figures}`)
    } finally {
      await sentinel.stop()
    }
  })
})
