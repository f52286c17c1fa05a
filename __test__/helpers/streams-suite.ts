// What the RedisStreamsPubSub suites share: pubsubs and servers closed after each test, a
// child process that holds events (killed at the end), and reading a stream's state back.
import type { ChildProcess } from 'node:child_process'
import path from 'node:path'

import { afterAll, afterEach } from 'vitest'

import { RedisStreamsPubSub, type RedisStreamsPubSubOptions } from '../../dist/esm/index.js'
import { jsonLinesChild } from './json-lines-child.js'
import { startRedis, type RedisServer, type RespValue } from './redis-server.js'
import { ev, sleep } from './streams.js'

/** The child process the suites spawn (fixtures/streams-process.mjs). */
export const FIXTURE = path.join(__dirname, '..', 'fixtures', 'streams-process.mjs')

/** A UUID v4, as `id` is stamped. */
export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/

/**
 * Registers the clean-up hooks of a suite and answers its helpers. `server()` is the suite's
 * shared server (started by the suite, so it can be external through REDIS_URL).
 */
export function streamsSuite(server: () => RedisServer) {
  const opened: RedisStreamsPubSub[] = []
  const servers: RedisServer[] = []
  const children = new Set<ChildProcess>()

  afterEach(async () => {
    await Promise.allSettled(opened.splice(0).map((p) => p.close()))
    // stop() thaws a frozen server first: nothing is ever left SIGSTOPped.
    await Promise.allSettled(servers.splice(0).map((s) => s.stop()))
  })
  afterAll(() => {
    for (const child of children) child.kill('SIGKILL')
  })

  /** A RedisStreamsPubSub closed after the test; on the shared server unless `url` is given. */
  function open(options: RedisStreamsPubSubOptions = {}): RedisStreamsPubSub {
    const pubsub = new RedisStreamsPubSub({ url: server().url, ...options })
    opened.push(pubsub)
    return pubsub
  }

  /** A server of this test's own, which it may freeze, kill or restart. */
  async function ownServer(): Promise<RedisServer> {
    const own = await startRedis()
    servers.push(own)
    return own
  }

  /** Spawns the fixture in `hold` mode; resolves with its stdout lines as they come. */
  function holdingChild(config: Record<string, unknown>) {
    const { child, lines: said, stderr } = jsonLinesChild(FIXTURE, { mode: 'hold', ...config })
    children.add(child)
    child.once('exit', () => children.delete(child))
    /** The first line of `type`, once it came. */
    const line = async (type: string, ms: number) => {
      const deadline = Date.now() + ms
      for (;;) {
        const found = said.find((l) => l.type === type)
        if (found) return found
        if (Date.now() > deadline || child.exitCode !== null) throw new Error(`child never said ${type}; stderr: ${stderr()}`)
        await sleep(20)
      }
    }
    /** Resolves once `n` events were reported. */
    const events = async (n: number, ms: number) => {
      const deadline = Date.now() + ms
      while (said.filter((l) => l.type === 'event').length < n) {
        if (Date.now() > deadline || child.exitCode !== null) throw new Error(`child reported fewer than ${n} events; stderr: ${stderr()}`)
        await sleep(20)
      }
    }
    const kill = () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve()
        child.once('exit', () => resolve())
        child.kill('SIGKILL')
      })
    return { child, line, events, kill }
  }

  return { open, ownServer, holdingChild, children }
}

/** The stream's entries as [entry id, field/value list]. */
export async function entries(server: RedisServer, key: string): Promise<Array<[string, string[]]>> {
  return (await server.cli('XRANGE', key, '-', '+')) as Array<[string, string[]]>
}

/** How many entries of `group` on `key` are read and not yet acked (XPENDING summary). */
export async function pendingCount(server: RedisServer, key: string, group: string): Promise<number> {
  const summary = (await server.cli('XPENDING', key, group)) as RespValue[]
  return Number(summary[0])
}

/** Publishes events `from..to` one after the other. */
export async function publishRange(pubsub: RedisStreamsPubSub, topic: string, from: number, to: number) {
  for (let n = from; n <= to; n++) await pubsub.publish(topic, ev(n))
}

/** The integers `from..to`. */
export const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i)

/**
 * Two consumers of one group on `jobs`, both blocked in their reads, the one that closes
 * blocked first, so the server would hand it the next entry; it closes, and an event is
 * published at once. Answers how long after the publish the live consumer got it (`Infinity`
 * if not within `waitMs`). A sibling takes over what a closed consumer took only by
 * reclaiming it after `reclaimIdleMs`, which the caller sets well above what "at once" means.
 */
export async function deliveryAfterSiblingClose(
  make: (options: RedisStreamsPubSubOptions) => RedisStreamsPubSub,
  options: RedisStreamsPubSubOptions,
  waitMs: number,
): Promise<number> {
  const closing = make(options)
  const live = make(options)
  const publisher = make(options)
  await closing.subscribe('jobs', (_event, ack) => ack?.(), { group: 'workers' })
  await sleep(100) // its reader blocks first
  let deliveredAt: number | undefined
  await live.subscribe('jobs', (_event, ack) => {
    deliveredAt ??= performance.now()
    return ack?.()
  }, { group: 'workers' })
  await publisher.publish('warm', ev(0)) // the publisher's connection is open
  await sleep(200) // both readers are now blocked
  await closing.close()
  const publishedAt = performance.now()
  await publisher.publish('jobs', ev(1))
  const deadline = publishedAt + waitMs
  while (deliveredAt === undefined && performance.now() < deadline) await sleep(10)
  return deliveredAt === undefined ? Infinity : deliveredAt - publishedAt
}
