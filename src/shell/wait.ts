// Waiting for a lease without polling: a provider tells this process's waiters when a key
// may have been freed, and each waiter also sets a timer at the holder's remaining TTL (an
// expiry, or a release by another library, publishes nothing; a lease without an expiry is
// looked at again every ttlMs of the waiter's, see hold.ts). Within a process, waiters of
// one key take turns in arrival order; across processes, whoever asks first after a release
// wins (docs/waiting.md).
import { RedisLeaseProvider as NativeRedisLeaseProvider } from './native.js'

/** The getter under which a provider (or a pubsub over one) offers its `Waiters`. */
export const releaseWaiters: unique symbol = Symbol('releaseWaiters')

/** Starts listening for `key`'s releases; resolves, once listening, the function that stops. */
export type Watch = (key: string, onRelease: () => void) => Promise<() => void>

/** One key's waiters in arrival order, and how many wake-ups the key has had. */
interface Queue {
  readonly places: WaitingPlace[]
  wakes: number
  /** Listening for the key (resolves the function that stops), for a provider that must. */
  listening: Promise<(() => void) | undefined>
  /** Resolves the head's `until()` early. */
  woken: (() => void) | undefined
}

/** A waiter's place in its key's queue. */
export interface Place {
  /**
   * Resolves once this waiter is first in line (at once when it is) or after `ms`
   * (`Infinity`: no limit), whichever comes first; rejects with `signal`'s reason.
   */
  turn(ms: number, signal: AbortSignal | undefined): Promise<void>
  /** The key's wake-ups so far: a change since a look means "look again now". */
  readonly wakes: number
  /**
   * Resolves at the key's next wake-up or after `ms`, whichever comes first; rejects with
   * `signal`'s reason. Its timer keeps the process alive: the caller is waiting for it.
   */
  until(ms: number, signal: AbortSignal | undefined): Promise<void>
  /** Leaves the queue (the next waiter gets its turn); the last to leave stops listening. */
  leave(): void
}

/** This process's waiters on one provider, key by key. */
export class Waiters {
  private readonly queues = new Map<string, Queue>()

  /** `watch`: how to listen for a key's releases, for a provider that is not told in-process. */
  constructor(private readonly watch?: Watch) {}

  /** Joins `key`'s queue once listening for its releases; rejects when listening failed. */
  async join(key: string): Promise<Place> {
    let queue = this.queues.get(key)
    if (queue === undefined) {
      const listening = this.watch?.(key, () => this.released(key)) ?? Promise.resolve(undefined)
      queue = { places: [], wakes: 0, listening, woken: undefined }
      this.queues.set(key, queue)
    }
    const place = new WaitingPlace(this, key, queue)
    queue.places.push(place)
    try {
      await queue.listening
    } catch (error) {
      place.leave()
      throw error
    }
    return place
  }

  /** `key` may have been freed: its first waiter looks again. */
  released(key: string): void {
    const queue = this.queues.get(key)
    if (queue === undefined) return
    queue.wakes++
    queue.woken?.()
  }

  /** The provider closed: every first waiter looks again (and finds it closed). */
  closed(): void {
    for (const key of this.queues.keys()) this.released(key)
  }

  /** Removes `place`; the next waiter is first now; the last stops listening. */
  left(key: string, queue: Queue, place: WaitingPlace): void {
    const at = queue.places.indexOf(place)
    if (at < 0) return
    queue.places.splice(at, 1)
    if (at === 0) queue.places[0]?.first()
    if (queue.places.length === 0 && this.queues.get(key) === queue) {
      this.queues.delete(key)
      queue.listening.then((stop) => stop?.(), () => {})
    }
  }
}

class WaitingPlace implements Place {
  private becameFirst: (() => void) | undefined

  constructor(
    private readonly waiters: Waiters,
    private readonly key: string,
    private readonly queue: Queue,
  ) {}

  get wakes(): number {
    return this.queue.wakes
  }

  first(): void {
    this.becameFirst?.()
  }

  turn(ms: number, signal: AbortSignal | undefined): Promise<void> {
    if (this.queue.places[0] === this) return Promise.resolve()
    return abortable(ms, signal, (resolve) => {
      this.becameFirst = resolve
      return () => (this.becameFirst = undefined)
    })
  }

  until(ms: number, signal: AbortSignal | undefined): Promise<void> {
    return abortable(ms, signal, (resolve) => {
      this.queue.woken = resolve
      return () => {
        if (this.queue.woken === resolve) this.queue.woken = undefined
      }
    })
  }

  leave(): void {
    this.waiters.left(this.key, this.queue, this)
  }
}

/** The longest a Node timer waits (a longer delay would fire at once). */
const LONGEST_TIMER = 2 ** 31 - 1

/**
 * A promise that `start` resolves, or a timer after `ms` (`Infinity`: none), or that rejects
 * with `signal`'s reason; `start` answers its cleanup, run whichever settles it. The timer
 * keeps the process alive: someone awaits it.
 */
function abortable(ms: number, signal: AbortSignal | undefined, start: (resolve: () => void) => () => void): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason)
    let timer: NodeJS.Timeout | undefined
    const settle = (): void => {
      clearTimeout(timer)
      cleanup()
      signal?.removeEventListener('abort', aborted)
    }
    const done = (): void => {
      settle()
      resolve()
    }
    const aborted = (): void => {
      settle()
      reject(signal?.reason)
    }
    const cleanup = start(done)
    if (ms !== Infinity) timer = setTimeout(done, Math.max(0, Math.min(ms, LONGEST_TIMER)))
    signal?.addEventListener('abort', aborted, { once: true })
  })
}

/** Waiters of the binding's Redis providers (the JS subclass's and the streams pubsub's). */
const redisWaiters = new WeakMap<object, Waiters>()

/** The waiters of `leases`, or `undefined` when it cannot tell waiters about releases. */
export function waitersOf(leases: object): Waiters | undefined {
  const offered = (leases as { [releaseWaiters]?: Waiters })[releaseWaiters]
  if (offered !== undefined) return offered
  if (!(leases instanceof NativeRedisLeaseProvider)) return undefined
  let waiters = redisWaiters.get(leases)
  if (waiters === undefined) {
    waiters = new Waiters(async (key, onRelease) => {
      const id = await leases.watchRelease(key, onRelease)
      return () => leases.unwatchRelease(key, id)
    })
    redisWaiters.set(leases, waiters)
  }
  return waiters
}
