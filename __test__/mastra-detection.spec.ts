// Mastra finds a lease backend structurally (isLeaseProvider), never with instanceof:
// the bare native objects must pass its real check, from the real package.
import { isLeaseProvider, type LeaseProvider } from '@mastra/core/events'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider } from '../dist/esm/index.js'
import { LEASE_METHODS, uniqueKey } from './helpers/lease.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

describe("Mastra's isLeaseProvider", () => {
  let server: RedisServer | undefined
  const providers: Array<{ close(): Promise<void> }> = []
  beforeAll(async () => {
    server = await startRedis()
  })
  afterAll(async () => {
    await Promise.allSettled(providers.map((p) => p.close()))
    await server?.stop()
  })

  const make = {
    MemoryLeaseProvider: () => new MemoryLeaseProvider(),
    RedisLeaseProvider: () => new RedisLeaseProvider({ url: server!.url }),
  }

  describe.each(Object.keys(make) as Array<keyof typeof make>)('%s', (name) => {
    it('is recognised by isLeaseProvider from @mastra/core/events', () => {
      const provider = make[name]()
      providers.push(provider)
      expect(isLeaseProvider(provider)).toBe(true)
    })

    it('exposes the five lease methods and close as functions', () => {
      const provider = make[name]()
      providers.push(provider)
      for (const method of [...LEASE_METHODS, 'close'] as const) expect(typeof provider[method], method).toBe('function')
    })

    it("works when its methods are bound to the instance, as Mastra's pubsub Proxy calls them", async () => {
      const provider = make[name]()
      providers.push(provider)
      // Mastra wraps the pubsub in a Proxy whose get trap binds methods to the target.
      const proxied = new Proxy(provider, {
        get(target, prop) {
          const value: unknown = Reflect.get(target, prop, target)
          return typeof value === 'function' ? value.bind(target) : value
        },
      })
      expect(isLeaseProvider(proxied)).toBe(true)
      const lease: LeaseProvider = proxied
      const key = uniqueKey('proxy')
      expect(await lease.acquireLease(key, 'A', 5_000)).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await lease.getLeaseOwner(key)).toBe('A')
      expect(await lease.renewLease(key, 'A', 5_000)).toBe(true)
      expect(await lease.transferLease(key, 'A', 'B', 5_000)).toBe(true)
      await lease.releaseLease(key, 'B')
      expect(await lease.getLeaseOwner(key)).toBeUndefined()
    })
  })

  it('the native classes are assignable to LeaseProvider without casts', () => {
    // A compile-time check (tsc --noEmit) as much as a runtime one.
    const memory: LeaseProvider = new MemoryLeaseProvider()
    const redis: LeaseProvider = new RedisLeaseProvider({ url: server!.url })
    providers.push(memory as MemoryLeaseProvider, redis as RedisLeaseProvider)
    expect(isLeaseProvider(memory) && isLeaseProvider(redis)).toBe(true)
  })
})
