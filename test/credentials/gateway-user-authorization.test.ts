// user-authorization through the gateway: two replicas on one Redis, real MCP clients (SDK) and a
// Streamable HTTP backend that verifies each token against the authorization server's keys. A user
// with no consent cannot open the session: the answer carries the consent link (-32014, or the
// spec's -32042 URL elicitation for a 2025-11-25 client that declared it); the link opened on one
// replica, the callback landing on the other; then the user's calls carry their own token, on
// either replica, and another user's never.
import { randomBytes } from 'node:crypto'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { buildGateway } from '../../src/app.js'
import { parseConfig } from '../../src/config/load.js'
import { createLogger } from '../../src/telemetry/logger.js'
import { closedPort } from '../fixtures/http-upstreams.js'
import { startProtectedUpstream } from '../fixtures/protected-upstream.js'
import { startIssuer } from '../helpers/jwks.js'
import { browse, startConsentServer, UA_CLIENT } from '../helpers/oauth-consent-server.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'

const PUBLIC = 'https://gw.example.com'

async function replica (t: Test, raw: Record<string, unknown>, port: number, replicaId: string, vaultKeys: string): Promise<string> {
  const config = parseConfig({ listen: { host: '127.0.0.1', port }, log: { level: process.env.TEST_LOG_LEVEL ?? 'silent' }, ...raw })
  const gateway = await buildGateway(config, { log: createLogger(config.log.level, replicaId), replicaId, vaultKeys })
  const url = await gateway.app.listen({ host: '127.0.0.1', port })
  t.teardown(async () => { await gateway.close() })
  return url
}

t.test('consent by link through the gateway, then each user calls the backend with their own token, on either replica', async t => {
  const redis = await startRedis(t)
  const users = await startIssuer(t, 'https://users.example', { aud: `${PUBLIC}/mcp/api` })
  const [portA, portB] = [await closedPort(), await closedPort()]
  const base = { a: `http://127.0.0.1:${portA}`, b: `http://127.0.0.1:${portB}` }
  const as = await startConsentServer(t, [`${base.b}/oauth/callback`], { tokenFormat: 'jwt' })
  // The audience is the backend's own URL (the resource), known once it listens.
  const expect = { jwksUri: `${as.issuer}/jwks`, issuer: as.issuer, audience: '' }
  const backend = await startProtectedUpstream(expect)
  expect.audience = backend.url
  t.teardown(backend.close)
  const raw = {
    redis: { url: redis.url, keyPrefix: randomPrefix() },
    auth: { publicUrl: PUBLIC },
    tenants: { acme: { jwt: [{ issuer: users.issuer, jwksUri: users.jwksUri }], servers: { api: {} } } },
    servers: {
      api: {
        transport: 'streamable-http',
        url: backend.url,
        protocol: 'legacy',
        credentials: { source: 'user-authorization', issuer: as.issuer, clientId: UA_CLIENT.id, clientSecret: UA_CLIENT.secret, resource: backend.url, redirectBaseUrl: base.b, scopes: ['read'], timeoutMs: 3000 }
      }
    }
  }
  const vaultKeys = `k1:${randomBytes(32).toString('base64')}`
  await replica(t, raw, portA, 'ra', vaultKeys)
  await replica(t, raw, portB, 'rb', vaultKeys)

  const connect = async (on: string, subject: string, capabilities: Record<string, unknown> = {}): Promise<Client> => {
    const client = new Client({ name: subject, version: '1.0.0' }, { capabilities })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${on}/mcp/api`), { requestInit: { headers: { authorization: `Bearer ${await users.mint({ sub: subject })}` } } }))
    t.teardown(async () => { await client.close().catch(() => {}) })
    return client
  }
  const refused = async (on: string, subject: string, capabilities?: Record<string, unknown>): Promise<McpError> => {
    try {
      await connect(on, subject, capabilities)
    } catch (err) {
      if (err instanceof McpError) return err
      throw err
    }
    throw new Error('connected without consent')
  }
  const whoami = async (client: Client): Promise<string | undefined> => ((await client.callTool({ name: 'whoami', arguments: {} })) as { content: Array<{ text: string }> }).content[0]?.text

  const plain = await refused(base.a, 'alice')
  t.equal(plain.code, -32014)
  const link = String((plain.data as Record<string, unknown>).authorizationUrl)
  t.match(link, `${base.b}/oauth/consent/`)
  const elicit = await refused(base.a, 'alice', { elicitation: { url: {} } })
  t.equal(elicit.code, -32042, 'a client that declared URL elicitation gets the URL elicitation error')
  t.match(elicit.data, { elicitations: [{ mode: 'url', url: link }] })

  const done = await browse(link.replace(base.b, base.a), 'alice')
  t.equal(done.status, 200)
  t.equal(done.url.origin, base.b, 'the callback landed on the other replica')
  t.equal(await whoami(await connect(base.a, 'alice')), 'alice')
  t.equal(await whoami(await connect(base.b, 'alice')), 'alice')

  const bobLink = String(((await refused(base.b, 'bob')).data as Record<string, unknown>).authorizationUrl)
  t.equal((await browse(bobLink, 'bob')).status, 200)
  const bob = await connect(base.a, 'bob')
  const alice = await connect(base.b, 'alice')
  t.same(await Promise.all([whoami(bob), whoami(alice), whoami(bob), whoami(alice)]), ['bob', 'alice', 'bob', 'alice'])
  t.ok(backend.seen.length > 0 && backend.seen.every(s => s.subject !== null), 'no request reached the backend without its user\'s token')
  t.equal(as.grants.filter(g => g === 'authorization_code').length, 2)
})
