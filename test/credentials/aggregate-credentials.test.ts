// An aggregate whose members each take the caller's own credential, end to end: real MCP clients
// (SDK v1) with their own JWTs, a real authorization server (oidc-provider) exchanging them per user
// and per member, a real HTTP backend that checks the token it gets and reports its subject (a
// dedicated member of the session), and a real stdio child reporting the token in its environment
// (a pooled member, on each user's own pool). Two users at once, in 2025 sessions and in 2026-07-28
// requests; a user whose exchange is refused gets the member's own error, and a user-authorization
// member needing consent gives its link, then comes back once the user has consented.
import { randomBytes } from 'node:crypto'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { McpError } from '@modelcontextprotocol/sdk/types.js'
import { decodeJwt } from 'jose'
import { pino } from 'pino'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { startIssuer, type TestIssuer } from '../helpers/jwks.js'
import { envelope, last, modernPost } from '../helpers/modern.js'
import { GATEWAY_CLIENT, startOAuthServer, TOKEN_EXCHANGE, type OAuthServer } from '../helpers/oauth-server.js'
import { startProtectedUpstream, type ProtectedUpstream } from '../fixtures/protected-upstream.js'
import { buildGateway } from '../../src/app.js'
import { parseConfig } from '../../src/config/load.js'
import { createLogger } from '../../src/telemetry/logger.js'
import { closedPort } from '../fixtures/http-upstreams.js'
import { browse, startConsentServer, UA_CLIENT } from '../helpers/oauth-consent-server.js'

const PUBLIC = 'https://gw.example.com'
const API_AUDIENCE = 'https://api.example/mcp'
const GH_AUDIENCE = 'https://github.example/api'

interface Setup { users: TestIssuer, as: OAuthServer, backend: ProtectedUpstream, gw: RunningGateway, logs: string[] }

async function setup (t: Test): Promise<Setup> {
  const users = await startIssuer(t, 'https://users.example', { aud: `${PUBLIC}/mcp/both` })
  const as = await startOAuthServer(t, { keys: users.keys.map(k => k.jwk) }, users.issuer)
  const backend = await startProtectedUpstream({ jwksUri: as.jwksUri, issuer: as.issuer, audience: API_AUDIENCE })
  t.teardown(backend.close)
  const logs: string[] = []
  const log = pino({ level: 'debug' }, { write: (line: string) => { logs.push(line) } })
  const exchange = { source: 'token-exchange', issuer: as.issuer, clientId: GATEWAY_CLIENT.id, clientSecret: GATEWAY_CLIENT.secret, timeoutMs: 2000 }
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC },
    tenants: { acme: { jwt: [{ issuer: users.issuer, jwksUri: users.jwksUri }], servers: { both: {}, api: {}, gh: {} } } },
    servers: {
      api: { transport: 'streamable-http', url: backend.url, protocol: 'legacy', credentials: { ...exchange, audience: API_AUDIENCE } },
      gh: stdioFixture('cred-env-server', ['GITHUB_TOKEN'], {
        sessions: 'pooled',
        poolSize: 1,
        poolMax: 2,
        credentials: { ...exchange, audience: GH_AUDIENCE, env: 'GITHUB_TOKEN' }
      }),
      both: { transport: 'aggregate', members: [{ server: 'api' }, { server: 'gh' }] }
    }
  }, { log, vaultKeys: `k1:${randomBytes(32).toString('base64')}` })
  return { users, as, backend, gw, logs }
}

interface User { name: string, client: Client, token: string }

async function userOf (t: Test, s: Setup, name: string): Promise<User> {
  const token = await s.users.mint({ sub: name })
  const client = new Client({ name: `client-${name}`, version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${s.gw.url}/mcp/both`), { requestInit: { headers: { authorization: `Bearer ${token}`, host: 'gw.example.com' } } }))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return { name, client, token }
}

const textOf = (result: unknown): string => ((result as { content?: Array<{ text: string }> } | undefined)?.content?.[0]?.text ?? '')

/** What the stdio member's child holds: its pid and the subject and audience of its token. */
function childSaw (text: string): { pid: number, sub: string | undefined, aud: unknown } {
  const seen = JSON.parse(text === '' ? '{}' : text) as { pid: number, token: string | null }
  const claims = seen.token === null ? undefined : decodeJwt(seen.token)
  return { pid: seen.pid, sub: claims?.sub, aud: claims?.aud }
}

/** Neither the clients' JWTs nor any backend token in what the gateway logged. */
function assertNoTokenLogged (t: Test, s: Setup, users: User[], childTokens: string[]): void {
  const log = s.logs.join('')
  t.match(log, 'audit: credential.issued', 'the log was captured')
  const backendTokens = new Set(s.backend.seen.map(r => r.token).filter((x): x is string => x !== null))
  t.ok(backendTokens.size >= 2 && childTokens.length > 0, 'tokens were seen to look for')
  for (const token of [...backendTokens, ...childTokens]) t.notOk(log.includes(token), 'no backend token logged')
  for (const user of users) t.notOk(log.includes(user.token), 'no client JWT logged')
}

t.test('2025 sessions: each user\'s calls through both members carry that user\'s own credential, concurrently', async t => {
  const s = await setup(t)
  const alice = await userOf(t, s, 'alice')
  const bob = await userOf(t, s, 'bob')
  const names = (await alice.client.listTools()).tools.map(tool => tool.name).sort()
  t.same(names, ['api__whoami', 'gh__credential'], 'both members are listed')
  const childTokens: string[] = []
  const pidsOf = new Map<string, Set<number>>([['alice', new Set()], ['bob', new Set()]])
  const calls: Array<Promise<void>> = []
  for (let i = 0; i < 8; i++) {
    for (const user of [alice, bob]) {
      calls.push(user.client.callTool({ name: 'api__whoami', arguments: {} }).then(r => { t.equal(textOf(r), user.name, `${user.name}'s HTTP member call carried ${user.name}'s token`) }))
      calls.push(user.client.callTool({ name: 'gh__credential', arguments: { delayMs: 10 + (i % 3) * 10 } }).then(r => {
        const text = textOf(r)
        const seen = childSaw(text)
        const token = (JSON.parse(text) as { token: string | null }).token
        if (token !== null) childTokens.push(token)
        t.equal(seen.sub, user.name, `${user.name}'s stdio member call ran in a child holding ${user.name}'s token`)
        t.equal(seen.aud, GH_AUDIENCE, 'exchanged for the stdio member\'s audience')
        pidsOf.get(user.name)?.add(seen.pid)
      }))
    }
  }
  await Promise.all(calls)
  const shared = [...(pidsOf.get('alice') ?? [])].filter(pid => pidsOf.get('bob')?.has(pid) === true)
  t.same(shared, [], 'no child served both users')
  t.same(s.backend.seen.filter(r => r.subject === null).map(r => r.method), [], 'the HTTP backend refused nothing')
  t.equal(s.as.grants.filter(g => g.grantType === TOKEN_EXCHANGE).length, 4, 'one exchange per user and member')
  assertNoTokenLogged(t, s, [alice, bob], childTokens)
})

t.test('2026-07-28 requests: lists and calls through the aggregate run on each caller\'s own pools', async t => {
  const s = await setup(t)
  const tokens: Record<string, string> = { alice: await s.users.mint({ sub: 'alice' }), bob: await s.users.mint({ sub: 'bob' }) }
  const post = async (who: string, method: string, params: Record<string, unknown>, id: number): Promise<Record<string, unknown>> =>
    last(await modernPost(`${s.gw.url}/mcp/both`, method, { ...params, _meta: envelope() }, id, { authorization: `Bearer ${tokens[who] ?? ''}`, host: 'gw.example.com' }))
  const listed = await post('alice', 'tools/list', {}, 1)
  t.same(((listed.result as { tools?: Array<{ name: string }> } | undefined)?.tools ?? []).map(tool => tool.name).sort(), ['api__whoami', 'gh__credential'], 'alice sees both members\' tools')
  const childTokens: string[] = []
  const answers = await Promise.all(Array.from({ length: 16 }, async (_, i) => {
    const who = i % 2 === 0 ? 'alice' : 'bob'
    const api = await post(who, 'tools/call', { name: 'api__whoami', arguments: {} }, 100 + i)
    const gh = await post(who, 'tools/call', { name: 'gh__credential', arguments: { delayMs: 20 } }, 200 + i)
    const text = textOf(gh.result)
    const token = text === '' ? null : (JSON.parse(text) as { token: string | null }).token
    if (token !== null) childTokens.push(token)
    return { who, api: textOf(api.result), child: childSaw(text) }
  }))
  t.same(answers.filter(a => a.api !== a.who).map(a => [a.who, a.api]), [], 'every HTTP member call carried the caller\'s own token')
  t.same(answers.filter(a => a.child.sub !== a.who).map(a => [a.who, a.child.sub]), [], 'every stdio member call ran in a child holding the caller\'s own token')
  const pids = (who: string): Set<number> => new Set(answers.filter(a => a.who === who).map(a => a.child.pid))
  t.same([...pids('alice')].filter(p => pids('bob').has(p)), [], 'no child served both')
  assertNoTokenLogged(t, s, [], childTokens)
})

t.test('a member whose credential is refused: left out of lists, its calls get its own typed error', async t => {
  const s = await setup(t)
  s.as.refused.add('mallory')
  const mallory = await userOf(t, s, 'mallory')
  t.same((await mallory.client.listTools()).tools.map(tool => tool.name), [], 'both members are left out of mallory\'s lists')
  for (const [name, server] of [['api__whoami', 'api'], ['gh__credential', 'gh']]) {
    const err = await mallory.client.callTool({ name: name ?? '', arguments: {} }).catch((e: unknown) => e) as { code?: number, data?: Record<string, unknown> }
    t.equal(err.code, -32011, `${name}: the refusal's own code`)
    t.match(err.data, { code: 'GW_ERR_CREDENTIAL_REFUSED', server, oauthError: 'invalid_grant' })
  }
  // The same for a 2026-07-28 request: the HTTP status and code the member would give.
  const token = await s.users.mint({ sub: 'mallory' })
  const answer = await modernPost(`${s.gw.url}/mcp/both`, 'tools/call', { name: 'gh__credential', arguments: {}, _meta: envelope() }, 1, { authorization: `Bearer ${token}`, host: 'gw.example.com' })
  const body = last(answer) as { error?: { code: number, data?: Record<string, unknown> } }
  t.equal(answer.status, 403)
  t.equal(body.error?.code, -32011)
  t.match(body.error?.data, { code: 'GW_ERR_CREDENTIAL_REFUSED', server: 'gh' })
  // Alice, meanwhile, is served: the refusal is mallory's alone.
  const alice = await userOf(t, s, 'alice')
  t.equal(textOf(await alice.client.callTool({ name: 'api__whoami', arguments: {} })), 'alice')
})

t.test('user-authorization member: consent needed is that member\'s own error with its link; after consent the member comes back', async t => {
  const users = await startIssuer(t, 'https://users.example', { aud: `${PUBLIC}/mcp/both` })
  const port = await closedPort()
  const base = `http://127.0.0.1:${port}`
  const as = await startConsentServer(t, [`${base}/oauth/callback`], { tokenFormat: 'jwt' })
  const expect = { jwksUri: `${as.issuer}/jwks`, issuer: as.issuer, audience: '' }
  const backend = await startProtectedUpstream(expect)
  expect.audience = backend.url
  t.teardown(backend.close)
  const config = parseConfig({
    listen: { host: '127.0.0.1', port },
    log: { level: 'silent' },
    auth: { publicUrl: PUBLIC },
    tenants: { acme: { jwt: [{ issuer: users.issuer, jwksUri: users.jwksUri }], servers: { both: {}, crm: {}, gh: {} } } },
    servers: {
      crm: {
        transport: 'streamable-http',
        url: backend.url,
        protocol: 'legacy',
        credentials: { source: 'user-authorization', issuer: as.issuer, clientId: UA_CLIENT.id, clientSecret: UA_CLIENT.secret, resource: backend.url, redirectBaseUrl: base, scopes: ['read'], timeoutMs: 3000 }
      },
      gh: stdioFixture('cred-env-server', ['GITHUB_TOKEN'], { sessions: 'pooled', poolSize: 1 }),
      both: { transport: 'aggregate', members: [{ server: 'crm' }, { server: 'gh' }] }
    }
  })
  const gateway = await buildGateway(config, { log: createLogger('silent', 'test'), vaultKeys: `k1:${randomBytes(32).toString('base64')}` })
  await gateway.app.listen({ host: '127.0.0.1', port })
  t.teardown(async () => { await gateway.close() })
  const token = await users.mint({ sub: 'alice' })
  const client = new Client({ name: 'alice', version: '1.0.0' }, { capabilities: { elicitation: { url: {} } } })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp/both`), { requestInit: { headers: { authorization: `Bearer ${token}` } } }))
  t.teardown(async () => { await client.close().catch(() => {}) })
  t.same((await client.listTools()).tools.map(tool => tool.name), ['gh__credential'], 'the member needing consent is left out; the other is served')
  const err = await client.callTool({ name: 'crm__whoami', arguments: {} }).catch((e: unknown) => e) as McpError
  const protocol = client.getServerVersion() !== undefined ? (client.transport as StreamableHTTPClientTransport).protocolVersion : undefined
  if (protocol === '2025-11-25') {
    t.equal(err.code, -32042, 'a 2025-11-25 client that declared URL elicitation gets the URL elicitation error')
  } else {
    t.equal(err.code, -32014, 'consent needed, with its link')
  }
  const link = protocol === '2025-11-25'
    ? String((err.data as { elicitations: Array<{ url: string }> }).elicitations[0]?.url)
    : String((err.data as Record<string, unknown>).authorizationUrl)
  t.match(link, `${base}/oauth/consent/`)
  // A 2026-07-28 request routed to the member: the same error, with its HTTP status.
  const modern = await modernPost(`${base}/mcp/both`, 'tools/call', { name: 'crm__whoami', arguments: {}, _meta: envelope() }, 1, { authorization: `Bearer ${token}` })
  t.equal(modern.status, 403)
  t.match(last(modern).error, { code: -32014, data: { code: 'GW_ERR_CREDENTIAL_CONSENT_REQUIRED', server: 'crm' } })

  t.equal((await browse(link, 'alice')).status, 200, 'consent given')
  // The session tries the member again every 5 s: then its tools are back and its calls carry alice's token.
  const deadline = Date.now() + 15_000
  let names: string[] = []
  while (Date.now() < deadline) {
    names = (await client.listTools()).tools.map(tool => tool.name).sort()
    if (names.includes('crm__whoami')) break
    await new Promise(resolve => setTimeout(resolve, 250))
  }
  t.same(names, ['crm__whoami', 'gh__credential'], 'the member is back after consent')
  t.equal(textOf(await client.callTool({ name: 'crm__whoami', arguments: {} })), 'alice')
  t.ok(backend.seen.length > 0 && backend.seen.every(r => r.subject !== null), 'no request reached the backend without the user\'s token')
})
