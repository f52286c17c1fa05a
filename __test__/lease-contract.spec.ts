// One contract, every provider: everything Mastra's LeaseProvider contract promises, and its
// lease records (helpers/lease-contract.ts), must hold for the in-memory
// store and for Redis alike, and through withLeases, which passes every call on.
import './helpers/mastra-node.js' // first: withLeases loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'

import { EventEmitterPubSub } from '@mastra/core/events'
import { afterAll, beforeAll, describe } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider, withLeases } from '../dist/esm/index.js'
import { describeLeaseContract } from './helpers/lease-contract.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

describeLeaseContract('MemoryLeaseProvider', (limits) => new MemoryLeaseProvider(limits as never))
describeLeaseContract('withLeases(EventEmitterPubSub, MemoryLeaseProvider)', (limits) =>
  withLeases(new EventEmitterPubSub(), new MemoryLeaseProvider(limits as never)),
)

describe('against a real redis-server', () => {
  let server: RedisServer | undefined
  beforeAll(async () => {
    server = await startRedis()
  })
  afterAll(async () => {
    await server?.stop()
  })
  // On a server of its own the contract also shows that bad input sends Redis nothing; a
  // shared REDIS_URL server runs other clients' commands meanwhile.
  const commandCalls = EXTERNAL_REDIS ? undefined : () => server!.commandCalls()
  // A key prefix of its own per provider: no test can see another's leftovers, even
  // on a shared REDIS_URL server.
  describeLeaseContract(
    'RedisLeaseProvider',
    (limits) => new RedisLeaseProvider({ url: server!.url, keyPrefix: `test:${randomUUID()}`, ...(limits as object) }),
    { commandCalls },
  )
  describeLeaseContract(
    'withLeases(EventEmitterPubSub, RedisLeaseProvider)',
    (limits) => withLeases(new EventEmitterPubSub(), new RedisLeaseProvider({ url: server!.url, keyPrefix: `test:${randomUUID()}`, ...(limits as object) })),
    { commandCalls },
  )
})
