// The types of mastra-lease/native: the native binding's, as `napi build` generates them
// (src/shell/native.d.ts, built into dist/cjs).
export * from './dist/cjs/native.js'
