// The job mastra-lease does for Mastra, shown without Mastra: several workers receive
// messages for the same conversation thread; exactly one owns the thread and runs the agent,
// the others route their messages to it. The owner renews its lease every TTL/3, hands the
// thread to a follow-up run without ever leaving it free, then releases it.
//
// Runs on the embedded in-memory provider; set REDIS_URL to run the same job on Redis.
import { randomUUID } from 'node:crypto'
import { MemoryLeaseProvider, RedisLeaseProvider } from 'mastra-lease'

const TTL_MS = 1_500
const url = process.env.REDIS_URL
const leases = url
  ? new RedisLeaseProvider({ url, keyPrefix: `mastra-lease-demo:${process.pid}`, commandTimeoutMs: 1_000 })
  : new MemoryLeaseProvider()
const backend = url ? `Redis at ${url.replace(/\/\/[^@]*@/, '//***@')}` : 'the in-memory provider'
console.log(`mastra-lease demo on ${backend}`)

// Mastra's thread keys are resourceId + NUL + threadId.
const thread = `user-42\0thread-7`
const workers = ['worker-a', 'worker-b', 'worker-c'].map((name) => ({ name, runId: `${name}:${randomUUID()}` }))

// 1. Every worker receives a message at the same moment and races for the thread.
const grants = await Promise.all(workers.map((w) => leases.acquireLease(thread, w.runId, TTL_MS)))
const winners = grants.filter((g) => g.acquired)
console.log(`\n1. ${workers.length} workers race for the thread: ${winners.length} wins`)
workers.forEach((w, i) =>
  console.log(grants[i].acquired ? `   ${w.name} owns it and runs the agent` : `   ${w.name} routes its message to ${grants[i].owner}`),
)
if (winners.length !== 1) throw new Error('exactly one worker must own the thread')
const owner = winners[0].owner

// 2. The owner keeps its lease alive by renewing every TTL/3 while the run lasts.
const renewals = []
for (let i = 0; i < 4; i++) {
  await new Promise((r) => setTimeout(r, TTL_MS / 3))
  renewals.push(await leases.renewLease(thread, owner, TTL_MS))
}
console.log(`\n2. the run outlives its TTL (${TTL_MS} ms) by renewing: ${renewals.join(', ')}`)
console.log(`   a late worker still sees the owner: ${await leases.getLeaseOwner(thread)}`)

// 3. A queued follow-up takes over the same thread with no gap for a racer to slip into.
const followUp = `follow-up:${randomUUID()}`
const racer = leases.acquireLease(thread, 'racer', TTL_MS)
const moved = await leases.transferLease(thread, owner, followUp, TTL_MS)
const raced = await racer
console.log(`\n3. transfer to the follow-up run: ${moved}; a racer at that moment wins: ${raced.acquired}`)
console.log(`   the old owner's renewals now fail: renewLease -> ${await leases.renewLease(thread, owner, TTL_MS)}`)

// 4. Done: release. Only the holder can release; anyone else's release is a no-op.
await leases.releaseLease(thread, owner)
console.log(`\n4. a stale release by the old owner changes nothing: owner is ${await leases.getLeaseOwner(thread)}`)
await leases.releaseLease(thread, followUp)
console.log(`   after the follow-up releases, the owner is ${await leases.getLeaseOwner(thread)}`)

// 5. Bad input is refused before anything is touched.
const refused = await leases.acquireLease(thread, 'x', 0).catch((err) => err)
console.log(`\n5. acquireLease with ttlMs 0 -> ${refused.name} ${refused.code}: ${refused.message}`)

// 6. A lease record names the run too: one worker id, two runs, two holders.
const first = await leases.acquireLease(thread, 'worker-a', TTL_MS, 'run-1')
const second = await leases.acquireLease(thread, 'worker-a', TTL_MS, 'run-2')
console.log(`\n6. worker-a for run-1: ${first.acquired}; worker-a for run-2: ${second.acquired}`)
console.log(`   the record: ${JSON.stringify(await leases.getLeaseRecord(thread))}`)
await leases.releaseLease(thread, 'worker-a', 'run-1')

await leases.close()
