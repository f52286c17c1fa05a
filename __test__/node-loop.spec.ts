// Where lease calls to one server run, a RedisLeaseProvider's and RedisStreamsPubSub's: on
// Node's own event loop, written and answered on Node's thread, as node-redis does, so a call
// wakes no other thread of this process (docs/benchmarks.md: two thread wake-ups per call were
// most of what a call cost).
// So are calls over TLS (rediss://: tls.spec.ts has them on this loop too), calls to the
// master behind Sentinel (the sentinels asked on the runtime, the master's link on the loop),
// and calls on a Cluster (each to its slot's master over a link on the loop; redis-rs' cluster
// connection, on the runtime, reads the slot map and takes what the cluster moved). At a unix
// socket and on runtimes without Node's libuv, the runtime's thread does the I/O as before;
// the Bun and Deno suites cover that path.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisLeaseProvider, RedisStreamsPubSub } from '../dist/esm/index.js'
import { expectRejection } from './helpers/lease.js'
import { closing, leaseSuite, RUN, stopLater } from './helpers/lease-runs.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { until } from './helpers/redis-process.js'
import { startSentinel, type RedisSentinel } from './helpers/redis-sentinel.js'
import { monitor, startRedis, type RedisServer } from './helpers/redis-server.js'
import { runtimeThreadSwitches, switchesOver2000Calls } from './helpers/runtime-thread.js'
import { ev, Inbox } from './helpers/streams.js'

leaseSuite()

let server: RedisServer
beforeAll(async () => {
  server = stopLater(await startRedis())
})

type Leases = Pick<RedisLeaseProvider, 'acquireLease' | 'renewLease' | 'getLeaseOwner' | 'releaseLease' | 'transferLease'>
type Deployment = Pick<ConstructorParameters<typeof RedisLeaseProvider>[0] & {}, 'url' | 'sentinel' | 'cluster' | 'commandTimeoutMs'>

/** Both classes on a deployment (read when a test opens one), each closed after the test. */
function bothClasses(deployment: () => Deployment): [string, (keyPrefix: string, commandTimeoutMs?: number) => Leases][] {
  return [
    ['RedisLeaseProvider', (keyPrefix, commandTimeoutMs) => closing(new RedisLeaseProvider({ ...deployment(), keyPrefix, commandTimeoutMs }))],
    ['RedisStreamsPubSub', (keyPrefix, commandTimeoutMs) => closing(new RedisStreamsPubSub({ ...deployment(), keyPrefix, commandTimeoutMs }))],
  ]
}

/**
 * A master frozen (SIGSTOP) for less than failure detection takes: several calls of one owner
 * in one turn, a renewal and a fresh acquire, each reject ERR_LEASE_TIMEOUT within the call's
 * bound, none answering false; once it is thawed the lease held before answers as before.
 * `meanwhile`, run while it is frozen, is what must keep answering.
 */
async function throughAFrozenMaster(leases: Leases, key: string, master: { freeze(): void; thaw(): void }, meanwhile: () => Promise<void> = async () => {}) {
  expect(await leases.acquireLease(key, 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
  master.freeze()
  try {
    const started = performance.now()
    await Promise.all([
      expectRejection(() => leases.renewLease(key, 'a', 60_000), Error, 'ERR_LEASE_TIMEOUT'),
      expectRejection(() => leases.acquireLease(`${key}-fresh`, 'a', 60_000), Error, 'ERR_LEASE_TIMEOUT'),
      expectRejection(() => leases.getLeaseOwner(key), Error, 'ERR_LEASE_TIMEOUT'),
      meanwhile(),
    ])
    expect(performance.now() - started).toBeLessThan(FROZEN_CALL_TIMEOUT_MS + 400)
  } finally {
    master.thaw()
  }
  expect(await leases.renewLease(key, 'a', 60_000)).toBe(true)
  expect(await leases.getLeaseOwner(key)).toBe('a')
  expect(await leases.transferLease(key, 'a', 'b', 60_000)).toBe(true)
}
/** Well under the 1 s in which the test deployments' failure detection starts. */
const FROZEN_CALL_TIMEOUT_MS = 250
const opening = bothClasses(() => ({ url: server.url }))

describe('lease calls to one server on Node’s own loop', () => {
  it.for(opening)('%s: 2,000 calls one after another wake the runtime’s thread fewer than 200 times (it did twice per call)', async ([kind, open], { skip }) => {
    skip(!/^rediss?:\/\//.test(server.url), 'a unix-socket REDIS_URL keeps the runtime’s thread doing the I/O')
    const woken = await switchesOver2000Calls(open(`node-loop:${RUN}:${kind}`))
    skip(woken === undefined, 'no /proc/self/task here: the thread’s context switches cannot be read')
    expect(woken).toBeLessThan(200)
  })

  it('RedisStreamsPubSub’s publishes, acks and lease calls share one connection on Node’s loop, named alike, beside the transport’s own and its reader; close() closes them all', async ({ skip }) => {
    skip(!/^rediss?:\/\//.test(server.url), 'a unix-socket REDIS_URL keeps every call on the transport’s connection')
    const name = `node-loop-streams-${RUN}`
    const pubsub = new RedisStreamsPubSub({ url: server.url, keyPrefix: `node-loop-streams:${RUN}`, connectionName: name })
    const named = async () => String(await server.cli('CLIENT', 'LIST')).split('\n').filter((line) => line.includes(` name=${name} `))
    try {
      await pubsub.publish('topic', { type: 't', runId: 'r', data: {} })
      await expect.poll(named, { timeout: 2_000 }).toHaveLength(1)
      expect(await pubsub.acquireLease('k', 'owner', 10_000)).toEqual({ acquired: true, owner: 'owner' })
      await pubsub.publish('topic', { type: 't', runId: 'r', data: {} })
      expect(await named()).toHaveLength(1)
      // A group: the transport's own connection creates it, a reader of its own reads it.
      const acked = new Promise<void>((resolve) => {
        void pubsub.subscribe('topic', async (_event, ack) => {
          await ack?.()
          resolve()
        }, { group: 'workers', startFrom: 'earliest' })
      })
      await acked
      await expect.poll(named, { timeout: 2_000 }).toHaveLength(3)
    } finally {
      await pubsub.close()
    }
    await expect.poll(named, { timeout: 2_000 }).toHaveLength(0)
    await expect(pubsub.acquireLease('k', 'owner', 10_000)).rejects.toMatchObject({ code: 'ERR_LEASE_CLOSED' })
  })

  it('RedisStreamsPubSub: 1,000 publishes one after another wake the runtime’s thread fewer than 200 times', async ({ skip }) => {
    skip(!/^rediss?:\/\//.test(server.url), 'a unix-socket REDIS_URL keeps the runtime’s thread doing the I/O')
    const pubsub = closing(new RedisStreamsPubSub({ url: server.url, keyPrefix: `node-loop-publish:${RUN}`, maxStreamLength: 0 }))
    await pubsub.publish('topic', { type: 't', runId: 'r', data: {} })
    const before = runtimeThreadSwitches()
    skip(before === undefined, 'no /proc/self/task here: the thread’s context switches cannot be read')
    for (let i = 0; i < 1_000; i++) await pubsub.publish('topic', { type: 't', runId: 'r', data: { i } })
    expect(runtimeThreadSwitches()! - before!).toBeLessThan(200)
    expect(await server.cli('XLEN', `node-loop-publish:${RUN}:topic`)).toBe(1_001)
  })

  it('a handler that acks its job and publishes its result in one turn, ack first: the result reaches Redis before the ack, on one connection, not the reader’s', async () => {
    const keyPrefix = `node-loop-order:${RUN}`
    const pubsub = closing(new RedisStreamsPubSub({ url: server.url, keyPrefix }))
    let handled = 0
    await pubsub.subscribe('jobs', (event, ack) => {
      // Neither awaited, as Mastra's workers do: both leave at the turn's end.
      void ack?.()
      void pubsub.publish('results', { type: 'done', runId: 'r', data: event.data })
      handled++
    }, { group: 'workers' })
    await pubsub.publish('warm', { type: 't', runId: 'r', data: {} })
    const watching = monitor(server, 1_500)
    await new Promise((resolve) => setTimeout(resolve, 200)) // MONITOR is on
    for (let n = 0; n < 5; n++) await pubsub.publish('jobs', { type: 'job', runId: 'r', data: { n } })
    await expect.poll(() => handled, { timeout: 2_000 }).toBe(5)
    const lines = await watching
    const client = (line: string) => /\[\d+ ([^\]]+)\]/.exec(line)?.[1]
    const isResult = (l: string) => l.includes('"XADD"') && l.includes(`"${keyPrefix}:results"`)
    const isAck = (l: string) => l.includes('"XACK"') && l.includes(`"${keyPrefix}:jobs"`)
    const sent = lines.filter((l) => isResult(l) || isAck(l))
    expect(sent.filter(isResult)).toHaveLength(5)
    // However a turn's calls were made, no job is acked before its result was written.
    let results = 0
    let acked = 0
    for (const line of sent) {
      if (isResult(line)) results++
      else acked += line.match(/"/g)!.length / 2 - 3 // "XACK" "key" "group" "id" ...
      expect(acked, line).toBeLessThanOrEqual(results)
    }
    expect(acked).toBe(5)
    const reads = lines.filter((l) => l.includes('"XREADGROUP"'))
    expect(reads.length).toBeGreaterThanOrEqual(1)
    expect(new Set(sent.map(client)).size).toBe(1)
    expect(reads.every((l) => client(l) !== client(sent[0]!))).toBe(true)
  })

  it('the connection given up when the server drops it is opened again by the next call, and one turn’s calls still go together in order', async ({ skip }) => {
    skip(!/^rediss?:\/\//.test(server.url), 'a unix-socket REDIS_URL keeps the runtime’s thread doing the I/O')
    const name = `node-loop-${RUN}`
    const provider = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: `node-loop-drop:${RUN}`, connectionName: name }))
    expect(await provider.acquireLease('a', 'one', 10_000)).toEqual({ acquired: true, owner: 'one' })
    expect(await server.cli('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes')).toBeGreaterThanOrEqual(1)
    // The first call after the drop may meet the broken connection; none may hang, and the
    // next turn runs on a new one.
    await Promise.allSettled([provider.getLeaseOwner('a')])
    const [renewed, owner, moved, after] = await Promise.all([
      provider.renewLease('a', 'one', 10_000),
      provider.getLeaseOwner('a'),
      provider.transferLease('a', 'one', 'two', 10_000),
      provider.getLeaseOwner('a'),
    ])
    expect({ renewed, owner, moved, after }).toEqual({ renewed: true, owner: 'one', moved: true, after: 'two' })
    // A fresh connection is named just after its first call: the old one is gone, one is left.
    const named = async () => String(await server.cli('CLIENT', 'LIST')).split('\n').filter((line) => line.includes(` name=${name} `))
    await expect.poll(named, { timeout: 2_000 }).toHaveLength(1)
  })
})

describe('lease calls behind Sentinel on Node’s own loop', () => {
  let sentinel: RedisSentinel
  beforeAll(async () => {
    sentinel = await startSentinel({ replicas: 1 })
  })
  afterAll(async () => {
    await sentinel?.stop()
  })
  const behind = bothClasses(() => ({ sentinel: { nodes: sentinel.sentinelUrls, masterName: sentinel.masterName } }))

  it.for(behind)('%s: 2,000 calls one after another wake the runtime’s thread fewer than 200 times, and the leases are in the master', async ([kind, open], { skip }) => {
    const keyPrefix = `node-loop-sentinel:${RUN}:${kind}`
    const woken = await switchesOver2000Calls(open(keyPrefix))
    skip(woken === undefined, 'no /proc/self/task here: the thread’s context switches cannot be read')
    expect(woken).toBeLessThan(200)
    expect(await (await sentinel.master()).cli('GET', `${keyPrefix}:lease:warm`)).toBe('owner')
  })

  it.for(behind)('%s: the master frozen: calls in one turn reject ERR_LEASE_TIMEOUT within their bound, never false, and answer as before once it is thawed', async ([kind, open]) => {
    const keyPrefix = `node-loop-sentinel-frozen:${RUN}:${kind}`
    await throughAFrozenMaster(open(keyPrefix, FROZEN_CALL_TIMEOUT_MS), 'k', await sentinel.master())
    expect(await (await sentinel.master()).cli('GET', `${keyPrefix}:lease:k`)).toBe('b')
  })

  it('the master killed: calls reach the one the sentinels promote, on Node’s loop again once they do', async ({ skip }) => {
    const keyPrefix = `node-loop-failover:${RUN}`
    const [, make] = behind[0]!
    const leases = make(keyPrefix)
    expect(await leases.acquireLease('before', 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
    await sentinel.killMasterAndWaitForFailover()
    const promoted = await sentinel.master()
    // The first calls may meet the dead master's link and reject coded; within seconds every
    // call is granted on the promoted one.
    await expect.poll(() => leases.acquireLease('after', 'a', 60_000).catch((err: { code?: string }) => err.code), { timeout: 10_000, interval: 50 })
      .toEqual({ acquired: true, owner: 'a' })
    expect(await promoted.cli('GET', `${keyPrefix}:lease:after`)).toBe('a')
    const woken = await switchesOver2000Calls(leases)
    skip(woken === undefined, 'no /proc/self/task here: the thread’s context switches cannot be read')
    expect(woken).toBeLessThan(200)
  })
})

describe('lease calls on a Redis Cluster on Node’s own loop', () => {
  let cluster: RedisCluster
  beforeAll(async () => {
    cluster = await startCluster()
  })
  afterAll(async () => {
    await cluster?.stop()
  })
  const onCluster = bothClasses(() => ({ cluster: { nodes: cluster.urls } }))
  const ownerIn = async (key: string) => (await cluster.masterOfSlot(await cluster.keySlot(key))).cli('GET', key)

  it.for(onCluster)('%s: 2,000 calls one after another wake the runtime’s thread fewer than 200 times, and each lease is on its slot’s master', async ([kind, open], { skip }) => {
    const keyPrefix = `node-loop-cluster:${RUN}:${kind}`
    const woken = await switchesOver2000Calls(open(keyPrefix))
    skip(woken === undefined, 'no /proc/self/task here: the thread’s context switches cannot be read')
    expect(woken).toBeLessThan(200)
    expect(await ownerIn(`${keyPrefix}:lease:warm`)).toBe('owner')
  })

  it.for(onCluster)('%s: a master frozen: its slots’ calls in one turn reject ERR_LEASE_TIMEOUT within their bound, never false, while another master’s keys answer meanwhile; thawed, they answer as before', async ([kind, open]) => {
    const keyPrefix = `node-loop-cluster-frozen:${RUN}:${kind}`
    const leases = open(keyPrefix, FROZEN_CALL_TIMEOUT_MS)
    const masterOf = async (key: string) => cluster.masterOfSlot(await cluster.keySlot(`${keyPrefix}:lease:${key}`))
    // Hash tags keep a key and its `-fresh` sibling in one slot.
    const frozen = await masterOf('{f}')
    let elsewhere = 0
    while ((await masterOf(`{e${elsewhere}}`)).port === frozen.port) elsewhere++
    const other = `{e${elsewhere}}`
    expect(await leases.acquireLease(other, 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
    await throughAFrozenMaster(leases, '{f}', frozen, async () => {
      // Another master's calls do not wait behind the frozen one's.
      const started = performance.now()
      for (let i = 0; i < 20; i++) expect(await leases.renewLease(other, 'a', 60_000)).toBe(true)
      expect(performance.now() - started).toBeLessThan(FROZEN_CALL_TIMEOUT_MS)
    })
    expect(await frozen.cli('GET', `${keyPrefix}:lease:{f}`)).toBe('b')
  })

  it.for([['RedisLeaseProvider', RedisLeaseProvider], ['RedisStreamsPubSub', RedisStreamsPubSub]] as const)('%s: a master frozen, the first seed named, once its calls timed out, every call of another master answers true within the bound while it stays frozen, and one made while it is frozen answers within a few bounds', async ([, Leases]) => {
    const keyPrefix = `node-loop-cluster-seed-frozen:${RUN}:${Leases.name}`
    const masterOf = async (key: string) => cluster.masterOfSlot(await cluster.keySlot(`${keyPrefix}:lease:${key}`))
    const frozen = await masterOf('{f}')
    let elsewhere = 0
    while ((await masterOf(`{e${elsewhere}}`)).port === frozen.port) elsewhere++
    const other = `{e${elsewhere}}`
    const nodes = [frozen.url, ...cluster.urls.filter((url) => url !== frozen.url)]
    const leases = closing(new Leases({ cluster: { nodes }, keyPrefix, commandTimeoutMs: FROZEN_CALL_TIMEOUT_MS }))
    expect(await leases.acquireLease('{f}', 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
    expect(await leases.acquireLease(other, 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
    frozen.freeze()
    try {
      await expectRejection(() => leases.renewLease('{f}', 'a', 60_000), Error, 'ERR_LEASE_TIMEOUT')
      for (let i = 0; i < 20; i++) {
        const started = performance.now()
        expect(await leases.renewLease(other, 'a', 60_000)).toBe(true)
        expect(performance.now() - started).toBeLessThan(FROZEN_CALL_TIMEOUT_MS)
      }
      // One made while it is frozen: its first calls may run out of time on that seed, then
      // the map is read from another node.
      const fresh = closing(new Leases({ cluster: { nodes }, keyPrefix, commandTimeoutMs: FROZEN_CALL_TIMEOUT_MS, connectTimeoutMs: FROZEN_CALL_TIMEOUT_MS }))
      const started = performance.now()
      const answers: unknown[] = []
      do answers.push(await fresh.renewLease(other, 'a', 60_000).then((held) => held, (err: { code?: string }) => err.code))
      while (answers.at(-1) !== true && performance.now() - started < 5_000)
      expect(answers.slice(0, -1).filter((answer) => answer !== 'ERR_LEASE_TIMEOUT')).toEqual([])
      expect(answers.at(-1)).toBe(true)
      expect(performance.now() - started).toBeLessThan(8 * FROZEN_CALL_TIMEOUT_MS)
    } finally {
      frozen.thaw()
    }
    expect(await leases.renewLease('{f}', 'a', 60_000)).toBe(true)
  })

  it.for([['RedisLeaseProvider', RedisLeaseProvider], ['RedisStreamsPubSub', RedisStreamsPubSub]] as const)('%s: a master frozen until its replica took its slots over: while it stays frozen its keys’ calls answer from the new master, never false', async ([, Leases]) => {
    // A cluster of its own: the failover changes who is master.
    const own = await startCluster()
    try {
      const keyPrefix = `node-loop-cluster-frozen-failover:${RUN}:${Leases.name}`
      const slot = await own.keySlot(`${keyPrefix}:lease:{f}`)
      const frozen = await own.masterOfSlot(slot)
      const leases = closing(new Leases({ cluster: { nodes: own.urls }, keyPrefix, commandTimeoutMs: FROZEN_CALL_TIMEOUT_MS }))
      expect(await leases.acquireLease('{f}', 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
      // The replica holds the lease: it replicated what the master had (WAIT would wait for the
      // writes of its own connection only).
      const offset = (info: unknown, field: string) => Number(new RegExp(`${field}:(\\d+)`).exec(String(info))![1])
      const written = offset(await frozen.cli('INFO', 'replication'), 'master_repl_offset')
      const [replica] = await own.replicasOf(frozen)
      await until('the replica caught up', 5_000, async () =>
        offset(await replica!.cli('INFO', 'replication'), 'slave_repl_offset') >= written ? undefined : 'behind')
      frozen.freeze()
      try {
        // Renewing all along, as an owner does: each call true or rejected, never false.
        const renewals: unknown[] = []
        const renew = () => leases.renewLease('{f}', 'a', 60_000).then((held) => held, (err: { code?: string }) => err.code)
        await until('a replica promoted', 20_000, async () => {
          renewals.push(await renew())
          return (await own.masterOfSlot(slot)).port === frozen.port ? 'not yet' : undefined
        })
        // Within a few calls of the promotion the new master answers, and from then on.
        const deadline = performance.now() + 2_000
        do renewals.push(await renew())
        while (renewals.at(-1) !== true && performance.now() < deadline)
        expect(renewals.filter((r) => r !== true && r !== 'ERR_LEASE_TIMEOUT' && r !== 'ERR_LEASE_CONNECTION')).toEqual([])
        expect(renewals.at(-1)).toBe(true)
        for (let i = 0; i < 20; i++) expect(await renew()).toBe(true)
        expect(await leases.getLeaseOwner('{f}')).toBe('a')
      } finally {
        frozen.thaw()
      }
    } finally {
      await own.stop()
    }
  })

  it.for([['RedisLeaseProvider', RedisLeaseProvider], ['RedisStreamsPubSub', RedisStreamsPubSub]] as const)('%s: the one seed named killed for good (its replica promoted), a slot moved after it: the redirection is followed from the masters that answer, not the seed', async ([, Leases]) => {
    // A cluster of its own: a master is killed and a slot moved.
    const own = await startCluster()
    try {
      const keyPrefix = `node-loop-cluster-seed-gone:${RUN}:${Leases.name}`
      const [seed] = await own.masters()
      const leases = closing(new Leases({ cluster: { nodes: [seed!.url] }, keyPrefix }))
      // A key of another master than the seed.
      let key = ''
      for (let i = 0; !key; i++) {
        if ((await own.masterOfSlot(await own.keySlot(`${keyPrefix}:lease:k${i}`))).port !== seed!.port) key = `k${i}`
      }
      expect(await leases.acquireLease(key, 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
      await own.killMasterAndWaitForPromotion(seed!)
      expect(await leases.renewLease(key, 'a', 60_000)).toBe(true)
      // Its slot moved: the master it was on answers MOVED.
      const slot = await own.keySlot(`${keyPrefix}:lease:${key}`)
      const from = await own.masterOfSlot(slot)
      const to = (await own.masters()).find((m) => m.port !== from.port)!
      expect(await own.migrateSlot(slot, to)).toBe(1)
      expect(await leases.renewLease(key, 'a', 60_000)).toBe(true)
      expect(await leases.transferLease(key, 'a', 'b', 60_000)).toBe(true)
      expect(await to.cli('GET', `${keyPrefix}:lease:${key}`)).toBe('b')
    } finally {
      await own.stop()
    }
  })

  it('RedisLeaseProvider: the link a call timed out on is given up (it may have gone silent), and the next call of its master opens a fresh one', async () => {
    const keyPrefix = `node-loop-cluster-stalled:${RUN}`
    const connectionName = `stalled-${process.pid}`
    const master = await cluster.masterOfSlot(await cluster.keySlot(`${keyPrefix}:lease:k`))
    const leases = closing(new RedisLeaseProvider({ cluster: { nodes: cluster.urls }, keyPrefix, connectionName, commandTimeoutMs: FROZEN_CALL_TIMEOUT_MS }))
    const ids = async () => String(await master.cli('CLIENT', 'LIST')).split('\n')
      .filter((line) => line.includes(` name=${connectionName} `)).map((line) => /^id=(\d+)/.exec(line)![1])
    expect(await leases.acquireLease('k', 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
    const before = await ids()
    expect(before).toHaveLength(1)
    master.freeze()
    try {
      await expectRejection(() => leases.renewLease('k', 'a', 60_000), Error, 'ERR_LEASE_TIMEOUT')
    } finally {
      master.thaw()
    }
    expect(await leases.renewLease('k', 'a', 60_000)).toBe(true)
    await expect.poll(ids, { timeout: 2_000, interval: 20 }).toHaveLength(1)
    expect(await ids()).not.toContain(before[0])
  })

  it('RedisStreamsPubSub: its calls on Node’s loop share the transport’s cluster connection: a master none of its readers is on holds two connections of it, that one and the loop’s link', async () => {
    const keyPrefix = `node-loop-cluster-conns:${RUN}`
    const connectionName = `conns-${process.pid}`
    const pubsub = closing(new RedisStreamsPubSub({ cluster: { nodes: cluster.urls }, keyPrefix, connectionName }))
    // Lease calls on keys of every master open the loop's links to them all; a group's
    // subscription opens the transport's cluster connection and a reader at its topic's master.
    for (let i = 0; i < 30; i++) expect(await pubsub.acquireLease(`k${i}`, 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
    const inbox = new Inbox()
    await pubsub.subscribe('conns', inbox.cb, { group: 'workers' })
    await pubsub.publish('conns', ev(0))
    await inbox.count(1)
    const readers = await cluster.masterOfSlot(await cluster.keySlot(`${keyPrefix}:conns`))
    const named = async (node: RedisCluster['nodes'][number]) =>
      String(await node.cli('CLIENT', 'LIST')).split('\n').filter((line) => line.includes(` name=${connectionName} `)).length
    const others = (await cluster.masters()).filter((m) => m.port !== readers.port)
    expect(others.length).toBeGreaterThan(0)
    for (const master of others) expect(await named(master), master.name).toBe(2)
  })

  it('RedisLeaseProvider: a master holds one connection of it, the loop’s link, until a redirection needs the cluster connection, which is opened then', async () => {
    const keyPrefix = `node-loop-cluster-lazy:${RUN}`
    const connectionName = `lazy-${process.pid}`
    const leases = closing(new RedisLeaseProvider({ cluster: { nodes: cluster.urls }, keyPrefix, connectionName }))
    const named = async (node: RedisCluster['nodes'][number]) =>
      String(await node.cli('CLIENT', 'LIST')).split('\n').filter((line) => line.includes(` name=${connectionName} `)).length
    // Lease calls on keys of every master, a script loaded on each (renewals), again after a
    // SCRIPT FLUSH, and a ping of every master: all on the masters' links.
    for (let i = 0; i < 30; i++) {
      expect(await leases.acquireLease(`k${i}`, 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
      expect(await leases.renewLease(`k${i}`, 'a', 60_000)).toBe(true)
    }
    expect(await leases.ping()).toBeGreaterThanOrEqual(0)
    const masters = await cluster.masters()
    // The script caches flushed: the renewals' scripts load again, on the masters' links too.
    for (const master of masters) await master.cli('SCRIPT', 'FLUSH')
    for (let i = 0; i < 30; i++) expect(await leases.renewLease(`k${i}`, 'a', 60_000)).toBe(true)
    for (const master of masters) expect(await named(master), master.name).toBe(1)
    // A slot moved: its next call meets MOVED, and the cluster connection that follows it
    // opens a connection to every master.
    const slot = await cluster.keySlot(`${keyPrefix}:lease:k0`)
    const from = await cluster.masterOfSlot(slot)
    const to = masters.find((m) => m.port !== from.port)!
    expect(await cluster.migrateSlot(slot, to)).toBeGreaterThan(0)
    expect(await leases.renewLease('k0', 'a', 60_000)).toBe(true)
    for (const master of masters) expect(await named(master), master.name).toBe(2)
  })

  it('calls of one turn on keys of many slots of one master (one pipeline per master), one of the slots moved meanwhile: every renewal and read answers as before the move', async () => {
    const keyPrefix = `node-loop-moved-many:${RUN}`
    const leases = closing(new RedisLeaseProvider({ cluster: { nodes: cluster.urls }, keyPrefix }))
    const masterOf = async (key: string) => cluster.masterOfSlot(await cluster.keySlot(`${keyPrefix}:lease:${key}`))
    const from = await masterOf('m0')
    const keys: string[] = []
    for (let i = 0; keys.length < 20; i++) if ((await masterOf(`m${i}`)).port === from.port) keys.push(`m${i}`)
    expect(new Set(await Promise.all(keys.map((key) => cluster.keySlot(`${keyPrefix}:lease:${key}`)))).size).toBeGreaterThan(1)
    expect(await Promise.all(keys.map((key) => leases.acquireLease(key, 'a', 60_000)))).toEqual(keys.map(() => ({ acquired: true, owner: 'a' })))
    const to = (await cluster.masters()).find((m) => m.port !== from.port)!
    expect(await cluster.migrateSlot(await cluster.keySlot(`${keyPrefix}:lease:${keys[0]}`), to)).toBeGreaterThanOrEqual(1)
    expect(await Promise.all(keys.map((key) => leases.renewLease(key, 'a', 60_000)))).toEqual(keys.map(() => true))
    expect(await Promise.all(keys.map((key) => leases.getLeaseOwner(key)))).toEqual(keys.map(() => 'a'))
    expect(await to.cli('GET', `${keyPrefix}:lease:${keys[0]}`)).toBe('a')
  })

  it('a slot moved to another master under held leases: every renewal, read and transfer answers as before the move, and calls are back on Node’s loop after it', async ({ skip }) => {
    const keyPrefix = `node-loop-moved:${RUN}`
    const [, make] = onCluster[0]!
    const leases = make(keyPrefix)
    // Keys of one slot: a hash tag in the lease key.
    const keys = Array.from({ length: 20 }, (_, i) => `{moved}-${i}`)
    for (const key of keys) expect(await leases.acquireLease(key, 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
    const slot = await cluster.keySlot(`${keyPrefix}:lease:${keys[0]}`)
    const from = await cluster.masterOfSlot(slot)
    const to = (await cluster.masters()).find((m) => m.port !== from.port)!
    expect(await cluster.migrateSlot(slot, to)).toBeGreaterThan(0)
    // The first call meets MOVED from the old master and goes through the cluster connection.
    for (const key of keys) {
      expect(await leases.renewLease(key, 'a', 60_000)).toBe(true)
      expect(await leases.getLeaseOwner(key)).toBe('a')
      expect(await leases.transferLease(key, 'a', 'b', 60_000)).toBe(true)
    }
    for (const key of keys) expect(await to.cli('GET', `${keyPrefix}:lease:${key}`)).toBe('b')
    const woken = await switchesOver2000Calls(leases)
    skip(woken === undefined, 'no /proc/self/task here: the thread’s context switches cannot be read')
    expect(woken).toBeLessThan(200)
  })

  it('RedisStreamsPubSub with streamIdleTtlMs: 1,000 publishes one after another, to topics on every master, wake the runtime’s thread fewer than 200 times; each stream holds its events and its TTL', async ({ skip }) => {
    const keyPrefix = `node-loop-cluster-ttl:${RUN}`
    const pubsub = closing(new RedisStreamsPubSub({ cluster: { nodes: cluster.urls }, keyPrefix, streamIdleTtlMs: 60_000 }))
    const topics = Array.from({ length: 10 }, (_, i) => `ttl-${i}`)
    const masterOf = async (topic: string) => cluster.masterOfSlot(await cluster.keySlot(`${keyPrefix}:${topic}`))
    expect(new Set((await Promise.all(topics.map(masterOf))).map((m) => m.port)).size).toBe(3)
    for (const topic of topics) await pubsub.publish(topic, { type: 't', runId: 'r', data: {} })
    const before = runtimeThreadSwitches()
    skip(before === undefined, 'no /proc/self/task here: the thread’s context switches cannot be read')
    for (let i = 0; i < 1_000; i++) await pubsub.publish(topics[i % topics.length]!, { type: 't', runId: 'r', data: { i } })
    expect(runtimeThreadSwitches()! - before!).toBeLessThan(200)
    for (const topic of topics) {
      const master = await masterOf(topic)
      expect(Number(await master.cli('XLEN', `${keyPrefix}:${topic}`)), topic).toBe(101)
      expect(Number(await master.cli('PTTL', `${keyPrefix}:${topic}`)), topic).toBeGreaterThan(50_000)
    }
  })

  it('RedisStreamsPubSub with streamIdleTtlMs: a topic’s slot moved to another master, a turn’s publishes to it, to a topic of its slot and to one of the master it moved to resolve, each event in its stream once, with its TTL', async () => {
    const keyPrefix = `node-loop-cluster-ttl-moved:${RUN}`
    const pubsub = closing(new RedisStreamsPubSub({ cluster: { nodes: cluster.urls }, keyPrefix, streamIdleTtlMs: 60_000 }))
    const stream = (topic: string) => `${keyPrefix}:${topic}`
    // Two topics of one slot (one hash tag): one to move, one that stays with it in the turn.
    const [moving, staying] = ['{ttl-moved}-a', '{ttl-moved}-b']
    for (const topic of [moving, staying]) await pubsub.publish(topic, { type: 't', runId: 'r', data: { n: -1 } })
    const slot = await cluster.keySlot(stream(moving))
    const from = await cluster.masterOfSlot(slot)
    const to = (await cluster.masters()).find((m) => m.port !== from.port)!
    // A topic of another master, in the same turn.
    let other = 'other-0'
    for (let i = 1; (await cluster.masterOfSlot(await cluster.keySlot(stream(other)))).port !== to.port; i++) other = `other-${i}`
    expect(await cluster.migrateSlot(slot, to)).toBeGreaterThan(0)
    await Promise.all([moving, staying, other].flatMap((topic) => [0, 1, 2].map((n) => pubsub.publish(topic, { type: 't', runId: 'r', data: { n } }))))
    const sent = (topic: string) => (topic === other ? [0, 1, 2] : [-1, 0, 1, 2])
    for (const topic of [moving, staying, other]) {
      const entries = (await to.cli('XRANGE', stream(topic), '-', '+')) as [string, string[]][]
      expect(entries.map(([, fields]) => (JSON.parse(fields[1]!) as { data: { n: number } }).data.n), topic).toEqual(sent(topic))
      expect(Number(await to.cli('PTTL', stream(topic))), topic).toBeGreaterThan(50_000)
    }
  })

  /** A RedisStreamsPubSub (`commandTimeoutMs` 1 s) and 12 topics with their masters, all three among them. */
  async function topicsOnEveryMaster(keyPrefix: string) {
    const commandTimeoutMs = 1_000
    const pubsub = closing(new RedisStreamsPubSub({ cluster: { nodes: cluster.urls }, keyPrefix, commandTimeoutMs }))
    const topics = Array.from({ length: 12 }, (_, i) => `topic-${i}`)
    const masters = await Promise.all(topics.map(async (topic) => cluster.masterOfSlot(await cluster.keySlot(`${keyPrefix}:${topic}`))))
    expect(new Set(masters.map((m) => m.port)).size).toBe(3)
    return { pubsub, commandTimeoutMs, topics, masters }
  }

  it('RedisStreamsPubSub: 64 publishers each awaiting its publish, on topics of every master: what the masters’ answers make leaves together, one write to each, so Redis reads 9.5 or more publishes at a time (7 to 9 when each answer wrote its own)', async ({ annotate }) => {
    const keyPrefix = `node-loop-cluster-publish-reads:${RUN}`
    const { pubsub, topics, masters } = await topicsOnEveryMaster(keyPrefix)
    const each = [...new Map(masters.map((m) => [m.port, m])).values()]
    const publishes = async (count: number) => {
      let next = 0
      await Promise.all(Array.from({ length: 64 }, async () => {
        for (let i; (i = next++) < count;) await pubsub.publish(topics[i % topics.length]!, { type: 't', runId: 'r', data: { i } })
      }))
    }
    await publishes(1_000) // every master's link open
    const reads = async () => {
      let total = 0
      for (const master of each) total += Number(/total_reads_processed:(\d+)/.exec(String(await master.cli('INFO', 'stats')))![1])
      return total
    }
    const before = await reads()
    await publishes(6_000)
    // The test's own INFO is one read more on each master.
    const perPublish = (await reads() - before - each.length) / 6_000
    await annotate(`Redis's reads per publish over the masters: ${perPublish.toFixed(3)} (one per ${Math.round(1 / perPublish)} publishes)`)
    expect(perPublish).toBeLessThan(1 / 9.5)
  })

  it('RedisStreamsPubSub: a master frozen, a turn’s publishes to topics of every master: the other masters’ resolve without waiting for it, its own reject ERR_LEASE_TIMEOUT within their bound', async () => {
    const keyPrefix = `node-loop-cluster-publish-frozen:${RUN}`
    const { pubsub, commandTimeoutMs, topics, masters } = await topicsOnEveryMaster(keyPrefix)
    // Every master's link open first.
    await Promise.all(topics.map((topic) => pubsub.publish(topic, { type: 't', runId: 'r', data: { n: 0 } })))
    const frozen = masters[0]!
    frozen.freeze()
    let outcomes: unknown[]
    try {
      const started = performance.now()
      outcomes = await Promise.all(topics.map((topic) =>
        pubsub.publish(topic, { type: 't', runId: 'r', data: { n: 1 } }).then(() => performance.now() - started, (err: unknown) => err)))
    } finally {
      frozen.thaw()
    }
    for (const [i, outcome] of outcomes.entries()) {
      if (masters[i]!.port === frozen.port) expect(outcome, topics[i]).toMatchObject({ code: 'ERR_LEASE_TIMEOUT' })
      else expect(outcome, topics[i]).toBeLessThan(commandTimeoutMs / 2)
    }
    for (const [i, topic] of topics.entries()) {
      if (masters[i]!.port !== frozen.port) expect(await masters[i]!.cli('XLEN', `${keyPrefix}:${topic}`), topic).toBe(2)
    }
  })

  it('RedisStreamsPubSub: a master frozen, a turn’s acks of deliveries from every master: the other masters’ resolve without waiting for it, and their entries are settled', async () => {
    const keyPrefix = `node-loop-cluster-ack-frozen:${RUN}`
    const { pubsub, commandTimeoutMs, topics, masters } = await topicsOnEveryMaster(keyPrefix)
    // Each topic's delivery held, its ack kept for later.
    const acks = new Map<string, () => Promise<void>>()
    const held = new Inbox((event, ack) => void acks.set(event.runId!, ack))
    for (const topic of topics) await pubsub.subscribe(topic, held.cb, { group: 'workers' })
    await Promise.all(topics.map((topic) => pubsub.publish(topic, { type: 't', runId: topic, data: {} })))
    await held.count(topics.length)
    const frozen = masters[0]!
    frozen.freeze()
    let took: number[]
    try {
      const started = performance.now()
      took = await Promise.all(topics.map((topic) => acks.get(topic)!().then(() => performance.now() - started)))
    } finally {
      frozen.thaw()
    }
    for (const [i, topic] of topics.entries()) {
      if (masters[i]!.port === frozen.port) continue
      expect(took[i], topic).toBeLessThan(commandTimeoutMs / 2)
      expect(((await masters[i]!.cli('XPENDING', `${keyPrefix}:${topic}`, 'workers')) as unknown[])[0], topic).toBe(0)
    }
  })

  it('a master killed: the calls of its slots reach the replica promoted in its place, on Node’s loop again once they do', async ({ skip }) => {
    const keyPrefix = `node-loop-cluster-failover:${RUN}`
    const [, make] = onCluster[0]!
    const leases = make(keyPrefix)
    const stored = (key: string) => `${keyPrefix}:lease:${key}`
    // Two keys of one slot (one hash tag).
    expect(await leases.acquireLease('{killed}-before', 'a', 60_000)).toEqual({ acquired: true, owner: 'a' })
    const slot = await cluster.keySlot(stored('{killed}-before'))
    expect(await cluster.keySlot(stored('{killed}-after'))).toBe(slot)
    const master = await cluster.masterOfSlot(slot)
    await cluster.killMasterAndWaitForPromotion(master)
    // The first calls may meet the dead master's link and reject coded.
    await expect.poll(() => leases.acquireLease('{killed}-after', 'a', 60_000).catch((err: { code?: string }) => err.code), { timeout: 10_000, interval: 50 })
      .toEqual({ acquired: true, owner: 'a' })
    const promoted = await cluster.masterOfSlot(slot)
    expect(promoted.port).not.toBe(master.port)
    expect(await promoted.cli('GET', stored('{killed}-after'))).toBe('a')
    const woken = await switchesOver2000Calls(leases)
    skip(woken === undefined, 'no /proc/self/task here: the thread’s context switches cannot be read')
    expect(woken).toBeLessThan(200)
  })
})
