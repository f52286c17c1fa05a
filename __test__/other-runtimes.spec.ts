// Bun and Deno, the npm registry's builds, load the package and its addon and run the lease
// lifecycle (in memory and on Redis), a streams round trip and Mastra's isLeaseProvider:
// fixtures/runtime-smoke.mjs under each. `.ci/run` installs both into target/runtimes.
import { spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

const root = path.resolve(__dirname, '..')
const modules = path.join(root, 'target', 'runtimes', 'node_modules')
const runtimes = [
  { name: 'Bun', binary: path.join(modules, '@oven', 'bun-linux-x64', 'bin', 'bun'), args: [] as string[] },
  { name: 'Deno', binary: path.join(modules, '@deno', 'linux-x64-glibc', 'deno'), args: ['run', '--allow-all'] },
]
const installed = runtimes.filter((r) => existsSync(r.binary))
const lifecycle = [true, true, 'a', true, 'b', null, null]

let server: RedisServer
beforeAll(async () => {
  if (installed.length > 0) server = await startRedis()
}, 30_000)
afterAll(async () => {
  await server?.stop()
})

describe('other runtimes', () => {
  it.for(runtimes)('$name loads the package and runs the lease lifecycle, a streams round trip and isLeaseProvider', { timeout: 90_000 }, (runtime, { skip }) => {
    // Without them each test is skipped saying so (the run's summary lists the reason).
    skip(installed.length === 0, 'Bun and Deno are not in target/runtimes (.ci/run installs them)')
    expect(existsSync(runtime.binary), `${runtime.binary}: .ci/run installs it`).toBe(true)
    const run = spawnSync(runtime.binary, [...runtime.args, path.join(__dirname, 'fixtures', 'runtime-smoke.mjs')], {
      cwd: root,
      env: { ...process.env, REDIS_URL: server.url, NO_COLOR: '1', DENO_NO_UPDATE_CHECK: '1' },
      encoding: 'utf8',
      timeout: 60_000,
    })
    expect(run.error).toBeUndefined()
    expect(run.status, run.stderr).toBe(0)
    const seen = JSON.parse(run.stdout.trim().split('\n').pop()!) as Record<string, unknown>
    expect(seen).toEqual({ memory: lifecycle, redis: lifecycle, pubsub: lifecycle, isLeaseProvider: [true, true, true], delivered: { n: 42 } })
  })
})
