// How often this process's runtime thread (named `mastra-lease`) was switched to: a lease call
// that crosses to it and back wakes it twice, one run on Node's own loop not at all
// (node-loop.spec.ts, and tls.spec.ts for rediss://).
import { existsSync, readdirSync, readFileSync } from 'node:fs'

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
