// Agents per Redis core: a simulated Mastra fleet on one redis-server, ours against Mastra's
// own backend's lease algorithm and stream layout on node-redis, in the same run. Redis is
// what a fleet shares and pays for, so the figure is what one turn costs Redis.
//
//   node bench/fleet.mjs                     Redis CPU per turn → turns per Redis core-second,
//                                            turns/s and p99s; three rounds, alternating
//   FLEET_CALLGRIND=1 node bench/fleet.mjs   Redis's instructions per turn (valgrind): the
//                                            stable figure on a VM whose CPU counters swing
//   BENCH_SCALE=0.5 …                        fewer turns
//
// Several processes (PROCS), each running AGENTS agents, one thread each. A turn is what
// Mastra's agent thread runtime does with the pubsub (CONTRACT.md, "How Mastra calls it"):
// - the thread lease acquired (key `resource\0thread`, owner the process's, 15 s TTL);
// - CHUNKS stream-chunk events published one after another on the thread's topic, each read by
//   the owner's group consumer (acked) and by a fan-out subscriber (the client's stream);
// - the lease renewed every RENEW_EVERY chunks (the 5 s `setInterval` of a 15 s TTL, time
//   compressed: the fleet runs as fast as it can);
// - every FENCE_EVERY-th turn under the durable-execution fence (execution-fence.ts): its own
//   lease (random owner, 30 s), `renewLease` before and after each of FENCE_STEPS steps, released;
// - the thread lease released, or every TRANSFER_EVERY-th turn transferred (the next turn's
//   owner is the one it was handed to).
// Every answer is checked (a lease refused, an event missing or doubled counts as bad).
//
// Turns per Redis core-second = turns ÷ Redis's CPU seconds over them (INFO's used_cpu_*): the
// turns one core of Redis sustains at saturation, which two cores cannot reach here with the
// clients beside the server.
import { fork } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { fmt, hr, pct, SCALE, setupRedis, startCallgrindRedis } from './harness.mjs';
import { MastraAlgorithm } from './mastra-scripts.mjs';
import { NodeRedisStreamsPubSub } from './mastra-streams.mjs';

const CALLGRIND = process.env.FLEET_CALLGRIND === '1';
const PROCS = 3;
const AGENTS = CALLGRIND ? 4 : 8;
const CHUNKS = 30;
const RENEW_EVERY = 10;
const FENCE_EVERY = 4;
const FENCE_STEPS = 3;
const TRANSFER_EVERY = 3;
// At least one fenced turn per agent.
const TURNS = Math.max(FENCE_EVERY, Math.round((CALLGRIND ? 8 : 40) * SCALE));
const THREAD_TTL = 15_000;
const FENCE_TTL = 30_000;
const ROUNDS = CALLGRIND ? 1 : 3;

const OURS = 'ours', PEER = 'Mastra';
const NAMES = { [OURS]: 'RedisStreamsPubSub (ours)', [PEER]: "Mastra's, on node-redis" };

if (process.argv[2] === 'worker') await worker();
else await main();

// ---------- one process of the fleet --------------------------------------------------------
async function worker() {
  const { FLEET_CONTESTANT: contestant, FLEET_URL: url, FLEET_PREFIX: keyPrefix, FLEET_PROC: proc } = process.env;
  let pubsub, leases;
  if (contestant === OURS) {
    const { RedisStreamsPubSub } = await import('../dist/esm/index.js');
    pubsub = leases = new RedisStreamsPubSub({ url, keyPrefix });
  } else {
    pubsub = new NodeRedisStreamsPubSub({ url, keyPrefix });
    await pubsub.connect();
    leases = new MastraAlgorithm(pubsub.client, keyPrefix);
  }
  let bad = 0;
  const check = (ok) => { if (!ok) bad++; };
  const turnMs = [], deliveryUs = [];

  /** One agent: its thread, its topic's two subscriptions, and what the current turn awaits. */
  async function agent(a) {
    const thread = `resource-${proc}\u0000thread-${a}`;
    const topic = `agent.stream.${proc}.${a}`;
    let owner = `process-${proc}/agent-${a}/0`;
    let turn = null; // { run, grouped: Set, fanned: Set, done }
    const arrived = () => {
      if (turn && turn.grouped.size === CHUNKS && turn.fanned.size === CHUNKS) turn.done();
    };
    const take = (seen) => (event, ack) => {
      const { run, seq, at } = event.data;
      if (!turn || run !== turn.run || seen(turn).has(seq)) bad++;
      else seen(turn).add(seq);
      return Promise.resolve(ack()).then(() => ({ at }));
    };
    const grouped = take((t) => t.grouped);
    const fanned = take((t) => t.fanned);
    await pubsub.subscribe(topic, (e, ack, nack) => grouped(e, ack, nack).then(arrived), { group: 'agents' });
    await pubsub.subscribe(topic, (e, ack, nack) => {
      deliveryUs.push(Number(hr() - BigInt(e.data.at)) / 1e3);
      return fanned(e, ack, nack).then(arrived);
    });
    return async function runTurn(n) {
      const start = hr();
      const run = randomUUID();
      const done = new Promise((resolve) => { turn = { run, grouped: new Set(), fanned: new Set(), done: resolve }; });
      const lease = await leases.acquireLease(thread, owner, THREAD_TTL);
      check(lease.acquired && lease.owner === owner);
      const fenced = n % FENCE_EVERY === FENCE_EVERY - 1;
      const fence = { key: `mastra:durable-agent-execution:v1:${JSON.stringify([`agent-${a}`, run])}`, owner: randomUUID() };
      if (fenced) check((await leases.acquireLease(fence.key, fence.owner, FENCE_TTL)).acquired);
      for (let seq = 0; seq < CHUNKS; seq++) {
        if (fenced && seq % (CHUNKS / FENCE_STEPS) === 0) check(await leases.renewLease(fence.key, fence.owner, FENCE_TTL));
        await pubsub.publish(topic, { type: 'chunk', runId: run, data: { run, seq, at: String(hr()) } });
        if (fenced && (seq + 1) % (CHUNKS / FENCE_STEPS) === 0) check(await leases.renewLease(fence.key, fence.owner, FENCE_TTL));
        if ((seq + 1) % RENEW_EVERY === 0 && seq + 1 < CHUNKS) check(await leases.renewLease(thread, owner, THREAD_TTL));
      }
      await done;
      if (fenced) await leases.releaseLease(fence.key, fence.owner);
      if (n % TRANSFER_EVERY === TRANSFER_EVERY - 1) {
        const next = owner.replace(/\d+$/, (g) => String(Number(g) + 1));
        check(await leases.transferLease(thread, owner, next, THREAD_TTL));
        owner = next;
      } else {
        await leases.releaseLease(thread, owner);
      }
      turnMs.push(Number(hr() - start) / 1e6);
    };
  }

  const agents = await Promise.all(Array.from({ length: AGENTS }, (_, a) => agent(a)));
  process.send({ ready: true });
  await new Promise((resolve) => process.once('message', resolve));
  const started = hr();
  let errors = 0;
  await Promise.all(agents.map(async (runTurn) => {
    for (let n = 0; n < TURNS; n++) await runTurn(n).catch(() => { errors++; });
  }));
  const seconds = Number(hr() - started) / 1e9;
  process.send({ turns: AGENTS * TURNS - errors, seconds, bad: bad + errors, turnMs, deliveryUs });
  await new Promise((resolve) => process.once('message', resolve));
  await pubsub.close();
  process.exit(0);
}

// ---------- the fleet, round after round ----------------------------------------------------
async function main() {
  const redis = CALLGRIND ? await startCallgrindRedis() : await setupRedis({ prefix: 'fleet', tmpPrefix: 'fleet-bench-' });
  const cpuSeconds = async () => {
    const info = await redis.admin.info('cpu');
    const field = (name) => Number(new RegExp(`${name}:([\\d.]+)`).exec(info)[1]);
    return field('used_cpu_user') + field('used_cpu_sys');
  };

  async function fleet(contestant) {
    const keyPrefix = `fleet:${randomUUID().slice(0, 8)}`;
    const procs = Array.from({ length: PROCS }, (_, proc) =>
      fork(fileURLToPath(import.meta.url), ['worker'], {
        env: { ...process.env, FLEET_CONTESTANT: contestant, FLEET_URL: redis.url, FLEET_PREFIX: keyPrefix, FLEET_PROC: String(proc) },
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      }));
    const next = (p) => new Promise((resolve, reject) => {
      p.once('message', resolve);
      p.once('exit', (code) => reject(new Error(`a ${contestant} worker exited (${code})`)));
    });
    await Promise.all(procs.map(next));
    await redis.admin.configResetStat();
    const before = CALLGRIND ? (redis.zero(), 0) : await cpuSeconds();
    const reports = await Promise.all(procs.map((p) => { const r = next(p); p.send({ go: true }); return r; }));
    const redisCost = CALLGRIND ? await redis.instructions() : (await cpuSeconds()) - before;
    const commands = Object.fromEntries([...(await redis.admin.info('commandstats')).matchAll(/cmdstat_(\S+?):calls=(\d+)/g)]
      .map(([, name, calls]) => [name, Number(calls)]));
    await Promise.all(procs.map((p) => { const exited = new Promise((r) => p.once('exit', r)); p.send({ close: true }); return exited; }));
    const turns = reports.reduce((n, r) => n + r.turns, 0);
    const sorted = (key) => reports.flatMap((r) => r[key]).sort((x, y) => x - y);
    return {
      turns,
      bad: reports.reduce((n, r) => n + r.bad, 0),
      perTurn: redisCost / turns, // CPU seconds, or instructions
      turnsPerSecond: turns / Math.max(...reports.map((r) => r.seconds)),
      turnP99Ms: pct(sorted('turnMs'), 0.99),
      deliveryP99Us: pct(sorted('deliveryUs'), 0.99),
      commands,
    };
  }

  const runs = { [OURS]: [], [PEER]: [] };
  await fleet(OURS); // warm-up: both sides' scripts loaded, the build's pages in
  await fleet(PEER);
  for (let round = 0; round < ROUNDS; round++) {
    for (const contestant of round % 2 ? [PEER, OURS] : [OURS, PEER]) {
      const r = await fleet(contestant);
      runs[contestant].push(r);
      const cost = CALLGRIND ? `${fmt(r.perTurn)} instructions` : `${fmt(r.perTurn * 1e6)} µs of Redis CPU`;
      console.error(`round ${round + 1} ${NAMES[contestant]}: ${r.turns} turns, ${cost} per turn, ${fmt(r.turnsPerSecond)} turns/s${r.bad ? `, ${r.bad} BAD` : ''}`);
    }
  }

  const median = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
  const span = (xs) => `${fmt(Math.min(...xs))}–${fmt(Math.max(...xs))}`;
  const row = (label, pick, d = 0) => {
    const [o, p] = [runs[OURS].map(pick), runs[PEER].map(pick)];
    const cells = [o, p].map((xs) => `${fmt(median(xs), d)}${xs.length > 1 ? ` (${span(xs)})` : ''}`.padStart(32));
    console.log(`${label.padEnd(40)}${cells.join('')}${`${(median(o) / median(p)).toFixed(2)}x`.padStart(10)}`);
  };
  console.log(`\n${PROCS} processes × ${AGENTS} agents × ${TURNS} turns; a turn: ${CHUNKS} chunks, a renewal every ${RENEW_EVERY}, ` +
    `every ${FENCE_EVERY}th fenced (${FENCE_STEPS} steps), every ${TRANSFER_EVERY}rd transferred; ${ROUNDS > 1 ? `median (min–max) of ${ROUNDS} runs` : 'one run'}`);
  console.log(`${''.padEnd(40)}${NAMES[OURS].padStart(32)}${NAMES[PEER].padStart(32)}${'ours/peer'.padStart(10)}`);
  if (CALLGRIND) {
    row("Redis's instructions per turn", (r) => r.perTurn);
  } else {
    row('turns per Redis core-second', (r) => 1 / r.perTurn);
    row('Redis CPU per turn (µs)', (r) => r.perTurn * 1e6);
    row('turns/s (this machine, clients beside)', (r) => r.turnsPerSecond);
    row('turn p99 (ms)', (r) => r.turnP99Ms, 1);
    row('chunk delivery p99 (µs)', (r) => r.deliveryP99Us);
  }
  // What each side sent in its last run, per turn (the stats' own commands left out).
  console.log('\ncommands per turn (last run)');
  for (const contestant of [OURS, PEER]) {
    const { commands, turns } = runs[contestant].at(-1);
    const sent = Object.entries(commands).filter(([name]) => !['info', 'config|resetstat'].includes(name))
      .sort(([, a], [, b]) => b - a).map(([name, calls]) => `${name} ${fmt(calls / turns, 1)}`);
    console.log(`  ${NAMES[contestant]}: ${sent.join(', ')}`);
  }
  const bad = [...runs[OURS], ...runs[PEER]].reduce((n, r) => n + r.bad, 0);
  if (bad) console.log(`\nINVALID: ${bad} wrong answers or lost events`);
  if (CALLGRIND) await redis.stop(); else await redis.shutdown();
  process.exit(bad ? 1 : 0);
}
