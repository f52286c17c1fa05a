// Failover-safe grants (`minReplicas`) with a replica that lags, stops or is gone: a grant
// waits for replicas on a connection of its own, so it answers ERR_LEASE_REPLICATION within
// `replicaTimeoutMs` of being sent whatever else is in flight, and reads, refusals, releases
// and publishes never wait behind a confirmation. Every call's latency and outcome is
// recorded and reported.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisLeaseProvider, RedisStreamsPubSub } from '../dist/esm/index.js'
import { errorCode, leaseFailureWarnings, sleep } from './helpers/lease.js'
import { closing, leaseSuite, RUN } from './helpers/lease-runs.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { startSentinel, type RedisSentinel } from './helpers/redis-sentinel.js'

leaseSuite()
// Grants refused for want of a replica warn through process.emitWarning (no logger here).
const leaseWarnings = leaseFailureWarnings()

const REPLICA_TIMEOUT = 300
const COMMAND_TIMEOUT = 2_000
/** How long past `replicaTimeoutMs` a refused grant may take: the round trips, a busy test process. */
const GRANT_SLACK = 250
/** What "at once" means for a call that waits for nobody, with room for a busy test process. */
const PROMPT_MS = 150

interface Outcome {
  kind: string
  ms: number
  code: string
}

/** Runs `call`, timing it and keeping its error code ('ok' when it resolved). */
async function timedOutcome(kind: string, call: () => Promise<unknown>): Promise<Outcome> {
  const start = performance.now()
  try {
    await call()
    return { kind, ms: performance.now() - start, code: 'ok' }
  } catch (err) {
    return { kind, ms: performance.now() - start, code: String(errorCode(err) ?? err) }
  }
}

/** Per kind: how many calls, their codes, and the slowest. */
function summary(outcomes: Outcome[]): string {
  const kinds = [...new Set(outcomes.map((o) => o.kind))]
  return kinds
    .map((kind) => {
      const of = outcomes.filter((o) => o.kind === kind)
      const codes = [...new Set(of.map((o) => o.code))].map((c) => `${of.filter((o) => o.code === c).length} ${c}`)
      const ms = of.map((o) => o.ms).sort((a, b) => a - b)
      return `${of.length} ${kind}: ${codes.join(', ')}, p50 ${ms[Math.floor(ms.length / 2)]!.toFixed(1)} ms, max ${ms.at(-1)!.toFixed(1)} ms`
    })
    .join('; ')
}

/** Checks each kind's outcomes: prompt kinds resolve at once, grants reject ERR_LEASE_REPLICATION in time. */
function judge(outcomes: Outcome[], grantKinds: string[]) {
  for (const o of outcomes) {
    if (grantKinds.includes(o.kind)) {
      expect(o.code, `${o.kind} after ${o.ms.toFixed(0)} ms`).toBe('ERR_LEASE_REPLICATION')
      expect(o.ms, o.kind).toBeLessThan(REPLICA_TIMEOUT + GRANT_SLACK)
    } else {
      expect(o.code, `${o.kind} after ${o.ms.toFixed(0)} ms`).toBe('ok')
      expect(o.ms, o.kind).toBeLessThan(PROMPT_MS)
    }
  }
}

/** A replica of `master`, in sync. */
async function replicaOf(master: RedisServer): Promise<RedisServer> {
  const replica = await startRedis({ args: ['--replicaof', '127.0.0.1', String(master.port)] })
  const deadline = performance.now() + 10_000
  while ((await replica.info('replication'))['master_link_status'] !== 'up') {
    if (performance.now() > deadline) throw new Error('the replica did not sync')
    await sleep(20)
  }
  return replica
}

interface Provider {
  acquireLease(key: string, owner: string, ttlMs: number): Promise<{ acquired: boolean; owner?: string }>
  getLeaseOwner(key: string): Promise<string | undefined>
  releaseLease(key: string, owner: string): Promise<void>
  renewLease(key: string, owner: string, ttlMs: number): Promise<boolean>
}

/**
 * Keys set up while the replicas still answer: `held` by another owner (refusals), `mine`
 * held by `me` (releases), then `fault()` runs, then everything in one turn: `grants`
 * acquires of free keys, reads, refusals and releases.
 */
async function oneTurn(p: Provider, label: string, counts: { grants: number; others: number }, fault: () => Promise<void>) {
  const key = (what: string, i: number) => `replication:${RUN}:${label}:${what}:${i}`
  for (let i = 0; i < counts.others; i++) {
    expect(await p.acquireLease(key('held', i), 'other', 60_000)).toMatchObject({ acquired: true, owner: 'other' })
    expect(await p.acquireLease(key('mine', i), 'me', 60_000)).toMatchObject({ acquired: true, owner: 'me' })
  }
  await fault()
  const calls: Array<Promise<Outcome>> = []
  for (let i = 0; i < counts.grants; i++) calls.push(timedOutcome('grant', () => p.acquireLease(key('free', i), 'me', 60_000)))
  for (let i = 0; i < counts.others; i++) {
    calls.push(timedOutcome('read', () => p.getLeaseOwner(key('held', i))))
    calls.push(
      timedOutcome('refusal', async () => {
        const answer = await p.acquireLease(key('held', i), 'me', 60_000)
        if (answer.acquired) throw new Error('a held key was granted')
      }),
    )
    calls.push(timedOutcome('release', () => p.releaseLease(key('mine', i), 'me')))
  }
  return Promise.all(calls)
}

/**
 * One call every `everyMs`, cycling through a read, a refusal and a grant, `n` in all. `held`
 * must be held by another owner already.
 */
async function paced(p: Provider, label: string, held: string, n: number, everyMs: number): Promise<Outcome[]> {
  const calls: Array<Promise<Outcome>> = []
  for (let i = 0; i < n; i++) {
    const kind = ['read', 'refusal', 'grant'][i % 3]!
    if (kind === 'read') calls.push(timedOutcome(kind, () => p.getLeaseOwner(held)))
    else if (kind === 'refusal') calls.push(timedOutcome(kind, async () => void (await p.acquireLease(held, 'me', 60_000))))
    else calls.push(timedOutcome(kind, () => p.acquireLease(`replication:${RUN}:${label}:paced:${i}`, 'me', 60_000)))
    await sleep(everyMs)
  }
  return Promise.all(calls)
}

describe.skipIf(EXTERNAL_REDIS)('minReplicas with one replica that stops answering', () => {
  let master: RedisServer
  let replica: RedisServer
  beforeAll(async () => {
    master = await startRedis()
    replica = await replicaOf(master)
  })
  afterAll(async () => {
    replica.thaw()
    await replica.stop()
    await master.stop()
  })

  const provider = (extra: object = {}) =>
    closing(new RedisLeaseProvider({ url: master.url, minReplicas: 1, replicaTimeoutMs: REPLICA_TIMEOUT, commandTimeoutMs: COMMAND_TIMEOUT, ...extra }))

  it('200 grants in one turn each reject ERR_LEASE_REPLICATION within replicaTimeoutMs, and the reads, refusals and releases beside them answer at once', async ({
    annotate,
  }) => {
    const p = provider()
    try {
      const outcomes = await oneTurn(p, 'stopped', { grants: 200, others: 50 }, async () => replica.freeze())
      await annotate(`replica stopped (SIGSTOP), one turn: ${summary(outcomes)}`)
      judge(outcomes, ['grant'])
    } finally {
      replica.thaw()
    }
  })

  it('one call every 10 ms: every read and refusal answers at once, every grant rejects ERR_LEASE_REPLICATION within replicaTimeoutMs', async ({ annotate }) => {
    const p = provider()
    const held = `replication:${RUN}:paced:held`
    expect(await p.acquireLease(held, 'other', 60_000)).toMatchObject({ acquired: true, owner: 'other' })
    replica.freeze()
    try {
      const outcomes = await paced(p, 'paced', held, 100, 10)
      await annotate(`replica stopped (SIGSTOP), a call every 10 ms: ${summary(outcomes)}`)
      judge(outcomes, ['grant'])
    } finally {
      replica.thaw()
    }
  })

  it('with the script cache flushed, a grant sends one confirmation: it rejects ERR_LEASE_REPLICATION within replicaTimeoutMs, not twice that', async ({
    annotate,
  }) => {
    const p = provider()
    const outcomes: Outcome[] = []
    replica.freeze()
    try {
      for (let i = 0; i < 5; i++) {
        await master.flushScripts()
        outcomes.push(await timedOutcome('grant', () => p.acquireLease(`replication:${RUN}:cold:${i}`, 'me', 60_000)))
        outcomes.push(await timedOutcome('renewal', () => p.renewLease(`replication:${RUN}:cold:${i}`, 'me', 60_000)))
      }
      await annotate(`replica stopped, SCRIPT FLUSH before each grant: ${summary(outcomes)}`)
      judge(outcomes, ['grant', 'renewal'])
    } finally {
      replica.thaw()
    }
  })

  it('the streams pubsub with minReplicas publishes at once while its grants wait for the stopped replica', async ({ annotate }) => {
    const pubsub = closing(
      new RedisStreamsPubSub({ url: master.url, minReplicas: 1, replicaTimeoutMs: REPLICA_TIMEOUT, commandTimeoutMs: COMMAND_TIMEOUT }),
    )
    replica.freeze()
    try {
      const calls: Array<Promise<Outcome>> = []
      for (let i = 0; i < 75; i++) {
        calls.push(timedOutcome('grant', () => pubsub.acquireLease(`replication:${RUN}:streams:${i}`, 'me', 60_000)))
        calls.push(
          timedOutcome('publish', () =>
            pubsub.publish(`replication-${RUN}`, { type: 'tick', id: String(i), data: { i }, runId: 'r' } as never),
          ),
        )
        if (i % 5 === 4) await sleep(10)
      }
      const outcomes = await Promise.all(calls)
      await annotate(`replica stopped, streams pubsub: ${summary(outcomes)}`)
      judge(outcomes, ['grant'])
    } finally {
      replica.thaw()
    }
  })

  it('once the replica answers again, grants are confirmed again', async () => {
    const p = provider()
    expect(await p.acquireLease(`replication:${RUN}:back`, 'me', 60_000)).toMatchObject({ acquired: true, owner: 'me' })
  })
})

describe.skipIf(EXTERNAL_REDIS)('minReplicas with the replica killed', () => {
  it('grants reject ERR_LEASE_REPLICATION within replicaTimeoutMs; reads, refusals and releases answer at once', async ({ annotate }) => {
    const master = await startRedis()
    const replica = await replicaOf(master)
    try {
      const p = closing(new RedisLeaseProvider({ url: master.url, minReplicas: 1, replicaTimeoutMs: REPLICA_TIMEOUT, commandTimeoutMs: COMMAND_TIMEOUT }))
      const held = `replication:${RUN}:killed:paced-held`
      const outcomes = await oneTurn(p, 'killed', { grants: 100, others: 30 }, async () => {
        expect(await p.acquireLease(held, 'other', 60_000)).toMatchObject({ acquired: true, owner: 'other' })
        await replica.kill()
      })
      const later = await paced(p, 'killed-paced', held, 60, 10)
      await annotate(`replica killed: one turn: ${summary(outcomes)}; a call every 10 ms: ${summary(later)}`)
      judge([...outcomes, ...later], ['grant'])
      await leaseWarnings.warned('ERR_LEASE_REPLICATION')
    } finally {
      await replica.stop()
      await master.stop()
    }
  })
})

describe.skipIf(EXTERNAL_REDIS)('minReplicas behind Sentinel, a replica stopped', () => {
  let sentinel: RedisSentinel
  beforeAll(async () => {
    sentinel = await startSentinel({ replicas: 1 })
  }, 40_000)
  afterAll(async () => sentinel?.stop())

  it('grants reject ERR_LEASE_REPLICATION within replicaTimeoutMs; reads, refusals and releases answer at once', async ({ annotate }) => {
    const p = closing(
      new RedisLeaseProvider({
        sentinel: { nodes: sentinel.sentinelUrls, masterName: sentinel.masterName },
        minReplicas: 1,
        replicaTimeoutMs: REPLICA_TIMEOUT,
        commandTimeoutMs: COMMAND_TIMEOUT,
      }),
    )
    const replica = sentinel.servers[1]!
    try {
      const outcomes = await oneTurn(p, 'sentinel', { grants: 100, others: 30 }, async () => replica.freeze())
      await annotate(`Sentinel, replica stopped: ${summary(outcomes)}`)
      judge(outcomes, ['grant'])
    } finally {
      replica.thaw()
    }
  })
})

describe.skipIf(EXTERNAL_REDIS)('minReplicas on a Cluster whose master failed over', () => {
  let cluster: RedisCluster
  beforeAll(async () => {
    cluster = await startCluster({ masters: 3, replicasPerMaster: 1 })
  }, 40_000)
  afterAll(async () => cluster?.stop())

  it('the holder’s renewals on the promoted master (no replica left) reject ERR_LEASE_REPLICATION within replicaTimeoutMs, none times out', async ({
    annotate,
  }) => {
    const p = closing(
      new RedisLeaseProvider({ cluster: { nodes: cluster.urls }, minReplicas: 1, replicaTimeoutMs: REPLICA_TIMEOUT, commandTimeoutMs: COMMAND_TIMEOUT }),
    )
    const victim = (await cluster.masters())[0]!
    const keys: string[] = []
    for (let i = 0; keys.length < 30; i++) {
      if ((await cluster.masterOfSlot(await cluster.keySlot(`{${i}}`))) === victim) keys.push(`{${i}}replication:${RUN}`)
    }
    // The leases to lose, each confirmed by the victim's replica first. On a loaded machine a
    // replica just started may miss one 300 ms confirmation: that grant is asked for again.
    for (const key of keys) {
      for (let attempt = 1; ; attempt++) {
        const granted = await p.acquireLease(key, 'me', 60_000).catch((err: unknown) => {
          if (errorCode(err) !== 'ERR_LEASE_REPLICATION' || attempt === 5) throw err
        })
        if (granted) {
          expect(granted).toMatchObject({ acquired: true, owner: 'me' })
          break
        }
      }
    }
    await cluster.killMasterAndWaitForPromotion(victim)
    // The first calls after the failover may meet the dead node; wait until one answers.
    const deadline = performance.now() + 10_000
    while ((await timedOutcome('probe', () => p.getLeaseOwner(keys[0]!))).code !== 'ok' && performance.now() < deadline) await sleep(50)
    const outcomes: Outcome[] = []
    for (let round = 0; round < 10; round++) {
      const turn = keys.map((key) => timedOutcome('renewal', () => p.renewLease(key, 'me', 60_000)))
      turn.push(...keys.map((key) => timedOutcome('read', () => p.getLeaseOwner(key))))
      outcomes.push(...(await Promise.all(turn)))
    }
    await annotate(`Cluster, a master killed and its replica promoted: ${summary(outcomes)}`)
    judge(outcomes, ['renewal'])
  }, 60_000)
})

describe.skipIf(EXTERNAL_REDIS)('minReplicas on a server that does not run WAIT', () => {
  /** A grant refused for want of WAIT: the code, and a message naming the command and the option. */
  const noWait = (outcome: { code: string; message: string }) => {
    expect(outcome.code).toBe('ERR_LEASE_UNSUPPORTED_COMMAND')
    expect(outcome.message).toMatch(/WAIT/)
    expect(outcome.message).toMatch(/minReplicas/)
  }
  const attempt = async (call: () => Promise<unknown>) => {
    try {
      await call()
      return { code: 'ok', message: '' }
    } catch (err) {
      return { code: String(errorCode(err)), message: (err as Error).message }
    }
  }

  for (const how of ['renamed away (--rename-command)', 'refused by the ACL user']) {
    it(`WAIT ${how}: every grant rejects ERR_LEASE_UNSUPPORTED_COMMAND naming WAIT and minReplicas, later ones before anything is sent; reads and releases still work`, async () => {
      const renamed = how.startsWith('renamed')
      const server = await startRedis({ args: renamed ? ['--rename-command', 'WAIT', ''] : [] })
      try {
        let url = server.url
        if (!renamed) {
          await server.cli('ACL', 'SETUSER', 'nowait', 'on', '>pw', '~*', '&*', '+@all', '-wait')
          url = server.url.replace('redis://', 'redis://nowait:pw@')
        }
        const p = closing(new RedisLeaseProvider({ url, minReplicas: 1, replicaTimeoutMs: REPLICA_TIMEOUT, commandTimeoutMs: COMMAND_TIMEOUT }))
        const key = `replication:${RUN}:nowait`
        noWait(await attempt(() => p.acquireLease(key, 'me', 60_000)))
        // Known now: the next grants are refused before anything is sent.
        const before = await server.commandCalls()
        noWait(await attempt(() => p.acquireLease(`${key}:2`, 'me', 60_000)))
        noWait(await attempt(() => p.renewLease(key, 'me', 60_000)))
        noWait(await attempt(() => p.transferLease(key, 'me', 'you', 60_000)))
        const after = await server.commandCalls()
        expect((after['evalsha'] ?? 0) - (before['evalsha'] ?? 0)).toBe(0)
        expect((after['set'] ?? 0) - (before['set'] ?? 0)).toBe(0)
        // The first grant was written (unconfirmed): its owner reads it and releases it.
        expect(await p.getLeaseOwner(key)).toBe('me')
        await p.releaseLease(key, 'me')
        expect(await p.getLeaseOwner(key)).toBeUndefined()
        await leaseWarnings.warned('ERR_LEASE_UNSUPPORTED_COMMAND')
      } finally {
        await server.stop()
      }
    })
  }
})
