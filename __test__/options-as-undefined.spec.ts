// Every optional option takes `undefined` as "not given", at run time as in its type
// (`name?: T | undefined`, for `exactOptionalPropertyTypes`): `{ url: process.env.REDIS_URL }`
// with the variable unset is the default URL. The option names come from the binding's own
// types, so an option added later is covered too. An unknown name is refused all the same.
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { MemoryLeaseProvider, RedisLeaseProvider, RedisStreamsPubSub } from '../dist/cjs/index.js'

const bindingTypes = readFileSync(path.resolve(__dirname, '..', 'src', 'shell', 'native.d.ts'), 'utf8')

/** The optional properties of `export interface <name>`, each with its declared type. */
function optionalOf(name: string): Array<[string, string]> {
  const body = new RegExp(`^export interface ${name} \\{\\n([\\s\\S]*?)^\\}`, 'm').exec(bindingTypes)?.[1]
  if (body === undefined) throw new Error(`no interface ${name} in native.d.ts`)
  return [...body.matchAll(/^ {2}(\w+)\?: (.+)$/gm)].map((m) => [m[1]!, m[2]!])
}

/** Each optional option of `name`, set to `undefined` inside `around` (the rest of a valid configuration). */
const cases = (name: string, around: (option: Record<string, undefined>) => unknown = (o) => o) =>
  optionalOf(name).map(([option, type]) => [`${name}.${option}`, type, around({ [option]: undefined })] as const)

const close = (p: { close(): unknown }) => void p.close()

describe('an option given as undefined', () => {
  it('is typed so: every optional property of the binding types takes undefined', () => {
    const all = [...bindingTypes.matchAll(/^ {2}(\w+)\?: (.+)$/gm)]
    expect(all.length).toBeGreaterThan(50)
    expect(all.filter((m) => !m[2]!.endsWith(' | undefined')).map((m) => m[1])).toEqual([])
  })

  const leaseCases = [
    ...cases('RedisLeaseProviderOptions'),
    ...cases('RedisClientOptions', (o) => ({ redisOptions: o })),
    ...cases('RedisSocketOptions', (o) => ({ redisOptions: { socket: o } })),
    ...cases('TlsOptions', (o) => ({ url: 'rediss://127.0.0.1:1', tls: o })),
    ...cases('ClusterOptions', (o) => ({ cluster: { nodes: ['redis://127.0.0.1:1'], ...o } })),
    ...cases('NodeRedisClusterOptions', (o) => ({ cluster: { rootNodes: [{ url: 'redis://127.0.0.1:1' }], ...o } })),
    ...cases('NodeRedisClusterDefaults', (o) => ({ cluster: { rootNodes: [{ url: 'redis://127.0.0.1:1' }], defaults: o } })),
    ...cases('SentinelOptions', (o) => ({ sentinel: { nodes: ['redis://127.0.0.1:1'], masterName: 'm', ...o } })),
  ]
  it.each(leaseCases)('%s (%s) is the default for RedisLeaseProvider', (_name, _type, options) => {
    close(new RedisLeaseProvider(options as ConstructorParameters<typeof RedisLeaseProvider>[0]))
  })

  it.each(cases('RedisStreamsOptions'))('%s (%s) is the default for RedisStreamsPubSub', (_name, _type, options) => {
    close(new RedisStreamsPubSub(options as ConstructorParameters<typeof RedisStreamsPubSub>[0]))
  })

  it.each(cases('MemoryLeaseProviderOptions'))('%s (%s) is the default for MemoryLeaseProvider', (_name, _type, options) => {
    close(new MemoryLeaseProvider(options as ConstructorParameters<typeof MemoryLeaseProvider>[0]))
  })

  it('still names an unknown option as an error, undefined or not', () => {
    expect(() => new RedisLeaseProvider({ urll: undefined } as never)).toThrow(expect.objectContaining({ code: 'ERR_LEASE_INVALID_OPTION' }))
    expect(() => new RedisStreamsPubSub({ redisOptions: { sockett: undefined } } as never)).toThrow(
      expect.objectContaining({ code: 'ERR_LEASE_INVALID_OPTION' }),
    )
  })
})
