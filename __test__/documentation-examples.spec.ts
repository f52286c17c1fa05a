// The examples in README.md and docs/*.md, as a user pastes them: every TypeScript and
// JavaScript block type-checks in a project `tsc --init` made (its strict defaults, with
// `exactOptionalPropertyTypes`, plus Node's types), each after the placeholders of
// fixtures/example-prelude.mts; the README's own then run against a test server.
import { execFileSync, spawnSync } from 'node:child_process'
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import ts from 'typescript'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startRedis, type RedisServer } from './helpers/redis-server'

const root = path.resolve(__dirname, '..')
// Inside the package, so `import … from 'mastra-lease'` finds this build by the package's name.
const project = path.join(root, 'target', 'examples')
const tsc = path.join(root, 'node_modules', 'typescript', 'bin', 'tsc')
const prelude = readFileSync(path.join(__dirname, 'fixtures', 'example-prelude.mts'), 'utf8')

interface Example {
  /** `README-2`: the document and the block's place in it. */
  name: string
  code: string
}

function examplesOf(file: string): Example[] {
  const text = readFileSync(path.join(root, file), 'utf8')
  const blocks = [...text.matchAll(/^```(?:ts|typescript|js|javascript|mjs)\n([\s\S]*?)^```/gm)]
  return blocks.map((block, i) => ({ name: `${path.basename(file, '.md')}-${i + 1}`, code: block[1]! }))
}

const documents = ['README.md', ...readdirSync(path.join(root, 'docs')).map((f) => `docs/${f}`).filter((f) => f.endsWith('.md'))]
const examples = documents.flatMap(examplesOf)
const readmeExamples = examples.filter((e) => e.name.startsWith('README-'))

let server: RedisServer

beforeAll(async () => {
  rmSync(project, { recursive: true, force: true })
  mkdirSync(project, { recursive: true })
  execFileSync(process.execPath, [tsc, '--init'], { cwd: project, stdio: 'ignore' })
  renameSync(path.join(project, 'tsconfig.json'), path.join(project, 'tsconfig.init.json'))
  // `tsc --init` leaves `types` empty; a Node project has Node's (`process.env`).
  writeFileSync(
    path.join(project, 'tsconfig.json'),
    JSON.stringify({ extends: './tsconfig.init.json', compilerOptions: { types: ['node'], noEmit: true }, include: ['*.mts'] }),
  )
  for (const example of examples) writeFileSync(path.join(project, `${example.name}.mts`), `${prelude}\n${example.code}`)
  server = await startRedis()
}, 60_000)

afterAll(async () => {
  await server?.stop()
})

describe('the documentation examples', () => {
  it('are found: the README has three, the docs some', () => {
    expect(readmeExamples.length).toBe(3)
    expect(examples.length).toBeGreaterThan(readmeExamples.length)
  })

  it("every example type-checks in a project made by tsc --init, exactOptionalPropertyTypes included", () => {
    const config = ts.getParsedCommandLineOfConfigFile(path.join(project, 'tsconfig.json'), {}, {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (d) => {
        throw new Error(ts.flattenDiagnosticMessageText(d.messageText, '\n'))
      },
    })!
    expect(config.options.strict).toBe(true)
    expect(config.options.exactOptionalPropertyTypes).toBe(true)
    expect(config.fileNames.length).toBe(examples.length)
    const program = ts.createProgram(config.fileNames, config.options)
    const errors = ts.getPreEmitDiagnostics(program).map((d) => {
      const where = d.file ? `${path.basename(d.file.fileName)}:${d.file.getLineAndCharacterOfPosition(d.start ?? 0).line + 1}` : ''
      return `${where} ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`
    })
    expect(errors).toEqual([])
  }, 60_000)

  it.each(readmeExamples.map((e) => [e.name, e] as const))("the README's %s runs against a Redis server and exits by itself", (_name, example) => {
    // Node 22 runs `await using` once it is compiled down, as TypeScript does for ES2022.
    const js = ts.transpileModule(`${prelude}\n${example.code}`, {
      compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext },
    }).outputText
    const file = path.join(project, `${example.name}.mjs`)
    writeFileSync(file, js)
    const run = spawnSync(process.execPath, [file], {
      cwd: project,
      env: { ...process.env, REDIS_URL: server.url, NO_COLOR: '1' },
      encoding: 'utf8',
      timeout: 20_000,
    })
    expect(run.error).toBeUndefined()
    // Mastra's own notice that it keeps its storage in memory when none is configured.
    const mastraNotice = /^No `storage` configured on Mastra/
    expect(run.stderr.split('\n').filter((line) => line !== '' && !mastraNotice.test(line))).toEqual([])
    expect(run.status).toBe(0)
  }, 30_000)
})
