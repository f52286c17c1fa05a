// Mastra (@mastra/core, "engines": ">=22.13.0") requires Node >= 22.13. A Mastra suite
// imports this module before anything from Mastra, so running it on an older Node fails
// here, with this message, instead of passing or failing for the wrong reason later.
// `npm test` / npm scripts use the `node` devDependency (Node 22); by hand, put
// node_modules/.bin first on PATH.

export const MASTRA_MIN_NODE = '22.13.0'

/** `version` >= `min`, both `major.minor.patch`. */
export function nodeAtLeast(version: string, min: string): boolean {
  const a = version.split('.').map(Number)
  const b = min.split('.').map(Number)
  for (let i = 0; i < 3; i++) {
    const x = a[i] ?? 0
    const y = b[i] ?? 0
    if (x !== y) return x > y
  }
  return true
}

if (!nodeAtLeast(process.versions.node, MASTRA_MIN_NODE)) {
  throw new Error(
    `The Mastra integration tests need Node >= ${MASTRA_MIN_NODE}, as @mastra/core requires, ` +
      `but run on Node ${process.versions.node} (${process.execPath}). ` +
      `Run them through npm (npm test) or with node_modules/.bin first on PATH, so the node devDependency is used.`,
  )
}

/** The Node binary for child processes: the one running the tests, checked above. */
export const NODE = process.execPath
