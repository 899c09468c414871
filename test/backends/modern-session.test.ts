// The bridge that serves a 2025-era session against a modern (2026-07-28) backend
// (src/backends/modern-session.ts), opened through openHttpBackend against the v2 SDK's
// modern-only server (test/fixtures/modern-upstream.ts) on 127.0.0.1: which configs reach it.
import t, { type Test } from 'tap'
import { pino } from 'pino'
import { closeHttpDispatchers, openHttpBackend } from '../../src/backends/http.js'
import { parseConfig } from '../../src/config/load.js'
import type { HttpServerConfig } from '../../src/config/schema.js'
import type { JsonRpcMessage } from '../../src/core/jsonrpc.js'
import { startModernUpstream, type ModernUpstream } from '../fixtures/modern-upstream.js'
import { Inbox, initializeParams, request } from './stdio-helpers.js'

t.teardown(closeHttpDispatchers)

const silent = pino({ level: process.env.TEST_LOG ?? 'silent' })

/** A server entry as the gateway's loader makes it: the schema's defaults applied. */
function serverConfig (raw: Record<string, unknown>): HttpServerConfig {
  return parseConfig({ servers: { up: { transport: 'streamable-http', ...raw } } }).servers.up as HttpServerConfig
}

async function modernOnly (t: Test): Promise<ModernUpstream> {
  const upstream = await startModernUpstream({ modernOnly: true })
  t.teardown(upstream.close)
  return upstream
}

/** Opens a session's backend connection and sends the client's initialize; resolves with its answer. */
async function initialize (t: Test, config: HttpServerConfig): Promise<{ inbox: Inbox, answer: JsonRpcMessage }> {
  const inbox = new Inbox()
  const conn = await openHttpBackend({ server: 'up', sid: 'client-session', log: silent, config, handlers: { onMessage: inbox.push, onExit: () => {}, onBackendSessionId: () => {} } })
  t.teardown(async () => await conn.close())
  await conn.send(request(1, 'initialize', initializeParams))
  return { inbox, answer: await inbox.response(1) }
}

const methodsSent = (upstream: ModernUpstream): unknown[] => upstream.requests.map(r => (r.body as { method?: unknown } | undefined)?.method)

t.test('no protocol setting means what the schema default means (auto): the era is probed, a modern-only server bridged', async t => {
  const upstream = await modernOnly(t)
  const withDefault = serverConfig({ url: upstream.url })
  t.equal(withDefault.protocol, 'auto', "the schema's default")
  const { protocol: _, ...unset } = withDefault
  const { answer } = await initialize(t, unset)
  t.match(answer, { id: 1, result: { serverInfo: { name: 'modern-upstream' } } }, "initialize answered from the backend's server/discover")
  t.notOk(methodsSent(upstream).includes('initialize'), 'no 2025 initialize went to the modern-only server')
})
