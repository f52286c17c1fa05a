// The contributor's loop: `npm run build` with nothing changed does not build the addon again
// (scripts/build-addon.mjs), and anything the addon is made from, changed, does.
import { spawnSync } from 'node:child_process'
import { readdirSync, statSync } from 'node:fs'
import path from 'node:path'
import { describe, expect, it } from 'vitest'

const root = path.resolve(__dirname, '..')
const script = path.join(root, 'scripts', 'build-addon.mjs')
const addon = path.join(root, readdirSync(root).find((f) => /^mastra-lease\..+\.node$/.test(f)) ?? 'mastra-lease.node')

function buildAddon(args: string[], env: NodeJS.ProcessEnv = process.env) {
  return spawnSync(process.execPath, [script, ...args], { cwd: root, env, encoding: 'utf8', timeout: 60_000 })
}

describe('the build', () => {
  it('builds nothing when nothing the addon is made from changed since npm run build', () => {
    const before = statSync(addon).mtimeMs
    const run = buildAddon([])
    expect(run.stderr).toBe('')
    expect(run.stdout).toMatch(/addon \(release\) up to date/)
    expect(run.status).toBe(0)
    expect(statSync(addon).mtimeMs).toBe(before)
  })

  it('finds a build due when what Cargo builds with changed (RUSTFLAGS, here)', () => {
    const run = buildAddon(['--check'], { ...process.env, RUSTFLAGS: '-C debug-assertions=on' })
    expect(run.stdout).toMatch(/addon \(release\) out of date/)
    expect(run.status).toBe(1)
  })

  it('keeps the debug profile apart: its stamp is its own', () => {
    const release = buildAddon(['--check'])
    expect(release.status).toBe(0)
    const debug = buildAddon(['--check', '--debug'])
    expect(debug.stdout).toMatch(/addon \(debug\) (up to date|out of date)/)
  })
})
