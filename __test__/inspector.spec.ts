// The operator's tools against a populated Redis: listLeases() pages through every lease
// under a prefix (SCAN, on every master of a cluster), and `npx mastra-lease` lists, reads and
// releases them by name, with exit codes a script can rely on and no credentials printed.
import { execFile } from 'node:child_process'
import net from 'node:net'
import path from 'node:path'

import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { RedisLeaseProvider } from '../dist/esm/index.js'
import { expectRejection } from './helpers/lease.js'
import { closing, leaseSuite, RUN, stopLater } from './helpers/lease-runs.js'
import { NODE } from './helpers/mastra-node.js'
import { EXTERNAL_REDIS, freePort, startRedis, type RedisServer } from './helpers/redis-server.js'
import { startCluster, type RedisCluster } from './helpers/redis-cluster.js'

leaseSuite()

const BIN = path.join(__dirname, '..', 'bin', 'mastra-lease.mjs')
const THREAD = 'resource-1\u0000thread-1'

/** Runs the command, REDIS_URL unset; its exit code, stdout and stderr. */
function cli(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return cliWith({ REDIS_URL: undefined }, ...args)
}

/** Runs the command with `env` over this process's environment (`undefined`: unset). */
function cliWith(env: NodeJS.ProcessEnv, ...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(NODE, [BIN, ...args], { cwd: path.join(__dirname, '..'), env: { ...process.env, ...env }, timeout: 20_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? Number((error as { code?: unknown }).code ?? 1) : 0, stdout, stderr })
    })
  })
}

/** Every page of listLeases, its keys in order of arrival. */
async function listAll(p: RedisLeaseProvider, count?: number): Promise<Array<{ key: string; owner: string; token?: number; ttlMs: number | null }>> {
  const all = []
  let cursor: string | undefined
  do {
    const page = await p.listLeases({ ...(cursor === undefined ? {} : { cursor }), ...(count === undefined ? {} : { count }) })
    all.push(...page.leases)
    cursor = page.cursor
  } while (cursor !== undefined)
  return all
}

let server: RedisServer
// A glob character in the prefix: it must match itself, not every prefix like it.
const prefix = `insp*${RUN}`
const MANY = 1_500
beforeAll(async () => {
  server = stopLater(await startRedis())
  const p = new RedisLeaseProvider({ url: server.url, keyPrefix: prefix })
  // The thread's lease with a fencing token, the jobs' plain (Mastra's acquireLease takes none).
  await p.acquireFencedLease(THREAD, 'run-1', 600_000)
  await Promise.all(Array.from({ length: MANY }, (_, i) => p.acquireLease(`job-${i}`, `worker-${i % 7}`, 600_000)))
  await p.close()
  const other = new RedisLeaseProvider({ url: server.url, keyPrefix: `inspX${RUN}` })
  await other.acquireLease('not-ours', 'someone', 600_000)
  await other.close()
  // A topic's stream named like a lease, under the same prefix: not a lease.
  await server.cli('XADD', `${prefix}:lease:events`, '*', 'f', 'v')
})

describe('listLeases', () => {
  it('pages through every lease under the prefix exactly once, with owner, token and TTL, and nothing else', async () => {
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const all = await listAll(p, 200)
    expect(all.length).toBe(MANY + 1)
    expect(new Set(all.map((l) => l.key)).size).toBe(MANY + 1)
    expect(all.find((l) => l.key === THREAD)).toEqual({ key: THREAD, owner: 'run-1', token: expect.any(Number), ttlMs: expect.any(Number) })
    expect(all.find((l) => l.key === 'job-8')).toMatchObject({ owner: 'worker-1' })
    expect(all.find((l) => l.key === 'job-8')!.token).toBeUndefined()
    expect(all.every((l) => l.ttlMs !== null && l.ttlMs > 590_000 && l.ttlMs <= 600_000)).toBe(true)
    expect(all.some((l) => l.key === 'not-ours' || l.key === 'events')).toBe(false)
  })

  it('lists a lease another client wrote without an expiry with ttlMs null', async () => {
    const own = `insp-no-expiry:${RUN}`
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: own }))
    await server.cli('SET', `${own}:lease:forever`, 'tool')
    await p.acquireLease('timed', 'worker', 600_000)
    const all = await listAll(p)
    expect(all.find((l) => l.key === 'forever')).toEqual({ key: 'forever', owner: 'tool', token: undefined, ttlMs: null })
    expect(all.find((l) => l.key === 'timed')!.ttlMs).toBeGreaterThan(590_000)
  })

  it('reads a page with plain reads at about the cost of getLease on each of its keys', async ({ annotate }) => {
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const keys = (await listAll(p)).map((l) => l.key)
    const best = async (run: () => Promise<unknown>) => {
      let fastest = Infinity
      for (let i = 0; i < 5; i++) {
        const started = performance.now()
        await run()
        fastest = Math.min(fastest, performance.now() - started)
      }
      return fastest
    }
    const listing = await best(() => listAll(p, 2_000))
    const reads = await best(() => Promise.all(keys.map((k) => p.getLease(k))))
    await annotate(`${keys.length} leases: listLeases ${listing.toFixed(1)} ms (SCAN and plain reads), getLease of each ${reads.toFixed(1)} ms (the script), ${(listing / reads).toFixed(2)}x`)
    expect(listing).toBeLessThan(reads * 4)
  })

  it('refuses an unknown option or a cursor it did not answer with ERR_LEASE_INVALID_OPTION', async () => {
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    await expectRejection(() => p.listLeases({ cursr: '0' } as never), TypeError, 'ERR_LEASE_INVALID_OPTION')
    await expectRejection(() => p.listLeases({ cursor: 'abc' }), RangeError, 'ERR_LEASE_INVALID_OPTION')
    await expectRejection(() => p.listLeases({ count: 0 }), RangeError, 'ERR_LEASE_INVALID_OPTION')
    await p.close()
    await expectRejection(() => p.listLeases(), Error, 'ERR_LEASE_CLOSED')
  })
})

describe('npx mastra-lease', () => {
  it('list prints one tab-separated line per lease, a thread key as "resource\\0thread"; --json one object each', async () => {
    const listed = await cli('list', '--url', server.url, '--prefix', prefix)
    expect(listed.code).toBe(0)
    const lines = listed.stdout.trim().split('\n')
    expect(lines.length).toBe(MANY + 1)
    expect(lines).toContainEqual(expect.stringMatching(/^resource-1\\0thread-1\trun-1\t\d+\t\d+$/))
    const json = await cli('list', '--url', server.url, '--prefix', prefix, '--json')
    const rows = json.stdout.trim().split('\n').map((l) => JSON.parse(l) as { key: string; owner: string })
    expect(rows.find((r) => r.key === THREAD)).toMatchObject({ owner: 'run-1', token: expect.any(Number), ttlMs: expect.any(Number) })
  })

  it('get prints the lease (exit 0), or says there is none (exit 1)', async () => {
    const got = await cli('get', 'resource-1\\0thread-1', '--url', server.url, '--prefix', prefix)
    expect(got).toMatchObject({ code: 0, stdout: expect.stringMatching(/^resource-1\\0thread-1\trun-1\t\d+\t\d+\n$/) })
    const missing = await cli('get', 'nope', '--url', server.url, '--prefix', prefix)
    expect(missing).toMatchObject({ code: 1, stdout: '', stderr: `mastra-lease: no live lease on nope (server ${server.url}, from --url; prefix ${prefix})\n` })
  })

  it('with no --url, every command reads $REDIS_URL and ends with one stderr line naming it and the prefix; --url wins over it, and says so', async () => {
    const own = `insp-env:${RUN}`
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: own }))
    await p.acquireLease('a', 'worker-1', 600_000)
    await p.acquireLease('b', 'worker-2', 600_000)
    const env = { REDIS_URL: server.url }
    const named = `server ${server.url}, from REDIS_URL; prefix ${own}`
    const listed = await cliWith(env, 'list', '--prefix', own)
    expect(listed).toMatchObject({ code: 0, stderr: `mastra-lease: 2 leases (${named})\n` })
    expect(listed.stdout.trim().split('\n').map((l) => l.split('\t')[0]).sort()).toEqual(['a', 'b'])
    expect(await cliWith(env, 'get', 'a', '--prefix', own)).toMatchObject({ code: 0, stdout: expect.stringMatching(/^a\tworker-1\t/), stderr: `mastra-lease: ${named}\n` })
    expect(await cliWith(env, 'release', 'a', '--owner', 'worker-1', '--prefix', own)).toMatchObject({ code: 0, stderr: `mastra-lease: ${named}\n` })
    expect(await cliWith(env, 'release', 'b', '--owner', 'worker-9', '--prefix', own)).toMatchObject({
      code: 1,
      stderr: `mastra-lease: b is not held by worker-9 (held by worker-2); nothing released (${named})\n`,
    })
    // Finding nothing is an answer, and says where it looked.
    expect(await cliWith(env, 'list', '--prefix', `${own}-empty`)).toEqual({ code: 0, stdout: '', stderr: `mastra-lease: 0 leases (server ${server.url}, from REDIS_URL; prefix ${own}-empty)\n` })
    // --url over a REDIS_URL where nothing listens: the one given is read, and the line says so.
    const over = await cliWith({ REDIS_URL: `redis://127.0.0.1:${await freePort()}` }, 'list', '--url', server.url, '--prefix', own)
    expect(over).toMatchObject({ code: 0, stderr: `mastra-lease: 1 lease (server ${server.url}, from --url, over REDIS_URL; prefix ${own})\n` })
  })

  it('nothing answering is exit 3 for every command, one stderr line naming the address, never the user or password: a refused port, a unix socket that is not there, a cluster, a server that never answers', async () => {
    const [user, password] = ['ops-user-7f3', 'hunter2-never-printed']
    const [port, other] = [await freePort(), await freePort()]
    const silent = net.createServer(() => {}) // accepts, never answers
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve))
    try {
      const mute = (silent.address() as net.AddressInfo).port
      const socket = `/tmp/mastra-lease-none-${port}.sock`
      const cases: Array<[NodeJS.ProcessEnv, string[], RegExp]> = [
        [{ REDIS_URL: `redis://${user}:${password}@127.0.0.1:${port}/2` }, [], new RegExp(`^mastra-lease: ERR_LEASE_CONNECTION: cannot reach Redis at 127\\.0\\.0\\.1:${port}: .* \\(server redis://127\\.0\\.0\\.1:${port}/2, from REDIS_URL; prefix mastra:topic\\)\n$`)],
        [{ REDIS_URL: undefined }, ['--url', `redis+unix://${socket}?user=${user}&pass=${password}`], new RegExp(`^mastra-lease: ERR_LEASE_CONNECTION: cannot reach Redis at the unix socket ${socket}: .* \\(server redis\\+unix://${socket}, from --url;`)],
        [{ REDIS_URL: undefined }, ['--cluster', `redis://${user}:${password}@127.0.0.1:${port}`, '--cluster', `redis://${user}:${password}@127.0.0.1:${other}`], new RegExp(`^mastra-lease: ERR_LEASE_CONNECTION: cannot reach Redis at the cluster of seed nodes 127\\.0\\.0\\.1:${port}, 127\\.0\\.0\\.1:${other}: .* \\(server the cluster of redis://127\\.0\\.0\\.1:${port}, redis://127\\.0\\.0\\.1:${other}, from --cluster`)],
        [{ REDIS_URL: undefined }, ['--url', `redis://${user}:${password}@127.0.0.1:${mute}`], new RegExp(`^mastra-lease: ERR_LEASE_TIMEOUT: .* \\(server redis://127\\.0\\.0\\.1:${mute}, from --url`)],
      ]
      const commands = [['list'], ['get', 'k'], ['release', 'k', '--owner', 'o']]
      const runs = cases.flatMap(([env, where, said]) => commands.map(async (command) => ({ said, run: await cliWith(env, ...command, ...where) })))
      for (const { said, run } of await Promise.all(runs)) {
        expect(run.code, run.stderr).toBe(3)
        expect(run.stdout).toBe('')
        expect(run.stderr).toMatch(said)
        expect(run.stderr.split('\n')).toHaveLength(2)
        expect(run.stderr).not.toContain(user)
        expect(run.stderr).not.toContain(password)
      }
    } finally {
      silent.close()
    }
  })

  it('--help says where the server comes from (--url over REDIS_URL over the default) and the four exit codes', async () => {
    const help = await cli('--help')
    expect(help.code).toBe(0)
    expect(help.stdout).toContain('default: $REDIS_URL, else redis://127.0.0.1:6379')
    expect(help.stdout).toContain('--url wins over REDIS_URL')
    expect(help.stdout).toMatch(/^ {2}0 {2}done \(list: whatever it listed, no lease at all included\)$/m)
    expect(help.stdout).toMatch(/^ {2}1 {2}nothing there: get found no live lease on KEY; release found KEY not held by OWNER$/m)
    expect(help.stdout).toMatch(/^ {2}2 {2}usage: /m)
    expect(help.stdout).toMatch(/^ {2}3 {2}Redis failed: nothing answered at the address \(connection refused, timed out/m)
  })

  it('a lease without an expiry shows "never" as its TTL in list and get, and null with --json', async () => {
    const own = `insp-cli-no-expiry:${RUN}`
    await server.cli('SET', `${own}:lease:forever`, 'tool')
    const where = ['--url', server.url, '--prefix', own]
    expect(await cli('list', ...where)).toMatchObject({ code: 0, stdout: 'forever\ttool\tnever\t\n' })
    expect(await cli('get', 'forever', ...where)).toMatchObject({ code: 0, stdout: 'forever\ttool\tnever\t\n' })
    const listed = await cli('list', ...where, '--json')
    expect(JSON.parse(listed.stdout)).toEqual({ key: 'forever', owner: 'tool', ttlMs: null, token: null })
    const got = await cli('get', 'forever', ...where, '--json')
    expect(JSON.parse(got.stdout)).toEqual({ key: 'forever', owner: 'tool', ttlMs: null, token: null })
  })

  it('release deletes only when the owner named holds it: another owner is exit 1 and leaves it, the holder exit 0', async () => {
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: prefix }))
    const wrong = await cli('release', 'job-1', '--owner', 'worker-9', '--url', server.url, '--prefix', prefix)
    expect(wrong).toMatchObject({ code: 1, stderr: expect.stringContaining('held by worker-1') })
    expect(await p.getLeaseOwner('job-1')).toBe('worker-1')
    const right = await cli('release', 'job-1', '--owner', 'worker-1', '--url', server.url, '--prefix', prefix)
    expect(right).toMatchObject({ code: 0, stdout: expect.stringContaining('released job-1') })
    expect(await p.getLeaseOwner('job-1')).toBeUndefined()
    const thread = await cli('release', 'resource-1\\0thread-1', '--owner', 'run-1', '--url', server.url, '--prefix', prefix)
    expect(thread.code).toBe(0)
    expect(await p.getLeaseOwner(THREAD)).toBeUndefined()
  })

  it('release names the owner alone and releases a lease held with metadata, with the metadata it holds it with', async () => {
    const own = `insp-release-metadata:${RUN}`
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: own }))
    expect(await p.acquireLease('run-thread', 'worker-m', 600_000, 'run-7')).toStrictEqual({ acquired: true, owner: 'worker-m' })
    const wrong = await cli('release', 'run-thread', '--owner', 'worker-n', '--url', server.url, '--prefix', own)
    expect(wrong).toMatchObject({ code: 1, stderr: expect.stringContaining('held by worker-m') })
    expect(await p.getLeaseRecord('run-thread')).toStrictEqual({ owner: 'worker-m', metadata: 'run-7' })
    const right = await cli('release', 'run-thread', '--owner', 'worker-m', '--url', server.url, '--prefix', own)
    expect(right).toMatchObject({ code: 0, stdout: expect.stringContaining('released run-thread') })
    expect(await p.getLeaseRecord('run-thread')).toBeUndefined()
    expect(await server.cli('KEYS', `${own}:*`)).toEqual([])
  })

  it('usage errors are exit 2 (release without --owner included); Redis failing is exit 3, and a password in the URL is never printed', async () => {
    expect((await cli('release', 'job-2', '--url', server.url)).code).toBe(2)
    expect((await cli('list', '--urll', server.url)).code).toBe(2)
    expect((await cli('frobnicate')).code).toBe(2)
    expect((await cli('get')).code).toBe(2)
    expect((await cli('list', '--url', server.url, '--cluster', server.url)).code).toBe(2)
    const down = await cli('list', '--url', `redis://admin:hunter2secret@127.0.0.1:${await freePort()}`)
    expect(down.code).toBe(3)
    expect(down.stderr).toMatch(/ERR_LEASE_(CONNECTION|TIMEOUT)/)
    expect(down.stdout + down.stderr).not.toContain('hunter2secret')
  })
})

describe('what an operator reads is what is there', () => {
  /** The leases `make` writes under a fresh prefix, and the prefix. */
  async function populated(label: string, make: (p: RedisLeaseProvider) => Promise<unknown>, options: { maxKeyBytes?: number } = {}): Promise<string> {
    const where = `insp-${label}:${RUN}`
    const p = new RedisLeaseProvider({ url: server.url, keyPrefix: where, ...options })
    await make(p)
    await p.close()
    return where
  }
  const columns = (line: string) => line.split('\t')

  it('list escapes tabs, newlines, CR, ANSI escapes, bidi overrides and backslashes in keys and owners, one line and four columns per lease', async () => {
    const keys = ['tab\there', 'line\nbreak', 'cr\rhere', 'ansi\x1b[31mred', 'bidi\u202eevil', 'back\\slash', 'nbsp\u00a0zwsp\u200b']
    const where = await populated('escape', (p) => Promise.all(keys.map((k) => p.acquireLease(k, `owner\n${k.slice(0, 3)}\x1b[0m`, 600_000))))
    const listed = await cli('list', '--url', server.url, '--prefix', where)
    expect(listed.code).toBe(0)
    const lines = listed.stdout.split('\n').filter((l) => l !== '')
    expect(lines.length).toBe(keys.length)
    expect(lines.every((l) => columns(l).length === 4)).toBe(true)
    // Nothing left that moves the cursor, recolours the terminal or reorders the text.
    expect(listed.stdout).not.toMatch(/[\x00-\x08\x0b-\x1f\x7f\u0080-\u009f\u00a0\u200b\u202e]/)
    expect(lines.map((l) => columns(l)[0]).sort()).toEqual(
      ['tab\\there', 'line\\nbreak', 'cr\\rhere', 'ansi\\x1b[31mred', 'bidi\\u202eevil', 'back\\\\slash', 'nbsp\\u00a0zwsp\\u200b'].sort(),
    )
    expect(lines.map((l) => columns(l)[1])).toContain('owner\\ntab\\x1b[0m')
  })

  it('list --json writes bidi overrides, C1 controls and line separators as \\uHHHH escapes, which JSON reads back as the same text', async () => {
    const keys = ['bidi\u202eevil', 'nel\u0085here', 'csi\u009b31m', 'ls\u2028ps\u2029', 'tag\u{e0041}']
    const where = await populated('json-escape', (p) => Promise.all(keys.map((k) => p.acquireLease(k, `owner-${k}`, 600_000))))
    const json = await cli('list', '--url', server.url, '--prefix', where, '--json')
    expect(json.code).toBe(0)
    // Nothing a terminal would act on or reorder: every such character is an escape.
    expect(json.stdout).not.toMatch(/[\u0080-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]|\u{e0041}/u)
    expect(json.stdout).toContain('bidi\\u202eevil')
    expect(json.stdout).toContain('csi\\u009b31m')
    const rows = json.stdout.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as { key: string; owner: string })
    expect(rows.map((r) => r.key).sort()).toEqual([...keys].sort())
    expect(rows.every((r) => r.owner === `owner-${r.key}`)).toBe(true)
  })

  it('an owner that is not UTF-8 (another client wrote it) shows its bytes as \\xHH, with rawOwner in --json; release refuses to name it, saying why', async () => {
    const where = await populated('binary-owner', async () => {})
    await server.cli('EVAL', "return redis.call('SET', KEYS[1], 'run' .. '\\255\\254', 'PX', 600000)", 1, `${where}:lease:thread`)
    const listed = await cli('list', '--url', server.url, '--prefix', where)
    expect(listed.stdout.split('\n').filter((l) => l !== '').map((l) => columns(l).slice(0, 2))).toEqual([['thread', 'run\\xff\\xfe']])
    const got = await cli('get', 'thread', '--url', server.url, '--prefix', where)
    expect(got).toMatchObject({ code: 0, stdout: expect.stringMatching(/^thread\trun\\xff\\xfe\t/) })
    const json = await cli('list', '--url', server.url, '--prefix', where, '--json')
    expect(JSON.parse(json.stdout)).toMatchObject({ key: 'thread', owner: 'run\ufffd\ufffd', rawOwner: Buffer.from([0x72, 0x75, 0x6e, 0xff, 0xfe]).toString('base64') })
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: where }))
    expect(await p.getLease('thread')).toEqual({ owner: 'run\ufffd\ufffd', token: undefined, ttlMs: expect.any(Number), rawOwner: Buffer.from([0x72, 0x75, 0x6e, 0xff, 0xfe]) })
    const refused = await cli('release', 'thread', '--owner', 'run\\xff\\xfe', '--url', server.url, '--prefix', where)
    expect(refused).toMatchObject({ code: 2, stderr: expect.stringMatching(/OWNER: \\xff is a byte that is not UTF-8 text, and no lease call can name it \(such a lease ends at its TTL, or when its key is deleted\)/) })
    expect(await p.getLeaseOwner('thread')).toBe('run\ufffd\ufffd')
  })

  it('list shows keys over maxKeyBytes and keys that are not UTF-8, escaped, instead of leaving them out', async () => {
    const long = 'L'.repeat(5_000)
    const where = await populated(
      'odd',
      (p) => Promise.all([...Array.from({ length: 11 }, (_, i) => p.acquireLease(`plain-${i}`, 'o', 600_000)), p.acquireLease(long, 'o', 600_000)]),
      { maxKeyBytes: 8_192 },
    )
    // Bytes no JavaScript string can hold: written by another client.
    await server.cli('EVAL', "return redis.call('SET', KEYS[1] .. '\\255\\254', 'o', 'PX', 600000)", 1, `${where}:lease:bin`)
    const listed = await cli('list', '--url', server.url, '--prefix', where)
    expect(listed.code).toBe(0)
    const keys = listed.stdout.split('\n').filter((l) => l !== '').map((l) => columns(l)[0])
    expect(keys.length).toBe(13)
    expect(keys).toContain(long)
    expect(keys).toContain('bin\\xff\\xfe')
    // What list shows, get can name, however long.
    expect(await cli('get', long, '--url', server.url, '--prefix', where)).toMatchObject({ code: 0, stdout: expect.stringMatching(/^L+\to\t/) })
    const json = await cli('list', '--url', server.url, '--prefix', where, '--json')
    const rows = json.stdout.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as { key: string; rawKey?: string })
    expect(rows.find((r) => r.rawKey !== undefined)).toEqual(expect.objectContaining({ key: 'bin\ufffd\ufffd', rawKey: Buffer.from('bin\xff\xfe', 'latin1').toString('base64') }))
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: where }))
    const all = await listAll(p)
    expect(all.length).toBe(13)
    const bin = all.find((l) => l.key === 'bin\ufffd\ufffd') as { rawKey?: Buffer } | undefined
    expect(bin?.rawKey).toEqual(Buffer.from([0x62, 0x69, 0x6e, 0xff, 0xfe]))
    expect(all.find((l) => l.key === 'plain-1')).not.toHaveProperty('rawKey')
  })

  it('a NUL shows as \\0 and a real U+2400 as itself; get and release take the same escaped form, and refuse an escape they do not know', async () => {
    const where = await populated('nul', (p) => Promise.all([p.acquireLease('res\0thr', 'owner\0nul', 600_000), p.acquireLease('res\u2400thr', 'owner-sym', 600_000)]))
    const listed = await cli('list', '--url', server.url, '--prefix', where)
    const rows = listed.stdout.split('\n').filter((l) => l !== '').map((l) => columns(l).slice(0, 2))
    expect(rows.sort()).toEqual([
      ['res\\0thr', 'owner\\0nul'],
      ['res\u2400thr', 'owner-sym'],
    ])
    expect(await cli('get', 'res\\0thr', '--url', server.url, '--prefix', where)).toMatchObject({ code: 0, stdout: expect.stringMatching(/^res\\0thr\towner\\0nul\t/) })
    expect(await cli('get', 'res\u2400thr', '--url', server.url, '--prefix', where)).toMatchObject({ code: 0, stdout: expect.stringMatching(/^res\u2400thr\towner-sym\t/) })
    expect(await cli('get', 'res\\u0000thr', '--url', server.url, '--prefix', where)).toMatchObject({ code: 0 })
    const released = await cli('release', 'res\\0thr', '--owner', 'owner\\0nul', '--url', server.url, '--prefix', where)
    expect(released.code).toBe(0)
    const p = closing(new RedisLeaseProvider({ url: server.url, keyPrefix: where }))
    expect(await p.getLeaseOwner('res\0thr')).toBeUndefined()
    expect(await p.getLeaseOwner('res\u2400thr')).toBe('owner-sym')
    const unknown = await cli('get', 'res\\qthr', '--url', server.url, '--prefix', where)
    expect(unknown).toMatchObject({ code: 2, stderr: expect.stringContaining('\\q') })
  })

  it('a server that does not speak Redis protocol is a clear coded error (exit 3), without the warning meant for Mastra', async () => {
    const http = net.createServer((socket) => socket.on('data', () => socket.end('HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n')))
    await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve))
    try {
      const { port } = http.address() as net.AddressInfo
      const answered = await cli('get', 'k', '--url', `redis://127.0.0.1:${port}`)
      expect(answered.code).toBe(3)
      expect(answered.stderr).toContain('ERR_LEASE_PROTOCOL')
      expect(answered.stderr).toMatch(/not speak Redis protocol/)
      expect(answered.stderr).not.toContain('Incompatible type')
      expect(answered.stderr).not.toContain('Mastra counts a failed acquireLease')
    } finally {
      http.close()
    }
  })

  it('a failed run says what failed and nothing about Mastra', async () => {
    const down = await cli('get', 'k', '--url', `redis://127.0.0.1:${await freePort()}`)
    expect(down.code).toBe(3)
    expect(down.stderr).toMatch(/ERR_LEASE_(CONNECTION|TIMEOUT)/)
    expect(down.stderr).not.toContain('Mastra counts a failed acquireLease')
  })

  it.skipIf(EXTERNAL_REDIS)('rediss:// against a server without TLS fails saying TLS is the likely cause', async () => {
    const mismatch = await cli('get', 'k', '--url', `rediss://127.0.0.1:${server.port}`)
    expect(mismatch.code).toBe(3)
    expect(mismatch.stderr).toMatch(/ERR_LEASE_(TIMEOUT|CONNECTION)/)
    expect(mismatch.stderr).toMatch(/TLS/)
  })

  // ACL users are the server's own: not created on a server the tests do not own.
  it.skipIf(EXTERNAL_REDIS)('a read-only ACL user (+@read) can list the leases', async () => {
    const where = await populated('acl', (p) => Promise.all([p.acquireFencedLease('a', 'o', 600_000), p.acquireLease('res\0thr', 'run', 600_000)]))
    const user = `reader-${RUN}`
    await server.cli('ACL', 'SETUSER', user, 'on', '>read-only-secret', '~*', 'resetchannels', '-@all', '+@read')
    const url = `redis://${user}:read-only-secret@127.0.0.1:${server.port}`
    const listed = await cli('list', '--url', url, '--prefix', where)
    expect(listed).toMatchObject({ code: 0, stderr: `mastra-lease: 2 leases (server redis://127.0.0.1:${server.port}, from --url; prefix ${where})\n` })
    expect(listed.stdout.split('\n').filter((l) => l !== '').map((l) => columns(l)[0]).sort()).toEqual(['a', 'res\\0thr'])
    const p = closing(new RedisLeaseProvider({ url, keyPrefix: where }))
    // The token key is read too: the fenced lease shows its token, the plain one none.
    expect((await listAll(p)).map((l) => [l.key, l.owner, l.token]).sort()).toEqual([
      ['a', 'o', expect.any(Number)],
      ['res\0thr', 'run', undefined],
    ])
  })
})

describe('on a Redis Cluster', () => {
  let cluster: RedisCluster
  beforeAll(async () => {
    cluster = await startCluster()
  })
  afterAll(async () => {
    await cluster?.stop()
  })

  it('listLeases and `mastra-lease list --cluster` find the leases of every master', async () => {
    const p = closing(new RedisLeaseProvider({ cluster: { nodes: cluster.urls }, keyPrefix: `insp-cluster:${RUN}` }))
    const keys = Array.from({ length: 300 }, (_, i) => `k-${i}`)
    await Promise.all(keys.map((k) => p.acquireLease(k, 'o', 600_000)))
    expect((await cluster.masters()).length).toBeGreaterThan(1)
    expect((await listAll(p, 50)).map((l) => l.key).sort()).toEqual([...keys].sort())
    const listed = await cli('list', '--cluster', cluster.urls[0]!, '--prefix', `insp-cluster:${RUN}`)
    expect(listed.code).toBe(0)
    expect(listed.stdout.trim().split('\n').length).toBe(keys.length)
  })
})
