// Mastra's own Redis backend takes `client`: an unconnected node-redis client or cluster. Ours
// reads its configuration (where, TLS, credentials, database, name; a cluster's root nodes and
// defaults) and opens connections of its own; the client object is never connected.
import { randomUUID } from 'node:crypto'
import { createClient, createCluster } from 'redis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { RedisLeaseProvider, RedisStreamsPubSub } from '../dist/esm/index.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

const PASSWORD = 'client-option-pw'
const invalidOption = expect.objectContaining({ code: 'ERR_LEASE_INVALID_OPTION' })

describe.skipIf(EXTERNAL_REDIS)("Mastra's client option", () => {
  let server: RedisServer
  let cluster: RedisCluster

  beforeAll(async () => {
    ;[server, cluster] = await Promise.all([startRedis({ args: ['--requirepass', PASSWORD], password: PASSWORD }), startCluster({ replicasPerMaster: 0 })])
  }, 60_000)

  afterAll(async () => {
    await Promise.all([server?.stop(), cluster?.stop()])
  })

  it("a client's URL, password, database and name are used: the lease lands in that database, on a connection so named, and the client stays unconnected", async () => {
    const client = createClient({ url: `redis://127.0.0.1:${server.port}`, password: PASSWORD, database: 3, name: 'from-a-client' })
    const leases = new RedisLeaseProvider({ client })
    try {
      const key = `k-${randomUUID()}`
      expect(await leases.acquireLease(key, 'me', 30_000)).toEqual({ acquired: true, owner: 'me' })
      expect(String(await server.cli('CLIENT', 'LIST'))).toMatch(/ name=from-a-client /)
      const reader = createClient({ url: `redis://127.0.0.1:${server.port}`, password: PASSWORD, database: 3 })
      await reader.connect()
      try {
        expect(await reader.get(`mastra:topic:lease:${key}`)).toBe('me')
      } finally {
        await reader.close()
      }
      expect(await server.cli('GET', `mastra:topic:lease:${key}`)).toBeNull() // not in database 0
      expect(client.isOpen).toBe(false)
    } finally {
      await leases.close()
    }
  })

  it("a client given its server as socket host and port reaches that server", async () => {
    const client = createClient({ socket: { host: '127.0.0.1', port: server.port }, password: PASSWORD })
    const pubsub = new RedisStreamsPubSub({ client })
    try {
      const key = `k-${randomUUID()}`
      expect((await pubsub.acquireLease(key, 'me', 30_000)).acquired).toBe(true)
      expect(await server.cli('GET', `mastra:topic:lease:${key}`)).toBe('me')
      expect(client.isOpen).toBe(false)
    } finally {
      await pubsub.close()
    }
  })

  it("a cluster's root nodes (by URL or by socket) are used, leases spread over its masters", async () => {
    const [first, second] = cluster.nodes
    const client = createCluster({ rootNodes: [{ url: `redis://127.0.0.1:${first!.port}` }, { socket: { host: '127.0.0.1', port: second!.port } }] })
    const pubsub = new RedisStreamsPubSub({ client })
    try {
      const keys = Array.from({ length: 12 }, (_, i) => `k-${i}-${randomUUID()}`)
      for (const key of keys) expect((await pubsub.acquireLease(key, 'me', 30_000)).acquired).toBe(true)
      for (const key of keys) expect(await pubsub.getLeaseOwner(key)).toBe('me')
      expect(client.isOpen).toBe(false)
    } finally {
      await pubsub.close()
    }
  }, 30_000)

  it('a connected client is refused before any I/O, and left connected', async () => {
    const client = createClient({ url: `redis://127.0.0.1:${server.port}`, password: PASSWORD })
    await client.connect()
    try {
      expect(() => new RedisLeaseProvider({ client })).toThrow(invalidOption)
      expect(() => new RedisLeaseProvider({ client })).toThrow(/must not be connected/)
      expect(client.isOpen).toBe(true)
    } finally {
      await client.close()
    }
  })

  it('client beside url, redisOptions, cluster or sentinel is refused: both would say where Redis is', () => {
    const client = createClient()
    expect(() => new RedisLeaseProvider({ client, url: 'redis://127.0.0.1:1' })).toThrow(/client: it and url both say where Redis is/)
    expect(() => new RedisStreamsPubSub({ client, redisOptions: { url: 'redis://127.0.0.1:1' } })).toThrow(invalidOption)
    expect(() => new RedisLeaseProvider({ client, cluster: { nodes: ['redis://127.0.0.1:1'] } })).toThrow(invalidOption)
    expect(() => new RedisLeaseProvider({ client, sentinel: { nodes: ['redis://127.0.0.1:1'], masterName: 'm' } })).toThrow(invalidOption)
  })

  it('what a client sets that cannot be honoured is refused by name, and what is not a client too', () => {
    expect(() => new RedisLeaseProvider({ client: createClient({ pingInterval: 1000 }) })).toThrow(/client: its pingInterval cannot be honoured/)
    expect(() => new RedisLeaseProvider({ client: createClient({ socket: { reconnectStrategy: () => 100 } }) })).toThrow(/reconnectStrategy is not supported but as false/)
    expect(() => new RedisLeaseProvider({ client: createCluster({ rootNodes: [{ url: 'redis://127.0.0.1:1' }], maxCommandRedirections: 3 }) })).toThrow(
      /the cluster's maxCommandRedirections cannot be honoured/,
    )
    expect(() => new RedisLeaseProvider({ client: {} as never })).toThrow(/must be a node-redis client or cluster/)
    // Options whose reading throws (a Proxy's trap) are refused with the coded error, the throw as its cause.
    const trap = new Error('trap')
    const proxy = new Proxy({}, { has: () => { throw trap } })
    expect(() => new RedisLeaseProvider(proxy)).toThrow(expect.objectContaining({ code: 'ERR_LEASE_INVALID_OPTION', cause: trap }))
    // undefined is "not given", as for every option.
    new RedisLeaseProvider({ client: undefined, url: 'redis://127.0.0.1:1' }).close()
  })
})
