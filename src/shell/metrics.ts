// OpenTelemetry metrics of the lease calls, recorded from the `mastra-lease:lease` channel once
// the application asks for them with recordLeaseMetrics(). @opentelemetry/api is an optional
// peer dependency, loaded only then, with `require`: the ESM build re-exports this CommonJS
// module (src/shell/build.mjs).
import type { Attributes, Counter, Histogram, MeterProvider } from '@opentelemetry/api'

import { leaseChannel, type LeaseCallContext } from './diagnostics.js'
import { coded, missingDependency } from './errors.js'

/** The instrument scope's name: what the metrics are grouped under. */
const SCOPE = 'mastra-lease'

/** Bucket bounds of the duration histogram, in seconds: 0.1 ms to 10 s. */
const BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

interface Instruments {
  provider: MeterProvider
  duration: Histogram
  granted: Counter
  refused: Counter
  lost: Counter
}

function instruments(provider: MeterProvider): Instruments {
  const meter = provider.getMeter(SCOPE)
  const count = (name: string, description: string) => meter.createCounter(name, { unit: '{lease}', description })
  return {
    provider,
    duration: meter.createHistogram('mastra_lease.operation.duration', {
      unit: 's',
      description: 'Duration of lease calls, by operation; failed ones carry error.type (the error code).',
      advice: { explicitBucketBoundaries: BUCKETS },
    }),
    granted: count('mastra_lease.lease.granted', 'Leases granted: acquires that left the caller holding the lease, and transfers.'),
    refused: count('mastra_lease.lease.refused', 'Acquires answered with another owner.'),
    lost: count('mastra_lease.lease.lost', 'Renewals that found the lease lost.'),
  }
}

/** The global meter provider of @opentelemetry/api, read on each use: an SDK may register later. */
function globalMeterProvider(): () => MeterProvider {
  let api: typeof import('@opentelemetry/api')
  try {
    api = require('@opentelemetry/api') as typeof import('@opentelemetry/api')
  } catch (cause) {
    throw missingDependency('recordLeaseMetrics()', '@opentelemetry/api', cause, 'pass it a MeterProvider')
  }
  return () => api.metrics.getMeterProvider()
}

/**
 * Records OpenTelemetry metrics of every lease call of this package's providers and pubsubs,
 * through `meterProvider` or, without one, @opentelemetry/api's global one (followed if an
 * SDK registers later). Metrics, all with `mastra_lease.operation.name` (`acquireLease`, ...):
 *
 * - `mastra_lease.operation.duration` (histogram, s): every call, with `error.type` (its
 *   `code`) when it failed; its count is the number of calls.
 * - `mastra_lease.lease.granted`, `.refused`, `.lost` (counters, `{lease}`).
 *
 * Answers a function that stops recording. Without `meterProvider`, throws
 * `ERR_LEASE_MISSING_DEPENDENCY` when @opentelemetry/api is not installed. While it records,
 * every lease call is traced, which an in-memory call feels and a Redis call hardly does
 * (docs/benchmarks.md).
 */
export function recordLeaseMetrics(meterProvider?: MeterProvider): () => void {
  if (meterProvider !== undefined && typeof (meterProvider as Partial<MeterProvider>)?.getMeter !== 'function') {
    const message = 'recordLeaseMetrics(): meterProvider must be an OpenTelemetry MeterProvider (with getMeter)'
    throw coded(new TypeError(message), 'ERR_LEASE_INVALID_OPTION')
  }
  const current = meterProvider === undefined ? globalMeterProvider() : () => meterProvider
  let made: Instruments | undefined
  const use = (): Instruments => {
    const provider = current()
    if (made?.provider !== provider) made = instruments(provider)
    return made
  }
  const started = new WeakMap<object, number>()
  const subscribers = {
    start(context: LeaseCallContext) {
      started.set(context, performance.now())
    },
    end() {},
    asyncStart() {},
    asyncEnd(context: LeaseCallContext) {
      const since = started.get(context)
      if (since === undefined) return
      const m = use()
      const operation: Attributes = { 'mastra_lease.operation.name': context.operation }
      const code = (context.error as { code?: unknown } | undefined)?.code
      const failed = context.error !== undefined
      const attributes = failed ? { ...operation, 'error.type': typeof code === 'string' ? code : 'Error' } : operation
      m.duration.record((performance.now() - since) / 1000, attributes)
      if (failed) return
      const result = context.result
      if (context.operation === 'acquireLease' || context.operation === 'acquireFencedLease') {
        const counter = (result as { acquired?: boolean }).acquired ? m.granted : m.refused
        counter.add(1, operation)
      } else if (context.operation === 'transferLease' && result === true) {
        m.granted.add(1, operation)
      } else if (context.operation === 'renewLease' && result === false) {
        m.lost.add(1, operation)
      }
    },
    error() {},
  }
  leaseChannel.subscribe(subscribers)
  return () => void leaseChannel.unsubscribe(subscribers)
}
