import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['__test__/**/*.spec.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Real child processes (redis-server, node) and a native addon: one process per file.
    pool: 'forks',
    fileParallelism: true,
  },
})
