// Lease records with metadata (this package's; Mastra proposed them, unmerged): the holder is the owner with
// its run's identity, so two runs under one owner id never both hold a key. Against Mastra's
// own Redis layout both ways (its backend writes `<prefix>:lease:<key>`, the owner alone, with
// raw commands; node-redis plays it here; our metadata lives in the lease's companion key,
// `<prefix>:fence:{<tag>}:<key>`), and in a history-checked round of runs sharing one owner
// id, with a negative control that drops the metadata and must find two holders at once.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { EventEmitterPubSub } from '@mastra/core/events'
import { createClient } from 'redis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub, withLeases } from '../dist/esm/index.js'
import { checkLeaseHistory, describeOverlaps, recordLeases, type LeaseOperation } from './helpers/lease-history.js'
import { sleep, uniqueKey } from './helpers/lease.js'
import { closing, leaseSuite, RUN } from './helpers/lease-runs.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()

let redis: RedisServer
let mastra: ReturnType<typeof createClient>
const PREFIX = `meta-${RUN}`

beforeAll(async () => {
  redis = await startRedis()
  // Mastra's backend is a node-redis client writing plain commands: this is that client.
  mastra = createClient({ url: redis.url })
  await mastra.connect()
})

afterAll(async () => {
  await mastra?.close()
  await redis?.stop()
})

const leaseKey = (key: string) => `${PREFIX}:lease:${key}`
/** The lease's companion keys in Redis (its name carries its slot's tag): none or one. */
const companionKeys = async (key: string) => (await mastra.keys(`${PREFIX}:fence:*`)).filter((name) => name.endsWith(`}:${key}`))

describe("Mastra's lease layout, both ways", () => {
  it("a lease Mastra's backend wrote (its key alone) is a holder without metadata: refused to a run with metadata, renewed and released as the plain holder it is", async () => {
    const leases = closing(new RedisLeaseProvider({ url: redis.url, keyPrefix: PREFIX }))
    const key = uniqueKey('from-mastra')
    await mastra.set(leaseKey(key), 'worker-1', { expiration: { type: 'PX', value: 30_000 } })

    expect(await leases.getLeaseRecord(key)).toStrictEqual({ owner: 'worker-1' })
    expect(await leases.getLeaseOwner(key)).toBe('worker-1')
    expect(await leases.acquireLease(key, 'worker-1', 30_000, 'run-1')).toStrictEqual({ acquired: false, owner: 'worker-1' })
    expect(await leases.renewLease(key, 'worker-1', 60_000, 'run-1')).toBe(false)
    await leases.releaseLease(key, 'worker-1', 'run-1')
    expect(await mastra.get(leaseKey(key))).toBe('worker-1')

    expect(await leases.acquireLease(key, 'worker-1', 30_000)).toStrictEqual({ acquired: true, owner: 'worker-1' })
    expect(await leases.renewLease(key, 'worker-1', 60_000)).toBe(true)
    expect(await mastra.pTTL(leaseKey(key))).toBeGreaterThan(50_000)
    // Nothing beside it: Mastra's calls leave the lease its key alone.
    expect(await companionKeys(key)).toEqual([])
    await leases.releaseLease(key, 'worker-1')
    expect(await mastra.exists(leaseKey(key))).toBe(0)
  })

  it("a lease we grant with metadata is where Mastra's backend reads its owner: the owner plain, the metadata in the companion key after its holder, one expiry", async () => {
    const leases = closing(new RedisLeaseProvider({ url: redis.url, keyPrefix: PREFIX }))
    const key = uniqueKey('to-mastra')
    expect(await leases.acquireLease(key, 'worker-1', 20_000, 'run-1')).toStrictEqual({ acquired: true, owner: 'worker-1' })
    expect(await mastra.get(leaseKey(key))).toBe('worker-1')
    const [companion, ...more] = await companionKeys(key)
    expect(more).toEqual([])
    // "<token>:<transfer id>:<holder's length>:<holder><metadata>"
    expect(await mastra.get(companion!)).toBe('::8:worker-1run-1')
    const [leaseTtl, companionTtl] = await Promise.all([mastra.pTTL(leaseKey(key)), mastra.pTTL(companion!)])
    expect(leaseTtl).toBeGreaterThan(19_000)
    expect(Math.abs(leaseTtl - companionTtl)).toBeLessThan(100)

    // A transfer writes the new holder's pair; one to no metadata removes it (a 1.71 holder).
    expect(await leases.transferLease(key, 'worker-1', 'worker-2', 20_000, 'run-1', 'run-2')).toBe(true)
    expect([await mastra.get(leaseKey(key)), await mastra.get(companion!)]).toEqual(['worker-2', '::8:worker-2run-2'])
    expect(await leases.transferLease(key, 'worker-2', 'worker-3', 20_000, 'run-2')).toBe(true)
    expect(await mastra.get(leaseKey(key))).toBe('worker-3')
    expect(await mastra.exists(companion!)).toBe(0)

    await leases.releaseLease(key, 'worker-3')
    expect(await mastra.exists([leaseKey(key), companion!])).toBe(0)
  })

  it("a holder Mastra's backend moved the lease key to (its transfer) inherits neither the metadata nor the token of the grant before", async () => {
    const leases = closing(new RedisLeaseProvider({ url: redis.url, keyPrefix: PREFIX }))
    const key = uniqueKey('moved-by-mastra')
    const first = await leases.acquireFencedLease(key, 'worker-1', 20_000, 'run-1')
    expect(first).toStrictEqual({ acquired: true, owner: 'worker-1', token: expect.any(Number) })
    await mastra.set(leaseKey(key), 'worker-2', { expiration: { type: 'PX', value: 20_000 } })
    expect(await leases.getLeaseRecord(key)).toStrictEqual({ owner: 'worker-2' })
    expect(await leases.getLease(key)).toEqual({ owner: 'worker-2', token: undefined, ttlMs: expect.any(Number) })
    expect(await leases.renewLease(key, 'worker-2', 20_000, 'run-1')).toBe(false)
    expect(await leases.renewLease(key, 'worker-2', 20_000)).toBe(true)
    await leases.releaseLease(key, 'worker-2')
    expect(await leases.getLeaseOwner(key)).toBeUndefined()
  })

  it('a plain acquire leaves no companion key behind, and a grant over an expired one with metadata clears it', async () => {
    const leases = closing(new RedisLeaseProvider({ url: redis.url, keyPrefix: PREFIX }))
    const key = uniqueKey('plain')
    expect(await leases.acquireLease(key, 'worker-1', 80, 'run-1')).toStrictEqual({ acquired: true, owner: 'worker-1' })
    expect(await companionKeys(key)).toHaveLength(1)
    await sleep(120)
    // The metadata expired with its lease: the next holder has none, and none lingers.
    expect(await leases.acquireLease(key, 'worker-2', 10_000)).toStrictEqual({ acquired: true, owner: 'worker-2' })
    expect(await leases.getLeaseRecord(key)).toStrictEqual({ owner: 'worker-2' })
    expect(await companionKeys(key)).toEqual([])
  })

  it('an owner that looks like JSON is an owner, never read as a record', async () => {
    const leases = closing(new RedisLeaseProvider({ url: redis.url, keyPrefix: PREFIX }))
    const key = uniqueKey('json-owner')
    const owner = JSON.stringify({ owner: 'worker-1', metadata: 'run-1' })
    await mastra.set(leaseKey(key), owner, { expiration: { type: 'PX', value: 30_000 } })
    expect(await leases.getLeaseRecord(key)).toStrictEqual({ owner })
    expect(await leases.acquireLease(key, 'worker-1', 30_000, 'run-1')).toStrictEqual({ acquired: false, owner })
    expect(await leases.renewLease(key, owner, 30_000)).toBe(true)
  })

  it('an owner and metadata holding colons, digits and NULs read back whole: only the holder with that very metadata holds', async () => {
    const leases = closing(new RedisLeaseProvider({ url: redis.url, keyPrefix: PREFIX }))
    const key = uniqueKey('bytes')
    const owner = '12:3:w\0:'
    const metadata = ':4:\0run:'
    expect(await leases.acquireFencedLease(key, owner, 20_000, metadata)).toMatchObject({ acquired: true, owner })
    expect(await leases.getLeaseRecord(key)).toStrictEqual({ owner, metadata })
    for (const other of [':4:', metadata.slice(1), `${metadata}x`, metadata.slice(0, -1)]) {
      expect(await leases.acquireLease(key, owner, 20_000, other)).toStrictEqual({ acquired: false, owner })
      expect(await leases.renewLease(key, owner, 20_000, other)).toBe(false)
    }
    expect(await leases.renewLease(key, owner, 20_000)).toBe(false)
    expect(await leases.renewLease(key, owner, 20_000, metadata)).toBe(true)
    await leases.releaseLease(key, owner, metadata)
    expect(await leases.getLeaseOwner(key)).toBeUndefined()
  })
})

describe('withLeases', () => {
  it('has getLeaseRecord exactly when its provider has it, and passes every metadata on', async () => {
    const leases = closing(new MemoryLeaseProvider())
    const pubsub = withLeases(new EventEmitterPubSub(), leases)
    const key = uniqueKey('with-leases')
    expect(typeof pubsub.getLeaseRecord).toBe('function')
    expect(await pubsub.acquireLease(key, 'worker-1', 10_000, 'run-1')).toStrictEqual({ acquired: true, owner: 'worker-1' })
    expect(await pubsub.acquireLease(key, 'worker-1', 10_000, 'run-2')).toStrictEqual({ acquired: false, owner: 'worker-1' })
    expect(await pubsub.renewLease(key, 'worker-1', 10_000, 'run-2')).toBe(false)
    expect(await pubsub.transferLease(key, 'worker-1', 'worker-2', 10_000, 'run-1', 'run-3')).toBe(true)
    expect(await pubsub.getLeaseRecord!(key)).toStrictEqual({ owner: 'worker-2', metadata: 'run-3' })
    await pubsub.releaseLease(key, 'worker-2', 'run-3')
    expect(await leases.getLeaseRecord(key)).toBeUndefined()

    // A provider of Mastra's 1.71 shape (five methods, no records): no getLeaseRecord at
    // all, so Mastra's structural check does not take the pubsub for a record provider.
    const five = {
      acquireLease: (key: string, owner: string, ttlMs: number) => leases.acquireLease(key, owner, ttlMs),
      getLeaseOwner: (key: string) => leases.getLeaseOwner(key),
      releaseLease: (key: string, owner: string) => leases.releaseLease(key, owner),
      renewLease: (key: string, owner: string, ttlMs: number) => leases.renewLease(key, owner, ttlMs),
      transferLease: (key: string, from: string, to: string, ttlMs: number) => leases.transferLease(key, from, to, ttlMs),
    }
    const plain = withLeases(new EventEmitterPubSub(), five)
    expect('getLeaseRecord' in plain).toBe(false)
    expect(typeof (plain as { getLeaseRecord?: unknown }).getLeaseRecord).toBe('undefined')
    expect('acquireFencedLease' in plain).toBe(false)
    // hold() over it still holds, with no token to be had.
    const held = await plain.hold(uniqueKey('plain-hold'), 'worker-1', { ttlMs: 1_000 })
    expect(held.token).toBeUndefined()
    await held.release()
  })
})

describe('hold() with metadata', () => {
  it('holds for its run: another run of the same owner id is refused while renewals keep it, and the release frees it', async () => {
    const leases = closing(new RedisLeaseProvider({ url: redis.url, keyPrefix: PREFIX }))
    const key = uniqueKey('hold')
    const lease = await leases.hold(key, 'worker-1', { ttlMs: 300, metadata: 'run-1' })
    expect([lease.metadata, typeof lease.token]).toEqual(['run-1', 'number'])
    await sleep(700) // past two TTLs: only its renewals (with its metadata) keep it
    expect(lease.signal.aborted).toBe(false)
    expect(await leases.acquireLease(key, 'worker-1', 300, 'run-2')).toStrictEqual({ acquired: false, owner: 'worker-1' })
    expect(await leases.getLeaseRecord(key)).toStrictEqual({ owner: 'worker-1', metadata: 'run-1' })
    await lease.release()
    expect(await leases.getLeaseRecord(key)).toBeUndefined()
    await expect(leases.hold(key, 'worker-1', { ttlMs: 300, metadata: 7 as never })).rejects.toMatchObject({ code: 'ERR_LEASE_INVALID_METADATA' })
  })
})

/** One run of a thread: its owner id (shared with other runs) and its identity, the metadata. */
interface Run {
  /** How the history checker names this holder: owner and run together. */
  label: string
  owner: string
  metadata: string
}

type MetadataProvider = {
  acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<{ acquired: boolean; owner?: string }>
  renewLease(key: string, owner: string, ttlMs: number, metadata?: string): Promise<boolean>
  releaseLease(key: string, owner: string, metadata?: string): Promise<void>
  transferLease(key: string, from: string, to: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): Promise<boolean>
  getLeaseOwner(key: string): Promise<string | undefined>
  close(): Promise<void>
}

/**
 * The provider as the history checker sees it: each run a holder of its own (its label),
 * called on the real provider as its shared owner id with its metadata; `withMetadata: false`
 * drops the metadata, the bug the records exist to close (the negative control).
 */
function asRuns(provider: MetadataProvider, runs: Map<string, Run>, withMetadata: boolean): MetadataProvider {
  const run = (label: string) => runs.get(label)!
  const meta = (label: string) => (withMetadata ? run(label).metadata : undefined)
  return {
    acquireLease: (key, label, ttlMs) => provider.acquireLease(key, run(label).owner, ttlMs, meta(label)),
    renewLease: (key, label, ttlMs) => provider.renewLease(key, run(label).owner, ttlMs, meta(label)),
    releaseLease: (key, label) => provider.releaseLease(key, run(label).owner, meta(label)),
    transferLease: (key, from, to, ttlMs) => provider.transferLease(key, run(from).owner, run(to).owner, ttlMs, meta(from), meta(to)),
    getLeaseOwner: (key) => provider.getLeaseOwner(key),
    close: () => provider.close(),
  }
}

/**
 * Runs of two owner ids (three runs each) contend for `keys` for `durationMs`: each acquires,
 * renews while it believes it holds, sometimes hands the lease to another run of its own
 * owner id, releases or walks away. Returns the checked history.
 */
async function contend(provider: MetadataProvider, withMetadata: boolean, keys: string[], durationMs: number) {
  const runs = new Map<string, Run>()
  for (const owner of ['worker-a', 'worker-b']) {
    for (const n of [1, 2, 3]) runs.set(`${owner}/run-${n}`, { label: `${owner}/run-${n}`, owner, metadata: `run-${n}` })
  }
  const ops: LeaseOperation[] = []
  const leases = recordLeases(asRuns(provider, runs, withMetadata), (op: LeaseOperation) => ops.push(op))
  const until = performance.now() + durationMs
  const labels = [...runs.keys()]
  let seed = 7
  const random = () => ((seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31)
  await Promise.all(
    labels.map(async (label) => {
      while (performance.now() < until) {
        const key = keys[Math.floor(random() * keys.length)]!
        const ttl = 150 + Math.floor(random() * 250)
        const grant = await leases.acquireLease(key, label, ttl)
        if (!grant.acquired) {
          await sleep(5 + random() * 20)
          continue
        }
        for (let step = 0; step < 3 && performance.now() < until; step++) {
          await sleep(random() * ttl * 0.5)
          const roll = random()
          if (roll < 0.15) {
            const sibling = labels.find((l) => l !== label && runs.get(l)!.owner === runs.get(label)!.owner && random() < 0.5)
            if (sibling !== undefined && (await leases.transferLease(key, label, sibling, ttl))) break
          } else if (roll < 0.3) {
            await leases.releaseLease(key, label)
            break
          } else if (roll < 0.4) {
            break // walks away: the lease expires
          }
          if (!(await leases.renewLease(key, label, ttl))) break
        }
      }
    }),
  )
  return checkLeaseHistory(ops)
}

describe('runs sharing one owner id, history-checked', () => {
  const providers: Array<[string, () => MetadataProvider]> = [
    ['in memory', () => new MemoryLeaseProvider()],
    ['on one Redis server', () => new RedisLeaseProvider({ url: redis.url, keyPrefix: PREFIX })],
    ['through RedisStreamsPubSub', () => new RedisStreamsPubSub({ url: redis.url, keyPrefix: `${PREFIX}-streams` })],
  ]
  for (const [where, make] of providers) {
    it(`${where}: two runs with one owner id and different metadata never hold a key at once`, async ({ annotate }) => {
      const provider = closing(make())
      const keys = [uniqueKey('runs-0'), uniqueKey('runs-1')]
      const report = await contend(provider, true, keys, 2_500)
      await annotate(`${report.operations} calls, ${report.grants} grants (${report.acquisitions} acquisitions), ${report.errors} errors, 0 overlaps expected`)
      expect(report.errors).toBe(0)
      // Enough contention that a broken store would have shown it.
      expect(report.acquisitions).toBeGreaterThan(20)
      expect(report.overlaps, describeOverlaps(report)).toEqual([])
    })
  }

  it('the negative control: without the metadata the same round finds two runs holding one key at once', async ({ annotate }) => {
    const provider = closing(new RedisLeaseProvider({ url: redis.url, keyPrefix: PREFIX }))
    const report = await contend(provider, false, [uniqueKey('control')], 1_500)
    await annotate(`${report.overlaps.length} overlaps among ${report.grants} grants`)
    expect(report.overlaps.length).toBeGreaterThan(0)
  })
})
