// Leases beyond one server: what a 3-master Redis Cluster and failover-safe grants
// (`minReplicas`) cost, each against a peer in the same run. Starts its own servers: a master
// with one replica, and a cluster of 3 masters (no replicas: the routing is what is measured).
// Run with `npm run bench:topologies` (builds first) or `node bench/topologies.mjs`.
// BENCH_SCALE=0.2 shrinks every op count.
//
// On a 2-core machine the three masters share the cores the client runs on: the cluster row
// shows what routing per hash slot costs a client, not what sharding adds in capacity.
import { execFile, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { createClient, createCluster } from 'redis';
import { hr, SCALE, pct, medianOf, printResults, ratioRow, printRatios } from './harness.mjs';

const n = (x) => Math.max(1000, Math.round(x * SCALE));
const TTL = 60_000;
const IN_FLIGHT = 64;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---------- servers ---------------------------------------------------------------------------
const tmp = mkdtempSync(join(tmpdir(), 'topology-bench-'));
const processes = [];
const freePort = () => new Promise((res, rej) => {
  const s = createServer().once('error', rej).listen(0, '127.0.0.1', () => {
    const { port } = s.address(); s.close(() => res(port));
  });
});
async function redisServer(name, ...args) {
  let port; do port = await freePort(); while (port === 6379);
  const dir = join(tmp, name);
  mkdirSync(dir, { recursive: true });
  const server = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '',
    '--appendonly', 'no', '--dir', dir, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  processes.push(server);
  await new Promise((res, rej) => {
    const t = setTimeout(() => rej(new Error(`${name} did not start`)), 10_000);
    server.once('exit', (c) => rej(new Error(`${name} exited (${c})`)));
    server.stdout.on('data', (d) => { if (/Ready to accept connections/.test(d)) { clearTimeout(t); res(); } });
  });
  return port;
}
const stopAll = () => {
  for (const p of processes) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
};
process.on('exit', stopAll);

const masterPort = await redisServer('master');
const replicaPort = await redisServer('replica', '--replicaof', '127.0.0.1', String(masterPort));
const single = `redis://127.0.0.1:${masterPort}`;
const clusterPorts = [];
for (let i = 0; i < 3; i++) clusterPorts.push(await redisServer(`node-${i}`, '--cluster-enabled', 'yes'));
await promisify(execFile)('redis-cli', ['--cluster', 'create', ...clusterPorts.map((p) => `127.0.0.1:${p}`), '--cluster-yes']);
const admins = await Promise.all([masterPort, replicaPort, ...clusterPorts].map(async (port) => {
  const c = createClient({ url: `redis://127.0.0.1:${port}` });
  c.on('error', () => {});
  await c.connect();
  return c;
}));
const [masterAdmin, replicaAdmin, ...nodeAdmins] = admins;
for (;;) {
  const states = await Promise.all(nodeAdmins.map((a) => a.sendCommand(['CLUSTER', 'INFO'])));
  if (states.every((s) => /cluster_state:ok/.test(s))) break;
  await sleep(100);
}
for (;;) {
  if (/master_link_status:up/.test(await replicaAdmin.info('replication'))) break;
  await sleep(100);
}
const cpuOf = async (admin) => {
  const info = await admin.info('cpu');
  const get = (f) => Number(new RegExp(`${f}:([\\d.]+)`).exec(info)?.[1] ?? NaN);
  return get('used_cpu_user_main_thread') + get('used_cpu_sys_main_thread');
};

// ---------- contestants ---------------------------------------------------------------------
const native = createRequire(import.meta.url)('../index.js');
const RENEW = `if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end return 0`;
const RELEASE = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`;
const TRANSFER = `if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0`;
const SHA = {};
for (const a of nodeAdmins) {
  for (const [k, src] of Object.entries({ renew: RENEW, release: RELEASE, transfer: TRANSFER })) SHA[k] = await a.scriptLoad(src);
}
// Mastra's algorithm (SET NX PX, then a refresh-if-same-owner script, then GET) through
// node-redis (its cluster client on the cluster): the peer a Mastra user has today.
class MastraAlgorithm {
  constructor(client, prefix) { this.c = client; this.p = `${prefix}:lease:`; }
  async acquireLease(key, owner, ttl) {
    const k = this.p + key;
    if ((await this.c.set(k, owner, { condition: 'NX', expiration: { type: 'PX', value: ttl } })) === 'OK') return { acquired: true, owner };
    if ((await this.c.evalSha(SHA.renew, { keys: [k], arguments: [owner, String(ttl)] })) === 1) return { acquired: true, owner };
    return { acquired: false, owner: (await this.c.get(k)) ?? undefined };
  }
  async getLeaseOwner(key) { return (await this.c.get(this.p + key)) ?? undefined; }
  async releaseLease(key, owner) { await this.c.evalSha(SHA.release, { keys: [this.p + key], arguments: [owner] }); }
  async renewLease(key, owner, ttl) { return (await this.c.evalSha(SHA.renew, { keys: [this.p + key], arguments: [owner, String(ttl)] })) === 1; }
  async transferLease(key, from, to, ttl) { return (await this.c.evalSha(SHA.transfer, { keys: [this.p + key], arguments: [from, to, String(ttl)] })) === 1; }
}
const clusterClient = createCluster({ rootNodes: clusterPorts.map((p) => ({ url: `redis://127.0.0.1:${p}` })) });
clusterClient.on('error', (e) => console.error('cluster client error', e));
await clusterClient.connect();

const singleClient = createClient({ url: single });
singleClient.on('error', (e) => console.error('client error', e));
await singleClient.connect();
for (const [k, src] of Object.entries({ renew: RENEW, release: RELEASE, transfer: TRANSFER })) await singleClient.scriptLoad(src);

const OURS = 'ours, one server', PEER = 'Mastra alg., node-redis', OURS_WAIT = 'ours, minReplicas 1', OURS_CLUSTER = 'ours, 3-master cluster', PEER_CLUSTER = 'Mastra alg., node-redis cluster';
const contestants = {
  [OURS]: { p: new native.RedisLeaseProvider({ url: single, keyPrefix: 'b1' }), admins: [masterAdmin] },
  [PEER]: { p: new MastraAlgorithm(singleClient, 'b5'), admins: [masterAdmin] },
  [OURS_WAIT]: { p: new native.RedisLeaseProvider({ url: single, keyPrefix: 'b2', minReplicas: 1 }), admins: [masterAdmin] },
  [OURS_CLUSTER]: { p: new native.RedisLeaseProvider({ cluster: { nodes: clusterPorts.map((p) => `redis://127.0.0.1:${p}`) }, keyPrefix: 'b3' }), admins: nodeAdmins },
  [PEER_CLUSTER]: { p: new MastraAlgorithm(clusterClient, 'b4'), admins: nodeAdmins },
};

// ---------- the workload: the lease lifecycle Mastra drives, 5 calls a unit -------------------
let runSeq = 0;
async function measure(name, units) {
  const { p, admins: servers } = contestants[name];
  const tag = `r${runSeq++}`;
  const lat = new Float64Array(units * 5);
  let li = 0, bad = 0, next = 0;
  const rec = (t) => { lat[li++] = Number(hr() - t) / 1e3; };
  const worker = async (w) => {
    for (let i; (i = next++) < units;) {
      const k = `${tag}:l${i}`, a = `a${w}`, b = `b${w}`;
      try {
        let t = hr(); const r = await p.acquireLease(k, a, TTL); rec(t);
        t = hr(); const renewed = await p.renewLease(k, a, TTL); rec(t);
        t = hr(); const o = await p.getLeaseOwner(k); rec(t);
        t = hr(); const moved = await p.transferLease(k, a, b, TTL); rec(t);
        t = hr(); await p.releaseLease(k, b); rec(t);
        if (r.acquired !== true || renewed !== true || o !== a || moved !== true) bad++;
      } catch { bad++; }
    }
  };
  const cpu0 = (await Promise.all(servers.map(cpuOf))).reduce((x, y) => x + y, 0);
  const t0 = hr();
  await Promise.all(Array.from({ length: IN_FLIGHT }, (_, w) => worker(w)));
  const secs = Number(hr() - t0) / 1e9;
  const cpu = (await Promise.all(servers.map(cpuOf))).reduce((x, y) => x + y, 0) - cpu0;
  const sorted = lat.subarray(0, li).sort();
  return { opsPerSec: li / secs, p50Us: pct(sorted, 0.5), p99Us: pct(sorted, 0.99), calls: li, bad, serverUsPerCall: (cpu * 1e6) / li };
}

const units = n(20_000);
process.stdout.write(`lifecycle @${IN_FLIGHT} in flight ...`);
const results = await medianOf(Object.keys(contestants), {
  warmup: (nm) => measure(nm, Math.ceil(units / 10)),
  run: (nm) => measure(nm, units),
  between: async () => {
    await masterAdmin.flushAll();
    for (const a of nodeAdmins) await a.flushAll();
  },
});
console.log(' done');
const w = { label: 'lifecycle (5 calls)', inFlight: IN_FLIGHT, results };
console.log(`\n${new Date().toISOString()}, Node ${process.version}, ${cpus().length} CPUs`);
printResults([w], { nameWidth: 34 });
console.log('\nRedis CPU per call (µs, all masters):');
for (const [nm, r] of Object.entries(results)) console.log(`  ${nm.padEnd(34)}${r.serverUsPerCall.toFixed(2)}`);
printRatios([
  ratioRow(w, OURS, PEER),
  ratioRow(w, OURS_CLUSTER, PEER_CLUSTER),
  ratioRow(w, OURS_CLUSTER, OURS),
  ratioRow(w, OURS_WAIT, OURS),
], 70);

for (const { p } of Object.values(contestants)) await p.close?.();
await clusterClient.close();
await singleClient.close();
for (const a of admins) await a.close();
stopAll();
