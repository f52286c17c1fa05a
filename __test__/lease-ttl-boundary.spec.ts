// Renewing leases right at their expiry (50 ms TTLs): a renew is true only while the lease
// lived, a false one never re-creates it, no renew wins after a rival acquired. The store is
// read straight after every renew, and the lease-interval history checker judges the run;
// negative controls run stores with the fault through the same checks.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { beforeAll, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider } from '../dist/esm/index.js'
import { bindLeases, checkLeaseHistory, describeOverlaps, recordLeases, type HistoryReport, type LeaseLike, type LeaseOperation } from './helpers/lease-history.js'
import { closing, leaseInRedis, leaseSuite, msBetween, msToNs, RUN, stopLater, timed, untilMono } from './helpers/lease-runs.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()

const LEASE_MS = 50
const RENEW_TTL_MS = 2_000

interface BoundaryRun {
  renews: number
  renewedTrue: number
  renewedFalse: number
  contested: number
  rivalWins: number
  holderWinsContested: number
  inspections: number
  violations: string[]
}

/**
 * Per key and iteration: `holder` takes a 50 ms lease, then renews it (with a 2 s TTL) aimed
 * at the expiry, from 12 ms before to 8 ms after (timers fire late on a busy machine, never
 * early). Every other iteration a rival's acquire is fired in the same tick as the renew.
 * Judged, with the times each call started and returned:
 * - renew true only if the lease may still have been live when the renew started,
 *   renew false only if it may have expired by the time the renew returned;
 * - never both the renew and the rival's acquire;
 * - the store afterwards holds what the results imply: the renewer, the rival, or nobody
 *   (so a false renew never re-created the key), with a TTL of about the new 2 s.
 */
async function ttlBoundary(o: {
  holder: LeaseLike
  rival: LeaseLike
  keys: string[]
  iterations: number
  /** The lease straight from the server; without it the store is asked, twice. */
  inspect?: (key: string) => Promise<{ owner: string | null; pttl: number }>
}): Promise<BoundaryRun> {
  const run: BoundaryRun = {
    renews: 0,
    renewedTrue: 0,
    renewedFalse: 0,
    contested: 0,
    rivalWins: 0,
    holderWinsContested: 0,
    inspections: 0,
    violations: [],
  }
  await Promise.all(
    o.keys.map(async (key, k) => {
      const flag = (i: number, what: string) => run.violations.push(`${JSON.stringify(key)} #${i}: ${what}`)
      for (let i = 0; i < o.iterations; i++) {
        const contested = (i + k) % 2 === 1
        const acq = await timed(() => o.holder.acquireLease(key, 'holder', LEASE_MS))
        if (!acq.value.acquired) {
          flag(i, `the acquire of a free key was refused in favour of ${acq.value.owner}`)
          continue
        }
        await untilMono(acq.t0 + msToNs(LEASE_MS + Math.random() * 20 - 12))
        const rivalFirst = contested && Math.random() < 0.5
        const rivalEarly = rivalFirst ? timed(() => o.rival.acquireLease(key, 'rival', RENEW_TTL_MS)) : undefined
        const renewing = timed(() => o.holder.renewLease(key, 'holder', RENEW_TTL_MS))
        const rivalLate = contested && !rivalFirst ? timed(() => o.rival.acquireLease(key, 'rival', RENEW_TTL_MS)) : undefined
        const [renew, rival] = await Promise.all([renewing, rivalEarly ?? rivalLate])

        run.renews++
        // The server set the 50 ms TTL somewhere in [acq.t0, acq.t1]; Redis counts whole ms.
        if (renew.value) {
          run.renewedTrue++
          if (renew.t0 > acq.t1 + msToNs(LEASE_MS + 1)) {
            flag(i, `renew returned true although it started ${msBetween(acq.t1, renew.t0).toFixed(2)} ms after the acquire returned: the expired lease was resurrected`)
          }
        } else {
          run.renewedFalse++
          if (renew.t1 < acq.t0 + msToNs(LEASE_MS)) {
            flag(i, `renew returned false only ${msBetween(acq.t0, renew.t1).toFixed(2)} ms after the acquire started, before the lease could expire`)
          }
        }
        let expected: string | null = renew.value ? 'holder' : null
        let grantedAt = renew.t0
        if (rival) {
          run.contested++
          if (rival.value.acquired) {
            run.rivalWins++
            expected = 'rival'
            grantedAt = rival.t0
            if (renew.value) flag(i, 'both the renew and the rival’s acquire succeeded')
          } else {
            if (rival.value.owner !== 'holder') flag(i, `the rival was refused in favour of ${rival.value.owner}`)
            if (renew.value) run.holderWinsContested++
          }
        }

        if (o.inspect) {
          const seen = await timed(() => o.inspect!(key))
          run.inspections++
          const { owner, pttl } = seen.value
          if (owner !== expected) flag(i, `the server holds ${owner} after renew ${renew.value} / rival ${rival?.value.acquired}; expected ${expected}`)
          if (expected === null && pttl !== -2) flag(i, `PTTL ${pttl} on a key that must be absent`)
          if (expected !== null) {
            const lowest = RENEW_TTL_MS - msBetween(grantedAt, seen.t1) - 2
            if (pttl > RENEW_TTL_MS || pttl < lowest) flag(i, `PTTL ${pttl} after a ${RENEW_TTL_MS} ms grant, expected in [${lowest.toFixed(0)}, ${RENEW_TTL_MS}]`)
          }
        } else {
          const owner = (await o.holder.getLeaseOwner(key)) ?? null
          if (owner !== expected) flag(i, `the store holds ${owner} after renew ${renew.value} / rival ${rival?.value.acquired}; expected ${expected}`)
          if (expected !== null) {
            // Once the 50 ms lease has surely run out, a renew that kept the old deadline shows.
            await untilMono(acq.t1 + msToNs(LEASE_MS + 10))
            const later = (await o.holder.getLeaseOwner(key)) ?? null
            if (later !== expected) flag(i, `${expected} lost the lease within ${LEASE_MS + 10} ms of a ${RENEW_TTL_MS} ms grant`)
          }
          run.inspections++
        }
        await Promise.all([o.holder.releaseLease(key, 'holder'), o.rival.releaseLease(key, 'rival')])
      }
    }),
  )
  return run
}

/** A broken renew that re-takes an expired lease (a SET where a GET-compare belongs). */
function resurrectingRenew(p: LeaseLike): LeaseLike {
  return { ...bindLeases(p), renewLease: async (k, o, t) => (await p.renewLease(k, o, t)) || (await p.acquireLease(k, o, t)).acquired }
}
/** A broken renew that reports the loss but re-created the key anyway. */
function recreatingRenew(p: LeaseLike): LeaseLike {
  return {
    ...bindLeases(p),
    renewLease: async (k, o, t) => {
      const renewed = await p.renewLease(k, o, t)
      if (!renewed) await p.acquireLease(k, o, t)
      return renewed
    },
  }
}

describe('renewing 50 ms leases right at their expiry', () => {
  let server: RedisServer
  beforeAll(async () => {
    server = await startRedis()
    stopLater(server)
  })

  const keysFor = (label: string, n: number) => Array.from({ length: n }, (_, i) => `${label}:${RUN}:${i}\u0000thread`)

  const figures = (run: BoundaryRun, report: HistoryReport) =>
    `${run.renews} boundary renews (${run.renewedTrue} true, ${run.renewedFalse} false), ` +
    `${run.contested} contested (rival won ${run.rivalWins}, holder won ${run.holderWinsContested}), ` +
    `${run.inspections} store inspections, ${report.operations} operations checked, ${report.overlaps.length} overlaps, ` +
    `${run.violations.length} violations`

  function expectClean(run: BoundaryRun, report: HistoryReport) {
    // Not vacuous: the renews really straddled the expiry, and rivals won and lost.
    expect(run.renews).toBeGreaterThanOrEqual(500)
    expect(run.renewedTrue, 'renews that beat the expiry').toBeGreaterThanOrEqual(run.renews * 0.05)
    expect(run.renewedFalse, 'renews that came too late').toBeGreaterThanOrEqual(run.renews * 0.05)
    expect(run.rivalWins).toBeGreaterThan(0)
    expect(run.holderWinsContested).toBeGreaterThan(0)
    expect(run.violations.slice(0, 5)).toEqual([])
    expect(report.errors, 'no call failed').toBe(0)
    expect(report.overlaps, describeOverlaps(report)).toEqual([])
  }

  it('MemoryLeaseProvider: a renew at expiry is true only while the lease lived, a false renew never re-creates it, and no renew wins after a rival acquired', async ({ annotate }) => {
    const store = closing(new MemoryLeaseProvider())
    const ops: LeaseOperation[] = []
    const leases = recordLeases(store, (op) => ops.push(op))
    const run = await ttlBoundary({ holder: leases, rival: leases, keys: keysFor('boundary-mem', 32), iterations: 24 })
    const report = checkLeaseHistory(ops)
    await annotate(figures(run, report))
    expectClean(run, report)
  })

  it('RedisLeaseProvider: the same, with the key and its PTTL read straight from Redis after every renew', async ({ annotate }) => {
    const prefix = `boundary:${RUN}`
    const ops: LeaseOperation[] = []
    const holder = recordLeases(closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })), (op) => ops.push(op))
    const rival = recordLeases(closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })), (op) => ops.push(op))
    const run = await ttlBoundary({
      holder,
      rival,
      keys: keysFor('boundary-redis', 32),
      iterations: 24,
      inspect: (key) => leaseInRedis(server, `${prefix}:lease:${key}`),
    })
    const report = checkLeaseHistory(ops)
    await annotate(figures(run, report))
    expectClean(run, report)
  })

  it('the boundary check flags a renew that re-takes an expired lease, and one that re-creates the key while returning false (negative controls)', async ({ annotate }) => {
    const memory = closing(new MemoryLeaseProvider())
    const resurrected = await ttlBoundary({ holder: resurrectingRenew(memory), rival: memory, keys: keysFor('boundary-neg-mem', 8), iterations: 6 })
    const prefix = `boundary-neg:${RUN}`
    const redis = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const recreated = await ttlBoundary({
      holder: recreatingRenew(redis),
      rival: redis,
      keys: keysFor('boundary-neg-redis', 8),
      iterations: 6,
      inspect: (key) => leaseInRedis(server, `${prefix}:lease:${key}`),
    })
    await annotate(
      `resurrecting renew ${resurrected.violations.length} violations ` +
        `(${resurrected.violations[0]}); re-creating renew ${recreated.violations.length} violations (${recreated.violations[0]})`,
    )
    expect(resurrected.violations.some((v) => v.includes('resurrected'))).toBe(true)
    expect(recreated.violations.some((v) => v.includes('the server holds holder') && v.includes('expected null'))).toBe(true)
  })
})
