// Builds the TypeScript shell: once as CommonJS (dist/cjs), the package itself, with the
// binding napi-rs generated beside it; then the ESM entry (dist/esm), which imports that
// build, so each module, class and provider's waiters exist once whichever way the package
// is loaded.
//
// Only what extends a class of @mastra/core is compiled for ESM as well: Mastra ships ESM and
// CommonJS copies of its classes, and a pubsub must be an instance of the PubSub its importer
// sees. Those modules, and the entry, are taken from an ESM compile, with every other import
// pointed at the CommonJS build.
import { execFileSync } from 'node:child_process'
import { copyFileSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import path from 'node:path'

const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc')
const compile = (config) => execFileSync(process.execPath, [tsc, '-p', config], { stdio: 'inherit' })
const ESM_COMPILE = 'target/shell-esm'

for (const dir of ['dist', ESM_COMPILE]) rmSync(dir, { recursive: true, force: true })

// Every optional property of the binding's types takes `undefined` too, as the addon does, so
// `{ url: process.env.REDIS_URL }` type-checks under `exactOptionalPropertyTypes` (on in
// `tsc --init`'s strict defaults). napi-rs writes `name?: T`; a function type is wrapped first.
const BINDING_TYPES = 'src/shell/native.d.ts'
const optional = /^(\s+\w+\?: )(.+)$/gm
writeFileSync(BINDING_TYPES, readFileSync(BINDING_TYPES, 'utf8').replace(optional, (whole, name, type) =>
  type.endsWith(' | undefined') ? whole : `${name}${type.includes('=>') ? `(${type})` : type} | undefined`))

compile('src/shell/tsconfig.json')
// Each folder marked with its module type, so Node and TypeScript read every file as it is.
writeFileSync('dist/cjs/package.json', JSON.stringify({ type: 'commonjs' }) + '\n')
// The loader napi-rs generated looks for the addon beside itself (a built one, here), then
// for the platform package.
for (const file of ['native.js', 'native.d.ts']) copyFileSync(`src/shell/${file}`, `dist/cjs/${file}`)
for (const file of readdirSync('.').filter((f) => /^mastra-lease\..+\.node$/.test(f))) copyFileSync(file, `dist/cjs/${file}`)

compile('src/shell/tsconfig.esm.json')
/** The modules a compiled module imports from its own folder, by name (`./hold.js`: `hold`). */
function localImports(file) {
  const text = readFileSync(path.join(ESM_COMPILE, file), 'utf8')
  return [...text.matchAll(/(?:from|import)\s*['"]\.\/([^'"]+)\.js['"]/g)].map((m) => m[1])
}
const modules = readdirSync(ESM_COMPILE)
  .filter((f) => f.endsWith('.js'))
  .map((f) => f.slice(0, -'.js'.length))
// Those that import @mastra/core at run time, or a module that does.
const mastraBound = new Set(modules.filter((m) => /from\s*['"]@mastra\/core/.test(readFileSync(path.join(ESM_COMPILE, `${m}.js`), 'utf8'))))
for (let grown = true; grown; ) {
  grown = false
  for (const m of modules) {
    if (!mastraBound.has(m) && localImports(`${m}.js`).some((i) => mastraBound.has(i))) grown = mastraBound.add(m) !== undefined
  }
}
mkdirSync('dist/esm')
writeFileSync('dist/esm/package.json', JSON.stringify({ type: 'module' }) + '\n')
for (const m of ['index', ...mastraBound]) {
  for (const file of [`${m}.js`, `${m}.d.ts`]) {
    const text = readFileSync(path.join(ESM_COMPILE, file), 'utf8').replace(
      /((?:from|import)\s*\(?\s*)(['"])\.\/([^'"]+)\.js\2/g,
      (whole, before, quote, name) => (mastraBound.has(name) ? whole : `${before}${quote}../cjs/${name}.js${quote}`),
    )
    writeFileSync(`dist/esm/${file}`, text)
  }
}
