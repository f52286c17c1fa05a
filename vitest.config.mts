import { defineConfig } from 'vitest/config'
import type { Reporter, TestModule } from 'vitest/node'

/**
 * Ends the run with the figures tests reported (`annotate`: what a fault or soak test
 * checked and measured), the tests that failed with the first lines of their errors, then one
 * plain line, `vitest: N passed, N failed, N skipped`, for CI logs (which may keep only their
 * tail).
 */
const figures: string[] = []
const summary: Reporter = {
  onTestCaseAnnotate(testCase, annotation) {
    figures.push(`  ${testCase.module.relativeModuleId} > ${testCase.fullName}\n    ${annotation.message}`)
  },
  onTestRunEnd(testModules: ReadonlyArray<TestModule>) {
    const count = { passed: 0, failed: 0, skipped: 0 }
    const failures: string[] = []
    const failed = (where: string, errors: ReadonlyArray<{ message: string }>) =>
      failures.push(`  ${where}\n    ${errors.flatMap((e) => e.message.split('\n')).slice(0, 6).join('\n    ')}`)
    for (const module of testModules) {
      for (const test of module.children.allTests()) {
        const result = test.result()
        if (result.state === 'passed' || result.state === 'failed' || result.state === 'skipped') count[result.state]++
        if (result.state === 'failed') failed(`${module.relativeModuleId} > ${test.fullName}`, result.errors ?? [])
      }
      // A module that failed outside its tests (a hook, an import) has no failed test to name it.
      const errors = module.errors()
      if (errors.length > 0) failed(module.relativeModuleId, errors)
    }
    if (figures.length > 0) console.log(`\nfigures:\n${figures.sort().join('\n')}`)
    if (failures.length > 0) console.log(`\nfailed:\n${failures.join('\n')}`)
    console.log(`\nvitest: ${count.passed} passed, ${count.failed} failed, ${count.skipped} skipped`)
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
