// Jest, for the tests that must run under Jest itself (its own modern fake timers): plain
// CommonJS test files against the built package (dist/cjs, as `require('mastra-lease')` finds
// it), so nothing is transformed. jest.spec.ts runs them and says how they went.
module.exports = {
  rootDir: __dirname,
  testMatch: ['<rootDir>/*.test.cjs'],
  testEnvironment: 'node',
  transform: {},
  // Never a cache or a watchman outside the run: each run starts as a user's first would.
  cache: false,
  watchman: false,
}
