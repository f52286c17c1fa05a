#!/usr/bin/env node
// Tests the package against the oldest @mastra/core whose agent turns take a thread lease
// through the configured provider (1.57.0, below) and the newest on the registry (or the
// versions given as arguments), each installed fresh with this package's tarballs (main and
// linux-x64-gnu): Mastra must detect the providers structurally, and the examples must run
// (the lease lifecycle, and an agent turn whose thread lease goes through our provider).
// Prints one line per version; peerDependencies in package.json is set to what passed.
// `npm run test:mastra-range` (needs the npm registry; about a minute).
import { execFileSync, spawnSync } from 'node:child_process'
import { copyFileSync, cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

// @mastra/core 1.46.0 brought the lease API (isLeaseProvider); its agent turns began taking the
// thread lease through the provider between 1.55.0 (not yet) and 1.57.0 (1.56 was never
// published). Earlier versions would load the package and never call it.
const OLDEST_SUPPORTED = '1.57.0'
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const work = mkdtempSync(path.join(os.tmpdir(), 'mastra-lease-range-'))
const sh = (cmd, args, cwd) => execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })

const newest = sh('npm', ['view', '@mastra/core', 'version'], work).trim()
const pack = (cwd) => sh('npm', ['pack', '--silent', '--ignore-scripts', '--pack-destination', work], cwd).trim().split('\n').pop()
const main = pack(root)
const platformDir = path.join(work, 'platform')
cpSync(path.join(root, 'npm', 'linux-x64-gnu'), platformDir, { recursive: true })
copyFileSync(path.join(root, 'mastra-lease.linux-x64-gnu.node'), path.join(platformDir, 'mastra-lease.linux-x64-gnu.node'))
const platform = pack(platformDir)

const DETECT = `import { isLeaseProvider } from '@mastra/core/events'
import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub } from 'mastra-lease'
const found = [new MemoryLeaseProvider(), new RedisLeaseProvider(), new RedisStreamsPubSub()].map((p) => isLeaseProvider(p))
if (!found.every(Boolean)) throw new Error('isLeaseProvider missed one: ' + found)
console.log('detected')
process.exit(0)
`

const results = []
try {
  const versions = process.argv.length > 2 ? process.argv.slice(2) : [OLDEST_SUPPORTED, newest]
  for (const version of [...new Set(versions)]) {
    const dir = path.join(work, version)
    mkdirSync(dir, { recursive: true })
    writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: `range-${version}`, private: true, type: 'module' }))
    const started = Date.now()
    try {
      sh('npm', ['install', '--no-audit', '--no-fund', '--ignore-scripts', '--legacy-peer-deps', `@mastra/core@${version}`, 'zod@^4', path.join(work, main), path.join(work, platform)], dir)
      writeFileSync(path.join(dir, 'detect.mjs'), DETECT)
      for (const example of ['demo.mjs', 'mastra.mjs']) copyFileSync(path.join(root, 'examples', example), path.join(dir, example))
      for (const script of ['detect.mjs', 'demo.mjs', 'mastra.mjs']) {
        const run = spawnSync(process.execPath, [script], { cwd: dir, encoding: 'utf8', timeout: 120_000 })
        if (run.status !== 0) throw new Error(`${script}: ${(run.stderr || run.stdout).split('\n').filter(Boolean).slice(-3).join(' / ')}`)
      }
      results.push({ version, ok: true, why: `detected, demo and agent turn ran (${((Date.now() - started) / 1000).toFixed(0)} s)` })
    } catch (err) {
      results.push({ version, ok: false, why: String(err.message ?? err).slice(0, 400) })
    }
  }
} finally {
  rmSync(work, { recursive: true, force: true })
}
for (const r of results) console.log(`@mastra/core ${r.version.padEnd(8)} ${r.ok ? 'passed' : 'FAILED'}  ${r.why}`)
const peer = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).peerDependencies['@mastra/core']
console.log(`peerDependencies: @mastra/core ${peer}`)
process.exit(results.every((r) => r.ok) ? 0 : 1)
