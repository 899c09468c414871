// The auth hook on the wire (A-RS-2, A-RS-3): every MCP route and method needs a
// credential once tenants are configured; refusals carry the RFC 6750 challenge and a JSON-RPC
// body; a tenant sees only its servers. Real gateway, real stdio backend, raw fetch.
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { bearer, initMessage, newKey, openSession, post, PUBLIC_URL } from '../helpers/auth.js'

const acmeKey = newKey('ci-bot')
const betaKey = newKey('ops')

async function gateway (t: Test): Promise<RunningGateway> {
  return await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: {
      acme: { apiKeys: [acmeKey.entry], servers: { full: {} } },
      beta: { apiKeys: [betaKey.entry], servers: { other: {} } }
    },
    servers: { full: stdioFixture('full-server'), other: stdioFixture('full-server') }
  })
}

interface Refusal { status: number, challenge: string | null, body: { jsonrpc: string, id: unknown, error: { code: number, message: string, data: { code: string } } } }

async function refusal (res: Response): Promise<Refusal> {
  return { status: res.status, challenge: res.headers.get('www-authenticate'), body: await res.json() as Refusal['body'] }
}

t.test('no credential: 401 with only resource_metadata, on every MCP route and method', async t => {
  const gw = await gateway(t)
  const cases: Array<[string, string, string]> = [
    ['POST', '/mcp/full', 'mcp/full'],
    ['GET', '/mcp/full', 'mcp/full'],
    ['DELETE', '/mcp/full', 'mcp/full'],
    ['GET', '/sse/full', 'sse/full'],
    ['POST', '/sse/full/messages?sessionId=abcdefghijklmnopqrstuvwx', 'sse/full'],
    ['POST', '/mcp/nosuch', 'mcp/nosuch']
  ]
  for (const [method, path, resource] of cases) {
    const res = await fetch(gw.url + path, {
      method,
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      ...(method === 'POST' ? { body: JSON.stringify(initMessage()) } : {})
    })
    const r = await refusal(res)
    t.equal(r.status, 401, `${method} ${path}`)
    t.equal(r.challenge, `Bearer resource_metadata="${PUBLIC_URL}/.well-known/oauth-protected-resource/${resource}"`, `${method} ${path}: challenge`)
    t.equal(r.body.jsonrpc, '2.0')
    t.equal(r.body.error.data.code, 'GW_ERR_UNAUTHORIZED')
  }
})

t.test('a bad credential: 401 invalid_token; two credentials: 400 invalid_request', async t => {
  const gw = await gateway(t)
  for (const headers of [bearer('mcpgw_nope'), { 'x-api-key': 'mcpgw_nope' }, bearer(`${acmeKey.key}x`)]) {
    const r = await refusal(await post(gw.url, '/mcp/full', initMessage(), headers))
    t.equal(r.status, 401)
    t.match(r.challenge, /^Bearer error="invalid_token", /)
    t.match(r.challenge, `resource_metadata="${PUBLIC_URL}/.well-known/oauth-protected-resource/mcp/full"`)
    t.equal(r.body.error.data.code, 'GW_ERR_INVALID_TOKEN')
    t.notMatch(JSON.stringify(r.body), 'mcpgw_', 'the credential is not echoed')
  }
  const r = await refusal(await post(gw.url, '/mcp/full', initMessage(), { ...bearer(acmeKey.key), 'x-api-key': betaKey.key }))
  t.equal(r.status, 400)
  t.match(r.challenge, /error="invalid_request"/)
})

t.test('a token in the query string is never accepted', async t => {
  const gw = await gateway(t)
  for (const q of [`access_token=${acmeKey.key}`, `api_key=${acmeKey.key}`, `token=${acmeKey.key}`]) {
    const r = await refusal(await post(gw.url, `/mcp/full?${q}`, initMessage()))
    t.equal(r.status, 401, q)
    t.notMatch(r.challenge, /error=/, 'treated as no credential at all')
  }
})

t.test('an API key as Bearer or X-API-Key opens a session', async t => {
  const gw = await gateway(t)
  const viaBearer = await openSession(gw.url, 'full', bearer(acmeKey.key))
  t.match(viaBearer.sid, /^[A-Za-z0-9_-]{16,}$/)
  const viaHeader = await openSession(gw.url, 'full', { 'x-api-key': acmeKey.key })
  t.not(viaHeader.sid, viaBearer.sid)
  // The same key on both ways is one principal: the session of one is the other's.
  const del = await fetch(`${gw.url}/mcp/full`, { method: 'DELETE', headers: { 'x-api-key': acmeKey.key, 'mcp-session-id': viaBearer.sid, 'mcp-protocol-version': viaBearer.version } })
  t.equal(del.status, 200)
})

t.test('a server not in the tenant\'s list is 403 without a scope challenge; one that does not exist is 404', async t => {
  // Which servers exist is no secret (their OAuth metadata is public): a server that does not
  // exist, or was removed by a reload, is 404 as without tenants, the client's cue to start over.
  const gw = await gateway(t)
  for (const [server, status, code] of [['other', 403, 'GW_ERR_SERVER_NOT_ALLOWED'], ['nosuch', 404, 'GW_ERR_SERVER_NOT_FOUND']] as const) {
    for (const [method, path] of [['POST', `/mcp/${server}`], ['GET', `/sse/${server}`]] as const) {
      const res = await fetch(gw.url + path, {
        method,
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...bearer(acmeKey.key) },
        ...(method === 'POST' ? { body: JSON.stringify(initMessage()) } : {})
      })
      const r = await refusal(res)
      t.equal(r.status, status, `${method} ${path}`)
      t.equal(r.challenge, null, 'no WWW-Authenticate')
      t.equal(r.body.error.data.code, code)
    }
  }
  // beta's own server works for beta.
  t.ok((await openSession(gw.url, 'other', bearer(betaKey.key))).sid)
})

t.test('/healthz and /readyz stay open; unknown paths stay 404', async t => {
  const gw = await gateway(t)
  t.equal((await fetch(`${gw.url}/healthz`)).status, 200)
  t.equal((await fetch(`${gw.url}/readyz`)).status, 200)
  t.equal((await fetch(`${gw.url}/nothing-here`)).status, 404)
})

t.test('refusals are audited without the credential', async t => {
  const lines: string[] = []
  const { createLogger } = await import('../../src/telemetry/logger.js')
  const log = createLogger('info', 'audit-test', { write: (line: string) => { lines.push(line) } })
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [acmeKey.entry], servers: { full: {} } } },
    servers: { full: stdioFixture('full-server'), other: stdioFixture('full-server') }
  }, { log })
  await post(gw.url, '/mcp/full', initMessage())
  await post(gw.url, '/mcp/full', initMessage(), bearer('mcpgw_wrong-key-value'))
  await post(gw.url, '/mcp/other', initMessage(), bearer(acmeKey.key))
  const audits = lines.map(l => JSON.parse(l) as Record<string, unknown>).filter(l => l.audit === 'request.refused')
  t.match(audits, [
    { server: 'full', status: 401, reason: 'no credential', via: 'none' },
    { server: 'full', status: 401, reason: 'unknown API key', via: 'api-key' },
    { server: 'other', status: 403, reason: 'server not allowed', tenant: 'acme', subject: /^[0-9a-f]{32}$/ }
  ])
  const all = lines.join('\n')
  t.notMatch(all, acmeKey.key)
  t.notMatch(all, 'mcpgw_wrong-key-value')
  t.notMatch(all, 'ci-bot', 'the key id (the subject) is not logged either')
})

t.test('CORS preflights need no credential', async t => {
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    http: { allowedOrigins: ['https://app.example.com'] },
    tenants: { acme: { apiKeys: [acmeKey.entry], servers: { full: {} } } },
    servers: { full: stdioFixture('full-server') }
  })
  const res = await fetch(`${gw.url}/mcp/full`, {
    method: 'OPTIONS',
    headers: { origin: 'https://app.example.com', 'access-control-request-method': 'POST', 'access-control-request-headers': 'x-api-key, content-type' }
  })
  t.equal(res.status, 204)
  t.match(res.headers.get('access-control-allow-headers'), /X-API-Key/)
  t.match(res.headers.get('access-control-expose-headers'), /WWW-Authenticate/)
})

t.test('replace() swaps the tenant table of a running gateway (config reload)', async t => {
  const gw = await gateway(t)
  const fresh = newKey('fresh')
  t.ok((await openSession(gw.url, 'full', bearer(acmeKey.key))).sid, 'before: the old key works')
  const { parseConfig } = await import('../../src/config/load.js')
  gw.gateway.tenants.replace(parseConfig({
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [fresh.entry], servers: { full: {}, other: {} } } },
    servers: { full: stdioFixture('full-server'), other: stdioFixture('full-server') }
  }))
  t.equal((await post(gw.url, '/mcp/full', initMessage(), bearer(acmeKey.key))).status, 401, 'after: the old key is gone')
  t.equal((await post(gw.url, '/mcp/full', initMessage(), bearer(betaKey.key))).status, 401, 'after: the removed tenant is gone')
  t.ok((await openSession(gw.url, 'other', bearer(fresh.key))).sid, 'after: the new key, and a server newly listed')
  gw.gateway.tenants.replace(parseConfig({ servers: { full: stdioFixture('full-server') } }))
  t.ok((await openSession(gw.url, 'full', {})).sid, 'tenants removed: anonymous again')
})
