// What only the Redis provider promises: the wire layout Mastra's own backend uses,
// bounded calls whatever the server does, coded transport errors, one shared
// connection, URL forms (auth, /db, unix sockets) and no handle left open.
import { spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import net from 'node:net'
import path from 'node:path'
import { inspect } from 'node:util'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { holdLease } from '../dist/esm/index.js'
import { RedisLeaseProvider } from '../index.js'
import { errorCode, expectRejection, expectThrow, settleWithin, sleep, uniqueKey, untyped, type LeaseApi } from './helpers/lease.js'
import { connectClient, EXTERNAL_REDIS, freePort, startRedis, type RedisServer, type RedisServerOptions, type RedisTestClient } from './helpers/redis-server.js'

const LONG = 60_000
type RedisOptions = NonNullable<ConstructorParameters<typeof RedisLeaseProvider>[0]>

const providers: LeaseApi[] = []
const servers: RedisServer[] = []
const extraClients: RedisTestClient[] = []

function provider(options: RedisOptions): RedisLeaseProvider {
  const p = new RedisLeaseProvider(options)
  providers.push(p)
  return p
}

/** A server of this test's own (or the REDIS_URL one, for tests that leave it alone). */
async function ownServer(opts?: RedisServerOptions): Promise<RedisServer> {
  const s = await startRedis(opts)
  servers.push(s)
  return s
}

afterEach(async () => {
  await Promise.allSettled(providers.splice(0).map((p) => p.close()))
  for (const c of extraClients.splice(0)) c.destroy()
  // stop() thaws a frozen server first: nothing is ever left SIGSTOPped.
  await Promise.allSettled(servers.splice(0).map((s) => s.stop()))
})

/** Every method once, against `key`, as thunks (so each is a fresh call). */
function everyCall(p: LeaseApi, key: string): Array<[string, () => Promise<unknown>]> {
  return [
    ['acquireLease', () => p.acquireLease(key, 'A', LONG)],
    ['getLeaseOwner', () => p.getLeaseOwner(key)],
    ['releaseLease', () => p.releaseLease(key, 'A')],
    ['renewLease', () => p.renewLease(key, 'A', LONG)],
    ['transferLease', () => p.transferLease(key, 'A', 'B', LONG)],
  ]
}

/** Poll `fn` until it resolves, each attempt bounded; fails after `ms`. */
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

describe('RedisLeaseProvider', () => {
  describe('wire layout (compatible with Mastra’s own Redis backend)', () => {
    let server: RedisServer
    beforeAll(async () => {
      server = await startRedis()
    })
    afterAll(async () => {
      await server?.stop()
    })

    it('stores a lease at mastra:topic:lease:<key> as the plain owner string with a PX expiry', async () => {
      const p = provider({ url: server.url })
      const key = `${uniqueKey('wire')}\0thread`
      const redisKey = `mastra:topic:lease:${key}`
      await p.acquireLease(key, 'owner-1', 10_000)
      expect(await server.cli('TYPE', redisKey)).toBe('string')
      expect(await server.cli('GET', redisKey)).toBe('owner-1')
      const pttl = Number(await server.cli('PTTL', redisKey))
      expect(pttl).toBeGreaterThan(9_000)
      expect(pttl).toBeLessThanOrEqual(10_000)

      expect(await p.renewLease(key, 'owner-1', 30_000)).toBe(true)
      expect(Number(await server.cli('PTTL', redisKey))).toBeGreaterThan(29_000)

      await p.acquireLease(key, 'owner-1', 40_000) // same-owner re-acquire refreshes the TTL
      expect(Number(await server.cli('PTTL', redisKey))).toBeGreaterThan(39_000)

      expect(await p.transferLease(key, 'owner-1', 'owner-2', 20_000)).toBe(true)
      expect(await server.cli('GET', redisKey)).toBe('owner-2')
      const after = Number(await server.cli('PTTL', redisKey))
      expect(after).toBeGreaterThan(19_000)
      expect(after).toBeLessThanOrEqual(20_000)

      await p.releaseLease(key, 'owner-2')
      expect(await server.cli('EXISTS', redisKey)).toBe(0)
    })

    it('uses a custom keyPrefix verbatim', async () => {
      const prefix = `custom:${randomUUID()}`
      const p = provider({ url: server.url, keyPrefix: prefix })
      const key = uniqueKey('prefixed')
      await p.acquireLease(key, 'A', 10_000)
      expect(await server.cli('GET', `${prefix}:lease:${key}`)).toBe('A')
      expect(await server.cli('EXISTS', `mastra:topic:lease:${key}`)).toBe(0)
      // A provider with the default prefix does not see it.
      const other = provider({ url: server.url })
      expect(await other.getLeaseOwner(key)).toBeUndefined()
    })

    it('respects a lease written by a plain SET ... PX, as Mastra’s own backend writes them', async () => {
      const prefix = `interop:${randomUUID()}`
      const p = provider({ url: server.url, keyPrefix: prefix })
      const key = `${uniqueKey('interop')}\0thread`
      const redisKey = `${prefix}:lease:${key}`
      expect(await server.cli('SET', redisKey, 'their-owner', 'PX', 10_000)).toBe('OK')
      expect(await p.getLeaseOwner(key)).toBe('their-owner')
      expect(await p.acquireLease(key, 'us', LONG)).toEqual({ acquired: false, owner: 'their-owner' })
      expect(await p.renewLease(key, 'us', LONG)).toBe(false)
      await p.releaseLease(key, 'us')
      expect(await server.cli('GET', redisKey)).toBe('their-owner')
      // The same owner, from another process using this package, can carry on.
      expect(await p.renewLease(key, 'their-owner', 30_000)).toBe(true)
      expect(Number(await server.cli('PTTL', redisKey))).toBeGreaterThan(29_000)
      expect(await p.transferLease(key, 'their-owner', 'us', 30_000)).toBe(true)
      expect(await server.cli('GET', redisKey)).toBe('us')
      await p.releaseLease(key, 'us')
      expect(await server.cli('EXISTS', redisKey)).toBe(0)
    })

    it('sees a lease expire when Redis expires it', async () => {
      const p = provider({ url: server.url })
      const key = uniqueKey('px')
      await server.cli('SET', `mastra:topic:lease:${key}`, 'A', 'PX', 100)
      expect(await p.getLeaseOwner(key)).toBe('A')
      await sleep(250)
      expect(await p.getLeaseOwner(key)).toBeUndefined()
      expect(await p.renewLease(key, 'A', LONG)).toBe(false)
      expect(await server.cli('EXISTS', `mastra:topic:lease:${key}`)).toBe(0)
    })

    it('two providers on one server coordinate: 200 owners racing through 4 providers, one winner', async () => {
      const ps = Array.from({ length: 4 }, () => provider({ url: server.url }))
      const key = uniqueKey('distributed')
      const results = await Promise.all(
        Array.from({ length: 200 }, (_, i) => ps[i % 4]!.acquireLease(key, `owner-${i}`, LONG)),
      )
      const winners = results.filter((r) => r.acquired)
      expect(winners).toHaveLength(1)
      for (const r of results) expect(r.owner).toBe(winners[0]!.owner)
      for (const q of ps) expect(await q.getLeaseOwner(key)).toBe(winners[0]!.owner)
      expect(await server.cli('GET', `mastra:topic:lease:${key}`)).toBe(winners[0]!.owner)
    })

    it('renewLease(key, owner, 0) rejects with a RangeError and the lease is still there', async () => {
      const p = provider({ url: server.url })
      const key = uniqueKey('renew-zero')
      const redisKey = `mastra:topic:lease:${key}`
      await p.acquireLease(key, 'A', 10_000)
      await expectRejection(() => p.renewLease(key, 'A', 0), RangeError, 'ERR_LEASE_INVALID_TTL')
      expect(await server.cli('GET', redisKey)).toBe('A')
      expect(Number(await server.cli('PTTL', redisKey))).toBeGreaterThan(9_000)
      expect(await p.getLeaseOwner(key)).toBe('A')
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

    it('a Redis error (WRONGTYPE) rejects every call with ERR_LEASE_REDIS and leaves the key alone', async () => {
      const p = provider({ url: server.url })
      const key = uniqueKey('wrongtype')
      const redisKey = `mastra:topic:lease:${key}`
      await server.cli('HSET', redisKey, 'field', 'value')
      for (const [name, call] of everyCall(p, key)) {
        const err = await expectRejection(call, Error, 'ERR_LEASE_REDIS').catch((e: unknown) => {
          throw new Error(`${name}: ${String(e)}`)
        })
        expect(err.message).toMatch(/WRONGTYPE/)
      }
      expect(await server.cli('TYPE', redisKey)).toBe('hash')
      expect(await server.cli('HGET', redisKey, 'field')).toBe('value')
    })
  })

  describe('bad input and connections', () => {
    it.skipIf(EXTERNAL_REDIS)('bad input sends no command to Redis', async () => {
      const server = await ownServer()
      const p = provider({ url: server.url })
      const key = uniqueKey('no-io')
      await p.acquireLease(key, 'A', LONG) // connected and scripts loaded
      const before = await server.commandCalls()
      const u = untyped(p)
      const bad: Array<() => unknown> = [
        () => u.acquireLease('', 'A', LONG),
        () => u.acquireLease(key, 'A', 0),
        () => u.acquireLease(key, 'A', '100'),
        () => u.acquireLease(key, '\uD800', LONG),
        () => u.acquireLease('k'.repeat(4097), 'A', LONG),
        () => u.getLeaseOwner(null),
        () => u.getLeaseOwner(key + '\uDC00'),
        () => u.releaseLease(key, ''),
        () => u.releaseLease(key, 'o'.repeat(1025)),
        () => u.renewLease(key, 'A', 0),
        () => u.renewLease(key, 'A', 1.5),
        () => u.renewLease(key, 'A', 100n),
        () => u.transferLease(key, 'A', '', LONG),
        () => u.transferLease(key, 'A', 'B', Number.NaN),
        () => u.transferLease(key, 123, 'B', LONG),
      ]
      for (const call of bad) {
        const r = await settleWithin(Promise.resolve().then(call), 2_000)
        expect(r.status).toBe('rejected')
      }
      const after = await server.commandCalls()
      // INFO (ours, and the eviction-policy check's) and CLIENT SETNAME come from the set-up
      // task a fresh connection runs after its first call succeeded, at a time of its own.
      const setUp = ['info', 'client|setname']
      const changed = Object.keys(after).filter((cmd) => !setUp.includes(cmd) && after[cmd] !== (before[cmd] ?? 0))
      expect(changed, 'commands sent for bad input').toEqual([])
      expect(await server.cli('GET', `mastra:topic:lease:${key}`)).toBe('A')
    })

    it.skipIf(EXTERNAL_REDIS)('the first calls, made all at once, share one connection; close() drops it', async () => {
      const server = await ownServer()
      const clients = async () => Number((await server.info('clients')).connected_clients)
      const baseline = await clients()
      const p = provider({ url: server.url })
      const key = uniqueKey('one-conn')
      const calls = Array.from({ length: 30 }, (_, i) => everyCall(p, `${key}:${i % 3}`)[i % 5]![1]())
      await Promise.all(calls)
      expect(await clients()).toBe(baseline + 1)
      // Steady use does not open more.
      await Promise.all(Array.from({ length: 100 }, (_, i) => p.acquireLease(`${key}:more:${i}`, 'A', LONG)))
      expect(await clients()).toBe(baseline + 1)
      await p.close()
      const deadline = Date.now() + 2_000
      while ((await clients()) !== baseline && Date.now() < deadline) await sleep(20)
      expect(await clients()).toBe(baseline)
    })

    it('rejects invalid constructor options synchronously with ERR_LEASE_INVALID_OPTION', () => {
      const make = (o: unknown) => () => new RedisLeaseProvider(o as RedisOptions)
      expectThrow(make({ commandTimeoutMs: 0 }), RangeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(make({ commandTimeoutMs: -5 }), RangeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(make({ commandTimeoutMs: 1.5 }), RangeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(make({ commandTimeoutMs: Number.NaN }), RangeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(make({ commandTimeoutMs: 'x' }), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(make({ connectTimeoutMs: 0 }), RangeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(make({ connectTimeoutMs: '100' }), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(make({ keyPrefix: 5 }), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(make({ url: 5 }), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expectThrow(make({ url: 'http://x' }), [TypeError, RangeError], 'ERR_LEASE_INVALID_OPTION')
      expectThrow(make({ url: 'not a url' }), [TypeError, RangeError], 'ERR_LEASE_INVALID_OPTION')
    })

    it('accepts every documented url form without connecting in the constructor', async () => {
      for (const url of [
        'redis://127.0.0.1:1',
        'redis://user:pass@127.0.0.1:1/3',
        'redis://:pass@127.0.0.1:1',
        'rediss://127.0.0.1:1',
        'redis+unix:///nonexistent/redis.sock',
        'unix:///nonexistent/redis.sock',
      ]) {
        const p = provider({ url, connectTimeoutMs: 200, commandTimeoutMs: 200 })
        expect(p, url).toBeInstanceOf(RedisLeaseProvider)
      }
    })

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

  describe.skipIf(EXTERNAL_REDIS)('url forms', () => {
    const PASSWORD = 'S3cret-pa55word-Zq9'

    async function authServer() {
      const server = await ownServer({ args: ['--requirepass', PASSWORD], password: PASSWORD })
      // An ACL user with a password that needs URL encoding, and one that may not touch lease keys.
      await server.cli('ACL', 'SETUSER', 'alice', 'on', '>p@ss w:rd/%', '~*', '+@all')
      await server.cli('ACL', 'SETUSER', 'limited', 'on', `>${PASSWORD}`, '~other:*', '+@all')
      return server
    }
    const hostPort = (s: RedisServer) => `127.0.0.1:${s.port}`

    /** A logger keeping everything it is told, to check it for secrets. */
    const recorder = () => {
      const lines: unknown[] = []
      return { lines, warn: (...args: unknown[]) => lines.push(args), debug: (...args: unknown[]) => lines.push(args) }
    }

    /** No secret in the error: not in its message, stack, cause chain or any property. */
    function expectNoSecret(err: unknown, logged: unknown[], secrets: string[]) {
      const seen = [String((err as Error | undefined)?.message), String((err as Error | undefined)?.stack), inspect(err, { depth: 10, showHidden: true })]
      for (let cause = (err as Error | undefined)?.cause; cause !== undefined; cause = (cause as Error).cause) seen.push(inspect(cause, { depth: 10, showHidden: true }))
      seen.push(JSON.stringify(logged))
      for (const secret of secrets) for (const text of seen) expect(text).not.toContain(secret)
    }

    it('a url with :password@ authenticates the default user', async () => {
      const server = await authServer()
      const p = provider({ url: `redis://:${PASSWORD}@${hostPort(server)}` })
      const key = uniqueKey('auth-default')
      expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await server.cli('GET', `mastra:topic:lease:${key}`)).toBe('A')
    })

    it('a url with user:password@ authenticates an ACL user, with URL-encoded characters', async () => {
      const server = await authServer()
      const p = provider({ url: `redis://alice:${encodeURIComponent('p@ss w:rd/%')}@${hostPort(server)}` })
      const key = uniqueKey('auth-acl')
      expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await server.cli('GET', `mastra:topic:lease:${key}`)).toBe('A')
    })

    it('a wrong password rejects with ERR_LEASE_AUTH and the error does not reveal the password', async () => {
      const server = await authServer()
      const wrong = 'Wr0ng-pa55word-Xy7'
      for (const url of [`redis://:${wrong}@${hostPort(server)}`, `redis://alice:${wrong}@${hostPort(server)}`]) {
        const logger = recorder()
        const p = provider({ url, connectTimeoutMs: 1_000, commandTimeoutMs: 1_000, logger })
        const r = await settleWithin(p.acquireLease(uniqueKey('wrong-pass'), 'A', LONG), 3_000)
        expect(r.status, url).toBe('rejected')
        if (r.status === 'rejected') {
          expect(errorCode(r.reason), url).toBe('ERR_LEASE_AUTH')
          expectNoSecret(r.reason, logger.lines, [wrong, PASSWORD])
        }
      }
    })

    it('no password against a server that requires one rejects with ERR_LEASE_AUTH', async () => {
      const server = await authServer()
      const p = provider({ url: `redis://${hostPort(server)}`, connectTimeoutMs: 1_000, commandTimeoutMs: 1_000 })
      const r = await settleWithin(p.getLeaseOwner(uniqueKey('noauth')), 3_000)
      expect(r.status).toBe('rejected')
      if (r.status === 'rejected') expect(errorCode(r.reason)).toBe('ERR_LEASE_AUTH')
    })

    it('an ACL user without access to the lease keys gets ERR_LEASE_AUTH (NOPERM) on every call', async () => {
      const server = await authServer()
      const logger = recorder()
      const p = provider({ url: `redis://limited:${PASSWORD}@${hostPort(server)}`, logger })
      for (const [name, call] of everyCall(p, uniqueKey('noperm'))) {
        const r = await settleWithin(call(), 3_000)
        expect(r.status, name).toBe('rejected')
        if (r.status === 'rejected') {
          expect(errorCode(r.reason), name).toBe('ERR_LEASE_AUTH')
          expectNoSecret(r.reason, logger.lines, [PASSWORD])
        }
      }
    })

    // The recommended ACL (docs/security.md): the lease keys, their metadata keys (every script
    // reads a holder's metadata) and their fencing keys, the seven commands the scripts need,
    // and for waiting (hold with wait) PTTL (getLease reads the holder's TTL) and the lease
    // keys' shard channels with the three commands that publish and listen there.
    const LEASE_COMMANDS = ['evalsha', 'script|load', 'get', 'set', 'pexpire', 'del', 'incr']
    const WAIT_COMMANDS = ['pttl', 'spublish', 'ssubscribe', 'sunsubscribe']
    const leaseUser = (name: string, password: string, commands = [...LEASE_COMMANDS, ...WAIT_COMMANDS], prefix = 'mastra:topic') => [
      'ACL',
      'SETUSER',
      name,
      'reset',
      'on',
      `>${password}`,
      `~${prefix}:lease:*`,
      `~${prefix}:lease-metadata:*`,
      `~${prefix}:fence:*`,
      'resetchannels',
      `&${prefix}:lease:*`,
      '-@all',
      ...commands.map((c) => `+${c}`),
    ]

    /**
     * The five methods through their whole life cycle, with a fenced grant and a holder with
     * metadata (released only with it); rejects at the first failure.
     */
    async function lifeCycle(p: RedisLeaseProvider, key: string) {
      expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await p.acquireLease(key, 'B', LONG)).toEqual({ acquired: false, owner: 'A' })
      expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await p.acquireFencedLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A', token: expect.any(Number) })
      expect(await p.getLeaseOwner(key)).toBe('A')
      expect(await p.renewLease(key, 'A', LONG)).toBe(true)
      expect(await p.renewLease(key, 'B', LONG)).toBe(false)
      expect(await p.transferLease(key, 'A', 'B', LONG, undefined, 'run-b')).toBe(true)
      await p.releaseLease(key, 'A') // not the holder: a no-op
      await p.releaseLease(key, 'B') // B with no metadata is not the holder either
      expect(await p.getLeaseOwner(key)).toBe('B')
      await p.releaseLease(key, 'B', 'run-b')
      expect(await p.getLeaseOwner(key)).toBeUndefined()
    }

    it('an ACL user confined to the lease, metadata and fencing keys and EVALSHA, SCRIPT LOAD, GET, SET, PEXPIRE, DEL, INCR can use all five methods; without any one of them it cannot; with PTTL, SPUBLISH, SSUBSCRIBE, SUNSUBSCRIBE it can wait', async () => {
      const server = await ownServer()
      const secret = 'L3ase-only-pa55-Wv8'
      await server.cli(...leaseUser('lease', secret))
      await server.cli('SCRIPT', 'FLUSH') // so SCRIPT LOAD is needed, as after a restart
      await server.cli('ACL', 'LOG', 'RESET')
      const logger = recorder()
      const url = `redis://lease:${secret}@${hostPort(server)}`
      const p = provider({ url, logger })
      await lifeCycle(p, uniqueKey('acl-least'))
      // With PTTL it reads a lease record too (getLeaseRecord runs the script getLease does).
      const recorded = uniqueKey('acl-record')
      await p.acquireLease(recorded, 'A', LONG, 'run-a')
      expect(await p.getLeaseRecord(recorded)).toStrictEqual({ owner: 'A', metadata: 'run-a' })
      await p.releaseLease(recorded, 'A', 'run-a')
      // Nothing was denied, but the optional INFO of the eviction-policy check and the
      // optional CLIENT SETNAME of the connection name.
      const denied = ((await server.cli('ACL', 'LOG')) as unknown[][]).map((entry) => entry[entry.indexOf('object') + 1])
      expect(denied.filter((object) => object !== 'info' && object !== 'client|setname')).toEqual([])
      expectNoSecret(undefined, logger.lines, [secret])

      // The same user waits for a lease and is woken by its release, long before its TTL.
      const key = uniqueKey('acl-wait')
      const holder = provider({ url })
      await holder.acquireLease(key, 'A', LONG)
      const waiting = holdLease(p, key, 'B', { ttlMs: LONG, wait: true })
      await sleep(200)
      await holder.releaseLease(key, 'A')
      const lease = await settleWithin(waiting, 2_000)
      expect(lease.status).toBe('fulfilled')
      if (lease.status === 'fulfilled') await lease.value.release()

      // Without the four waiting commands (the line before waiting existed) the five methods
      // still work: the release's publish fails quietly inside the script.
      await server.cli(...leaseUser('unwaiting', secret, LEASE_COMMANDS))
      await lifeCycle(provider({ url: `redis://unwaiting:${secret}@${hostPort(server)}` }), uniqueKey('acl-unwaiting'))

      // The metadata keys are needed: every script names one, so without them every
      // scripted call is refused (NOPERM), even for a holder with no metadata.
      const noMetadataKeys = leaseUser('no-metadata-keys', secret).filter((arg) => !arg.includes(':lease-metadata:'))
      await server.cli(...noMetadataKeys)
      const keyless = provider({ url: `redis://no-metadata-keys:${secret}@${hostPort(server)}` })
      const refused = await settleWithin(lifeCycle(keyless, uniqueKey('acl-no-metadata')), 5_000)
      expect(refused.status).toBe('rejected')
      if (refused.status === 'rejected') expect(errorCode(refused.reason)).toBe('ERR_LEASE_AUTH')

      // Each of the seven is needed: a user without it fails somewhere in the life cycle.
      for (const missing of LEASE_COMMANDS) {
        await server.cli(...leaseUser('lacking', secret, LEASE_COMMANDS.filter((c) => c !== missing)))
        await server.cli('SCRIPT', 'FLUSH')
        const lacking = provider({ url: `redis://lacking:${secret}@${hostPort(server)}` })
        const r = await settleWithin(lifeCycle(lacking, uniqueKey('acl-lacking')), 5_000)
        expect(r.status, `without ${missing}`).toBe('rejected')
        if (r.status === 'rejected') {
          // Refused at the top (EVALSHA, SCRIPT LOAD, and SET: a plain acquire is one SET) it
          // is NOPERM; refused inside a script (where the life cycle first meets GET, PEXPIRE,
          // DEL, INCR), a script error.
          const expected = ['evalsha', 'script|load', 'set'].includes(missing) ? 'ERR_LEASE_AUTH' : 'ERR_LEASE_REDIS'
          expect(errorCode(r.reason), `without ${missing}`).toBe(expected)
        }
      }
    })

    // getLeaseRecord has a script of its own, plain GETs: no PTTL needed, as getLease needs.
    it('an ACL user of the seven commands alone reads a lease record (getLeaseRecord)', async () => {
      const server = await ownServer()
      const secret = 'Rec0rd-only-pa55-Tq4'
      await server.cli(...leaseUser('recorder', secret, LEASE_COMMANDS))
      const p = provider({ url: `redis://recorder:${secret}@${hostPort(server)}` })
      const key = uniqueKey('acl-record-only')
      expect(await p.acquireLease(key, 'A', LONG, 'run-a')).toStrictEqual({ acquired: true, owner: 'A' })
      expect(await p.getLeaseRecord(key)).toStrictEqual({ owner: 'A', metadata: 'run-a' })
    })

    it('the confined user reaching outside its prefix gets ERR_LEASE_AUTH (NOPERM) on every call, and the keys stay untouched', async () => {
      const server = await ownServer()
      const secret = 'Tenant-a-pa55-Rr2'
      await server.cli(...leaseUser('tenant-a', secret, LEASE_COMMANDS, 'tenant-a'))
      const own = provider({ url: `redis://tenant-a:${secret}@${hostPort(server)}`, keyPrefix: 'tenant-a' })
      const key = uniqueKey('tenant')
      expect(await own.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
      await server.cli('SET', `tenant-b:lease:${key}`, 'B', 'PX', LONG)
      const logger = recorder()
      const p = provider({ url: `redis://tenant-a:${secret}@${hostPort(server)}`, keyPrefix: 'tenant-b', logger })
      const connections = async () => Number((await server.info('stats')).total_connections_received)
      const opened = await connections()
      for (const [name, call] of everyCall(p, key)) {
        const r = await settleWithin(call(), 3_000)
        expect(r.status, name).toBe('rejected')
        if (r.status === 'rejected') {
          expect(errorCode(r.reason), name).toBe('ERR_LEASE_AUTH')
          expect(String((r.reason as Error).message), name).toMatch(/NoPerm/i)
          expectNoSecret(r.reason, logger.lines, [secret])
        }
      }
      expect(await server.cli('GET', `tenant-b:lease:${key}`)).toBe('B')
      expect(await server.cli('GET', `tenant-a:lease:${key}`)).toBe('A')
      // The connection answered: it is kept, not reopened for every refused call.
      expect((await connections()) - opened).toBe(1)
    })

    it('a connection error (nothing listening, a host that does not resolve) or a url that does not parse does not reveal the password either', async () => {
      const port = await freePort()
      // Nothing listening, and a host that does not resolve.
      for (const host of [`127.0.0.1:${port}`, 'no-such-host.invalid:6379']) {
        const logger = recorder()
        const p = provider({ url: `redis://bob:${PASSWORD}@${host}`, connectTimeoutMs: 300, commandTimeoutMs: 300, logger })
        const r = await settleWithin(p.getLeaseOwner(uniqueKey('leak')), 2_500)
        expect(r.status, host).toBe('rejected')
        if (r.status === 'rejected') {
          expect(errorCode(r.reason), host).toBe('ERR_LEASE_CONNECTION')
          expectNoSecret(r.reason, logger.lines, [PASSWORD])
        }
      }
      // A url that does not parse is refused in the constructor, without echoing it.
      for (const url of [`redis://bob:${PASSWORD}@127.0.0.1:notaport`, `redis://bob:${PASSWORD}@[::1`, `http://bob:${PASSWORD}@h`]) {
        let thrown: unknown
        try {
          new RedisLeaseProvider({ url })
        } catch (err) {
          thrown = err
        }
        expect(errorCode(thrown), url).toBe('ERR_LEASE_INVALID_OPTION')
        expectNoSecret(thrown, [], [PASSWORD])
      }
    })

    it('a /db path selects that database', async () => {
      const server = await ownServer()
      const p = provider({ url: `${server.url}/5` })
      const key = uniqueKey('db5')
      await p.acquireLease(key, 'A', LONG)
      const db5 = await connectClient({ host: '127.0.0.1', port: server.port, db: 5 })
      extraClients.push(db5)
      expect(await db5.get(`mastra:topic:lease:${key}`)).toBe('A')
      expect(await server.cli('EXISTS', `mastra:topic:lease:${key}`)).toBe(0)
      // A provider on db 0 does not see it.
      const p0 = provider({ url: server.url })
      expect(await p0.getLeaseOwner(key)).toBeUndefined()
    })

    it('unix socket urls (redis+unix:// and unix://) work', async () => {
      const server = await ownServer({ unixSocket: true })
      const socketPath = server.socketPath!
      for (const url of [`redis+unix://${socketPath}`, `unix://${socketPath}`]) {
        const p = provider({ url })
        const key = uniqueKey('unix')
        expect(await p.acquireLease(key, 'A', LONG), url).toStrictEqual({ acquired: true, owner: 'A' })
        expect(await server.cli('GET', `mastra:topic:lease:${key}`)).toBe('A')
        expect(await p.getLeaseOwner(key)).toBe('A')
      }
    })
  })
})
