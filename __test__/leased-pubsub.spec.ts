// LeasedPubSub is pure delegation: every PubSub member goes to the transport with its exact
// arguments and result, every lease method to the lease provider. The transport here is a
// real subclass of Mastra's PubSub that records what reaches it.
import './helpers/mastra-node.js'

import { PubSub, type Event, type EventCallback, type PubSubDeliveryMode, type SubscribeOptions } from '@mastra/core/events'
import { describe, expect, it } from 'vitest'

import { MemoryLeaseProvider, withLeases } from '../dist/esm/index.js'
import { expectThrow } from './helpers/lease.js'

class RecordingTransport extends PubSub {
  calls: Array<[string, ...unknown[]]> = []
  closed = 0
  history: Event[] = [{ type: 't', id: 'e1', data: { n: 1 }, runId: 'r', createdAt: new Date(0) }]

  async publish(topic: string, event: Omit<Event, 'id' | 'createdAt'>, options?: { localOnly?: boolean }) {
    this.calls.push(['publish', topic, event, options])
  }
  async subscribe(topic: string, cb: EventCallback, options?: SubscribeOptions) {
    this.calls.push(['subscribe', topic, cb, options])
  }
  async unsubscribe(topic: string, cb: EventCallback) {
    this.calls.push(['unsubscribe', topic, cb])
  }
  async flush() {
    this.calls.push(['flush'])
  }
  override async clearTopic(topic: string) {
    this.calls.push(['clearTopic', topic])
  }
  override get supportedModes(): ReadonlyArray<PubSubDeliveryMode> {
    return ['push', 'pull']
  }
  override get supportsNativeBatching() {
    return true
  }
  override get supportsOffsets() {
    return true
  }
  override async getHistory(topic: string, offset?: number) {
    this.calls.push(['getHistory', topic, offset])
    return this.history
  }
  override async subscribeWithReplay(topic: string, cb: EventCallback) {
    this.calls.push(['subscribeWithReplay', topic, cb])
  }
  override async subscribeFromOffset(topic: string, offset: number, cb: EventCallback) {
    this.calls.push(['subscribeFromOffset', topic, offset, cb])
  }
  async close() {
    this.closed++
  }
}

describe('LeasedPubSub', () => {
  it('withLeases refuses, at the call, a transport that is not a PubSub and a provider without the five lease methods, naming what it takes', () => {
    const leases = new MemoryLeaseProvider()
    const transport = new RecordingTransport()
    for (const inner of [null, undefined, {}, { publish() {} }]) {
      const err = expectThrow(() => withLeases(inner as never, leases), TypeError, 'ERR_LEASE_INVALID_ARGUMENT')
      expect(err.message).toMatch(/a PubSub .*publish, subscribe, unsubscribe and flush/)
    }
    const { releaseLease: _dropped, ...four } = { acquireLease() {}, getLeaseOwner() {}, releaseLease() {}, renewLease() {}, transferLease() {} }
    for (const provider of [null, undefined, {}, four, 'redis://']) {
      const err = expectThrow(() => withLeases(transport, provider as never), TypeError, 'ERR_LEASE_INVALID_ARGUMENT')
      expect(err.message).toMatch(/a lease provider .*acquireLease, getLeaseOwner, releaseLease, renewLease and transferLease/)
    }
    // Structural, as Mastra's isLeaseProvider: any object with the five methods will do.
    withLeases(transport, { acquireLease() {}, getLeaseOwner() {}, releaseLease() {}, renewLease() {}, transferLease() {} } as never)
  })

  it('passes every PubSub member to the transport with its exact arguments', async () => {
    const transport = new RecordingTransport()
    const pubsub = withLeases(transport, new MemoryLeaseProvider())
    const cb: EventCallback = () => {}
    const event = { type: 'signal', data: { text: 'hi' }, runId: 'run-1' }
    const batch = { maxSize: 10, maxWaitMs: 5 }

    await pubsub.publish('topic-a', event, { localOnly: true })
    await pubsub.subscribe('topic-a', cb, { group: 'workers', startFrom: 'latest', batch })
    await pubsub.unsubscribe('topic-a', cb)
    await pubsub.flush()
    await pubsub.clearTopic('topic-a')
    const history = await pubsub.getHistory('topic-a', 3)
    await pubsub.subscribeWithReplay('topic-b', cb)
    await pubsub.subscribeFromOffset('topic-c', 7, cb)

    expect(transport.calls).toEqual([
      ['publish', 'topic-a', event, { localOnly: true }],
      ['subscribe', 'topic-a', cb, { group: 'workers', startFrom: 'latest', batch }],
      ['unsubscribe', 'topic-a', cb],
      ['flush'],
      ['clearTopic', 'topic-a'],
      ['getHistory', 'topic-a', 3],
      ['subscribeWithReplay', 'topic-b', cb],
      ['subscribeFromOffset', 'topic-c', 7, cb],
    ])
    expect(history).toBe(transport.history)
    expect(pubsub.supportedModes).toEqual(['push', 'pull'])
    expect(pubsub.supportsNativeBatching).toBe(true)
    expect(pubsub.supportsOffsets).toBe(true)
    expect(pubsub.getInner()).toBe(transport)
    expect(pubsub).toBeInstanceOf(PubSub)
  })

  it("reports the transport's capabilities, not the base class defaults", () => {
    class PushOnly extends RecordingTransport {
      override get supportedModes(): ReadonlyArray<PubSubDeliveryMode> {
        return ['push']
      }
      override get supportsNativeBatching() {
        return false
      }
    }
    const pubsub = withLeases(new PushOnly(), new MemoryLeaseProvider())
    expect(pubsub.supportedModes).toEqual(['push'])
    expect(pubsub.supportsNativeBatching).toBe(false)
  })

  it('sends the five lease methods to the lease provider, and getLeaseProvider() hands out the pubsub itself, so Mastra calls go through it', async () => {
    const leases = new MemoryLeaseProvider()
    const transport = new RecordingTransport()
    const pubsub = withLeases(transport, leases)
    const key = `res\0thread-${Math.random()}`

    expect(await pubsub.acquireLease(key, 'a', 10_000)).toStrictEqual({ acquired: true, owner: 'a' })
    expect(await leases.getLeaseOwner(key)).toBe('a')
    expect(await pubsub.acquireLease(key, 'b', 10_000)).toEqual({ acquired: false, owner: 'a' })
    expect(await pubsub.renewLease(key, 'a', 10_000)).toBe(true)
    expect(await pubsub.transferLease(key, 'a', 'b', 10_000)).toBe(true)
    expect(await pubsub.getLeaseOwner(key)).toBe('b')
    await pubsub.releaseLease(key, 'b')
    expect(await leases.getLeaseOwner(key)).toBeUndefined()
    expect(pubsub.getLeaseProvider()).toBe(pubsub)
    expect(transport.calls).toEqual([])
  })

  it('passes lease errors through unchanged: bad input stays a coded TypeError/RangeError', async () => {
    const pubsub = withLeases(new RecordingTransport(), new MemoryLeaseProvider())
    await expect(pubsub.acquireLease('k', 'a', 0)).rejects.toMatchObject({ name: 'RangeError', code: 'ERR_LEASE_INVALID_TTL' })
    await expect(pubsub.acquireLease('k', 'a', 1.5)).rejects.toBeInstanceOf(RangeError)
  })

  it('close() closes the transport and then the lease provider', async () => {
    const transport = new RecordingTransport()
    const leases = new MemoryLeaseProvider()
    const pubsub = withLeases(transport, leases)
    await pubsub.close()
    expect(transport.closed).toBe(1)
    await expect(leases.acquireLease('k', 'a', 1000)).rejects.toMatchObject({ code: 'ERR_LEASE_CLOSED' })
  })

  it('keeps working when called through a Proxy, the way Mastra holds its pubsub', async () => {
    const pubsub = withLeases(new RecordingTransport(), new MemoryLeaseProvider())
    const proxy = new Proxy(pubsub, {})
    expect(await proxy.acquireLease('proxied', 'a', 1000)).toStrictEqual({ acquired: true, owner: 'a' })
    expect(await proxy.getLeaseOwner('proxied')).toBe('a')
    expect(proxy.supportedModes).toEqual(['push', 'pull'])
  })
})
