// rediss:// against real redis-servers listening only on TLS, with certificates signed by a
// throwaway CA made for this run. Three servers: one for `localhost`/127.0.0.1 that asks
// for no client certificate, one with `tls-auth-clients yes`, and one whose certificate
// names only `redis.test`. Calls that depend on the platform's roots (SSL_CERT_FILE) run in
// a child process, so this process's environment never matters. Beyond one server: a Redis
// Cluster and a Sentinel set on TLS only (the cluster bus and replication too).
import './helpers/mastra-node.js' // first: RedisStreamsPubSub loads Mastra, which needs Node >= 22.13

import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { createClient } from 'redis'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'

import { RedisStreamsPubSub } from '../dist/esm/index.js'
import { RedisLeaseProvider } from '../index.js'
import { errorCode, leaseFailureWarnings } from './helpers/lease.js'
import { EXTERNAL_REDIS, freePort } from './helpers/redis-server.js'
import { ev, Inbox, numberOf, uniquePrefix } from './helpers/streams.js'
// Refused certificates fail lease calls, which warn through process.emitWarning (no logger here).
leaseFailureWarnings()

const root = path.resolve(__dirname, '..')
let dir: string
const servers: ChildProcess[] = []
/** Ports of the three servers. */
let open: number // certificate for localhost and 127.0.0.1, no client certificate asked
let mutual: number // the same certificate, `tls-auth-clients yes`
let named: number // certificate for redis.test only

function openssl(...args: string[]) {
  execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' })
}

const file = (name: string) => path.join(dir, name)
const pem = (name: string) => readFileSync(file(name), 'utf8')

/** A key and a certificate signed by the test CA, with the given subjectAltName. */
function issue(name: string, subject: string, san: string | undefined, clientAuth = false) {
  openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', subject)
  const ext = [san && `subjectAltName=${san}`, clientAuth && 'extendedKeyUsage=clientAuth'].filter(Boolean).join('\n')
  writeFileSync(file(`${name}.cnf`), `${ext}\n`)
  openssl('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out', `${name}.crt`, '-days', '2', '-extfile', `${name}.cnf`)
}

/** Starts a TLS-only redis-server and waits until it completes a handshake. */
async function tlsServer(cert: string, authClients: boolean): Promise<number> {
  const port = await freePort()
  servers.push(
    spawn(
      'redis-server',
      ['--port', '0', '--tls-port', String(port), '--bind', '127.0.0.1', '--tls-cert-file', `${cert}.crt`, '--tls-key-file', `${cert}.key`,
        '--tls-ca-cert-file', 'ca.crt', '--tls-auth-clients', authClients ? 'yes' : 'no', '--save', '', '--appendonly', 'no', '--dir', dir],
      { cwd: dir, stdio: 'ignore' },
    ),
  )
  const deadline = Date.now() + 10_000
  for (;;) {
    try {
      execFileSync('openssl', ['s_client', '-connect', `127.0.0.1:${port}`, '-CAfile', 'ca.crt', '-cert', 'client.crt', '-key', 'client.key'],
        { cwd: dir, input: '', stdio: 'pipe', timeout: 2000 })
      return port
    } catch {
      if (Date.now() > deadline) throw new Error('TLS redis-server did not start')
      await new Promise((r) => setTimeout(r, 100))
    }
  }
}

interface TlsFiles {
  ca?: string
  cert?: string
  key?: string
  servername?: string
}

/**
 * Runs one acquire + getLeaseOwner in a child process, without SSL_CERT_FILE unless
 * `trustCa`; `tls` names files read in the child (as Buffers when `buffers`). Prints JSON
 * or the error's code.
 */
function callOverTls(url: string, opts: { trustCa?: boolean; tls?: TlsFiles; buffers?: boolean } = {}): { ok?: unknown; code?: string; message?: string } {
  const tls = opts.tls && Object.fromEntries(Object.entries(opts.tls).map(([k, v]) => [k, k === 'servername' ? v : file(v)]))
  const script = `
    const fs = require('node:fs')
    const { RedisLeaseProvider } = require(${JSON.stringify(path.join(root, 'index.js'))})
    const files = ${JSON.stringify(tls ?? null)}
    const tls = files && Object.fromEntries(Object.entries(files).map(([k, v]) =>
      [k, k === 'servername' ? v : ${opts.buffers ? 'fs.readFileSync(v)' : "fs.readFileSync(v, 'utf8')"}]))
    // A logger, so the warning a refused connection's failed calls cause stays out of the
    // stderr this child shares with the test run (the result below says how the call failed).
    const logger = { warn() {} }
    const p = new RedisLeaseProvider({ url: ${JSON.stringify(url)}, commandTimeoutMs: 3000, logger, ...(tls ? { tls } : {}) })
    p.acquireLease('tls\\0key', 'owner-1', 5000)
      .then(async (grant) => ({ ok: [grant, await p.getLeaseOwner('tls\\0key')] }))
      .catch((e) => ({ code: e.code, message: e.message }))
      .then(async (out) => { console.log(JSON.stringify(out)); await p.close() })`
  const env = { ...process.env }
  delete env.SSL_CERT_FILE
  if (opts.trustCa) env.SSL_CERT_FILE = file('ca.crt')
  const out = execFileSync(process.execPath, ['-e', script], { env, encoding: 'utf8', timeout: 20_000 })
  return JSON.parse(out.trim().split('\n').pop()!)
}

const GRANTED = { ok: [{ acquired: true, owner: 'owner-1' }, 'owner-1'] }

describe.skipIf(EXTERNAL_REDIS)('rediss:// (TLS)', () => {
  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'mastra-lease-tls-'))
    openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2', '-subj', '/CN=mastra-lease test CA')
    issue('server', '/CN=localhost', 'DNS:localhost,IP:127.0.0.1')
    issue('named', '/CN=redis.test', 'DNS:redis.test')
    issue('client', '/CN=mastra-lease client', undefined, true)
    // A client certificate from a CA the servers do not trust.
    openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'stranger.key', '-out', 'stranger.crt', '-days', '2', '-subj', '/CN=stranger')
    ;[open, mutual, named] = await Promise.all([tlsServer('server', false), tlsServer('server', true), tlsServer('named', false)])
  }, 60_000)

  afterAll(() => {
    for (const s of servers) s.kill('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  })

  describe('trust from the platform roots (SSL_CERT_FILE)', () => {
    it('leases over rediss:// when the server certificate chains to a trusted CA', () => {
      expect(callOverTls(`rediss://localhost:${open}`, { trustCa: true })).toEqual(GRANTED)
    })

    it('refuses a server certificate from an unknown CA with a coded connection error, not a lost lease', () => {
      const out = callOverTls(`rediss://localhost:${open}`)
      expect(out.code).toBe('ERR_LEASE_CONNECTION')
      expect(out.message).toMatch(/certificate/i)
    })
  })

  describe('the tls option', () => {
    it('trusts the CA given as tls.ca (a PEM string or a Buffer) with no SSL_CERT_FILE', () => {
      expect(callOverTls(`rediss://localhost:${open}`, { tls: { ca: 'ca.crt' } })).toEqual(GRANTED)
      expect(callOverTls(`rediss://127.0.0.1:${open}`, { tls: { ca: 'ca.crt' }, buffers: true })).toEqual(GRANTED)
    })

    it('tls.ca replaces the platform roots: a CA that did not sign the server certificate is refused even when SSL_CERT_FILE trusts the right one', () => {
      const out = callOverTls(`rediss://localhost:${open}`, { trustCa: true, tls: { ca: 'stranger.crt' } })
      expect(out.code).toBe('ERR_LEASE_CONNECTION')
      expect(out.message).toMatch(/certificate/i)
    })

    it('a server with tls-auth-clients yes refuses a client without a certificate with ERR_LEASE_CONNECTION, never false', () => {
      const out = callOverTls(`rediss://localhost:${mutual}`, { tls: { ca: 'ca.crt' } })
      expect(out.ok).toBeUndefined()
      expect(out.code).toBe('ERR_LEASE_CONNECTION')
    })

    it('a server with tls-auth-clients yes refuses a client certificate from a CA it does not trust', () => {
      const out = callOverTls(`rediss://localhost:${mutual}`, { tls: { ca: 'ca.crt', cert: 'stranger.crt', key: 'stranger.key' } })
      expect(out.ok).toBeUndefined()
      expect(out.code).toBe('ERR_LEASE_CONNECTION')
    })

    it('a server with tls-auth-clients yes accepts a client certificate and key (strings or Buffers) signed by its CA', () => {
      expect(callOverTls(`rediss://localhost:${mutual}`, { tls: { ca: 'ca.crt', cert: 'client.crt', key: 'client.key' } })).toEqual(GRANTED)
      expect(callOverTls(`rediss://localhost:${mutual}`, { tls: { ca: 'ca.crt', cert: 'client.crt', key: 'client.key' }, buffers: true })).toEqual(GRANTED)
    })

    it('verifies the server certificate against the URL host: a certificate for redis.test reached at 127.0.0.1 is refused', () => {
      const out = callOverTls(`rediss://127.0.0.1:${named}`, { tls: { ca: 'ca.crt' } })
      expect(out.code).toBe('ERR_LEASE_CONNECTION')
      expect(out.message).toMatch(/certificate/i)
      // The same CA and server, named as on its certificate, would be trusted: only the name fails.
      expect(callOverTls(`rediss://localhost:${open}`, { tls: { ca: 'ca.crt' } })).toEqual(GRANTED)
    })
  })

  describe('RedisStreamsPubSub with the tls option', () => {
    const pubsubs: RedisStreamsPubSub[] = []
    afterEach(async () => {
      await Promise.allSettled(pubsubs.splice(0).map((p) => p.close()))
    })

    it('publishes, delivers and leases over mutual TLS with tls.ca, tls.cert and tls.key', async () => {
      const pubsub = new RedisStreamsPubSub({
        url: `rediss://localhost:${mutual}`,
        keyPrefix: uniquePrefix('tls'),
        tls: { ca: readFileSync(file('ca.crt')), cert: pem('client.crt'), key: readFileSync(file('client.key')) },
        blockMs: 100,
      })
      pubsubs.push(pubsub)
      const inbox = new Inbox()
      await pubsub.subscribe('topic', inbox.cb)
      await pubsub.publish('topic', ev(1))
      await pubsub.publish('topic', ev(2))
      await inbox.until((events) => events.length >= 2, 10_000, 'two events over TLS')
      expect(inbox.events.map(numberOf)).toEqual([1, 2])
      expect(await pubsub.acquireLease('k', 'owner-1', 5_000)).toStrictEqual({ acquired: true, owner: 'owner-1' })
      expect(await pubsub.acquireLease('k', 'owner-2', 5_000)).toEqual({ acquired: false, owner: 'owner-1' })
      expect(await pubsub.renewLease('k', 'owner-1', 5_000)).toBe(true)
      expect(await pubsub.getLeaseOwner('k')).toBe('owner-1')
    })

    it("a node-redis client configured for mutual TLS (socket.tls, ca, cert, key), as Mastra's backend takes it, is read and used, never connected", async () => {
      const client = createClient({
        socket: { host: 'localhost', port: mutual, tls: true, ca: pem('ca.crt'), cert: pem('client.crt'), key: pem('client.key') },
      })
      const pubsub = new RedisStreamsPubSub({ client, keyPrefix: uniquePrefix('tls-client'), blockMs: 100 })
      pubsubs.push(pubsub)
      const inbox = new Inbox()
      await pubsub.subscribe('topic', inbox.cb)
      await pubsub.publish('topic', ev(1))
      await inbox.until((events) => events.length >= 1, 10_000, 'an event over TLS')
      expect(await pubsub.acquireLease('k', 'owner-1', 5_000)).toStrictEqual({ acquired: true, owner: 'owner-1' })
      expect(client.isOpen).toBe(false)
    })

    it('a waiter (hold with wait) is woken over mutual TLS by a release on another connection', async () => {
      const options = {
        url: `rediss://localhost:${mutual}`,
        keyPrefix: uniquePrefix('tls-wait'),
        tls: { ca: pem('ca.crt'), cert: pem('client.crt'), key: pem('client.key') },
      }
      const holder = new RedisStreamsPubSub(options)
      const waiter = new RedisStreamsPubSub(options)
      pubsubs.push(holder, waiter)
      await holder.acquireLease('k', 'A', 60_000)
      const waiting = waiter.hold('k', 'B', { ttlMs: 5_000, wait: true })
      await new Promise((resolve) => setTimeout(resolve, 200))
      await holder.releaseLease('k', 'A')
      const lease = await Promise.race([waiting, new Promise((resolve) => setTimeout(resolve, 2_000, 'not woken'))])
      expect(lease).toMatchObject({ owner: 'B' })
    })

    it('without a client certificate, publish and the lease calls reject with ERR_LEASE_CONNECTION', async () => {
      const pubsub = new RedisStreamsPubSub({ url: `rediss://localhost:${mutual}`, keyPrefix: uniquePrefix('tls'), tls: { ca: pem('ca.crt') }, commandTimeoutMs: 3_000 })
      pubsubs.push(pubsub)
      const publish = await pubsub.publish('topic', ev(1)).then(() => 'resolved', errorCode)
      const lease = await pubsub.acquireLease('k', 'owner-1', 5_000).then(() => 'resolved', errorCode)
      expect({ publish, lease }).toEqual({ publish: 'ERR_LEASE_CONNECTION', lease: 'ERR_LEASE_CONNECTION' })
    })

    it('a certificate for redis.test reached at 127.0.0.1 is refused for publish and leases', async () => {
      const pubsub = new RedisStreamsPubSub({ url: `rediss://127.0.0.1:${named}`, keyPrefix: uniquePrefix('tls'), tls: { ca: pem('ca.crt') }, commandTimeoutMs: 3_000 })
      pubsubs.push(pubsub)
      const publish = await pubsub.publish('topic', ev(1)).then(() => 'resolved', errorCode)
      const lease = await pubsub.acquireLease('k', 'owner-1', 5_000).then(() => 'resolved', errorCode)
      expect({ publish, lease }).toEqual({ publish: 'ERR_LEASE_CONNECTION', lease: 'ERR_LEASE_CONNECTION' })
    })
  })

  describe('bad tls options throw at construction, and never repeat key material', () => {
    type Make = (options: Record<string, unknown>) => unknown
    const makers: Array<[string, Make]> = [
      ['RedisLeaseProvider', (o) => new RedisLeaseProvider(o as never)],
      ['RedisStreamsPubSub', (o) => new RedisStreamsPubSub(o as never)],
    ]

    async function thrown(make: Make, options: Record<string, unknown>): Promise<Error & { code?: unknown }> {
      let made: { close(): Promise<void> }
      try {
        made = make(options) as { close(): Promise<void> }
      } catch (err) {
        return err as Error & { code?: unknown }
      }
      await made.close()
      throw new Error(`no throw for ${Object.keys(options.tls as object).join(', ')}`)
    }

    it.each(makers)('%s: unparsable PEM, a cert without its key, a mismatched key, a wrong type, servername, or tls with redis:// each throw ERR_LEASE_INVALID_OPTION', async (_name, make) => {
      const key = pem('client.key')
      // A PEM block whose base64 is fine but whose content is not a certificate.
      const notACert = `-----BEGIN CERTIFICATE-----\n${Buffer.from('not a certificate at all').toString('base64')}\n-----END CERTIFICATE-----\n`
      const url = `rediss://localhost:${open}`
      const cases: Array<[Record<string, unknown>, typeof TypeError | typeof RangeError, RegExp]> = [
        [{ url, tls: { ca: 'garbage' } }, RangeError, /tls\.ca holds no PEM certificate/],
        [{ url, tls: { ca: key } }, RangeError, /tls\.ca holds no PEM certificate/], // the key passed by mistake
        [{ url, tls: { ca: '-----BEGIN CERTIFICATE-----\nAAAA' } }, RangeError, /tls\.ca is not well-formed PEM/],
        [{ url, tls: { ca: notACert } }, RangeError, /tls\.ca: certificate 1 is not a valid X\.509/],
        [{ url, tls: { ca: pem('ca.crt'), cert: pem('client.crt') } }, TypeError, /tls\.cert and tls\.key go together/],
        [{ url, tls: { key } }, TypeError, /tls\.cert and tls\.key go together/],
        [{ url, tls: { cert: pem('client.crt'), key: pem('stranger.key') } }, RangeError, /tls\.key is not the private key of tls\.cert/],
        [{ url, tls: { cert: pem('client.crt'), key: pem('client.crt') } }, RangeError, /tls\.key holds no PEM private key/],
        [{ url, tls: { cert: 'garbage', key } }, RangeError, /tls\.cert holds no PEM certificate/],
        [{ url, tls: { ca: 42 } }, TypeError, /tls\.ca must be a PEM string or Buffer, got number/],
        [{ url, tls: { ca: new Uint16Array(4) } }, TypeError, /tls\.ca must be a PEM string or Buffer/],
        [{ url, tls: 'ca.crt' }, TypeError, /tls must be an object, got string/],
        [{ url, tls: { ca: pem('ca.crt'), servername: 'redis.test' } }, TypeError, /tls\.servername is not supported.*URL's host/],
        [{ url, tls: { rejectUnauthorized: false } }, TypeError, /tls\.rejectUnauthorized is not supported/],
        [{ url: `redis://localhost:${open}`, tls: { ca: pem('ca.crt') } }, RangeError, /tls is set but url is not a rediss:\/\/ URL/],
        [{ url: `redis://localhost:${open}`, tls: {} }, RangeError, /tls is set but url is not a rediss:\/\/ URL/],
        [{ url: 'redis+unix:///tmp/none.sock', tls: { cert: pem('client.crt'), key } }, RangeError, /not a rediss:\/\/ URL/],
      ]
      const keyLines = key.split('\n').filter((line) => line.length > 20)
      for (const [options, cls, message] of cases) {
        const err = await thrown(make, options)
        const label = JSON.stringify(Object.keys(options.tls as object))
        expect(err, label).toBeInstanceOf(cls)
        expect(err.code, label).toBe('ERR_LEASE_INVALID_OPTION')
        expect(err.message, label).toMatch(message)
        for (const line of keyLines) expect(err.message, label).not.toContain(line)
        expect(err.message, label).not.toContain('PRIVATE KEY-----')
      }
    })

    it.each(makers)('%s: tls null, undefined or {} means none: the platform roots, which do not trust the test CA', async (_name, make) => {
      for (const tls of [null, undefined, {}]) {
        const made = make({ url: `rediss://localhost:${open}`, tls }) as { acquireLease(key: string, owner: string, ttlMs: number): Promise<unknown>; close(): Promise<void> }
        const answer = await made.acquireLease('k', 'owner-1', 5_000).then(() => 'resolved', errorCode)
        expect(answer, JSON.stringify(tls)).toBe('ERR_LEASE_CONNECTION')
        await made.close()
      }
    })
  })

  describe('beyond one server', () => {
    // Absolute paths: a server reads its files after moving to its own dir.
    const tlsArgs = () => ['--port', '0', '--bind', '127.0.0.1', '--tls-cert-file', file('server.crt'), '--tls-key-file', file('server.key'),
      '--tls-ca-cert-file', file('ca.crt'), '--tls-auth-clients', 'no', '--tls-replication', 'yes', '--save', '', '--appendonly', 'no']
    const cli = (port: number, ...args: string[]) =>
      execFileSync('redis-cli', ['--tls', '--cacert', 'ca.crt', '-p', String(port), ...args], { cwd: dir, stdio: 'pipe' }).toString()

    /** A redis-server (or sentinel) listening on TLS only, in a dir of its own; resolves once it answers. */
    async function tlsNode(name: string, extra: string[], sentinel = false): Promise<number> {
      const port = await freePort()
      const own = path.join(dir, name)
      execFileSync('mkdir', ['-p', own])
      const args = [...tlsArgs(), '--tls-port', String(port), '--dir', own, ...extra]
      const conf = path.join(own, 'sentinel.conf')
      if (sentinel) writeFileSync(conf, '')
      servers.push(spawn('redis-server', sentinel ? [conf, '--sentinel', ...args] : args, { cwd: dir, stdio: 'ignore' }))
      const deadline = Date.now() + 10_000
      for (;;) {
        try {
          if (cli(port, 'PING').trim() === 'PONG') return port
        } catch {
          // not listening yet
        }
        if (Date.now() > deadline) throw new Error(`${name} did not start`)
        await new Promise((r) => setTimeout(r, 100))
      }
    }

    it('a Redis Cluster on TLS only: every node reached over rediss:// with the tls option, leases and events on every master; a wrong CA is ERR_LEASE_CONNECTION', async () => {
      const ports: number[] = []
      for (let i = 0; i < 3; i++) {
        const bus = await freePort()
        ports.push(await tlsNode(`cluster-${i}`, ['--cluster-enabled', 'yes', '--tls-cluster', 'yes', '--cluster-port', String(bus), '--cluster-node-timeout', '1000']))
      }
      execFileSync('redis-cli', ['--tls', '--cacert', 'ca.crt', '--cluster', 'create', ...ports.map((p) => `127.0.0.1:${p}`), '--cluster-yes'], { cwd: dir, stdio: 'pipe' })
      const deadline = Date.now() + 15_000
      while (!ports.every((p) => cli(p, 'CLUSTER', 'INFO').includes('cluster_state:ok'))) {
        if (Date.now() > deadline) throw new Error('the TLS cluster never reached cluster_state:ok')
        await new Promise((r) => setTimeout(r, 100))
      }
      const cluster = { nodes: [`rediss://127.0.0.1:${ports[0]}`] }
      const leases = new RedisLeaseProvider({ cluster, tls: { ca: pem('ca.crt') }, keyPrefix: uniquePrefix('tls-cluster') })
      const pubsub = new RedisStreamsPubSub({ cluster, tls: { ca: pem('ca.crt') }, keyPrefix: uniquePrefix('tls-cluster') })
      try {
        // Keys enough to land on every master.
        const keys = Array.from({ length: 30 }, (_, i) => `thread-${i}`)
        const grants = await Promise.all(keys.map((k) => leases.acquireLease(k, 'a', 10_000)))
        expect(grants.every((g) => g.acquired)).toBe(true)
        const inbox = new Inbox()
        for (const topic of ['t-0', 't-1', 't-2', 't-3', 't-4']) await pubsub.subscribe(topic, inbox.cb, { group: 'g' })
        await Promise.all(['t-0', 't-1', 't-2', 't-3', 't-4'].map((topic, n) => pubsub.publish(topic, ev(n))))
        await inbox.count(5)
        expect(inbox.numbers.sort()).toEqual([0, 1, 2, 3, 4])
        // Spread: every master holds some of the leases.
        for (const port of ports) expect(Number(cli(port, 'DBSIZE').trim())).toBeGreaterThan(0)
      } finally {
        await leases.close()
        await pubsub.close()
      }
      const stranger = new RedisLeaseProvider({ cluster, tls: { ca: pem('stranger.crt') }, commandTimeoutMs: 1_000 })
      try {
        expect(await stranger.acquireLease('k', 'a', 1_000).catch(errorCode)).toBe('ERR_LEASE_CONNECTION')
      } finally {
        await stranger.close()
      }
    }, 60_000)

    it('behind Sentinel on TLS only: the sentinels and the master reached over rediss:// with the tls option', async () => {
      const master = await tlsNode('sentinel-master', [])
      const sentinelPort = await tlsNode('sentinel-0', [], true)
      cli(sentinelPort, 'SENTINEL', 'MONITOR', 'mymaster', '127.0.0.1', String(master), '1')
      const leases = new RedisLeaseProvider({
        sentinel: { nodes: [`rediss://127.0.0.1:${sentinelPort}`], masterName: 'mymaster' },
        tls: { ca: pem('ca.crt') },
        keyPrefix: uniquePrefix('tls-sentinel'),
      })
      try {
        expect(await leases.acquireLease('k', 'a', 10_000)).toStrictEqual({ acquired: true, owner: 'a' })
        expect(await leases.getLeaseOwner('k')).toBe('a')
        expect(cli(master, 'DBSIZE').trim()).not.toBe('0')
      } finally {
        await leases.close()
      }
    }, 30_000)
  })
})
