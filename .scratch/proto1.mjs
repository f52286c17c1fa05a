import { Mastra } from '@mastra/core'
import { Agent } from '@mastra/core/agent'
import { EventEmitterPubSub } from '@mastra/core/events'
import { MemoryLeaseProvider, withLeases } from 'mastra-lease'

const calls = []
const inner = new MemoryLeaseProvider()
const spy = {}
for (const m of ['acquireLease','getLeaseOwner','releaseLease','renewLease','transferLease']) {
  spy[m] = async (...args) => { const r = await inner[m](...args); calls.push([m, ...args, r]); return r }
}
const model = {
  specificationVersion: 'v2', provider: 'mock', modelId: 'mock-1', supportedUrls: {},
  async doGenerate() { throw new Error('no generate') },
  async doStream(options) {
    console.log('doStream prompt', JSON.stringify(options.prompt).slice(0, 300))
    await new Promise(r => setTimeout(r, 200))
    return { stream: new ReadableStream({ start(c) {
      c.enqueue({ type: 'stream-start', warnings: [] })
      c.enqueue({ type: 'response-metadata', id: 'r1', modelId: 'mock-1', timestamp: new Date() })
      c.enqueue({ type: 'text-start', id: 't1' })
      c.enqueue({ type: 'text-delta', id: 't1', delta: 'hello' })
      c.enqueue({ type: 'text-end', id: 't1' })
      c.enqueue({ type: 'finish', finishReason: 'stop', usage: { inputTokens: 1, outputTokens: 1, totalTokens: 2 } })
      c.close()
    } }) }
  },
}
const agent = new Agent({ id: 'a', name: 'a', instructions: 'x', model })
const mastra = new Mastra({ agents: { a: agent }, pubsub: withLeases(new EventEmitterPubSub(), spy), logger: false })
const a = mastra.getAgent('a')
const out = await a.stream('hi', { memory: { resource: 'res', thread: 'th' } })
console.log('runId', out.runId)
console.log('owner during', await inner.getLeaseOwner('res\0th'))
console.log('text', await out.text)
await new Promise(r => setTimeout(r, 100))
console.log('owner after', await inner.getLeaseOwner('res\0th'))
console.log(calls)
