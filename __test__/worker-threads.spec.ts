// The addon in worker threads: loaded by one worker after another that exit (or are
// terminated in the middle of calls), with the main thread never loading it. Each case runs
// in a child process of its own, so a crash is seen as a signal, not a lost test runner.
import { spawnSync } from 'node:child_process'
import path from 'node:path'

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { startRedis, type RedisServer } from './helpers/redis-server.js'

const FIXTURE = path.join(__dirname, 'fixtures', 'worker-threads.mjs')

let redis: RedisServer
beforeAll(async () => {
  redis = await startRedis()
})
afterAll(async () => {
  await redis?.stop()
})

function run(mode: 'exit' | 'terminate') {
  const child = spawnSync(process.execPath, [FIXTURE, JSON.stringify({ mode, url: redis.url, workers: 3 })], {
    encoding: 'utf8',
    timeout: 60_000,
  })
  return { status: child.status, signal: child.signal, stdout: child.stdout, stderr: child.stderr }
}

describe('worker threads', () => {
  it('three workers load the addon one after another, use all three classes and exit; the process lives on and exits cleanly', () => {
    const result = run('exit')
    expect(result.signal, result.stderr).toBeNull()
    expect(result.status, result.stderr).toBe(0)
    expect(result.stdout.match(/"ok"/g)).toHaveLength(3)
    expect(result.stdout).toContain('done')
  })

  it('three workers terminated in the middle of hundreds of calls and two subscriptions each leave the process running', () => {
    const result = run('terminate')
    expect(result.signal, result.stderr).toBeNull()
    expect(result.status, result.stderr).toBe(0)
    expect(result.stdout.match(/"busy"/g)).toHaveLength(3)
    expect(result.stdout).toContain('done')
  })
})
