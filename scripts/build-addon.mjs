// Builds the addon with `napi build` (release, or `--debug`), unless nothing it is made from
// changed since the last build of that profile: then it says so and returns in a moment.
// With `--check` it builds nothing and exits 0 when up to date, 1 when a build is due.
//
// Cargo alone would not: `napi build` sets NAPI_FORCE_BUILD_MASTRA_LEASE to the time of day
// whenever its type-definition folder is new (the first build in a target directory), and
// the crate's build script, through napi-build, reruns whenever that variable changes, so
// the build after the first compiled the crate again (about 50 s) with nothing changed.
//
// What the addon is made from: every file rustc reads (src/**/*.rs and the Lua scripts it
// compiles in), the manifests, the lock file, the build script, the toolchain, the variables
// that change what Cargo builds, and the napi command itself. The stamp holds their digest
// and what the build left, and is written only after a build that succeeded.
import { createHash } from 'node:crypto'
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs'
import path from 'node:path'

const root = path.resolve(import.meta.dirname, '..')
const debug = process.argv.includes('--debug')
const check = process.argv.includes('--check')
const napi = [
  'build', '--platform', ...(debug ? [] : ['--release']), '--no-const-enum',
  '--js', 'src/shell/native.js', '--dts', 'src/shell/native.d.ts',
]
const stamp = path.join(root, 'target', `addon-${debug ? 'debug' : 'release'}.stamp`)

/** Every file under `dir` (relative to the root) whose name ends in one of `endings`, sorted. */
function filesUnder(dir, endings) {
  const found = []
  for (const entry of readdirSync(path.join(root, dir), { withFileTypes: true })) {
    const relative = path.join(dir, entry.name)
    if (entry.isDirectory()) found.push(...filesUnder(relative, endings))
    else if (endings.some((e) => entry.name.endsWith(e))) found.push(relative)
  }
  return found.sort()
}

function digest() {
  const hash = createHash('sha256')
  const inputs = [...filesUnder('src', ['.rs', '.lua']), 'Cargo.toml', 'Cargo.lock', 'build.rs']
  for (const config of ['.cargo/config.toml', '.cargo/config']) if (existsSync(path.join(root, config))) inputs.push(config)
  for (const file of inputs) hash.update(`${file}\0`).update(readFileSync(path.join(root, file))).update('\0')
  hash.update(execFileSync('rustc', ['-vV'], { encoding: 'utf8' }))
  hash.update(JSON.stringify(napi))
  hash.update(readFileSync(path.join(root, 'node_modules', '@napi-rs', 'cli', 'package.json')))
  const cargoEnv = Object.entries(process.env)
    .filter(([name]) => /^(RUSTFLAGS|RUSTC|CARGO_BUILD_.*|CARGO_ENCODED_RUSTFLAGS|CARGO_PROFILE_.*|CARGO_TARGET_.*)$/.test(name))
    .sort(([a], [b]) => a.localeCompare(b))
  return hash.update(JSON.stringify(cargoEnv)).digest('hex')
}

/**
 * What the last build left: each addon at the root and the loader, by size and time, so a
 * build of the other profile (or a file removed) since then is built again.
 */
function outputs() {
  const files = [...readdirSync(root).filter((f) => /^mastra-lease\..+\.node$/.test(f)), 'src/shell/native.js']
  return files.map((f) => {
    const at = path.join(root, f)
    return existsSync(at) ? `${f} ${statSync(at).size} ${statSync(at).mtimeMs}` : `${f} missing`
  })
}

const inputs = digest()
const last = existsSync(stamp) ? readFileSync(stamp, 'utf8') : ''
const upToDate = last === JSON.stringify({ inputs, outputs: outputs() }) && existsSync(path.join(root, 'src/shell/native.d.ts'))
if (upToDate || check) {
  console.log(`addon (${debug ? 'debug' : 'release'}) ${upToDate ? 'up to date: nothing it is made from changed' : 'out of date'}`)
  if (!upToDate) process.exitCode = 1
} else {
  const cli = path.join(root, 'node_modules', '@napi-rs', 'cli', 'dist', 'cli.js')
  execFileSync(process.execPath, [cli, ...napi], { cwd: root, stdio: 'inherit' })
  mkdirSync(path.dirname(stamp), { recursive: true })
  writeFileSync(stamp, JSON.stringify({ inputs, outputs: outputs() }))
}
