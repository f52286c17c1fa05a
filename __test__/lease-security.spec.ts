// A Redis whose eviction policy could evict lease keys is reported. Once
// per established connection the provider reads `INFO memory`; any policy but `noeviction`
// with `maxmemory` set gets one warning per provider and policy, through `logger` or, without
// one, `process.emitWarning`. The check never delays or fails a lease call.
//
// Who gets in and what is revealed: credentials in the url (the default user, an ACL user,
// URL-encoded), wrong or missing ones refused with ERR_LEASE_AUTH, the least-privileged ACL
// user of docs/security.md, and no password in any error or log line. The other url forms
// (a /db path, unix sockets) are here too.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { execFile } from 'node:child_process'
import { readFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { inspect } from 'node:util'

import { afterEach, describe, expect, it } from 'vitest'

import { RedisLeaseProvider } from '../index.js'
import { holdLease, RedisStreamsPubSub } from '../dist/esm/index.js'
import { CollectingLogger, errorCode, everyCall, expectThrow, leaseFailureWarnings, settleWithin, sleep, uniqueKey, unprintedWarnings, type LeaseApi } from './helpers/lease.js'
import { NODE } from './helpers/mastra-node.js'
import { perTest } from './helpers/per-test.js'
import { connectClient, EXTERNAL_REDIS, freePort, type RedisServer, type RedisTestClient } from './helpers/redis-server.js'

const LONG = 60_000
const CODE = 'MASTRA_LEASE_EVICTION_POLICY'
const MAXMEMORY = 64 * 1024 * 1024

const { provider, ownServer, providers } = perTest()
// Calls refused by ACLs or for a password fail, and warn through process.emitWarning (no logger here).
const leaseWarnings = leaseFailureWarnings()
const extraClients: RedisTestClient[] = []
afterEach(() => {
  for (const c of extraClients.splice(0)) c.destroy()
})

/** A server with `maxmemory` set and the given eviction policy. */
const serverWith = (policy: string, maxmemory = MAXMEMORY) =>
  ownServer({ args: ['--maxmemory', String(maxmemory), '--maxmemory-policy', policy] })


/**
 * The ACL lines of docs/security.md's least-privileged user, as arguments: the user's own, then
 * the one that lets it wake waiters.
 */
function documentedAclLines(): [string[], string[]] {
  const page = readFileSync(path.join(__dirname, '..', 'docs', 'security.md'), 'utf8')
  const section = page.slice(page.indexOf('**The least-privileged user.**'))
  const lines = [...section.matchAll(/^ {2}(ACL SETUSER mastra-lease .*)$/gm)].map((m) => m[1]!.split(' '))
  if (lines.length < 2) throw new Error('docs/security.md no longer shows the two ACL lines of its least-privileged user')
  return [lines[0]!, lines[1]!]
}

const INSPECTOR = path.join(__dirname, '..', 'bin', 'mastra-lease.mjs')

/** Runs the `mastra-lease` command; its exit code, stdout and stderr. */
function inspector(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(NODE, [INSPECTOR, ...args], { timeout: 20_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? Number((error as { code?: unknown }).code ?? 1) : 0, stdout, stderr })
    })
  })
}

/** Every method once on `key`, as the owner `A` (each resolves whatever the lease state). */
async function everyMethod(p: LeaseApi, key: string): Promise<void> {
  await p.acquireLease(key, 'A', LONG)
  await p.getLeaseOwner(key)
  await p.renewLease(key, 'A', LONG)
  await p.transferLease(key, 'A', 'B', LONG)
  await p.releaseLease(key, 'B')
}

/**
 * Counts the INFO commands others sent to `server` since this was called: the helper's own
 * `INFO commandstats` reads count too, so they are subtracted.
 */
async function infoCounter(server: RedisServer): Promise<() => Promise<number>> {
  let mine = 0
  const read = async () => {
    const calls = (await server.commandCalls()).info ?? 0
    mine++
    return calls
  }
  const base = await read()
  return async () => {
    const before = mine
    return (await read()) - base - before
  }
}

/** Polls `ready` every 25 ms until it holds; fails after `ms`. */
async function until(what: string, ready: () => boolean | Promise<boolean>, ms = 5_000): Promise<void> {
  const deadline = Date.now() + ms
  while (!(await ready())) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`)
    await sleep(25)
  }
}

/** Calls until one succeeds (the first after a killed connection may fail). */
async function reconnected(p: LeaseApi, key: string): Promise<void> {
  const deadline = Date.now() + 5_000
  for (;;) {
    const r = await settleWithin(p.getLeaseOwner(key), 3_000)
    if (r.status === 'fulfilled') return
    if (Date.now() > deadline) throw new Error(`no call succeeded after the kill: ${String(errorCode(r.reason))}`)
    await sleep(50)
  }
}

describe.skipIf(EXTERNAL_REDIS)('eviction policy warning', () => {
  it('allkeys-lru with maxmemory: one warning naming the policy, however many calls follow', async () => {
    const server = await serverWith('allkeys-lru')
    const infos = await infoCounter(server)
    const logger = new CollectingLogger()
    const p = provider({ url: server.url, logger })
    const key = uniqueKey('evict-allkeys')
    await everyMethod(p, key)
    await until('the warning', () => logger.warnings.length > 0)
    for (let round = 0; round < 10; round++) {
      await Promise.all(Array.from({ length: 10 }, (_, i) => everyMethod(p, `${key}:${i}`)))
    }
    await sleep(200)
    expect(logger.warnings).toHaveLength(1)
    const [warning] = logger.warnings
    expect(warning!.message).toContain('allkeys-lru')
    expect(warning!.message).toContain('noeviction')
    expect(warning!.fields).toEqual({ code: CODE, maxmemory: MAXMEMORY, maxmemoryPolicy: 'allkeys-lru' })
    // One INFO per connection (the calls share two, by key), not one per call (510 calls
    // were made).
    expect(await infos()).toBeGreaterThanOrEqual(1)
    expect(await infos()).toBeLessThanOrEqual(2)
  })

  it('volatile-lru warns too, and says why: every lease has a TTL', async () => {
    const server = await serverWith('volatile-lru')
    const logger = new CollectingLogger()
    const p = provider({ url: server.url, logger })
    await everyMethod(p, uniqueKey('evict-volatile'))
    await until('the warning', () => logger.warnings.length > 0)
    expect(logger.warnings[0]!.message).toContain('volatile-lru')
    expect(logger.warnings[0]!.message).toContain('every lease has one')
    expect(logger.warnings[0]!.fields?.maxmemoryPolicy).toBe('volatile-lru')
  })

  it('noeviction with maxmemory set: the policy is read once per connection and nothing is reported', async () => {
    const server = await serverWith('noeviction')
    const infos = await infoCounter(server)
    const logger = new CollectingLogger()
    const p = provider({ url: server.url, logger })
    await everyMethod(p, uniqueKey('evict-none'))
    await until('the INFO read', async () => (await infos()) >= 1)
    await everyMethod(p, uniqueKey('evict-none'))
    await sleep(200)
    expect(logger.lines).toEqual([])
    // One INFO per connection: the calls share two, by key.
    expect(await infos()).toBeGreaterThanOrEqual(1)
    expect(await infos()).toBeLessThanOrEqual(2)
  })

  it('maxmemory 0 (no limit) with allkeys-lru: the policy is read once per connection and nothing is reported', async () => {
    const server = await serverWith('allkeys-lru', 0)
    const infos = await infoCounter(server)
    const logger = new CollectingLogger()
    const p = provider({ url: server.url, logger })
    await everyMethod(p, uniqueKey('evict-unlimited'))
    await until('the INFO read', async () => (await infos()) >= 1)
    await sleep(200)
    expect(logger.lines).toEqual([])
    // One INFO per connection: the calls share two, by key.
    expect(await infos()).toBeGreaterThanOrEqual(1)
    expect(await infos()).toBeLessThanOrEqual(2)
  })

  it('a user denied INFO gets no warning, one debug note, and every call works', async () => {
    const server = await serverWith('allkeys-lru')
    const password = 'N0-info-pa55-Kq3'
    await server.cli('ACL', 'SETUSER', 'noinfo', 'on', `>${password}`, '~*', '+@all', '-info')
    const logger = new CollectingLogger()
    const p = provider({ url: `redis://noinfo:${password}@127.0.0.1:${server.port}`, logger })
    const key = uniqueKey('evict-noinfo')
    expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
    await until('the refused INFO', () => logger.lines.length > 0)
    expect(await p.renewLease(key, 'A', LONG)).toBe(true)
    expect(await p.transferLease(key, 'A', 'B', LONG)).toBe(true)
    expect(await p.getLeaseOwner(key)).toBe('B')
    await p.releaseLease(key, 'B')
    expect(await p.getLeaseOwner(key)).toBeUndefined()
    await sleep(200)
    expect(logger.warnings).toEqual([])
    expect(logger.lines).toHaveLength(1)
    expect(logger.lines[0]!.level).toBe('debug')
    expect(String(logger.lines[0]!.fields?.error)).toMatch(/info/i)
    expect(JSON.stringify(logger.lines)).not.toContain(password)
    // Redis saw the INFO and refused it: the check was tried, not skipped.
    const denied = JSON.stringify(await server.cli('ACL', 'LOG'))
    expect(denied).toContain('info')
  })

  it('after CONFIG SET and a killed connection, the new connection is checked: a new policy warns, a known one does not', async () => {
    const server = await serverWith('allkeys-lru')
    const infos = await infoCounter(server)
    const logger = new CollectingLogger()
    const p = provider({ url: server.url, logger })
    const key = uniqueKey('evict-reconnect')
    await everyMethod(p, key)
    await until('the first warning', () => logger.warnings.length === 1)

    await server.cli('CONFIG', 'SET', 'maxmemory-policy', 'volatile-lfu')
    await everyMethod(p, key) // the same connection: not read again
    await sleep(100)
    expect(await infos()).toBe(1)
    expect(logger.warnings).toHaveLength(1)
    await server.cli('CLIENT', 'KILL', 'TYPE', 'normal') // every client but the helper's own
    await reconnected(p, key)
    await until('the second warning', () => logger.warnings.length === 2)
    expect(logger.warnings[1]!.fields?.maxmemoryPolicy).toBe('volatile-lfu')

    // Back to a policy already reported: read again on the next connection, not repeated.
    await server.cli('CONFIG', 'SET', 'maxmemory-policy', 'allkeys-lru')
    await server.cli('CLIENT', 'KILL', 'TYPE', 'normal')
    await reconnected(p, key)
    await until('the third INFO read', async () => (await infos()) >= 3)
    await sleep(200)
    expect(logger.warnings.map((w) => w.fields?.maxmemoryPolicy)).toEqual(['allkeys-lru', 'volatile-lfu'])
    expect(await infos()).toBe(3)
  })

  it('without a logger the warning is one process warning with code MASTRA_LEASE_EVICTION_POLICY', async () => {
    const server = await serverWith('allkeys-lfu')
    const seen: Error[] = []
    const listen = (w: Error) => {
      if ((w as Error & { code?: unknown }).code === CODE) seen.push(w)
    }
    await unprintedWarnings(async () => {
      process.on('warning', listen)
      try {
        const p = provider({ url: server.url })
        const key = uniqueKey('evict-process')
        await everyMethod(p, key)
        await until('the process warning', () => seen.length > 0)
        await Promise.all(Array.from({ length: 20 }, (_, i) => everyMethod(p, `${key}:${i}`)))
        await sleep(200)
      } finally {
        process.off('warning', listen)
      }
    })
    expect(seen).toHaveLength(1)
    expect(seen[0]!.name).toBe('Warning')
    expect(seen[0]!.message).toContain('allkeys-lfu')
  })

  it('RedisStreamsPubSub warns through its logger, once, for its events and leases alike', async () => {
    const server = await serverWith('volatile-ttl')
    const logger = new CollectingLogger()
    const pubsub = new RedisStreamsPubSub({ url: server.url, logger })
    providers.push(pubsub)
    const key = uniqueKey('evict-streams')
    await pubsub.publish(uniqueKey('topic'), { type: 'test', runId: 'r', data: {} })
    await everyMethod(pubsub, key)
    await until('the warning', () => logger.warnings.length > 0)
    await everyMethod(pubsub, key)
    await sleep(200)
    expect(logger.warnings).toHaveLength(1)
    expect(logger.warnings[0]!.fields).toEqual({ code: CODE, maxmemory: MAXMEMORY, maxmemoryPolicy: 'volatile-ttl' })
  })

  it('a logger that throws changes nothing for the calls', async () => {
    const server = await serverWith('allkeys-random')
    let thrown = 0
    const logger = {
      warn() {
        thrown++
        throw new Error('logger failure')
      },
      debug() {},
    }
    const p = provider({ url: server.url, logger })
    const key = uniqueKey('evict-throwing')
    await everyMethod(p, key)
    await until('the warning', () => thrown > 0)
    expect(await p.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
    expect(await p.getLeaseOwner(key)).toBe('A')
  })
})

describe('the logger option', () => {
  it('anything without a warn(message, fields) method, or with a debug that is not one, is rejected with ERR_LEASE_INVALID_OPTION', () => {
    const bad: unknown[] = [null, 'console', 42, true, {}, { debug() {} }, { warn: 1, debug() {} }, { warn() {}, debug: 'x' }, []]
    for (const logger of bad) {
      expectThrow(() => new RedisLeaseProvider({ logger } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expect(() => new RedisLeaseProvider({ logger } as never)).toThrow(/logger/)
    }
    // Mastra's logger shape: methods on the prototype, or a plain object, or console.
    // A logger needs only what it is called with: warn alone will do.
    for (const logger of [new CollectingLogger(), { warn() {}, debug() {} }, { warn() {} }, console]) {
      const p = provider({ logger })
      expect(p).toBeInstanceOf(RedisLeaseProvider)
    }
  })
})

/** No secret in the error: not in its message, stack, cause chain or any property. */
function expectNoSecret(err: unknown, logged: unknown[], secrets: string[]) {
  const seen = [String((err as Error | undefined)?.message), String((err as Error | undefined)?.stack), inspect(err, { depth: 10, showHidden: true })]
  for (let cause = (err as Error | undefined)?.cause; cause !== undefined; cause = (cause as Error).cause) seen.push(inspect(cause, { depth: 10, showHidden: true }))
  seen.push(JSON.stringify(logged))
  for (const secret of secrets) for (const text of seen) expect(text).not.toContain(secret)
}

describe('RedisLeaseProvider', () => {
  it.skipIf(EXTERNAL_REDIS)('a timeout names where Redis was sought too (a frozen server), and neither the user nor the password', async () => {
    const password = 'Pw-never-printed-82'
    const server = await ownServer({ args: ['--requirepass', password], password })
    const logged: unknown[] = []
    const logger = { warn: (...args: unknown[]) => logged.push(args) }
    const p = provider({ url: `redis://default:${password}@127.0.0.1:${server.port}`, connectTimeoutMs: 500, commandTimeoutMs: 300, logger })
    await p.getLeaseOwner(uniqueKey('where-timeout')) // connected first: what follows is a command's timeout
    server.freeze()
    try {
      const r = await settleWithin(p.acquireLease(uniqueKey('where-timeout'), 'A', 60_000), 2_000)
      expect(r.status).toBe('rejected')
      if (r.status === 'rejected') {
        expect(errorCode(r.reason)).toBe('ERR_LEASE_TIMEOUT')
        expect((r.reason as Error).message).toContain(`Redis at 127.0.0.1:${server.port} did not answer within 300 ms`)
        expectNoSecret(r.reason, logged, [password])
      }
    } finally {
      server.thaw()
    }
  })

  it("a connection error names where Redis was sought (host and port, the unix socket, a cluster's seed nodes, the sentinels and the master's name), and neither the user nor the password", async () => {
    const [port, other] = [await freePort(), await freePort()]
    const [user, password] = ['carol-the-operator', 'Pw-never-printed-81']
    const socket = path.join(os.tmpdir(), `mastra-lease-nothing-${port}.sock`)
    const cases: Array<[ConstructorParameters<typeof RedisLeaseProvider>[0], string]> = [
      [{ url: `redis://${user}:${password}@127.0.0.1:${port}/3` }, `cannot reach Redis at 127.0.0.1:${port}: `],
      [{ url: `redis+unix://${socket}?user=${user}&pass=${password}` }, `cannot reach Redis at the unix socket ${socket}: `],
      [
        { cluster: { nodes: [`redis://127.0.0.1:${port}`, `redis://127.0.0.1:${other}`], username: user, password } },
        `cannot reach Redis at the cluster of seed nodes 127.0.0.1:${port}, 127.0.0.1:${other}: `,
      ],
      [
        { sentinel: { nodes: [`redis://${user}:${password}@127.0.0.1:${port}`], masterName: 'leases', username: user, password } },
        `cannot reach Redis at the master "leases" of sentinel 127.0.0.1:${port}: `,
      ],
    ]
    for (const [options, named] of cases) {
      const logged: unknown[] = []
      const logger = { warn: (...args: unknown[]) => logged.push(args) }
      const p = provider({ ...options, connectTimeoutMs: 500, commandTimeoutMs: 1_500, logger })
      const r = await settleWithin(p.getLeaseOwner(uniqueKey('where')), 3_000)
      expect(r.status, named).toBe('rejected')
      if (r.status === 'rejected') {
        expect((r.reason as Error).constructor, named).toBe(Error)
        expect(errorCode(r.reason), named).toBe('ERR_LEASE_CONNECTION')
        expect((r.reason as Error).message).toContain(named)
        expectNoSecret(r.reason, logged, [user, password])
      }
    }
  })

  describe('url forms, read in the constructor', () => {
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

    // The recommended ACL, read from docs/security.md: the lease keys and their companion keys
    // (`fence:`: every script reads a holder's token and metadata there, and the slot's token
    // counter), and the commands the
    // scripts and plain calls need; then, for waking waiters, the lease keys' shard channels
    // with the three commands that publish and listen there. Each line as documented, the
    // user's name and password put in.
    const [BASE_LINE, WAKE_LINE] = documentedAclLines()
    const commandsOf = (line: string[]) => line.filter((arg) => arg.startsWith('+')).map((arg) => arg.slice(1))
    const LEASE_COMMANDS = commandsOf(BASE_LINE)
    const WAIT_COMMANDS = commandsOf(WAKE_LINE)
    const leaseUser = (name: string, password: string, commands = [...LEASE_COMMANDS, ...WAIT_COMMANDS], prefix = 'mastra:topic') => [
      'ACL',
      'SETUSER',
      name,
      'reset',
      'on',
      `>${password}`,
      `~${prefix}:lease:*`,
      `~${prefix}:fence:*`,
      'resetchannels',
      `&${prefix}:lease:*`,
      '-@all',
      ...commands.map((c) => `+${c}`),
    ]
    /** A documented line for user `name` with `password`. */
    const asUser = (line: string[], name: string, password: string) =>
      line.map((arg, i) => (i === 2 ? name : arg === '>PASSWORD' ? `>${password}` : arg))

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

    it("the least-privileged ACL user of docs/security.md, made with the page's very lines, uses every documented feature: the five methods, a fenced grant, getLease, getLeaseRecord, hold (waiting until the holder's TTL, or woken with the second line) and `mastra-lease get`; without any one of its commands but EXISTS it cannot", async () => {
      const server = await ownServer()
      const secret = 'L3ase-only-pa55-Wv8'
      const url = `redis://mastra-lease:${secret}@${hostPort(server)}`
      await server.cli(...asUser(BASE_LINE, 'mastra-lease', secret))
      await server.cli('SCRIPT', 'FLUSH') // so SCRIPT LOAD is needed, as after a restart
      await server.cli('ACL', 'LOG', 'RESET')
      const logger = recorder()
      const p = provider({ url, logger })
      await lifeCycle(p, uniqueKey('acl-least'))
      const recorded = uniqueKey('acl-record')
      await p.acquireLease(recorded, 'A', LONG, 'run-a')
      expect(await p.getLeaseRecord(recorded)).toStrictEqual({ owner: 'A', metadata: 'run-a' })
      expect(await p.getLease(recorded)).toEqual({ owner: 'A', token: undefined, ttlMs: expect.any(Number) })
      const got = await inspector('get', recorded, '--url', url)
      expect(got, got.stderr).toMatchObject({ code: 0, stdout: expect.stringContaining('\tA\t') })
      await p.releaseLease(recorded, 'A', 'run-a')
      const held = await holdLease(p, uniqueKey('acl-hold'), 'A', { ttlMs: LONG })
      await held.release()

      // A waiter takes the lease once its holder's TTL runs out: no wake-up reaches it.
      const key = uniqueKey('acl-wait-ttl')
      const holder = provider({ url })
      await holder.acquireLease(key, 'A', 800)
      const startedAt = performance.now()
      const waited = await settleWithin(holdLease(p, key, 'B', { ttlMs: LONG, wait: true }), 5_000)
      expect(waited.status).toBe('fulfilled')
      if (waited.status === 'fulfilled') await waited.value.release()
      expect(performance.now() - startedAt).toBeGreaterThan(600)
      // Denied: only the optional INFO of the eviction-policy check, the optional CLIENT
      // SETNAME of the connection name, the waking that the second line grants, and, on a
      // server that has it (Redis 7.2 and later, Valkey), the CLIENT SETINFO redis-rs sends
      // as it connects, its answer ignored.
      const optional = ['info', 'client|setname', 'client|setinfo', 'spublish', 'publish', 'ssubscribe', 'subscribe']
      const denied = ((await server.cli('ACL', 'LOG')) as unknown[][]).map((entry) => String(entry[entry.indexOf('object') + 1]))
      expect(denied.filter((object) => !optional.includes(object) && !object.startsWith('mastra:topic:lease:'))).toEqual([])
      expectNoSecret(undefined, logger.lines, [secret])

      // With the second line, the same user is woken by the release, long before the TTL.
      await server.cli(...asUser(WAKE_LINE, 'mastra-lease', secret))
      const woken = uniqueKey('acl-wait-woken')
      const woke = provider({ url })
      await holder.acquireLease(woken, 'A', LONG)
      const waiting = holdLease(woke, woken, 'B', { ttlMs: LONG, wait: true })
      await sleep(200)
      await holder.releaseLease(woken, 'A')
      const lease = await settleWithin(waiting, 2_000)
      expect(lease.status).toBe('fulfilled')
      if (lease.status === 'fulfilled') await lease.value.release()

      // The companion keys are needed: every script names one, so without them every
      // scripted call is refused (NOPERM), even for a holder with no metadata or token.
      const noCompanionKeys = leaseUser('no-companion-keys', secret).filter((arg) => !arg.includes(':fence:'))
      await server.cli(...noCompanionKeys)
      const keyless = provider({ url: `redis://no-companion-keys:${secret}@${hostPort(server)}` })
      const refused = await settleWithin(lifeCycle(keyless, uniqueKey('acl-no-companion')), 5_000)
      expect(refused.status).toBe('rejected')
      if (refused.status === 'rejected') expect(errorCode(refused.reason)).toBe('ERR_LEASE_AUTH')
      await leaseWarnings.warned('ERR_LEASE_AUTH')

      // Each command is needed but EXISTS: a user without it fails somewhere in the life
      // cycle or in getLease. Without EXISTS, acquires go as the acquire script.
      expect(LEASE_COMMANDS).toContain('exists')
      for (const missing of LEASE_COMMANDS) {
        await server.cli(...leaseUser('lacking', secret, LEASE_COMMANDS.filter((c) => c !== missing)))
        await server.cli('SCRIPT', 'FLUSH')
        const lacking = provider({ url: `redis://lacking:${secret}@${hostPort(server)}` })
        const key = uniqueKey('acl-lacking')
        const readBack = async () => {
          await lifeCycle(lacking, key)
          await lacking.acquireLease(key, 'A', LONG)
          return lacking.getLease(key)
        }
        const r = await settleWithin(readBack(), 5_000)
        if (missing === 'exists') {
          expect(r.status, 'without exists').toBe('fulfilled')
          continue
        }
        expect(r.status, `without ${missing}`).toBe('rejected')
        if (r.status === 'rejected') {
          // Refused at the top (EVALSHA, SCRIPT LOAD, and SET: a plain acquire is one SET) it
          // is NOPERM; refused inside a script (where the life cycle first meets GET, PEXPIRE,
          // DEL, INCR, and getLease PTTL), a script error.
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
