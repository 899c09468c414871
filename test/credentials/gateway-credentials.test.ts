// Per-user credentials end to end: real MCP clients (SDK v1) with their own JWTs, the gateway
// exchanging each for a backend token at a real authorization server (oidc-provider), and a real
// backend that checks the token's audience and signature and reports the subject it saw.
import { randomBytes } from 'node:crypto'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { pino } from 'pino'
import t, { type Test } from 'tap'
import { startGateway, type RunningGateway } from '../helpers/gateway.js'
import { startIssuer, type TestIssuer } from '../helpers/jwks.js'
import { GATEWAY_CLIENT, startOAuthServer, TOKEN_EXCHANGE, type OAuthServer } from '../helpers/oauth-server.js'
import { startProtectedUpstream, type ProtectedUpstream } from '../fixtures/protected-upstream.js'
import { envelope, last, modernPost } from '../helpers/modern.js'

const PUBLIC = 'https://gw.example.com'
const AUDIENCE = 'https://api.example/mcp'

interface Setup { users: TestIssuer, as: OAuthServer, backend: ProtectedUpstream, gw: RunningGateway, logs: string[] }

async function setup (t: Test, credentials: Record<string, unknown> = {}, extra: Record<string, unknown> = {}): Promise<Setup> {
  const users = await startIssuer(t, 'https://users.example', { aud: `${PUBLIC}/mcp/api` })
  const as = await startOAuthServer(t, { keys: users.keys.map(k => k.jwk) }, users.issuer)
  const backend = await startProtectedUpstream({ jwksUri: as.jwksUri, issuer: as.issuer, audience: AUDIENCE })
  t.teardown(backend.close)
  const logs: string[] = []
  const log = pino({ level: 'debug' }, { write: (line: string) => { logs.push(line) } })
  const gw = await startGateway(t, {
    ...extra,
    auth: { publicUrl: PUBLIC },
    tenants: { acme: { jwt: [{ issuer: users.issuer, jwksUri: users.jwksUri }], servers: { api: {} } } },
    servers: {
      api: {
        transport: 'streamable-http',
        url: backend.url,
        protocol: 'legacy',
        credentials: Object.fromEntries(Object.entries({ source: 'token-exchange', issuer: as.issuer, clientId: GATEWAY_CLIENT.id, clientSecret: GATEWAY_CLIENT.secret, audience: AUDIENCE, timeoutMs: 1000, ...credentials }).filter(([, v]) => v !== undefined))
      }
    }
  }, { log, vaultKeys: `k1:${randomBytes(32).toString('base64')}` })
  return { users, as, backend, gw, logs }
}

async function clientOf (t: Test, s: Setup, subject: string): Promise<{ client: Client, token: string }> {
  const token = await s.users.mint({ sub: subject })
  const client = new Client({ name: `client-${subject}`, version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(`${s.gw.url}/mcp/api`), { requestInit: { headers: { authorization: `Bearer ${token}` } } })
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  return { client, token }
}

const textOf = (result: unknown): string => ((result as { content: Array<{ text: string }> }).content[0]?.text ?? '')
const exchanges = (s: Setup): number => s.as.grants.filter(g => g.grantType === TOKEN_EXCHANGE).length

t.test('two users of one tenant each reach the backend with their own token, concurrently', async t => {
  const s = await setup(t)
  const alice = await clientOf(t, s, 'alice')
  const bob = await clientOf(t, s, 'bob')
  const calls = []
  for (let i = 0; i < 10; i++) {
    calls.push(alice.client.callTool({ name: 'whoami', arguments: {} }).then(r => ['alice', textOf(r)]))
    calls.push(bob.client.callTool({ name: 'whoami', arguments: {} }).then(r => ['bob', textOf(r)]))
  }
  for (const [who, saw] of await Promise.all(calls)) t.equal(saw, who, `${who}'s call carried ${who}'s token`)
  t.equal(exchanges(s), 2, 'one exchange per user')
  t.same(s.backend.seen.filter(r => r.subject === null).map(r => [r.method, r.token === null]), [], 'the backend refused nothing')
  // Nothing secret in the gateway's log: neither the clients' JWTs nor the exchanged tokens.
  const log = s.logs.join('')
  t.match(log, 'audit: credential.issued')
  for (const token of new Set(s.backend.seen.map(r => r.token))) t.notMatch(log, token!, 'no backend token logged')
  t.notMatch(log, alice.token)
  t.notMatch(log, bob.token)
})

t.test('a backend 401: one re-exchange, then a clear error', async t => {
  const s = await setup(t)
  const alice = await clientOf(t, s, 'alice')
  t.equal(textOf(await alice.client.callTool({ name: 'whoami', arguments: {} })), 'alice')
  const before = exchanges(s)
  // The backend revokes the token it has seen: the gateway gets a new one and the call goes through.
  for (const r of s.backend.seen) if (r.token !== null) s.backend.revoked.add(r.token)
  t.equal(textOf(await alice.client.callTool({ name: 'whoami', arguments: {} })), 'alice')
  t.equal(exchanges(s), before + 1, 'exactly one re-exchange')
  // The backend refuses every token: one retry, then GW_ERR_CREDENTIAL_REJECTED.
  s.backend.refuseAll = true
  const err = await alice.client.callTool({ name: 'whoami', arguments: {} }).catch((e: unknown) => e) as { code?: number, data?: Record<string, unknown> }
  t.equal(err.code, -32012)
  t.match(err.data, { code: 'GW_ERR_CREDENTIAL_REJECTED', server: 'api', source: 'gateway' })
  t.equal(exchanges(s), before + 2, 'one more exchange for the one retry, no loop')
})

t.test('the authorization server stopped mid-run: a clear error, no hang; cached tokens still serve', async t => {
  const s = await setup(t)
  const alice = await clientOf(t, s, 'alice')
  await s.as.stop()
  t.equal(textOf(await alice.client.callTool({ name: 'whoami', arguments: {} })), 'alice', 'alice\'s token is cached')
  const started = Date.now()
  const err = await clientOf(t, s, 'carol').catch((e: unknown) => e) as Error
  t.ok(Date.now() - started < 5000, `answered in ${Date.now() - started} ms`)
  t.match(String(err.message), /authorization server for backend 'api' is unavailable/)
  t.match(s.logs.join(''), /"audit":"credential.failed".*"outcome":"unavailable"/)
})

t.test('a refused exchange is its own error', async t => {
  const s = await setup(t)
  s.as.refused.add('mallory')
  const err = await clientOf(t, s, 'mallory').catch((e: unknown) => e) as Error
  t.match(String(err.message), /refused a credential for backend 'api': invalid_grant/)
})

t.test('a token about to expire is exchanged again; the old one is not sent', async t => {
  const s = await setup(t, { refreshBeforeMs: 1000 })
  s.as.ttlSeconds = 2
  const alice = await clientOf(t, s, 'alice')
  t.equal(textOf(await alice.client.callTool({ name: 'whoami', arguments: {} })), 'alice')
  const first = exchanges(s)
  const firstToken = s.backend.seen.at(-1)?.token
  await new Promise(resolve => setTimeout(resolve, 1200))
  t.equal(textOf(await alice.client.callTool({ name: 'whoami', arguments: {} })), 'alice')
  t.equal(exchanges(s), first + 1, 're-exchanged before expiry')
  t.not(s.backend.seen.at(-1)?.token, firstToken)
})

t.test('2026-07-28 requests: a per-user source runs on the caller\'s own pool, client credentials on the tenant\'s', async t => {
  const perUser = await setup(t)
  const call = { name: 'whoami', arguments: {}, _meta: envelope() }
  for (const user of ['alice', 'bob', 'alice']) {
    const answer = await modernPost(`${perUser.gw.url}/mcp/api`, 'tools/call', call, 1, { authorization: `Bearer ${await perUser.users.mint({ sub: user })}` })
    t.equal((last(answer).result as { content: Array<{ text: string }> } | undefined)?.content[0]?.text, user, `${user}'s call carries ${user}'s own token`)
  }
  t.ok(perUser.backend.seen.length > 0 && perUser.backend.seen.every(r => r.token !== null), 'no request reached the backend without a token')

  const tenantWide = await setup(t, { source: 'client-credentials', resource: AUDIENCE, audience: undefined })
  const served = await modernPost(`${tenantWide.gw.url}/mcp/api`, 'tools/call', call, 1, { authorization: `Bearer ${await tenantWide.users.mint({ sub: 'alice' })}` })
  t.equal((last(served).result as { content: Array<{ text: string }> } | undefined)?.content[0]?.text, GATEWAY_CLIENT.id, 'the tenant\'s own client token')
})

t.test('the admin API lists what the vault holds, never a token', async t => {
  const ADMIN = 'admin-token-0123456789-0123456789-01'
  const s = await setup(t, {}, { admin: { token: ADMIN } })
  const alice = await clientOf(t, s, 'alice')
  await alice.client.callTool({ name: 'whoami', arguments: {} })
  const res = await fetch(`${s.gw.url}/admin/api/credentials?tenant=acme`, { headers: { authorization: `Bearer ${ADMIN}` } })
  const text = await res.text()
  const body = JSON.parse(text) as { credentials: Array<Record<string, unknown>> }
  t.equal(body.credentials.length, 1)
  t.match(body.credentials[0], { server: 'api', subject: /^[0-9a-f]{32}$/, audience: AUDIENCE, keyId: 'k1' })
  for (const r of s.backend.seen) if (r.token !== null) t.notMatch(text, r.token)
  t.equal((await fetch(`${s.gw.url}/admin/api/credentials?tenant=acme`)).status, 401, 'the admin token is required')
})
