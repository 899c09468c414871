// A dedicated stdio session with a per-user credential across replicas: two gateway processes on
// one real Redis, a client alternating between them, the replica running the child SIGKILLed. The
// survivor takes the session over and starts the child again with the SAME user's credential (the
// token the vault holds for (tenant, server, subject)), never another user's; no log line of either
// process carries a token or a client JWT.
import { randomBytes } from 'node:crypto'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { decodeJwt } from 'jose'
import t, { type Test } from 'tap'
import { sessionKeys } from '../../src/state/redis/keys.js'
import { stdioFixture } from '../helpers/gateway.js'
import { startIssuer, type TestIssuer } from '../helpers/jwks.js'
import { GATEWAY_CLIENT, startOAuthServer, TOKEN_EXCHANGE } from '../helpers/oauth-server.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { startReplica, type ReplicaProcess } from '../helpers/replicas.js'

const PUBLIC = 'https://gw.example.com'
const AUDIENCE = 'https://github.example/api'

interface User { client: Client, token: string, sid: () => string }

/** A client whose requests alternate between the replicas (a non-sticky load balancer). */
async function userOf (t: Test, users: TestIssuer, replicas: ReplicaProcess[], subject: string): Promise<User> {
  const token = await users.mint({ sub: subject })
  let next = 0
  const alternating = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const alive = replicas.filter(r => r.child.exitCode === null && r.child.signalCode === null)
    const target = alive[next++ % alive.length]!
    const url = new URL(String(input instanceof Request ? input.url : input))
    return await fetch(`${target.url}${url.pathname}${url.search}`, init)
  }
  const client = new Client({ name: `client-${subject}`, version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(`${replicas[0]!.url}/mcp/gh`), {
    fetch: alternating,
    requestInit: { headers: { authorization: `Bearer ${token}`, host: 'gw.example.com' } }
  })
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  return { client, token, sid: () => transport.sessionId ?? '' }
}

interface Seen { pid: number, token: string, sub: string | undefined }

async function credentialOf (user: User): Promise<Seen> {
  const result = await user.client.callTool({ name: 'credential', arguments: {} })
  const seen = JSON.parse((result as { content: Array<{ text: string }> }).content[0]?.text ?? '{}') as { pid: number, token: string }
  return { ...seen, sub: decodeJwt(seen.token).sub }
}

t.test('owner killed: the survivor restarts the child with the same user\'s credential', async t => {
  const users = await startIssuer(t, 'https://users.example', { aud: `${PUBLIC}/mcp/gh` })
  const as = await startOAuthServer(t, { keys: users.keys.map(k => k.jwk) }, users.issuer)
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  // Both replicas open what the other sealed: one key ring, from the environment they inherit.
  const before = process.env.MCPGW_VAULT_KEYS
  process.env.MCPGW_VAULT_KEYS = `k1:${randomBytes(32).toString('base64')}`
  t.teardown(() => { if (before === undefined) delete process.env.MCPGW_VAULT_KEYS; else process.env.MCPGW_VAULT_KEYS = before })
  const config = {
    redis: { url: redis.url, keyPrefix: prefix, connectTimeoutMs: 2000 },
    auth: { publicUrl: PUBLIC },
    tenants: { acme: { jwt: [{ issuer: users.issuer, jwksUri: users.jwksUri }], servers: { gh: {} } } },
    servers: {
      gh: stdioFixture('cred-env-server', ['GITHUB_TOKEN'], {
        credentials: { source: 'token-exchange', issuer: as.issuer, clientId: GATEWAY_CLIENT.id, clientSecret: GATEWAY_CLIENT.secret, audience: AUDIENCE, env: 'GITHUB_TOKEN', timeoutMs: 2000 }
      })
    }
  }
  const replicas = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config)))
  const alice = await userOf(t, users, replicas, 'alice')
  const bob = await userOf(t, users, replicas, 'bob')
  const first = { alice: await credentialOf(alice), bob: await credentialOf(bob) }
  t.equal(first.alice.sub, 'alice')
  t.equal(first.bob.sub, 'bob')
  // Calls alternate replicas: each is relayed to the owner, whose child keeps its token.
  for (let i = 0; i < 4; i++) t.same(await credentialOf(alice), first.alice, `call ${i}: alice's child, alice's token`)

  const inspect = await testRedis(t, redis.url)
  const ownerId = await inspect.get(sessionKeys(prefix, alice.sid()).owner)
  const owner = replicas.find(r => r.logs.some(l => l.replica === ownerId))
  if (owner === undefined) throw new Error(`no replica owns alice's session (owner ${String(ownerId)})`)
  const exchanges = as.grants.filter(g => g.grantType === TOKEN_EXCHANGE).length
  await owner.kill()

  const after = await credentialOf(alice)
  t.equal(after.sub, 'alice', 'the new child holds alice\'s credential')
  t.not(after.pid, first.alice.pid, 'a new child')
  t.equal(after.token, first.alice.token, 'the token the vault holds for alice, not a new grant')
  t.equal(as.grants.filter(g => g.grantType === TOKEN_EXCHANGE).length, exchanges, 'no exchange was needed')
  const bobAfter = await credentialOf(bob)
  t.equal(bobAfter.sub, 'bob', 'bob\'s session, on the survivor, still bob\'s')

  const logged = replicas.flatMap(r => r.logs).map(l => JSON.stringify(l)).join('\n')
  t.match(logged, 'took over a session', 'the survivor took a session over')
  for (const secret of [first.alice.token, first.bob.token, alice.token, bob.token]) t.notOk(logged.includes(secret), 'no token in either replica\'s log')
})
