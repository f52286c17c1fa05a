#!/usr/bin/env node
// The operator's view of the leases in a Redis: list them, read one, release one by naming its
// owner (compare-and-delete: there is no way to take a lease from an owner you do not name).
//
// Exit codes: 0 done; 1 nothing to do (no live lease on the key; not held by that owner);
// 2 a usage error; 3 Redis failed (unreachable, timed out, refused). Credentials in the URL
// are never printed.
import { parseArgs } from 'node:util'

import { RedisLeaseProvider } from 'mastra-lease'

const USAGE = `usage:
  mastra-lease list              [--url URL | --cluster URL...] [--prefix PREFIX] [--json]
  mastra-lease get KEY           [--url URL | --cluster URL...] [--prefix PREFIX] [--json]
  mastra-lease release KEY --owner OWNER [--url URL | --cluster URL...] [--prefix PREFIX]

  --url       the Redis to read (default: $REDIS_URL, else redis://127.0.0.1:6379)
  --cluster   a seed node of a Redis Cluster, instead of --url (repeat for more)
  --prefix    the providers' keyPrefix (default mastra:topic)
  --json      one JSON object per lease instead of tab-separated columns

Mastra's thread keys hold a NUL between resource and thread: it is shown as " \u2400 ", and
a KEY given with \u2400 (spaces around it or not) means that NUL.`

const EXIT = { done: 0, nothing: 1, usage: 2, redis: 3 }

/** Stops with `code`, saying `message` on stderr. */
function fail(code, message) {
  process.stderr.write(`mastra-lease: ${message}\n`)
  process.exit(code)
}

/** A key as an operator reads it: a NUL as " ␀ ". */
const shown = (key) => key.replaceAll('\0', ' \u2400 ')
/** A key as an operator types it: "␀", with spaces around it or not, is a NUL. */
const typed = (key) => key.replace(/ ?\u2400 ?/g, '\0')
/** An error's text without credentials that a URL in it might carry. */
const redacted = (text) => String(text).replace(/(\w+:\/\/)[^/@\s]*@/g, '$1***@')

let parsed
try {
  parsed = parseArgs({
    allowPositionals: true,
    options: {
      url: { type: 'string' },
      cluster: { type: 'string', multiple: true },
      prefix: { type: 'string' },
      owner: { type: 'string' },
      json: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
  })
} catch (error) {
  fail(EXIT.usage, `${error.message}\n${USAGE}`)
}
const { values, positionals } = parsed
if (values.help) {
  process.stdout.write(`${USAGE}\n`)
  process.exit(EXIT.done)
}
const [command, key, ...extra] = positionals
const wants = { list: 0, get: 1, release: 1 }
if (!(command in wants)) fail(EXIT.usage, `${command === undefined ? 'no command' : `unknown command ${command}`}\n${USAGE}`)
if ((key === undefined ? 0 : 1) + extra.length !== wants[command]) fail(EXIT.usage, `${command} takes ${wants[command] ? 'a KEY' : 'no KEY'}\n${USAGE}`)
if (command === 'release' && values.owner === undefined) fail(EXIT.usage, 'release needs --owner: only the owner you name can lose the lease')
if (command !== 'release' && values.owner !== undefined) fail(EXIT.usage, `--owner is for release, not ${command}`)
if (values.url !== undefined && values.cluster !== undefined) fail(EXIT.usage, 'give --url or --cluster, not both')

let leases
try {
  const where = values.cluster ? { cluster: { nodes: values.cluster } } : { url: values.url ?? process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' }
  leases = new RedisLeaseProvider({ ...where, ...(values.prefix === undefined ? {} : { keyPrefix: values.prefix }), connectionName: 'mastra-lease-cli' })
} catch (error) {
  fail(EXIT.usage, redacted(error.message))
}

// A lease without an expiry (another client's raw SET) has ttlMs null: "never" in a table.
const line = (k, lease) =>
  values.json
    ? JSON.stringify({ key: k, owner: lease.owner, ttlMs: lease.ttlMs, token: lease.token ?? null })
    : [shown(k), shown(lease.owner), lease.ttlMs ?? 'never', lease.token ?? ''].join('\t')

let code = EXIT.done
try {
  if (command === 'list') {
    let cursor
    do {
      const page = await leases.listLeases(cursor === undefined ? {} : { cursor })
      if (page.leases.length > 0) process.stdout.write(`${page.leases.map((l) => line(l.key, l)).join('\n')}\n`)
      cursor = page.cursor
    } while (cursor !== undefined)
  } else if (command === 'get') {
    const lease = await leases.getLease(typed(key))
    if (lease === undefined) {
      process.stderr.write(`mastra-lease: no live lease on ${shown(typed(key))}\n`)
      code = EXIT.nothing
    } else {
      process.stdout.write(`${line(typed(key), lease)}\n`)
    }
  } else {
    const k = typed(key)
    const owner = typed(values.owner)
    const before = await leases.getLease(k)
    if (before?.owner !== owner) {
      const held = before === undefined ? 'no live lease' : `held by ${shown(before.owner)}`
      process.stderr.write(`mastra-lease: ${shown(k)} is not held by ${shown(owner)} (${held}); nothing released\n`)
      code = EXIT.nothing
    } else {
      await leases.releaseLease(k, owner) // compare-and-delete: only if `owner` still holds it
      const after = await leases.getLease(k)
      process.stdout.write(`released ${shown(k)} (held by ${shown(owner)}${after ? `; now held by ${shown(after.owner)}` : ''})\n`)
    }
  }
} catch (error) {
  const bad = typeof error?.code === 'string' && /^ERR_LEASE_INVALID_/.test(error.code)
  process.stderr.write(`mastra-lease: ${error?.code ?? 'error'}: ${redacted(error?.message ?? error)}\n`)
  code = bad ? EXIT.usage : EXIT.redis
} finally {
  await leases.close()
}
process.exit(code)
