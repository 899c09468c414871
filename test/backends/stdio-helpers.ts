// Shared by backend-stdio.test.ts and supervisor.test.ts: configs for the hostile fixtures, a
// logger that collects its lines, and an inbox that waits for messages.
import { fileURLToPath } from 'node:url'
import { createLogger, type Logger } from '../../src/telemetry/logger.js'
import type { StdioServerConfig } from '../../src/config/schema.js'
import type { JsonRpcMessage, RequestId } from '../../src/core/jsonrpc.js'

/** The compiled fixture's path (tests run from dist/test, next to dist/test/fixtures). */
export function fixture (name: string): string {
  return fileURLToPath(new URL(`../fixtures/${name}.js`, import.meta.url))
}

export function stdioConfig (name: string, args: string[] = [], overrides: Partial<StdioServerConfig> = {}): StdioServerConfig {
  return {
    transport: 'stdio',
    command: process.execPath,
    args: [fixture(name), ...args],
    env: {},
    inheritEnv: [],
    maxSessions: 100,
    requestTimeoutMs: 10_000,
    maxLineBytes: 10_485_760,
    stopGraceMs: 500,
    restart: { maxRestarts: 3, windowMs: 60_000, baseDelayMs: 10, maxDelayMs: 50 },
    ...overrides
  }
}

export interface LogLine {
  level: number
  msg?: string
  [key: string]: unknown
}

/** A real pino logger whose destination keeps every line, parsed. */
export function collectingLogger (): { log: Logger, lines: LogLine[] } {
  const lines: LogLine[] = []
  const log = createLogger('debug', 'test-replica', { write (s: string) { lines.push(JSON.parse(s) as LogLine) } })
  return { log, lines }
}

/** Collects messages and lets a test wait for the one it expects (fails after 20 s, not hangs). */
export class Inbox {
  readonly messages: JsonRpcMessage[] = []
  readonly #waiters: Array<{ match: (m: JsonRpcMessage) => boolean, resolve: (m: JsonRpcMessage) => void }> = []

  readonly push = (m: JsonRpcMessage): void => {
    this.messages.push(m)
    for (const w of [...this.#waiters]) {
      if (w.match(m)) {
        this.#waiters.splice(this.#waiters.indexOf(w), 1)
        w.resolve(m)
      }
    }
  }

  async wait (match: (m: JsonRpcMessage) => boolean, what: string): Promise<JsonRpcMessage> {
    const found = this.messages.find(match)
    if (found !== undefined) return found
    return await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), 20_000)
      this.#waiters.push({ match, resolve: m => { clearTimeout(timer); resolve(m) } })
    })
  }

  async response (id: RequestId): Promise<JsonRpcMessage> {
    return await this.wait(m => !('method' in m) && m.id === id, `the response to ${String(id)}`)
  }
}

export const initializeParams = {
  protocolVersion: '2025-06-18',
  capabilities: { roots: { listChanged: true } },
  clientInfo: { name: 'stdio-test-client', version: '1.2.3' }
}

export function request (id: RequestId, method: string, params?: Record<string, unknown>): JsonRpcMessage {
  return params === undefined ? { jsonrpc: '2.0', id, method } : { jsonrpc: '2.0', id, method, params }
}

export function callTool (id: RequestId, name: string, args: Record<string, unknown> = {}): JsonRpcMessage {
  return request(id, 'tools/call', { name, arguments: args })
}

/** The text of a tools/call result's first content item. */
export function toolText (m: JsonRpcMessage): string {
  const result = (m as { result?: { content?: Array<{ text?: string }> } }).result
  const text = result?.content?.[0]?.text
  if (typeof text !== 'string') throw new Error(`not a text tool result: ${JSON.stringify(m).slice(0, 200)}`)
  return text
}

/** True when no process with this pid exists any more (kill(pid, 0) fails with ESRCH). */
export function isGone (pid: number): boolean {
  try {
    process.kill(pid, 0)
    return false
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ESRCH'
  }
}

/** Waits until `done()` holds (polling every 10 ms; fails after 20 s rather than hanging). */
export async function waitUntil (done: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 20_000
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`)
    await new Promise(resolve => setTimeout(resolve, 10))
  }
}
