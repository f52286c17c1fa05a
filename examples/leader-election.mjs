// Leader election: several replicas of one Mastra app, and only the holder of the
// `scheduler` lease runs the scheduled workflow. Kill the holder and another replica takes
// over once the lease's TTL has run out; the old leader, if it was only cut off, stops the
// moment its lease is lost (its `lease.signal` aborts) instead of running alongside.
//
// Start a few in separate terminals (Node >= 22.13, after `npm run build`):
//   REDIS_URL=redis://127.0.0.1:6379 node examples/leader-election.mjs replica-1
//   REDIS_URL=redis://127.0.0.1:6379 node examples/leader-election.mjs replica-2
// Each prints one JSON line per event: {"replica","event":"leader"|"ran"|"lost"|"follower", ...}.
// TTL_MS (default 3000) and EVERY_MS (default 500, how often the leader runs the workflow)
// tune it; KEY_PREFIX keeps several demos on one server apart.
import { setTimeout as sleep } from 'node:timers/promises'

import { Mastra } from '@mastra/core'
import { createStep, createWorkflow } from '@mastra/core/workflows'
import { RedisLeaseProvider } from 'mastra-lease'
import { z } from 'zod'

const replica = process.argv[2] ?? `replica-${process.pid}`
const url = process.env.REDIS_URL
if (!url) throw new Error('set REDIS_URL: the replicas elect their leader through Redis')
const ttlMs = Number(process.env.TTL_MS ?? 3_000)
const everyMs = Number(process.env.EVERY_MS ?? 500)
const say = (event, fields = {}) => console.log(JSON.stringify({ replica, event, ...fields }))

// The scheduled job: a one-step Mastra workflow. `token` is the lease's fencing token: a
// store the report goes to can refuse writes carrying a lower one than it has seen.
const tick = z.object({ replica: z.string(), tick: z.number(), token: z.number() })
const report = createStep({
  id: 'report',
  inputSchema: tick,
  outputSchema: z.object({ line: z.string() }),
  execute: async ({ inputData: { replica, tick, token } }) => ({ line: `report #${tick} by ${replica} (token ${token})` }),
})
const workflow = createWorkflow({ id: 'report', inputSchema: tick, outputSchema: z.object({ line: z.string() }) })
  .then(report)
  .commit()
const mastra = new Mastra({ workflows: { report: workflow }, logger: false })

const leases = new RedisLeaseProvider({ url, keyPrefix: process.env.KEY_PREFIX ?? 'leader-election' })
const stopping = new AbortController()
for (const signal of ['SIGINT', 'SIGTERM']) process.once(signal, () => stopping.abort(new Error(signal)))

/** Runs the workflow every `everyMs` for as long as `lease` is held. */
async function lead(lease) {
  say('leader', { token: lease.token })
  for (let ticks = 1; !lease.signal.aborted; ticks++) {
    const run = await mastra.getWorkflow('report').createRun()
    const result = await run.start({ inputData: { replica, tick: ticks, token: lease.token } })
    if (lease.signal.aborted) break // lost while it ran: a store checking tokens refuses its write
    say('ran', { line: result.result?.line, status: result.status })
    await sleep(everyMs, undefined, { signal: lease.signal }).catch(() => {})
  }
  if (!stopping.signal.aborted) say('lost', { code: lease.signal.reason?.code })
}

let leader
while (!stopping.signal.aborted) {
  let lease
  try {
    lease = await leases.hold('scheduler', replica, { ttlMs, signal: stopping.signal })
  } catch (error) {
    if (stopping.signal.aborted) break
    if (error?.code !== 'ERR_LEASE_HELD') say('error', { code: error?.code, message: String(error?.message ?? error) })
    else if (error.owner !== leader) say('follower', { leader: (leader = error.owner) })
    // Ask again after a third of the TTL: a dead leader's lease lapses a TTL after its last renewal.
    await sleep(ttlMs / 3, undefined, { signal: stopping.signal }).catch(() => {})
    continue
  }
  try {
    await lead(lease)
  } finally {
    await lease.release() // on SIGTERM too: a follower takes over without waiting out the TTL
  }
}
await leases.close()
