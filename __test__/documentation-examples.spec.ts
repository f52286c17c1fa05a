// The examples in README.md and docs/*.md, as a user pastes them into a fresh project: every
// TypeScript block is a whole program. Each type-checks under TypeScript 5.9 and 7 in a project
// that version's `tsc --init` made (strict, exactOptionalPropertyTypes, target esnext) with
// Node's types; then TypeScript 7 compiles it as that project would and it runs on this Node
// against a test server, exiting by itself.
import { execFileSync, spawnSync } from 'node:child_process'
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startRedis, type RedisServer } from './helpers/redis-server'

const root = path.resolve(__dirname, '..')
// Inside the package, so `import … from 'mastra-lease'` finds this build by the package's name.
const projects = path.join(root, 'target', 'examples')
const compilers = [
  { version: '5.9', tsc: path.join(root, 'node_modules', 'typescript', 'bin', 'tsc') },
  { version: '7', tsc: path.join(root, 'node_modules', 'typescript-7', 'bin', 'tsc') },
]

interface Example {
  /** `README-2`: the document and the block's place in it. */
  name: string
  code: string
}

function examplesOf(file: string): Example[] {
  const text = readFileSync(path.join(root, file), 'utf8')
  const blocks = [...text.matchAll(/^```(?:ts|typescript)\n([\s\S]*?)^```/gm)]
  return blocks.map((block, i) => ({ name: `${path.basename(file, '.md')}-${i + 1}`, code: block[1]! }))
}

const documents = ['README.md', ...readdirSync(path.join(root, 'docs')).map((f) => `docs/${f}`).filter((f) => f.endsWith('.md'))]
const examples = documents.flatMap(examplesOf)
// Test files (docs/testing.md's) run under their own runner, in testing-doc.spec.ts.
const programs = examples.filter((e) => !/from '(vitest|@jest\/globals)'/.test(e.code))

// What a user's own code sees of the package: everything it exports, and the addon's bindings.
const packageTypes = `import * as lease from 'mastra-lease'
import * as native from 'mastra-lease/native'
export type Everything = [typeof lease, typeof native]
`

/** The project `tsc --init` of that version makes, with Node's types, the examples in it. */
function makeProject(compiler: (typeof compilers)[number]): string {
  const dir = path.join(projects, `typescript-${compiler.version}`)
  mkdirSync(dir, { recursive: true })
  execFileSync(process.execPath, [compiler.tsc, '--init'], { cwd: dir, stdio: 'ignore' })
  renameSync(path.join(dir, 'tsconfig.json'), path.join(dir, 'tsconfig.init.json'))
  // `tsc --init` leaves `types` empty; a Node project has Node's (`process.env`).
  const project = (include: string[], compilerOptions: Record<string, unknown>) =>
    JSON.stringify({ extends: './tsconfig.init.json', compilerOptions: { types: ['node'], ...compilerOptions }, include })
  writeFileSync(path.join(dir, 'tsconfig.json'), project(['*.mts'], { rootDir: '.', outDir: 'out', sourceMap: false, declaration: false, declarationMap: false }))
  // The package's own declarations checked too, which `tsc --init`'s skipLibCheck would not.
  writeFileSync(path.join(dir, 'tsconfig.types.json'), project(['package-types.mts'], { noEmit: true, skipLibCheck: false }))
  for (const example of examples) writeFileSync(path.join(dir, `${example.name}.mts`), example.code)
  writeFileSync(path.join(dir, 'package-types.mts'), packageTypes)
  return dir
}

/** Runs tsc; its diagnostics, one per line, or nothing. */
function tsc(compiler: (typeof compilers)[number], dir: string, ...args: string[]): string {
  const run = spawnSync(process.execPath, [compiler.tsc, '--pretty', 'false', ...args], { cwd: dir, encoding: 'utf8' })
  return `${run.stdout}${run.stderr}`.trim()
}

const dirs = new Map<string, string>()
let server: RedisServer

beforeAll(async () => {
  rmSync(projects, { recursive: true, force: true })
  for (const compiler of compilers) dirs.set(compiler.version, makeProject(compiler))
  server = await startRedis()
}, 60_000)

afterAll(async () => {
  await server?.stop()
})

describe('the documentation examples', () => {
  it('are found: the README has three, the docs some', () => {
    expect(examples.filter((e) => e.name.startsWith('README-')).length).toBe(3)
    expect(examples.length).toBeGreaterThan(3)
  })

  for (const compiler of compilers) {
    it(`type-check, each as a whole file, in the project TypeScript ${compiler.version}'s tsc --init makes`, { timeout: 120_000 }, () => {
      const dir = dirs.get(compiler.version)!
    const init = readFileSync(path.join(dir, 'tsconfig.init.json'), 'utf8')
      expect(init).toMatch(/^\s*"strict": true/m)
      expect(init).toMatch(/^\s*"exactOptionalPropertyTypes": true/m)
      expect(tsc(compiler, dir, '--noEmit', '-p', 'tsconfig.json')).toBe('')
    })
  }

  // Under TypeScript 7 alone: 5.9 takes a minute over @mastra/core's declarations.
  it("leave the package's declarations, mastra-lease and mastra-lease/native, clean under TypeScript 7 without skipLibCheck", { timeout: 120_000 }, () => {
    const compiler = compilers.find((c) => c.version === '7')!
    // @mastra/core's own declarations, which ours import, have errors of their own under
    // exactOptionalPropertyTypes: only what is reported in this package's files counts.
    const errors = tsc(compiler, dirs.get(compiler.version)!, '-p', 'tsconfig.types.json')
      .split('\n')
      .filter((line) => /^\S.*: error TS/.test(line) && !line.includes('node_modules/'))
    expect(errors).toEqual([])
  })

  describe('run as TypeScript 7 compiles them', () => {
    beforeAll(() => {
      const seven = compilers.find((c) => c.version === '7')!
      expect(tsc(seven, dirs.get('7')!, '-p', 'tsconfig.json')).toBe('')
    }, 120_000)

    it.for(programs.map((e) => e.name))('%s runs against a Redis server and exits by itself', { timeout: 30_000 }, (name) => {
      const run = spawnSync(process.execPath, [path.join(dirs.get('7')!, 'out', `${name}.mjs`)], {
        cwd: dirs.get('7')!,
        env: { ...process.env, REDIS_URL: server.url, NO_COLOR: '1' },
        encoding: 'utf8',
        timeout: 20_000,
      })
      expect(run.error).toBeUndefined()
      // Nothing thrown or warned by Node (what a block logs on purpose may go to stderr: the
      // diagnostics subscriber's `console.warn`, which lease-diagnostics.spec.ts reads).
      const thrownOrWarned = /^(\w*Error\b|.*Warning: |\s+at )/
      expect(run.stderr.split('\n').filter((line) => thrownOrWarned.test(line))).toEqual([])
      expect(run.status).toBe(0)
    })
  })
})

// The README points to these whole programs (demo.mjs is what `npm run demo` runs; the
// leader election has a spec of its own).
describe('the example programs', () => {
  const files = ['demo.mjs', 'mastra.mjs']
  const places = [
    { on: 'in memory', env: () => ({ REDIS_URL: '' }) },
    { on: 'on Redis', env: () => ({ REDIS_URL: server.url }) },
  ]
  it.for(files.flatMap((file) => places.map((place) => [file, place.on] as const)))('examples/%s runs %s and exits 0', { timeout: 60_000 }, ([program, on]) => {
    const place = places.find((p) => p.on === on)!
    const run = spawnSync(process.execPath, [path.join(root, 'examples', program)], {
      cwd: root,
      env: { ...process.env, ...place.env(), NO_COLOR: '1' },
      encoding: 'utf8',
      timeout: 45_000,
    })
    expect(run.error).toBeUndefined()
    expect(run.stderr).toBe('')
    expect(run.status).toBe(0)
  })
})
