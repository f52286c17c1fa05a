// Packs this clone for installing elsewhere: the main package and this machine's platform
// package with the addon just built, side by side in target/pack/, then prints the one
// `npm install` that installs both. The path to a working install until the package is on
// the registry (`npm run pack:local`; it builds first).
//
// The loader finds the addon in `mastra-lease-<platform>` by name, so the two tarballs go
// into the same project; the main package lists its platform packages as optional
// dependencies only once published (the release workflow adds them).
import { execFileSync } from 'node:child_process'
import { copyFileSync, cpSync, existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs'
import path from 'node:path'

const root = path.resolve(import.meta.dirname, '..')
const out = path.join(root, 'target', 'pack')
const addon = readdirSync(root).find((f) => /^mastra-lease\..+\.node$/.test(f))
if (addon === undefined) {
  console.error('pack:local: no addon at the root: run `npm run build` first')
  process.exit(1)
}
const platform = addon.slice('mastra-lease.'.length, -'.node'.length)
const platformPackage = path.join(root, 'npm', platform)
if (!existsSync(platformPackage)) {
  console.error(`pack:local: no platform package npm/${platform} for the addon ${addon}`)
  process.exit(1)
}

rmSync(out, { recursive: true, force: true })
mkdirSync(out, { recursive: true })
const staged = path.join(out, 'platform')
cpSync(platformPackage, staged, { recursive: true })
copyFileSync(path.join(root, addon), path.join(staged, addon))
const pack = (cwd) =>
  path.join(out, execFileSync('npm', ['pack', '--silent', '--ignore-scripts', '--pack-destination', out], { cwd, encoding: 'utf8' }).trim().split('\n').pop())
const tarballs = [pack(root), pack(staged)]
rmSync(staged, { recursive: true, force: true })

console.log(`Packed mastra-lease and mastra-lease-${platform} into ${path.relative(process.cwd(), out) || '.'}. In your project:\n`)
console.log(`  npm install ${tarballs.join(' ')}\n`)
