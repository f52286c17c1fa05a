// What one test opens, closed after it: its providers, then its own redis-servers (a frozen
// one thawed first, so nothing is ever left SIGSTOPped).
import { afterEach } from 'vitest'

import { RedisLeaseProvider } from '../../index.js'
import type { LeaseApi } from './lease.js'
import { startRedis, type RedisServer, type RedisServerOptions } from './redis-server.js'

type RedisOptions = ConstructorParameters<typeof RedisLeaseProvider>[0]

/** Call once at a spec file's top level: its tests' providers and servers go after each. */
export function perTest() {
  const providers: LeaseApi[] = []
  const servers: RedisServer[] = []
  afterEach(async () => {
    await Promise.allSettled(providers.splice(0).map((p) => p.close()))
    await Promise.allSettled(servers.splice(0).map((s) => s.stop()))
  })
  return {
    /** Anything with `close()` the test opened (a pubsub, say), closed with the providers. */
    providers,
    /** A provider closed after the test. */
    provider(options: RedisOptions): RedisLeaseProvider {
      const p = new RedisLeaseProvider(options)
      providers.push(p)
      return p
    },
    /** A server of the test's own, stopped after it. */
    async ownServer(opts?: RedisServerOptions): Promise<RedisServer> {
      const s = await startRedis(opts)
      servers.push(s)
      return s
    },
  }
}
