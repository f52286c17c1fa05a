import { Mastra } from '@mastra/core'
import { Agent } from '@mastra/core/agent'
import { UnixSocketPubSub } from '@mastra/core/events'
import { RedisLeaseProvider, withLeases } from 'mastra-lease'

const [socketPath, redisUrl, mode, index] = process.argv.slice(2)
const seen = []
const model = {
  specificationVersion: 'v2', provider: 'mock', modelId: 'mock-1', supportedUrls: {},
  async doGenerate() { throw new Error('no generate') },
  async doStream(options) {
    const users = options.prompt.filter(m => m.role === 'user').map(m => m.content.map(p => p.text).join(''))
    seen.push(users)
    await new Promise(r => setTimeout(r, 500))
    return { stream: new ReadableStream({ start(c) {
      c.enqueue({ type: 'stream-start', warnings: [] })
      c.enqueue({ type: 'text-start', id: 't1' })
      c.enqueue({ type: 'text-delta', id: 't1', delta: 'ok' })
      c.enqueue({ type: 'text-end', id: 't1' })
      c.enqueue({ type: 'finish', finishReason: 'stop', usage: { inputTokens: 1, outputTokens: 1, totalTokens: 2 } })
      c.close()
    } }) }
  },
}
const transport = new UnixSocketPubSub(socketPath)
const pubsub = mode === 'leases' ? withLeases(transport, new RedisLeaseProvider({ url: redisUrl })) : transport
const agent = new Agent({ id: 'a', name: 'a', instructions: 'x', model })
const mastra = new Mastra({ agents: { a: agent }, pubsub, logger: false })
await pubsub.subscribe('warmup', () => {})
process.send({ type: 'ready', index, broker: transport.isBroker })
process.on('message', async (msg) => {
  if (msg.type === 'fire') {
    const rt = mastra.agentThreadStreamRuntime
    const res = rt.sendSignal(mastra.getAgent('a'), { type: 'user-message', contents: `signal ${index}` }, { resourceId: 'r', threadId: 't', ifIdle: { behavior: 'wake' } }, mastra.pubsub)
    const acc = await res.accepted
    let text
    if (acc.output) text = await acc.output.text
    process.send({ type: 'accepted', index, action: acc.action, runId: acc.runId, text })
  } else if (msg.type === 'report') {
    process.send({ type: 'report', index, seen, state: mastra.agentThreadStreamRuntime.getThreadState({ resourceId: 'r', threadId: 't' }, mastra.pubsub) })
  } else if (msg.type === 'exit') { await pubsub.close(); process.exit(0) }
})
