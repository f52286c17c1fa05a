// Leases beyond one plain server: over TLS, on a 3-master Redis Cluster, behind Sentinel, and
// failover-safe grants (`minReplicas`), each against Mastra's algorithm on node-redis in the
// same run, at 1 and 64 in flight; then publishes on the cluster, with and without an idle TTL. Starts its own servers: a master with one replica and a
// sentinel watching them, a TLS-only server (a CA and a certificate made with openssl), and a
// cluster of 3 masters (no replicas: the routing is what is measured).
// Run with `npm run bench:topologies` (builds first) or `node bench/topologies.mjs`.
// BENCH_SCALE=0.2 shrinks every op count.
//
// On a 2-core machine the three masters share the cores the client runs on: the cluster row
// shows what routing per hash slot costs a client, not what sharding adds in capacity.
import { execFile, spawn } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { createClient, createCluster, createSentinel } from 'redis';
import { hr, SCALE, pct, medianOf, printResults, ratioRow, printRatios } from './harness.mjs';
import { MastraAlgorithm } from './mastra-scripts.mjs';

const n = (x) => Math.max(1000, Math.round(x * SCALE));
const TTL = 60_000;
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

// A CA, and a certificate for 127.0.0.1 signed by it, for the TLS server.
const openssl = (...args) => execFileSync('openssl', args, { cwd: tmp, stdio: 'ignore' });
openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2', '-subj', '/CN=bench CA');
openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=127.0.0.1');
writeFileSync(join(tmp, 'server.cnf'), 'subjectAltName=IP:127.0.0.1\n');
openssl('x509', '-req', '-in', 'server.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out', 'server.crt', '-days', '2', '-extfile', 'server.cnf');
const ca = readFileSync(join(tmp, 'ca.crt'), 'utf8');

const masterPort = await redisServer('master');
let tlsPort; do tlsPort = await freePort(); while (tlsPort === 6379);
await redisServer('tls', '--port', '0', '--tls-port', String(tlsPort), '--tls-cert-file', join(tmp, 'server.crt'),
  '--tls-key-file', join(tmp, 'server.key'), '--tls-ca-cert-file', join(tmp, 'ca.crt'), '--tls-auth-clients', 'no');
const tlsUrl = `rediss://127.0.0.1:${tlsPort}`;
const tlsClient = () => createClient({ url: tlsUrl, socket: { tls: true, ca } });
const replicaPort = await redisServer('replica', '--replicaof', '127.0.0.1', String(masterPort));
const single = `redis://127.0.0.1:${masterPort}`;
// One sentinel watching the master, for the clients that find it through Sentinel.
let sentinelPort; do sentinelPort = await freePort(); while (sentinelPort === 6379);
mkdirSync(join(tmp, 'sentinel'));
writeFileSync(join(tmp, 'sentinel', 'sentinel.conf'), `sentinel monitor bench 127.0.0.1 ${masterPort} 1\n`);
processes.push(spawn('redis-server', [join(tmp, 'sentinel', 'sentinel.conf'), '--sentinel', '--port', String(sentinelPort),
  '--bind', '127.0.0.1', '--dir', join(tmp, 'sentinel')], { stdio: 'ignore' }));
const sentinelNodes = [{ host: '127.0.0.1', port: sentinelPort }];
const clusterPorts = [];
for (let i = 0; i < 3; i++) clusterPorts.push(await redisServer(`node-${i}`, '--cluster-enabled', 'yes'));
await promisify(execFile)('redis-cli', ['--cluster', 'create', ...clusterPorts.map((p) => `127.0.0.1:${p}`), '--cluster-yes']);
const admins = await Promise.all([masterPort, replicaPort, ...clusterPorts].map((port) => createClient({ url: `redis://127.0.0.1:${port}` })).concat(tlsClient())
  .map(async (c) => {
    c.on('error', () => {});
    await c.connect();
    return c;
  }));
const [masterAdmin, replicaAdmin, ...rest] = admins;
const tlsAdmin = rest.pop();
const nodeAdmins = rest;
for (;;) {
  const states = await Promise.all(nodeAdmins.map((a) => a.sendCommand(['CLUSTER', 'INFO'])));
  if (states.every((s) => /cluster_state:ok/.test(s))) break;
  await sleep(100);
}
for (;;) {
  if (/master_link_status:up/.test(await replicaAdmin.info('replication'))) break;
  await sleep(100);
}
for (;;) {
  const sentinelAdmin = createClient({ url: `redis://127.0.0.1:${sentinelPort}` }).on('error', () => {});
  const known = await sentinelAdmin.connect().then(() => sentinelAdmin.sendCommand(['SENTINEL', 'REPLICAS', 'bench'])).catch(() => []);
  await sentinelAdmin.close().catch(() => {});
  if (known.length > 0) break;
  await sleep(100);
}
const cpuOf = async (admin) => {
  const info = await admin.info('cpu');
  const get = (f) => Number(new RegExp(`${f}:([\\d.]+)`).exec(info)?.[1] ?? NaN);
  return get('used_cpu_user_main_thread') + get('used_cpu_sys_main_thread');
};

// ---------- contestants ---------------------------------------------------------------------
const native = createRequire(import.meta.url)('../index.js');
// Mastra's algorithm, as its backend sends it (bench/mastra-scripts.mjs), through node-redis:
// its cluster client on the cluster, TLS where the server speaks it.
const clusterClient = createCluster({ rootNodes: clusterPorts.map((p) => ({ url: `redis://127.0.0.1:${p}` })) });
clusterClient.on('error', (e) => console.error('cluster client error', e));
await clusterClient.connect();

const singleClient = createClient({ url: single });
const tlsPeerClient = tlsClient();
const sentinelClient = createSentinel({ name: 'bench', sentinelRootNodes: sentinelNodes });
for (const c of [singleClient, tlsPeerClient, sentinelClient]) {
  c.on('error', (e) => console.error('client error', e));
  await c.connect();
}

const OURS = 'ours, one server', PEER = 'Mastra alg., node-redis', OURS_WAIT = 'ours, minReplicas 1', OURS_CLUSTER = 'ours, 3-master cluster', PEER_CLUSTER = 'Mastra alg., node-redis cluster';
const OURS_TLS = 'ours, TLS', PEER_TLS = 'Mastra alg., node-redis, TLS';
const OURS_SENTINEL = 'ours, behind Sentinel', PEER_SENTINEL = 'Mastra alg., node-redis sentinel';
const contestants = {
  [OURS]: { p: new native.RedisLeaseProvider({ url: single, keyPrefix: 'b1' }), admins: [masterAdmin] },
  [PEER]: { p: new MastraAlgorithm(singleClient, 'b5'), admins: [masterAdmin] },
  [OURS_TLS]: { p: new native.RedisLeaseProvider({ url: tlsUrl, tls: { ca }, keyPrefix: 'b6' }), admins: [tlsAdmin] },
  [PEER_TLS]: { p: new MastraAlgorithm(tlsPeerClient, 'b7'), admins: [tlsAdmin] },
  [OURS_SENTINEL]: {
    p: new native.RedisLeaseProvider({ sentinel: { nodes: [`redis://127.0.0.1:${sentinelPort}`], masterName: 'bench' }, keyPrefix: 'b8' }),
    admins: [masterAdmin],
  },
  [PEER_SENTINEL]: { p: new MastraAlgorithm(sentinelClient, 'b9'), admins: [masterAdmin] },
  [OURS_WAIT]: { p: new native.RedisLeaseProvider({ url: single, keyPrefix: 'b2', minReplicas: 1 }), admins: [masterAdmin] },
  [OURS_CLUSTER]: { p: new native.RedisLeaseProvider({ cluster: { nodes: clusterPorts.map((p) => `redis://127.0.0.1:${p}`) }, keyPrefix: 'b3' }), admins: nodeAdmins },
  [PEER_CLUSTER]: { p: new MastraAlgorithm(clusterClient, 'b4'), admins: nodeAdmins },
};

// ---------- the workload: the lease lifecycle Mastra drives, 5 calls a unit -------------------
let runSeq = 0;
async function measure(name, units, inFlight) {
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
  const { secs, serverSecs, ownUs } = await timed(servers, () => Promise.all(Array.from({ length: inFlight }, (_, w) => worker(w))));
  return figures(lat.subarray(0, li), secs, serverSecs, ownUs, bad);
}

/** Runs `work`, answering how long it took, the CPU seconds `servers` spent and this process's µs. */
async function timed(servers, work) {
  const serverCpu = async () => (await Promise.all(servers.map(cpuOf))).reduce((x, y) => x + y, 0);
  const cpu0 = await serverCpu();
  const own0 = process.cpuUsage();
  const t0 = hr();
  await work();
  const secs = Number(hr() - t0) / 1e9;
  const own = process.cpuUsage(own0);
  return { secs, serverSecs: (await serverCpu()) - cpu0, ownUs: own.user + own.system };
}

/** A run's figures from its calls' latencies (µs). */
function figures(lat, secs, serverSecs, ownUs, bad) {
  const sorted = lat.sort();
  const calls = sorted.length;
  return { opsPerSec: calls / secs, p50Us: pct(sorted, 0.5), p99Us: pct(sorted, 0.99), calls, bad, serverUsPerCall: (serverSecs * 1e6) / calls, processUsPerCall: ownUs / calls };
}

const workloads = [];
for (const [inFlight, units] of [[1, n(4_000)], [64, n(20_000)]]) {
  process.stdout.write(`lifecycle @${inFlight} in flight ...`);
  const results = await medianOf(Object.keys(contestants), {
    warmup: (nm) => measure(nm, Math.ceil(units / 10), inFlight),
    run: (nm) => measure(nm, units, inFlight),
    between: async () => {
      for (const a of [masterAdmin, tlsAdmin, ...nodeAdmins]) await a.flushAll();
    },
  });
  console.log(' done');
  workloads.push({ label: 'lifecycle (5 calls)', inFlight, results });
}
console.log(`\n${new Date().toISOString()}, Node ${process.version}, ${cpus().length} CPUs`);
printResults(workloads, { nameWidth: 34 });
for (const w of workloads) {
  // On this VM the servers and the client share the cores: at saturation the calls per second
  // follow the two figures' sum.
  console.log(`\nCPU per call @${w.inFlight} (µs): Redis's (all masters), this process's`);
  for (const [nm, r] of Object.entries(w.results)) {
    console.log(`  ${nm.padEnd(34)}${r.serverUsPerCall.toFixed(2).padStart(8)}${r.processUsPerCall.toFixed(2).padStart(8)}`);
  }
}
// ---------- publishes on the cluster, as the agent stream makes them -------------------------
// Mastra's publish (one XADD, MAXLEN ~) on node-redis' cluster client against ours; and ours
// under an idle TTL (each append a MULTI block: XADD, PEXPIRE, EXEC) against that block sent
// by node-redis' cluster client. 64 topics, over every master.
const { RedisStreamsPubSub } = await import('../dist/esm/index.js');
const IDLE_TTL = 60_000;
const P_OURS = 'ours', P_PEER = "Mastra's XADD, node-redis cluster", P_OURS_TTL = 'ours, streamIdleTtlMs', P_PEER_TTL = 'MULTI XADD PEXPIRE, node-redis cl.';
const seeds = clusterPorts.map((p) => `redis://127.0.0.1:${p}`);
const publishers = {
  [P_OURS]: new RedisStreamsPubSub({ cluster: { nodes: seeds }, keyPrefix: 'p1' }),
  [P_PEER]: { publish: (topic, event) => clusterClient.xAdd(`p2:${topic}`, '*', { event: JSON.stringify(event) }, { TRIM: { strategy: 'MAXLEN', strategyModifier: '~', threshold: 10_000 } }) },
  [P_OURS_TTL]: new RedisStreamsPubSub({ cluster: { nodes: seeds }, keyPrefix: 'p3', streamIdleTtlMs: IDLE_TTL }),
  [P_PEER_TTL]: {
    publish: (topic, event) => {
      const key = `p4:${topic}`;
      return clusterClient.multi(key).xAdd(key, '*', { event: JSON.stringify(event) }).pExpire(key, IDLE_TTL).exec();
    },
  },
};
async function measurePublishes(name, units, inFlight) {
  const publisher = publishers[name];
  const lat = new Float64Array(units);
  let li = 0, bad = 0, next = 0;
  const { secs, serverSecs, ownUs } = await timed(nodeAdmins, () => Promise.all(Array.from({ length: inFlight }, async () => {
    for (let i; (i = next++) < units;) {
      const t = hr();
      try {
        await publisher.publish(`t${i % 64}`, { type: 'chunk', runId: 'run', data: { i } });
      } catch { bad++; }
      lat[li++] = Number(hr() - t) / 1e3;
    }
  })));
  return figures(lat.subarray(0, li), secs, serverSecs, ownUs, bad);
}
const published = [];
for (const [inFlight, units] of [[1, n(4_000)], [64, n(40_000)]]) {
  process.stdout.write(`publishes on the cluster @${inFlight} in flight ...`);
  const results = await medianOf(Object.keys(publishers), {
    warmup: (nm) => measurePublishes(nm, Math.ceil(units / 10), inFlight),
    run: (nm) => measurePublishes(nm, units, inFlight),
    between: async () => {
      for (const a of nodeAdmins) await a.flushAll();
    },
  });
  console.log(' done');
  published.push({ label: 'publish, 3-master cluster', inFlight, results });
}
printResults(published, { unit: 'publishes/s', nameWidth: 36 });
for (const w of published) {
  console.log(`\nCPU per publish @${w.inFlight} (µs): Redis's (all masters), this process's`);
  for (const [nm, r] of Object.entries(w.results)) {
    console.log(`  ${nm.padEnd(36)}${r.serverUsPerCall.toFixed(2).padStart(8)}${r.processUsPerCall.toFixed(2).padStart(8)}`);
  }
}

const [at1, at64] = workloads;
const [published1, published64] = published;
printRatios([
  ratioRow(at1, OURS, PEER, 0.95), ratioRow(at64, OURS, PEER),
  ratioRow(at1, OURS_TLS, PEER_TLS, 1.1), ratioRow(at64, OURS_TLS, PEER_TLS, 1.5),
  ratioRow(at1, OURS_SENTINEL, PEER_SENTINEL), ratioRow(at64, OURS_SENTINEL, PEER_SENTINEL),
  ratioRow(at1, OURS_CLUSTER, PEER_CLUSTER, 1.1), ratioRow(at64, OURS_CLUSTER, PEER_CLUSTER, 1.5),
  ratioRow(at64, OURS_CLUSTER, OURS),
  ratioRow(at64, OURS_WAIT, OURS),
  ratioRow(published1, P_OURS, P_PEER), ratioRow(published64, P_OURS, P_PEER),
  ratioRow(published1, P_OURS_TTL, P_PEER_TTL), ratioRow(published64, P_OURS_TTL, P_PEER_TTL),
], 96);

// Mastra's algorithm closes its client.
for (const { p } of Object.values(contestants)) await p.close();
for (const name of [P_OURS, P_OURS_TTL]) await publishers[name].close();
for (const a of admins) await a.close();
stopAll();
