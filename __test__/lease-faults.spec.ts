// Mutual exclusion under load and under faults, judged by the lease-history checker
// (helpers/lease-history.ts): per key, the windows over which different owners *believed*
// they held the lease must never overlap, and a counter incremented read-sleep-write under
// the lease must lose no update. Two negative controls show the checker flags real breaks.
//
// And what one provider's calls do when the server fails them: nothing listening, a server
// that accepts and never answers, a frozen, killed or restarted server, a connection closed
// while idle, a server out of memory or without its scripts (SCRIPT FLUSH). Each call
// settles in bounded time with a coded error, never a false answer, and the provider
// recovers by itself; a process whose providers meet no Redis still exits by itself.
import { spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import net from 'node:net'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisLeaseProvider } from '../index.js'
import { errorCode, everyCall, expectRejection, leaseFailureWarnings, settleWithin, sleep, uniqueKey } from './helpers/lease.js'
import { checkCounter, checkLeaseHistory, describeOverlaps, recordLeases, type LeaseOperation } from './helpers/lease-history.js'
import { leaseStorm, lostWithoutPause, unprotectedWithoutPause, type StormConfig, type StormResult } from './helpers/lease-storm.js'
import { perTest } from './helpers/per-test.js'
import { EXTERNAL_REDIS, freePort, startRedis, type RedisServer } from './helpers/redis-server.js'

const LONG = 60_000

const servers: RedisServer[] = []
afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop()))
})

const { provider, ownServer } = perTest()

// The faults fail lease calls, which warn through process.emitWarning (no logger here).
leaseFailureWarnings()

/**
 * Runs `script` in a child Node process; answers its stdout. The child must exit by itself,
 * with code 0, within 8 s: a handle left open keeps it alive and fails the test.
 */
async function runScript(script: string): Promise<string> {
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  let err = ''
  child.stdout.on('data', (d: Buffer) => (out += d.toString()))
  child.stderr.on('data', (d: Buffer) => (err += d.toString()))
  const exit = new Promise<number | null>((r) => child.once('exit', (code) => r(code)))
  try {
    const r = await settleWithin(exit, 8_000)
    if (r.status !== 'fulfilled') throw new Error(`child did not exit by itself within 8 s (a handle is left open); stderr: ${err}`)
    expect(r.value, err).toBe(0)
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  }
  return out
}

/** Poll `fn` until it resolves, each attempt bounded; fails after `ms`. */
async function eventually<T>(fn: () => Promise<T>, ms: number, attemptMs = 3_000): Promise<T> {
  const deadline = Date.now() + ms
  let last: unknown
  while (Date.now() < deadline) {
    const r = await settleWithin(fn(), attemptMs)
    if (r.status === 'fulfilled') return r.value
    last = r.reason
    await sleep(50)
  }
  throw new Error(`did not succeed within ${ms} ms; last error: ${String(last)} (${String(errorCode(last))})`)
}

/** A storm of `config.workers` processes on `keys` fresh keys of one redis-server. */
function storm(server: RedisServer, config: Omit<StormConfig, 'keys'> & { keys: number }): Promise<StormResult> {
  const run = randomUUID().slice(0, 8)
  const keys = Array.from({ length: config.keys }, (_, i) => `faults:${run}:thread-${i}\u0000x`)
  return leaseStorm({ url: server.url }, `faults:${run}`, { ...config, keys })
}

describe('the history checker on hand-written histories', () => {
  // Times in ms on a made-up monotonic line.
  const at = (msTime: number) => BigInt(Math.round(msTime * 1e6))
  const op = (o: Omit<LeaseOperation, 'start' | 'end'> & { start: number; end: number }): LeaseOperation => ({
    ...o,
    start: at(o.start),
    end: at(o.end),
  })

  it('accepts a hand-over by transfer and a take-over after the TTL ran out', () => {
    const report = checkLeaseHistory([
      op({ op: 'acquire', key: 'k', owner: 'a', ttlMs: 100, start: 0, end: 1, outcome: 'ok' }),
      op({ op: 'transfer', key: 'k', owner: 'a', to: 'b', ttlMs: 100, start: 50, end: 51, outcome: 'ok' }),
      // b's window is [51, 150]; c gets the key only after that.
      op({ op: 'acquire', key: 'k', owner: 'c', ttlMs: 100, start: 149, end: 151, outcome: 'ok' }),
      op({ op: 'release', key: 'k', owner: 'c', ttlMs: 0, start: 160, end: 161, outcome: 'ok' }),
      op({ op: 'acquire', key: 'k', owner: 'd', ttlMs: 100, start: 161, end: 162, outcome: 'ok' }),
    ])
    expect(report).toMatchObject({ operations: 5, grants: 4, acquisitions: 3, overlaps: [] })
  })

  it('an owner with two calls in flight: a transfer to b racing b’s own release opens no window for b, whichever started first', () => {
    for (const releaseStart of [40, 55]) {
      const report = checkLeaseHistory([
        op({ op: 'acquire', key: 'k', owner: 'a', ttlMs: 100, start: 0, end: 1, outcome: 'ok' }),
        op({ op: 'transfer', key: 'k', owner: 'a', to: 'b', ttlMs: 100, start: 50, end: 60, outcome: 'ok' }),
        // Redis may have run the release after the transfer: the key is free, c takes it.
        op({ op: 'release', key: 'k', owner: 'b', ttlMs: 0, start: releaseStart, end: 62, outcome: 'ok' }),
        op({ op: 'acquire', key: 'k', owner: 'c', ttlMs: 100, start: 70, end: 71, outcome: 'ok' }),
      ])
      expect(report.overlaps, `release started at ${releaseStart}`).toEqual([])
    }
  })

  it('a release that ended before the transfer to its owner started does not hide the overlap that follows', () => {
    const report = checkLeaseHistory([
      op({ op: 'acquire', key: 'k', owner: 'a', ttlMs: 100, start: 0, end: 1, outcome: 'ok' }),
      op({ op: 'release', key: 'k', owner: 'b', ttlMs: 0, start: 40, end: 45, outcome: 'ok' }),
      op({ op: 'transfer', key: 'k', owner: 'a', to: 'b', ttlMs: 100, start: 50, end: 60, outcome: 'ok' }),
      op({ op: 'acquire', key: 'k', owner: 'c', ttlMs: 100, start: 70, end: 71, outcome: 'ok' }),
    ])
    expect(report.overlaps).toHaveLength(1)
    expect(report.overlaps[0]).toMatchObject({ first: { owner: 'b' }, second: { owner: 'c' } })
  })

  it('flags a second owner granted the key inside the first owner’s window, with both windows', () => {
    const report = checkLeaseHistory([
      op({ op: 'acquire', key: 'k', owner: 'a', ttlMs: 100, start: 0, end: 1, outcome: 'ok' }),
      op({ op: 'acquire', key: 'k', owner: 'b', ttlMs: 100, start: 90, end: 91, outcome: 'ok' }),
      op({ op: 'acquire', key: 'other', owner: 'c', ttlMs: 100, start: 0, end: 1, outcome: 'ok' }),
    ])
    expect(report.overlaps).toHaveLength(1)
    expect(report.overlaps[0]).toMatchObject({ key: 'k', first: { owner: 'a', from: at(1), to: at(100) }, second: { owner: 'b' } })
    expect(report.overlaps[0]?.overlapMs).toBeCloseTo(9, 6)
  })

  it('lets a renew with a shorter TTL replace the longer one', () => {
    const history = [
      op({ op: 'acquire', key: 'k', owner: 'a', ttlMs: 500, start: 0, end: 1, outcome: 'ok' }),
      op({ op: 'renew', key: 'k', owner: 'a', ttlMs: 100, start: 10, end: 11, outcome: 'ok' }),
      // a now believes [1, 110] only, so b taking the key at 116 is fine.
      op({ op: 'acquire', key: 'k', owner: 'b', ttlMs: 100, start: 115, end: 116, outcome: 'ok' }),
    ]
    expect(checkLeaseHistory(history).overlaps).toEqual([])
    const withoutRenew = checkLeaseHistory(history.filter((o) => o.op !== 'renew'))
    expect(withoutRenew.overlaps.map((o) => [o.first.owner, o.second.owner])).toEqual([['a', 'b']])
  })

  it('ends a belief at a false renew, and not at a renew that rejected', () => {
    const history = (outcome: LeaseOperation['outcome']) => [
      op({ op: 'acquire', key: 'k', owner: 'b', ttlMs: 300, start: 0, end: 1, outcome: 'ok' }),
      op({ op: 'renew', key: 'k', owner: 'b', ttlMs: 300, start: 200, end: 201, outcome }),
      op({ op: 'acquire', key: 'k', owner: 'c', ttlMs: 100, start: 250, end: 251, outcome: 'ok' }),
    ]
    expect(checkLeaseHistory(history('refused')).overlaps).toEqual([])
    const afterError = checkLeaseHistory(history('error'))
    expect(afterError.errors).toBe(1)
    expect(afterError.overlaps.map((o) => [o.first.owner, o.second.owner, o.overlapMs])).toEqual([['b', 'c', 49]])
  })

  it('counts lost updates as increments the shared value does not show', () => {
    expect(checkCounter(7, 9)).toEqual({ increments: 9, value: 7, lost: 2 })
  })
})

describe.skipIf(EXTERNAL_REDIS)('mutual exclusion, checked from the recorded history', () => {
  let server: RedisServer
  beforeAll(async () => {
    server = await startRedis()
    servers.push(server)
  })

  it('an acquire storm of 16 processes on 4 keys never lets two owners believe they hold a key at once, and loses no update', async ({ annotate }) => {
    const { history, report, counters } = await storm(server, {
      workers: 16,
      keys: 4,
      durationMs: 5_000,
      maxOps: 1_000,
      ttlMinMs: 200,
      ttlMaxMs: 500,
      paceMs: 6,
      walkAway: 0.03,
      broken: false,
    })
    const uses = history.uses.length
    await annotate(
      `storm: ${report.operations} operations checked (${report.acquisitions} acquisitions, ${report.grants} grants, ` +
        `${report.errors} errors), ${report.overlaps.length} overlaps, ${uses} protected increments ` +
        `(${report.unprotectedUses.length - unprotectedWithoutPause(report).length} paused past the margin), ` +
        `counters ${counters.map((c) => `${c.value}/${c.increments}`).join(' ')}`,
    )

    // Not vacuous: every worker finished, and there was real contention over the keys.
    expect(history.summaries).toHaveLength(16)
    expect(report.operations).toBeGreaterThanOrEqual(3_000)
    expect(report.acquisitions).toBeGreaterThanOrEqual(200)
    expect(uses).toBeGreaterThanOrEqual(200)
    for (const kind of ['acquire', 'renew', 'transfer', 'release'] as const) {
      expect(history.operations.filter((o) => o.op === kind && o.outcome === 'ok').length, kind).toBeGreaterThan(0)
    }
    expect(history.operations.filter((o) => o.outcome === 'refused').length, 'contended calls').toBeGreaterThan(0)

    expect(report.errors, 'no call failed against a healthy server').toBe(0)
    expect(report.overlaps, describeOverlaps(report)).toEqual([])
    expect(unprotectedWithoutPause(report), 'every increment ran inside its owner’s believed window').toEqual([])
    expect(lostWithoutPause(report, counters), 'no update lost but where a section was paused past the margin').toEqual([])
  })

  it('the checker flags a provider that tells every caller it acquired the lease (negative control)', async ({ annotate }) => {
    const { report, counters } = await storm(server, {
      workers: 2,
      keys: 1,
      durationMs: 1_500,
      maxOps: 2_000,
      ttlMinMs: 200,
      ttlMaxMs: 500,
      paceMs: 2,
      walkAway: 0,
      broken: true,
    })
    const lost = counters.reduce((n, c) => n + c.lost, 0)
    await annotate(
      `broken provider: ${report.operations} operations checked, ${report.overlaps.length} overlaps, ${lost} lost updates\n` +
        describeOverlaps(report).split('\n')[0],
    )

    expect(report.operations).toBeGreaterThanOrEqual(300)
    expect(report.overlaps.length).toBeGreaterThanOrEqual(1)
    // The overlap is between the two workers, on the one key.
    const owners = new Set(report.overlaps.flatMap((o) => [o.first.owner.split('/')[0], o.second.owner.split('/')[0]]))
    expect(owners).toEqual(new Set(['w0', 'w1']))
    expect(lost, 'read-sleep-write increments overwrote each other').toBeGreaterThan(0)
  })

  it('the checker flags a redis-server killed and restarted without persistence while a lease is held (negative control)', async ({ annotate }) => {
    const own = await startRedis()
    servers.push(own)
    const key = `faults:${randomUUID().slice(0, 8)}:thread\u0000kill`
    const ops: LeaseOperation[] = []
    const a = recordLeases(new RedisLeaseProvider({ url: own.url }), (op) => ops.push(op))
    const b = recordLeases(new RedisLeaseProvider({ url: own.url }), (op) => ops.push(op))
    try {
      expect(await a.acquireLease(key, 'owner-a', 30_000)).toStrictEqual({ acquired: true, owner: 'owner-a' })
      expect(await b.acquireLease(key, 'owner-b', 30_000)).toEqual({ acquired: false, owner: 'owner-a' })
      expect(checkLeaseHistory(ops).overlaps, 'no overlap before the fault').toEqual([])

      // The fault: SIGKILL, then a fresh server on the same port with no data.
      await own.kill()
      await own.restart()

      // B's provider reconnects; calls during the reconnect may reject (recorded as errors).
      let grant: { acquired: boolean; owner?: string } | undefined
      const deadline = Date.now() + 10_000
      while (!grant && Date.now() < deadline) {
        grant = await b.acquireLease(key, 'owner-b', 30_000).catch(() => undefined)
        if (!grant) await new Promise((r) => setTimeout(r, 50))
      }
      expect(grant, 'B acquires the wiped lease while A still believes it holds it').toStrictEqual({ acquired: true, owner: 'owner-b' })
      // A finds out only at its next renew (once its own provider has reconnected too).
      let renewed: boolean | undefined
      while (renewed === undefined && Date.now() < deadline) {
        renewed = await a.renewLease(key, 'owner-a', 30_000).catch(() => undefined)
        if (renewed === undefined) await new Promise((r) => setTimeout(r, 50))
      }
      expect(renewed).toBe(false)
    } finally {
      await a.close()
      await b.close()
    }

    const report = checkLeaseHistory(ops)
    await annotate(`kill -9 + restart: ${report.operations} operations checked, ${report.overlaps.length} overlaps\n${describeOverlaps(report)}`)
    expect(report.overlaps).toHaveLength(1)
    const [overlap] = report.overlaps
    expect(overlap?.key).toBe(key)
    expect([overlap?.first.owner, overlap?.second.owner]).toEqual(['owner-a', 'owner-b'])
    // A's window was cut short by its false renew, after B's began.
    expect(overlap?.first.endedBy?.op).toBe('renew')
    expect(overlap?.overlapMs).toBeGreaterThan(0)
  })
})

describe('RedisLeaseProvider', () => {
  describe('when no server answers, and no handle is left open', () => {
    it('nothing listening at start: calls reject fast with a coded error, again and again', async () => {
      const port = await freePort()
      const p = provider({ url: `redis://127.0.0.1:${port}` })
      for (const [name, call] of everyCall(p, uniqueKey('refused'))) {
        const r = await settleWithin(call(), 2_500)
        expect(r.status, name).toBe('rejected')
        if (r.status === 'rejected') expect(['ERR_LEASE_CONNECTION', 'ERR_LEASE_TIMEOUT'], name).toContain(errorCode(r.reason))
      }
    })

    it('Redis absent at start: a process that never closes its providers gets fast coded rejections, no unhandled rejection, and exits by itself', async () => {
      const port = await freePort()
      // Both Redis surfaces, pointed at a port nobody listens on, never closed. Each call is
      // timed alone; the process must then end on its own (no handle left open).
      const script = `
        const { RedisLeaseProvider, RedisStreamsPubSub } = require(${JSON.stringify(path.resolve(__dirname, '..', 'dist', 'cjs', 'index.js'))});
        const failures = [];
        const results = [];
        process.on('unhandledRejection', (e) => failures.push('unhandledRejection ' + ((e && e.code) || String(e))));
        process.on('uncaughtException', (e) => failures.push('uncaughtException ' + ((e && e.code) || String(e))));
        process.on('exit', () => process.stdout.write(JSON.stringify({ results, failures })));
        const options = { url: 'redis://127.0.0.1:${port}', commandTimeoutMs: 5000 };
        const provider = new RedisLeaseProvider(options);
        const pubsub = new RedisStreamsPubSub(options);
        const calls = (p, who) => [
          [who + ' acquireLease', () => p.acquireLease('k', 'a', 60000)],
          [who + ' getLeaseOwner', () => p.getLeaseOwner('k')],
          [who + ' releaseLease', () => p.releaseLease('k', 'a')],
          [who + ' renewLease', () => p.renewLease('k', 'a', 60000)],
          [who + ' transferLease', () => p.transferLease('k', 'a', 'b', 60000)],
        ];
        const all = [
          ...calls(provider, 'provider'),
          ...calls(pubsub, 'pubsub'),
          ['pubsub publish', () => pubsub.publish('topic', { type: 'test', runId: 'r', data: {} })],
        ];
        (async () => {
          for (const [name, call] of all) {
            const started = performance.now();
            const outcome = await call().then(() => 'resolved', (e) => e.code);
            results.push({ name, outcome, ms: Math.round(performance.now() - started) });
          }
        })();
      `
      const started = performance.now()
      const out = await runScript(script)
      const lifetime = performance.now() - started
      const { results, failures } = JSON.parse(out) as { results: Array<{ name: string; outcome: string; ms: number }>; failures: string[] }
      expect(failures).toEqual([])
      expect(results.map((r) => r.name)).toHaveLength(11)
      for (const r of results) {
        expect(r.outcome, r.name).toMatch(/^ERR_LEASE_(CONNECTION|TIMEOUT)$/)
        // A refused connection is known at once: far under commandTimeoutMs (5 s).
        expect(r.ms, r.name).toBeLessThan(1_000)
      }
      // Eleven refused calls and Node's start-up, far from 11 command timeouts.
      expect(lifetime).toBeLessThan(8_000)
    })

    it('a server that accepts but never answers: calls reject within connect + command timeout', async () => {
      const sockets = new Set<net.Socket>()
      const silent = net.createServer((s) => {
        sockets.add(s)
        s.on('error', () => {})
      })
      await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r))
      try {
        const port = (silent.address() as net.AddressInfo).port
        const p = provider({ url: `redis://127.0.0.1:${port}`, connectTimeoutMs: 300, commandTimeoutMs: 300 })
        const results = await Promise.all(everyCall(p, uniqueKey('silent')).map(([, call]) => settleWithin(call(), 2_000)))
        for (const r of results) {
          expect(r.status).toBe('rejected')
          if (r.status === 'rejected') expect(['ERR_LEASE_TIMEOUT', 'ERR_LEASE_CONNECTION']).toContain(errorCode(r.reason))
        }
      } finally {
        for (const s of sockets) s.destroy()
        await new Promise((r) => silent.close(r))
      }
    })

    it('a child process that uses both providers and closes them exits by itself', async () => {
      const server = await ownServer()
      const script = `
        const { MemoryLeaseProvider, RedisLeaseProvider } = require(${JSON.stringify(path.resolve(__dirname, '..', 'dist', 'cjs', 'index.js'))});
        (async () => {
          const memory = new MemoryLeaseProvider();
          const redis = new RedisLeaseProvider({ url: ${JSON.stringify(server.url)}, keyPrefix: ${JSON.stringify(`child:${randomUUID()}`)} });
          const unreachable = new RedisLeaseProvider({ url: 'redis://127.0.0.1:${await freePort()}', connectTimeoutMs: 200, commandTimeoutMs: 200 });
          const a = await memory.acquireLease('k', 'child', 60000);
          const b = await redis.acquireLease('k', 'child', 60000);
          const c = await redis.getLeaseOwner('k');
          const d = await unreachable.getLeaseOwner('k').then(() => 'resolved', (e) => e.code);
          await memory.close();
          await redis.close();
          await unreachable.close();
          process.stdout.write(JSON.stringify({ a, b, c, d }));
        })().catch((e) => { console.error(e); process.exit(2); });
      `
      const out = await runScript(script)
      expect(JSON.parse(out)).toStrictEqual({
        a: { acquired: true, owner: 'child' },
        b: { acquired: true, owner: 'child' },
        c: 'child',
        d: expect.stringMatching(/^ERR_LEASE_(CONNECTION|TIMEOUT)$/),
      })
    })
  })

  describe('when the server forgets its scripts', () => {
    let server: RedisServer
    beforeAll(async () => {
      server = await startRedis()
    })
    afterAll(async () => {
      await server?.stop()
    })

    it('SCRIPT FLUSH between calls is invisible: every call keeps working', async () => {
      const p = provider({ url: server.url })
      const key = uniqueKey('noscript')
      const steps: Array<() => Promise<unknown>> = [
        async () => expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' }),
        async () => expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' }),
        async () => expect(await p.acquireLease(key, 'B', LONG)).toEqual({ acquired: false, owner: 'A' }),
        async () => expect(await p.getLeaseOwner(key)).toBe('A'),
        async () => expect(await p.renewLease(key, 'A', LONG)).toBe(true),
        async () => expect(await p.transferLease(key, 'A', 'B', LONG)).toBe(true),
        async () => expect(await p.releaseLease(key, 'B')).toBeUndefined(),
        async () => expect(await p.getLeaseOwner(key)).toBeUndefined(),
      ]
      for (const step of steps) {
        await server.flushScripts()
        await step()
      }
      // And many concurrent calls right after a flush.
      await server.flushScripts()
      const keys = Array.from({ length: 50 }, (_, i) => uniqueKey(`noscript-${i}`))
      const res = await Promise.all(keys.map((k) => p.acquireLease(k, 'C', LONG)))
      expect(res.every((r) => r.acquired)).toBe(true)
    })
  })

  describe.skipIf(EXTERNAL_REDIS)('when the server misbehaves', () => {
    it('a frozen server: every call rejects with ERR_LEASE_TIMEOUT within commandTimeoutMs, and works again after SIGCONT', async () => {
      const server = await ownServer()
      const p = provider({ url: server.url, commandTimeoutMs: 300 })
      const key = uniqueKey('frozen')
      await p.acquireLease(key, 'A', LONG)
      server.freeze()
      try {
        const results = await Promise.all(everyCall(p, key).map(([name, call]) => settleWithin(call(), 1_000).then((r) => ({ name, ...r }))))
        for (const r of results) {
          expect(r.status, r.name).toBe('rejected')
          if (r.status === 'rejected') expect(errorCode(r.reason), r.name).toBe('ERR_LEASE_TIMEOUT')
          expect(r.elapsed, r.name).toBeLessThan(1_000)
        }
        // Still bounded on later calls while frozen.
        const again = await settleWithin(p.getLeaseOwner(key), 1_000)
        expect(again.status).toBe('rejected')
      } finally {
        server.thaw()
      }
      const other = uniqueKey('after-thaw')
      expect(await eventually(() => p.acquireLease(other, 'A', LONG), 3_000)).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await p.getLeaseOwner(other)).toBe('A')
      expect(await server.cli('GET', `mastra:topic:lease:${other}`)).toBe('A')
    })

    it('a provider whose first call meets a frozen server still settles in bounded time', async () => {
      const server = await ownServer()
      server.freeze()
      try {
        // The kernel still accepts the TCP connection; the handshake never completes.
        const p = provider({ url: server.url, connectTimeoutMs: 300, commandTimeoutMs: 300 })
        const r = await settleWithin(p.acquireLease(uniqueKey('frozen-first'), 'A', LONG), 1_500)
        expect(r.status).toBe('rejected')
        if (r.status === 'rejected') expect(['ERR_LEASE_TIMEOUT', 'ERR_LEASE_CONNECTION']).toContain(errorCode(r.reason))
      } finally {
        server.thaw()
      }
    })

    it('a killed server: calls reject with a coded error and never resolve false', async () => {
      const server = await ownServer()
      const p = provider({ url: server.url, connectTimeoutMs: 500, commandTimeoutMs: 500 })
      const key = uniqueKey('killed')
      await p.acquireLease(key, 'A', LONG)
      await server.kill()
      for (let round = 0; round < 2; round++) {
        for (const [name, call] of everyCall(p, key)) {
          const r = await settleWithin(call(), 2_000)
          expect(r.status, `${name} resolved ${JSON.stringify(r.status === 'fulfilled' ? r.value : null)}`).toBe('rejected')
          if (r.status === 'rejected') expect(['ERR_LEASE_CONNECTION', 'ERR_LEASE_TIMEOUT'], name).toContain(errorCode(r.reason))
        }
      }
    })

    it('after a restart on the same port the provider recovers by itself', async () => {
      const server = await ownServer()
      const p = provider({ url: server.url, connectTimeoutMs: 500, commandTimeoutMs: 500 })
      await p.acquireLease(uniqueKey('before-restart'), 'A', LONG)
      await server.kill()
      const down = await settleWithin(p.getLeaseOwner(uniqueKey('down')), 2_000)
      expect(down.status).toBe('rejected')
      await server.restart()
      // A restarted server has no scripts cached: recovery includes reloading them.
      // The dead connection is noticed by the first call, which goes again on a new one.
      const key = uniqueKey('after-restart')
      expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await p.acquireLease(key, 'B', LONG)).toEqual({ acquired: false, owner: 'A' })
      expect(await p.renewLease(key, 'A', LONG)).toBe(true)
      expect(await p.transferLease(key, 'A', 'B', LONG)).toBe(true)
      expect(await server.cli('GET', `mastra:topic:lease:${key}`)).toBe('B')
      await p.releaseLease(key, 'B')
      expect(await p.getLeaseOwner(key)).toBeUndefined()
    })

    it('a server still loading its data after a restart: calls wait for it within commandTimeoutMs and answer, or reject ERR_LEASE_CONNECTION, never ERR_LEASE_REDIS', async ({ annotate }) => {
      // Loading slowed down (1 ms a key) and answering meanwhile (every 1 KiB): for about 3 s
      // after the restart every command is answered LOADING and runs nothing.
      const server = await ownServer({ args: ['--key-load-delay', '1000', '--loading-process-events-interval-bytes', '1024'] })
      await server.cli('EVAL', "for i = 1, 3000 do redis.call('SET', 'filler:' .. i, 'x') end", 0)
      await server.cli('SAVE')
      const loading = async () => (await server.info('persistence')).loading
      const quick = provider({ url: server.url, commandTimeoutMs: 500 })
      const patient = provider({ url: server.url, commandTimeoutMs: 10_000 })
      await server.restart({ whileLoading: true })
      expect(await loading(), 'the server is loading').toBe('1')
      const started = performance.now()
      const [refused, granted] = await Promise.all([
        settleWithin(quick.acquireLease(uniqueKey('loading-quick'), 'A', LONG), 3_000),
        patient.acquireLease(uniqueKey('loading-patient'), 'A', LONG),
      ])
      const waited = performance.now() - started
      expect(refused.status).toBe('rejected')
      if (refused.status === 'rejected') expect(errorCode(refused.reason)).toBe('ERR_LEASE_CONNECTION')
      expect(refused.elapsed).toBeLessThan(1_500)
      expect(granted).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await loading()).toBe('0')
      await annotate(`loading: the 500 ms call rejected ERR_LEASE_CONNECTION after ${Math.round(refused.elapsed)} ms; the 10 s one granted after ${Math.round(waited)} ms`)
    })

    it('a connection the server closed while idle costs no failed call, a transfer included', async () => {
      // Servers with `timeout`, proxies and NATs close idle connections. Mastra counts a
      // rejected acquireLease as acquired, so a spurious connection error is not harmless.
      const server = await ownServer()
      const p = provider({ url: server.url })
      const key = uniqueKey('idle-closed')
      const lease = `mastra:topic:lease:${key}`
      expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
      const closeIdle = async () => {
        expect(await server.cli('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes')).toBeGreaterThan(0)
        await sleep(50)
      }
      await closeIdle()
      expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
      await closeIdle()
      expect(await p.renewLease(key, 'A', LONG)).toBe(true)
      await closeIdle()
      expect(await p.getLeaseOwner(key)).toBe('A')
      await closeIdle()
      expect(await p.releaseLease(uniqueKey('not-held'), 'A')).toBeUndefined()
      await closeIdle()
      expect(await p.transferLease(key, 'A', 'B', LONG)).toBe(true)
      expect(await server.cli('GET', lease)).toBe('B')
    })

    it('with maxmemory and noeviction, a write that needs memory (acquire, transfer) rejects with ERR_LEASE_REDIS, never false; the rest tell the truth; all works once memory is back', async () => {
      const server = await ownServer({ args: ['--maxmemory-policy', 'noeviction'] })
      const p = provider({ url: server.url })
      const held = uniqueKey('oom-held')
      const handed = uniqueKey('oom-handed')
      const fresh = uniqueKey('oom-fresh')
      await p.acquireLease(held, 'A', LONG)
      await p.acquireLease(handed, 'A', LONG)
      await server.cli('CONFIG', 'SET', 'maxmemory', '1')
      try {
        // A new key and an overwrite need memory: Redis refuses them (OOM), and the caller hears it.
        const oom = [
          await expectRejection(() => p.acquireLease(fresh, 'A', LONG), Error, 'ERR_LEASE_REDIS'),
          await expectRejection(() => p.transferLease(handed, 'A', 'B', LONG), Error, 'ERR_LEASE_REDIS'),
        ]
        for (const err of oom) expect(err.message).toContain('OOM')
        expect(await server.cli('EXISTS', `mastra:topic:lease:${fresh}`)).toBe(0)
        expect(await server.cli('GET', `mastra:topic:lease:${handed}`)).toBe('A')
        // PEXPIRE, GET and DEL need no memory: Redis runs them, and every answer is true to the state.
        expect(await p.renewLease(held, 'A', LONG)).toBe(true)
        expect(await p.acquireLease(held, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
        expect(await p.acquireLease(held, 'B', LONG)).toEqual({ acquired: false, owner: 'A' })
        expect(await p.renewLease(held, 'B', LONG)).toBe(false)
        expect(await p.transferLease(held, 'B', 'C', LONG)).toBe(false)
        expect(await p.getLeaseOwner(held)).toBe('A')
        await p.releaseLease(held, 'A')
        expect(await server.cli('EXISTS', `mastra:topic:lease:${held}`)).toBe(0)
      } finally {
        await server.cli('CONFIG', 'SET', 'maxmemory', '0')
      }
      expect(await p.acquireLease(fresh, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await p.transferLease(handed, 'A', 'B', LONG)).toBe(true)
    })
  })
})
