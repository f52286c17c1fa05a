// A real Redis Cluster for the tests, started on free ports (see redis-process.ts for the
// rules every topology follows): `masters` masters with `replicasPerMaster` replicas each,
// made a cluster by `redis-cli --cluster create`, and the faults the specs inject into it
// (manual failover, a killed master, a slot moved).
import { mkdtempSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { performance } from 'node:perf_hooks'

import { baseArgs, byPort, HOST, launch, launchAll, redisCli, stopAll, until, withLogs, type TopologyNode } from './redis-process.js'
import { parseInfo, tail, type RedisProcess, type RespValue } from './redis-server.js'

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

type ClusterMember = RedisProcess & { busPort: number; id: string }

/**
 * `perMaster` fresh keys (drawn by `newKey`) on each master, and how many masters that is.
 * Fresh keys fall on a master by chance (twelve drawn at once miss one of three masters about
 * once in 40 runs), so this draws until every master has its share. `stored(key)` is the name
 * the key has in Redis, whose slot decides.
 */
export async function keysOnEveryMaster(
  cluster: RedisCluster,
  perMaster: number,
  newKey: () => string,
  stored: (key: string) => string,
): Promise<{ keys: string[]; masters: number }> {
  const masters = (await cluster.masters()).length
  const keys: string[] = []
  const onMaster = new Map<number, number>()
  while (keys.length < perMaster * masters) {
    const key = newKey()
    const port = (await cluster.masterOfSlot(await cluster.keySlot(stored(key)))).port
    if ((onMaster.get(port) ?? 0) >= perMaster) continue
    onMaster.set(port, (onMaster.get(port) ?? 0) + 1)
    keys.push(key)
  }
  return { keys, masters: onMaster.size }
}

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
