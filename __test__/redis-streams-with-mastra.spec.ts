// RedisStreamsPubSub as Mastra uses it: the leases on the same connection, `new Mastra({ pubsub })`,
// and a process that exits by itself after close().
//
// Layout (the one Mastra's own Redis Streams backend uses): a topic is the stream
// `<keyPrefix>:<topic>` whose entries carry one field, `event`, holding the event as JSON;
// a lease is the string `<keyPrefix>:lease:<key>` holding the owner, with a PX expiry.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import { spawn } from 'node:child_process'

import { Mastra } from '@mastra/core'
import { isLeaseProvider, PubSub, type LeaseProvider } from '@mastra/core/events'
import { createStep, createWorkflow } from '@mastra/core/workflows/evented'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { z } from 'zod'

import { errorCode } from './helpers/lease.js'
import { NODE } from './helpers/mastra-node.js'
import { startRedis, type RedisServer, type RespValue } from './helpers/redis-server.js'
import { ev, sleep, uniquePrefix } from './helpers/streams.js'
import { entries, FIXTURE, streamsSuite } from './helpers/streams-suite.js'

let redis: RedisServer
beforeAll(async () => {
  redis = await startRedis()
})
afterAll(async () => {
  await redis?.stop()
})
const { open, children } = streamsSuite(() => redis)

describe('RedisStreamsPubSub', () => {
  describe('leases on the same connection', () => {
    it("acquire / owner / renew / transfer / release work, stored at <keyPrefix>:lease:<key> as Mastra's backend stores them", async () => {
      const prefix = uniquePrefix('lease')
      const a = open({ keyPrefix: prefix })
      const b = open({ keyPrefix: prefix })
      const key = 'resource-1\0thread-1'
      const leaseKey = `${prefix}:lease:${key}`

      expect(await a.acquireLease(key, 'run-a', 10_000)).toStrictEqual({ acquired: true, owner: 'run-a' })
      expect(await redis.cli('GET', leaseKey)).toBe('run-a')
      const ttl = Number(await redis.cli('PTTL', leaseKey))
      expect(ttl).toBeGreaterThan(9_000)
      expect(ttl).toBeLessThanOrEqual(10_000)

      expect(await b.acquireLease(key, 'run-b', 10_000)).toEqual({ acquired: false, owner: 'run-a' })
      expect(await b.getLeaseOwner(key)).toBe('run-a')
      expect(await b.renewLease(key, 'run-b', 10_000)).toBe(false)
      expect(await a.renewLease(key, 'run-a', 20_000)).toBe(true)
      expect(Number(await redis.cli('PTTL', leaseKey))).toBeGreaterThan(19_000)
      expect(await a.transferLease(key, 'run-a', 'run-a2', 10_000)).toBe(true)
      expect(await b.getLeaseOwner(key)).toBe('run-a2')
      expect(await a.transferLease(key, 'run-a', 'run-x', 10_000)).toBe(false)
      await b.releaseLease(key, 'run-a') // not the owner: a no-op
      expect(await a.getLeaseOwner(key)).toBe('run-a2')
      await a.releaseLease(key, 'run-a2')
      expect(await b.getLeaseOwner(key)).toBeUndefined()
      expect(await redis.cli('EXISTS', leaseKey)).toBe(0)

      // A lease written by someone else in that layout (Mastra's backend: SET NX PX) is seen.
      await redis.cli('SET', `${prefix}:lease:foreign`, 'their-run', 'PX', 10_000, 'NX')
      expect(await a.getLeaseOwner('foreign')).toBe('their-run')
      expect(await a.acquireLease('foreign', 'our-run', 1_000)).toEqual({ acquired: false, owner: 'their-run' })
    })

    it('getLeaseProvider() answers from the same store, and lease keys never collide with topic streams', async () => {
      const prefix = uniquePrefix('lease-provider')
      const pubsub = open({ keyPrefix: prefix })
      const provider: LeaseProvider = pubsub.getLeaseProvider()
      expect(await provider.acquireLease('k', 'owner-1', 5_000)).toStrictEqual({ acquired: true, owner: 'owner-1' })
      expect(await pubsub.getLeaseOwner('k')).toBe('owner-1')
      // A topic named like a lease lives at <prefix>:<topic>, a lease at <prefix>:lease:<key>.
      await pubsub.publish('lease', ev(1))
      expect(await redis.cli('TYPE', `${prefix}:lease`)).toBe('stream')
      expect(await redis.cli('TYPE', `${prefix}:lease:k`)).toBe('string')
    })

    it('lease input errors are coded rejections, as for RedisLeaseProvider', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('lease-input'), maxTtlMs: 1_000 })
      const codes = await Promise.all([
        pubsub.acquireLease('', 'o', 100).catch(errorCode),
        pubsub.acquireLease('k', '', 100).catch(errorCode),
        pubsub.renewLease('k', 'o', 0).catch(errorCode),
        pubsub.acquireLease('k', 'o', 5_000).catch(errorCode),
      ])
      expect(codes).toEqual(['ERR_LEASE_INVALID_KEY', 'ERR_LEASE_INVALID_OWNER', 'ERR_LEASE_INVALID_TTL', 'ERR_LEASE_INVALID_TTL'])
    })
  })

  describe('with Mastra', () => {
    it('new Mastra({ pubsub: new RedisStreamsPubSub(...) }) type-checks without a cast, and Mastra sees a LeaseProvider through its proxy', async () => {
      const pubsub = open({ keyPrefix: uniquePrefix('mastra') })
      // Compile-time checks as much as runtime ones (tsc --noEmit -p . runs over __test__).
      const asPubSub: PubSub = pubsub
      const asLeaseProvider: LeaseProvider = pubsub
      const mastra = new Mastra({ pubsub, logger: false })
      expect(asPubSub).toBe(pubsub)
      expect(isLeaseProvider(asLeaseProvider)).toBe(true)
      expect(isLeaseProvider(mastra.pubsub)).toBe(true)
      const unwrap = Reflect.get(mastra.pubsub, 'getLeaseProvider') as () => LeaseProvider
      const provider = unwrap.call(mastra.pubsub)
      expect(isLeaseProvider(provider)).toBe(true)
      // Through the proxy, methods are bound to our object: a lease taken there is ours.
      expect(await mastra.pubsub.publish('via-proxy', ev(1))).toBeUndefined()
      expect(await provider.acquireLease('proxy\0thread', 'run', 5_000)).toStrictEqual({ acquired: true, owner: 'run' })
      expect(await pubsub.getLeaseOwner('proxy\0thread')).toBe('run')
    })

    it("startWorkers() runs Mastra's OrchestrationWorker on it: a consumer group reads the workflows stream", async () => {
      const prefix = uniquePrefix('mastra-workers')
      const pubsub = open({ keyPrefix: prefix })
      const mastra = new Mastra({ pubsub, logger: false })
      await mastra.startWorkers()
      try {
        const groups = (await redis.cli('XINFO', 'GROUPS', `${prefix}:workflows`)) as RespValue[][]
        expect(groups.length).toBeGreaterThan(0)
        // The worker reads what lands on the stream: the group moves past an event written there.
        await pubsub.publish('workflows', { type: 'mastra-lease.test.noop', runId: 'no-such-run', data: {} })
        const [[entryId]] = (await entries(redis, `${prefix}:workflows`)) as [[string, string[]]]
        const atOrAfter = (id: string, than: string) => {
          const [a, b] = id.split('-').map(BigInt) as [bigint, bigint]
          const [c, d] = than.split('-').map(BigInt) as [bigint, bigint]
          return a > c || (a === c && b >= d)
        }
        let delivered = '0-0'
        for (let i = 0; i < 100 && !atOrAfter(delivered, entryId); i++) {
          const [group] = (await redis.cli('XINFO', 'GROUPS', `${prefix}:workflows`)) as RespValue[][]
          delivered = String(group![group!.indexOf('last-delivered-id') + 1])
          if (!atOrAfter(delivered, entryId)) await sleep(20)
        }
        expect(atOrAfter(delivered, entryId), `last-delivered-id ${delivered}, event ${entryId}`).toBe(true)
      } finally {
        await mastra.stopWorkers()
      }
    })
  })

  describe('an evented workflow, watched', () => {
    it("run.watch(), which subscribes without awaiting, gets the run's events, which Mastra publishes localOnly: none of them reaches Redis", async () => {
      const prefix = uniquePrefix('mastra-watch')
      const pubsub = open({ keyPrefix: prefix, blockMs: 100 })
      const counted = z.object({ n: z.number() })
      const step = (id: string) => createStep({ id, inputSchema: counted, outputSchema: counted, execute: async ({ inputData }) => ({ n: inputData.n + 1 }) })
      const workflow = createWorkflow({ id: 'watched', inputSchema: counted, outputSchema: counted }).then(step('first')).then(step('second')).commit()
      const mastra = new Mastra({ workflows: { watched: workflow }, pubsub, logger: false })
      await mastra.startWorkers()
      try {
        const run = await mastra.getWorkflow('watched').createRun()
        const seen: unknown[] = []
        const stop = run.watch((event) => void seen.push(event))
        const result = await run.start({ inputData: { n: 0 } })
        stop()
        expect(result.status).toBe('success')
        expect(seen.length).toBeGreaterThan(0)
        expect(await redis.cli('EXISTS', `${prefix}:workflow.events.v2.${run.runId}`)).toBe(0)
      } finally {
        await mastra.stopWorkers()
      }
    })
  })

  describe('a process using it', () => {
    /** Runs the fixture without IPC; resolves with its exit code and output, or kills it after `ms`. */
    function runChild(mode: 'close' | 'no-close', ms: number, prefix: string) {
      const config = { mode, url: redis.url, keyPrefix: prefix, topic: 'child', group: 'child-group' }
      const child = spawn(NODE, [FIXTURE, JSON.stringify(config)], { stdio: ['ignore', 'pipe', 'pipe'] })
      children.add(child)
      let out = ''
      let err = ''
      child.stdout.on('data', (d: Buffer) => (out += d.toString()))
      child.stderr.on('data', (d: Buffer) => (err += d.toString()))
      return new Promise<{ exited: boolean; code: number | null; out: string; err: string }>((resolve) => {
        const timer = setTimeout(() => {
          child.kill('SIGKILL')
        }, ms)
        child.once('exit', (code, signal) => {
          clearTimeout(timer)
          children.delete(child)
          resolve({ exited: signal === null, code, out, err })
        })
      })
    }

    it('exits by itself after close(), with subscriptions (group and fan-out) and a lease taken before', async () => {
      const prefix = uniquePrefix('child-exit')
      const started = Date.now()
      const r = await runChild('close', 10_000, prefix)
      expect(r.exited, `the child was still running after 10 s (a handle left open); stderr: ${r.err}`).toBe(true)
      expect(r.code, r.err).toBe(0)
      expect(JSON.parse(r.out.trim())).toStrictEqual({
        type: 'done',
        grouped: { n: 1 },
        fanned: { n: 1 },
        lease: { acquired: true, owner: 'child-run' },
      })
      expect(Date.now() - started).toBeLessThan(10_000)
      expect(await redis.cli('GET', `${prefix}:lease:child\0thread`)).toBe('child-run')
    })

    it('without close(), a live subscription keeps the process running (the control for the test above)', async () => {
      const r = await runChild('no-close', 2_500, uniquePrefix('child-alive'))
      expect(r.out, r.err).toContain('"type":"done"')
      expect(r.exited, 'the child exited although it still had live subscriptions').toBe(false)
    })
  })
})
