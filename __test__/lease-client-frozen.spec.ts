// A client process frozen (SIGSTOP) for longer than its lease: a peer acquires meanwhile, the
// resumed client's next renew is false and it sees the peer as owner. A client whose provider
// lies about renews is the negative control.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'
import { beforeAll, describe, expect, it } from 'vitest'

import { RedisLeaseProvider } from '../index.js'
import { sleep } from './helpers/lease.js'
import { checkLeaseHistory, describeOverlaps, monotonicNow, recordLeases, type HistoryReport, type LeaseOperation } from './helpers/lease-history.js'
import { closing, LeaseChild, leaseInRedis, leaseSuite, msBetween, msToNs, RUN, stopLater, timed, untilMono, type ChildEvent, type Grant } from './helpers/lease-runs.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()

interface FrozenRun {
  violations: string[]
  report: HistoryReport
  renewsBeforeFreeze: number
  frozenMs: number
  /** The first renew the resumed client started. */
  firstRenewAfter?: LeaseOperation
  ownerSeenByClient?: string
}

async function frozenClient(server: RedisServer, lieOnRenew: boolean): Promise<FrozenRun> {
  const TTL = 600
  const EVERY = 200
  const FREEZE = 1_600
  const PEER_TTL = 5_000
  const prefix = `frozen:${RUN}`
  const key = `frozen-${randomUUID().slice(0, 8)}\u0000thread`
  const violations: string[] = []
  const child = await LeaseChild.start({ store: 'redis', url: server.url, keyPrefix: prefix, lieOnRenew })
  const peerOps: LeaseOperation[] = []
  const peer = recordLeases(closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })), (op) => peerOps.push(op))
  try {
    const first = await child.call<Grant>('acquireLease', key, 'client', TTL)
    if (!first.acquired) violations.push(`the client could not take a free key: ${JSON.stringify(first)}`)
    await child.request({ cmd: 'autoRenew', key, owner: 'client', ttlMs: TTL, everyMs: EVERY })
    const okRenews = () => child.ops.filter((o) => o.op === 'renew' && o.outcome === 'ok').length
    await child.waitFor(() => okRenews() >= 2, 5_000)
    const renewsBeforeFreeze = okRenews()

    const frozenAt = monotonicNow()
    child.signal('SIGSTOP')
    // The peer asks until the frozen client's lease runs out.
    let grant: Grant = { acquired: false }
    while (!grant.acquired && monotonicNow() < frozenAt + msToNs(FREEZE - 200)) {
      grant = await peer.acquireLease(key, 'peer', PEER_TTL)
      if (!grant.acquired) await sleep(20)
    }
    if (!grant.acquired) violations.push(`the peer never acquired while the client was frozen (holder ${grant.owner})`)
    await untilMono(frozenAt + msToNs(FREEZE))
    const thawedAt = monotonicNow()
    child.signal('SIGCONT')

    const renewAfter = (e: ChildEvent) => e.type === 'op' && e.op === 'renew' && BigInt(String(e.start)) >= thawedAt
    await child.waitFor(renewAfter, 5_000)
    if (!lieOnRenew) await child.waitFor((e) => e.type === 'lost', 5_000).catch(() => violations.push('the client never reported the loss'))
    await sleep(3 * EVERY) // room for renews it should not make any more
    const firstRenewAfter = child.ops.find((o) => o.op === 'renew' && o.start >= thawedAt)
    if (firstRenewAfter?.outcome !== 'refused') violations.push(`the resumed client's next renew was ${firstRenewAfter?.outcome}, not false`)
    const lost = child.events.find((e) => e.type === 'lost')
    if (lost) {
      const lostAt = BigInt(String(lost.mono))
      const later = child.ops.filter((o) => o.start > lostAt)
      if (later.length) violations.push(`after reporting the loss the client still called ${later.map((o) => o.op).join(', ')}`)
    }
    if (child.ops.filter((o) => o.op === 'acquire').length !== 1) violations.push('the client re-took the lease')

    const ownerSeenByClient = await child.call<string | undefined>('getLeaseOwner', key)
    if (ownerSeenByClient !== 'peer') violations.push(`the client sees ${ownerSeenByClient} as the owner, not the peer`)
    const peerGrant = peerOps.find((o) => o.op === 'acquire' && o.outcome === 'ok')
    const inRedis = await timed(() => leaseInRedis(server, `${prefix}:lease:${key}`))
    if (inRedis.value.owner !== 'peer') violations.push(`Redis holds ${inRedis.value.owner}, not the peer`)
    if (peerGrant) {
      const lowest = PEER_TTL - msBetween(peerGrant.start, inRedis.t1) - 2
      if (inRedis.value.pttl < lowest) violations.push(`the peer's TTL was cut to ${inRedis.value.pttl} ms (at least ${lowest.toFixed(0)} expected)`)
    }

    const report = checkLeaseHistory([...child.ops, ...peerOps])
    return { violations, report, renewsBeforeFreeze, frozenMs: msBetween(frozenAt, thawedAt), firstRenewAfter, ownerSeenByClient }
  } finally {
    await child.stop()
  }
}

describe('the client process frozen (SIGSTOP) for longer than its lease', () => {
  let server: RedisServer
  beforeAll(async () => {
    server = await startRedis()
    stopLater(server)
  })

  it('a peer acquires meanwhile; the resumed client’s next renew is false, it reports the loss without re-taking, and sees the peer as the owner', async ({ annotate }) => {
    const run = await frozenClient(server, false)
    await annotate(
      `client renewed ${run.renewsBeforeFreeze} times, frozen ${run.frozenMs.toFixed(0)} ms (TTL 600 ms), ` +
        `first renew after SIGCONT ${run.firstRenewAfter?.outcome}, owner seen ${run.ownerSeenByClient}; ` +
        `${run.report.operations} operations checked, ${run.report.overlaps.length} overlaps`,
    )
    expect(run.renewsBeforeFreeze).toBeGreaterThanOrEqual(2)
    expect(run.frozenMs).toBeGreaterThan(600)
    expect(run.violations).toEqual([])
    expect(run.report.errors).toBe(0)
    expect(run.report.overlaps, describeOverlaps(run.report)).toEqual([])
  })

  it('a client whose provider claims every renew succeeded is caught, by the same checks and by the history checker (negative control)', async ({ annotate }) => {
    const run = await frozenClient(server, true)
    await annotate(`negative control: ${run.violations.length} violations (${run.violations[0]}), ${run.report.overlaps.length} overlaps`)
    expect(run.violations.some((v) => v.includes('next renew was ok'))).toBe(true)
    expect(run.report.overlaps.length).toBeGreaterThanOrEqual(1)
    expect(new Set(run.report.overlaps.flatMap((o) => [o.first.owner, o.second.owner]))).toEqual(new Set(['client', 'peer']))
  })
})
