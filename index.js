'use strict'
// mastra-lease/native: the binding's classes and functions as napi-rs generates them
// (src/shell/native.js, built into dist/cjs beside the shell), without the shell's tracing.
require('./platform-check.cjs')
module.exports = require('./dist/cjs/native.js')
