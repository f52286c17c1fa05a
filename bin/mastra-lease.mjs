#!/usr/bin/env node
// The operator's view of the leases in a Redis: list them, read one, release one by naming its
// owner (compare-and-delete: there is no way to take a lease from an owner you do not name).
//
// Every run says on stderr which Redis it read (--url, else $REDIS_URL, else the default) and
// why that one, so that "no leases" is never mistaken for "the wrong server". Exit codes (in
// USAGE). Credentials in the URL are never printed.
import { parseArgs } from 'node:util'

import { RedisLeaseProvider } from 'mastra-lease'

const USAGE = String.raw`usage:
  mastra-lease list              [--url URL | --cluster URL...] [--prefix PREFIX] [--json]
  mastra-lease get KEY           [--url URL | --cluster URL...] [--prefix PREFIX] [--json]
  mastra-lease release KEY --owner OWNER [--url URL | --cluster URL...] [--prefix PREFIX]

  --url       the Redis to read (default: $REDIS_URL, else redis://127.0.0.1:6379);
              --url wins over REDIS_URL
  --cluster   a seed node of a Redis Cluster, instead of --url and REDIS_URL (repeat for more)
  --prefix    the providers' keyPrefix (default mastra:topic)
  --json      one JSON object per lease instead of tab-separated columns (with rawKey and
              rawOwner, the bytes in base64, for a key or an owner that is not UTF-8), the
              characters the columns escape written as \uHHHH there

Keys and owners are shown escaped, so that each lease is one line of four columns: a
backslash as \\, NUL as \0, tab, newline and CR as \t \n \r, other ASCII controls as \xHH,
invisible, spacing and bidi characters (U+202E, ...) as \uHHHH, and the bytes of a key or an
owner that are not UTF-8 as \xHH (80 to ff), which no lease call can name: such a lease
ends at its TTL, or when its key is deleted. Mastra's thread keys hold a NUL between resource and
thread: resource\0thread. A KEY or OWNER given to get and release is read the same way
(quote it for the shell: 'resource\0thread'); any other escape is a usage error.

Every run ends with one line on stderr naming the server it read, where that came from
(--url, REDIS_URL, --cluster or the default) and the prefix; never a user or password.

Exit codes:
  0  done (list: whatever it listed, no lease at all included)
  1  nothing there: get found no live lease on KEY; release found KEY not held by OWNER
  2  usage: an unknown command or option, a bad KEY, OWNER or URL
  3  Redis failed: nothing answered at the address (connection refused, timed out, a host
     that does not resolve), or what answered refused (credentials, an ACL, a command it
     lacks) or is not Redis`

const EXIT = { done: 0, nothing: 1, usage: 2, redis: 3 }

/** Stops with `code`, saying `message` on stderr. */
function fail(code, message) {
  process.stderr.write(`mastra-lease: ${message}\n`)
  process.exit(code)
}

const ESCAPES = { '\0': '\\0', '\t': '\\t', '\n': '\\n', '\r': '\\r', '\\': '\\\\' }
const UNESCAPES = { 0: '\0', t: '\t', n: '\n', r: '\r', '\\': '\\' }
const hex = (n, width) => n.toString(16).padStart(width, '0')

/**
 * A key or an owner as an operator reads it: every character that could split a column,
 * forge a line, recolour the terminal or reorder the text (controls, format characters such
 * as bidi overrides, separators other than the plain space) and the backslash itself, as an
 * escape that `typed` reads back.
 */
const shown = (text) =>
  text.replace(/[\\\p{C}\p{Z}]/gu, (c) => {
    if (c === ' ') return c
    if (c in ESCAPES) return ESCAPES[c]
    const code = c.codePointAt(0)
    if (code < 0x80) return `\\x${hex(code, 2)}`
    return code > 0xffff ? `\\u{${hex(code, 1)}}` : `\\u${hex(code, 4)}`
  })

const utf8 = new TextDecoder('utf-8', { fatal: true })
/** A key or an owner that is not UTF-8 (`rawKey`, `rawOwner`), shown as `shown` shows text, each stray byte as \xHH. */
function shownBytes(bytes) {
  let out = ''
  for (let i = 0; i < bytes.length; ) {
    const lead = bytes[i]
    const length = lead < 0x80 ? 1 : lead >= 0xc2 && lead <= 0xdf ? 2 : lead >= 0xe0 && lead <= 0xef ? 3 : lead >= 0xf0 && lead <= 0xf4 ? 4 : 0
    let char
    try {
      char = length > 0 && i + length <= bytes.length ? utf8.decode(bytes.subarray(i, i + length)) : undefined
    } catch {}
    if (char === undefined) {
      out += `\\x${hex(lead, 2)}`
      i += 1
    } else {
      out += shown(char)
      i += length
    }
  }
  return out
}

/** A KEY or OWNER as an operator types it: `shown`'s escapes read back; any other is refused. */
const typed = (text, what) =>
  text.replace(/\\(?:u\{([0-9a-fA-F]{1,6})\}|u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2})|(.?))/gsu, (_all, braced, four, two, single) => {
    if (braced !== undefined || four !== undefined) {
      const code = parseInt(braced ?? four, 16)
      if (code > 0x10ffff) fail(EXIT.usage, `${what}: \\u{${braced}} is past the last Unicode character`)
      return String.fromCodePoint(code)
    }
    if (two !== undefined) {
      if (parseInt(two, 16) >= 0x80) {
        fail(EXIT.usage, `${what}: \\x${two} is a byte that is not UTF-8 text, and no lease call can name it (such a lease ends at its TTL, or when its key is deleted)`)
      }
      return String.fromCharCode(parseInt(two, 16))
    }
    if (single in UNESCAPES) return UNESCAPES[single]
    fail(EXIT.usage, `${what}: unknown escape \\${single} (the escapes are \\\\ \\0 \\t \\n \\r \\xHH \\uHHHH \\u{H...})`)
  })
/** An error's text without credentials that a URL in it might carry. */
const redacted = (text) => String(text).replace(/(\w+:\/\/)[^/@\s]*@/g, '$1***@')

/**
 * A URL as the operator is told it: without its user and password, and without its query but
 * the database (a unix socket's `?pass=` and `?user=`).
 */
function shownUrl(text) {
  let url
  try {
    url = new URL(text)
  } catch {
    return 'a URL that does not parse'
  }
  const db = url.searchParams.get('db')
  url.username = ''
  url.password = ''
  url.search = db === null ? '' : `?db=${encodeURIComponent(db)}`
  url.hash = ''
  return url.href
}

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
const k = key === undefined ? undefined : typed(key, 'KEY')
const owner = values.owner === undefined ? undefined : typed(values.owner, 'OWNER')

// Which Redis, and why that one: an empty REDIS_URL counts as unset.
const env = process.env.REDIS_URL || undefined
const over = env === undefined ? '' : ', over REDIS_URL'
const [where, server] = values.cluster
  ? [{ cluster: { nodes: values.cluster } }, `the cluster of ${values.cluster.map(shownUrl).join(', ')}, from --cluster${over}`]
  : values.url !== undefined
    ? [{ url: values.url }, `${shownUrl(values.url)}, from --url${over}`]
    : env !== undefined
      ? [{ url: env }, `${shownUrl(env)}, from REDIS_URL`]
      : [{ url: 'redis://127.0.0.1:6379' }, 'redis://127.0.0.1:6379, the default: no --url, REDIS_URL unset']
const read = `server ${server}; prefix ${shown(values.prefix ?? 'mastra:topic')}`

/** Tells the operator `message` on stderr, with the server it is about: one line. */
const say = (message) => process.stderr.write(`mastra-lease: ${message === '' ? read : `${message} (${read})`}\n`)

let leases
try {
  // The warning meant for Mastra's users (lease calls are failing, and Mastra counts a failed
  // acquire as acquired) means nothing here, where the failure is this run's own error; the
  // provider's other warnings (the eviction policy) are the operator's to read.
  const logger = { warn: (message, fields) => fields?.failedCalls === undefined && process.stderr.write(`${redacted(message)}\n`) }
  // Whatever list shows, get and release can name: a key longer than the fleet's maxKeyBytes too.
  const limits = { maxKeyBytes: 1 << 26, maxOwnerBytes: 1 << 26 }
  leases = new RedisLeaseProvider({ ...where, ...(values.prefix === undefined ? {} : { keyPrefix: values.prefix }), connectionName: 'mastra-lease-cli', logger, ...limits })
} catch (error) {
  say(redacted(error.message))
  process.exit(EXIT.usage)
}

/**
 * `value` as one line of JSON in which every character `shown` escapes (bidi overrides, C1
 * controls, line and paragraph separators, ...) is written as \uHHHH: JSON reads them back the
 * same, and a terminal shows them as text.
 */
const jsonLine = (value) =>
  JSON.stringify(value).replace(/[\p{C}\p{Z}]/gu, (c) =>
    c === ' ' ? c : Array.from({ length: c.length }, (_, i) => `\\u${hex(c.charCodeAt(i), 4)}`).join(''),
  )

/**
 * One lease as a line; `raw`: its key's bytes, for a key that is not UTF-8 (`rawKey`), as the
 * lease has its owner's (`rawOwner`). A lease without an expiry (another client's raw SET) has
 * ttlMs null: "never" in a table.
 */
const line = (k, lease, raw) =>
  values.json
    ? jsonLine({
        key: k,
        ...(raw ? { rawKey: raw.toString('base64') } : {}),
        owner: lease.owner,
        ...(lease.rawOwner ? { rawOwner: lease.rawOwner.toString('base64') } : {}),
        ttlMs: lease.ttlMs,
        token: lease.token ?? null,
      })
    : [raw ? shownBytes(raw) : shown(k), lease.rawOwner ? shownBytes(lease.rawOwner) : shown(lease.owner), lease.ttlMs ?? 'never', lease.token ?? ''].join('\t')

let code = EXIT.done
try {
  if (command === 'list') {
    let cursor
    let listed = 0
    do {
      const page = await leases.listLeases(cursor === undefined ? {} : { cursor })
      if (page.leases.length > 0) process.stdout.write(`${page.leases.map((l) => line(l.key, l, l.rawKey)).join('\n')}\n`)
      listed += page.leases.length
      cursor = page.cursor
    } while (cursor !== undefined)
    say(`${listed} lease${listed === 1 ? '' : 's'}`)
  } else if (command === 'get') {
    const lease = await leases.getLease(k)
    if (lease === undefined) {
      say(`no live lease on ${shown(k)}`)
      code = EXIT.nothing
    } else {
      process.stdout.write(`${line(k, lease)}\n`)
      say('')
    }
  } else {
    const before = await leases.getLeaseRecord(k)
    if (before?.owner !== owner) {
      const held = before === undefined ? 'no live lease' : `held by ${shown(before.owner)}`
      say(`${shown(k)} is not held by ${shown(owner)} (${held}); nothing released`)
      code = EXIT.nothing
    } else {
      // Compare-and-delete: only if `owner` still holds it, with the metadata it held it with
      // a moment ago (a hold for another run since is left alone).
      await leases.releaseLease(k, owner, before.metadata)
      const after = await leases.getLease(k)
      process.stdout.write(`released ${shown(k)} (held by ${shown(owner)}${after ? `; now held by ${shown(after.owner)}` : ''})\n`)
      say('')
    }
  }
} catch (error) {
  const bad = typeof error?.code === 'string' && /^ERR_LEASE_INVALID_/.test(error.code)
  say(`${error?.code ?? 'error'}: ${redacted(error?.message ?? error).replace(/\s*\n\s*/g, ' ')}`)
  code = bad ? EXIT.usage : EXIT.redis
} finally {
  await leases.close()
}
process.exit(code)
