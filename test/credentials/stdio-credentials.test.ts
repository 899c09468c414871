// Each user's own credential in a stdio child's environment, end to end: real MCP clients (SDK v1)
// with their own JWTs, a real authorization server (oidc-provider) exchanging them per user, and a
// real stdio child reporting the variable it was started with. Dedicated sessions, a pooled server
// under interleaved load, a reload between calls, a lapsed credential, a refused one.
import { randomBytes } from 'node:crypto'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { decodeJwt } from 'jose'
import { pino } from 'pino'
import t, { type Test } from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { startIssuer, type TestIssuer } from '../helpers/jwks.js'
import { newKey } from '../helpers/auth.js'
import { envelope, last, modernPost } from '../helpers/modern.js'
import { GATEWAY_CLIENT, startOAuthServer, TOKEN_EXCHANGE, type OAuthServer } from '../helpers/oauth-server.js'

const PUBLIC = 'https://gw.example.com'
const AUDIENCE = 'https://github.example/api'

interface Setup { users: TestIssuer, as: OAuthServer, gw: RunningGateway, logs: string[], raw: Record<string, unknown> }

function gatewayConfig (users: TestIssuer, as: OAuthServer, server: Record<string, unknown> = {}, credentials: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    auth: { publicUrl: PUBLIC },
    tenants: { acme: { jwt: [{ issuer: users.issuer, jwksUri: users.jwksUri }], servers: { gh: {} } } },
    servers: {
      gh: stdioFixture('cred-env-server', ['GITHUB_TOKEN'], {
        credentials: { source: 'token-exchange', issuer: as.issuer, clientId: GATEWAY_CLIENT.id, clientSecret: GATEWAY_CLIENT.secret, audience: AUDIENCE, env: 'GITHUB_TOKEN', timeoutMs: 2000, ...credentials },
        ...server
      })
    }
  }
}

async function setup (t: Test, server: Record<string, unknown> = {}, credentials: Record<string, unknown> = {}): Promise<Setup> {
  const users = await startIssuer(t, 'https://users.example', { aud: `${PUBLIC}/mcp/gh` })
  const as = await startOAuthServer(t, { keys: users.keys.map(k => k.jwk) }, users.issuer)
  const logs: string[] = []
  const log = pino({ level: 'debug' }, { write: (line: string) => { logs.push(line) } })
  const raw = gatewayConfig(users, as, server, credentials)
  const gw = await startGateway(t, raw, { log, vaultKeys: `k1:${randomBytes(32).toString('base64')}` })
  return { users, as, gw, logs, raw }
}

interface User { client: Client, token: string }

async function userOf (t: Test, s: Setup, subject: string): Promise<User> {
  const token = await s.users.mint({ sub: subject })
  const client = new Client({ name: `client-${subject}`, version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(`${s.gw.url}/mcp/gh`), { requestInit: { headers: { authorization: `Bearer ${token}`, host: 'gw.example.com' } } })
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  return { client, token }
}

interface Seen { pid: number, token: string | null, sub: string | undefined }

async function credentialOf (user: User, delayMs?: number): Promise<Seen> {
  const result = await user.client.callTool({ name: 'credential', arguments: delayMs === undefined ? {} : { delayMs } })
  const seen = JSON.parse((result as { content: Array<{ text: string }> }).content[0]?.text ?? '{}') as { pid: number, token: string | null }
  return { ...seen, sub: seen.token === null ? undefined : decodeJwt(seen.token).sub }
}

/** No backend token, and no client JWT, in anything the gateway logged. */
function assertNoSecretLogged (t: Test, s: Setup, seen: Seen[], users: User[]): void {
  const log = s.logs.join('')
  t.match(log, 'audit: credential.issued', 'the log was captured')
  const tokens = new Set(seen.map(x => x.token).filter((x): x is string => x !== null))
  t.ok(tokens.size > 0)
  for (const token of tokens) t.notOk(log.includes(token), 'no backend token logged')
  for (const user of users) t.notOk(log.includes(user.token), 'no client JWT logged')
}

t.test('dedicated sessions: each user\'s child holds that user\'s own token', async t => {
  const s = await setup(t)
  const alice = await userOf(t, s, 'alice')
  const bob = await userOf(t, s, 'bob')
  const a = await credentialOf(alice)
  const b = await credentialOf(bob)
  t.equal(a.sub, 'alice', 'alice\'s child got alice\'s token')
  t.equal(b.sub, 'bob', 'bob\'s child got bob\'s token')
  t.equal(decodeJwt(a.token ?? '').aud, AUDIENCE, 'the token names the backend')
  t.not(a.pid, b.pid, 'a child each')
  t.same(await credentialOf(alice), a, 'the same child, the same token, on the next call')
  t.equal(s.as.grants.filter(g => g.grantType === TOKEN_EXCHANGE).length, 2, 'one exchange per user')
  assertNoSecretLogged(t, s, [a, b], [alice, bob])
})

t.test('pooled: interleaved calls of two users are served only by children holding their own token; a reload between calls mixes nothing', async t => {
  const s = await setup(t, { sessions: 'pooled', poolSize: 1, poolMax: 3 })
  const alice = await userOf(t, s, 'alice')
  const bob = await userOf(t, s, 'bob')
  const round = async (): Promise<Array<[string, Seen]>> => await Promise.all(Array.from({ length: 24 }, async (_, i) => {
    const [name, user] = i % 2 === 0 ? ['alice', alice] as const : ['bob', bob] as const
    return [name, await credentialOf(user, 20 + (i % 5) * 10)] as [string, Seen]
  }))
  const check = (results: Array<[string, Seen]>, label: string): void => {
    const pidsOf = new Map<string, Set<number>>([['alice', new Set()], ['bob', new Set()]])
    for (const [name, seen] of results) {
      if (seen.sub !== name) t.fail(`${label}: ${name}'s call was served with ${String(seen.sub)}'s token`)
      pidsOf.get(name)?.add(seen.pid)
    }
    t.pass(`${label}: all ${results.length} calls served with the caller's own token`)
    const shared = [...(pidsOf.get('alice') ?? [])].filter(pid => pidsOf.get('bob')?.has(pid) === true)
    t.same(shared, [], `${label}: no child served both users`)
    t.ok((pidsOf.get('alice')?.size ?? 0) <= 3, `${label}: poolMax applies per user (${pidsOf.get('alice')?.size ?? 0} children)`)
  }
  const first = await round()
  check(first, 'before the reload')
  // The server's pool settings change: its children end, new ones start, per user again.
  const raw = s.raw as { servers: { gh: Record<string, unknown> } }
  await s.gw.gateway.live.apply(parseConfig({ ...s.gw.config, servers: { gh: { ...raw.servers.gh, poolMax: 2 } } }))
  const second = await round()
  check(second, 'after the reload')
  t.same(first.filter(([, x]) => second.some(([, y]) => y.pid === x.pid)), [], 'the reload replaced the children')
  assertNoSecretLogged(t, s, [...first, ...second].map(([, x]) => x), [alice, bob])
})

t.test('2026-07-28 requests run on the caller\'s own pool: interleaved, each user\'s call sees only that user\'s token', async t => {
  const s = await setup(t, { poolSize: 1, poolMax: 2 })
  const tokens = { alice: await s.users.mint({ sub: 'alice' }), bob: await s.users.mint({ sub: 'bob' }) }
  const answers = await Promise.all(Array.from({ length: 16 }, async (_, i) => {
    const who = i % 2 === 0 ? 'alice' : 'bob'
    const answer = await modernPost(`${s.gw.url}/mcp/gh`, 'tools/call', { name: 'credential', arguments: { delayMs: 20 }, _meta: envelope() }, i + 1, { authorization: `Bearer ${tokens[who]}`, host: 'gw.example.com' })
    const text = ((last(answer).result as { content?: Array<{ text: string }> } | undefined)?.content?.[0]?.text) ?? '{}'
    const seen = JSON.parse(text) as { pid?: number, token?: string }
    return { who, pid: seen.pid, sub: seen.token === undefined ? undefined : decodeJwt(seen.token).sub }
  }))
  t.same(answers.filter(a => a.sub !== a.who), [], 'every call served with the caller\'s own token')
  const pids = (who: string): Set<number | undefined> => new Set(answers.filter(a => a.who === who).map(a => a.pid))
  t.same([...pids('alice')].filter(p => pids('bob').has(p)), [], 'no child served both')
})

t.test('a credential that lapsed: the next request gets a new child with a fresh token of the same user', async t => {
  const s = await setup(t, {}, { refreshBeforeMs: 0 })
  s.as.ttlSeconds = 2
  const alice = await userOf(t, s, 'alice')
  const before = await credentialOf(alice)
  t.equal(before.sub, 'alice')
  await new Promise(resolve => setTimeout(resolve, 2300))
  const after = await credentialOf(alice)
  t.equal(after.sub, 'alice', 'still alice\'s')
  t.not(after.token, before.token, 'a fresh token')
  t.not(after.pid, before.pid, 'in a new child')
  t.match(s.logs.join(''), /"why":"credential lapsed"/)
})

t.test('a refused credential fails the initialize with its typed error, and no child starts', async t => {
  const s = await setup(t)
  s.as.refused.add('mallory')
  const token = await s.users.mint({ sub: 'mallory' })
  const res = await fetch(`${s.gw.url}/mcp/gh`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, host: 'gw.example.com', 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'm', version: '1' } } })
  })
  t.equal(res.status, 403)
  const body = await res.json() as { error?: { code: number, data?: Record<string, unknown> } }
  t.equal(body.error?.code, -32011)
  t.match(body.error?.data, { code: 'GW_ERR_CREDENTIAL_REFUSED', server: 'gh', oauthError: 'invalid_grant' })
  t.notMatch(s.logs.join(''), /"msg":"backend started"/, 'no child was started')
})

t.test('client-credentials per tenant on a pooled server: each tenant\'s children hold its own token, in the template', async t => {
  const users = await startIssuer(t, 'https://users.example')
  const as = await startOAuthServer(t, { keys: users.keys.map(k => k.jwk) }, users.issuer)
  const keys = { acme: newKey('acme-bot'), beta: newKey('beta-bot') }
  const own = (tenant: string): Record<string, unknown> => ({
    credentials: { source: 'client-credentials', tokenEndpoint: as.tokenEndpoint, clientId: GATEWAY_CLIENT.id, clientSecret: GATEWAY_CLIENT.secret, resource: `https://${tenant}.github.example/api`, env: 'GITHUB_TOKEN', envTemplate: 'token {token}' }
  })
  const logs: string[] = []
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC },
    tenants: {
      acme: { apiKeys: [keys.acme.entry], servers: { gh: own('acme') } },
      beta: { apiKeys: [keys.beta.entry], servers: { gh: own('beta') } }
    },
    servers: { gh: stdioFixture('cred-env-server', ['GITHUB_TOKEN'], { sessions: 'pooled', poolSize: 1, poolMax: 2 }) }
  }, { log: pino({ level: 'debug' }, { write: (line: string) => { logs.push(line) } }), vaultKeys: `k1:${randomBytes(32).toString('base64')}` })
  const seen: Record<string, string[]> = { acme: [], beta: [] }
  for (const tenant of ['acme', 'beta'] as const) {
    const client = new Client({ name: tenant, version: '1.0.0' })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/gh`), { requestInit: { headers: { authorization: `Bearer ${keys[tenant].key}`, host: 'gw.example.com' } } }))
    t.teardown(async () => { await client.close().catch(() => {}) })
    const results = await Promise.all(Array.from({ length: 6 }, async () => await client.callTool({ name: 'credential', arguments: { delayMs: 30 } })))
    for (const result of results) seen[tenant]?.push((JSON.parse((result as { content: Array<{ text: string }> }).content[0]?.text ?? '{}') as { token: string }).token)
  }
  for (const tenant of ['acme', 'beta']) {
    const values = seen[tenant] ?? []
    t.ok(values.every(v => v.startsWith('token ')), `${tenant}: the template was applied`)
    t.same([...new Set(values.map(v => decodeJwt(v.slice('token '.length)).aud))], [`https://${tenant}.github.example/api`], `${tenant}: only its own token`)
  }
  t.equal(as.grants.filter(g => g.grantType === 'client_credentials').length, 2, 'one grant per tenant')
  for (const value of [...(seen.acme ?? []), ...(seen.beta ?? [])]) t.notOk(logs.join('').includes(value.slice('token '.length)), 'no token logged')
})

t.test('config: a stdio credentials block needs env; env belongs to stdio servers only', async t => {
  const users = await startIssuer(t, 'https://users.example')
  const as = await startOAuthServer(t, { keys: users.keys.map(k => k.jwk) }, users.issuer)
  const raw = gatewayConfig(users, as) as { servers: { gh: { credentials: Record<string, unknown> } } }
  const noEnv = { ...raw, servers: { gh: { ...raw.servers.gh, credentials: { ...raw.servers.gh.credentials, env: undefined } } } }
  t.throws(() => parseConfig(JSON.parse(JSON.stringify(noEnv))), /servers\/gh\/credentials\/env.*required on a stdio server/)
  const http = { ...raw, servers: { gh: { transport: 'streamable-http', url: 'https://x.example/mcp', protocol: 'legacy', credentials: raw.servers.gh.credentials } } }
  t.throws(() => parseConfig(http), /servers\/gh\/credentials\/env.*stdio servers only/)
  t.ok(parseConfig(raw), 'the stdio block with env loads')
})
