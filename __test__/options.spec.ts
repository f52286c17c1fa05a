// Options are checked strictly by every class: an option it does not know, or two that
// conflict, throw ERR_LEASE_INVALID_OPTION naming it. A typo must not quietly connect to
// whatever Redis runs on localhost. A configuration written for Mastra's own Redis Streams
// backend (`redisOptions`, `inFlightTimeoutMs`) works unchanged where its fields mean
// something here, and is refused by name where they do not. The streams methods check their
// arguments as the lease methods do.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub } from '../dist/esm/index.js'
import { expectRejection, expectThrow, uniqueKey } from './helpers/lease.js'
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

  it("a ready-made client (Mastra's backend takes one) is refused with what to give instead", () => {
    for (const make of [classes.RedisLeaseProvider, classes.RedisStreamsPubSub]) {
      const err = expectThrow(() => make({ client: {} }), TypeError, 'ERR_LEASE_INVALID_OPTION')
      expect(err.message).toMatch(/unknown option client; a ready-made client cannot be used.*url \(or redisOptions\)/)
    }
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
      expect(await leases.acquireLease(key, 'A', 10_000)).toEqual({ acquired: true, owner: 'A', token: expect.any(Number) })
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
      [{ urll: 'redis://x' }, /redisOptions\.urll is not supported: redisOptions takes url, username, password, database, name and socket\.tls/],
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
  it('the streams pubsub says "the streams pubsub is closed", its leases too; a lease provider, "the lease provider"', async () => {
    const pubsub = new RedisStreamsPubSub({ url: redis.url })
    await pubsub.close()
    for (const call of [() => pubsub.publish('t', { type: 'x', runId: 'r', data: {} }), () => pubsub.subscribe('t', () => {}), () => pubsub.acquireLease('k', 'o', 1000)]) {
      const err = await expectRejection(call, Error, 'ERR_LEASE_CLOSED')
      expect(err.message).toBe('the streams pubsub is closed')
    }
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

  it("subscribe(topic, 5), startFrom: 'bogus', an unknown subscribe option and options whose Proxy traps throw are errors", async () => {
    const p = pubsub()
    await expectRejection(() => p.subscribe('t', 5 as never), TypeError, 'ERR_STREAMS_INVALID_ARGUMENT')
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

describe('cluster, sentinel, minReplicas and fencingTokens', () => {
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
      [{ fencingTokens: 'false' }, TypeError, /fencingTokens must be a boolean, got string/],
      [{ fencingTokens: 0 }, TypeError, /fencingTokens must be a boolean, got number/],
      [{ fencingToken: false }, TypeError, /fencingToken.*did you mean fencingTokens\?/],
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
  })

  it('good cluster and sentinel options construct without connecting', async () => {
    for (const make of Object.values(redisClasses)) {
      await kept(make({ cluster: { nodes: NODES, username: 'u', password: 'p' }, minReplicas: 1, replicaTimeoutMs: 200 })).close()
      await kept(make({ sentinel: { nodes: NODES, masterName: 'm', username: 'u', password: 'p', database: 2 }, minReplicas: 2 })).close()
      await kept(make({ cluster: { nodes: NODES }, fencingTokens: false })).close()
    }
  })
})
