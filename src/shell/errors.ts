/** `error` with the stable `code` this package's errors carry, and any other `fields`. */
export function coded<E extends Error>(error: E, code: string, fields: object = {}): E & { code: string } {
  return Object.assign(error, { code }, fields)
}

/**
 * The `ERR_LEASE_MISSING_DEPENDENCY` that `feature` throws when `dependency`, an optional peer
 * dependency it needs, cannot be loaded (`cause`: why): what to install, and how.
 */
export function missingDependency(feature: string, dependency: string, cause: unknown, otherwise: string): Error & { code: string } {
  const message = `${feature} needs ${dependency}, an optional peer dependency of mastra-lease, and cannot load it: install it (npm install ${dependency}), or ${otherwise}`
  return coded(new Error(message, { cause }), 'ERR_LEASE_MISSING_DEPENDENCY')
}

/** The methods of `names` that `value` lacks; a getter or a Proxy trap that throws counts as lacking. */
export function missing(value: unknown, names: readonly string[]): string[] {
  return names.filter((name) => {
    try {
      return typeof value !== 'object' || value === null || typeof (value as Record<string, unknown>)[name] !== 'function'
    } catch {
      return true
    }
  })
}

/** `value` as an argument error describes it, given the methods it lacks. */
export function described(value: unknown, lacking: string[]): string {
  if (value === null) return 'null'
  return typeof value === 'object' ? `an object without ${lacking.join(', ')}` : typeof value
}

const LEASE_METHODS = ['acquireLease', 'getLeaseOwner', 'releaseLease', 'renewLease', 'transferLease'] as const

/**
 * Why `value` is not a lease provider, as the `ERR_LEASE_INVALID_ARGUMENT` to throw (`what`
 * names the argument), or undefined when it is one. Structural, as Mastra's isLeaseProvider:
 * a provider resolving another copy of @mastra/core will do.
 */
export function notLeaseProvider(value: unknown, what: string): TypeError | undefined {
  const lacking = missing(value, LEASE_METHODS)
  if (lacking.length === 0) return undefined
  const message = `${what} must be a lease provider (with acquireLease, getLeaseOwner, releaseLease, renewLease and transferLease methods), got ${described(value, lacking)}`
  return coded(new TypeError(message), 'ERR_LEASE_INVALID_ARGUMENT')
}
