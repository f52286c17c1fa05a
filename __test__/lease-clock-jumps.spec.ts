// Wall-clock jumps on the client (libfaketime; CLOCK_MONOTONIC untouched): a lease stays held
// across a +1 h and a -1 h jump and expires on time. A store that keeps deadlines on
// Date.now() is the negative control.
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { randomUUID } from 'node:crypto'
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'

import { beforeAll, beforeEach, describe, expect, it, type TestContext } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider } from '../dist/esm/index.js'
import { monotonicNow } from './helpers/lease-history.js'
import { LeaseChild, leaseInRedis, leaseSuite, msBetween, msToNs, RUN, stopLater, tempDirs, timed, untilMono, type Grant, type Timed } from './helpers/lease-runs.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()

const FAKETIME_LIB = [
  '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1',
  '/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1',
  '/usr/lib/faketime/libfaketime.so.1',
  '/usr/local/lib/faketime/libfaketime.so.1',
].find((p) => existsSync(p))

interface ClockRun {
  violations: string[]
  /** How far Date.now() in the child moved at each jump, beyond the monotonic time that passed (ms). */
  jumps: number[]
  checks: number
}

/**
 * In a child whose wall clock the test moves (libfaketime reads FAKETIME_TIMESTAMP_FILE on
 * every call; CLOCK_MONOTONIC is left alone): k1 is taken at real time, then the clock jumps
 * +1 h; k2 is taken, then the clock jumps back -1 h. Both 2 s leases must stay held across the
 * jumps and up to shortly before their TTL ends by the monotonic clock, and be free right after.
 */
async function clockJumps(child: LeaseChild, clockFile: string, inspect?: (key: string) => Promise<{ owner: string | null; pttl: number }>): Promise<ClockRun> {
  const TTL = 2_000
  const run: ClockRun = { violations: [], jumps: [], checks: 0 }
  const [k1, k2] = ['before-jumps', 'during-jumps'].map((label) => `clock:${RUN}:${randomUUID().slice(0, 8)}:${label}\u0000thread`) as [string, string]

  const jump = async (offset: string) => {
    const before = await child.clock()
    writeFileSync(clockFile, offset)
    const after = await child.clock()
    run.jumps.push(after.wall - before.wall - msBetween(before.mono, after.mono))
  }
  const acquire = async (key: string) => {
    const g = await timed(() => child.call<Grant>('acquireLease', key, 'holder', TTL))
    if (!g.value.acquired) run.violations.push(`${key}: the holder could not take a free key`)
    return g
  }
  const held = async (key: string, granted: Timed<Grant>, when: string) => {
    const owner = await timed(() => child.call<string | undefined>('getLeaseOwner', key))
    const rival = await timed(() => child.call<Grant>('acquireLease', key, 'rival', TTL))
    run.checks++
    if (rival.t1 >= granted.t0 + msToNs(TTL)) {
      run.violations.push(`${key}: the check ${when} came too late to judge (the machine stalled)`)
      return
    }
    if (owner.value !== 'holder') run.violations.push(`${key}: not held ${when} (owner ${owner.value})`)
    if (rival.value.acquired) run.violations.push(`${key}: a rival acquired it ${when}`)
    if (inspect) {
      const seen = await timed(() => inspect(key))
      const most = TTL - msBetween(granted.t1, seen.t0) + 1
      if (seen.value.owner === 'holder' && (seen.value.pttl <= 0 || seen.value.pttl > most)) {
        run.violations.push(`${key}: PTTL ${seen.value.pttl} ${when}, expected in (0, ${most.toFixed(0)}]`)
      }
    }
  }
  const expired = async (key: string, when: string) => {
    const owner = await child.call<string | undefined>('getLeaseOwner', key)
    const rival = await child.call<Grant>('acquireLease', key, 'rival', TTL)
    run.checks++
    if (owner !== undefined) run.violations.push(`${key}: still held by ${owner} ${when}`)
    if (!rival.acquired) run.violations.push(`${key}: a rival was refused ${when}`)
  }

  writeFileSync(clockFile, '+0')
  const g1 = await acquire(k1)
  await jump('+3600') // one hour ahead
  await held(k1, g1, 'after a +1 h jump')
  const g2 = await acquire(k2)
  await jump('+0') // one hour back
  await held(k1, g1, 'after a -1 h jump')
  await held(k2, g2, 'after a -1 h jump')
  await untilMono(g1.t0 + msToNs(TTL - 400))
  await held(k1, g1, '400 ms before its TTL ends')
  await untilMono(g2.t0 + msToNs(TTL - 400))
  await held(k2, g2, '400 ms before its TTL ends')
  await untilMono(g1.t1 + msToNs(TTL + 300))
  await expired(k1, '300 ms after its TTL ended')
  await untilMono(g2.t1 + msToNs(TTL + 300))
  await expired(k2, '300 ms after its TTL ended')
  return run
}

describe('wall-clock jumps on the client (libfaketime, CLOCK_MONOTONIC untouched)', () => {
  let server: RedisServer
  let dir: string
  // Without libfaketime each test is skipped saying so (the run's summary lists the reason).
  beforeEach(({ skip }) => skip(!FAKETIME_LIB, 'libfaketime not installed (apt-get install faketime)'))
  beforeAll(async () => {
    if (!FAKETIME_LIB) return
    server = await startRedis()
    stopLater(server)
    dir = mkdtempSync(path.join(os.tmpdir(), 'mlr-clock-'))
    tempDirs.push(dir)
  })

  async function underFaketime(config: Record<string, unknown>) {
    const clockFile = path.join(dir, `clock-${randomUUID().slice(0, 8)}`)
    writeFileSync(clockFile, '+0')
    const env = {
      ...process.env,
      LD_PRELOAD: [FAKETIME_LIB, process.env.LD_PRELOAD].filter(Boolean).join(' '),
      FAKETIME_TIMESTAMP_FILE: clockFile,
      FAKETIME_NO_CACHE: '1',
      FAKETIME_DONT_FAKE_MONOTONIC: '1',
      DONT_FAKE_MONOTONIC: '1', // the name before libfaketime 0.9.8
    }
    const child = await LeaseChild.start(config, env)
    // The child's monotonic clock is the test's own: it reads between our two readings.
    const before = monotonicNow()
    const { mono } = await child.clock()
    const after = monotonicNow()
    expect(mono >= before && mono <= after, 'CLOCK_MONOTONIC in the child is not faked').toBe(true)
    return { child, clockFile }
  }

  function expectJumped(run: ClockRun) {
    // The fault really happened: Date.now() in the child jumped an hour each way.
    expect(run.jumps).toHaveLength(2)
    expect(Math.abs(run.jumps[0]! - 3_600_000), `Date.now() jumped ${run.jumps[0]} ms`).toBeLessThan(1_000)
    expect(Math.abs(run.jumps[1]! + 3_600_000), `Date.now() jumped ${run.jumps[1]} ms`).toBeLessThan(1_000)
  }

  async function heldThroughJumps(annotate: TestContext['annotate'], config: Record<string, unknown>, prefix?: string) {
    const { child, clockFile } = await underFaketime(config)
    try {
      const run = await clockJumps(child, clockFile, prefix ? (key) => leaseInRedis(server, `${prefix}:lease:${key}`) : undefined)
      await annotate(`jumps ${run.jumps.map((j) => j.toFixed(0)).join(' / ')} ms, ${run.checks} checks, ${run.violations.length} violations`)
      expectJumped(run)
      expect(run.checks).toBe(7)
      expect(run.violations).toEqual([])
    } finally {
      await child.stop()
    }
  }

  it('MemoryLeaseProvider: a 2 s lease stays held across a +1 h and a -1 h jump, and expires on time by the monotonic clock', async ({ annotate }) => {
    await heldThroughJumps(annotate, { store: 'memory' })
  })

  it('RedisLeaseProvider: the same, with the PTTL in Redis counting down through both jumps', async ({ annotate }) => {
    const prefix = `clock:${RUN}`
    await heldThroughJumps(annotate, { store: 'redis', url: server.url, keyPrefix: prefix }, prefix)
  })

  it('a store that keeps deadlines on Date.now() fails the same checks under the same jumps (negative control)', async ({ annotate }) => {
    const { child, clockFile } = await underFaketime({ store: 'wallclock' })
    try {
      const run = await clockJumps(child, clockFile)
      await annotate(`negative control: ${run.violations.length} violations: ${run.violations.join(' | ')}`)
      expectJumped(run)
      expect(run.violations.some((v) => v.includes('not held after a +1 h jump'))).toBe(true)
      expect(run.violations.some((v) => v.includes('still held by holder 300 ms after its TTL ended'))).toBe(true)
    } finally {
      await child.stop()
    }
  })
})
