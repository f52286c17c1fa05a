// Valkey, where many Mastra users are (ElastiCache's default engine): the lease contract on one
// valkey-server and on a Valkey Cluster, the Redis Streams suites, and the fault suites (a
// server frozen, killed, restarted, still loading, out of memory, its scripts flushed, its
// commands renamed away or refused by ACL), against valkey-server processes of their own
// (helpers/valkey.ts: what .ci/run installs, or VALKEY_SERVER).
//
// The streams and fault suites are the spec files Redis runs, imported whole into a describe
// of this file: every server this file starts is a valkey-server (useServerProgram), so each of
// their tests runs on Valkey as written. A spec file is a process of its own, so the Redis runs
// of those files are untouched.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisLeaseProvider } from '../dist/esm/index.js'
import { describeLeaseContract } from './helpers/lease-contract.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { EXTERNAL_REDIS, startRedis, useServerProgram, type RedisServer } from './helpers/redis-server.js'
import { valkey, VALKEY_SERVER } from './helpers/valkey.js'

useServerProgram(VALKEY_SERVER)

/** Why this file cannot run here, if it cannot. */
const cannot = valkey.missing ?? (EXTERNAL_REDIS ? 'REDIS_URL names the server every suite uses; unset it to run Valkey servers of their own' : undefined)

/** `body` inside a describe titled `title`; where Valkey cannot run, one test skipped saying why. */
function onValkey(title: string, body: () => void | Promise<void>) {
  describe(title, async () => {
    if (cannot !== undefined) {
      it('runs on Valkey', ({ skip }) => skip(cannot))
      return
    }
    await body()
  })
}

describe(`valkey-server ${valkey.version ?? '(not installed)'}`, () => {
  onValkey('the servers', () => {
    it('every server these suites start is that valkey-server, not redis-server (INFO server)', async () => {
      const server = await startRedis()
      try {
        const info = await server.info('server')
        expect(info['server_name']).toBe('valkey')
        expect(info['valkey_version']).toBe(valkey.version)
      } finally {
        await server.stop()
      }
    })
  })

  onValkey('the lease contract on one server', () => {
    let server: RedisServer
    beforeAll(async () => {
      server = await startRedis()
    })
    afterAll(async () => {
      await server?.stop()
    })
    describeLeaseContract(
      'RedisLeaseProvider',
      (limits) => new RedisLeaseProvider({ url: server.url, keyPrefix: `test:${randomUUID()}`, ...(limits as object) }),
      { commandCalls: () => server.commandCalls() },
    )
  })

  onValkey('on a Valkey Cluster of 3 masters and 3 replicas', () => {
    let cluster: RedisCluster
    beforeAll(async () => {
      cluster = await startCluster()
    })
    afterAll(async () => {
      await cluster?.stop()
    })

    it('every node is a valkey-server in cluster mode, made a cluster by redis-cli --cluster create', async () => {
      for (const node of cluster.nodes) expect(await node.info('server')).toMatchObject({ server_name: 'valkey', server_mode: 'cluster' })
      expect(await cluster.health()).toBeUndefined()
    })
    describeLeaseContract('RedisLeaseProvider', (limits) => new RedisLeaseProvider({ cluster: { nodes: cluster.urls }, keyPrefix: `test:${randomUUID()}`, ...(limits as object) }))
  })

  // Each imported into a describe of its own, whose hooks its top-level ones become: a file's
  // servers are started and stopped within it.
  const suite = (file: string, load: () => Promise<unknown>) =>
    describe(file, async () => {
      await load()
    })
  onValkey('the Redis Streams suites', () => {
    suite('redis-streams-publish-and-deliver.spec.ts', () => import('./redis-streams-publish-and-deliver.spec.js'))
    suite('redis-streams-settling.spec.ts', () => import('./redis-streams-settling.spec.js'))
    suite('redis-streams-lifecycle.spec.ts', () => import('./redis-streams-lifecycle.spec.js'))
    suite('redis-streams-connections.spec.ts', () => import('./redis-streams-connections.spec.js'))
  })
  onValkey('the fault suites', () => {
    suite('lease-faults.spec.ts', () => import('./lease-faults.spec.js'))
    suite('servers-lacking-commands.spec.ts', () => import('./servers-lacking-commands.spec.js'))
  })
})
