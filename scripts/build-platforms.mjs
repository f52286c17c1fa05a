#!/usr/bin/env node
// Builds the addon for every target in package.json's napi.targets that this machine can
// build, and puts each .node in its platform package (npm/<platform>/). Cross-builds go
// through `napi build -x` (cargo-zigbuild with zig, both from PyPI). Prints one line per
// target: built, or skipped and why (macOS needs Apple's SDK and Windows MSVC's, which no
// registry here carries). `npm run build:platforms [-- <target>...]`.
import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const pkg = JSON.parse(execFileSync('node', ['-p', 'JSON.stringify(require("./package.json"))'], { cwd: root, encoding: 'utf8' }))
const binary = pkg.napi.binaryName
const host = execFileSync('rustc', ['-vV'], { encoding: 'utf8' }).match(/^host: (.+)$/m)[1]
const wanted = process.argv.slice(2)
const targets = wanted.length ? wanted : pkg.napi.targets

/** What a target needs here, or why it cannot be built. */
function missing(target) {
  const installed = execFileSync('rustup', ['target', 'list', '--installed'], { encoding: 'utf8' }).split('\n')
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

const out = path.join(root, 'target', 'platforms')
rmSync(out, { recursive: true, force: true })
mkdirSync(out, { recursive: true })
const results = []
for (const target of targets) {
  const why = missing(target)
  if (why) {
    results.push({ target, status: 'skipped', why })
    continue
  }
  const started = Date.now()
  const args = ['napi', 'build', '--platform', '--release', '--no-const-enum', '--no-js', '--target', target, '--output-dir', out]
  if (target !== host) args.push('--cross-compile')
  const build = spawnSync('npx', args, { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
  const node = readdirSync(out).find((f) => f.endsWith('.node') && !results.some((r) => r.file === f))
  if (build.status !== 0 || !node) {
    const lines = `${build.stdout}\n${build.stderr}`.split('\n').filter((l) => /error|not found|cannot|unable/i.test(l))
    results.push({ target, status: 'skipped', why: `the build failed: ${lines.slice(-2).join(' / ').slice(0, 300) || `exit ${build.status}`}` })
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
