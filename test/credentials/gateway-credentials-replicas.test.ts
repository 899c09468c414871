// Per-user credentials across replicas: two gateways on one Redis, a client whose requests
// alternate between them. A token one replica obtained is found by the other in the vault (sealed
// there): one exchange per user, whichever replica takes the request, and no user gets another's.
import { randomBytes } from 'node:crypto'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import t from 'tap'
import { startGateway } from '../helpers/gateway.js'
import { startIssuer } from '../helpers/jwks.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { startRoundRobinProxy } from '../helpers/replicas.js'
import { GATEWAY_CLIENT, startOAuthServer, TOKEN_EXCHANGE } from '../helpers/oauth-server.js'
import { startProtectedUpstream } from '../fixtures/protected-upstream.js'

const PUBLIC = 'https://gw.example.com'
const AUDIENCE = 'https://api.example/mcp'

t.test('two replicas share the exchanged tokens through the vault, per user', async t => {
  const redis = await startRedis(t)
  const users = await startIssuer(t, 'https://users.example', { aud: `${PUBLIC}/mcp/api` })
  const as = await startOAuthServer(t, { keys: users.keys.map(k => k.jwk) }, users.issuer)
  const backend = await startProtectedUpstream({ jwksUri: as.jwksUri, issuer: as.issuer, audience: AUDIENCE })
  t.teardown(backend.close)
  const keyPrefix = randomPrefix()
  const vaultKeys = `k1:${randomBytes(32).toString('base64')}`
  const config = {
    redis: { url: redis.url, keyPrefix },
    auth: { publicUrl: PUBLIC },
    tenants: { acme: { jwt: [{ issuer: users.issuer, jwksUri: users.jwksUri }], servers: { api: {} } } },
    servers: {
      api: {
        transport: 'streamable-http',
        url: backend.url,
        protocol: 'legacy',
        credentials: { source: 'token-exchange', issuer: as.issuer, clientId: GATEWAY_CLIENT.id, clientSecret: GATEWAY_CLIENT.secret, audience: AUDIENCE, timeoutMs: 1000 }
      }
    }
  }
  const a = await startGateway(t, config, { replicaId: 'ra', vaultKeys })
  const b = await startGateway(t, config, { replicaId: 'rb', vaultKeys })
  const proxy = await startRoundRobinProxy(t, [a.url, b.url])
  const clients = []
  for (const subject of ['alice', 'bob']) {
    const token = await users.mint({ sub: subject })
    const client = new Client({ name: subject, version: '1.0.0' })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${proxy.url}/mcp/api`), { requestInit: { headers: { authorization: `Bearer ${token}` } } }))
    t.teardown(async () => { await client.close().catch(() => {}) })
    clients.push({ subject, client })
  }
  const calls = []
  for (let i = 0; i < 6; i++) {
    for (const { subject, client } of clients) {
      calls.push(client.callTool({ name: 'whoami', arguments: {} }).then(r => [subject, (r as { content: Array<{ text: string }> }).content[0]?.text]))
    }
  }
  for (const [subject, saw] of await Promise.all(calls)) t.equal(saw, subject)
  t.ok(proxy.counts.every(n => n > 0), `both replicas served (${proxy.counts.join(', ')})`)
  t.equal(as.grants.filter(g => g.grantType === TOKEN_EXCHANGE).length, 2, 'one exchange per user across both replicas')
  // What rests in Redis is sealed: no token the backend saw is in it.
  const r = await testRedis(t, redis.url)
  const keys = await r.keys(`${keyPrefix}:vault:*`)
  t.ok(keys.length >= 2)
  const stored = JSON.stringify(await Promise.all(keys.map(async k => await r.type(k) === 'hash' ? await r.hgetall(k) : null)))
  for (const token of new Set(backend.seen.map(s => s.token))) if (token !== null) t.notMatch(stored, token)
})
