// Small pieces shared by the RedisStreamsPubSub suites: an event inbox a test can wait on,
// events to publish, unique key prefixes, and a recording logger.
import { randomUUID } from 'node:crypto'

import type { Event, EventCallback } from '@mastra/core/events'

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms))

const run = randomUUID().slice(0, 8)
let counter = 0
/** A key prefix no other test (or earlier run against a shared REDIS_URL) uses. */
export const uniquePrefix = (label: string) => `test:${run}:${++counter}:${label}`

/** What a test publishes: Mastra's event shape without `id` and `createdAt`. */
export type Publishable = Omit<Event, 'id' | 'createdAt'>

/** Event number `n` of a test: `{ type: 'test', runId, data: { n } }`. */
export const ev = (n: number, runId = 'run-1'): Publishable => ({ type: 'test', runId, data: { n } })

/** The `data.n` of a delivered event. */
export const numberOf = (event: Event): number => (event.data as { n: number }).n

type Handler = (event: Event, ack: () => Promise<void>, nack: () => Promise<void>) => void | Promise<void>

/**
 * A subscriber callback that records every delivery and lets the test wait for them.
 * By default it acks each event; pass a handler to do something else.
 */
export class Inbox {
  readonly events: Event[] = []
  private waiters: Array<() => void> = []
  readonly cb: EventCallback

  constructor(handler: Handler = (_event, ack) => ack()) {
    this.cb = (event, ack, nack) => {
      this.events.push(event)
      for (const wake of this.waiters.splice(0)) wake()
      return handler(event, ack ?? (async () => {}), nack ?? (async () => {}))
    }
  }

  get numbers(): number[] {
    return this.events.map(numberOf)
  }

  /** Resolves once `done(events)` holds; rejects after `ms` naming `what`. */
  async until(done: (events: Event[]) => boolean, ms: number, what: string): Promise<Event[]> {
    const deadline = Date.now() + ms
    while (!done(this.events)) {
      const left = deadline - Date.now()
      if (left <= 0) {
        throw new Error(`timed out after ${ms} ms waiting for ${what}; got ${JSON.stringify(this.events.map((e) => e.data))}`)
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.min(left, 50))
        this.waiters.push(() => {
          clearTimeout(timer)
          resolve()
        })
      })
    }
    return this.events
  }

  /** Resolves once at least `n` events arrived. */
  count(n: number, ms = 5_000): Promise<Event[]> {
    return this.until((events) => events.length >= n, ms, `${n} event(s)`)
  }
}

export interface LogLine {
  level: 'debug' | 'warn'
  message: string
  fields: Record<string, unknown> | undefined
}

/** A logger shaped like Mastra's (`debug`, `warn`) that records what it was told. */
export function recordingLogger() {
  const lines: LogLine[] = []
  return {
    lines,
    warnings: () => lines.filter((l) => l.level === 'warn'),
    debug(message: string, fields?: Record<string, unknown>) {
      lines.push({ level: 'debug', message, fields })
    },
    warn(message: string, fields?: Record<string, unknown>) {
      lines.push({ level: 'warn', message, fields })
    },
  }
}
