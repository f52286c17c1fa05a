'use strict'
// Loaded before the napi loader (dist/cjs/native.js): when this platform has no binary, say so
// plainly, with what exists and how to build one, instead of the loader's error about npm.
const { existsSync } = require('node:fs')
const path = require('node:path')

/** The platforms published as mastra-lease-<platform> (package.json's napi.targets). */
const PUBLISHED = ['linux-x64-gnu', 'linux-x64-musl', 'linux-arm64-gnu', 'linux-arm64-musl', 'darwin-x64', 'darwin-arm64', 'win32-x64-msvc']

function platform() {
  const base = `${process.platform}-${process.arch}`
  if (process.platform === 'win32') return `${base}-msvc`
  if (process.platform !== 'linux') return base
  const report = typeof process.report?.getReport === 'function' ? process.report.getReport() : undefined
  return `${base}-${report?.header?.glibcVersionRuntime ? 'gnu' : 'musl'}`
}

const name = platform()
// Where the loader looks first: beside itself (a binary built from source).
let found = existsSync(path.join(__dirname, 'dist', 'cjs', `mastra-lease.${name}.node`))
if (!found) {
  try {
    require.resolve(`mastra-lease-${name}`)
    found = true
  } catch {
    found = false
  }
}
if (!found) {
  const binary = `mastra-lease-${name}`
  const { optionalDependencies = {} } = require('./package.json')
  let message
  if (existsSync(path.join(__dirname, 'Cargo.toml'))) {
    // The repository itself, not an installed package.
    message = `mastra-lease: this clone has no addon built for ${name}: run \`npm run build\` (it needs Rust; DEVELOPING.md).`
  } else if (!PUBLISHED.includes(name)) {
    message =
      `mastra-lease has no binary for ${name}. Binaries exist for ${PUBLISHED.join(', ')}. To build one: clone the repository, ` +
      'install Rust, run `npm install && npm run pack:local` there, and install the two tarballs it names (docs/platforms.md).'
  } else if (!(binary in optionalDependencies)) {
    // Packed from a clone: platform packages become optional dependencies only at release.
    message =
      `mastra-lease: the package with its binary for ${name} (${binary}) is not installed. This mastra-lease was packed from ` +
      `a clone, so nothing installs ${binary} for it: \`npm run pack:local\` in the clone packs both and prints the one npm install of the two.`
  } else {
    message =
      `mastra-lease: the package with its binary for ${name} (${binary}) is not installed. It is an optional dependency: ` +
      'install again without --no-optional/--omit=optional, and on the machine (or with --os/--cpu/--libc for the platform) it runs on.'
  }
  const err = new Error(message)
  err.code = 'ERR_LEASE_NO_BINARY'
  throw err
}
