// What the Cluster and Sentinel helpers (redis-cluster.ts, redis-sentinel.ts) share: their
// processes are redis-server.ts' RedisProcess, each on fresh ports, in a sub-dir of its
// topology's temp dir, logging to `redis.log` there.
//
// The same rules as redis-server.ts: never port 6379, everything bound to 127.0.0.1, no
// persistence, every process in a temp dir (one per topology, one sub-dir per process)
// removed by `stop()`. A topology is always local: REDIS_URL names one external server,
// which can be neither a cluster nor a sentinel set-up, so the specs that use these skip
// themselves with `describe.skipIf(EXTERNAL_REDIS)` like the other kill/freeze tests.
//
// Start in `beforeAll`, `stop()` in `afterAll`. Nodes are RedisServer objects (cli, info,
// freeze/thaw, kill, restart, stop), so the helpers written for a single server take them.
// A start that fails quotes the tail of each process's log.
import { execFile } from 'node:child_process'
import { mkdirSync, rmSync } from 'node:fs'
import path from 'node:path'
import { performance } from 'node:perf_hooks'
import { promisify } from 'node:util'

import { freePort, RedisProcess, tail, type RedisServer } from './redis-server.js'

export const HOST = '127.0.0.1'
const execFileAsync = promisify(execFile)
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** A redis-server (or sentinel) process of a topology. */
export interface TopologyNode extends RedisServer {
  /** e.g. 'node-2', 'replica-1', 'sentinel-0'; also the name of its dir. */
  readonly name: string
  /** Its own dir (config, nodes.conf, redis.log); kept across restart(). */
  readonly dir: string
  /** Neither killed nor stopped (it may be frozen). */
  readonly running: boolean
  /** SIGSTOPped and not thawed yet. */
  readonly frozen: boolean
  /** Running and not frozen: it can answer. */
  readonly reachable: boolean
  readonly pid: number | undefined
  /** The first element of ROLE: 'master', 'slave' or 'sentinel'. */
  role(): Promise<string>
}

// freePort() closes its probe socket, so two calls in a row may hand out the same port:
// never give one out twice in this process.
const handedOut = new Set<number>()
async function takePorts(count: number): Promise<number[]> {
  const ports: number[] = []
  while (ports.length < count) {
    const port = await freePort()
    if (handedOut.has(port)) continue
    handedOut.add(port)
    ports.push(port)
  }
  return ports
}

/**
 * Poll `check` until it returns undefined (done) or the deadline passes; `check` returns why
 * it is not done yet, which the timeout error quotes. A throwing check counts as not done.
 */
export async function until(what: string, timeoutMs: number, check: () => Promise<string | undefined>, everyMs = 50): Promise<void> {
  const deadline = performance.now() + timeoutMs
  let why = 'not checked yet'
  for (;;) {
    try {
      const reason = await check()
      if (reason === undefined) return
      why = reason
    } catch (err) {
      why = (err as Error).message
    }
    if (performance.now() > deadline) throw new Error(`${what}: not done within ${timeoutMs} ms (${why})`)
    await sleep(everyMs)
  }
}

/**
 * Spawn one process in `root/name`, on `portCount` fresh ports (retried on new ports when
 * it cannot start, e.g. a port taken in between); `setup` writes any config file and returns the argv.
 */
export async function launch(
  root: string,
  name: string,
  portCount: number,
  password: string | undefined,
  setup: (dir: string, ports: number[]) => string[],
): Promise<RedisProcess> {
  const dir = path.join(root, name)
  let lastLog = ''
  for (let attempt = 0; attempt < 5; attempt++) {
    rmSync(dir, { recursive: true, force: true })
    mkdirSync(dir, { recursive: true })
    const ports = await takePorts(portCount)
    const node = new RedisProcess({ name, dir, ports, argv: setup(dir, ports), password })
    if (await node.start()) return node
    lastLog = tail(node.logFile)
  }
  throw new Error(`could not start ${name}:\n${lastLog}`)
}

/**
 * Run `count` launches at once and append the started nodes to `into` in index order, the
 * ones that did start even when another failed (so that stop() still reaches them).
 */
export async function launchAll<N extends RedisProcess>(count: number, into: N[], start: (i: number) => Promise<N>): Promise<void> {
  const results = await Promise.allSettled(Array.from({ length: count }, (_, i) => start(i)))
  for (const r of results) if (r.status === 'fulfilled') into.push(r.value)
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected')
  if (failed) throw failed.reason
}

/** Arguments every data node gets: local only, no persistence, full syncs without a delay. */
export function baseArgs(dir: string, port: number, password: string | undefined): string[] {
  const args = ['--port', String(port), '--bind', HOST, '--dir', dir, '--logfile', path.join(dir, 'redis.log')]
  args.push('--save', '', '--appendonly', 'no')
  // Diskless full sync (the 7.0 default) waits 5 s for more replicas before it starts.
  args.push('--repl-diskless-sync-delay', '0')
  if (password !== undefined) args.push('--requirepass', password, '--masterauth', password)
  return args
}

export async function redisCli(args: string[], password: string | undefined, timeoutMs: number): Promise<string> {
  const auth = password !== undefined ? ['-a', password, '--no-auth-warning'] : []
  try {
    const { stdout } = await execFileAsync('redis-cli', [...auth, ...args], { encoding: 'utf8', timeout: Math.round(timeoutMs), killSignal: 'SIGKILL' })
    return stdout
  } catch (err) {
    const e = err as Error & { stdout?: string; stderr?: string }
    const text = `redis-cli ${args.join(' ')} failed: ${e.message}\n${e.stdout ?? ''}${e.stderr ?? ''}`
    throw new Error(password !== undefined ? text.split(password).join('***') : text)
  }
}

/** Run `step`; when it fails, append the tail of these nodes' logs to its error. */
export async function withLogs<T>(nodes: TopologyNode[], step: () => Promise<T>, lines = 8): Promise<T> {
  try {
    return await step()
  } catch (err) {
    const logs = nodes.map((n) => `--- ${n.name} (port ${n.port})\n${tail(path.join(n.dir, 'redis.log'), lines)}`).join('\n')
    throw new Error(`${(err as Error).message}\n${logs}`)
  }
}

export async function stopAll(nodes: RedisProcess[], root: string) {
  await Promise.all(nodes.map((n) => n.stop()))
  rmSync(root, { recursive: true, force: true })
}

export function byPort<N extends RedisProcess>(nodes: N[], port: number): N {
  const node = nodes.find((n) => n.port === port)
  if (!node) throw new Error(`no node of this topology on port ${port}`)
  return node
}
