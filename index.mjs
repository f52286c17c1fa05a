// ESM entry: the native binding is loaded once, through the CommonJS loader napi generates.
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const binding = require('./index.js')

export const { MemoryLeaseProvider, RedisLeaseProvider } = binding
export default binding
