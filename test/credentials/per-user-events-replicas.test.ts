// A per-user pool's events across replicas: two gateway processes on one real Redis, a per-user
// credential (token exchange through a real oidc-provider) in front of the full-server stdio
// fixture. Alice and bob hold 2026-07-28 listen streams on replica B; alice's call on replica A
// changes her child's tool list there. Her stream on B hears it (the listen topic, registered in
// the session store, names her subject), bob's does not.
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client'
import t from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { startIssuer } from '../helpers/jwks.js'
import { envelope, last, MODERN_VERSION, modernPost } from '../helpers/modern.js'
import { GATEWAY_CLIENT, startOAuthServer } from '../helpers/oauth-server.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica } from '../helpers/replicas.js'

const PUBLIC = 'https://gw.example.com'

t.test('alice\'s list_changed on replica A reaches her listen stream on replica B, not bob\'s', async t => {
  const users = await startIssuer(t, 'https://users.example', { aud: `${PUBLIC}/mcp/full` })
  const as = await startOAuthServer(t, { keys: users.keys.map(k => k.jwk) }, users.issuer)
  const redis = await startRedis(t)
  const before = process.env.MCPGW_VAULT_KEYS
  process.env.MCPGW_VAULT_KEYS = `k1:${randomBytes(32).toString('base64')}`
  t.teardown(() => { if (before === undefined) delete process.env.MCPGW_VAULT_KEYS; else process.env.MCPGW_VAULT_KEYS = before })
  const config = {
    redis: { url: redis.url, keyPrefix: randomPrefix(), connectTimeoutMs: 2000 },
    auth: { publicUrl: PUBLIC },
    tenants: { acme: { jwt: [{ issuer: users.issuer, jwksUri: users.jwksUri }], servers: { full: {} } } },
    servers: {
      full: stdioFixture('full-server', [], {
        credentials: { source: 'token-exchange', issuer: as.issuer, clientId: GATEWAY_CLIENT.id, clientSecret: GATEWAY_CLIENT.secret, audience: 'https://full.example/api', env: 'FULL_TOKEN', timeoutMs: 2000 },
        poolSize: 1
      })
    }
  }
  const [a, b] = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config)))
  if (a === undefined || b === undefined) throw new Error('no replicas')
  const headers = { alice: { authorization: `Bearer ${await users.mint({ sub: 'alice' })}`, host: 'gw.example.com' }, bob: { authorization: `Bearer ${await users.mint({ sub: 'bob' })}`, host: 'gw.example.com' } }
  const heard = { alice: 0, bob: 0 }
  for (const who of ['alice', 'bob'] as const) {
    const client = new ClientV2({ name: `modern-${who}`, version: '1' }, { versionNegotiation: { mode: { pin: MODERN_VERSION } } })
    client.setNotificationHandler('notifications/tools/list_changed', () => { heard[who]++ })
    await client.connect(new TransportV2(new URL(`${b.url}/mcp/full`), { requestInit: { headers: headers[who] } }))
    t.teardown(async () => { await client.close().catch(() => {}) })
    const listen = await client.listen({ toolsListChanged: true })
    t.match(listen.honoredFilter, { toolsListChanged: true }, `${who}'s listen stream on B is acknowledged`)
  }
  let id = 0
  const addTool = async (who: 'alice' | 'bob'): Promise<void> => {
    const answer = await modernPost(`${a.url}/mcp/full`, 'tools/call', { name: 'add-tool', arguments: {}, _meta: envelope() }, ++id, headers[who])
    if (last(answer).result === undefined) throw new Error(`add-tool failed: ${JSON.stringify(last(answer))}`)
  }
  // A's first add-tool for a subject opens that subject's child there (its list becomes the baseline
  // before the tool is added): retried until heard, as registration and the first list may lag.
  for (let attempt = 0; attempt < 10 && heard.alice === 0; attempt++) {
    await addTool('alice')
    for (let i = 0; i < 20 && heard.alice === 0; i++) await sleep(50)
  }
  t.ok(heard.alice > 0, 'alice\'s stream on B hears the change of her child on A')
  await sleep(700)
  t.equal(heard.bob, 0, 'bob\'s stream on B does not')
  const aliceBefore = heard.alice
  for (let attempt = 0; attempt < 10 && heard.bob === 0; attempt++) {
    await addTool('bob')
    for (let i = 0; i < 20 && heard.bob === 0; i++) await sleep(50)
  }
  t.ok(heard.bob > 0, 'bob\'s stream on B hears his own child\'s change on A')
  await sleep(700)
  t.equal(heard.alice, aliceBefore, 'alice\'s stream hears nothing of bob\'s')
})
