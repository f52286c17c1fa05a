// OpenTelemetry metrics of the lease calls: recordLeaseMetrics() records every call's duration
// (with error.type when it failed) and the grants, refusals and losses, into the real
// @opentelemetry/sdk-metrics, read back through an in-memory metric reader.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'

import { metrics } from '@opentelemetry/api'
import { DataPointType, MeterProvider, MetricReader, type MetricData } from '@opentelemetry/sdk-metrics'
import { afterEach, beforeAll, describe, expect, it } from 'vitest'

import { leaseChannel, MemoryLeaseProvider, RedisLeaseProvider, recordLeaseMetrics } from '../dist/esm/index.js'
import { closing, leaseSuite, RUN, stopLater } from './helpers/lease-runs.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()

let server: RedisServer
beforeAll(async () => {
  server = stopLater(await startRedis())
})

/** A reader that keeps everything in memory until asked. */
class InMemoryReader extends MetricReader {
  protected async onForceFlush() {}
  protected async onShutdown() {}
  /** Every metric collected now, by name. */
  async byName(): Promise<Map<string, MetricData>> {
    const { resourceMetrics } = await this.collect()
    const all = resourceMetrics.scopeMetrics.filter((s) => s.scope.name === 'mastra-lease').flatMap((s) => s.metrics)
    return new Map(all.map((m) => [m.descriptor.name, m]))
  }
}

/** Histogram counts per attribute set, as `operation` or `operation error.type`. */
function callCounts(metric: MetricData | undefined): Record<string, number> {
  if (metric?.dataPointType !== DataPointType.HISTOGRAM) throw new Error('mastra_lease.operation.duration is not a histogram')
  return Object.fromEntries(
    metric.dataPoints.map((p) => [[p.attributes['mastra_lease.operation.name'], p.attributes['error.type']].filter(Boolean).join(' '), p.value.count]),
  )
}
function sums(metric: MetricData | undefined): Record<string, number> {
  if (metric?.dataPointType !== DataPointType.SUM) return {}
  return Object.fromEntries(metric.dataPoints.map((p) => [String(p.attributes['mastra_lease.operation.name']), p.value]))
}

const stops: Array<() => void> = []
afterEach(() => {
  for (const stop of stops.splice(0)) stop()
  metrics.disable()
})

describe.each([
  ['MemoryLeaseProvider', () => new MemoryLeaseProvider()],
  ['RedisLeaseProvider', () => new RedisLeaseProvider({ url: server.url, keyPrefix: `metrics:${RUN}` })],
])('%s', (_name, make) => {
  it('records each call in mastra_lease.operation.duration by operation and error code, and counts grants, refusals and losses', async () => {
    const reader = new InMemoryReader()
    stops.push(recordLeaseMetrics(new MeterProvider({ readers: [reader] })))
    const p = closing(make())
    const key = `metrics-${randomUUID().slice(0, 8)}`
    await p.acquireLease(key, 'A', 60_000) // granted
    await p.acquireLease(key, 'B', 60_000) // refused
    await p.renewLease(key, 'A', 60_000)
    await p.renewLease(key, 'C', 60_000) // lost
    await p.transferLease(key, 'A', 'B', 60_000) // granted
    await p.getLeaseOwner(key)
    await p.releaseLease(key, 'B')
    await expect(p.acquireLease('', 'A', 60_000)).rejects.toMatchObject({ code: 'ERR_LEASE_INVALID_KEY' })

    const byName = await reader.byName()
    expect(callCounts(byName.get('mastra_lease.operation.duration'))).toEqual({
      acquireLease: 2,
      'acquireLease ERR_LEASE_INVALID_KEY': 1,
      renewLease: 2,
      transferLease: 1,
      getLeaseOwner: 1,
      releaseLease: 1,
    })
    const duration = byName.get('mastra_lease.operation.duration')!
    expect(duration.descriptor.unit).toBe('s')
    if (duration.dataPointType === DataPointType.HISTOGRAM) {
      for (const point of duration.dataPoints) expect(point.value.max).toBeLessThan(5)
    }
    expect(sums(byName.get('mastra_lease.lease.granted'))).toEqual({ acquireLease: 1, transferLease: 1 })
    expect(sums(byName.get('mastra_lease.lease.refused'))).toEqual({ acquireLease: 1 })
    expect(sums(byName.get('mastra_lease.lease.lost'))).toEqual({ renewLease: 1 })
  })
})

describe('recordLeaseMetrics', () => {
  it("without a MeterProvider uses @opentelemetry/api's global one, even one registered after it was called", async () => {
    stops.push(recordLeaseMetrics())
    const p = new MemoryLeaseProvider()
    await p.acquireLease('before', 'A', 1_000) // the API's no-op provider: nothing to read
    const reader = new InMemoryReader()
    metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }))
    await p.acquireLease('after', 'A', 1_000)
    expect(callCounts((await reader.byName()).get('mastra_lease.operation.duration'))).toEqual({ acquireLease: 1 })
  })

  it('stops recording (and tracing) once its stop function is called', async () => {
    const reader = new InMemoryReader()
    const stop = recordLeaseMetrics(new MeterProvider({ readers: [reader] }))
    const p = new MemoryLeaseProvider()
    await p.acquireLease('k', 'A', 1_000)
    stop()
    expect(leaseChannel.hasSubscribers).toBe(false)
    await p.acquireLease('k2', 'A', 1_000)
    expect(callCounts((await reader.byName()).get('mastra_lease.operation.duration'))).toEqual({ acquireLease: 1 })
  })

  it('refuses something that is not a MeterProvider with ERR_LEASE_INVALID_OPTION', () => {
    expect(() => recordLeaseMetrics({} as never)).toThrow(expect.objectContaining({ name: 'TypeError', code: 'ERR_LEASE_INVALID_OPTION' }))
    expect(leaseChannel.hasSubscribers).toBe(false)
  })
})
