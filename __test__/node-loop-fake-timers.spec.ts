// Lease calls under vitest's fake timers (@sinonjs/fake-timers) with `queueMicrotask` faked,
// as a test suite of Mastra users' would fake them: every call still settles.
//
// The addon keeps the `queueMicrotask` its thread first finds, so what is under test is the
// first lease call this process makes: that is why this is a file of its own (vitest runs
// each file in a process of its own) and why the Redis test comes first. On a build that
// keeps the fake, every later call of the process hangs too, so nothing else may share the
// file; node-loop-faults.spec.ts has the same fault with a hand-made fake, in a child process.
// `nextTick` is left real: vitest cannot fake it in its child-process pool.
import { beforeAll, describe, expect, it, vi } from 'vitest'

import { MemoryLeaseProvider, RedisLeaseProvider } from '../dist/esm/index.js'
import { closing, leaseSuite, RUN, stopLater } from './helpers/lease-runs.js'
import { startRedis, type RedisServer } from './helpers/redis-server.js'

leaseSuite()

let server: RedisServer
beforeAll(async () => {
  server = stopLater(await startRedis())
})

/** What vitest 4 fakes here: everything it can in a child process, queueMicrotask included. */
const FAKED = ['setTimeout', 'clearTimeout', 'setImmediate', 'clearImmediate', 'setInterval', 'clearInterval', 'queueMicrotask', 'Date'] as const

// Taken before any fake is installed: the bound on each wait.
const realSetTimeout = globalThis.setTimeout
const realClearTimeout = globalThis.clearTimeout

/** The calls' values (or rejection codes), or 'pending' for each that did not settle within `ms`. */
async function settledWithin(calls: Promise<unknown>[], ms: number): Promise<unknown[]> {
  const outcomes: unknown[] = calls.map(() => 'pending')
  let timer: ReturnType<typeof setTimeout> | undefined
  await Promise.race([
    Promise.all(
      calls.map((call, i) =>
        call.then(
          (value) => (outcomes[i] = value),
          (error: unknown) => (outcomes[i] = (error as { code?: unknown }).code ?? String(error)),
        ),
      ),
    ),
    new Promise((resolve) => (timer = realSetTimeout(resolve, ms))),
  ])
  realClearTimeout(timer)
  return outcomes
}

const GRANTED = [{ acquired: true, owner: 'owner' }, 'owner']

describe('lease calls under vitest’s fake timers, queueMicrotask faked', () => {
  it('a RedisLeaseProvider’s calls, this process’s first, settle while the fakes are installed, and a new provider’s once they are gone', async ({ annotate }) => {
    const options = { url: server.url, keyPrefix: `node-loop-fake-timers:${RUN}`, commandTimeoutMs: 1_000, connectTimeoutMs: 1_000 }
    let faked: unknown[]
    vi.useFakeTimers({ toFake: [...FAKED] })
    try {
      const provider = closing(new RedisLeaseProvider(options))
      faked = await settledWithin([provider.acquireLease('faked', 'owner', 10_000), provider.getLeaseOwner('faked')], 3_000)
    } finally {
      vi.useRealTimers()
    }
    const provider = closing(new RedisLeaseProvider(options))
    const real = await settledWithin([provider.acquireLease('real', 'owner', 10_000), provider.getLeaseOwner('real')], 3_000)
    await annotate(`faked: ${JSON.stringify(faked)}; real timers again, a new provider: ${JSON.stringify(real)}`)
    expect({ faked, real }).toEqual({ faked: GRANTED, real: GRANTED })
  }, 15_000)

  it('a MemoryLeaseProvider’s calls settle while the fakes are installed', async () => {
    vi.useFakeTimers({ toFake: [...FAKED] })
    try {
      const provider = closing(new MemoryLeaseProvider())
      expect(await settledWithin([provider.acquireLease('k', 'owner', 10_000), provider.getLeaseOwner('k')], 3_000)).toEqual(GRANTED)
    } finally {
      vi.useRealTimers()
    }
  })
})
