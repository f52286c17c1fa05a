// One-key scripts in the shape of Mastra's own backend's (`pubsub/redis-streams`), for the
// peers of bench/lease.mjs and bench/redis-instructions.mjs: each reads the key and acts only
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
