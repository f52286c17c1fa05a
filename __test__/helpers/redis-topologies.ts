// Real Redis Cluster and Redis Sentinel topologies for the tests, started on free ports.
//
// The same rules as redis-server.ts: never port 6379, everything bound to 127.0.0.1, no
// persistence, every process in a temp dir (one per topology, one sub-dir per process)
// removed by `stop()`. A topology is always local: REDIS_URL names one external server,
// which can be neither a cluster nor a sentinel set-up, so the specs that use these skip
// themselves with `describe.skipIf(EXTERNAL_REDIS)` like the other kill/freeze tests.
//
// Start in `beforeAll`, `stop()` in `afterAll`. Nodes are RedisServer objects (cli, info,
// freeze/thaw, kill, restart, stop), so the helpers written for a single server take them.
// Each process logs to `redis.log` in its own dir; a start that fails quotes its tail.
import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { performance } from 'node:perf_hooks'
import { promisify } from 'node:util'

import { freePort, RespClient, type RedisServer, type RespValue } from './redis-server.js'

// ---------------------------------------------------------------------------
// Shared plumbing
// ---------------------------------------------------------------------------

const HOST = '127.0.0.1'
const execFileAsync = promisify(execFile)
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

const live = new Set<ChildProcess>()
// Last resort: never leave a process behind, least of all a SIGSTOPped one.
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

/** A flat [k1, v1, k2, v2, ...] reply (SENTINEL replicas/sentinels entries) as an object. */
function pairs(reply: RespValue): Record<string, string> {
  const out: Record<string, string> = {}
  const items = Array.isArray(reply) ? reply : []
  for (let i = 0; i + 1 < items.length; i += 2) out[String(items[i])] = String(items[i + 1])
  return out
}

function tail(file: string, lines = 15): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n')
  } catch {
    return '(no log)'
  }
}

/**
 * Poll `check` until it returns undefined (done) or the deadline passes; `check` returns why
 * it is not done yet, which the timeout error quotes. A throwing check counts as not done.
 */
async function until(what: string, timeoutMs: number, check: () => Promise<string | undefined>, everyMs = 50): Promise<void> {
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

interface NodeSpec {
  name: string
  dir: string
  /** The client port first, then any other port the process listens on (a cluster bus). */
  ports: number[]
  /** The whole redis-server argv (a config file may only come first). */
  argv: string[]
  /** What the helper's own client authenticates with. */
  password?: string
}

class Node implements TopologyNode {
  readonly url: string
  readonly host = HOST
  readonly port: number
  readonly socketPath = undefined
  readonly external = false
  readonly name: string
  readonly dir: string
  readonly ports: number[]
  private proc: ChildProcess | undefined
  private isFrozen = false
  private readonly client: RespClient

  constructor(private readonly spec: NodeSpec) {
    this.name = spec.name
    this.dir = spec.dir
    this.ports = spec.ports
    this.port = spec.ports[0]!
    this.url = `redis://${HOST}:${this.port}`
    this.client = new RespClient({ host: HOST, port: this.port, password: spec.password })
  }

  get running() {
    return this.proc !== undefined
  }
  get frozen() {
    return this.isFrozen
  }
  get reachable() {
    return this.proc !== undefined && !this.isFrozen
  }
  get pid() {
    return this.proc?.pid
  }
  get logFile() {
    return path.join(this.dir, 'redis.log')
  }

  /** Spawn and wait for PING; false when the process exits first (e.g. its port is taken). */
  async start(timeoutMs = 10_000): Promise<boolean> {
    const child = spawn('redis-server', this.spec.argv, { cwd: this.dir, stdio: ['ignore', 'ignore', 'pipe'] })
    live.add(child)
    child.once('exit', () => live.delete(child))
    child.stderr?.resume()
    const probe = new RespClient({ host: HOST, port: this.port, password: this.spec.password }, 500)
    try {
      const deadline = performance.now() + timeoutMs
      while (performance.now() < deadline) {
        if (child.exitCode !== null || child.signalCode !== null) return false
        try {
          if ((await probe.command('PING')) === 'PONG') {
            this.proc = child
            this.isFrozen = false
            return true
          }
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
    return false
  }

  cli(...args: Array<string | number>): Promise<RespValue> {
    return this.client.command(...args)
  }
  async info(section: string) {
    return parseInfo(String(await this.client.command('INFO', section)))
  }
  async commandCalls() {
    const stats = await this.info('commandstats')
    const out: Record<string, number> = {}
    for (const [k, v] of Object.entries(stats)) {
      const m = /^cmdstat_(.+)$/.exec(k)
      const calls = /(?:^|,)calls=(\d+)/.exec(v)
      if (m && calls) out[m[1]!] = Number(calls[1])
    }
    return out
  }
  async flushScripts() {
    await this.client.command('SCRIPT', 'FLUSH')
  }
  async role() {
    const reply = await this.client.command('ROLE')
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
    this.client.close()
    const p = this.proc
    this.proc = undefined
    if (!p) return
    p.kill('SIGCONT')
    this.isFrozen = false
    p.kill('SIGKILL')
    await waitExit(p, 5000)
  }
  /** Start again on the same port(s) with the same dir, so a cluster node keeps its nodes.conf and id. */
  async restart() {
    await this.kill()
    const deadline = performance.now() + 10_000
    while (performance.now() < deadline) {
      if (await this.start()) return
      await sleep(50)
    }
    throw new Error(`could not restart ${this.name} on port ${this.port}:\n${tail(this.logFile)}`)
  }
  /** SIGKILL (no persistence to save, and a master's SIGTERM may wait for replicas); the dir stays. */
  async stop() {
    await this.kill()
  }
}

/**
 * Spawn one process in `root/name`, on `portCount` fresh ports (retried on new ports when
 * it cannot start, e.g. a port taken in between); `setup` writes any config file and returns the argv.
 */
async function launch(
  root: string,
  name: string,
  portCount: number,
  password: string | undefined,
  setup: (dir: string, ports: number[]) => string[],
): Promise<Node> {
  const dir = path.join(root, name)
  let lastLog = ''
  for (let attempt = 0; attempt < 5; attempt++) {
    rmSync(dir, { recursive: true, force: true })
    mkdirSync(dir, { recursive: true })
    const ports = await takePorts(portCount)
    const node = new Node({ name, dir, ports, argv: setup(dir, ports), password })
    if (await node.start()) return node
    lastLog = tail(node.logFile)
  }
  throw new Error(`could not start ${name}:\n${lastLog}`)
}

/**
 * Run `count` launches at once and append the started nodes to `into` in index order, the
 * ones that did start even when another failed (so that stop() still reaches them).
 */
async function launchAll<N extends Node>(count: number, into: N[], start: (i: number) => Promise<N>): Promise<void> {
  const results = await Promise.allSettled(Array.from({ length: count }, (_, i) => start(i)))
  for (const r of results) if (r.status === 'fulfilled') into.push(r.value)
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected')
  if (failed) throw failed.reason
}

/** Arguments every data node gets: local only, no persistence, full syncs without a delay. */
function baseArgs(dir: string, port: number, password: string | undefined): string[] {
  const args = ['--port', String(port), '--bind', HOST, '--dir', dir, '--logfile', path.join(dir, 'redis.log')]
  args.push('--save', '', '--appendonly', 'no')
  // Diskless full sync (the 7.0 default) waits 5 s for more replicas before it starts.
  args.push('--repl-diskless-sync-delay', '0')
  if (password !== undefined) args.push('--requirepass', password, '--masterauth', password)
  return args
}

async function redisCli(args: string[], password: string | undefined, timeoutMs: number): Promise<string> {
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
async function withLogs<T>(nodes: TopologyNode[], step: () => Promise<T>, lines = 8): Promise<T> {
  try {
    return await step()
  } catch (err) {
    const logs = nodes.map((n) => `--- ${n.name} (port ${n.port})\n${tail(path.join(n.dir, 'redis.log'), lines)}`).join('\n')
    throw new Error(`${(err as Error).message}\n${logs}`)
  }
}

async function stopAll(nodes: Node[], root: string) {
  await Promise.all(nodes.map((n) => n.stop()))
  rmSync(root, { recursive: true, force: true })
}

function byPort<N extends Node>(nodes: N[], port: number): N {
  const node = nodes.find((n) => n.port === port)
  if (!node) throw new Error(`no node of this topology on port ${port}`)
  return node
}

// ---------------------------------------------------------------------------
// Cluster
// ---------------------------------------------------------------------------

export interface ClusterOptions {
  /** At least 3 (redis-cli --cluster create needs 3). Default 3. */
  masters?: number
  /** Default 1. */
  replicasPerMaster?: number
  /** cluster-node-timeout; failure detection and promotion take about 2-3x this. Default 1000. */
  nodeTimeoutMs?: number
  /** requirepass and masterauth on every node; the helper's clients and redis-cli use it. */
  password?: string
  /** How long start() may take before it gives up. Default 20 s. */
  startTimeoutMs?: number
}

export interface ClusterNode extends TopologyNode {
  /** The cluster bus port (set explicitly with cluster-port, never port + 10000). */
  readonly busPort: number
  /** CLUSTER MYID: kept across restart(), which reuses nodes.conf. */
  readonly id: string
}

export interface RedisCluster {
  /** Every node, in start order: the first `masters` were created as masters. */
  readonly nodes: ClusterNode[]
  /** Seed URLs, `redis://127.0.0.1:port`, one per node (no credentials). */
  readonly urls: string[]
  readonly password: string | undefined
  /** Reachable nodes whose ROLE is master, right now. */
  masters(): Promise<ClusterNode[]>
  /** Reachable nodes whose ROLE is slave, right now. */
  replicas(): Promise<ClusterNode[]>
  /** Reachable replicas (ROLE) that replicate `master`. */
  replicasOf(master: ClusterNode): Promise<ClusterNode[]>
  /** The slot's owner according to CLUSTER SLOTS on a reachable node. */
  masterOfSlot(slot: number): Promise<ClusterNode>
  /** CLUSTER KEYSLOT on a reachable node. */
  keySlot(key: string): Promise<number>
  /**
   * CLUSTER FAILOVER [FORCE|TAKEOVER] on `replica`, then wait until it is master, its old master
   * (if reachable) a replica, and the cluster healthy. Returns the elapsed ms.
   */
  failover(replica: ClusterNode, mode?: 'FORCE' | 'TAKEOVER'): Promise<number>
  /**
   * SIGKILL `master`, wait until one of its replicas is master and the cluster healthy again
   * (cluster_state:ok and the same slot owners on every reachable node). Returns the elapsed ms.
   */
  killMasterAndWaitForPromotion(master: ClusterNode): Promise<number>
  /**
   * Move one slot and its keys to `toMaster` (IMPORTING/MIGRATING, GETKEYSINSLOT + MIGRATE ... KEYS,
   * SETSLOT NODE on every master), then wait until every reachable node agrees. Returns the keys moved.
   */
  migrateSlot(slot: number, toMaster: ClusterNode): Promise<number>
  /** Why the cluster is not healthy, or undefined when it is (see waitHealthy). */
  health(): Promise<string | undefined>
  /**
   * Wait until every reachable node says cluster_state:ok with all slots assigned and lists the
   * same slot owners (reachable masters), every reachable replica's master link is up, and in
   * every reachable node's CLUSTER NODES the reachable nodes carry no failure flag, a connected
   * bus link and their actual roles. Default timeout 15 s.
   */
  waitHealthy(timeoutMs?: number): Promise<void>
  /** Kill every node (thawed first) and remove the temp dir; idempotent. */
  stop(): Promise<void>
}

type ClusterMember = Node & { busPort: number; id: string }

export async function startCluster(opts: ClusterOptions = {}): Promise<RedisCluster> {
  const masters = opts.masters ?? 3
  const replicasPerMaster = opts.replicasPerMaster ?? 1
  const nodeTimeoutMs = opts.nodeTimeoutMs ?? 1000
  const password = opts.password
  const startTimeoutMs = opts.startTimeoutMs ?? 20_000
  if (masters < 3) throw new Error('a cluster needs at least 3 masters')
  const total = masters * (1 + replicasPerMaster)
  const t0 = performance.now()

  const root = mkdtempSync(path.join(os.tmpdir(), 'mlr-cluster-'))
  const nodes: ClusterMember[] = []
  let stopped = false
  const stop = async () => {
    if (stopped) return
    stopped = true
    await stopAll(nodes, root)
  }

  try {
    await launchAll(total, nodes, (i) =>
      launch(root, `node-${i}`, 2, password, (dir, [port, bus]) => [
        ...baseArgs(dir, port!, password),
        '--cluster-enabled', 'yes',
        '--cluster-port', String(bus),
        '--cluster-config-file', path.join(dir, 'nodes.conf'),
        '--cluster-node-timeout', String(nodeTimeoutMs),
      ]).then((node) => Object.assign(node, { busPort: node.ports[1]!, id: '' })),
    )
    for (const node of nodes) node.id = String(await node.cli('CLUSTER', 'MYID'))

    await redisCli(
      ['--cluster', 'create', ...nodes.map((n) => `${HOST}:${n.port}`), '--cluster-replicas', String(replicasPerMaster), '--cluster-yes'],
      password,
      Math.max(1000, startTimeoutMs - (performance.now() - t0)),
    )
  } catch (err) {
    await stop()
    throw err
  }

  const reachable = () => nodes.filter((n) => n.reachable)
  const rolesOf = async () => Promise.all(reachable().map(async (n) => ({ node: n, role: (await n.cli('ROLE')) as RespValue[] })))

  const cluster: RedisCluster = {
    nodes,
    urls: nodes.map((n) => n.url),
    password,
    async masters() {
      return (await rolesOf()).filter((r) => r.role[0] === 'master').map((r) => r.node)
    },
    async replicas() {
      return (await rolesOf()).filter((r) => r.role[0] === 'slave').map((r) => r.node)
    },
    async replicasOf(master) {
      return (await rolesOf()).filter((r) => r.role[0] === 'slave' && Number(r.role[2]) === master.port).map((r) => r.node)
    },
    async masterOfSlot(slot) {
      const node = reachable()[0]
      if (!node) throw new Error('no reachable cluster node')
      const ranges = (await node.cli('CLUSTER', 'SLOTS')) as RespValue[][]
      const range = ranges.find((r) => Number(r[0]) <= slot && slot <= Number(r[1]))
      if (!range) throw new Error(`slot ${slot} has no owner according to ${node.name}`)
      return byPort(nodes, Number((range[2] as RespValue[])[1]))
    },
    async keySlot(key) {
      const node = reachable()[0]
      if (!node) throw new Error('no reachable cluster node')
      return Number(await node.cli('CLUSTER', 'KEYSLOT', key))
    },
    async failover(replica, mode) {
      const role = (await replica.cli('ROLE')) as RespValue[]
      if (role[0] !== 'slave') throw new Error(`${replica.name} is not a replica`)
      const oldMaster = byPort(nodes, Number(role[2]))
      const start = performance.now()
      await replica.cli('CLUSTER', 'FAILOVER', ...(mode ? [mode] : []))
      await withLogs([replica, oldMaster], () =>
        until(`failover to ${replica.name}`, 15_000, async () => {
          if ((await replica.role()) !== 'master') return `${replica.name} is not master yet`
          if (oldMaster.reachable && (await oldMaster.role()) !== 'slave') return `${oldMaster.name} is not a replica yet`
          return cluster.health()
        }),
      )
      return performance.now() - start
    },
    async killMasterAndWaitForPromotion(master) {
      if ((await master.role()) !== 'master') throw new Error(`${master.name} is not a master`)
      const candidates = await cluster.replicasOf(master)
      if (candidates.length === 0) throw new Error(`${master.name} has no replica to promote`)
      const start = performance.now()
      await master.kill()
      await until(`promotion of a replica of ${master.name}`, 10 * nodeTimeoutMs + 10_000, async () => {
        const roles = await Promise.all(candidates.filter((c) => c.reachable).map((c) => c.role()))
        if (!roles.includes('master')) return `no replica of ${master.name} is master yet`
        return cluster.health()
      })
      return performance.now() - start
    },
    async migrateSlot(slot, toMaster) {
      const from = await cluster.masterOfSlot(slot)
      if (from === toMaster) return 0
      if ((await toMaster.role()) !== 'master') throw new Error(`${toMaster.name} is not a master`)
      await toMaster.cli('CLUSTER', 'SETSLOT', slot, 'IMPORTING', from.id)
      await from.cli('CLUSTER', 'SETSLOT', slot, 'MIGRATING', toMaster.id)
      const auth = password !== undefined ? ['AUTH', password] : []
      let moved = 0
      for (;;) {
        const keys = (await from.cli('CLUSTER', 'GETKEYSINSLOT', slot, 100)) as string[]
        if (keys.length === 0) break
        await from.cli('MIGRATE', toMaster.host, toMaster.port, '', 0, 5000, ...auth, 'KEYS', ...keys)
        moved += keys.length
      }
      // The target first, then the source, then the other masters (as redis-cli --cluster reshard does).
      await toMaster.cli('CLUSTER', 'SETSLOT', slot, 'NODE', toMaster.id)
      await from.cli('CLUSTER', 'SETSLOT', slot, 'NODE', toMaster.id)
      for (const m of await cluster.masters()) {
        if (m !== toMaster && m !== from) await m.cli('CLUSTER', 'SETSLOT', slot, 'NODE', toMaster.id)
      }
      await until(`slot ${slot} owned by ${toMaster.name} everywhere`, 10_000, async () => {
        for (const node of reachable()) {
          const ranges = (await node.cli('CLUSTER', 'SLOTS')) as RespValue[][]
          const range = ranges.find((r) => Number(r[0]) <= slot && slot <= Number(r[1]))
          const owner = range ? Number((range[2] as RespValue[])[1]) : undefined
          if (owner !== toMaster.port) return `${node.name} sees slot ${slot} on port ${owner}`
        }
        return cluster.health()
      })
      return moved
    },
    async health() {
      const views = new Map<string, string>()
      const live = reachable()
      const masterPorts = new Set<number>()
      /** node id -> what every node should say about it in CLUSTER NODES: 'master' or the id of its master. */
      const expected = new Map<string, string>()
      for (const node of live) {
        const role = (await node.cli('ROLE')) as RespValue[]
        if (role[0] === 'master') {
          masterPorts.add(node.port)
          expected.set(node.id, 'master')
        } else if (role[0] === 'slave') {
          const link = (await node.info('replication'))['master_link_status']
          if (link !== 'up') return `${node.name}: master_link_status:${link}`
          expected.set(node.id, byPort(nodes, Number(role[2])).id)
        }
      }
      for (const node of live) {
        // Each node's view of the others: no failure flag left on a node that is back, and
        // the roles as they are (a manual failover is ignored by a master that still sees its
        // replica as failed or as a master, e.g. just after the replica restarted).
        for (const line of String(await node.cli('CLUSTER', 'NODES')).split('\n')) {
          const [id, , flagList, masterId, , , , linkState] = line.split(' ')
          const want = id ? expected.get(id) : undefined
          if (!id || want === undefined) continue
          const flags = (flagList ?? '').split(',')
          const other = nodes.find((n) => n.id === id)!.name
          if (flags.some((f) => f === 'fail' || f === 'fail?' || f === 'handshake' || f === 'noaddr')) return `${node.name} flags ${other} ${flagList}`
          if (!flags.includes('myself') && linkState !== 'connected') return `${node.name}: bus link to ${other} ${linkState}`
          const seen = flags.includes('master') ? 'master' : masterId
          if (seen !== want) return `${node.name} sees ${other} as ${flags.includes('master') ? 'a master' : `a replica of ${masterId}`}`
        }
      }
      for (const node of live) {
        const info = parseInfo(String(await node.cli('CLUSTER', 'INFO')))
        if (info['cluster_state'] !== 'ok') return `${node.name}: cluster_state:${info['cluster_state']}`
        if (info['cluster_slots_assigned'] !== '16384') return `${node.name}: cluster_slots_assigned:${info['cluster_slots_assigned']}`
        if (Number(info['cluster_known_nodes']) !== nodes.length) return `${node.name}: cluster_known_nodes:${info['cluster_known_nodes']}`
        const ranges = (await node.cli('CLUSTER', 'SLOTS')) as RespValue[][]
        const owners = ranges
          .map((r) => ({ from: Number(r[0]), to: Number(r[1]), port: Number((r[2] as RespValue[])[1]) }))
          .sort((a, b) => a.from - b.from)
        for (const o of owners) {
          if (!masterPorts.has(o.port)) return `${node.name} sees slots ${o.from}-${o.to} on port ${o.port}, not a reachable master`
        }
        views.set(node.name, owners.map((o) => `${o.from}-${o.to}@${o.port}`).join(','))
      }
      if (new Set(views.values()).size > 1) return `the nodes disagree on slot owners: ${JSON.stringify(Object.fromEntries(views))}`
      return undefined
    },
    async waitHealthy(timeoutMs = 15_000) {
      await until('healthy cluster', timeoutMs, () => cluster.health())
    },
    stop,
  }

  try {
    const left = Math.max(1000, startTimeoutMs - (performance.now() - t0))
    await until('cluster start', left, async () => {
      const roles = await rolesOf()
      const masterCount = roles.filter((r) => r.role[0] === 'master').length
      if (masterCount !== masters) return `${masterCount} masters, expected ${masters}`
      for (const r of roles.filter((x) => x.role[0] === 'master')) {
        const count = roles.filter((x) => x.role[0] === 'slave' && Number(x.role[2]) === r.node.port).length
        if (count !== replicasPerMaster) return `${r.node.name} has ${count} replicas, expected ${replicasPerMaster}`
      }
      return cluster.health()
    })
  } catch (err) {
    const logs = nodes.map((n) => `--- ${n.name}\n${tail(n.logFile, 5)}`).join('\n')
    await stop()
    throw new Error(`${(err as Error).message}\n${logs}`)
  }
  return cluster
}

// ---------------------------------------------------------------------------
// Sentinel
// ---------------------------------------------------------------------------

export interface SentinelOptions {
  /** Replicas of the initial master. Default 2. */
  replicas?: number
  /** Default 3; the quorum is a majority of them. */
  sentinels?: number
  /** Default 'mymaster'. */
  masterName?: string
  /** sentinel down-after-milliseconds. Default 1000. */
  downAfterMs?: number
  /** sentinel failover-timeout. Default 3000. */
  failoverTimeoutMs?: number
  /** requirepass/masterauth on the data nodes and `sentinel auth-pass` (the sentinels need none). */
  password?: string
  /** How long start() may take before it gives up. Default 20 s. */
  startTimeoutMs?: number
}

export interface RedisSentinel {
  readonly masterName: string
  readonly password: string | undefined
  /** The data nodes: the initial master first, then its replicas. */
  readonly servers: TopologyNode[]
  /** The sentinel processes (cli talks to the sentinel). */
  readonly sentinels: TopologyNode[]
  /** `redis://127.0.0.1:port`, one per sentinel. */
  readonly sentinelUrls: string[]
  /** The current master, from SENTINEL get-master-addr-by-name on a reachable sentinel. */
  master(): Promise<TopologyNode>
  /**
   * SIGKILL the current master, wait until every reachable sentinel reports the same other
   * master and that node's ROLE is master. Returns the elapsed ms.
   */
  killMasterAndWaitForFailover(): Promise<number>
  /**
   * SENTINEL FAILOVER (retried while the sentinel has no good replica yet), then the same wait.
   * Returns the elapsed ms. The old master goes on running as a master until the sentinels
   * reconfigure it as a replica (Sentinel waits ~8 s for that, then its next INFO): use
   * waitHealthy() when the test needs that too.
   */
  failover(): Promise<number>
  /** Why the set-up is not settled, or undefined (see waitHealthy). */
  health(): Promise<string | undefined>
  /**
   * Wait until every reachable sentinel reports the same master, whose ROLE is master, every
   * reachable other server replicates it with its link up, and each sentinel lists those
   * replicas (not down) and knows the other sentinels. Default timeout 30 s.
   */
  waitHealthy(timeoutMs?: number): Promise<void>
  /** Kill every process (thawed first) and remove the temp dir; idempotent. */
  stop(): Promise<void>
}

export async function startSentinel(opts: SentinelOptions = {}): Promise<RedisSentinel> {
  const replicaCount = opts.replicas ?? 2
  const sentinelCount = opts.sentinels ?? 3
  const masterName = opts.masterName ?? 'mymaster'
  const downAfterMs = opts.downAfterMs ?? 1000
  const failoverTimeoutMs = opts.failoverTimeoutMs ?? 3000
  const password = opts.password
  const startTimeoutMs = opts.startTimeoutMs ?? 20_000
  const quorum = Math.floor(sentinelCount / 2) + 1
  const t0 = performance.now()

  const root = mkdtempSync(path.join(os.tmpdir(), 'mlr-sentinel-'))
  const servers: Node[] = []
  const sentinels: Node[] = []
  let stopped = false
  const stop = async () => {
    if (stopped) return
    stopped = true
    await stopAll([...sentinels, ...servers], root)
  }
  const timeLeft = () => Math.max(1000, startTimeoutMs - (performance.now() - t0))

  const reachableSentinels = () => sentinels.filter((s) => s.reachable)
  const reportedMasters = async () =>
    Promise.all(
      reachableSentinels().map(async (s) => {
        const addr = (await s.cli('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', masterName)) as RespValue[] | null
        return { sentinel: s, port: addr ? Number(addr[1]) : undefined }
      }),
    )

  /** Every reachable sentinel reports the same master, not `notPort`, and its ROLE is master. */
  const switched = async (notPort: number | undefined): Promise<string | undefined> => {
    const reports = await reportedMasters()
    if (reports.length === 0) return 'no reachable sentinel'
    for (const r of reports) {
      if (r.port === undefined || r.port === notPort) return `${r.sentinel.name} reports port ${r.port}`
    }
    const port = reports[0]!.port!
    if (reports.some((r) => r.port !== port)) return `sentinels disagree: ${reports.map((r) => r.port).join(', ')}`
    const master = byPort(servers, port)
    if (!master.reachable) return `${master.name} (reported master) is not reachable`
    const role = await master.role()
    return role === 'master' ? undefined : `${master.name} (reported master) has ROLE ${role}`
  }

  /**
   * Settled: the sentinels agree on a master whose ROLE is master, every other reachable server
   * replicates it with its link up, and every sentinel lists those replicas (not down) and knows
   * the other sentinels. `strict` (at start) also wants each sentinel's own view of every
   * replica's link to be ok; after a failover a sentinel refreshes a replica's INFO only every
   * 10 s, so its view of the old master lags for that long.
   */
  const health = async (strict: boolean): Promise<string | undefined> => {
    const why = await switched(undefined)
    if (why) return why
    const master = await topology.master()
    const others = servers.filter((s) => s !== master && s.reachable)
    for (const replica of others) {
      const info = await replica.info('replication')
      if (info['role'] !== 'slave' || Number(info['master_port']) !== master.port) return `${replica.name} does not replicate ${master.name} yet`
      if (info['master_link_status'] !== 'up') return `${replica.name}: master_link_status:${info['master_link_status']}`
    }
    for (const s of reachableSentinels()) {
      const listed = ((await s.cli('SENTINEL', 'REPLICAS', masterName)) as RespValue[]).map(pairs)
      for (const replica of others) {
        const entry = listed.find((r) => Number(r['port']) === replica.port)
        if (!entry) return `${s.name} does not list ${replica.name}`
        const flags = String(entry['flags']).split(',')
        if (!flags.includes('slave') || flags.some((f) => f === 's_down' || f === 'o_down' || f === 'disconnected')) {
          return `${s.name} lists ${replica.name} as ${entry['flags']}`
        }
        if (strict && (entry['master-link-status'] !== 'ok' || Number(entry['master-port']) !== master.port)) {
          return `${s.name} sees ${replica.name} with link ${entry['master-link-status']} to port ${entry['master-port']}`
        }
      }
      const peers = ((await s.cli('SENTINEL', 'SENTINELS', masterName)) as RespValue[]).map(pairs)
      if (peers.length < sentinels.length - 1) return `${s.name} knows ${peers.length} other sentinels`
    }
    return undefined
  }

  const topology: RedisSentinel = {
    masterName,
    password,
    servers,
    sentinels,
    sentinelUrls: [],
    async master() {
      for (const s of reachableSentinels()) {
        const addr = (await s.cli('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', masterName)) as RespValue[] | null
        if (addr) return byPort(servers, Number(addr[1]))
      }
      throw new Error(`no reachable sentinel knows ${masterName}`)
    },
    async killMasterAndWaitForFailover() {
      const old = await topology.master()
      const start = performance.now()
      await old.kill()
      await until(`sentinel failover away from ${old.name}`, 4 * failoverTimeoutMs + 10 * downAfterMs + 10_000, () => switched(old.port))
      return performance.now() - start
    },
    async failover() {
      const old = await topology.master()
      const start = performance.now()
      await until('SENTINEL FAILOVER accepted', 2 * failoverTimeoutMs + 10_000, async () => {
        const s = reachableSentinels()[0]
        if (!s) return 'no reachable sentinel'
        try {
          await s.cli('SENTINEL', 'FAILOVER', masterName)
          return undefined
        } catch (err) {
          // -NOGOODSLAVE while the replicas still resync, -INPROG during a failover.
          if (/NOGOODSLAVE|INPROG/.test((err as Error).message)) return (err as Error).message
          throw err
        }
      }, 100)
      await until(`sentinel failover away from ${old.name}`, 4 * failoverTimeoutMs + 10_000, () => switched(old.port))
      return performance.now() - start
    },
    health: () => health(false),
    async waitHealthy(timeoutMs = 30_000) {
      await until('settled sentinel set-up', timeoutMs, () => topology.health())
    },
    stop,
  }

  try {
    const master = await launch(root, 'master', 1, password, (dir, [port]) => baseArgs(dir, port!, password))
    servers.push(master)
    await launchAll(replicaCount, servers, (i) =>
      launch(root, `replica-${i}`, 1, password, (dir, [port]) => [...baseArgs(dir, port!, password), '--replicaof', HOST, String(master.port)]),
    )
    await until('replication links up', timeLeft(), async () => {
      for (const replica of servers.slice(1)) {
        const link = (await replica.info('replication'))['master_link_status']
        if (link !== 'up') return `${replica.name}: master_link_status:${link}`
      }
      return undefined
    })

    await launchAll(sentinelCount, sentinels, (i) =>
      launch(root, `sentinel-${i}`, 1, undefined, (dir, [port]) => {
        const conf = path.join(dir, 'sentinel.conf')
        const lines = [
          `port ${port}`,
          `bind ${HOST}`,
          `dir ${dir}`,
          `logfile ${path.join(dir, 'redis.log')}`,
          'sentinel resolve-hostnames no',
          `sentinel monitor ${masterName} ${HOST} ${master.port} ${quorum}`,
          `sentinel down-after-milliseconds ${masterName} ${downAfterMs}`,
          `sentinel failover-timeout ${masterName} ${failoverTimeoutMs}`,
          `sentinel parallel-syncs ${masterName} ${replicaCount}`,
        ]
        if (password !== undefined) lines.push(`sentinel auth-pass ${masterName} ${password}`)
        writeFileSync(conf, lines.join('\n') + '\n')
        return [conf, '--sentinel']
      }),
    )
    topology.sentinelUrls.push(...sentinels.map((s) => s.url))

    await until('sentinels discover the set-up', timeLeft(), () => health(true))
  } catch (err) {
    const logs = [...servers, ...sentinels]
      .filter((n) => existsSync(n.logFile))
      .map((n) => `--- ${n.name}\n${tail(n.logFile, 5)}`)
      .join('\n')
    await stop()
    throw new Error(`${(err as Error).message}\n${logs}`)
  }
  return topology
}
