// One-key scripts in the shape of Mastra's own backend's (`pubsub/redis-streams`), and its
// lease calls made with them (`MastraAlgorithm`), for the peers of bench/lease.mjs,
// bench/instructions.mjs and bench/redis-instructions.mjs: each script reads the key and acts only
// for its owner. That backend sends them with node-redis' `eval`, the script's whole text on
// every call (Redis hashes it each time to find the compiled script), so Mastra's peer does
// too; `acquire`, the one-key acquire script peer's, goes by SHA.
export const MASTRA_LUA = {
  renew: `
    if redis.call("GET", KEYS[1]) == ARGV[1] then
      return redis.call("PEXPIRE", KEYS[1], ARGV[2])
    end
    return 0
  `,
  release: `
    if redis.call("GET", KEYS[1]) == ARGV[1] then
      return redis.call("DEL", KEYS[1])
    end
    return 0
  `,
  transfer: `
    if redis.call("GET", KEYS[1]) == ARGV[1] then
      redis.call("SET", KEYS[1], ARGV[2], "PX", ARGV[3])
      return 1
    end
    return 0
  `,
  // A one-key acquire as a script: claim when free, refresh for the same owner, else the holder.
  acquire: `local cur = redis.call('GET', KEYS[1])
if cur == false then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return {1, ARGV[1]} end
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return {1, cur} end
return {0, cur}`,
};

// Mastra's own backend's lease calls on a node-redis client, as its code makes them: acquire is SET NX PX, then
// (when taken) the refresh-if-same-owner script, then GET (up to 3 round trips); renew,
// release and transfer are one EVAL each, the script's text sent every time; no tokens.
export class MastraAlgorithm {
  constructor(client, prefix) { this.c = client; this.p = `${prefix}:lease:`; }
  async acquireLease(key, owner, ttl) {
    const k = this.p + key;
    if ((await this.c.set(k, owner, { condition: 'NX', expiration: { type: 'PX', value: ttl } })) === 'OK') {
      return { acquired: true, owner };
    }
    if ((await this.c.eval(MASTRA_LUA.renew, { keys: [k], arguments: [owner, String(ttl)] })) === 1) {
      return { acquired: true, owner };
    }
    return { acquired: false, owner: (await this.c.get(k)) ?? undefined };
  }
  async getLeaseOwner(key) { return (await this.c.get(this.p + key)) ?? undefined; }
  async releaseLease(key, owner) { await this.c.eval(MASTRA_LUA.release, { keys: [this.p + key], arguments: [owner] }); }
  async renewLease(key, owner, ttl) {
    return (await this.c.eval(MASTRA_LUA.renew, { keys: [this.p + key], arguments: [owner, String(ttl)] })) === 1;
  }
  async transferLease(key, from, to, ttl) {
    return (await this.c.eval(MASTRA_LUA.transfer, { keys: [this.p + key], arguments: [from, to, String(ttl)] })) === 1;
  }
  async close() { await this.c.close(); }
}
