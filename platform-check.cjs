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
  const supported = PUBLISHED.includes(name)
  const err = new Error(
    supported
      ? `mastra-lease: the package with its binary for ${name} (mastra-lease-${name}) is not installed. It is an optional dependency: ` +
          'install again without --no-optional/--omit=optional, and on the machine (or with --os/--cpu/--libc for the platform) it runs on.'
      : `mastra-lease has no binary for ${name}. Binaries exist for ${PUBLISHED.join(', ')}. ` +
          'To build one: clone the repository, install Rust, then `npm install && npm run build` (see DEVELOPING.md).',
  )
  err.code = 'ERR_LEASE_NO_BINARY'
  throw err
}
