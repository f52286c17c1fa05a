import { stripVTControlCharacters } from 'node:util'

import { defineConfig } from 'vitest/config'
import type { Reporter, TestModule } from 'vitest/node'

/**
 * A log written to a file or a pipe (CI's) carries no colour codes, unless FORCE_COLOR asks
 * for them. Vitest colours through tinyrainbow, which looks at TERM but not at whether stdout
 * is a terminal, and has coloured its status symbols before this file is read: so what this
 * process writes to a stream that is not a terminal goes without escapes, and NO_COLOR keeps
 * them out of the workers and the processes the tests start. On a terminal nothing changes.
 */
if (!('FORCE_COLOR' in process.env)) {
  if (!process.stdout.isTTY) process.env.NO_COLOR ??= '1'
  for (const stream of [process.stdout, process.stderr]) {
    if (stream.isTTY) continue
    const write = stream.write.bind(stream) as (chunk: unknown, ...rest: unknown[]) => boolean
    stream.write = ((chunk: unknown, ...rest: unknown[]) =>
      write(typeof chunk === 'string' ? stripVTControlCharacters(chunk) : chunk, ...rest)) as typeof stream.write
  }
}

/**
 * Ends the run with the figures tests reported (`annotate`: what a fault or soak test
 * checked and measured), the tests that failed with the first lines of their errors, the
 * tests skipped with a reason (`ctx.skip(note)`), one line per file and reason, then one
 * plain line, `vitest: N passed, N expected to fail, N failed, N skipped`, for CI logs (which
 * may keep only their tail). An `it.fails` test whose body failed, as it should, is counted as
 * expected to fail, not as passed; one whose body passed is failed, as vitest has it.
 */
const figures: string[] = []
const summary: Reporter = {
  onTestCaseAnnotate(testCase, annotation) {
    figures.push(`  ${testCase.module.relativeModuleId} > ${testCase.fullName}\n    ${annotation.message}`)
  },
  onTestRunEnd(testModules: ReadonlyArray<TestModule>) {
    const count = { passed: 0, expectedToFail: 0, failed: 0, skipped: 0 }
    const failures: string[] = []
    const skipNotes = new Map<string, number>()
    const failed = (where: string, errors: ReadonlyArray<{ message: string }>) =>
      failures.push(`  ${where}\n    ${errors.flatMap((e) => e.message.split('\n')).slice(0, 6).join('\n    ')}`)
    for (const module of testModules) {
      for (const test of module.children.allTests()) {
        const result = test.result()
        if (result.state === 'passed') count[test.options.fails ? 'expectedToFail' : 'passed']++
        if (result.state === 'failed' || result.state === 'skipped') count[result.state]++
        if (result.state === 'failed') failed(`${module.relativeModuleId} > ${test.fullName}`, result.errors ?? [])
        if (result.state === 'skipped' && result.note) {
          const where = `${module.relativeModuleId}: ${result.note}`
          skipNotes.set(where, (skipNotes.get(where) ?? 0) + 1)
        }
      }
      // A module that failed outside its tests (a hook, an import) has no failed test to name it.
      const errors = module.errors()
      if (errors.length > 0) failed(module.relativeModuleId, errors)
    }
    if (figures.length > 0) console.log(`\nfigures:\n${figures.sort().join('\n')}`)
    if (skipNotes.size > 0) {
      const lines = [...skipNotes].map(([where, n]) => `  ${n} ${n === 1 ? 'test' : 'tests'} in ${where}`)
      console.log(`\nskipped:\n${lines.sort().join('\n')}`)
    }
    if (failures.length > 0) console.log(`\nfailed:\n${failures.join('\n')}`)
    console.log(`\nvitest: ${count.passed} passed, ${count.expectedToFail} expected to fail, ${count.failed} failed, ${count.skipped} skipped`)
  },
}

export default defineConfig({
  test: {
    include: ['__test__/**/*.spec.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Real child processes (redis-server, node) and a native addon: one process per file.
    pool: 'forks',
    fileParallelism: true,
    reporters: ['default', summary],
    // The package under test is loaded by Node itself, as users load it: Vite's own module
    // graph would make a second copy of each CommonJS module the ESM build imports.
    server: { deps: { external: [/\/dist\//] } },
  },
})
