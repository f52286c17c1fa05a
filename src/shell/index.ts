// mastra-lease: the package's public entry. The providers come from the Rust binding
// (native.js, which `napi build` generates here): RedisLeaseProvider extends its class,
// MemoryLeaseProvider wraps its in-memory table, both tracing their calls; `withLeases` puts
// either behind a Mastra PubSub.
// First: a plain error, not the loader's, when this platform has no binary.
import '../../platform-check.cjs'
export { MemoryLeaseProvider } from './memory-lease-provider.js'
export { RedisLeaseProvider } from './redis-lease-provider.js'
export type { RedisLeaseProviderOptions } from './redis-lease-provider.js'
export type { ClientOption, NodeRedisClient } from './node-redis-client.js'
export { ackChannel, deliverChannel, leaseChannel, nackChannel, publishChannel } from './diagnostics.js'
export { holdLease } from './hold.js'
export { recordLeaseMetrics } from './metrics.js'
export type { HeldLease, HoldOptions, LeaseSource } from './hold.js'
export type { DeliveryMessage, LeaseCallContext, LeaseOperation, PublishContext } from './diagnostics.js'
export type {
  FencedLeaseGrant,
  LeaseGrant,
  LeaseCalls,
  LeaseRecord,
  LeaseState,
  LeaseStats,
  MemoryLeaseProviderOptions,
  RedisStreamsOptions,
  TlsOptions,
} from './native.js'
export { LeasedPubSub, withLeases } from './leased-pubsub.js'
export { RedisStreamsPubSub } from './redis-streams-pubsub.js'
export type { ExtendableEventCallback, PublishOptions, RedisStreamsPubSubOptions, StreamsLogger, TrimTopicOptions } from './redis-streams-pubsub.js'
