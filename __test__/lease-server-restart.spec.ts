// A server killed (kill -9) and restarted with appendonly yes and appendfsync always: leases
// survive with their owner and their TTL keeps running; the providers recover by themselves.
// The restart without persistence, where leases are lost, is in lease-faults.spec.ts.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { describe, expect, it } from 'vitest'

import { RedisLeaseProvider } from '../index.js'
import { sleep } from './helpers/lease.js'
import { checkLeaseHistory, describeOverlaps, recordLeases, type LeaseOperation } from './helpers/lease-history.js'
import { closing, leaseInRedis, leaseSuite, msBetween, msToNs, RUN, stopLater, timed, untilMono, type Grant, type Timed } from './helpers/lease-runs.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()

describe.skipIf(EXTERNAL_REDIS)('kill -9 and restart of a server with appendonly yes and appendfsync always', () => {
  it('leases survive with the same owner, their TTL keeps running through the restart, and the providers recover by themselves', async ({ annotate }) => {
    const TTL = 3_000
    const server = await startRedis({ args: ['--appendonly', 'yes', '--appendfsync', 'always'] })
    stopLater(server)
    expect(await server.cli('CONFIG', 'GET', 'appendfsync')).toEqual(['appendfsync', 'always'])
    const prefix = `aof:${RUN}`
    const fullKey = (key: string) => `${prefix}:lease:${key}`
    const ops: LeaseOperation[] = []
    const holder = recordLeases(closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })), (op) => ops.push(op))
    const other = recordLeases(closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })), (op) => ops.push(op))
    const renewed = Array.from({ length: 3 }, (_, i) => `aof-renewed-${i}\u0000thread`)
    const left = Array.from({ length: 3 }, (_, i) => `aof-left-${i}\u0000thread`)

    const grants = new Map<string, Timed<Grant>>()
    for (const key of [...renewed, ...left]) grants.set(key, await timed(() => holder.acquireLease(key, 'holder', TTL)))
    for (const [key, g] of grants) expect(g.value, key).toStrictEqual({ acquired: true, owner: 'holder' })
    const lastGrant = grants.get(left[left.length - 1]!)!
    const firstGrant = grants.get(renewed[0]!)!

    await server.kill()
    await sleep(300)
    await server.restart()

    // Straight from the restarted server: same owner, and the time spent down is gone from the TTL.
    for (const [key, g] of grants) {
      const seen = await timed(() => leaseInRedis(server, fullKey(key)))
      expect(seen.value.owner, key).toBe('holder')
      const most = TTL - msBetween(g.value.acquired ? g.t1 : g.t0, seen.t0) + 1
      expect(seen.value.pttl, `${key}: PTTL after the restart`).toBeGreaterThan(0)
      expect(seen.value.pttl, `${key}: PTTL after the restart`).toBeLessThanOrEqual(most)
    }

    // The same provider objects, not new ones: calls may reject while they reconnect.
    const reconnectErrors: unknown[] = []
    const settled = async <T>(call: () => Promise<T>): Promise<T> => {
      const deadline = Date.now() + 5_000
      for (;;) {
        try {
          return await call()
        } catch (err) {
          reconnectErrors.push((err as { code?: unknown })?.code ?? err)
          if (Date.now() > deadline) throw err
          await sleep(50)
        }
      }
    }
    for (const key of renewed) {
      const r = await timed(() => settled(() => holder.renewLease(key, 'holder', TTL)))
      expect(r.t1 < firstGrant.t0 + msToNs(TTL), 'the check ran before the lease could expire').toBe(true)
      expect(r.value, `${key}: renew by the holder after the restart`).toBe(true)
    }
    for (const key of left) {
      const r = await timed(() => settled(() => other.acquireLease(key, 'other', TTL)))
      expect(r.t1 < grants.get(key)!.t0 + msToNs(TTL), 'the check ran before the lease could expire').toBe(true)
      expect(r.value, `${key}: another owner before the TTL ran out`).toEqual({ acquired: false, owner: 'holder' })
    }

    // On time: still held shortly before the original TTL ends, free right after it.
    await untilMono(lastGrant.t0 + msToNs(TTL - 500))
    for (const key of left) {
      const r = await timed(() => other.acquireLease(key, 'other', TTL))
      expect(r.t1 < grants.get(key)!.t0 + msToNs(TTL), 'the check ran before the lease could expire').toBe(true)
      expect(r.value, `${key}: held up to the end of its TTL`).toEqual({ acquired: false, owner: 'holder' })
    }
    await untilMono(lastGrant.t1 + msToNs(TTL + 250))
    for (const key of left) expect(await other.acquireLease(key, 'other', TTL), `${key}: expired on time`).toStrictEqual({ acquired: true, owner: 'other' })
    // The renewed ones run on their new TTL.
    for (const key of renewed) expect(await other.acquireLease(key, 'other', TTL), `${key}: renewed after the restart`).toEqual({ acquired: false, owner: 'holder' })

    const report = checkLeaseHistory(ops)
    await annotate(
      `1 kill -9 + restart, ${grants.size} leases survived, ${reconnectErrors.length} calls rejected while reconnecting ` +
        `(${reconnectErrors.join(', ')}), ` +
        `${report.operations} operations checked, ${report.overlaps.length} overlaps`,
    )
    for (const code of reconnectErrors) expect(['ERR_LEASE_CONNECTION', 'ERR_LEASE_TIMEOUT'], 'a call during the reconnect rejects with a coded error').toContain(code)
    expect(report.overlaps, describeOverlaps(report)).toEqual([])
  })
})
