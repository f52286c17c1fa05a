import { coded } from './errors.js'

/**
 * A node-redis client (`createClient(…)`) or cluster (`createCluster(…)`), not yet connected:
 * what Mastra's own Redis backend takes as `client`. This package reads its configuration and
 * opens connections of its own in Rust; the object itself is never used, connected or closed.
 */
export type NodeRedisClient = { readonly isOpen: boolean; readonly options?: unknown } | { readonly isOpen: boolean; readonly _options: unknown }

/** The `client` option, beside the options of the class that takes it. */
export interface ClientOption {
  /**
   * A node-redis client or cluster, unconnected, as Mastra's backend takes it: its URL (or
   * host, port, socket path), TLS and its certificates, username, password, database and name,
   * a cluster's root nodes and defaults, are read and used; not with `url`, `redisOptions`,
   * `cluster` or `sentinel`. What cannot be honoured is refused by name, as in `redisOptions`.
   * The client itself is never used, connected or closed.
   */
  client?: NodeRedisClient | undefined
}

type Fields = Record<string, unknown>

/** `client` refused, saying `why`. */
function invalid(why: string): TypeError {
  return coded(new TypeError(`client: ${why}`), 'ERR_LEASE_INVALID_OPTION')
}

const isObject = (value: unknown): value is Fields => typeof value === 'object' && value !== null

/**
 * What node-redis fills in itself, whatever the caller gave: its command modules and its
 * handling of maintenance notices (none of them says where or how to connect).
 */
const FILLED_IN = ['modules', 'maintNotifications', 'maintEndpointType', 'maintRelaxedSocketTimeout', 'maintRelaxedCommandTimeout']

/** A one-server client's options as `redisOptions` (its URL in it) and `tls` (its certificates). */
function fromClient(options: Fields): Fields {
  const { url, socket = {}, username, password, credentialsProvider, ...rest } = options
  if (!isObject(socket)) throw invalid('its socket options are not an object')
  for (const name of FILLED_IN) delete rest[name]
  // node-redis makes a credentials provider of the username and password; one of the caller's
  // own (a token that rotates) cannot be honoured.
  if (credentialsProvider !== undefined && username === undefined && password === undefined) {
    throw invalid('a credentialsProvider is not supported: give username and password (or put them in the URL)')
  }
  const extra = Object.keys(rest).filter((name) => rest[name] !== undefined && name !== 'name' && name !== 'database')
  if (extra.length > 0) {
    throw invalid(`its ${extra.join(', ')} cannot be honoured: this client reads url, socket, username, password, database and name`)
  }
  const { host, port, path, tls, ca, cert, key, ...socketRest } = socket
  let where = url
  if (where === undefined) {
    if (path !== undefined) where = `redis+unix://${String(path)}`
    else where = `${tls === true ? 'rediss' : 'redis'}://${host === undefined ? '127.0.0.1' : bracketed(String(host))}:${port === undefined ? 6379 : String(port)}`
  }
  const redisOptions: Fields = { url: where, ...rest }
  if (username !== undefined) redisOptions.username = username
  if (password !== undefined) redisOptions.password = password
  // With a URL, node-redis also fills in the host and port it parsed from it.
  const socketOut: Fields = { ...socketRest }
  if (tls !== undefined && !(url === undefined && tls === true)) socketOut.tls = tls
  if (Object.keys(socketOut).length > 0) redisOptions.socket = socketOut
  const material = Object.fromEntries(Object.entries({ ca, cert, key }).filter(([, v]) => v !== undefined))
  return Object.keys(material).length > 0 ? { redisOptions, tls: material } : { redisOptions }
}

/** An IPv6 host in a URL goes in brackets. */
const bracketed = (host: string) => (host.includes(':') && !host.startsWith('[') ? `[${host}]` : host)

/** A cluster's options as `cluster` in node-redis' shape, each root node by its URL. */
function fromCluster(options: Fields): Fields {
  const { rootNodes, defaults, useReplicas, ...rest } = options
  for (const name of FILLED_IN) delete rest[name]
  const extra = Object.keys(rest).filter((name) => rest[name] !== undefined)
  if (extra.length > 0) throw invalid(`the cluster's ${extra.join(', ')} cannot be honoured: this client reads rootNodes, defaults and useReplicas`)
  if (!Array.isArray(rootNodes)) throw invalid("the cluster's rootNodes are not an array")
  const nodes = rootNodes.map((node: unknown, i) => {
    if (!isObject(node)) throw invalid(`the cluster's rootNodes[${i}] is not an object`)
    if (node.url !== undefined) return node
    const socket = isObject(node.socket) ? node.socket : {}
    const { host, port, tls, ...others } = socket
    const left = Object.keys(others).filter((name) => others[name] !== undefined)
    if (left.length > 0) throw invalid(`the cluster's rootNodes[${i}].socket.${left[0]} cannot be honoured: give TLS material in the tls option`)
    return { url: `${tls === true ? 'rediss' : 'redis'}://${bracketed(String(host ?? '127.0.0.1'))}:${String(port ?? 6379)}` }
  })
  const cluster: Fields = { rootNodes: nodes }
  if (defaults !== undefined) cluster.defaults = defaults
  if (useReplicas !== undefined) cluster.useReplicas = useReplicas
  return { cluster }
}

/**
 * `options` with `client` replaced by the connection options it stands for, checked before any
 * I/O; `options` itself when it has no `client`. A connected client, or `client` beside
 * `url`, `redisOptions`, `cluster` or `sentinel`, is refused. What reading them throws (a
 * getter, a Proxy's trap) is refused too, with it as the `cause`, as the binding does.
 */
export function readClient<T extends object>(options: (T & ClientOption) | null | undefined): T | null | undefined {
  try {
    return withoutClient(options)
  } catch (error) {
    if (isObject(error) && error.code === 'ERR_LEASE_INVALID_OPTION') throw error
    throw coded(new TypeError('options: reading them threw', { cause: error }), 'ERR_LEASE_INVALID_OPTION')
  }
}

function withoutClient<T extends object>(options: (T & ClientOption) | null | undefined): T | null | undefined {
  if (!isObject(options) || !('client' in options)) return options
  const { client: given, ...rest } = options
  const client: unknown = given
  if (client === undefined) return rest as T
  if (!isObject(client) || typeof client.isOpen !== 'boolean') {
    throw invalid('it must be a node-redis client or cluster (createClient or createCluster from the redis package)')
  }
  const beside = ['url', 'redisOptions', 'cluster', 'sentinel'].filter((name) => (rest as Fields)[name] !== undefined)
  if (beside.length > 0) throw invalid(`it and ${beside.join(', ')} both say where Redis is: give one`)
  if (client.isOpen) {
    throw invalid('it must not be connected: its configuration is read and this class opens connections of its own (the client is never used or closed)')
  }
  let read: Fields
  if ('_options' in client && isObject(client._options) && 'rootNodes' in client._options) read = fromCluster({ ...client._options })
  else if (isObject(client.options)) read = fromClient({ ...client.options })
  else throw invalid('it has no options to read (a node-redis client has them from createClient)')
  if (read.tls !== undefined && (rest as Fields).tls !== undefined) throw invalid('its TLS certificates and the tls option both give them: give one')
  return { ...rest, ...read } as T
}
