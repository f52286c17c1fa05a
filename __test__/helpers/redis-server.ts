// Real redis-server processes for the tests, plus a tiny RESP client to look at them.
//
// Every server gets its own free port (never 6379), its own temp dir, no persistence,
// and is bound to 127.0.0.1. When REDIS_URL is set, `startRedis()` hands back that
// external server instead, and the tests that must freeze/kill/restart a server skip
// themselves (`it.skipIf(EXTERNAL_REDIS)`).
import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'

export const EXTERNAL_REDIS_URL: string | undefined = process.env.REDIS_URL || undefined
/** True when the tests run against an external server they must not freeze, kill or restart. */
export const EXTERNAL_REDIS = EXTERNAL_REDIS_URL !== undefined

export type RespValue = string | number | null | RespValue[]

/** An error reply from Redis (`-ERR ...`), as opposed to a transport failure. */
export class RespError extends Error {
  override name = 'RespError'
}

export interface RedisServerOptions {
  /** Extra redis-server arguments, e.g. ['--requirepass', 'pw']. */
  args?: string[]
  /** Also listen on a unix socket (its path is `socketPath`). */
  unixSocket?: boolean
  /** Password (and user) the helper's own client authenticates with. */
  password?: string
  username?: string
}

export interface RedisServer {
  /** URL for the provider under test (no credentials unless the server is external). */
  readonly url: string
  readonly host: string
  readonly port: number
  readonly socketPath: string | undefined
  readonly external: boolean
  /** Run one command on the server (own connection, reused; AUTH done for you). */
  cli(...args: Array<string | number>): Promise<RespValue>
  /** `INFO section` parsed into key -> value. */
  info(section: string): Promise<Record<string, string>>
  /** Calls per command from `INFO commandstats`, e.g. { get: 3, evalsha: 10 }. */
  commandCalls(): Promise<Record<string, number>>
  flushScripts(): Promise<void>
  /** SIGSTOP: the server keeps its sockets open but answers nothing. */
  freeze(): void
  /** SIGCONT. */
  thaw(): void
  /** SIGKILL, then wait for the process to be gone. */
  kill(): Promise<void>
  /** Start again on the same port (after kill(), or stops it first). */
  restart(): Promise<void>
  /** Stop and clean up; idempotent. Never touches an external server. */
  stop(): Promise<void>
}

// ---------------------------------------------------------------------------
// RESP client
// ---------------------------------------------------------------------------

function encodeCommand(args: Array<string | number>): Buffer {
  const parts: Buffer[] = [Buffer.from(`*${args.length}\r\n`)]
  for (const arg of args) {
    const body = Buffer.from(String(arg), 'utf8')
    parts.push(Buffer.from(`$${body.length}\r\n`), body, Buffer.from('\r\n'))
  }
  return Buffer.concat(parts)
}

type Parsed = { value: RespValue | RespError; end: number }

/** Parse one RESP2 reply starting at `start`; undefined when the buffer is incomplete. */
function parseReply(buf: Buffer, start: number): Parsed | undefined {
  const lineEnd = buf.indexOf('\r\n', start)
  if (lineEnd < 0) return undefined
  const type = String.fromCharCode(buf[start]!)
  const line = buf.toString('utf8', start + 1, lineEnd)
  const next = lineEnd + 2
  switch (type) {
    case '+':
      return { value: line, end: next }
    case '-':
      return { value: new RespError(line), end: next }
    case ':':
      return { value: Number(line), end: next }
    case '$': {
      const len = Number(line)
      if (len < 0) return { value: null, end: next }
      if (buf.length < next + len + 2) return undefined
      return { value: buf.toString('utf8', next, next + len), end: next + len + 2 }
    }
    case '*': {
      const count = Number(line)
      if (count < 0) return { value: null, end: next }
      const items: RespValue[] = []
      let pos = next
      for (let i = 0; i < count; i++) {
        const item = parseReply(buf, pos)
        if (!item) return undefined
        if (item.value instanceof RespError) throw item.value
        items.push(item.value)
        pos = item.end
      }
      return { value: items, end: pos }
    }
    default:
      throw new Error(`unexpected RESP type byte ${JSON.stringify(type)}`)
  }
}

export interface RespTarget {
  host?: string
  port?: number
  path?: string
  username?: string
  password?: string
  db?: number
}

export function parseRedisUrl(url: string): RespTarget {
  const u = new URL(url)
  const target: RespTarget = {}
  if (u.protocol === 'unix:' || u.protocol === 'redis+unix:') {
    target.path = decodeURIComponent(u.pathname)
    const db = u.searchParams.get('db')
    if (db) target.db = Number(db)
  } else {
    target.host = u.hostname || '127.0.0.1'
    target.port = u.port ? Number(u.port) : 6379
    const db = u.pathname.replace(/^\//, '')
    if (db) target.db = Number(db)
  }
  if (u.username) target.username = decodeURIComponent(u.username)
  if (u.password) target.password = decodeURIComponent(u.password)
  return target
}

/** A minimal RESP2 client: one socket, pipelined commands answered in order. */
export class RespClient {
  private socket: net.Socket | undefined
  private buffer: Buffer = Buffer.alloc(0)
  private pending: Array<{ resolve: (v: RespValue) => void; reject: (e: Error) => void }> = []
  private connecting: Promise<void> | undefined

  constructor(
    private readonly target: RespTarget,
    private readonly timeoutMs = 5000,
  ) {}

  private connect(): Promise<void> {
    if (this.socket && !this.socket.destroyed) return Promise.resolve()
    if (this.connecting) return this.connecting
    this.connecting = new Promise<void>((resolve, reject) => {
      const socket = this.target.path
        ? net.createConnection({ path: this.target.path })
        : net.createConnection({ host: this.target.host ?? '127.0.0.1', port: this.target.port ?? 6379 })
      const fail = (err: Error) => {
        this.failAll(err)
        if (this.socket === socket) this.socket = undefined
        socket.destroy()
        reject(err)
      }
      socket.once('error', fail)
      socket.once('connect', () => {
        socket.off('error', fail)
        socket.on('error', (err) => this.failAll(err))
        socket.on('close', () => {
          if (this.socket === socket) this.socket = undefined
          this.failAll(new Error('connection closed'))
        })
        socket.on('data', (chunk) => this.onData(chunk))
        this.socket = socket
        this.buffer = Buffer.alloc(0)
        resolve()
      })
    }).finally(() => {
      this.connecting = undefined
    })
    return this.connecting.then(async () => {
      const { username, password, db } = this.target
      if (password !== undefined) await this.send(username ? ['AUTH', username, password] : ['AUTH', password])
      if (db !== undefined && db !== 0) await this.send(['SELECT', db])
    })
  }

  private onData(chunk: Buffer) {
    this.buffer = this.buffer.length ? Buffer.concat([this.buffer, chunk]) : chunk
    let pos = 0
    for (;;) {
      let parsed: Parsed | undefined
      try {
        parsed = parseReply(this.buffer, pos)
      } catch (err) {
        // An error nested in an array reply: hand it to the waiting caller.
        parsed = undefined
        const waiter = this.pending.shift()
        waiter?.reject(err as Error)
        this.socket?.destroy()
        return
      }
      if (!parsed) break
      pos = parsed.end
      const waiter = this.pending.shift()
      if (!waiter) continue
      if (parsed.value instanceof RespError) waiter.reject(parsed.value)
      else waiter.resolve(parsed.value)
    }
    this.buffer = this.buffer.subarray(pos)
  }

  private failAll(err: Error) {
    const waiting = this.pending
    this.pending = []
    for (const w of waiting) w.reject(err)
  }

  private send(args: Array<string | number>): Promise<RespValue> {
    const socket = this.socket
    if (!socket) return Promise.reject(new Error('not connected'))
    return new Promise<RespValue>((resolve, reject) => {
      const timer = setTimeout(() => {
        // The server stopped answering (e.g. SIGSTOP): drop this connection.
        reject(new Error(`redis did not answer ${String(args[0])} within ${this.timeoutMs} ms`))
        socket.destroy()
      }, this.timeoutMs)
      this.pending.push({
        resolve: (v) => {
          clearTimeout(timer)
          resolve(v)
        },
        reject: (e) => {
          clearTimeout(timer)
          reject(e)
        },
      })
      socket.write(encodeCommand(args))
    })
  }

  async command(...args: Array<string | number>): Promise<RespValue> {
    await this.connect()
    return this.send(args)
  }

  close() {
    this.socket?.destroy()
    this.socket = undefined
  }
}

// ---------------------------------------------------------------------------
// Server processes
// ---------------------------------------------------------------------------

const live = new Set<ChildProcess>()
// Last resort: never leave a server behind, least of all a SIGSTOPped one.
process.once('exit', () => {
  for (const child of live) {
    try {
      child.kill('SIGCONT')
      child.kill('SIGKILL')
    } catch {
      /* already gone */
    }
  }
})

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.unref()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address()
      const port = typeof addr === 'object' && addr ? addr.port : 0
      srv.close(() => (port && port !== 6379 ? resolve(port) : freePort().then(resolve, reject)))
    })
  })
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

function waitExit(child: ChildProcess, ms: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true)
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms)
    child.once('exit', () => {
      clearTimeout(timer)
      resolve(true)
    })
  })
}

function parseInfo(text: string): Record<string, string> {
  const out: Record<string, string> = {}
  for (const line of text.split('\r\n')) {
    if (!line || line.startsWith('#')) continue
    const i = line.indexOf(':')
    if (i > 0) out[line.slice(0, i)] = line.slice(i + 1)
  }
  return out
}

function commonApi(client: RespClient) {
  const info = async (section: string) => parseInfo(String(await client.command('INFO', section)))
  return {
    cli: (...args: Array<string | number>) => client.command(...args),
    info,
    async commandCalls() {
      const stats = await info('commandstats')
      const out: Record<string, number> = {}
      for (const [k, v] of Object.entries(stats)) {
        const m = /^cmdstat_(.+)$/.exec(k)
        const calls = /(?:^|,)calls=(\d+)/.exec(v)
        if (m && calls) out[m[1]!] = Number(calls[1])
      }
      return out
    },
    async flushScripts() {
      await client.command('SCRIPT', 'FLUSH')
    },
  }
}

function externalServer(url: string): RedisServer {
  const target = parseRedisUrl(url)
  const client = new RespClient(target)
  const refuse = (what: string) => () => {
    throw new Error(`cannot ${what} an external REDIS_URL server; guard this test with it.skipIf(EXTERNAL_REDIS)`)
  }
  return {
    url,
    host: target.host ?? '',
    port: target.port ?? 0,
    socketPath: target.path,
    external: true,
    ...commonApi(client),
    freeze: refuse('freeze'),
    thaw: refuse('thaw'),
    kill: async () => refuse('kill')(),
    restart: async () => refuse('restart')(),
    async stop() {
      client.close()
    },
  }
}

async function spawnOnPort(
  port: number,
  dir: string,
  opts: RedisServerOptions,
  socketPath: string | undefined,
): Promise<ChildProcess | undefined> {
  const args = ['--port', String(port), '--save', '', '--appendonly', 'no', '--bind', '127.0.0.1', '--dir', dir]
  if (socketPath) args.push('--unixsocket', socketPath, '--unixsocketperm', '700')
  args.push(...(opts.args ?? []))
  const child = spawn('redis-server', args, { stdio: ['ignore', 'ignore', 'pipe'] })
  live.add(child)
  child.once('exit', () => live.delete(child))
  child.stderr?.resume()
  const probe = new RespClient({ host: '127.0.0.1', port, password: opts.password, username: opts.username }, 500)
  try {
    const deadline = Date.now() + 10_000
    while (Date.now() < deadline) {
      if (child.exitCode !== null || child.signalCode !== null) return undefined // e.g. port taken
      try {
        if ((await probe.command('PING')) === 'PONG') return child
      } catch {
        probe.close()
        await sleep(20)
      }
    }
  } finally {
    probe.close()
  }
  child.kill('SIGKILL')
  await waitExit(child, 2000)
  return undefined
}

/** Start a fresh redis-server (or return the REDIS_URL one). Call `stop()` in afterAll/afterEach. */
export async function startRedis(opts: RedisServerOptions = {}): Promise<RedisServer> {
  if (EXTERNAL_REDIS_URL) return externalServer(EXTERNAL_REDIS_URL)

  const dir = mkdtempSync(path.join(os.tmpdir(), 'mlr-'))
  const socketPath = opts.unixSocket ? path.join(dir, 'redis.sock') : undefined
  let port = 0
  let child: ChildProcess | undefined
  for (let attempt = 0; attempt < 5 && !child; attempt++) {
    port = await freePort()
    child = await spawnOnPort(port, dir, opts, socketPath)
  }
  if (!child) {
    rmSync(dir, { recursive: true, force: true })
    throw new Error('could not start redis-server')
  }

  const client = new RespClient({ host: '127.0.0.1', port, password: opts.password, username: opts.username })
  let proc: ChildProcess | undefined = child
  let frozen = false
  let stopped = false

  const killNow = async () => {
    const p = proc
    proc = undefined
    if (!p) return
    p.kill('SIGCONT')
    frozen = false
    p.kill('SIGKILL')
    await waitExit(p, 5000)
  }

  const server: RedisServer = {
    url: `redis://127.0.0.1:${port}`,
    host: '127.0.0.1',
    port,
    socketPath,
    external: false,
    ...commonApi(client),
    freeze() {
      if (!proc) throw new Error('server is not running')
      proc.kill('SIGSTOP')
      frozen = true
    },
    thaw() {
      if (proc && frozen) proc.kill('SIGCONT')
      frozen = false
    },
    async kill() {
      client.close()
      await killNow()
    },
    async restart() {
      client.close()
      await killNow()
      // The port may linger briefly; the provider under test keeps retrying meanwhile.
      const deadline = Date.now() + 10_000
      while (!proc && Date.now() < deadline) {
        proc = await spawnOnPort(port, dir, opts, socketPath)
        if (!proc) await sleep(50)
      }
      if (!proc) throw new Error(`could not restart redis-server on port ${port}`)
    },
    async stop() {
      if (stopped) return
      stopped = true
      client.close()
      const p = proc
      proc = undefined
      if (p) {
        if (frozen) p.kill('SIGCONT')
        frozen = false
        p.kill('SIGTERM')
        if (!(await waitExit(p, 3000))) {
          p.kill('SIGKILL')
          await waitExit(p, 3000)
        }
      }
      rmSync(dir, { recursive: true, force: true })
    },
  }
  return server
}

/**
 * The commands the server runs for `ms` (MONITOR), one line each, as Redis prints them:
 * `<time> [<db> <client>] "XREAD" "COUNT" ...`.
 */
export async function monitor(server: RedisServer, ms: number): Promise<string[]> {
  const target = parseRedisUrl(server.url)
  const socket = target.path
    ? net.createConnection({ path: target.path })
    : net.createConnection({ host: target.host ?? '127.0.0.1', port: target.port ?? 6379 })
  let text = ''
  socket.on('data', (chunk) => (text += chunk.toString('utf8')))
  await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject))
  if (target.password !== undefined) {
    socket.write(encodeCommand(target.username ? ['AUTH', target.username, target.password] : ['AUTH', target.password]))
  }
  socket.write(encodeCommand(['MONITOR']))
  await sleep(ms)
  socket.destroy()
  return text
    .split('\r\n')
    .filter((line) => line.startsWith('+') && line !== '+OK')
    .map((line) => line.slice(1))
}
