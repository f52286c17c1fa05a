/** `error` with the stable `code` this package's errors carry, and any other `fields`. */
export function coded<E extends Error>(error: E, code: string, fields: object = {}): E & { code: string } {
  return Object.assign(error, { code }, fields)
}
