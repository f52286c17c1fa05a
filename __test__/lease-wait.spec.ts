// hold(key, owner, { wait: true }): waiting for a lease another owner holds, without polling.
// A release or transfer by another provider (another process, for Redis: its own connection)
// wakes the waiter within milliseconds; a lease left to expire wakes it when its TTL runs
// out; in between, the waiter sends Redis nothing (INFO commandstats). Waiters in one process
// take turns in arrival order; the caller's signal and waitTimeoutMs end a wait.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'

import { EventEmitterPubSub, type LeaseProvider } from '@mastra/core/events'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { holdLease, MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub, withLeases, type HeldLease, type HoldOptions } from '../dist/esm/index.js'
import { expectRejection, leaseFailureWarnings, pending, sleep } from './helpers/lease.js'
import { closing, leaseSuite, RUN, stopLater } from './helpers/lease-runs.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { keysOnEveryMaster, startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { startSentinel, type RedisSentinel } from './helpers/redis-sentinel.js'

leaseSuite()
// A frozen or killed server fails lease calls, which warn through process.emitWarning (no logger here).
const leaseWarnings = leaseFailureWarnings()

let server: RedisServer
beforeAll(async () => {
  server = stopLater(await startRedis())
})

type Leases = {
  hold(key: string, owner: string, options: HoldOptions): Promise<HeldLease>
  acquireLease(key: string, owner: string, ttlMs: number): Promise<{ acquired: boolean; owner?: string }>
  releaseLease(key: string, owner: string): Promise<void>
  transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number): Promise<boolean>
  getLeaseOwner(key: string): Promise<string | undefined>
  close(): Promise<void>
}

/** Two views of one lease store: the waiter's, and the holder's (another connection on Redis). */
type Pair = { waiter: Leases; holder: Leases }

const pairs: Array<[string, () => Pair]> = [
  [
    'MemoryLeaseProvider',
    () => {
      const p = closing(new MemoryLeaseProvider())
      return { waiter: p, holder: p }
    },
  ],
  [
    // The pubsub is the ESM build's, the provider class the CommonJS one (the ESM file
    // re-exports it): waiting must find the provider's waiters across the two.
    'withLeases over MemoryLeaseProvider',
    () => {
      const p = closing(withLeases(new EventEmitterPubSub(), new MemoryLeaseProvider()))
      return { waiter: p, holder: p }
    },
  ],
  [
    'RedisLeaseProvider',
    () => {
      const options = { url: server.url, keyPrefix: `wait:${RUN}` }
      return { waiter: closing(new RedisLeaseProvider(options)), holder: closing(new RedisLeaseProvider(options)) }
    },
  ],
  [
    'RedisStreamsPubSub',
    () => {
      const options = { url: server.url, keyPrefix: `wait-streams:${RUN}` }
      return { waiter: closing(new RedisStreamsPubSub(options)), holder: closing(new RedisStreamsPubSub(options)) }
    },
  ],
]
const newKey = () => `wait-${randomUUID().slice(0, 8)}\u0000thread`


/** A fresh key that `A` holds for a minute, through the holder's side of a new pair. */
async function heldByA(make: () => Pair) {
  const { waiter, holder } = make()
  const key = newKey()
  await holder.acquireLease(key, 'A', 60_000)
  return { waiter, holder, key }
}

describe.each(pairs)('%s.hold with wait', (_name, make) => {
  it('takes the lease within milliseconds of its release by the holder, long before the TTL', async ({ annotate }) => {
    const { waiter, holder, key } = await heldByA(make)
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
    await sleep(300)
    expect(waiting.settled).toBe(false)
    await holder.releaseLease(key, 'A')
    const released = performance.now()
    await waiting.done
    expect(waiting.error).toBeUndefined()
    expect(waiting.lease).toMatchObject({ key, owner: 'B' })
    expect(await holder.getLeaseOwner(key)).toBe('B')
    const took = waiting.at - released
    await annotate(`granted ${took.toFixed(1)} ms after the release`)
    // The figure above is the measurement; the bound only tells a wake-up from the 60 s TTL
    // (or a poll), with room for a test machine that stalls a process now and then.
    expect(took).toBeLessThan(1_000)
    await waiting.lease!.release()
  })

  it('takes the lease when the holder lets it expire, once its TTL has run out and not before', async () => {
    const { waiter, holder } = make()
    const key = newKey()
    await holder.acquireLease(key, 'A', 600)
    const granted = performance.now()
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
    await waiting.done
    expect(waiting.error).toBeUndefined()
    const after = waiting.at - granted
    expect(after).toBeGreaterThanOrEqual(590)
    expect(after).toBeLessThan(600 + 1_000)
    await waiting.lease!.release()
  })

  it('a transfer wakes the waiter, which goes on waiting for the new holder and takes the lease when it releases', async () => {
    const { waiter, holder, key } = await heldByA(make)
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
    await sleep(200)
    expect(await holder.transferLease(key, 'A', 'C', 60_000)).toBe(true)
    await sleep(200)
    expect(waiting.settled).toBe(false)
    expect(await holder.getLeaseOwner(key)).toBe('C')
    await holder.releaseLease(key, 'C')
    await waiting.done
    expect(waiting.lease).toMatchObject({ owner: 'B' })
    await waiting.lease!.release()
  })

  it('waiters in one process take turns in arrival order, each when the one before releases', async () => {
    const { waiter, holder, key } = await heldByA(make)
    const order: string[] = []
    const waits = ['B1', 'B2', 'B3'].map((owner) => {
      const waiting = pending(waiter.hold(key, owner, { ttlMs: 5_000, wait: true }))
      void waiting.done.then(() => order.push(owner))
      return waiting
    })
    await sleep(200)
    await holder.releaseLease(key, 'A')
    for (const [i, waiting] of waits.entries()) {
      await waiting.done
      expect(waiting.lease).toMatchObject({ owner: `B${i + 1}` })
      await sleep(100)
      expect(waits.filter((w) => w.settled).length).toBe(i + 1) // the next waits for this release
      await waiting.lease!.release()
    }
    expect(order).toEqual(['B1', 'B2', 'B3'])
  })

  it('rejects with ERR_LEASE_HELD, naming the holder, once waitTimeoutMs passes', async () => {
    const { waiter, holder, key } = await heldByA(make)
    const started = performance.now()
    const error = await expectRejection(() => waiter.hold(key, 'B', { ttlMs: 5_000, wait: true, waitTimeoutMs: 400 }), Error, 'ERR_LEASE_HELD')
    const waited = performance.now() - started
    expect(error).toMatchObject({ owner: 'A' })
    expect(waited).toBeGreaterThanOrEqual(395)
    expect(waited).toBeLessThan(400 + 1_000)
    expect(await holder.getLeaseOwner(key)).toBe('A')
  })

  it("the caller's signal ends a wait with its reason, and the next waiter in line still gets its turn", async () => {
    const { waiter, holder, key } = await heldByA(make)
    const controller = new AbortController()
    const first = pending(waiter.hold(key, 'B1', { ttlMs: 5_000, wait: true, signal: controller.signal }))
    const second = pending(waiter.hold(key, 'B2', { ttlMs: 5_000, wait: true }))
    await sleep(200)
    controller.abort(new Error('no longer needed'))
    await first.done
    expect(first.error).toMatchObject({ message: 'no longer needed' })
    await holder.releaseLease(key, 'A')
    await second.done
    expect(second.lease).toMatchObject({ owner: 'B2' })
    await second.lease!.release()
  })

  it('closing the provider ends every wait with ERR_LEASE_CLOSED', async () => {
    const { waiter, holder, key } = await heldByA(make)
    const waits = ['B1', 'B2'].map((owner) => pending(waiter.hold(key, owner, { ttlMs: 5_000, wait: true })))
    await sleep(200)
    await waiter.close()
    for (const waiting of waits) {
      await waiting.done
      expect(waiting.error).toMatchObject({ code: 'ERR_LEASE_CLOSED' })
    }
  })

  it('refuses unusable wait options with ERR_LEASE_INVALID_OPTION before taking anything', async () => {
    const { waiter, holder } = make()
    const key = newKey()
    await expectRejection(() => waiter.hold(key, 'B', { ttlMs: 1_000, wait: 'yes' as never }), TypeError, 'ERR_LEASE_INVALID_OPTION')
    await expectRejection(() => waiter.hold(key, 'B', { ttlMs: 1_000, waitTimeoutMs: 100 }), TypeError, 'ERR_LEASE_INVALID_OPTION')
    await expectRejection(() => waiter.hold(key, 'B', { ttlMs: 1_000, wait: true, waitTimeoutMs: -1 }), RangeError, 'ERR_LEASE_INVALID_OPTION')
    await expectRejection(() => waiter.hold(key, 'B', { ttlMs: 1_000, wait: true, waitTimeoutMs: '5' as never }), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expect(await holder.getLeaseOwner(key)).toBeUndefined()
  })
})

describe('holdLease with wait over a provider that cannot tell waiters about releases', () => {
  it("rejects with ERR_LEASE_UNSUPPORTED before any call (Mastra's own in-process leases)", async () => {
    const pubsub = new EventEmitterPubSub()
    const leases = pubsub as unknown as LeaseProvider
    const key = newKey()
    await expectRejection(() => holdLease(leases, key, 'B', { ttlMs: 1_000, wait: true }), TypeError, 'ERR_LEASE_UNSUPPORTED')
    expect(await leases.getLeaseOwner(key)).toBeUndefined()
  })
})

describe.skipIf(EXTERNAL_REDIS)('waiting on Redis', () => {
  const prefix = `wait-redis:${RUN}`
  const options = () => ({ url: server.url, keyPrefix: prefix })
  /** Commands Redis ran, those inside scripts included, but the test's own INFO. */
  // A new connection's own setup is not the wait's doing (CLIENT SETINFO: redis-rs', on a
  // server that has it, Redis 7.2 and later or Valkey).
  const leaseCommands = (calls: Record<string, number>) =>
    Object.entries(calls)
      .filter(([name]) => !['info', 'ping', 'client|setname', 'client|setinfo', 'client|id'].includes(name))
      .reduce((sum, [, n]) => sum + n, 0)

  it('sends Redis nothing while it waits (INFO commandstats), and a handful of commands once woken', async ({ annotate }) => {
    const holder = closing(new RedisLeaseProvider(options()))
    const waiter = closing(new RedisLeaseProvider(options()))
    const key = newKey()
    await holder.acquireLease(key, 'A', 60_000)
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
    await sleep(300) // subscribed, refused, read the TTL: now only waiting
    const before = leaseCommands(await server.commandCalls())
    await sleep(2_000)
    const during = leaseCommands(await server.commandCalls()) - before
    expect(during).toBe(0)
    await holder.releaseLease(key, 'A')
    await waiting.done
    const woken = leaseCommands(await server.commandCalls()) - before
    await annotate(`commands in 2 s of waiting: ${during}; from the release to the grant, the release's included: ${woken}`)
    // The release of a lease a waiter marked (EVALSHA, and the GET, EXISTS, GET, DEL, SPUBLISH
    // inside it) and the waiter's acquire (EVALSHA and the commands inside): no loop.
    expect(woken).toBeLessThanOrEqual(12)
    expect(waiting.lease).toMatchObject({ owner: 'B' })
    await waiting.lease!.release()
  })

  it('wakes when the holder lets the TTL run out, having sent nothing meanwhile (INFO commandstats)', async () => {
    const holder = closing(new RedisLeaseProvider(options()))
    const waiter = closing(new RedisLeaseProvider(options()))
    const key = newKey()
    await holder.acquireLease(key, 'A', 1_500)
    const granted = performance.now()
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
    await sleep(300)
    const before = leaseCommands(await server.commandCalls())
    await sleep(900) // still within the TTL
    expect(leaseCommands(await server.commandCalls()) - before).toBe(0)
    expect(waiting.settled).toBe(false)
    await waiting.done
    expect(waiting.lease).toMatchObject({ owner: 'B' })
    expect(waiting.at - granted).toBeGreaterThanOrEqual(1_490)
    await waiting.lease!.release()
  })

  it('a waiter on a lease without an expiry (a raw SET) sends nothing, and is woken within milliseconds by a release', async ({ annotate }) => {
    const holder = closing(new RedisLeaseProvider(options()))
    const waiter = closing(new RedisLeaseProvider(options()))
    const key = newKey()
    await server.cli('SET', `${prefix}:lease:${key}`, 'A')
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true, waitTimeoutMs: 4_000 }))
    await sleep(300) // subscribed, refused, read the lease: now only waiting
    const before = await server.commandCalls()
    await sleep(1_000)
    const during = leaseCommands(await server.commandCalls()) - leaseCommands(before)
    expect(waiting.settled).toBe(false)
    expect(during).toBe(0)
    await holder.releaseLease(key, 'A')
    const released = performance.now()
    await waiting.done
    const took = waiting.at - released
    await annotate(`no expiry: commands in 1 s of waiting: ${during}; granted ${took.toFixed(1)} ms after the release`)
    expect(waiting.error).toBeUndefined()
    expect(waiting.lease).toMatchObject({ owner: 'B' })
    expect(took).toBeLessThan(1_000) // a wake-up, not the waitTimeoutMs's last look
    await waiting.lease!.release()
  })

  it('a raw DEL of a lease without an expiry publishes nothing: the waiter finds it free at its next look, one ttlMs on', async ({ annotate }) => {
    const waiter = closing(new RedisLeaseProvider(options()))
    const key = newKey()
    await server.cli('SET', `${prefix}:lease:${key}`, 'A')
    const started = performance.now()
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 1_500, wait: true }))
    await sleep(300)
    await server.cli('DEL', `${prefix}:lease:${key}`)
    const before = await server.commandCalls()
    await sleep(700)
    expect(waiting.settled).toBe(false) // nobody told it
    expect(leaseCommands(await server.commandCalls()) - leaseCommands(before)).toBe(0)
    await waiting.done
    const after = waiting.at - started
    await annotate(`no expiry, deleted by a raw DEL: granted ${after.toFixed(1)} ms after the wait began`)
    expect(waiting.error).toBeUndefined()
    expect(waiting.lease).toMatchObject({ owner: 'B' })
    expect(after).toBeGreaterThanOrEqual(1_490)
    expect(after).toBeLessThan(1_500 + 1_000)
    await waiting.lease!.release()
  })

  it('a lease without an expiry that is given one later (a raw PEXPIRE) is taken when that runs out, read at the next look one ttlMs on', async () => {
    const waiter = closing(new RedisLeaseProvider(options()))
    const key = newKey()
    await server.cli('SET', `${prefix}:lease:${key}`, 'A')
    const started = performance.now()
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 1_500, wait: true }))
    await sleep(300)
    const before = await server.commandCalls()
    await sleep(900)
    expect(leaseCommands(await server.commandCalls()) - leaseCommands(before)).toBe(0)
    await server.cli('PEXPIRE', `${prefix}:lease:${key}`, 1_100) // runs out at about 2.3 s
    await waiting.done
    const after = waiting.at - started
    expect(waiting.error).toBeUndefined()
    expect(waiting.lease).toMatchObject({ owner: 'B' })
    // The look at 1.5 s reads the new TTL and sets its timer: taken at its end, not at 3 s.
    expect(after).toBeGreaterThanOrEqual(2_290)
    expect(after).toBeLessThan(2_300 + 1_000)
    await waiting.lease!.release()
  })

  it('a wait on a lease without an expiry still ends at waitTimeoutMs, and at its signal, with nothing sent between', async ({ annotate }) => {
    const waiter = closing(new RedisLeaseProvider(options()))
    const key = newKey()
    await server.cli('SET', `${prefix}:lease:${key}`, 'A')
    const started = performance.now()
    const before = await server.commandCalls()
    const error = await expectRejection(() => waiter.hold(key, 'B', { ttlMs: 60_000, wait: true, waitTimeoutMs: 800 }), Error, 'ERR_LEASE_HELD')
    const waited = performance.now() - started
    expect(error).toMatchObject({ owner: 'A' })
    expect(waited).toBeGreaterThanOrEqual(795)
    expect(waited).toBeLessThan(800 + 1_000)
    const sent = leaseCommands(await server.commandCalls()) - leaseCommands(before)
    await annotate(`no expiry: commands in a wait of 800 ms that timed out: ${sent}`)
    // The listener's HELLO and subscription, the refused acquire and the read, the last
    // acquire at the deadline, the unsubscription, each with the commands inside its script
    // (and, on a server that has not seen them yet, the scripts' loading): no loop.
    expect(sent).toBeLessThanOrEqual(20)
    const controller = new AbortController()
    const aborted = pending(waiter.hold(key, 'B', { ttlMs: 60_000, wait: true, signal: controller.signal }))
    await sleep(300)
    expect(aborted.settled).toBe(false)
    controller.abort(new Error('no longer needed'))
    await aborted.done
    expect(aborted.error).toMatchObject({ message: 'no longer needed' })
    expect(await waiter.getLeaseOwner(key)).toBe('A')
  })

  it('keeps one subscription per key and process however many wait, and drops it once none does', async () => {
    const holder = closing(new RedisLeaseProvider(options()))
    const waiter = closing(new RedisLeaseProvider(options()))
    const key = newKey()
    await holder.acquireLease(key, 'A', 60_000)
    const waits = ['B1', 'B2', 'B3'].map((owner) => pending(waiter.hold(key, owner, { ttlMs: 5_000, wait: true })))
    await sleep(200)
    const channel = `${prefix}:lease:${key}`
    expect(await server.cli('PUBSUB', 'SHARDNUMSUB', channel)).toEqual([channel, 1])
    await holder.releaseLease(key, 'A')
    for (const waiting of waits) {
      await waiting.done
      await waiting.lease!.release()
    }
    await sleep(100)
    expect(await server.cli('PUBSUB', 'SHARDNUMSUB', channel)).toEqual([channel, 0])
  })

  it('a server frozen under a wait ends it with ERR_LEASE_TIMEOUT when the waiter next asks (at the TTL), never a longer wait', async () => {
    const own = stopLater(await startRedis())
    const holder = closing(new RedisLeaseProvider({ url: own.url, keyPrefix: prefix }))
    const waiter = closing(new RedisLeaseProvider({ url: own.url, keyPrefix: prefix, commandTimeoutMs: 300 }))
    const key = newKey()
    await holder.acquireLease(key, 'A', 1_000)
    const granted = performance.now()
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
    await sleep(200)
    own.freeze()
    try {
      await waiting.done
      expect(waiting.error).toMatchObject({ code: 'ERR_LEASE_TIMEOUT' })
      const after = waiting.at - granted
      expect(after).toBeGreaterThanOrEqual(990)
      expect(after).toBeLessThan(1_000 + 300 + 1_000)
      await leaseWarnings.warned('ERR_LEASE_TIMEOUT')
    } finally {
      own.thaw()
    }
  })

  it('a waiter whose server is gone for a second and restarts (the lease gone with it) takes the lease once it is back', async () => {
    const own = stopLater(await startRedis())
    const holder = closing(new RedisLeaseProvider({ url: own.url, keyPrefix: prefix }))
    const waiter = closing(new RedisLeaseProvider({ url: own.url, keyPrefix: prefix }))
    const key = newKey()
    await holder.acquireLease(key, 'A', 60_000)
    const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
    await sleep(200)
    // Gone for a second: a look meanwhile could only fail (its connection refused at once).
    await own.kill()
    await sleep(1_000)
    expect(waiting.settled).toBe(false)
    await own.restart()
    const back = performance.now()
    await waiting.done
    expect(waiting.error).toBeUndefined()
    expect(waiting.lease).toMatchObject({ owner: 'B' })
    expect(waiting.at - back).toBeLessThan(5_000) // not the 60 s TTL
    await waiting.lease!.release()
  })
})

describe.skipIf(EXTERNAL_REDIS)('waiting on a Redis Cluster', () => {
  let cluster: RedisCluster
  beforeAll(async () => {
    cluster = await startCluster({ replicasPerMaster: 0 })
  }, 60_000)
  afterAll(async () => {
    await cluster?.stop()
  })

  it('wakes waiters of keys on every master within milliseconds of their release (sharded pub/sub)', async ({ annotate }) => {
    const options = { cluster: { nodes: cluster.urls }, keyPrefix: `wait-cluster:${RUN}` }
    const holder = closing(new RedisLeaseProvider(options))
    const waiter = closing(new RedisLeaseProvider(options))
    const { keys, masters } = await keysOnEveryMaster(cluster, 4, newKey, (key) => `wait-cluster:${RUN}:lease:${key}`)
    expect(masters).toBe(3) // the keys span every master
    await Promise.all(keys.map((key) => holder.acquireLease(key, 'A', 60_000)))
    const waits = keys.map((key) => pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true })))
    await sleep(300)
    const released = performance.now()
    await Promise.all(keys.map((key) => holder.releaseLease(key, 'A')))
    await Promise.all(waits.map((w) => w.done))
    const slowest = Math.max(...waits.map((w) => w.at - released))
    await annotate(`cluster: 12 waiters granted within ${slowest.toFixed(1)} ms of the releases`)
    for (const waiting of waits) expect(waiting.lease).toMatchObject({ owner: 'B' })
    expect(slowest).toBeLessThan(1_000)
    await Promise.all(waits.map((w) => w.lease!.release()))
  })
})

describe.skipIf(EXTERNAL_REDIS)('waiting behind Sentinel', () => {
  let sentinel: RedisSentinel
  beforeAll(async () => {
    sentinel = await startSentinel({ replicas: 1 })
  }, 60_000)
  afterAll(async () => {
    await sentinel?.stop()
  })

  it('wakes a waiter within milliseconds of a release, before and after a failover (listening on the new master)', async ({ annotate }) => {
    const options = { sentinel: { nodes: sentinel.sentinelUrls, masterName: sentinel.masterName }, keyPrefix: `wait-sentinel:${RUN}` }
    const holder = closing(new RedisLeaseProvider(options))
    const waiter = closing(new RedisLeaseProvider(options))
    const wakeAfterRelease = async () => {
      const key = newKey()
      await holder.acquireLease(key, 'A', 60_000)
      const waiting = pending(waiter.hold(key, 'B', { ttlMs: 5_000, wait: true }))
      await sleep(300)
      expect(waiting.settled).toBe(false)
      await holder.releaseLease(key, 'A')
      const released = performance.now()
      await waiting.done
      expect(waiting.lease).toMatchObject({ owner: 'B' })
      await waiting.lease!.release()
      return waiting.at - released
    }
    const before = await wakeAfterRelease()
    await sentinel.killMasterAndWaitForFailover()
    // The holder's next call finds the new master; the waiter's listener reconnects by itself.
    let after = Infinity
    for (let attempt = 0; attempt < 20 && after === Infinity; attempt++) {
      after = await wakeAfterRelease().catch(async () => (await sleep(250), Infinity))
    }
    await annotate(`sentinel: granted ${before.toFixed(1)} ms after the release before the failover, ${after.toFixed(1)} ms after`)
    expect(before).toBeLessThan(1_000)
    expect(after).toBeLessThan(1_000)
  })
})
