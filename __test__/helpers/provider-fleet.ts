// What the suites of Mastra's lease callers share (mastra-step-fence.spec.ts,
// mastra-lease-callers.spec.ts): the three kinds of provider a caller meets, several processes'
// worth of one kind at a time.
import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub } from '../../dist/esm/index.js'
import type { LeaseApi, LeaseRecordApi } from './lease.js'
import { uniquePrefix } from './streams.js'

export const PROVIDER_KINDS = ['MemoryLeaseProvider', 'RedisLeaseProvider', 'RedisStreamsPubSub'] as const
export type ProviderKind = (typeof PROVIDER_KINDS)[number]

/**
 * `n` processes' providers of one kind sharing one store: one in-memory table, or one key
 * prefix on the server at `url` with a connection each. Each goes into `opened` (perTest()'s
 * `providers`), closed after the test.
 */
export function providerFleet(kind: ProviderKind, n: number, url: string, opened: LeaseApi[]): LeaseRecordApi[] {
  const keyPrefix = uniquePrefix('callers')
  const open = <T extends LeaseRecordApi>(provider: T): T => {
    opened.push(provider)
    return provider
  }
  if (kind === 'MemoryLeaseProvider') {
    const shared = open(new MemoryLeaseProvider())
    return Array.from({ length: n }, () => shared)
  }
  return Array.from({ length: n }, () => open(kind === 'RedisLeaseProvider' ? new RedisLeaseProvider({ url, keyPrefix }) : new RedisStreamsPubSub({ url, keyPrefix })))
}
