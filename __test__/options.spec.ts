// Options are checked strictly by every class: an option it does not know, or two that
// conflict, throw ERR_LEASE_INVALID_OPTION naming it. A typo must not quietly connect to
// whatever Redis runs on localhost. A configuration written for Mastra's own Redis Streams
// backend (`redisOptions`, `inFlightTimeoutMs`) works unchanged where its fields mean
// something here, and is refused by name where they do not. The streams methods check their
// arguments as the lease methods do.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { execFileSync } from 'node:child_process'
import net from 'node:net'

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub } from '../dist/esm/index.js'
import { RedisLeaseProvider as NativeRedisLeaseProvider } from '../index.js'
import { errorCode, expectRejection, expectThrow, uniqueKey, unprintedWarnings } from './helpers/lease.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { Inbox, recordingLogger } from './helpers/streams.js'

let redis: RedisServer
const closers: Array<{ close(): Promise<void> }> = []

beforeAll(async () => {
  redis = await startRedis()
})
afterEach(async () => {
  await Promise.allSettled(closers.splice(0).map((c) => c.close()))
})
afterAll(async () => {
  await redis?.stop()
})

type AnyOptions = Record<string, unknown>
const classes = {
  MemoryLeaseProvider: (o: AnyOptions) => new MemoryLeaseProvider(o as never),
  RedisLeaseProvider: (o: AnyOptions) => new RedisLeaseProvider(o as never),
  RedisStreamsPubSub: (o: AnyOptions) => new RedisStreamsPubSub(o as never),
} as const

function kept<T extends { close(): Promise<void> }>(value: T): T {
  closers.push(value)
  return value
}

describe('unknown options', () => {
  it.each(Object.entries(classes))('%s refuses an option it does not know, naming it and the one meant', (name, make) => {
    for (const [options, named, meant] of [
      [{ maxKeyByte: 10 }, 'maxKeyByte', 'maxKeyBytes'],
      [{ urll: redis.url }, 'urll', name === 'MemoryLeaseProvider' ? undefined : 'url'],
      [{ maxTtlMs: 1_000, banana: true }, 'banana', undefined],
    ] as Array<[AnyOptions, string, string | undefined]>) {
      const err = expectThrow(() => make(options), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expect(err.message).toContain(`${name}: unknown option ${named}`)
      if (meant) expect(err.message).toContain(`did you mean ${meant}?`)
    }
  })

  it('RedisStreamsPubSub refuses a misspelt inFlightTimeoutMs instead of connecting to the default Redis', () => {
    const err = expectThrow(() => new RedisStreamsPubSub({ url: redis.url, inFlightTimeoutMz: 5 } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expect(err.message).toMatch(/unknown option inFlightTimeoutMz; did you mean inFlightTimeoutMs\?/)
  })

  it("a client that is not node-redis' (Mastra's backend takes one of those) is refused with what it must be", () => {
    for (const make of [classes.RedisLeaseProvider, classes.RedisStreamsPubSub]) {
      const err = expectThrow(() => make({ client: {} }), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expect(err.message).toMatch(/client: it must be a node-redis client or cluster/)
    }
  })

  it('the raw binding (mastra-lease/native) refuses client, naming the classes that read one', () => {
    const err = expectThrow(() => new NativeRedisLeaseProvider({ client: {} } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expect(err.message).toMatch(/unknown option client; the classes of mastra-lease read a node-redis client's configuration.*url \(or redisOptions\)/)
  })

  it('an option that belongs to RedisStreamsPubSub given to RedisLeaseProvider says so', () => {
    const err = expectThrow(() => new RedisLeaseProvider({ inFlightTimeoutMs: 10 } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expect(err.message).toContain('it is an option of RedisStreamsPubSub')
  })
})

describe("redisOptions, as Mastra's Redis Streams backend takes them", () => {
  it.skipIf(EXTERNAL_REDIS)('url, username, password, database and name connect as they would through node-redis', async () => {
    const server = await startRedis({ args: ['--requirepass', 'top-secret'], password: 'top-secret' })
    try {
      await server.cli('ACL', 'SETUSER', 'app', 'on', '>app-secret', '~*', '&*', '+@all')
      const name = `named-${uniqueKey('conn').slice(-12).replace(/\W/g, '')}`
      const redisOptions = { url: server.url, username: 'app', password: 'app-secret', database: 3, name }
      const leases = kept(new RedisLeaseProvider({ redisOptions }))
      const key = uniqueKey('redis-options')
      expect(await leases.acquireLease(key, 'A', 10_000)).toStrictEqual({ acquired: true, owner: 'A' })
      await server.cli('SELECT', 3) // the helper's own connection now looks at database 3
      expect(await server.cli('GET', `mastra:topic:lease:${key}`)).toBe('A')
      const pubsub = kept(new RedisStreamsPubSub({ redisOptions, keyPrefix: 'opts' }))
      await pubsub.publish('t', { type: 'x', runId: 'r', data: {} })
      expect(await server.cli('XLEN', 'opts:t')).toBe(1)
      const deadline = Date.now() + 2_000
      let list = ''
      while (Date.now() < deadline && !list.includes(`name=${name} `)) {
        list = String(await server.cli('CLIENT', 'LIST'))
        await new Promise((r) => setTimeout(r, 20))
      }
      expect(list).toContain(`name=${name} `)
      expect(list).toContain('user=app ')
    } finally {
      await server.stop()
    }
  })

  it('fields that mean nothing here, and a client of its own, are refused by name', () => {
    for (const [redisOptions, message] of [
      [{ socket: { host: 'h', port: 1 } }, /redisOptions\.socket\.host is not supported: give the server in url/],
      [{ socket: { tls: 'yes' } }, /redisOptions\.socket\.tls must be a boolean/],
      [{ socket: { ca: 'pem' } }, /give TLS material in the tls option/],
      [{ pingInterval: 1000 }, /redisOptions\.pingInterval is not supported/],
      [{ RESP: 3 }, /redisOptions\.RESP is not supported/],
      [{ urll: 'redis://x' }, /redisOptions\.urll is not supported: redisOptions takes url, username, password, database, name and socket/],
      [{ socket: { keepAlives: true } }, /redisOptions\.socket\.keepAlives is not supported.*did you mean keepAlive\?/],
      [{ database: -1 }, /redisOptions\.database must be a whole number/],
    ] as Array<[AnyOptions, RegExp]>) {
      for (const make of [classes.RedisLeaseProvider, classes.RedisStreamsPubSub]) {
        const err = expectThrow(() => make({ redisOptions }), Error, 'ERR_LEASE_INVALID_OPTION')
        expect(err.message).toMatch(message)
      }
    }
  })

  it('url and redisOptions.url, or connectionName and redisOptions.name, that differ conflict; the same value twice does not', () => {
    expectThrow(() => new RedisStreamsPubSub({ url: 'redis://a:1', redisOptions: { url: 'redis://b:2' } } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expectThrow(() => new RedisLeaseProvider({ connectionName: 'a', redisOptions: { name: 'b' } } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expectThrow(() => new RedisLeaseProvider({ url: 'redis://u:p@h:1', redisOptions: { password: 'q' } } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expectThrow(() => new RedisLeaseProvider({ url: 'redis://h:1/2', redisOptions: { database: 3 } } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expectThrow(() => new RedisLeaseProvider({ url: 'rediss://h:1', redisOptions: { socket: { tls: false } } } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    kept(new RedisStreamsPubSub({ url: redis.url, redisOptions: { url: redis.url } }))
    kept(new RedisLeaseProvider({ connectionName: 'a', redisOptions: { name: 'a' } }))
  })

  it('socket.tls true makes a redis:// url a rediss:// one, so tls options apply to it', () => {
    const pem = '-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n'
    // Without socket.tls, tls with a redis:// url is refused; with it, the PEM itself is checked.
    expect(() => new RedisLeaseProvider({ url: 'redis://h:1', tls: { ca: pem } })).toThrow(/rediss:\/\//)
    expect(() => new RedisLeaseProvider({ url: 'redis://h:1', redisOptions: { socket: { tls: true } }, tls: { ca: pem } } as never)).toThrow(/tls\.ca/)
  })
})

describe('option getters that throw', () => {
  it.each(Object.entries(classes))('%s surfaces what a getter threw, coded, with it as cause, instead of taking the default', (_name, make) => {
    const thrown = new Error('vault unavailable')
    const options = {
      get maxKeyBytes(): number {
        throw thrown
      },
    }
    const err = expectThrow(() => make(options), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expect(err.message).toContain('reading option maxKeyBytes threw: vault unavailable')
    expect((err as Error & { cause?: unknown }).cause).toBe(thrown)
  })

  it('a url getter that throws never connects anywhere, and a Proxy whose trap throws surfaces too', () => {
    const url = {
      get url(): string {
        throw new Error('no url for you')
      },
    }
    expectThrow(() => new RedisLeaseProvider(url as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expectThrow(() => new RedisStreamsPubSub(url as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    const trap = new Proxy(
      {},
      {
        ownKeys() {
          throw new Error('trapped')
        },
      },
    )
    for (const make of Object.values(classes)) {
      const err = expectThrow(() => make(trap), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expect((err as Error & { cause?: Error }).cause?.message).toBe('trapped')
    }
  })
})

describe('options that Redis would refuse later, or that are not options at all', () => {
  const redisClasses = { RedisLeaseProvider: classes.RedisLeaseProvider, RedisStreamsPubSub: classes.RedisStreamsPubSub }

  it.each(Object.entries(redisClasses))('%s refuses a connectionName Redis cannot set (a space, a newline, a non-ASCII letter), saying why, before any I/O', (_name, make) => {
    for (const name of ['a b', 'line\nbreak', 'tab\there', 'naïve']) {
      const err = expectThrow(() => make({ url: redis.url, connectionName: name }), RangeError, 'ERR_LEASE_INVALID_OPTION')
      expect(err.message).toMatch(/connectionName .*spaces/)
      expectThrow(() => make({ redisOptions: { url: redis.url, name } }), RangeError, 'ERR_LEASE_INVALID_OPTION')
    }
    kept(make({ url: redis.url, connectionName: 'worker-1:eu/west' }))
  })

  it.each(Object.entries(classes))('%s refuses an array as options', (_name, make) => {
    const err = expectThrow(() => make([] as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expect(err.message).toContain('got an array')
  })

  it.each(Object.entries(redisClasses))('%s refuses a keyPrefix over 1024 bytes and takes one of 1024', (_name, make) => {
    const err = expectThrow(() => make({ url: redis.url, keyPrefix: 'p'.repeat(1_000_000) }), RangeError, 'ERR_LEASE_INVALID_OPTION')
    expect(err.message).toContain('keyPrefix')
    expectThrow(() => make({ url: redis.url, keyPrefix: 'é'.repeat(513) }), RangeError, 'ERR_LEASE_INVALID_OPTION')
    kept(make({ url: redis.url, keyPrefix: 'p'.repeat(1_024) }))
  })
})

describe('loggers', () => {
  it('a logger with warn alone will do; one without warn is refused', () => {
    kept(new RedisLeaseProvider({ url: redis.url, logger: { warn() {} } }))
    kept(new RedisStreamsPubSub({ url: redis.url, logger: { warn() {} } }))
    expectThrow(() => new RedisStreamsPubSub({ url: redis.url, logger: { debug() {} } } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
  })

  it('a logger with warn alone gets the warnings, and no debug note breaks anything', async () => {
    const warnings: string[] = []
    const pubsub = kept(new RedisStreamsPubSub({ url: redis.url, keyPrefix: uniqueKey('warn-only'), maxDeliveryAttempts: 1, logger: { warn: (m: string) => warnings.push(m) } }))
    const inbox = new Inbox((_event, _ack, nack) => nack())
    await pubsub.subscribe('t', inbox.cb, { group: 'g' })
    await pubsub.subscribe('t', inbox.cb, { group: 'g' }) // a debug note at most
    await pubsub.publish('t', { type: 'x', runId: 'r', data: {} })
    await inbox.count(1)
    const deadline = Date.now() + 2_000
    while (!warnings.some((w) => /max delivery attempts/.test(w)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20))
    expect(warnings.some((w) => /max delivery attempts/.test(w))).toBe(true)
  })
})

describe('closed instances say what is closed', () => {
  it(`the streams pubsub says "the streams pubsub is closed", with Mastra's "cannot publish (subscribe) on closed client" for publish and subscribe; a lease provider, "the lease provider"`, async () => {
    const pubsub = new RedisStreamsPubSub({ url: redis.url })
    await pubsub.close()
    for (const [call, message] of [
      [() => pubsub.publish('t', { type: 'x', runId: 'r', data: {} }), 'the streams pubsub is closed: cannot publish on closed client'],
      [() => pubsub.publish('t', { type: 'x', runId: 'r', data: {} }, { localOnly: true }), 'the streams pubsub is closed: cannot publish on closed client'],
      [() => pubsub.subscribe('t', () => {}), 'the streams pubsub is closed: cannot subscribe on closed client'],
      [() => pubsub.acquireLease('k', 'o', 1000), 'the streams pubsub is closed'],
    ] as Array<[() => Promise<unknown>, string]>) {
      const err = await expectRejection(call, Error, 'ERR_LEASE_CLOSED')
      expect(err.message).toBe(message)
    }
    // What code written against Mastra's backend matches on.
    await expect(pubsub.publish('t', { type: 'x', runId: 'r', data: {} })).rejects.toThrow(/cannot publish on closed client/)
    await expect(pubsub.subscribe('t', () => {})).rejects.toThrow(/cannot subscribe on closed client/)
    for (const p of [new RedisLeaseProvider({ url: redis.url }), new MemoryLeaseProvider()]) {
      await p.close()
      const err = await expectRejection(() => p.getLeaseOwner('k'), Error, 'ERR_LEASE_CLOSED')
      expect(err.message).toBe('the lease provider is closed')
    }
  })
})

describe('streams arguments are checked as lease keys are', () => {
  const logger = recordingLogger()
  const pubsub = () => kept(new RedisStreamsPubSub({ url: redis.url, keyPrefix: uniqueKey('args'), logger }))
  const event = { type: 'x', runId: 'r', data: {} }

  it('a topic or group that is not a string is a coded TypeError, for publish, subscribe and clearTopic', async () => {
    const p = pubsub()
    await expectRejection(() => p.publish(5 as never, event), TypeError, 'ERR_STREAMS_INVALID_ARGUMENT')
    await expectRejection(() => p.subscribe({} as never, () => {}), TypeError, 'ERR_STREAMS_INVALID_ARGUMENT')
    await expectRejection(() => p.subscribe('t', () => {}, { group: 7 as never }), TypeError, 'ERR_STREAMS_INVALID_ARGUMENT')
    await expectRejection(() => p.subscribe('', () => {}), RangeError, 'ERR_STREAMS_INVALID_ARGUMENT')
    await expectRejection(() => p.subscribe('t', () => {}, { group: '' }), RangeError, 'ERR_STREAMS_INVALID_ARGUMENT')
  })

  it("a topic with a lone surrogate is refused instead of becoming U+FFFD (a publish to '\\uD800' must not reach '\\uD801')", async () => {
    const p = pubsub()
    const replacement = new Inbox()
    await p.subscribe('\uFFFD', replacement.cb) // what both would become, were they converted
    await expectRejection(() => p.subscribe('\uD801', new Inbox().cb), TypeError, 'ERR_STREAMS_INVALID_ARGUMENT')
    await expectRejection(() => p.publish('\uD800', event), TypeError, 'ERR_STREAMS_INVALID_ARGUMENT')
    await new Promise((r) => setTimeout(r, 300))
    expect(replacement.events).toEqual([])
  })

  it("subscribe(topic, 5), startFrom: 'bogus', an unknown subscribe option, an array as options and options whose Proxy traps throw are errors", async () => {
    const p = pubsub()
    await expectRejection(() => p.subscribe('t', 5 as never), TypeError, 'ERR_STREAMS_INVALID_ARGUMENT')
    const array = await expectRejection(() => p.subscribe('t', () => {}, [] as never), TypeError, 'ERR_STREAMS_INVALID_ARGUMENT')
    expect(array.message).toContain('an array')
    await expectRejection(() => p.subscribe('t', () => {}, { startFrom: 'bogus' as never }), RangeError, 'ERR_STREAMS_INVALID_ARGUMENT')
    const err = await expectRejection(() => p.subscribe('t', () => {}, { grup: 'workers' } as never), TypeError, 'ERR_STREAMS_INVALID_ARGUMENT')
    expect(err.message).toContain('unknown subscribe option "grup"')
    const thrown = new Error('trapped')
    const trap = new Proxy({}, { ownKeys: () => { throw thrown } })
    const trapped = await expectRejection(() => p.subscribe('t', () => {}, trap as never), TypeError, 'ERR_STREAMS_INVALID_ARGUMENT')
    expect((trapped as Error & { cause?: unknown }).cause).toBe(thrown)
    const getter = new Proxy({ group: 'g' }, { get: () => { throw thrown } })
    expect(((await expectRejection(() => p.subscribe('t', () => {}, getter as never), TypeError, 'ERR_STREAMS_INVALID_ARGUMENT')) as Error & { cause?: unknown }).cause).toBe(thrown)
    // Mastra's batch option: a pubsub without native batching delivers unbatched.
    await p.subscribe('t', () => {}, { batch: { maxSize: 10 } } as never)
  })
})

describe('cluster, sentinel, minReplicas and maxMetadataBytes; fencingTokens refused', () => {
  const NODES = ['redis://127.0.0.1:7000', 'redis://127.0.0.1:7001']
  const redisClasses = { RedisLeaseProvider: classes.RedisLeaseProvider, RedisStreamsPubSub: classes.RedisStreamsPubSub }

  it.each(Object.entries(redisClasses))('%s refuses every bad cluster or sentinel option by name, before connecting anywhere', (_name, make) => {
    for (const [options, cls, message] of [
      [{ url: redis.url, cluster: { nodes: NODES } }, TypeError, /url.*cluster|cluster.*url/],
      [{ url: redis.url, sentinel: { nodes: NODES, masterName: 'm' } }, TypeError, /url.*sentinel|sentinel.*url/],
      [{ cluster: { nodes: NODES }, sentinel: { nodes: NODES, masterName: 'm' } }, TypeError, /cluster.*sentinel|sentinel.*cluster/],
      [{ cluster: { node: NODES } }, TypeError, /node.*did you mean nodes\?/],
      [{ cluster: { nodes: NODES, pasword: 'x' } }, TypeError, /pasword.*did you mean password\?/],
      [{ cluster: { nodes: [] } }, RangeError, /at least one node/],
      [{ cluster: { nodes: 'redis://127.0.0.1:7000' } }, TypeError, /cluster\.nodes/],
      [{ cluster: { nodes: ['http://127.0.0.1:7000'] } }, RangeError, /not a Redis URL/],
      [{ cluster: { nodes: ['redis://127.0.0.1:7000', 'rediss://127.0.0.1:7001'] } }, RangeError, /mix redis:\/\/ and rediss:\/\//],
      [{ cluster: { nodes: ['redis://a:one@127.0.0.1:7000', 'redis://a:two@127.0.0.1:7001'] } }, RangeError, /different credentials/],
      [{ cluster: { nodes: ['redis://127.0.0.1:7000/2'] } }, RangeError, /database 0 only/],
      [{ cluster: { nodes: ['redis+unix:///tmp/redis.sock'] } }, RangeError, /not unix sockets/],
      [{ cluster: { nodes: NODES }, keyPrefix: 'app{' }, RangeError, /brace/],
      [{ sentinel: { nodes: NODES } }, TypeError, /masterName/],
      [{ sentinel: { nodes: NODES, masterName: 'm', master: 'x' } }, TypeError, /sentinel\.master is not an option/],
      [{ sentinel: { nodes: NODES, masterName: 'm' }, redisOptions: { socket: { tls: true } } }, TypeError, /socket\.tls/],
      [{ minReplicas: -1 }, RangeError, /minReplicas/],
      [{ minReplicas: 1.5 }, RangeError, /minReplicas/],
      [{ minReplicas: '1' }, TypeError, /minReplicas/],
      [{ replicaTimeoutMs: 100 }, TypeError, /replicaTimeoutMs without minReplicas/],
      [{ minReplicas: 1, replicaTimeoutMs: 2_000, commandTimeoutMs: 2_000 }, RangeError, /must be shorter than commandTimeoutMs/],
      // Gone: whatever its value, it is refused with the way over (a fenced grant per call).
      [{ fencingTokens: false }, TypeError, /unknown option fencingTokens; it is gone: .*acquireFencedLease/],
      [{ fencingTokens: true }, TypeError, /unknown option fencingTokens; it is gone: .*acquireFencedLease/],
      [{ fencingTokens: 'false' }, TypeError, /unknown option fencingTokens; it is gone: .*acquireFencedLease/],
      [{ maxMetadataBytes: 0 }, RangeError, /maxMetadataBytes/],
      [{ maxMetadataBytes: '4096' }, TypeError, /maxMetadataBytes/],
      [{ maxMetadataByte: 1 }, TypeError, /maxMetadataByte.*did you mean maxMetadataBytes\?/],
    ] as Array<[AnyOptions, typeof TypeError, RegExp]>) {
      const err = expectThrow(() => make(options), cls, 'ERR_LEASE_INVALID_OPTION')
      expect(err.message, JSON.stringify(options)).toMatch(message)
      // Credentials in a node URL are never echoed.
      expect(err.message).not.toMatch(/one@|two@/)
    }
  })

  it('MemoryLeaseProvider has no cluster, sentinel, minReplicas or fencingTokens', () => {
    for (const option of ['cluster', 'sentinel', 'minReplicas', 'fencingTokens']) {
      expectThrow(() => classes.MemoryLeaseProvider({ [option]: 1 }), TypeError, 'ERR_LEASE_INVALID_OPTION')
    }
    const gone = expectThrow(() => classes.MemoryLeaseProvider({ fencingTokens: false }), TypeError, 'ERR_LEASE_INVALID_OPTION')
    expect(gone.message).toMatch(/unknown option fencingTokens; it is gone: .*acquireFencedLease/)
  })

  it('good cluster and sentinel options construct without connecting', async () => {
    for (const make of Object.values(redisClasses)) {
      await kept(make({ cluster: { nodes: NODES, username: 'u', password: 'p' }, minReplicas: 1, replicaTimeoutMs: 200 })).close()
      await kept(make({ sentinel: { nodes: NODES, masterName: 'm', username: 'u', password: 'p', database: 2 }, minReplicas: 2 })).close()
      await kept(make({ cluster: { nodes: NODES }, maxMetadataBytes: 256 })).close()
    }
  })
})

describe("maxDeliveryAttempts 0, as Mastra's backend takes it", () => {
  const about = <T extends { message: string }>(lines: T[]) => lines.filter((l) => /maxDeliveryAttempts/.test(l.message))
  const turn = () => new Promise((r) => setTimeout(r, 50)) // notices reach JavaScript on a later turn

  it("is unlimited, with Mastra's warning through the logger once per instance, before the constructor returns (as Mastra's own test looks for it); Infinity and the default give none", async () => {
    const logger = recordingLogger()
    kept(new RedisStreamsPubSub({ url: redis.url, maxDeliveryAttempts: 0, logger }))
    expect(about(logger.warnings()), 'told at once').toHaveLength(1)
    for (const maxDeliveryAttempts of [0, Infinity, undefined]) {
      const pubsub = kept(new RedisStreamsPubSub({ url: redis.url, maxDeliveryAttempts, logger }))
      await pubsub.publish(uniqueKey('attempts'), { type: 'x', runId: 'r', data: {} })
    }
    await turn()
    const warned = about(logger.warnings())
    expect(warned, 'one warning per instance given 0').toHaveLength(2)
    expect(warned[0]!.message).toMatch(/maxDeliveryAttempts=0 is treated as Infinity for back-compat.*pass Infinity to disable the cap explicitly/)
    expect(warned[0]!.fields).toMatchObject({ code: 'MASTRA_LEASE_ZERO_DELIVERY_ATTEMPTS' })
  })

  it('without a logger, the warning goes to process.emitWarning with its code, once per instance', async () => {
    const seen: Array<Error & { code?: string }> = []
    const listener = (warning: Error & { code?: string }) => void seen.push(warning)
    await unprintedWarnings(async () => {
      process.on('warning', listener)
      try {
        kept(new RedisStreamsPubSub({ url: redis.url, maxDeliveryAttempts: 0 }))
        kept(new RedisStreamsPubSub({ url: redis.url, maxDeliveryAttempts: Infinity }))
        await turn()
      } finally {
        process.off('warning', listener)
      }
    })
    const warned = seen.filter((w) => w.code === 'MASTRA_LEASE_ZERO_DELIVERY_ATTEMPTS')
    expect(warned).toHaveLength(1)
    expect(warned[0]!.message).toMatch(/maxDeliveryAttempts=0 is treated as Infinity/)
  })
})

describe("redisOptions.socket, as node-redis takes it", () => {
  const redisClasses = { RedisLeaseProvider: classes.RedisLeaseProvider, RedisStreamsPubSub: classes.RedisStreamsPubSub }

  it.each(Object.entries(redisClasses))('%s takes connectTimeout, noDelay and keepAlive (true, false, or a delay in ms), and keepAliveInitialDelay', async (_name, make) => {
    for (const socket of [
      { connectTimeout: 500 },
      { noDelay: true },
      { noDelay: false },
      { keepAlive: true },
      { keepAlive: false },
      { keepAlive: 10_000 },
      { keepAlive: true, keepAliveInitialDelay: 10_000 },
      { connectTimeout: 500, noDelay: true, keepAlive: true, tls: false },
    ]) {
      await kept(make({ redisOptions: { url: redis.url, socket } })).close()
    }
    // The same bound given both ways is one bound.
    await kept(make({ url: redis.url, connectTimeoutMs: 500, redisOptions: { socket: { connectTimeout: 500 } } })).close()
  })

  it.each(Object.entries(redisClasses))('%s refuses a socket field given badly, or connectTimeout and connectTimeoutMs that differ, by name', (_name, make) => {
    for (const [socket, cls, message, top] of [
      [{ connectTimeout: 500 }, TypeError, /connectTimeoutMs and redisOptions\.socket\.connectTimeout conflict/, { connectTimeoutMs: 600 }],
      [{ connectTimeout: 0 }, RangeError, /redisOptions\.socket\.connectTimeout must be a whole number/],
      [{ connectTimeout: '500' }, TypeError, /redisOptions\.socket\.connectTimeout must be a number/],
      [{ noDelay: 'yes' }, TypeError, /redisOptions\.socket\.noDelay must be a boolean/],
      [{ keepAlive: 'on' }, TypeError, /redisOptions\.socket\.keepAlive must be a boolean or a delay in milliseconds/],
      [{ keepAlive: -1 }, RangeError, /redisOptions\.socket\.keepAlive must be/],
      [{ keepAlive: false, keepAliveInitialDelay: 1_000 }, TypeError, /keepAliveInitialDelay with keepAlive false/],
      [{ keepAlive: 2_000, keepAliveInitialDelay: 1_000 }, TypeError, /keepAlive and redisOptions\.socket\.keepAliveInitialDelay conflict/],
    ] as Array<[AnyOptions, typeof TypeError, RegExp, AnyOptions?]>) {
      const err = expectThrow(() => make({ ...top, redisOptions: { url: redis.url, socket } }), cls, 'ERR_LEASE_INVALID_OPTION')
      expect(err.message, JSON.stringify(socket)).toMatch(message)
    }
  })

  it.each(Object.entries(redisClasses))('%s takes reconnectStrategy false, what it does, and refuses a delay or a function, saying that a broken connection is opened again by the next call', async (_name, make) => {
    const taken = kept(make({ redisOptions: { url: redis.url, socket: { reconnectStrategy: false } } }))
    expect(await taken.acquireLease(uniqueKey('no-reconnect-loop'), 'A', 1_000)).toEqual({ acquired: true, owner: 'A' })
    for (const reconnectStrategy of [true, 500, (retries: number) => Math.min(retries * 50, 500)]) {
      const err = expectThrow(() => make({ redisOptions: { url: redis.url, socket: { reconnectStrategy } } } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expect(err.message).toMatch(/redisOptions\.socket\.reconnectStrategy is not supported but as false: .*the next call opens it again/)
    }
  })

  it('connectTimeout bounds opening a connection as connectTimeoutMs does: a server that never answers is given up on well before the default 2 s', async ({ annotate }) => {
    const silent = net.createServer(() => {}) // accepts, never answers
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r))
    const url = `redis://127.0.0.1:${(silent.address() as net.AddressInfo).port}`
    try {
      for (const [label, options] of [
        ['redisOptions.socket.connectTimeout', { redisOptions: { url, socket: { connectTimeout: 200 } } }],
        ['connectTimeoutMs', { url, connectTimeoutMs: 200 }],
      ] as const) {
        const p = kept(new RedisLeaseProvider({ ...options, commandTimeoutMs: 5_000, logger: { warn() {} } }))
        const started = performance.now()
        const err = await p.getLeaseOwner('k').then(() => undefined, (e: unknown) => e)
        const elapsed = performance.now() - started
        await annotate(`${label} 200: the call gave up after ${elapsed.toFixed(0)} ms`)
        expect(['ERR_LEASE_TIMEOUT', 'ERR_LEASE_CONNECTION'], label).toContain(errorCode(err))
        expect(elapsed, label).toBeLessThan(1_500)
      }
    } finally {
      silent.close()
    }
  })

  it.skipIf(EXTERNAL_REDIS || process.platform !== 'linux')('keepAlive puts TCP keepalive probes on the connection, on by default as in node-redis; keepAlive false leaves them off', async () => {
    const probes = async (socket: AnyOptions | undefined): Promise<boolean> => {
      const name = `ka-${uniqueKey('').slice(-10).replace(/\W/g, '')}`
      const p = kept(new RedisLeaseProvider({ url: redis.url, connectionName: name, ...(socket && { redisOptions: { socket } }) }))
      await p.getLeaseOwner('k')
      // The connection is named beside the first call, not before it: look until it shows.
      let port: string | undefined
      for (const deadline = Date.now() + 2_000; port === undefined && Date.now() < deadline; ) {
        const line = String(await redis.cli('CLIENT', 'LIST')).split('\n').find((l) => l.includes(`name=${name} `))
        port = /addr=127\.0\.0\.1:(\d+)/.exec(line ?? '')?.[1]
      }
      expect(port, `our connection (${name}) in CLIENT LIST`).toBeDefined()
      const ss = execFileSync('ss', ['-tno', 'state', 'established', `( sport = :${port} )`], { encoding: 'utf8' })
      return /keepalive/.test(ss)
    }
    expect(await probes(undefined), 'by default').toBe(true)
    expect(await probes({ keepAlive: true }), 'keepAlive: true').toBe(true)
    expect(await probes({ keepAlive: false }), 'keepAlive: false').toBe(false)
  })
})

describe("cluster, in node-redis' shape as Mastra's backend takes it", () => {
  const NODES = ['redis://127.0.0.1:7000', 'redis://127.0.0.1:7001']
  const redisClasses = { RedisLeaseProvider: classes.RedisLeaseProvider, RedisStreamsPubSub: classes.RedisStreamsPubSub }
  const rootNodes = NODES.map((url) => ({ url }))

  it.each(Object.entries(redisClasses))('%s takes { rootNodes: [{ url }], defaults: { username, password } } without connecting', async (_name, make) => {
    await kept(make({ cluster: { rootNodes } })).close()
    await kept(make({ cluster: { rootNodes, defaults: { username: 'u', password: 'p' } } })).close()
    await kept(make({ cluster: { rootNodes, defaults: { password: 'p' }, useReplicas: false } })).close()
  })

  it.each(Object.entries(redisClasses))('%s refuses what it cannot honour of that shape by name, and the two shapes mixed', (_name, make) => {
    for (const [cluster, cls, message] of [
      [{ rootNodes, nodes: NODES }, TypeError, /cluster\.nodes and cluster\.rootNodes conflict/],
      [{ nodes: NODES, defaults: { password: 'p' } }, TypeError, /cluster\.defaults goes with cluster\.rootNodes/],
      [{ rootNodes: [] }, RangeError, /cluster\.rootNodes must name at least one node/],
      [{ rootNodes: NODES }, TypeError, /cluster\.rootNodes\[0\] must be an object/],
      [{ rootNodes: [{ socket: { host: '127.0.0.1', port: 7000 } }] }, TypeError, /cluster\.rootNodes\[0\]\.socket is not supported: give the node's url/],
      [{ rootNodes: [{ url: NODES[0], password: 'p' }] }, TypeError, /cluster\.rootNodes\[0\]\.password is not supported: .*cluster\.defaults/],
      [{ rootNodes, defaults: { socket: { tls: true } } }, TypeError, /cluster\.defaults\.socket is not an option of cluster\.defaults/],
      [{ rootNodes, defaults: { pasword: 'p' } }, TypeError, /cluster\.defaults\.pasword.*did you mean password\?/],
      [{ rootNodes, useReplicas: true }, TypeError, /cluster\.useReplicas true is not supported: every call goes to the masters/],
      [{ rootNodes, maxCommandRedirections: 3 }, TypeError, /cluster\.maxCommandRedirections is not an option of cluster/],
    ] as Array<[AnyOptions, typeof TypeError, RegExp]>) {
      const err = expectThrow(() => make({ cluster }), cls, 'ERR_LEASE_INVALID_OPTION')
      expect(err.message, JSON.stringify(cluster)).toMatch(message)
    }
  })
})

describe("RedisLeaseProvider's own options", () => {
  type RedisOptions = NonNullable<ConstructorParameters<typeof RedisLeaseProvider>[0]>

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
})
