// A child process of the suites that talks through JSON lines on stdout only, no IPC channel,
// so nothing but its own handles decides when it exits: its lines as they come, its exit, a
// kill.
import { spawn } from 'node:child_process'

import { NODE } from './mastra-node.js'

export type Line = Record<string, unknown> & { type: string }

/** Runs `script` with `config` as its JSON argument; `onLine` sees each line as it comes. */
export function jsonLinesChild(script: string, config: unknown, onLine: (line: Line) => void = () => {}) {
  const child = spawn(NODE, [script, JSON.stringify(config)], { stdio: ['ignore', 'pipe', 'pipe'] })
  const lines: Line[] = []
  let buffer = ''
  let stderr = ''
  child.stdout.on('data', (chunk: Buffer) => {
    buffer += chunk.toString()
    let i
    while ((i = buffer.indexOf('\n')) >= 0) {
      const line = JSON.parse(buffer.slice(0, i)) as Line
      buffer = buffer.slice(i + 1)
      lines.push(line)
      onLine(line)
    }
  })
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()))
  // 'close', not 'exit': at 'exit' the child's stdout may still hold its last lines.
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('close', (code, signal) => resolve({ code, signal })),
  )
  return {
    child,
    lines,
    /** Resolves with how it ended, once it has. */
    exited,
    stderr: () => stderr,
    kill: () => child.kill('SIGKILL'),
  }
}
