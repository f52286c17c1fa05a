// The operator's tools against a populated Redis: listLeases() pages through every lease
// under a prefix (SCAN, on every master of a cluster), and `npx mastra-lease` lists, reads and
// releases them by name, with exit codes a script can rely on and no credentials printed.
import { execFile } from 'node:child_process'
import path from 'node:path'

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisLeaseProvider } from '../dist/esm/index.js'
import { expectRejection } from './helpers/lease.js'
import { closing, leaseSuite, RUN, stopLater } from './helpers/lease-runs.js'
import { NODE } from './helpers/mastra-node.js'
import { freePort, startRedis, type RedisServer } from './helpers/redis-server.js'
import { startCluster, type RedisCluster } from './helpers/redis-topologies.js'

leaseSuite()

const BIN = path.join(__dirname, '..', 'bin', 'mastra-lease.mjs')
const THREAD = 'resource-1\u0000thread-1'

/** Runs the command; its exit code, stdout and stderr. */
function cli(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(NODE, [BIN, ...args], { cwd: path.join(__dirname, '..'), timeout: 20_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? Number((error as { code?: unknown }).code ?? 1) : 0, stdout, stderr })
    })
  })
}

/** Every page of listLeases, its keys in order of arrival. */
async function listAll(p: RedisLeaseProvider, count?: number): Promise<Array<{ key: string; owner: string; token?: number; ttlMs: number | null }>> {
  const all = []
  let cursor: string | undefined
  do {
    const page = await p.listLeases({ ...(cursor === undefined ? {} : { cursor }), ...(count === undefined ? {} : { count }) })
    all.push(...page.leases)
    cursor = page.cursor
  } while (cursor !== undefined)
  return all
}

let server: RedisServer
// A glob character in the prefix: it must match itself, not every prefix like it.
const prefix = `insp*${RUN}`
const MANY = 1_500
beforeAll(async () => {
  server = stopLater(await startRedis())
  const p = new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })
  await p.acquireLease(THREAD, 'run-1', 600_000)
  await Promise.all(Array.from({ length: MANY }, (_, i) => p.acquireLease(`job-${i}`, `worker-${i % 7}`, 600_000)))
  await p.close()
  const other = new RedisLeaseProvider({ url: server.url, keyPrefix: `inspX${RUN}` })
  await other.acquireLease('not-ours', 'someone', 600_000)
  await other.close()
  // A topic's stream named like a lease, under the same prefix: not a lease.
  await server.cli('XADD', `${prefix}:lease:events`, '*', 'f', 'v')
})

describe('listLeases', () => {
  it('pages through every lease under the prefix exactly once, with owner, token and TTL, and nothing else', async () => {
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const all = await listAll(p, 200)
    expect(all.length).toBe(MANY + 1)
    expect(new Set(all.map((l) => l.key)).size).toBe(MANY + 1)
    expect(all.find((l) => l.key === THREAD)).toEqual({ key: THREAD, owner: 'run-1', token: expect.any(Number), ttlMs: expect.any(Number) })
    expect(all.find((l) => l.key === 'job-8')).toMatchObject({ owner: 'worker-1' })
    expect(all.every((l) => l.ttlMs !== null && l.ttlMs > 590_000 && l.ttlMs <= 600_000)).toBe(true)
    expect(all.some((l) => l.key === 'not-ours' || l.key === 'events')).toBe(false)
  })

  it('lists a lease another client wrote without an expiry with ttlMs null', async () => {
    const own = `insp-no-expiry:${RUN}`
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: own }))
    await server.cli('SET', `${own}:lease:forever`, 'tool')
    await p.acquireLease('timed', 'worker', 600_000)
    const all = await listAll(p)
    expect(all.find((l) => l.key === 'forever')).toEqual({ key: 'forever', owner: 'tool', token: undefined, ttlMs: null })
    expect(all.find((l) => l.key === 'timed')!.ttlMs).toBeGreaterThan(590_000)
  })

  it('refuses an unknown option or a cursor it did not answer with ERR_LEASE_INVALID_OPTION', async () => {
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    await expectRejection(() => p.listLeases({ cursr: '0' } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    await expectRejection(() => p.listLeases({ cursor: 'abc' }), RangeError, 'ERR_LEASE_INVALID_OPTION')
    await expectRejection(() => p.listLeases({ count: 0 }), RangeError, 'ERR_LEASE_INVALID_OPTION')
    await p.close()
    await expectRejection(() => p.listLeases(), Error, 'ERR_LEASE_CLOSED')
  })
})

describe('npx mastra-lease', () => {
  it('list prints one tab-separated line per lease, a thread key as "resource ␀ thread"; --json one object each', async () => {
    const listed = await cli('list', '--url', server.url, '--prefix', prefix)
    expect(listed.code).toBe(0)
    const lines = listed.stdout.trim().split('\n')
    expect(lines.length).toBe(MANY + 1)
    expect(lines).toContainEqual(expect.stringMatching(/^resource-1 \u2400 thread-1\trun-1\t\d+\t\d+$/))
    const json = await cli('list', '--url', server.url, '--prefix', prefix, '--json')
    const rows = json.stdout.trim().split('\n').map((l) => JSON.parse(l) as { key: string; owner: string })
    expect(rows.find((r) => r.key === THREAD)).toMatchObject({ owner: 'run-1', token: expect.any(Number), ttlMs: expect.any(Number) })
  })

  it('get prints the lease (exit 0), or says there is none (exit 1)', async () => {
    const got = await cli('get', 'resource-1 \u2400 thread-1', '--url', server.url, '--prefix', prefix)
    expect(got).toMatchObject({ code: 0, stdout: expect.stringMatching(/^resource-1 \u2400 thread-1\trun-1\t\d+\t\d+\n$/) })
    const missing = await cli('get', 'nope', '--url', server.url, '--prefix', prefix)
    expect(missing).toMatchObject({ code: 1, stdout: '', stderr: expect.stringContaining('no live lease on nope') })
  })

  it('a lease without an expiry shows "never" as its TTL in list and get, and null with --json', async () => {
    const own = `insp-cli-no-expiry:${RUN}`
    await server.cli('SET', `${own}:lease:forever`, 'tool')
    const where = ['--url', server.url, '--prefix', own]
    expect(await cli('list', ...where)).toMatchObject({ code: 0, stdout: 'forever\ttool\tnever\t\n' })
    expect(await cli('get', 'forever', ...where)).toMatchObject({ code: 0, stdout: 'forever\ttool\tnever\t\n' })
    const listed = await cli('list', ...where, '--json')
    expect(JSON.parse(listed.stdout)).toEqual({ key: 'forever', owner: 'tool', ttlMs: null, token: null })
    const got = await cli('get', 'forever', ...where, '--json')
    expect(JSON.parse(got.stdout)).toEqual({ key: 'forever', owner: 'tool', ttlMs: null, token: null })
  })

  it('release deletes only when the owner named holds it: another owner is exit 1 and leaves it, the holder exit 0', async () => {
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const wrong = await cli('release', 'job-1', '--owner', 'worker-9', '--url', server.url, '--prefix', prefix)
    expect(wrong).toMatchObject({ code: 1, stderr: expect.stringContaining('held by worker-1') })
    expect(await p.getLeaseOwner('job-1')).toBe('worker-1')
    const right = await cli('release', 'job-1', '--owner', 'worker-1', '--url', server.url, '--prefix', prefix)
    expect(right).toMatchObject({ code: 0, stdout: expect.stringContaining('released job-1') })
    expect(await p.getLeaseOwner('job-1')).toBeUndefined()
    const thread = await cli('release', 'resource-1\u2400thread-1', '--owner', 'run-1', '--url', server.url, '--prefix', prefix)
    expect(thread.code).toBe(0)
    expect(await p.getLeaseOwner(THREAD)).toBeUndefined()
  })

  it('usage errors are exit 2 (release without --owner included); Redis failing is exit 3, and a password in the URL is never printed', async () => {
    expect((await cli('release', 'job-2', '--url', server.url)).code).toBe(2)
    expect((await cli('list', '--urll', server.url)).code).toBe(2)
    expect((await cli('frobnicate')).code).toBe(2)
    expect((await cli('get')).code).toBe(2)
    expect((await cli('list', '--url', server.url, '--cluster', server.url)).code).toBe(2)
    const down = await cli('list', '--url', `redis://admin:hunter2secret@127.0.0.1:${await freePort()}`)
    expect(down.code).toBe(3)
    expect(down.stderr).toMatch(/ERR_LEASE_(CONNECTION|TIMEOUT)/)
    expect(down.stdout + down.stderr).not.toContain('hunter2secret')
  })
})

describe('on a Redis Cluster', () => {
  let cluster: RedisCluster
  beforeAll(async () => {
    cluster = await startCluster()
  })
  afterAll(async () => {
    await cluster?.stop()
  })

  it('listLeases and `mastra-lease list --cluster` find the leases of every master', async () => {
    const p = closing(new RedisLeaseProvider({ cluster: { nodes: cluster.urls }, keyPrefix: `insp-cluster:${RUN}` }))
    const keys = Array.from({ length: 300 }, (_, i) => `k-${i}`)
    await Promise.all(keys.map((k) => p.acquireLease(k, 'o', 600_000)))
    expect((await cluster.masters()).length).toBeGreaterThan(1)
    expect((await listAll(p, 50)).map((l) => l.key).sort()).toEqual([...keys].sort())
    const listed = await cli('list', '--cluster', cluster.urls[0]!, '--prefix', `insp-cluster:${RUN}`)
    expect(listed.code).toBe(0)
    expect(listed.stdout.trim().split('\n').length).toBe(keys.length)
  })
})
