// How often this process's runtime thread (named `mastra-lease`) was switched to: a lease call
// that crosses to it and back wakes it twice, one run on Node's own loop not at all
// (node-loop.spec.ts, and tls.spec.ts for rediss://).
import { existsSync, readdirSync, readFileSync } from 'node:fs'

import type { LeaseProvider } from '@mastra/core/events'
import { expect } from 'vitest'

/** The context switches of this process's runtime thread so far; undefined without /proc. */
export function runtimeThreadSwitches(): number | undefined {
  const tasks = '/proc/self/task'
  if (!existsSync(tasks)) return undefined
  for (const tid of readdirSync(tasks)) {
    let comm: string
    try {
      comm = readFileSync(`${tasks}/${tid}/comm`, 'utf8').trim()
    } catch {
      continue // the thread ended meanwhile
    }
    if (comm !== 'mastra-lease') continue
    const status = readFileSync(`${tasks}/${tid}/status`, 'utf8')
    const count = (name: string) => Number(/^(\w+):\s+(\d+)$/m.exec(status.split('\n').find((l) => l.startsWith(name)) ?? '')?.[2] ?? NaN)
    return count('voluntary_ctxt_switches') + count('nonvoluntary_ctxt_switches')
  }
  return undefined
}

/**
 * How often the runtime's thread was switched to while `provider` made 2,000 lease calls one
 * after another (acquire, renew, read, release on ten keys), each answer checked; connected
 * first, so the count leaves the connection out. Undefined without /proc.
 */
export async function switchesOver2000Calls(
  provider: Pick<LeaseProvider, 'acquireLease' | 'renewLease' | 'getLeaseOwner' | 'releaseLease'>,
): Promise<number | undefined> {
  expect(await provider.acquireLease('warm', 'owner', 10_000)).toEqual({ acquired: true, owner: 'owner' })
  const before = runtimeThreadSwitches()
  if (before === undefined) return undefined
  for (let i = 0; i < 500; i++) {
    const key = `k${i % 10}`
    expect(await provider.acquireLease(key, 'owner', 10_000)).toEqual({ acquired: true, owner: 'owner' })
    expect(await provider.renewLease(key, 'owner', 10_000)).toBe(true)
    expect(await provider.getLeaseOwner(key)).toBe('owner')
    await provider.releaseLease(key, 'owner')
  }
  return runtimeThreadSwitches()! - before
}
