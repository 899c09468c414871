// Sessions driven by the official SDK client (v1), the way the issue measures every target:
// over stdio straight to the fixture, or over Streamable HTTP to a proxy, the gateway or an
// upstream, plus the cross-replica fetch that sends everything after initialize to replica B.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { FetchLike } from '@modelcontextprotocol/sdk/shared/transport.js'
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client'

/** What a benchmark call needs of a client: the v1 SDK's and the v2 SDK's both have it. */
export interface ToolCaller {
  callTool (params: { name: string, arguments: Record<string, unknown> }): Promise<unknown>
  close (): Promise<void>
}

export interface BenchSession {
  client: ToolCaller
  close: () => Promise<void>
}

/** How a target's `echo` is called and what it must answer (the two fixtures differ). */
export interface Echo {
  args: (i: number) => Record<string, unknown>
  expect: (i: number) => string
}
export const STDIO_ECHO: Echo = { args: i => ({ text: `ping-${i}` }), expect: i => `ping-${i}` }
export const HTTP_ECHO: Echo = { args: i => ({ message: `ping-${i}` }), expect: i => `echo: ping-${i}` }

/** Every session still open, closed by the cleanup if a run stops half-way. */
export const openSessions = new Set<BenchSession>()

function track (client: ToolCaller, closeTransport: () => Promise<void>): BenchSession {
  const session: BenchSession = {
    client,
    close: async () => {
      if (!openSessions.delete(session)) return
      await closeTransport().catch(() => {})
      await client.close().catch(() => {})
    }
  }
  openSessions.add(session)
  return session
}

/** SDK stdio client straight to the command; `children` holds the child's pid while it lives. */
export async function connectStdio (command: string, args: string[], children: Set<number>): Promise<BenchSession> {
  const client = new Client({ name: 'bench', version: '1.0.0' })
  const transport = new StdioClientTransport({ command, args, stderr: 'ignore' })
  await client.connect(transport)
  const pid = transport.pid
  if (pid !== null) children.add(pid)
  return track(client, async () => { if (pid !== null) children.delete(pid) })
}

export async function connectHttp (url: string, fetchImpl?: FetchLike): Promise<BenchSession> {
  const client = new Client({ name: 'bench', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(url), fetchImpl === undefined ? {} : { fetch: fetchImpl })
  await client.connect(transport)
  // DELETE ends the session at once, so the server stops its child before the next phase.
  return track(client, async () => { await transport.terminateSession() })
}

/** The v2 SDK client pinned to 2026-07-28: no session, every call a stateless request. */
export async function connectModern (url: string): Promise<BenchSession> {
  const client = new ClientV2({ name: 'bench', version: '1.0.0' }, { versionNegotiation: { mode: { pin: '2026-07-28' } } })
  await client.connect(new TransportV2(new URL(url)))
  return track(client, async () => {})
}

const isInitialize = (body: unknown): boolean => {
  if (typeof body !== 'string' || !body.includes('"initialize"')) return false
  try {
    const parsed = JSON.parse(body) as { method?: unknown }
    return parsed.method === 'initialize'
  } catch {
    return false
  }
}

/** Sends the initialize POST to its own URL (replica A) and every other request (POST, GET, DELETE) to `b`. */
export function crossFetch (b: string, counts: { a: number, b: number }): FetchLike {
  const bOrigin = new URL(b)
  return async (url, init) => {
    if (init?.method === 'POST' && isInitialize(init.body)) {
      counts.a++
      return await fetch(url, init)
    }
    counts.b++
    const target = new URL(url)
    target.host = bOrigin.host
    return await fetch(target, init)
  }
}

/** One `echo` call; null when it answered what it should, else what went wrong. */
export async function callEcho (session: BenchSession, echo: Echo, i: number): Promise<string | null> {
  try {
    const result = await session.client.callTool({ name: 'echo', arguments: echo.args(i) }) as { content?: Array<{ type: string, text?: string }>, isError?: boolean }
    const text = result.content?.[0]?.text
    return text === echo.expect(i) && result.isError !== true ? null : `unexpected result ${JSON.stringify(result).slice(0, 200)}`
  } catch (err) {
    return err instanceof Error ? err.message : String(err)
  }
}
