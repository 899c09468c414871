// Audit lines: one per decision that matters - session created and ended with tenant and
// subject digest, each tools/call with tenant, subject digest, server, tool, outcome and duration,
// refusals with their reason - and never a key, a token or a full subject in any log line.
import t from 'tap'
import { createLogger } from '../../src/telemetry/logger.js'
import { principalOf } from '../../src/auth/principal.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { bearer, callTool, initMessage, newKey, openSession, post, PUBLIC_URL } from '../helpers/auth.js'
import { startIssuer } from '../helpers/jwks.js'
import { eventually } from '../helpers/wait.js'

t.test('audit lines for sessions and tool calls, without secrets', async t => {
  const key = newKey('ci-bot')
  const issuer = await startIssuer(t, 'https://login.acme.test/', { sub: 'alice@acme.example', aud: `${PUBLIC_URL}/mcp/full` })
  const lines: string[] = []
  const log = createLogger('info', 'audit', { write: (line: string) => { lines.push(line) } })
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [key.entry], jwt: [{ issuer: issuer.issuer, jwksUri: issuer.jwksUri }], servers: { full: {} } } },
    servers: { full: stdioFixture('full-server') }
  }, { log })
  const entries = (): Array<Record<string, unknown>> => lines.map(l => JSON.parse(l) as Record<string, unknown>).filter(l => typeof l.audit === 'string')
  const subject = principalOf('acme', 'key:ci-bot', 'api-key').subjectDigest

  const cred = bearer(key.key)
  const session = await openSession(gw.url, 'full', cred)
  await callTool(gw.url, 'full', cred, session, 'echo', { text: 'hi' }, 2)
  await callTool(gw.url, 'full', cred, session, 'fail', {}, 3)
  await callTool(gw.url, 'full', cred, session, 'throw', {}, 4)
  await post(gw.url, '/mcp/full', initMessage(), bearer('mcpgw_not-a-key'))
  const del = await fetch(`${gw.url}/mcp/full`, { method: 'DELETE', headers: { ...cred, 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version } })
  t.equal(del.status, 200)
  const token = await issuer.mint()
  const jwtSession = await openSession(gw.url, 'full', bearer(token))
  await callTool(gw.url, 'full', bearer(token), jwtSession, 'echo', { text: 'jwt' }, 2)

  await eventually('the session ended line', () => entries().some(e => e.audit === 'session.ended') ? true : undefined)
  const audits = entries()
  t.match(audits.filter(e => e.audit === 'session.created'), [
    { tenant: 'acme', subject, server: 'full', transport: 'streamable', session: /^[A-Za-z0-9_-]{10}$/ },
    { tenant: 'acme', subject: /^[0-9a-f]{32}$/, server: 'full' }
  ])
  t.not(audits.filter(e => e.audit === 'session.created')[1]?.subject, subject, 'the JWT subject is another principal')
  t.match(audits.filter(e => e.audit === 'tools.call'), [
    { tenant: 'acme', subject, server: 'full', tool: 'echo', outcome: 'ok', ms: Number },
    { tool: 'fail', outcome: 'tool-error' },
    { tool: 'throw', outcome: 'error' },
    { tool: 'echo', outcome: 'ok' }
  ])
  t.match(audits.filter(e => e.audit === 'session.ended'), [{ tenant: 'acme', subject, server: 'full', reason: 'client DELETE' }])
  t.match(audits.filter(e => e.audit === 'request.refused'), [{ server: 'full', status: 401, reason: 'unknown API key' }])

  // Request lines come from Fastify's per-request child logger (telemetry/logger.ts requestChildLogger).
  const created = lines.map(l => JSON.parse(l) as Record<string, unknown>).filter(l => l.msg === 'session created')
  t.match(created, [{ replica: 'audit', reqId: /^req-/, server: 'full' }, { replica: 'audit', reqId: /^req-/ }], 'request lines carry the replica and the request id')
  t.not(created[0]?.reqId, created[1]?.reqId, 'each request its own id')
  for (const key of ['reqId', 'sid', 'backend', 'replica']) {
    t.same(lines.filter(l => (l.match(new RegExp(`"${key}":`, 'g')) ?? []).length > 1), [], `"${key}" at most once in a line, however many child loggers made it`)
  }
  t.ok(lines.some(l => /"sid":"[A-Za-z0-9_-]{10}".*"backend":"full".*"msg":"backend started"/.test(l)), 'a backend\'s line names its session and backend')

  const all = lines.join('\n')
  t.notMatch(all, key.key, 'no API key')
  t.notMatch(all, 'mcpgw_not-a-key', 'no presented key')
  t.notMatch(all, token, 'no token')
  t.notMatch(all, token.split('.')[2] ?? '', 'not even its signature')
  t.notMatch(all, 'alice', 'no JWT subject')
  t.notMatch(all, 'ci-bot', 'no key id')
  t.notMatch(all, session.sid, 'no session id either')
})

t.test('a session that ends by idle timeout is audited too, once', async t => {
  const key = newKey('idle-bot')
  const lines: string[] = []
  const log = createLogger('info', 'audit', { write: (line: string) => { lines.push(line) } })
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    sessions: { idleTimeoutMs: 1000 },
    tenants: { acme: { apiKeys: [key.entry], servers: { full: {} } } },
    servers: { full: stdioFixture('full-server') }
  }, { log })
  const session = await openSession(gw.url, 'full', bearer(key.key))
  const ended = (): Array<Record<string, unknown>> => lines.map(l => JSON.parse(l) as Record<string, unknown>).filter(l => l.audit === 'session.ended')
  await eventually('the idle session to end', () => ended().length > 0 ? true : undefined)
  t.match(ended(), [{ tenant: 'acme', subject: principalOf('acme', 'key:idle-bot', 'api-key').subjectDigest, server: 'full', reason: 'idle timeout' }])
  const res = await fetch(`${gw.url}/mcp/full`, { method: 'DELETE', headers: { ...bearer(key.key), 'mcp-session-id': session.sid } })
  t.equal(res.status, 404, 'the session is gone')
  t.equal(ended().length, 1, 'one line')
})
