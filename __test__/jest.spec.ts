// The tests that run under Jest itself (__test__/jest/, plain CommonJS against the built
// package): Jest, a devDependency, runs each file in a child process, against a redis-server
// started here; its own report is shown when it fails.
import { spawn } from 'node:child_process'
import path from 'node:path'

import { beforeAll, describe, expect, it } from 'vitest'

import { leaseSuite, stopLater } from './helpers/lease-runs.js'
import { NODE } from './helpers/mastra-node.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()

const JEST = path.join(__dirname, '..', 'node_modules', 'jest', 'bin', 'jest.js')
const CONFIG = path.join(__dirname, 'jest', 'jest.config.cjs')

let server: RedisServer
beforeAll(async () => {
  server = stopLater(await startRedis())
})

interface JestRun {
  status: number | null
  /** Each test's full name and status, from Jest's JSON report. */
  tests: Array<[string, string]>
  /** What Jest printed for a person (its failures, with their diffs). */
  report: string
}

/** Runs Jest on one file of __test__/jest, in a child process bounded in time. */
function jest(file: string): Promise<JestRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(NODE, [JEST, '--config', CONFIG, '--ci', '--runInBand', '--json', '--runTestsByPath', path.join(__dirname, 'jest', file)], {
      env: { ...process.env, REDIS_URL: server.url, NO_COLOR: '1', FORCE_COLOR: '0' },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let json = ''
    let report = ''
    child.stdout.on('data', (chunk: Buffer) => (json += chunk))
    child.stderr.on('data', (chunk: Buffer) => (report += chunk))
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000)
    child.on('error', reject)
    child.on('close', (status) => {
      clearTimeout(timer)
      let tests: Array<[string, string]> = []
      try {
        const results = JSON.parse(json) as { testResults: Array<{ assertionResults: Array<{ fullName: string; status: string }> }> }
        tests = results.testResults.flatMap((file) => file.assertionResults.map((test) => [test.fullName, test.status] as [string, string]))
      } catch {
        report += `\n(no JSON report from Jest: ${json.slice(0, 2_000)})`
      }
      resolve({ status, tests, report })
    })
  })
}

/** Every test of the run passed, at least `count` of them; Jest's own report in the failure. */
function expectPassed(run: JestRun, count: number) {
  const failed = run.tests.filter(([, status]) => status !== 'passed')
  const summary = { status: run.status, tests: run.tests.length, failed }
  expect(summary, `Jest's report:\n${run.report}`).toEqual({ status: 0, tests: expect.any(Number), failed: [] })
  expect(run.tests.length, `Jest's report:\n${run.report}`).toBeGreaterThanOrEqual(count)
}

describe('under Jest', () => {
  it("MemoryLeaseProvider({ clock }) follows Jest's modern fake timers (advanceTimersByTime, setSystemTime), as EventEmitterPubSub does, through renewals, fencing, hold() and waiting", async () => {
    expectPassed(await jest('memory-clock.test.cjs'), 4)
  }, 90_000)

  it("every call of a RedisLeaseProvider against a real server, and of a MemoryLeaseProvider without the clock option, settles under Jest's default fake timers", async () => {
    expectPassed(await jest('settles.test.cjs'), 2)
  }, 90_000)
})
