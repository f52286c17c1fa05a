// Real redis-server processes for the tests, and node-redis connections to look at them.
//
// Every server gets its own free port (never 6379), its own temp dir, no persistence,
// and is bound to 127.0.0.1. When REDIS_URL is set, `startRedis()` hands back that
// external server instead, and the tests that must freeze/kill/restart a server skip
// themselves (`it.skipIf(EXTERNAL_REDIS)`).
//
// `RedisProcess` is the one redis-server process (spawn, wait for PING, freeze, kill,
// restart); `startRedis()` runs one, and the Cluster and Sentinel helpers
// (redis-cluster.ts, redis-sentinel.ts over redis-process.ts) run several. Each runs
// `redis-server`, or the program `useServerProgram()` names (valkey.spec.ts: valkey-server).
import { spawn, type ChildProcess } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { performance } from 'node:perf_hooks'

import { createClient } from 'redis'

export const EXTERNAL_REDIS_URL: string | undefined = process.env.REDIS_URL || undefined
/** True when the tests run against an external server they must not freeze, kill or restart. */
export const EXTERNAL_REDIS = EXTERNAL_REDIS_URL !== undefined

/** A reply as node-redis hands over a RESP2 reply of `sendCommand`, untransformed. */
export type RespValue = string | number | null | RespValue[]

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
  /** Start again on the same port (after kill(), or stops it first); with `whileLoading`,
   * answered once it takes connections, while it may still be loading its data. */
  restart(options?: { whileLoading?: boolean }): Promise<void>
  /** Stop and clean up; idempotent. Never touches an external server. */
  stop(): Promise<void>
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

// ---------------------------------------------------------------------------
// node-redis connections
// ---------------------------------------------------------------------------

export interface RedisTarget {
  host?: string
  port?: number
  path?: string
  /** rediss:// */
  tls?: boolean
  username?: string
  password?: string
  db?: number
}

export function parseRedisUrl(url: string): RedisTarget {
  const u = new URL(url)
  const target: RedisTarget = {}
  if (u.protocol === 'unix:' || u.protocol === 'redis+unix:') {
    target.path = decodeURIComponent(u.pathname)
    const db = u.searchParams.get('db')
    if (db) target.db = Number(db)
  } else {
    target.host = u.hostname || '127.0.0.1'
    target.port = u.port ? Number(u.port) : 6379
    if (u.protocol === 'rediss:') target.tls = true
    const db = u.pathname.replace(/^\//, '')
    if (db) target.db = Number(db)
  }
  if (u.username) target.username = decodeURIComponent(u.username)
  if (u.password) target.password = decodeURIComponent(u.password)
  return target
}

function newClient(target: RedisTarget, connectTimeout: number) {
  const common = { connectTimeout, reconnectStrategy: false as const }
  const socket = target.path
    ? { ...common, path: target.path, tls: false as const }
    : target.tls
      ? { ...common, host: target.host ?? '127.0.0.1', port: target.port ?? 6379, tls: true as const, servername: target.host }
      : { ...common, host: target.host ?? '127.0.0.1', port: target.port ?? 6379 }
  const client = createClient({
    socket,
    username: target.username,
    password: target.password,
    database: target.db,
    // The server sees only what a test sends (plus AUTH and SELECT): no CLIENT SETINFO in
    // its commandstats, its ACL log or a MONITOR, and nothing a renamed command could refuse.
    // RESP is left unset on purpose: RESP: 2 would open with HELLO.
    disableClientInfo: true,
    // Disconnected means failed at once, not queued until a reconnect that never comes.
    disableOfflineQueue: true,
  })
  // A lost connection is reported through the pending calls; an unheard 'error' event
  // would crash the test process.
  client.on('error', () => {})
  return client
}

/** A node-redis client of the tests: RESP2, no reconnect, no offline queue, no client info. */
export type RedisTestClient = ReturnType<typeof newClient>

function destroyQuietly(client: RedisTestClient) {
  try {
    client.destroy()
  } catch {
    /* already closed */
  }
}

/**
 * `work` on `client`, given up after `ms` (a SIGSTOPped server accepts the TCP connection
 * and then answers nothing): the client is destroyed then, so that no late reply lands.
 */
async function bounded<T>(client: RedisTestClient, ms: number, what: string, work: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      destroyQuietly(client)
      reject(new Error(`redis did not answer ${what} within ${ms} ms`))
    }, ms)
  })
  try {
    return await Promise.race([work, timeout])
  } finally {
    clearTimeout(timer)
  }
}

/**
 * A connected node-redis client to `target` (AUTH and SELECT done), or a rejection within
 * `timeoutMs`. Destroy it when done (`client.destroy()`).
 */
export async function connectClient(target: RedisTarget, timeoutMs = 5000): Promise<RedisTestClient> {
  const client = newClient(target, timeoutMs)
  try {
    await bounded(client, timeoutMs, 'the connection', client.connect())
  } catch (err) {
    destroyQuietly(client)
    throw err
  }
  return client
}

/**
 * One connection to a server, opened on first use and again after it was lost (a killed
 * or restarted server, CLIENT KILL): each command answered within `timeoutMs` or failed,
 * and the connection dropped with it.
 */
export class ServerConnection {
  private client: Promise<RedisTestClient> | undefined

  constructor(
    private readonly target: RedisTarget,
    private readonly timeoutMs = 5000,
  ) {}

  private connected(): Promise<RedisTestClient> {
    const current = this.client
    if (current) {
      return current.then((client) => {
        if (client.isReady) return client
        if (this.client === current) this.client = undefined
        return this.connected()
      })
    }
    const opening = connectClient(this.target, this.timeoutMs)
    this.client = opening
    opening.catch(() => {
      if (this.client === opening) this.client = undefined
    })
    return opening
  }

  async command(...args: Array<string | number>): Promise<RespValue> {
    const client = await this.connected()
    return bounded(client, this.timeoutMs, String(args[0]), client.sendCommand<RespValue>(args.map(String)))
  }

  close() {
    const current = this.client
    this.client = undefined
    current?.then(destroyQuietly, () => {})
  }
}

/**
 * The commands the server runs for `ms` (MONITOR), one line each, as Redis prints them:
 * `<time> [<db> <client>] "XREAD" "COUNT" ...`.
 */
export async function monitor(server: RedisServer, ms: number): Promise<string[]> {
  const client = await connectClient(parseRedisUrl(server.url))
  const lines: string[] = []
  try {
    await client.monitor((line) => lines.push(String(line)))
    await sleep(ms)
  } finally {
    destroyQuietly(client)
  }
  return lines
}

// ---------------------------------------------------------------------------
// Server processes
// ---------------------------------------------------------------------------

let program = 'redis-server'
/**
 * The program of every server the helpers start from now on (startRedis, startCluster,
 * startSentinel): `redis-server` from the PATH, unless a spec file names another that takes
 * its flags (valkey.spec.ts: `valkey-server`). Each spec file is a process of its own.
 */
export function useServerProgram(path: string) {
  program = path
}

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

export function waitExit(child: ChildProcess, ms: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true)
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms)
    child.once('exit', () => {
      clearTimeout(timer)
      resolve(true)
    })
  })
}

/** The last `lines` lines of a log file. */
export function tail(file: string, lines = 15): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n')
  } catch {
    return '(no log)'
  }
}

/** `INFO` (or `CLUSTER INFO`) text as key -> value. */
export function parseInfo(text: string): Record<string, string> {
  const out: Record<string, string> = {}
  for (const line of text.split('\r\n')) {
    if (!line || line.startsWith('#')) continue
    const i = line.indexOf(':')
    if (i > 0) out[line.slice(0, i)] = line.slice(i + 1)
  }
  return out
}

function commonApi(connection: ServerConnection) {
  const info = async (section: string) => parseInfo(String(await connection.command('INFO', section)))
  return {
    cli: (...args: Array<string | number>) => connection.command(...args),
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
      await connection.command('SCRIPT', 'FLUSH')
    },
  }
}

export interface ProcessSpec {
  /** e.g. 'redis-server', 'node-2', 'sentinel-0'. */
  name: string
  /** Its own dir, the process's cwd; kept across restart(). */
  dir: string
  /** The client port first, then any other port the process listens on (a cluster bus). */
  ports: number[]
  /** The whole redis-server argv (a config file may only come first). */
  argv: string[]
  /** A unix socket the process also listens on. */
  socketPath?: string
  /** What the helper's own client authenticates with. */
  password?: string
  username?: string
}

/** One redis-server (or sentinel) process on 127.0.0.1, and the helper's connection to it. */
export class RedisProcess implements RedisServer {
  readonly url: string
  readonly host = '127.0.0.1'
  readonly port: number
  readonly socketPath: string | undefined
  readonly external = false
  readonly name: string
  readonly dir: string
  readonly ports: number[]
  readonly cli: (...args: Array<string | number>) => Promise<RespValue>
  readonly info: (section: string) => Promise<Record<string, string>>
  readonly commandCalls: () => Promise<Record<string, number>>
  readonly flushScripts: () => Promise<void>
  /** The program it runs (useServerProgram's when it was made), again on restart(). */
  readonly program = program
  private proc: ChildProcess | undefined
  private isFrozen = false
  private readonly connection: ServerConnection

  constructor(private readonly spec: ProcessSpec) {
    this.name = spec.name
    this.dir = spec.dir
    this.ports = spec.ports
    this.port = spec.ports[0]!
    this.socketPath = spec.socketPath
    this.url = `redis://${this.host}:${this.port}`
    this.connection = new ServerConnection(this.target())
    const api = commonApi(this.connection)
    this.cli = api.cli
    this.info = api.info
    this.commandCalls = api.commandCalls
    this.flushScripts = api.flushScripts
  }

  private target(): RedisTarget {
    return { host: this.host, port: this.port, password: this.spec.password, username: this.spec.username }
  }

  /** Neither killed nor stopped (it may be frozen). */
  get running() {
    return this.proc !== undefined
  }
  /** SIGSTOPped and not thawed yet. */
  get frozen() {
    return this.isFrozen
  }
  /** Running and not frozen: it can answer. */
  get reachable() {
    return this.proc !== undefined && !this.isFrozen
  }
  get pid() {
    return this.proc?.pid
  }
  /** Where a process started with `--logfile redis.log` (or `logfile` in its config) logs. */
  get logFile() {
    return path.join(this.dir, 'redis.log')
  }

  /** Spawn and wait for PING (or, `whileLoading`, for a LOADING answer to it too); false when
   * the process exits first (e.g. its port is taken). */
  async start(timeoutMs = 10_000, whileLoading = false): Promise<boolean> {
    const child = spawn(this.program, this.spec.argv, { cwd: this.dir, stdio: ['ignore', 'ignore', 'pipe'] })
    live.add(child)
    child.once('exit', () => live.delete(child))
    child.stderr?.resume()
    const deadline = performance.now() + timeoutMs
    while (performance.now() < deadline) {
      if (child.exitCode !== null || child.signalCode !== null) return false
      let probe: RedisTestClient | undefined
      try {
        probe = await connectClient(this.target(), 500)
        if ((await bounded(probe, 500, 'PING', probe.ping())) === 'PONG') {
          this.proc = child
          this.isFrozen = false
          return true
        }
      } catch (err) {
        if (whileLoading && String((err as Error)?.message).startsWith('LOADING')) {
          this.proc = child
          this.isFrozen = false
          return true
        }
        await sleep(20)
      } finally {
        if (probe) destroyQuietly(probe)
      }
    }
    child.kill('SIGKILL')
    await waitExit(child, 2000)
    return false
  }

  /** The first element of ROLE: 'master', 'slave' or 'sentinel'. */
  async role() {
    const reply = await this.cli('ROLE')
    return Array.isArray(reply) ? String(reply[0]) : String(reply)
  }
  freeze() {
    if (!this.proc) throw new Error(`${this.name} is not running`)
    this.proc.kill('SIGSTOP')
    this.isFrozen = true
  }
  thaw() {
    if (this.proc && this.isFrozen) this.proc.kill('SIGCONT')
    this.isFrozen = false
  }
  async kill() {
    this.connection.close()
    const p = this.proc
    this.proc = undefined
    if (!p) return
    p.kill('SIGCONT')
    this.isFrozen = false
    p.kill('SIGKILL')
    await waitExit(p, 5000)
  }
  /** Start again on the same port(s) with the same dir, so a cluster node keeps its nodes.conf and id. */
  async restart(options: { whileLoading?: boolean } = {}) {
    await this.kill()
    // The port may linger briefly; the provider under test keeps retrying meanwhile.
    const deadline = performance.now() + 10_000
    while (performance.now() < deadline) {
      if (await this.start(10_000, options.whileLoading)) return
      await sleep(50)
    }
    const log = existsSync(this.logFile) ? `:\n${tail(this.logFile)}` : ''
    throw new Error(`could not restart ${this.name} on port ${this.port}${log}`)
  }
  /** SIGKILL (no persistence to save, and a master's SIGTERM may wait for replicas); the dir stays. */
  async stop() {
    await this.kill()
  }
  /** SIGTERM (thawed first), SIGKILL after `graceMs`; the dir stays. */
  async terminate(graceMs: number) {
    this.connection.close()
    const p = this.proc
    this.proc = undefined
    if (!p) return
    if (this.isFrozen) p.kill('SIGCONT')
    this.isFrozen = false
    p.kill('SIGTERM')
    if (!(await waitExit(p, graceMs))) {
      p.kill('SIGKILL')
      await waitExit(p, graceMs)
    }
  }
}

function externalServer(url: string): RedisServer {
  const target = parseRedisUrl(url)
  const connection = new ServerConnection(target)
  const refuse = (what: string) => () => {
    throw new Error(`cannot ${what} an external REDIS_URL server; guard this test with it.skipIf(EXTERNAL_REDIS)`)
  }
  return {
    url,
    host: target.host ?? '',
    port: target.port ?? 0,
    socketPath: target.path,
    external: true,
    ...commonApi(connection),
    freeze: refuse('freeze'),
    thaw: refuse('thaw'),
    kill: async () => refuse('kill')(),
    restart: async () => refuse('restart')(),
    async stop() {
      connection.close()
    },
  }
}

/** A server of its own: stop() ends it gently and removes its temp dir. */
class LocalServer extends RedisProcess {
  private stopped = false
  override async stop() {
    if (this.stopped) return
    this.stopped = true
    await this.terminate(3000)
    rmSync(this.dir, { recursive: true, force: true })
  }
}

/** Start a fresh redis-server (or return the REDIS_URL one). Call `stop()` in afterAll/afterEach. */
export async function startRedis(opts: RedisServerOptions = {}): Promise<RedisServer> {
  if (EXTERNAL_REDIS_URL) return externalServer(EXTERNAL_REDIS_URL)

  const dir = mkdtempSync(path.join(os.tmpdir(), 'mlr-'))
  const socketPath = opts.unixSocket ? path.join(dir, 'redis.sock') : undefined
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort()
    const argv = ['--port', String(port), '--save', '', '--appendonly', 'no', '--bind', '127.0.0.1', '--dir', dir]
    if (socketPath) argv.push('--unixsocket', socketPath, '--unixsocketperm', '700')
    argv.push(...(opts.args ?? []))
    const server = new LocalServer({ name: 'redis-server', dir, ports: [port], argv, socketPath, password: opts.password, username: opts.username })
    if (await server.start()) return server
  }
  rmSync(dir, { recursive: true, force: true })
  throw new Error(`could not start ${program}`)
}
