// A Redis whose eviction policy could evict lease keys is reported. Once
// per established connection the provider reads `INFO memory`; any policy but `noeviction`
// with `maxmemory` set gets one warning per provider and policy, through `logger` or, without
// one, `process.emitWarning`. The check never delays or fails a lease call.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { afterEach, describe, expect, it } from 'vitest'

import { RedisLeaseProvider } from '../index.js'
import { RedisStreamsPubSub } from '../dist/esm/index.js'
import { CollectingLogger, errorCode, expectThrow, settleWithin, sleep, uniqueKey, type LeaseApi } from './helpers/lease.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer, type RedisServerOptions } from './helpers/redis-server.js'

const LONG = 60_000
const CODE = 'MASTRA_LEASE_EVICTION_POLICY'
const MAXMEMORY = 64 * 1024 * 1024

const providers: LeaseApi[] = []
const servers: RedisServer[] = []

afterEach(async () => {
  await Promise.allSettled(providers.splice(0).map((p) => p.close()))
  await Promise.allSettled(servers.splice(0).map((s) => s.stop()))
})

async function ownServer(opts?: RedisServerOptions): Promise<RedisServer> {
  const s = await startRedis(opts)
  servers.push(s)
  return s
}

/** A server with `maxmemory` set and the given eviction policy. */
const serverWith = (policy: string, maxmemory = MAXMEMORY) =>
  ownServer({ args: ['--maxmemory', String(maxmemory), '--maxmemory-policy', policy] })


function provider(options: ConstructorParameters<typeof RedisLeaseProvider>[0]): RedisLeaseProvider {
  const p = new RedisLeaseProvider(options)
  providers.push(p)
  return p
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
    // One INFO for the one connection, not one per call (510 calls were made).
    expect(await infos()).toBe(1)
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

  it('noeviction with maxmemory set: the policy is read once and nothing is reported', async () => {
    const server = await serverWith('noeviction')
    const infos = await infoCounter(server)
    const logger = new CollectingLogger()
    const p = provider({ url: server.url, logger })
    await everyMethod(p, uniqueKey('evict-none'))
    await until('the INFO read', async () => (await infos()) >= 1)
    await everyMethod(p, uniqueKey('evict-none'))
    await sleep(200)
    expect(logger.lines).toEqual([])
    expect(await infos()).toBe(1)
  })

  it('maxmemory 0 (no limit) with allkeys-lru: the policy is read once and nothing is reported', async () => {
    const server = await serverWith('allkeys-lru', 0)
    const infos = await infoCounter(server)
    const logger = new CollectingLogger()
    const p = provider({ url: server.url, logger })
    await everyMethod(p, uniqueKey('evict-unlimited'))
    await until('the INFO read', async () => (await infos()) >= 1)
    await sleep(200)
    expect(logger.lines).toEqual([])
    expect(await infos()).toBe(1)
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
