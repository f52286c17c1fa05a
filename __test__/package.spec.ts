// The packed tarballs are what users install: the main package (the loader, the shell, the
// types; no addon) and the platform package that carries the addon (npm/linux-x64-gnu here),
// which the loader finds as `mastra-lease-linux-x64-gnu`. Installed together they must load
// without a Rust toolchain, from both ESM and CommonJS.
import { execFileSync } from 'node:child_process'
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

const root = path.resolve(__dirname, '..')
let project: string

/** PATH without any directory that holds cargo or rustc, so nothing can build Rust. */
function pathWithoutRust(): string {
  return (process.env.PATH ?? '')
    .split(path.delimiter)
    .filter((dir) => {
      try {
        return !readdirSync(dir).some((f) => f === 'cargo' || f === 'rustc')
      } catch {
        return true
      }
    })
    .join(path.delimiter)
}

function run(file: string, code: string): string {
  writeFileSync(path.join(project, file), code)
  return execFileSync(process.execPath, [file], {
    cwd: project,
    env: { ...process.env, PATH: pathWithoutRust() },
    encoding: 'utf8',
    timeout: 20_000,
  })
}

describe('the npm package', () => {
  beforeAll(() => {
    project = mkdtempSync(path.join(os.tmpdir(), 'mastra-lease-pack-'))
    // The README's install from a clone: `npm run pack:local` (its build already ran) packs the
    // main package and the platform package with the addon this run built, and prints the
    // one `npm install` of the two.
    const printed = execFileSync(process.execPath, [path.join(root, 'scripts', 'pack-local.mjs')], { cwd: root, encoding: 'utf8' })
    const install = /^ {2}npm install (\S+) (\S+)$/m.exec(printed)
    if (install === null) throw new Error(`pack:local printed no npm install line:\n${printed}`)
    const [tarball, platformTarball] = [install[1]!, install[2]!]
    expect(path.basename(platformTarball)).toMatch(/^mastra-lease-linux-x64-gnu-/)
    for (const file of [tarball, platformTarball]) copyFileSync(file, path.join(project, path.basename(file)))
    writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'consumer', private: true }))
    // The peer @mastra/core is the user's own install; here it is this repository's copy
    // (linked in, so its dependencies resolve where they live), since an offline npm may
    // hold its tarball but not its registry metadata.
    execFileSync('npm', ['install', '--offline', '--legacy-peer-deps', '--no-audit', '--no-fund', '--ignore-scripts', tarball, platformTarball], {
      cwd: project,
      env: { ...process.env, PATH: [path.dirname(process.execPath), pathWithoutRust()].join(path.delimiter) },
      stdio: 'pipe',
    })
    mkdirSync(path.join(project, 'node_modules', '@mastra'), { recursive: true })
    symlinkSync(path.join(root, 'node_modules', '@mastra', 'core'), path.join(project, 'node_modules', '@mastra', 'core'), 'dir')
  }, 120_000)

  afterAll(() => rmSync(project, { recursive: true, force: true }))

  it('installs from its tarball and loads with require, without a Rust toolchain', () => {
    const out = run(
      'check.cjs',
      `const { MemoryLeaseProvider, RedisLeaseProvider } = require('mastra-lease')
       const m = new MemoryLeaseProvider()
       m.acquireLease('k\\0t', 'me', 1000).then(async (g) => {
         const fenced = await m.acquireFencedLease('k\\0t', 'me', 1000)
         console.log(typeof RedisLeaseProvider, JSON.stringify(g), JSON.stringify(fenced))
         return m.close()
       })`,
    )
    expect(out.trim()).toBe('function {"acquired":true,"owner":"me"} {"acquired":true,"owner":"me","token":1}')
  })

  it('loads with import, exposing the same classes', () => {
    const out = run(
      'check.mjs',
      `import { MemoryLeaseProvider, RedisLeaseProvider, withLeases } from 'mastra-lease'
       import { createRequire } from 'node:module'
       const cjs = createRequire(import.meta.url)('mastra-lease')
       const m = new MemoryLeaseProvider()
       const g = await m.acquireLease('k', 'me', 1000)
       console.log(MemoryLeaseProvider === cjs.MemoryLeaseProvider, RedisLeaseProvider === cjs.RedisLeaseProvider, g.acquired, typeof withLeases, typeof cjs.withLeases)
       await m.close()`,
    )
    expect(out.trim()).toBe('true true true function function')
  })

  it('recordLeaseMetrics() without @opentelemetry/api installed throws ERR_LEASE_MISSING_DEPENDENCY naming the package and its install, from either entry; given a MeterProvider it records', () => {
    expect(existsSync(path.join(project, 'node_modules', '@opentelemetry', 'api'))).toBe(false)
    const out = run(
      'metrics.mjs',
      `import { recordLeaseMetrics } from 'mastra-lease'
       import { createRequire } from 'node:module'
       for (const record of [recordLeaseMetrics, createRequire(import.meta.url)('mastra-lease').recordLeaseMetrics]) {
         try {
           record()
           console.log('recorded')
         } catch (e) {
           console.log(JSON.stringify({ name: e.name, code: e.code, message: e.message, cause: e.cause?.code }))
         }
       }
       // The way out the message offers: a MeterProvider of the application's own.
       const instrument = { record() {}, add() {} }
       const meter = { createHistogram: () => instrument, createCounter: () => instrument }
       console.log(typeof recordLeaseMetrics({ getMeter: () => meter }))`,
    )
    const [esm, cjs, given] = out.trim().split('\n')
    expect(esm).toBe(cjs)
    expect(JSON.parse(esm!)).toEqual({
      name: 'Error',
      code: 'ERR_LEASE_MISSING_DEPENDENCY',
      message: 'recordLeaseMetrics() needs @opentelemetry/api, an optional peer dependency of mastra-lease, and cannot load it: install it (npm install @opentelemetry/api), or pass it a MeterProvider',
      cause: 'MODULE_NOT_FOUND',
    })
    expect(given).toBe('function')
  })

  it('loads the addon from the platform package, with no .node beside the loader', () => {
    expect(readdirSync(path.join(project, 'node_modules', 'mastra-lease')).filter((f) => f.endsWith('.node'))).toEqual([])
    const out = run('which.cjs', `console.log(require.resolve('mastra-lease-linux-x64-gnu'), typeof require('mastra-lease').MemoryLeaseProvider)`)
    expect(out.trim()).toBe(`${path.join(realpathSync(project), 'node_modules', 'mastra-lease-linux-x64-gnu', 'mastra-lease.linux-x64-gnu.node')} function`)
  })

  it('without its platform package, says which package is missing instead of failing inside the loader', () => {
    const bare = mkdtempSync(path.join(os.tmpdir(), 'mastra-lease-bare-'))
    try {
      writeFileSync(path.join(bare, 'package.json'), JSON.stringify({ name: 'bare', private: true }))
      const tarball = readdirSync(project).find((f) => f.startsWith('mastra-lease-0') && f.endsWith('.tgz'))!
      execFileSync('npm', ['install', '--offline', '--legacy-peer-deps', '--no-audit', '--no-fund', '--ignore-scripts', path.join(project, tarball)], {
        cwd: bare,
        env: { ...process.env, PATH: [path.dirname(process.execPath), pathWithoutRust()].join(path.delimiter) },
        stdio: 'pipe',
      })
      mkdirSync(path.join(bare, 'node_modules', '@mastra'), { recursive: true })
      symlinkSync(path.join(root, 'node_modules', '@mastra', 'core'), path.join(bare, 'node_modules', '@mastra', 'core'), 'dir')
      for (const [file, code] of <Array<[string, string]>>[
        ['check.cjs', `try { require('mastra-lease') } catch (e) { console.log(e.code, e.message) }`],
        ['check.mjs', `try { await import('mastra-lease') } catch (e) { console.log(e.code, e.message) }`],
      ]) {
        writeFileSync(path.join(bare, file), code)
        const out = execFileSync(process.execPath, [file], { cwd: bare, encoding: 'utf8' })
        expect(out, file).toMatch(/^ERR_LEASE_NO_BINARY mastra-lease: the package with its binary for linux-x64-gnu \(mastra-lease-linux-x64-gnu\) is not installed/)
        // Packed from a clone, it lists no platform package: the advice is the clone's.
        expect(out, file).toContain('packed from a clone')
        expect(out, file).toContain('npm run pack:local')
      }
      // Installed from the registry, the platform packages are its optional dependencies.
      const installed = path.join(bare, 'node_modules', 'mastra-lease', 'package.json')
      const manifest = JSON.parse(readFileSync(installed, 'utf8')) as Record<string, unknown>
      writeFileSync(installed, JSON.stringify({ ...manifest, optionalDependencies: { 'mastra-lease-linux-x64-gnu': '0.1.0' } }))
      const out = execFileSync(process.execPath, ['check.cjs'], { cwd: bare, encoding: 'utf8' })
      expect(out).toMatch(/^ERR_LEASE_NO_BINARY mastra-lease: the package with its binary for linux-x64-gnu \(mastra-lease-linux-x64-gnu\) is not installed\. It is an optional dependency: install again without --no-optional/)
    } finally {
      rmSync(bare, { recursive: true, force: true })
    }
  })

  it('in a clone without a build, says to run npm run build, from either entry', () => {
    const clone = mkdtempSync(path.join(os.tmpdir(), 'mastra-lease-clone-'))
    try {
      for (const file of ['package.json', 'Cargo.toml', 'index.js', 'platform-check.cjs']) copyFileSync(path.join(root, file), path.join(clone, file))
      const out = execFileSync(process.execPath, ['-e', `try { require('./index.js') } catch (e) { console.log(e.code, e.message) }`], { cwd: clone, encoding: 'utf8' })
      expect(out).toMatch(/^ERR_LEASE_NO_BINARY mastra-lease: this clone has no addon built for linux-x64-gnu: run `npm run build`/)
    } finally {
      rmSync(clone, { recursive: true, force: true })
    }
  })

  it('installs the mastra-lease command: --help answers with its usage and exit code 0, a usage error with 2', () => {
    const bin = path.join(project, 'node_modules', '.bin', 'mastra-lease')
    const env = { ...process.env, PATH: [path.dirname(process.execPath), pathWithoutRust()].join(path.delimiter) }
    const help = execFileSync(bin, ['--help'], { cwd: project, env, encoding: 'utf8', timeout: 20_000 })
    expect(help).toContain('mastra-lease list')
    let code: unknown
    try {
      execFileSync(bin, ['frobnicate'], { cwd: project, env, stdio: 'pipe', timeout: 20_000 })
    } catch (error) {
      code = (error as { status?: unknown }).status
    }
    expect(code).toBe(2)
  })

  it('ships its type declarations and no native addon, and nothing from the source tree', () => {
    const files = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: root, encoding: 'utf8' })
    const names = (JSON.parse(files) as Array<{ files: Array<{ path: string }> }>)[0]!.files.map((f) => f.path).sort()
    expect(names).toEqual(
      expect.arrayContaining([
        'index.d.ts',
        'index.js',
        'platform-check.cjs',
        'dist/esm/index.js',
        'dist/esm/index.d.ts',
        'dist/cjs/index.js',
        'dist/cjs/index.d.ts',
        'bin/mastra-lease.mjs',
        'package.json',
        'README.md',
      ]),
    )
    expect(names.filter((n) => n.endsWith('.node'))).toEqual([])
    expect(names.some((n) => n.startsWith('src/') || n.startsWith('__test__/'))).toBe(false)
  })
})
