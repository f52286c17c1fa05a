// The peer of bench/streams.mjs and bench/fleet.mjs: Mastra's Redis Streams layout on
// node-redis, as its own backend (`pubsub/redis-streams`) reads and writes it.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { createClient } from 'redis';

// The peer: Mastra's Redis Streams layout on node-redis. Publish = one XADD (MAXLEN ~) with the
// event's JSON in the field `event`, stamped with id / createdAt / deliveryAttempt. Each
// subscription reads on its own connection (a duplicate of the writer) with XREADGROUP
// COUNT 10 BLOCK 1000 `>`, parses each entry and calls the callback without waiting for it
// (so handlers overlap, as with ours); ack = XACK on the shared writer, which node-redis
// auto-pipelines with everything else issued in the same tick.
export class NodeRedisStreamsPubSub {
  constructor({ url, keyPrefix, blockMs = 1000, batchCount = 10, maxStreamLength = 10_000, maxDeliveryAttempts = 5 }) {
    this.prefix = keyPrefix;
    this.opts = { blockMs, batchCount, maxDeliveryAttempts };
    this.trim = maxStreamLength > 0
      ? { TRIM: { strategy: 'MAXLEN', strategyModifier: '~', threshold: maxStreamLength } } : undefined;
    this.client = createClient({ url });
    this.client.on('error', (e) => console.error('node-redis writer error', e.message));
    this.connecting = null;
    this.subs = [];
  }
  connect() {
    return (this.connecting ??= this.client.connect());
  }
  key(topic) { return `${this.prefix}:${topic}`; }

  async publish(topic, event) {
    if (!this.client.isReady) await this.connect();
    const stamped = { ...event, id: randomUUID(), createdAt: new Date(), deliveryAttempt: event.deliveryAttempt ?? 1 };
    await this.client.xAdd(this.key(topic), '*', { event: JSON.stringify(stamped) }, this.trim);
  }

  async subscribe(topic, cb, options = {}) {
    if (!options.group) return this.subscribeFanOut(topic, cb);
    await this.connect();
    const key = this.key(topic), group = options.group;
    try {
      await this.client.xGroupCreate(key, group, options.startFrom === 'latest' ? '$' : '0', { MKSTREAM: true });
    } catch (e) { if (!String(e?.message).includes('BUSYGROUP')) throw e; }
    const reader = this.client.duplicate();
    reader.on('error', () => {}); // destroy() on unsubscribe rejects the pending read
    await reader.connect();
    const sub = { topic, cb, key, group, consumer: `${group}-${randomUUID()}`, reader, stopped: false };
    sub.loop = this.readLoop(sub);
    this.subs.push(sub);
  }

  async readLoop(sub) {
    const { key, group, consumer, reader } = sub;
    const opts = { COUNT: this.opts.batchCount, BLOCK: this.opts.blockMs };
    while (!sub.stopped) {
      let reply;
      try {
        reply = await reader.xReadGroup(group, consumer, { key, id: '>' }, opts);
      } catch (e) {
        if (sub.stopped) return;
        await sleep(100);
        continue;
      }
      if (!reply) continue;
      for (const stream of reply) {
        for (const { id, message } of stream.messages) this.deliver(sub, id, message.event);
      }
    }
  }

  // Fan-out, as Mastra's own backend does it: a reader of its own per subscription, XREAD
  // BLOCK from the stream's end, every entry to the callback; ack and nack do nothing.
  async subscribeFanOut(topic, cb) {
    await this.connect();
    const key = this.key(topic);
    const reader = this.client.duplicate();
    reader.on('error', () => {});
    await reader.connect();
    const sub = { topic, cb, key, reader, stopped: false };
    sub.loop = (async () => {
      let last = '$';
      const opts = { COUNT: this.opts.batchCount, BLOCK: this.opts.blockMs };
      while (!sub.stopped) {
        let reply;
        try {
          reply = await reader.xRead({ key, id: last }, opts);
        } catch {
          if (sub.stopped) return;
          await sleep(100);
          continue;
        }
        if (!reply) continue;
        for (const stream of reply) {
          for (const { id, message } of stream.messages) {
            last = id;
            const event = JSON.parse(message.event);
            event.createdAt = new Date(event.createdAt);
            const settle = async () => {};
            try {
              const r = cb(event, settle, settle);
              if (r && typeof r.then === 'function') r.then(undefined, () => {});
            } catch { /* a fan-out callback's failure is its own */ }
          }
        }
      }
    })();
    this.subs.push(sub);
  }

  deliver(sub, entryId, json) {
    const { key, group } = sub;
    let event;
    try {
      event = JSON.parse(json);
      event.createdAt = new Date(event.createdAt);
    } catch {
      void this.client.xAck(key, group, entryId).catch(() => {});
      return;
    }
    let settled = false;
    const ack = async () => {
      if (settled) return;
      settled = true;
      await this.client.xAck(key, group, entryId);
    };
    const nack = async () => { // not exercised by the bench; here so the callback contract is whole
      if (settled) return;
      settled = true;
      const attempt = (event.deliveryAttempt ?? 1) + 1;
      const multi = this.client.multi();
      if (attempt <= this.opts.maxDeliveryAttempts) {
        multi.xAdd(key, '*', { event: JSON.stringify({ ...event, deliveryAttempt: attempt }) }, this.trim);
      }
      await multi.xAck(key, group, entryId).exec();
    };
    const failed = () => void nack().catch(() => {});
    try {
      const r = sub.cb(event, ack, nack);
      if (r && typeof r.then === 'function') r.then(undefined, failed);
    } catch { failed(); }
  }

  async unsubscribe(topic, cb) {
    const i = this.subs.findIndex((s) => s.topic === topic && s.cb === cb);
    if (i < 0) return;
    const [sub] = this.subs.splice(i, 1);
    sub.stopped = true;
    sub.reader.destroy();
    await sub.loop;
  }

  async close() {
    for (const s of [...this.subs]) await this.unsubscribe(s.topic, s.cb);
    if (this.connecting) await this.client.close();
  }
}
