// RedisStreamsPubSub as a serverless invocation uses it: construct, take work, settle it
// without awaiting, close, exit. What an invocation settled before close() must reach Redis
// before close() resolves: an ack still in flight when the process exits leaves the entry
// pending, and a sibling runs the job again after reclaimIdleMs; a nack lost so is never
// redelivered at all. End to end: invocations that take a thread's lease for each job, some
// SIGKILLed mid-run, history-checked.
import './helpers/mastra-node.js' // first: fails clearly on Node < 22.13, before Mastra loads

import path from 'node:path'

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub, type RedisStreamsPubSubOptions } from '../dist/esm/index.js'
import { jsonLinesChild, type Line } from './helpers/json-lines-child.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'
import { EXTERNAL_REDIS, startRedis, type RedisServer } from './helpers/redis-server.js'
import { ev, Inbox, sleep, uniquePrefix } from './helpers/streams.js'
import { entries, pendingCount, range, streamsSuite } from './helpers/streams-suite.js'

const INVOCATION = path.join(__dirname, 'fixtures', 'invocation-process.mjs')

let redis: RedisServer
beforeAll(async () => {
  redis = await startRedis()
})
afterAll(async () => {
  await redis?.stop()
})
const { open } = streamsSuite(() => redis)

/** Runs the invocation fixture to its end (killed after `timeoutMs`): its exit code, its lines and its stderr. */
async function invocation(config: Record<string, unknown>, timeoutMs = 20_000) {
  const child = jsonLinesChild(INVOCATION, config)
  const timer = setTimeout(child.kill, timeoutMs)
  const { code } = await child.exited
  clearTimeout(timer)
  return { code, said: child.lines, stderr: child.stderr() }
}

const JOBS = 5

/** Blocks this thread (Node's loop with it) for `ms`. */
const blockThread = (ms: number) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms)

/** Where a run's stream lives, and how to read its group's state back. */
interface Deployment {
  options: RedisStreamsPubSubOptions
  /** XPENDING's count and the stream's entries. */
  pending(key: string): Promise<number>
  entries(key: string): Promise<Array<[string, string[]]>>
}

/**
 * `runs` invocations, `parallel` at a time: each takes the 5 jobs published for it, settles
 * them `how` in one turn without awaiting, closes and exits. Answers how many runs lost
 * something: an entry left pending, or (for nacks) a job not appended again as attempt 2.
 */
async function settleRuns(where: Deployment, how: 'ack' | 'nack', through: 'callback' | 'pull-transport', runs: number, parallel: number) {
  let lost = 0
  const failures: string[] = []
  const one = async (run: number) => {
    const prefix = uniquePrefix(`invocation-${how}-${run}`)
    const key = `${prefix}:jobs`
    const own = new RedisStreamsPubSub({ ...where.options, keyPrefix: prefix })
    for (let n = 1; n <= JOBS; n++) await own.publish('jobs', ev(n))
    await own.close()
    const { code, said, stderr } = await invocation({
      mode: 'settle',
      options: { ...where.options, keyPrefix: prefix },
      topic: 'jobs',
      group: 'workers',
      count: JOBS,
      how,
      through,
    })
    if (code !== 0 || !said.some((l) => l.type === 'closed')) failures.push(`run ${run}: exit ${code}, ${stderr}`)
    const pending = await where.pending(key)
    // The jobs present at attempt 2. A job may be there twice: the invocation's group reader
    // may read a nacked job's new entry before it stops, and hand it back unchanged.
    const redelivered = new Set(
      (await where.entries(key))
        .map(([, fields]) => JSON.parse(fields[1]!) as { data: { n: number }; deliveryAttempt?: number })
        .filter((event) => event.deliveryAttempt === 2)
        .map((event) => event.data.n),
    ).size
    if (pending > 0 || (how === 'nack' && redelivered !== JOBS)) lost++
  }
  for (let run = 0; run < runs; run += parallel) {
    await Promise.all(Array.from({ length: Math.min(parallel, runs - run) }, (_, i) => one(run + i)))
  }
  expect(failures).toEqual([])
  return lost
}

describe('an invocation that settles its events and closes loses none of them', () => {
  const single = (): Deployment => ({
    options: { url: redis.url },
    pending: (key) => pendingCount(redis, key, 'workers'),
    entries: (key) => entries(redis, key),
  })

  it.skipIf(EXTERNAL_REDIS)('a worker process that acks its jobs without awaiting, then closes and exits, leaves none pending, run after run', async ({ annotate }) => {
    const lost = await settleRuns(single(), 'ack', 'callback', 30, 4)
    await annotate(`acks lost in ${lost} of 30 invocations`)
    expect(lost).toBe(0)
  })

  it.skipIf(EXTERNAL_REDIS)("a worker process whose jobs Mastra's PullTransport acks without awaiting, then closes and exits, leaves none pending", async ({ annotate }) => {
    const lost = await settleRuns(single(), 'ack', 'pull-transport', 20, 4)
    await annotate(`PullTransport acks lost in ${lost} of 20 invocations`)
    expect(lost).toBe(0)
  })

  it.skipIf(EXTERNAL_REDIS)('a worker process that nacks its jobs without awaiting, then closes and exits, has each redelivered as attempt 2, run after run', async ({ annotate }) => {
    const lost = await settleRuns(single(), 'nack', 'callback', 20, 4)
    await annotate(`nacks lost in ${lost} of 20 invocations`)
    expect(lost).toBe(0)
  })

  it('in one process, acks and nacks made in the turn of close() have reached Redis when close() resolves, round after round', async ({ annotate }) => {
    const rounds = 200
    const lost: string[] = []
    let handedBack = 0
    for (let round = 0; round < rounds; round++) {
      const prefix = uniquePrefix(`invocation-in-process-${round}`)
      const key = `${prefix}:jobs`
      const publisher = open({ keyPrefix: prefix })
      for (let n = 1; n <= JOBS; n++) await publisher.publish('jobs', ev(n))
      const worker = new RedisStreamsPubSub({ url: redis.url, keyPrefix: prefix, reclaimIntervalMs: 0 })
      const settles: Array<() => Promise<void>> = []
      // Odd jobs acked, even ones nacked.
      const inbox = new Inbox((event, ack, nack) => void settles.push(event.data && (event.data as { n: number }).n % 2 ? ack : nack))
      await worker.subscribe('jobs', inbox.cb, { group: 'workers' })
      await inbox.count(JOBS)
      for (const settle of settles) void settle()
      await worker.close()
      const outcome = await settledJobs(key)
      // The closing worker's reader may read a nacked job's new entry before it stops, and
      // hand it back unchanged (appended again, the read one acked): a second copy of that
      // job at attempt 2, nothing lost.
      handedBack += outcome.attempt2 - outcome.redelivered.length
      if (outcome.pending > 0 || outcome.redelivered.join() !== '2,4' || outcome.later > 0) {
        lost.push(`round ${round}: ${JSON.stringify(outcome)}`)
      }
    }
    await annotate(`settles lost in ${lost.length} of ${rounds} closes (nacked jobs read again by the closing reader and handed back: ${handedBack})`)
    expect(lost).toEqual([])
  })

  /**
   * What a round left in Redis: the group's pending count, the jobs present at attempt 2
   * (each nacked job once appended again: 2 and 4), how many entries are at attempt 2, and
   * how many at a later attempt (none: nothing was nacked twice); `entries` lists them all
   * (`id n attempt`), for the report of a round that lost something.
   */
  async function settledJobs(key: string) {
    const all = (await entries(redis, key)).map(([id, fields]) => {
      const event = JSON.parse(fields[1]!) as { data: { n: number }; deliveryAttempt?: number }
      return { id, n: event.data.n, attempt: event.deliveryAttempt ?? 1 }
    })
    const atTwo = all.filter((e) => e.attempt === 2)
    return {
      pending: await pendingCount(redis, key, 'workers'),
      redelivered: [...new Set(atTwo.map((e) => e.n))].sort((a, b) => a - b),
      attempt2: atTwo.length,
      later: all.filter((e) => e.attempt > 2).length,
      entries: all.map((e) => `${e.id} ${e.n} ${e.attempt}`),
    }
  }
})

describe.skipIf(EXTERNAL_REDIS)('on a Redis Cluster, an invocation that settles its events and closes loses none of them', () => {
  let cluster: RedisCluster
  beforeAll(async () => {
    cluster = await startCluster({ replicasPerMaster: 0 })
  }, 60_000)
  afterAll(async () => {
    await cluster?.stop()
  })
  const clustered = (): Deployment => {
    const master = async (key: string) => cluster.masterOfSlot(await cluster.keySlot(key))
    return {
      options: { cluster: { nodes: cluster.urls } },
      pending: async (key) => Number(((await (await master(key)).cli('XPENDING', key, 'workers')) as unknown[])[0]),
      entries: async (key) => (await (await master(key)).cli('XRANGE', key, '-', '+')) as Array<[string, string[]]>,
    }
  }

  it('worker processes that ack or nack their jobs without awaiting, then close and exit, leave none pending', async ({ annotate }) => {
    const acks = await settleRuns(clustered(), 'ack', 'callback', 20, 5)
    const nacks = await settleRuns(clustered(), 'nack', 'callback', 15, 5)
    await annotate(`cluster: acks lost in ${acks} of 20 invocations, nacks in ${nacks} of 15`)
    expect({ acks, nacks }).toEqual({ acks: 0, nacks: 0 })
  })

  // On a cluster the transport's calls go on the runtime's threads, not Node's loop. An ack
  // or publish made while a flush waits for an earlier one is not the flush's to wait for,
  // but it is close()'s: it leaves at the end of its turn, which may be after close() began.
  it('an ack and a publish made while a flush waits, in the turn of close(), have reached Redis when close() resolves', async () => {
    const prefix = uniquePrefix('ack-behind-flush')
    const key = `${prefix}:jobs`
    const worker = new RedisStreamsPubSub({ cluster: { nodes: cluster.urls }, keyPrefix: prefix, reclaimIntervalMs: 0, blockMs: 100 })
    for (let n = 1; n <= 2; n++) await worker.publish('jobs', ev(n))
    const acks: Array<() => Promise<void>> = []
    const inbox = new Inbox((_event, ack) => void acks.push(ack))
    await worker.subscribe('jobs', inbox.cb, { group: 'workers' })
    await inbox.count(2)
    const master = await cluster.masterOfSlot(await cluster.keySlot(key))
    // Every write (XACK among them) waits on the master for 500 ms.
    await master.cli('CLIENT', 'PAUSE', 500, 'WRITE')
    void acks[0]!()
    await sleep(50) // the first ack is waiting in Redis
    void worker.flush() // waits for it
    blockThread(50) // the flush's wait has begun
    void acks[1]!()
    const published = worker.publish('jobs', ev(3)).then(
      () => 'published',
      (err: unknown) => String(err),
    )
    const closed = worker.close()
    // This turn, and with it the second ack's and the publish's send, ends after the pause:
    // the first ack and the flush are done by then, and close() has gone on.
    blockThread(1_500)
    await closed
    expect(await published).toBe('published')
    const jobs = ((await master.cli('XRANGE', key, '-', '+')) as Array<[string, string[]]>).map(([, fields]) => JSON.parse(fields[1]!).data.n)
    expect({ pending: Number(((await master.cli('XPENDING', key, 'workers')) as unknown[])[0]), jobs }).toEqual({ pending: 0, jobs: [1, 2, 3] })
  })
})


describe.skipIf(EXTERNAL_REDIS)('invocations end to end: each takes the lease of its jobs\' threads, runs them, acks without awaiting, hands the lease on, closes and exits', () => {
  it('with some invocations SIGKILLed mid-run: no two owners of a thread at once, no job lost, no job an invocation acked before it closed run again', { timeout: 90_000 }, async ({ annotate }) => {
    const JOBS_IN_ALL = 60
    const THREADS = 4
    const prefix = uniquePrefix('invocations-e2e')
    const key = `${prefix}:jobs`
    // Each invocation holds a few jobs at a time, as a function sized for its share does.
    const options = { url: redis.url, keyPrefix: prefix, reclaimIntervalMs: 300, reclaimIdleMs: 800, maxInFlight: 3, batchCount: 3 }
    const publisher = open({ keyPrefix: prefix })
    for (let n = 1; n <= JOBS_IN_ALL; n++) await publisher.publish('jobs', { type: 'job', runId: 'e2e', data: { n, thread: `thread-${n % THREADS}` } })

    const lines: Array<Line & { invocation: string }> = []
    const killedAt = new Map<string, bigint>()
    const clean = new Set<string>()
    const finished = () => {
      const ended = new Set(lines.filter((l) => l.type === 'end').map((l) => l.n))
      return ended.size === JOBS_IN_ALL
    }
    let spawned = 0
    const run = async (invocation: string, kill: boolean) => {
      const config = { mode: 'work', options, topic: 'jobs', group: 'workers', invocation, ttlMs: 1_000, jobs: 5, idleMs: 600, stepMs: 40 }
      let starts = 0
      const child = jsonLinesChild(INVOCATION, config, (line) => {
        lines.push({ ...line, invocation })
        // Killed in the middle of its second job (a step takes 40 ms).
        if (kill && line.type === 'start' && ++starts === 2) {
          setTimeout(() => {
            killedAt.set(invocation, process.hrtime.bigint())
            child.kill()
          }, 5 + Math.random() * 20)
        }
      })
      const { code, signal } = await child.exited
      if (signal === 'SIGKILL') return
      if (code !== 0) throw new Error(`invocation ${invocation} exited ${code}: ${child.stderr()}`)
      clean.add(invocation)
    }
    const deadline = Date.now() + 60_000
    const running = new Set<Promise<void>>()
    while (!(finished() && (await pendingCount(redis, key, 'workers')) === 0)) {
      expect(Date.now(), 'every job done within a minute').toBeLessThan(deadline)
      while (running.size < 3) {
        const invocation = `inv-${++spawned}`
        const one = run(invocation, spawned % 3 === 2).finally(() => running.delete(one))
        running.add(one)
      }
      await Promise.race([...running, sleep(200)])
    }
    await Promise.all(running)

    // No two owners of a thread at once: each job's run, from its start to its end (or to the
    // kill of its invocation), against every other invocation's on the same thread.
    const runs = lines
      .filter((l) => l.type === 'start')
      .map((start) => {
        const end = lines.find((l) => l.type === 'end' && l.invocation === start.invocation && l.n === start.n)
        const until = end ? BigInt(end.at as string) : killedAt.get(start.invocation)
        return { thread: start.thread as string, n: start.n as number, owner: start.invocation, from: BigInt(start.at as string), until }
      })
    const overlaps = runs.flatMap((a, i) =>
      runs.slice(i + 1).filter((b) => a.thread === b.thread && a.owner !== b.owner && a.from < (b.until ?? a.from + 1n) && b.from < (a.until ?? b.from + 1n)).map((b) => `${a.thread}: job ${a.n} of ${a.owner} and job ${b.n} of ${b.owner}`),
    )
    expect(runs.filter((r) => r.until === undefined), 'a run that neither ended nor was killed').toEqual([])
    expect(overlaps, 'two owners of a thread at once').toEqual([])
    // No job lost: each ran to its end, and nothing is left pending.
    const ended = new Set(lines.filter((l) => l.type === 'end').map((l) => l.n as number))
    expect([...ended].sort((a, b) => a - b)).toEqual(range(1, JOBS_IN_ALL))
    // No job acked by an invocation that closed cleanly ran again after that.
    const ackedThenRun = lines
      .filter((l) => l.type === 'closed')
      .flatMap((closed) =>
        (closed.acked as number[]).flatMap((n) => {
          const end = lines.find((l) => l.type === 'end' && l.invocation === closed.invocation && l.n === n)!
          return lines.filter((l) => l.type === 'start' && l.n === n && BigInt(l.at as string) > BigInt(end.at as string)).map((l) => `job ${n}, acked by ${closed.invocation}, ran again by ${l.invocation}`)
        }),
      )
    expect(ackedThenRun).toEqual([])
    const reruns = runs.length - JOBS_IN_ALL
    await annotate(
      `${spawned} invocations (${killedAt.size} SIGKILLed, ${clean.size} closed cleanly), ${runs.length} job runs for ${JOBS_IN_ALL} jobs (${reruns} again after a kill), 0 overlaps, 0 lost, 0 acked jobs run again`,
    )
  })
})
