// A real Redis Sentinel set-up for the tests, started on free ports (see redis-process.ts
// for the rules every topology follows): a master, its replicas and the sentinels watching
// them, and the failovers the specs wait for.
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { performance } from 'node:perf_hooks'

import { baseArgs, byPort, HOST, launch, launchAll, stopAll, until, type TopologyNode } from './redis-process.js'
import { tail, type RedisProcess, type RespValue } from './redis-server.js'

/** A flat [k1, v1, k2, v2, ...] reply (SENTINEL replicas/sentinels entries) as an object. */
function pairs(reply: RespValue): Record<string, string> {
  const out: Record<string, string> = {}
  const items = Array.isArray(reply) ? reply : []
  for (let i = 0; i + 1 < items.length; i += 2) out[String(items[i])] = String(items[i + 1])
  return out
}

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
  const servers: RedisProcess[] = []
  const sentinels: RedisProcess[] = []
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
