// One contract, every provider: everything Mastra's LeaseProvider contract promises
// (helpers/lease-contract.ts) must hold for the in-memory store and for Redis alike.
import { randomUUID } from 'node:crypto'
import { afterAll, beforeAll, describe } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider } from '../dist/esm/index.js'
import { describeLeaseContract } from './helpers/lease-contract.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

describeLeaseContract('MemoryLeaseProvider', (limits) => new MemoryLeaseProvider(limits as never))

describe('against a real redis-server', () => {
  let server: RedisServer | undefined
  beforeAll(async () => {
    server = await startRedis()
  })
  afterAll(async () => {
    await server?.stop()
  })
  // A key prefix of its own per provider: no test can see another's leftovers, even
  // on a shared REDIS_URL server.
  describeLeaseContract(
    'RedisLeaseProvider',
    (limits) => new RedisLeaseProvider({ url: server!.url, keyPrefix: `test:${randomUUID()}`, ...(limits as object) }),
  )
  // Without fencing tokens an acquire is a plain SET NX, and the scripts leave the token
  // key out: the same contract, without a token on a grant.
  describeLeaseContract(
    'RedisLeaseProvider without fencing tokens',
    (limits) =>
      new RedisLeaseProvider({ url: server!.url, keyPrefix: `test:${randomUUID()}`, fencingTokens: false, ...(limits as object) }),
    { tokens: false },
  )
})
