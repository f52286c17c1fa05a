// Soak: a million lease calls from one RedisLeaseProvider (256 in flight)
// against a real redis-server whose client connections are killed over and over
// (`CLIENT KILL TYPE normal` from a side connection). What must hold:
//
// - every call either answers what a fresh key's lifecycle must answer, or rejects with a
//   transport code (ERR_LEASE_CONNECTION / ERR_LEASE_TIMEOUT / ERR_LEASE_OUTCOME_UNKNOWN): a
//   flap never becomes `false`;
// - the client process's memory and active handles stay flat (measured after a warm-up and
//   at the end, after a full GC, in a process of its own started with --expose-gc), and it
//   exits by itself after close();
// - Redis' key count is back to zero once every lease is released or has expired, and the
//   leases left to expire were expired by Redis.
//
// The in-memory store's side (1M expired leases reclaimed) is in
// memory-provider.spec.ts: '1M leases with a 50 ms TTL stop being resident soon after they expire'.
import { spawn, type ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import path from 'node:path'

import { afterEach, describe, expect, it } from 'vitest'

import { sleep } from './helpers/lease.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'

const WORKER = path.join(__dirname, 'fixtures', 'lease-soak-worker.mjs')
const OPS = 1_000_000
const WARMUP_OPS = 150_000
const FLAP_EVERY_MS = 100
const EXPIRE_TTL_MS = 1_500
const MB = 1024 * 1024
// A leak of 20 bytes per call over the 850k calls after the warm-up is 16 MB.
const RSS_GROWTH_LIMIT = 16 * MB

interface Sample {
  ops: number
  rss: number
  heapUsed: number
  external: number
  handles: string[]
}
interface SoakResult {
  stats: {
    ops: number
    fulfilled: number
    rejected: Record<string, number>
    violations: number
    violationSamples: string[]
    lifecycles: number
    completed: number
    expiring: number
    expiringCompleted: number
    abandoned: number
    cleanupOps: number
    made: { acquire: number; fenced: number; renew: number; owner: number; transfer: number; release: number }
    /** Of the renews and transfers made, those on fenced leases. */
    madeOnFenced: { renew: number; transfer: number; release: number }
  }
  soakMs: number
  warm: Sample
  end: Sample
}

const children = new Set<ChildProcess>()
const servers: RedisServer[] = []
afterEach(async () => {
  for (const child of children) child.kill('SIGKILL')
  children.clear()
  await Promise.allSettled(servers.splice(0).map((s) => s.stop()))
})

/** Kill every client connection but our own, every `everyMs`, until `stop()`. */
function flapConnections(server: RedisServer, everyMs: number) {
  let stopped = false
  let flaps = 0
  let killed = 0
  const loop = (async () => {
    while (!stopped) {
      await sleep(everyMs)
      if (stopped) break
      const n = Number(await server.cli('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes'))
      flaps++
      killed += n
    }
  })()
  return {
    async stop() {
      stopped = true
      await loop
      return { flaps, killed }
    },
  }
}

describe.skipIf(EXTERNAL_REDIS)('soak: a million lease calls through connection flaps', () => {
  it('1M calls with the connection killed every 100 ms: coded rejections only, flat memory and handles, and zero keys left', async ({ annotate }) => {
    const server = await startRedis()
    servers.push(server)
    const keyPrefix = `soak:${randomUUID()}`
    const started = performance.now()
    const calls0 = await server.commandCalls()

    const child = spawn(
      process.execPath,
      [
        '--expose-gc',
        WORKER,
        JSON.stringify({
          url: server.url,
          keyPrefix,
          ops: OPS,
          warmupOps: WARMUP_OPS,
          inFlight: 256,
          ttlMs: 30_000,
          expireTtlMs: EXPIRE_TTL_MS,
        }),
      ],
      { stdio: ['pipe', 'pipe', 'pipe'] },
    )
    children.add(child)
    const flapper = flapConnections(server, FLAP_EVERY_MS)
    let flapped: { flaps: number; killed: number } | undefined
    let stderr = ''
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()))
    let result: SoakResult | undefined
    let resulted = () => {}
    let buffered = ''
    child.stdout.on('data', (d: Buffer) => {
      buffered += d.toString()
      for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
        const line = JSON.parse(buffered.slice(0, nl)) as { type: string } & SoakResult
        buffered = buffered.slice(nl + 1)
        if (line.type === 'ops-done') {
          void flapper.stop().then((f) => {
            flapped = f
            child.stdin.end()
          })
        } else if (line.type === 'result') {
          result = line
          resulted()
        }
      }
    })
    // It must exit by itself once it has printed its result: a handle left open keeps it
    // alive, so give it a few seconds, then end it.
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
    await Promise.race([exited, new Promise<void>((r) => (resulted = r))])
    const exitCode = await Promise.race([exited, sleep(10_000).then(() => 'still running' as const)])
    if (exitCode === 'still running') child.kill('SIGKILL')
    children.delete(child)
    flapped ??= await flapper.stop()
    expect(stderr).toBe('')
    expect(result, `no result from the soak process (exit ${String(exitCode)})`).toBeDefined()
    const { stats, warm, end, soakMs } = result!

    // Back to the token counters alone: the released leases (and their tokens) are gone, the
    // expiring ones expire, and one counter stays per hash slot used (at most 16,384).
    const expiredKeys = async () => Number((await server.info('stats')).expired_keys)
    const counter = new RegExp(`^${keyPrefix}:fence:\\{[0-9A-Za-z]+\\}$`)
    const census = async () => {
      const all = (await server.cli('KEYS', `${keyPrefix}:*`)) as string[]
      const counters = all.filter((k) => counter.test(k)).length
      return { leases: all.length - counters, counters }
    }
    let { leases: keys, counters } = await census()
    const keysAtEnd = keys
    // KEYS leaves out a key past its expiry before Redis deletes it (and counts it expired):
    // wait for DBSIZE, which counts it until then, to hold the counters alone.
    const deleted = async () => Number(await server.cli('DBSIZE')) === counters
    const deadline = Date.now() + EXPIRE_TTL_MS + 10_000
    while ((keys > 0 || !(await deleted())) && Date.now() < deadline) {
      await sleep(100)
      ;({ leases: keys, counters } = await census())
    }
    const expired = await expiredKeys()
    const elapsed = performance.now() - started

    const rejected = Object.values(stats.rejected).reduce((a, b) => a + b, 0)
    // The GETs the calls made would run once each (inside their scripts, or as getLeaseOwner):
    // a renew and a transfer of a fenced lease read the lease key and its companion key (its
    // token), of a plain one the lease key alone (one EXISTS finds no companion key); a release
    // of a fenced lease it holds the same two, of a plain one the lease key alone;
    // getLeaseOwner the lease key; an acquire of a fresh key none (its SET NX GET claims it,
    // plain or in the script). A cleanup release reads the lease key, and its companion key at most
    // where it still held the lease (one of a key's two at most). The GETs beyond those come from calls a flap cut off and the provider
    // sent again (a plain acquire sent again finds itself holding, and refreshes in the script).
    const gets = ((await server.commandCalls()).get ?? 0) - (calls0.get ?? 0)
    const made = stats.made
    const onFenced = stats.madeOnFenced
    const renewReads = 2 * onFenced.renew + (made.renew - onFenced.renew)
    const transferReads = 2 * onFenced.transfer + (made.transfer - onFenced.transfer)
    const releaseReads = 2 * onFenced.release + (made.release - onFenced.release)
    const once = renewReads + transferReads + releaseReads + made.owner + stats.cleanupOps + stats.cleanupOps / 2
    const sentAgain = gets - once
    await annotate(
      `[soak] ${stats.ops} calls in ${(soakMs / 1000).toFixed(1)} s (${Math.round(stats.ops / (soakMs / 1000))}/s), ` +
        `${stats.fulfilled} answered, ${rejected} rejected ${JSON.stringify(stats.rejected)}, ${stats.violations} violations; ` +
        `${stats.lifecycles} lifecycles, ${stats.completed} completed (${stats.expiringCompleted} left to expire), ${stats.abandoned} cut short by a flap, ` +
        `${stats.cleanupOps} cleanup releases; ${flapped.flaps} flaps killing ${flapped.killed} connections, ${sentAgain} extra GETs from calls sent again; ` +
        `RSS ${(warm.rss / MB).toFixed(1)} → ${(end.rss / MB).toFixed(1)} MB, heap ${(warm.heapUsed / MB).toFixed(1)} → ` +
        `${(end.heapUsed / MB).toFixed(1)} MB, handles [${warm.handles.join(', ')}] → [${end.handles.join(', ')}]; ` +
        `lease and companion keys ${keysAtEnd} at the end → ${keys}, ${counters} token counters, ${expired} expired by Redis; ` +
        `${(elapsed / 1000).toFixed(1)} s in all`,
    )

    expect(stats.violationSamples, 'wrong answers or uncoded rejections').toEqual([])
    expect(stats.violations).toBe(0)
    expect(stats.ops).toBeGreaterThanOrEqual(OPS)
    // The flaps really hit the provider, and most calls still went through.
    expect(flapped.flaps).toBeGreaterThan(10)
    expect(flapped.killed).toBeGreaterThan(10)
    // A call a flap cuts off goes again on a new connection (coded rejections only when that
    // fails too): Redis ran more calls than were made.
    expect(sentAgain).toBeGreaterThan(0)
    expect(stats.fulfilled).toBeGreaterThan(OPS / 2)
    // Both kinds of acquire were soaked.
    expect(made.acquire).toBeGreaterThan(stats.lifecycles / 3)
    expect(made.fenced).toBeGreaterThan(stats.lifecycles / 3)

    // Flat: what the process holds after the warm-up is what it holds at the end.
    expect(warm.ops).toBeGreaterThanOrEqual(WARMUP_OPS)
    expect(end.rss - warm.rss, 'RSS growth after the warm-up').toBeLessThan(RSS_GROWTH_LIMIT)
    expect(end.heapUsed - warm.heapUsed, 'JS heap growth after the warm-up').toBeLessThan(8 * MB)
    // No handle at the end that was not there after the warm-up (stdin ends in between).
    const left = [...warm.handles]
    const added = end.handles.filter((h) => {
      const i = left.indexOf(h)
      if (i < 0) return true
      left.splice(i, 1)
      return false
    })
    expect(added, `handles: [${warm.handles.join(', ')}] → [${end.handles.join(', ')}]`).toEqual([])
    expect(exitCode, 'the soak process exits by itself after close()').toBe(0)

    // No lease or token key left, the counters bounded, and Redis itself expired the leases
    // left to expire.
    expect(keys).toBe(0)
    expect(counters).toBeGreaterThan(0)
    expect(counters).toBeLessThanOrEqual(16_384)
    expect(stats.expiringCompleted).toBeGreaterThan(1_000)
    expect(expired, 'leases expired by Redis').toBeGreaterThanOrEqual(stats.expiringCompleted)
  }, 90_000)
})
