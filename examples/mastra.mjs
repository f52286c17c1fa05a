// A small Mastra project on mastra-lease: one agent (a local model, no network, no API key),
// Mastra's EventEmitterPubSub for events and our lease provider for thread ownership. One
// thread turn runs: Mastra takes the lease on resourceId + "\0" + threadId in our provider,
// with the run's id as owner, and releases it when the turn ends.
//
// In-memory leases by default; set REDIS_URL to lease on Redis. After `npm run build`:
//   node examples/mastra.mjs          (Node >= 22.13, as Mastra requires)
import { randomUUID } from 'node:crypto'
import { Mastra } from '@mastra/core'
import { Agent } from '@mastra/core/agent'
import { EventEmitterPubSub } from '@mastra/core/events'
import { MemoryLeaseProvider, RedisLeaseProvider, withLeases } from 'mastra-lease'

const [major, minor] = process.versions.node.split('.').map(Number)
if (major < 22 || (major === 22 && minor < 13)) throw new Error(`Mastra needs Node >= 22.13, this is ${process.version}`)

const url = process.env.REDIS_URL
const leases = url ? new RedisLeaseProvider({ url }) : new MemoryLeaseProvider()
const resourceId = 'user-42'
const threadId = `thread-${randomUUID()}`
const key = `${resourceId}\0${threadId}`

// A language model implementing the AI SDK v2 interface. While it answers, it looks at who
// holds the thread's lease in our provider.
let ownerDuringTurn
const reply = (text) => [
  { type: 'stream-start', warnings: [] },
  { type: 'text-start', id: '1' },
  { type: 'text-delta', id: '1', delta: text },
  { type: 'text-end', id: '1' },
  { type: 'finish', finishReason: 'stop', usage: { inputTokens: 1, outputTokens: 1, totalTokens: 2 } },
]
const model = {
  specificationVersion: 'v2',
  provider: 'local',
  modelId: 'echo',
  supportedUrls: {},
  async doGenerate() {
    throw new Error('this example only streams')
  },
  async doStream({ prompt }) {
    ownerDuringTurn = await leases.getLeaseOwner(key)
    const question = prompt.findLast((m) => m.role === 'user').content.map((p) => p.text).join('')
    const parts = reply(`You said: ${question}`)
    return { stream: new ReadableStream({ start: (c) => (parts.forEach((p) => c.enqueue(p)), c.close()) }) }
  },
}

const mastra = new Mastra({
  agents: { assistant: new Agent({ id: 'assistant', name: 'assistant', instructions: 'Echo the user.', model }) },
  pubsub: withLeases(new EventEmitterPubSub(), leases),
  logger: false,
})
console.log(`Mastra with leases on ${url ? 'Redis' : 'the in-memory provider'}`)

const output = await mastra.getAgent('assistant').stream('Hello, Mastra!', {
  memory: { resource: resourceId, thread: threadId },
})
console.log(`reply: ${await output.text}`)
console.log(`while the model answered, our provider's lease on the thread was held by ${ownerDuringTurn}`)
console.log(`that is this run's id: ${ownerDuringTurn === output.runId}`)

// Mastra releases the lease just after the turn ends (fire-and-forget); give it a moment.
let ownerAfter = await leases.getLeaseOwner(key)
for (let i = 0; i < 50 && ownerAfter !== undefined; i++) {
  await new Promise((r) => setTimeout(r, 20))
  ownerAfter = await leases.getLeaseOwner(key)
}
console.log(`after the turn: ${ownerAfter === undefined ? 'released' : `still held by ${ownerAfter}`}`)

await mastra.pubsub.close()
if (ownerDuringTurn !== output.runId || ownerAfter !== undefined) process.exitCode = 1
