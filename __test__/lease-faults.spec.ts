// Mutual exclusion under load and under faults, judged by the lease-history checker
// (helpers/lease-history.ts): per key, the windows over which different owners *believed*
// they held the lease must never overlap, and a counter incremented read-sleep-write under
// the lease must lose no update. Two negative controls show the checker flags real breaks.
import { randomUUID } from 'node:crypto'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisLeaseProvider } from '../index.js'
import { checkCounter, checkLeaseHistory, describeOverlaps, recordLeases, type LeaseOperation } from './helpers/lease-history.js'
import { leaseStorm, unprotectedWithoutPause, type StormConfig, type StormResult } from './helpers/lease-storm.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

const servers: RedisServer[] = []
afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop()))
})

/** A storm of `config.workers` processes on `keys` fresh keys of one redis-server. */
function storm(server: RedisServer, config: Omit<StormConfig, 'keys'> & { keys: number }): Promise<StormResult> {
  const run = randomUUID().slice(0, 8)
  const keys = Array.from({ length: config.keys }, (_, i) => `faults:${run}:thread-${i}\u0000x`)
  return leaseStorm({ url: server.url }, `faults:${run}`, { ...config, keys })
}

describe('the history checker on hand-written histories', () => {
  // Times in ms on a made-up monotonic line.
  const at = (msTime: number) => BigInt(Math.round(msTime * 1e6))
  const op = (o: Omit<LeaseOperation, 'start' | 'end'> & { start: number; end: number }): LeaseOperation => ({
    ...o,
    start: at(o.start),
    end: at(o.end),
  })

  it('accepts a hand-over by transfer and a take-over after the TTL ran out', () => {
    const report = checkLeaseHistory([
      op({ op: 'acquire', key: 'k', owner: 'a', ttlMs: 100, start: 0, end: 1, outcome: 'ok' }),
      op({ op: 'transfer', key: 'k', owner: 'a', to: 'b', ttlMs: 100, start: 50, end: 51, outcome: 'ok' }),
      // b's window is [51, 150]; c gets the key only after that.
      op({ op: 'acquire', key: 'k', owner: 'c', ttlMs: 100, start: 149, end: 151, outcome: 'ok' }),
      op({ op: 'release', key: 'k', owner: 'c', ttlMs: 0, start: 160, end: 161, outcome: 'ok' }),
      op({ op: 'acquire', key: 'k', owner: 'd', ttlMs: 100, start: 161, end: 162, outcome: 'ok' }),
    ])
    expect(report).toMatchObject({ operations: 5, grants: 4, acquisitions: 3, overlaps: [] })
  })

  it('an owner with two calls in flight: a transfer to b racing b’s own release opens no window for b, whichever started first', () => {
    for (const releaseStart of [40, 55]) {
      const report = checkLeaseHistory([
        op({ op: 'acquire', key: 'k', owner: 'a', ttlMs: 100, start: 0, end: 1, outcome: 'ok' }),
        op({ op: 'transfer', key: 'k', owner: 'a', to: 'b', ttlMs: 100, start: 50, end: 60, outcome: 'ok' }),
        // Redis may have run the release after the transfer: the key is free, c takes it.
        op({ op: 'release', key: 'k', owner: 'b', ttlMs: 0, start: releaseStart, end: 62, outcome: 'ok' }),
        op({ op: 'acquire', key: 'k', owner: 'c', ttlMs: 100, start: 70, end: 71, outcome: 'ok' }),
      ])
      expect(report.overlaps, `release started at ${releaseStart}`).toEqual([])
    }
  })

  it('a release that ended before the transfer to its owner started does not hide the overlap that follows', () => {
    const report = checkLeaseHistory([
      op({ op: 'acquire', key: 'k', owner: 'a', ttlMs: 100, start: 0, end: 1, outcome: 'ok' }),
      op({ op: 'release', key: 'k', owner: 'b', ttlMs: 0, start: 40, end: 45, outcome: 'ok' }),
      op({ op: 'transfer', key: 'k', owner: 'a', to: 'b', ttlMs: 100, start: 50, end: 60, outcome: 'ok' }),
      op({ op: 'acquire', key: 'k', owner: 'c', ttlMs: 100, start: 70, end: 71, outcome: 'ok' }),
    ])
    expect(report.overlaps).toHaveLength(1)
    expect(report.overlaps[0]).toMatchObject({ first: { owner: 'b' }, second: { owner: 'c' } })
  })

  it('flags a second owner granted the key inside the first owner’s window, with both windows', () => {
    const report = checkLeaseHistory([
      op({ op: 'acquire', key: 'k', owner: 'a', ttlMs: 100, start: 0, end: 1, outcome: 'ok' }),
      op({ op: 'acquire', key: 'k', owner: 'b', ttlMs: 100, start: 90, end: 91, outcome: 'ok' }),
      op({ op: 'acquire', key: 'other', owner: 'c', ttlMs: 100, start: 0, end: 1, outcome: 'ok' }),
    ])
    expect(report.overlaps).toHaveLength(1)
    expect(report.overlaps[0]).toMatchObject({ key: 'k', first: { owner: 'a', from: at(1), to: at(100) }, second: { owner: 'b' } })
    expect(report.overlaps[0]?.overlapMs).toBeCloseTo(9, 6)
  })

  it('lets a renew with a shorter TTL replace the longer one', () => {
    const history = [
      op({ op: 'acquire', key: 'k', owner: 'a', ttlMs: 500, start: 0, end: 1, outcome: 'ok' }),
      op({ op: 'renew', key: 'k', owner: 'a', ttlMs: 100, start: 10, end: 11, outcome: 'ok' }),
      // a now believes [1, 110] only, so b taking the key at 116 is fine.
      op({ op: 'acquire', key: 'k', owner: 'b', ttlMs: 100, start: 115, end: 116, outcome: 'ok' }),
    ]
    expect(checkLeaseHistory(history).overlaps).toEqual([])
    const withoutRenew = checkLeaseHistory(history.filter((o) => o.op !== 'renew'))
    expect(withoutRenew.overlaps.map((o) => [o.first.owner, o.second.owner])).toEqual([['a', 'b']])
  })

  it('ends a belief at a false renew, and not at a renew that rejected', () => {
    const history = (outcome: LeaseOperation['outcome']) => [
      op({ op: 'acquire', key: 'k', owner: 'b', ttlMs: 300, start: 0, end: 1, outcome: 'ok' }),
      op({ op: 'renew', key: 'k', owner: 'b', ttlMs: 300, start: 200, end: 201, outcome }),
      op({ op: 'acquire', key: 'k', owner: 'c', ttlMs: 100, start: 250, end: 251, outcome: 'ok' }),
    ]
    expect(checkLeaseHistory(history('refused')).overlaps).toEqual([])
    const afterError = checkLeaseHistory(history('error'))
    expect(afterError.errors).toBe(1)
    expect(afterError.overlaps.map((o) => [o.first.owner, o.second.owner, o.overlapMs])).toEqual([['b', 'c', 49]])
  })

  it('counts lost updates as increments the shared value does not show', () => {
    expect(checkCounter(7, 9)).toEqual({ increments: 9, value: 7, lost: 2 })
  })
})

describe.skipIf(EXTERNAL_REDIS)('mutual exclusion, checked from the recorded history', () => {
  let server: RedisServer
  beforeAll(async () => {
    server = await startRedis()
    servers.push(server)
  })

  it('an acquire storm of 16 processes on 4 keys never lets two owners believe they hold a key at once, and loses no update', async ({ annotate }) => {
    const { history, report, counters } = await storm(server, {
      workers: 16,
      keys: 4,
      durationMs: 5_000,
      maxOps: 1_000,
      ttlMinMs: 200,
      ttlMaxMs: 500,
      paceMs: 6,
      walkAway: 0.03,
      broken: false,
    })
    const uses = history.uses.length
    await annotate(
      `storm: ${report.operations} operations checked (${report.acquisitions} acquisitions, ${report.grants} grants, ` +
        `${report.errors} errors), ${report.overlaps.length} overlaps, ${uses} protected increments ` +
        `(${report.unprotectedUses.length - unprotectedWithoutPause(report).length} paused past the margin), ` +
        `counters ${counters.map((c) => `${c.value}/${c.increments}`).join(' ')}`,
    )

    // Not vacuous: every worker finished, and there was real contention over the keys.
    expect(history.summaries).toHaveLength(16)
    expect(report.operations).toBeGreaterThanOrEqual(3_000)
    expect(report.acquisitions).toBeGreaterThanOrEqual(200)
    expect(uses).toBeGreaterThanOrEqual(200)
    for (const kind of ['acquire', 'renew', 'transfer', 'release'] as const) {
      expect(history.operations.filter((o) => o.op === kind && o.outcome === 'ok').length, kind).toBeGreaterThan(0)
    }
    expect(history.operations.filter((o) => o.outcome === 'refused').length, 'contended calls').toBeGreaterThan(0)

    expect(report.errors, 'no call failed against a healthy server').toBe(0)
    expect(report.overlaps, describeOverlaps(report)).toEqual([])
    expect(unprotectedWithoutPause(report), 'every increment ran inside its owner’s believed window').toEqual([])
    for (const c of counters) expect(c.lost, `lost updates on ${JSON.stringify(c.key)}`).toBe(0)
  })

  it('the checker flags a provider that tells every caller it acquired the lease (negative control)', async ({ annotate }) => {
    const { report, counters } = await storm(server, {
      workers: 2,
      keys: 1,
      durationMs: 1_500,
      maxOps: 2_000,
      ttlMinMs: 200,
      ttlMaxMs: 500,
      paceMs: 2,
      walkAway: 0,
      broken: true,
    })
    const lost = counters.reduce((n, c) => n + c.lost, 0)
    await annotate(
      `broken provider: ${report.operations} operations checked, ${report.overlaps.length} overlaps, ${lost} lost updates\n` +
        describeOverlaps(report).split('\n')[0],
    )

    expect(report.operations).toBeGreaterThanOrEqual(300)
    expect(report.overlaps.length).toBeGreaterThanOrEqual(1)
    // The overlap is between the two workers, on the one key.
    const owners = new Set(report.overlaps.flatMap((o) => [o.first.owner.split('/')[0], o.second.owner.split('/')[0]]))
    expect(owners).toEqual(new Set(['w0', 'w1']))
    expect(lost, 'read-sleep-write increments overwrote each other').toBeGreaterThan(0)
  })

  it('the checker flags a redis-server killed and restarted without persistence while a lease is held (negative control)', async ({ annotate }) => {
    const own = await startRedis()
    servers.push(own)
    const key = `faults:${randomUUID().slice(0, 8)}:thread\u0000kill`
    const ops: LeaseOperation[] = []
    const a = recordLeases(new RedisLeaseProvider({ url: own.url }), (op) => ops.push(op))
    const b = recordLeases(new RedisLeaseProvider({ url: own.url }), (op) => ops.push(op))
    try {
      expect(await a.acquireLease(key, 'owner-a', 30_000)).toStrictEqual({ acquired: true, owner: 'owner-a' })
      expect(await b.acquireLease(key, 'owner-b', 30_000)).toEqual({ acquired: false, owner: 'owner-a' })
      expect(checkLeaseHistory(ops).overlaps, 'no overlap before the fault').toEqual([])

      // The fault: SIGKILL, then a fresh server on the same port with no data.
      await own.kill()
      await own.restart()

      // B's provider reconnects; calls during the reconnect may reject (recorded as errors).
      let grant: { acquired: boolean; owner?: string } | undefined
      const deadline = Date.now() + 10_000
      while (!grant && Date.now() < deadline) {
        grant = await b.acquireLease(key, 'owner-b', 30_000).catch(() => undefined)
        if (!grant) await new Promise((r) => setTimeout(r, 50))
      }
      expect(grant, 'B acquires the wiped lease while A still believes it holds it').toStrictEqual({ acquired: true, owner: 'owner-b' })
      // A finds out only at its next renew (once its own provider has reconnected too).
      let renewed: boolean | undefined
      while (renewed === undefined && Date.now() < deadline) {
        renewed = await a.renewLease(key, 'owner-a', 30_000).catch(() => undefined)
        if (renewed === undefined) await new Promise((r) => setTimeout(r, 50))
      }
      expect(renewed).toBe(false)
    } finally {
      await a.close()
      await b.close()
    }

    const report = checkLeaseHistory(ops)
    await annotate(`kill -9 + restart: ${report.operations} operations checked, ${report.overlaps.length} overlaps\n${describeOverlaps(report)}`)
    expect(report.overlaps).toHaveLength(1)
    const [overlap] = report.overlaps
    expect(overlap?.key).toBe(key)
    expect([overlap?.first.owner, overlap?.second.owner]).toEqual(['owner-a', 'owner-b'])
    // A's window was cut short by its false renew, after B's began.
    expect(overlap?.first.endedBy?.op).toBe('renew')
    expect(overlap?.overlapMs).toBeGreaterThan(0)
  })
})
