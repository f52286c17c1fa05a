// docs/testing.md's test files run as a user runs them: those that import vitest under
// vitest, those that import @jest/globals under Jest (compiled to CommonJS, as ts-jest would),
// each in a child process from a folder inside the package, so that `import … from
// 'mastra-lease'` finds this build. documentation-examples.spec.ts type-checks them with every
// other document's block, and runs the others, plain programs, under Node.
import { spawnSync } from 'node:child_process'
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import path from 'node:path'

import ts from 'typescript'
import { beforeAll, describe, expect, it } from 'vitest'

import { NODE } from './helpers/mastra-node.js'

const root = path.resolve(__dirname, '..')
const folder = path.join(root, 'target', 'testing-examples')

type Runner = 'vitest' | 'jest'

const examples = [...readFileSync(path.join(root, 'docs', 'testing.md'), 'utf8').matchAll(/^```ts\n([\s\S]*?)^```/gm)].map((block, i) => {
  const code = block[1]!
  const runner: Runner | undefined = /from 'vitest'/.test(code) ? 'vitest' : /from '@jest\/globals'/.test(code) ? 'jest' : undefined
  return { name: `testing-${i + 1}`, code, runner }
}).filter((e): e is typeof e & { runner: Runner } => e.runner !== undefined)

/** A test file compiled to CommonJS, as ts-jest would. */
const compiled = (code: string) =>
  ts.transpileModule(code, { compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022 } }).outputText

/** The command that runs one example, once written into the folder. */
function command(example: (typeof examples)[number]): string[] {
  switch (example.runner) {
    case 'vitest': {
      writeFileSync(path.join(folder, `${example.name}.spec.mts`), example.code)
      const vitest = path.join(root, 'node_modules', 'vitest', 'vitest.mjs')
      return [vitest, 'run', '--root', folder, '--config', path.join(folder, 'vitest.config.mjs'), `${example.name}.spec.mts`]
    }
    case 'jest': {
      writeFileSync(path.join(folder, `${example.name}.test.cjs`), compiled(example.code))
      const jest = path.join(root, 'node_modules', 'jest', 'bin', 'jest.js')
      return [jest, '--config', path.join(folder, 'jest.config.cjs'), '--ci', '--runInBand', '--runTestsByPath', path.join(folder, `${example.name}.test.cjs`)]
    }
  }
}

beforeAll(() => {
  rmSync(folder, { recursive: true, force: true })
  mkdirSync(folder, { recursive: true })
  // The package's build is loaded by Node, as a user's project loads it (see vitest.config.mts).
  writeFileSync(
    path.join(folder, 'vitest.config.mjs'),
    "export default { test: { include: ['*.spec.mts'], pool: 'forks', server: { deps: { external: [/\\/dist\\//] } } } }\n",
  )
  writeFileSync(
    path.join(folder, 'jest.config.cjs'),
    "module.exports = { rootDir: __dirname, testMatch: ['<rootDir>/*.test.cjs'], testEnvironment: 'node', transform: {}, cache: false, watchman: false }\n",
  )
})

describe('docs/testing.md', () => {
  it('has test files for vitest and Jest', () => {
    expect(new Set(examples.map((e) => e.runner))).toEqual(new Set(['vitest', 'jest']))
  })

  it.each(examples.map((e) => [e.name, e.runner, e] as const))('%s runs under %s and passes', (_name, _runner, example) => {
    // The child is a run of its own, not a worker of this one.
    const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith('VITEST')))
    const run = spawnSync(NODE, command(example), { cwd: folder, env: { ...env, NO_COLOR: '1', FORCE_COLOR: '0' }, encoding: 'utf8', timeout: 60_000 })
    expect({ status: run.status, error: run.error }, `${run.stdout}\n${run.stderr}`).toEqual({ status: 0, error: undefined })
  }, 90_000)
})
