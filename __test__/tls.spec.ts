// rediss:// against a real redis-server listening only on TLS, with a certificate signed by
// a throwaway CA made for this run. The provider trusts the platform's roots (and the file
// named by SSL_CERT_FILE), so the calls run in a child process pointed at that CA.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

import { EXTERNAL_REDIS, freePort } from './helpers/redis-server.js'

const root = path.resolve(__dirname, '..')
let dir: string
let port: number
let server: ChildProcess | undefined

function openssl(...args: string[]) {
  execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' })
}

/** Runs one acquire + getLeaseOwner in a child process; prints JSON or the error's code. */
function callOverTls(url: string, trustCa: boolean): { ok?: unknown; code?: string; message?: string } {
  const script = `
    const { RedisLeaseProvider } = require(${JSON.stringify(path.join(root, 'index.js'))})
    const p = new RedisLeaseProvider({ url: ${JSON.stringify(url)}, commandTimeoutMs: 3000 })
    p.acquireLease('tls\\0key', 'owner-1', 5000)
      .then(async (grant) => ({ ok: [grant, await p.getLeaseOwner('tls\\0key')] }))
      .catch((e) => ({ code: e.code, message: e.message }))
      .then(async (out) => { console.log(JSON.stringify(out)); await p.close() })`
  const env = { ...process.env }
  delete env.SSL_CERT_FILE
  if (trustCa) env.SSL_CERT_FILE = path.join(dir, 'ca.crt')
  const out = execFileSync(process.execPath, ['-e', script], { env, encoding: 'utf8', timeout: 20_000 })
  return JSON.parse(out.trim().split('\n').pop()!)
}

describe.skipIf(EXTERNAL_REDIS)('rediss:// (TLS)', () => {
  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'mastra-lease-tls-'))
    openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2', '-subj', '/CN=mastra-lease test CA')
    openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=localhost')
    writeFileSync(path.join(dir, 'san.cnf'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n')
    openssl('x509', '-req', '-in', 'server.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out', 'server.crt', '-days', '2', '-extfile', 'san.cnf')
    port = await freePort()
    server = spawn(
      'redis-server',
      ['--port', '0', '--tls-port', String(port), '--bind', '127.0.0.1', '--tls-cert-file', 'server.crt', '--tls-key-file', 'server.key',
        '--tls-ca-cert-file', 'ca.crt', '--tls-auth-clients', 'no', '--save', '', '--appendonly', 'no', '--dir', dir],
      { cwd: dir, stdio: 'ignore' },
    )
    // Ready when it accepts a TLS handshake: poll with openssl s_client.
    const deadline = Date.now() + 10_000
    for (;;) {
      try {
        execFileSync('openssl', ['s_client', '-connect', `127.0.0.1:${port}`, '-CAfile', 'ca.crt'], { cwd: dir, input: '', stdio: 'pipe', timeout: 2000 })
        break
      } catch {
        if (Date.now() > deadline) throw new Error('TLS redis-server did not start')
        await new Promise((r) => setTimeout(r, 100))
      }
    }
  }, 30_000)

  afterAll(() => {
    server?.kill('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  })

  it('leases over rediss:// when the server certificate chains to a trusted CA', () => {
    const out = callOverTls(`rediss://localhost:${port}`, true)
    expect(out).toEqual({ ok: [{ acquired: true, owner: 'owner-1' }, 'owner-1'] })
  })

  it('refuses a server certificate from an unknown CA with a coded connection error, not a lost lease', () => {
    const out = callOverTls(`rediss://localhost:${port}`, false)
    expect(out.code).toBe('ERR_LEASE_CONNECTION')
    expect(out.message).toMatch(/certificate/i)
  })
})
