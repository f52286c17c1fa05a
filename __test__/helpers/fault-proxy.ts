// A TCP fault proxy between a provider under test and a real redis-server, in the spirit of
// toxiproxy: the tests switch its mode at runtime and read back what it did.
//
//   pass          forward both directions as they come
//   delay(ms)     hold every chunk `ms` in each direction (a round trip gains 2 × ms)
//   blackhole     accept connections, forward nothing, keep every socket open; what arrives is
//                 held, as TCP's retransmissions would hold it, and delivered once the mode
//                 leaves blackhole (a partition that heals). `{ existingOnly: true }` blackholes
//                 only the connections open now and lets new ones pass: a flow a NAT or
//                 firewall forgot, dropped silently, while fresh connections work
//   dropReplies   forward commands so Redis executes them, and swallow every reply: "the
//                 command ran, the answer never came back". A byte stream cannot lose bytes and
//                 go on, so a connection that lost replies is reset when the mode is left
//                 (`{ keepStream: true }` keeps it, to see what a client makes of a stream that
//                 silently lost replies; no real network does that)
//   reset()       destroy every current client connection with a TCP RST
//                 (`socket.resetAndDestroy()`) and stay in the current mode; with
//                 `{ persist: true }` it becomes the mode: every new connection is reset too
//
// Order is kept per direction whatever the mode changes: a chunk never overtakes one that
// arrived before it. Counters say what was forwarded and which faults were injected, so the
// tests can report figures and check their faults really happened.
import net from 'node:net'

export type FaultMode = 'pass' | 'delay' | 'blackhole' | 'dropReplies' | 'reset'

export interface FaultProxyStats {
  /** Client connections accepted. */
  connections: number
  /** Bytes written on: client → Redis and Redis → client. */
  bytesUp: number
  bytesDown: number
  /** Complete commands (RESP frames) that arrived from clients, forwarded or not. */
  commandsUp: number
  /** Complete replies that arrived from Redis, forwarded or not. */
  repliesDown: number
  /** Per command name (upper case), the most of it that one chunk from a client carried:
   * more than 1 means the client sent them together, without waiting for a reply between. */
  mostInOneChunk: Record<string, number>
  /** Faults injected. */
  faults: {
    /** Chunks (either direction) held back by delay(ms). */
    delayedChunks: number
    /** Chunks (either direction) held while blackholed. */
    heldChunks: number
    /** Replies Redis sent that no client ever saw (dropReplies). */
    droppedReplies: number
    /** Client connections reset with RST: by reset(), on arrival under reset({persist}), or
     * because they had lost replies when dropReplies ended. */
    resets: number
  }
}

export interface FaultProxy {
  /** `redis://127.0.0.1:<proxy port>`, for the provider under test. */
  readonly url: string
  readonly port: number
  readonly mode: FaultMode
  /** Client connections open right now. */
  readonly openConnections: number
  pass(): void
  delay(ms: number): void
  blackhole(options?: { existingOnly?: boolean }): void
  dropReplies(options?: { keepStream?: boolean }): void
  /** Resets every current connection; returns how many. With `persist`, new ones too until the mode changes. */
  reset(options?: { persist?: boolean }): number
  stats(): FaultProxyStats
  /** Closes the listener and every connection; idempotent. */
  close(): Promise<void>
}

// ---------------------------------------------------------------------------
// Counting RESP frames in a byte stream (RESP2 and RESP3), without keeping them
// ---------------------------------------------------------------------------

const LINE_TYPES = new Set(['+', '-', ':', '_', ',', '#', '('])
const BLOB_TYPES = new Set(['$', '!', '='])
const AGGREGATE_TYPES = new Map([
  ['*', 1],
  ['~', 1],
  ['>', 1],
  ['%', 2],
  ['|', 2],
])

/** The end of one complete frame starting at `start`, or -1 if the buffer stops short. */
function frameEnd(buf: Buffer, start: number): number {
  const lineEnd = buf.indexOf('\r\n', start)
  if (lineEnd < 0) return -1
  const type = String.fromCharCode(buf[start]!)
  const next = lineEnd + 2
  if (LINE_TYPES.has(type)) return next
  const len = Number(buf.toString('latin1', start + 1, lineEnd))
  if (BLOB_TYPES.has(type)) {
    if (len < 0) return next
    return buf.length >= next + len + 2 ? next + len + 2 : -1
  }
  const per = AGGREGATE_TYPES.get(type)
  if (per !== undefined) {
    // An attribute (`|`) precedes the value it annotates; count it as part of that value.
    let pos = next
    for (let i = 0; i < Math.max(len, 0) * per; i++) {
      pos = frameEnd(buf, pos)
      if (pos < 0) return -1
    }
    return type === '|' ? frameEnd(buf, pos) : pos
  }
  // Not RESP (an inline command, or garbage): count the line as one frame.
  return next
}

/** The name of the command a complete client frame (`*N` of bulk strings) starts with. */
function commandName(buf: Buffer, start: number): string | undefined {
  if (buf[start] !== 0x2a /* * */) return undefined
  const header = buf.indexOf('\r\n', start)
  if (header < 0 || buf[header + 2] !== 0x24 /* $ */) return undefined
  const lenEnd = buf.indexOf('\r\n', header + 2)
  const len = Number(buf.toString('latin1', header + 3, lenEnd))
  return buf.toString('latin1', lenEnd + 2, lenEnd + 2 + len).toUpperCase()
}

/** Counts complete frames across chunk boundaries; `names` collects each command's name. */
class FrameCounter {
  private pending: Buffer = Buffer.alloc(0)

  push(chunk: Buffer, names?: string[]): number {
    const buf = this.pending.length ? Buffer.concat([this.pending, chunk]) : chunk
    let pos = 0
    let frames = 0
    for (;;) {
      if (pos >= buf.length) break
      const end = frameEnd(buf, pos)
      if (end < 0) break
      const name = names && commandName(buf, pos)
      if (name) names.push(name)
      pos = end
      frames++
    }
    this.pending = buf.subarray(pos)
    return frames
  }
}

// ---------------------------------------------------------------------------
// The proxy
// ---------------------------------------------------------------------------

interface Held {
  chunk: Buffer
  /** When it may go (monotonic ms); Infinity while blackholed. */
  at: number
}

/** One direction of one connection: an ordered queue in front of the writing socket. */
class Lane {
  queue: Held[] = []
  timer: NodeJS.Timeout | undefined
  readonly frames = new FrameCounter()

  constructor(
    readonly to: net.Socket,
    readonly onSent: (chunk: Buffer) => void,
  ) {}

  /** Writes everything that is due, in order; sets a timer for the rest. */
  pump() {
    clearTimeout(this.timer)
    this.timer = undefined
    const now = performance.now()
    while (this.queue.length && this.queue[0]!.at <= now) {
      const { chunk } = this.queue.shift()!
      if (!this.to.destroyed) this.to.write(chunk)
      this.onSent(chunk)
    }
    const head = this.queue[0]
    if (head && Number.isFinite(head.at)) this.timer = setTimeout(() => this.pump(), Math.max(0, head.at - now) + 1)
  }

  stop() {
    clearTimeout(this.timer)
    this.queue = []
  }
}

interface Link {
  client: net.Socket
  upstream: net.Socket
  up: Lane
  down: Lane
  /** Replies were swallowed on this connection: its byte stream no longer lines up. */
  lostReplies: boolean
  /** Blackholed by `blackhole({ existingOnly: true })`, whatever the mode, until pass(). */
  stuck: boolean
}

export async function startFaultProxy(target: { host: string; port: number }): Promise<FaultProxy> {
  let mode: FaultMode = 'pass'
  let delayMs = 0
  let persistReset = false
  let keepStream = false
  const links = new Set<Link>()
  const stats: FaultProxyStats = {
    connections: 0,
    bytesUp: 0,
    bytesDown: 0,
    commandsUp: 0,
    repliesDown: 0,
    mostInOneChunk: {},
    faults: { delayedChunks: 0, heldChunks: 0, droppedReplies: 0, resets: 0 },
  }

  const resetLink = (link: Link) => {
    if (!links.delete(link)) return
    link.up.stop()
    link.down.stop()
    if (!link.client.destroyed) link.client.resetAndDestroy()
    link.upstream.destroy()
    stats.faults.resets++
  }
  const dropLink = (link: Link) => {
    if (!links.delete(link)) return
    link.up.stop()
    link.down.stop()
    link.client.destroy()
    link.upstream.destroy()
  }

  /** Where a chunk arriving now goes, in the current mode. */
  const admit = (lane: Lane, chunk: Buffer, direction: 'up' | 'down', link: Link) => {
    const names: string[] | undefined = direction === 'up' ? [] : undefined
    const frames = lane.frames.push(chunk, names)
    if (direction === 'up') stats.commandsUp += frames
    else stats.repliesDown += frames
    const inChunk = new Map<string, number>()
    for (const name of names ?? []) inChunk.set(name, (inChunk.get(name) ?? 0) + 1)
    for (const [name, n] of inChunk) stats.mostInOneChunk[name] = Math.max(stats.mostInOneChunk[name] ?? 0, n)
    if (mode === 'dropReplies' && direction === 'down') {
      stats.faults.droppedReplies += frames
      link.lostReplies = true
      return
    }
    let at = performance.now()
    if (mode === 'blackhole' || link.stuck) {
      at = Infinity
      stats.faults.heldChunks++
    } else if (mode === 'delay') {
      at += delayMs
      stats.faults.delayedChunks++
    }
    // Never overtake what is already queued.
    const last = lane.queue[lane.queue.length - 1]
    if (last && last.at > at) at = last.at
    lane.queue.push({ chunk, at })
    lane.pump()
  }

  const server = net.createServer((client) => {
    stats.connections++
    client.setNoDelay(true)
    client.on('error', () => {})
    if (mode === 'reset' && persistReset) {
      stats.faults.resets++
      client.resetAndDestroy()
      return
    }
    const upstream = net.createConnection({ host: target.host, port: target.port })
    upstream.setNoDelay(true)
    upstream.on('error', () => {})
    const link: Link = {
      client,
      upstream,
      lostReplies: false,
      stuck: false,
      up: new Lane(upstream, (chunk) => (stats.bytesUp += chunk.length)),
      down: new Lane(client, (chunk) => (stats.bytesDown += chunk.length)),
    }
    links.add(link)
    client.on('data', (chunk: Buffer) => admit(link.up, chunk, 'up', link))
    upstream.on('data', (chunk: Buffer) => admit(link.down, chunk, 'down', link))
    // Either side closing closes the other (a FIN from Redis becomes a FIN to the client).
    client.on('close', () => dropLink(link))
    upstream.on('close', () => dropLink(link))
  })
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => resolve())
  })
  const port = (server.address() as net.AddressInfo).port

  /** Leaving a mode: release what blackhole held, reset streams that lost replies. */
  const leave = (next: FaultMode) => {
    const was = mode
    mode = next
    persistReset = false
    for (const link of [...links]) {
      if (was === 'dropReplies' && link.lostReplies && !keepStream) {
        resetLink(link)
        continue
      }
      if (was === 'blackhole' || (link.stuck && next === 'pass')) {
        link.stuck = false
        const now = performance.now()
        for (const lane of [link.up, link.down]) {
          for (const held of lane.queue) if (!Number.isFinite(held.at)) held.at = now
          lane.pump()
        }
      }
    }
  }

  let closed: Promise<void> | undefined
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    get mode() {
      return mode
    },
    get openConnections() {
      return links.size
    },
    pass: () => leave('pass'),
    delay(ms: number) {
      leave('delay')
      delayMs = ms
    },
    blackhole(options = {}) {
      if (!options.existingOnly) return leave('blackhole')
      leave('pass')
      for (const link of links) link.stuck = true
    },
    dropReplies(options = {}) {
      leave('dropReplies')
      keepStream = options.keepStream ?? false
    },
    reset(options = {}) {
      // A one-off reset leaves the mode as it was (a delay stays on); a persistent one is a mode.
      if (options.persist) {
        leave('reset')
        persistReset = true
      }
      const current = [...links]
      for (const link of current) resetLink(link)
      return current.length
    },
    stats: () => ({ ...stats, mostInOneChunk: { ...stats.mostInOneChunk }, faults: { ...stats.faults } }),
    close() {
      closed ??= new Promise<void>((resolve) => {
        server.close(() => resolve())
        for (const link of [...links]) dropLink(link)
      })
      return closed
    },
  }
}
