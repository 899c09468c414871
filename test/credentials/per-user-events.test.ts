// A per-user pool's session-level events stay with its own user: a server whose credential is each
// user's own (token exchange through a real oidc-provider) runs a pooled stdio child per user (the
// full-server fixture); what alice's child announces (tools/list_changed, resources/updated) reaches
// alice's pooled session and her 2026-07-28 listen stream, never bob's, and bob's own events reach
// him. Shared pools' events reaching every session of a tenant: test/integration/pooled-sessions.test.ts.
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { ResourceUpdatedNotificationSchema, ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { startIssuer, type TestIssuer } from '../helpers/jwks.js'
import { MODERN_VERSION } from '../helpers/modern.js'
import { GATEWAY_CLIENT, startOAuthServer } from '../helpers/oauth-server.js'

const PUBLIC = 'https://gw.example.com'
/** Long enough for a misrouted event to have arrived (it would come right after the rightful one). */
const QUIET_MS = 700

interface Setup { users: TestIssuer, gw: RunningGateway }

async function setup (t: Test, server: Record<string, unknown>, path = 'full'): Promise<Setup> {
  const users = await startIssuer(t, 'https://users.example', { aud: `${PUBLIC}/mcp/${path}` })
  const as = await startOAuthServer(t, { keys: users.keys.map(k => k.jwk) }, users.issuer)
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC },
    tenants: { acme: { jwt: [{ issuer: users.issuer, jwksUri: users.jwksUri }], servers: { full: {}, agg: {} } } },
    servers: {
      full: stdioFixture('full-server', [], {
        credentials: { source: 'token-exchange', issuer: as.issuer, clientId: GATEWAY_CLIENT.id, clientSecret: GATEWAY_CLIENT.secret, audience: 'https://full.example/api', env: 'FULL_TOKEN', timeoutMs: 2000 },
        poolSize: 1,
        ...server
      }),
      agg: { transport: 'aggregate', members: [{ server: 'full' }] }
    }
  }, { vaultKeys: `k1:${randomBytes(32).toString('base64')}` })
  return { users, gw }
}

async function headersOf (s: Setup, subject: string): Promise<Record<string, string>> {
  return { authorization: `Bearer ${await s.users.mint({ sub: subject })}`, host: 'gw.example.com' }
}

interface Heard { listChanged: number, updated: string[] }

/**
 * Triggers an event until `heard` (a stream may open a moment after its client connected): more
 * of the same events only give a misrouting more chances to show.
 */
async function triggerUntil (what: string, trigger: () => Promise<unknown>, heard: () => boolean): Promise<void> {
  for (let attempt = 0; attempt < 10; attempt++) {
    await trigger()
    const deadline = Date.now() + 1000
    while (Date.now() < deadline) {
      if (heard()) return
      await sleep(50)
    }
  }
  throw new Error(`never heard: ${what}`)
}

t.test('pooled sessions: alice\'s child\'s list_changed and resources/updated reach alice\'s session only', async t => {
  const s = await setup(t, { sessions: 'pooled' })
  const open = async (subject: string): Promise<{ client: Client, heard: Heard }> => {
    const client = new Client({ name: `client-${subject}`, version: '1.0.0' })
    const heard: Heard = { listChanged: 0, updated: [] }
    client.setNotificationHandler(ToolListChangedNotificationSchema, () => { heard.listChanged++ })
    client.setNotificationHandler(ResourceUpdatedNotificationSchema, n => { heard.updated.push(n.params.uri) })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${s.gw.url}/mcp/full`), { requestInit: { headers: await headersOf(s, subject) } }))
    t.teardown(async () => { await client.close().catch(() => {}) })
    return { client, heard }
  }
  const alice = await open('alice')
  const bob = await open('bob')
  // Both subscribe to the same URI, each upstream on their own child.
  await alice.client.subscribeResource({ uri: 'test://counter' })
  await bob.client.subscribeResource({ uri: 'test://counter' })
  await sleep(300) // the GET streams are open

  await triggerUntil('alice hears her list_changed', async () => await alice.client.callTool({ name: 'add-tool', arguments: {} }), () => alice.heard.listChanged > 0)
  await triggerUntil('alice hears her resources/updated', async () => await alice.client.callTool({ name: 'touch-resource', arguments: { uri: 'test://counter' } }), () => alice.heard.updated.length > 0)
  await sleep(QUIET_MS)
  t.equal(bob.heard.listChanged, 0, 'bob does not hear alice\'s list_changed')
  t.same(bob.heard.updated, [], 'nor her resources/updated of the same URI')
  const aliceTools = (await alice.client.listTools()).tools.map(tool => tool.name)
  t.ok(aliceTools.some(name => name.startsWith('dynamic-tool-')), 'alice\'s list changed')
  t.notOk((await bob.client.listTools()).tools.some(tool => tool.name.startsWith('dynamic-tool-')), 'bob\'s did not')

  // Bob's own events reach bob, and not alice.
  const aliceHeard = { ...alice.heard, updated: [...alice.heard.updated] }
  await triggerUntil('bob hears his list_changed', async () => await bob.client.callTool({ name: 'add-tool', arguments: {} }), () => bob.heard.listChanged > 0)
  await triggerUntil('bob hears his resources/updated', async () => await bob.client.callTool({ name: 'touch-resource', arguments: { uri: 'test://counter' } }), () => bob.heard.updated.length > 0)
  await sleep(QUIET_MS)
  t.same(alice.heard, aliceHeard, 'alice hears nothing of bob\'s child')
})

t.test('2026-07-28 subscriptions/listen: alice\'s events reach her listen streams only', async t => {
  const s = await setup(t, {})
  const open = async (subject: string): Promise<{ client: ClientV2, heard: Heard, close: () => Promise<void> }> => {
    const client = new ClientV2({ name: `modern-${subject}`, version: '1' }, { versionNegotiation: { mode: { pin: MODERN_VERSION } } })
    const heard: Heard = { listChanged: 0, updated: [] }
    client.setNotificationHandler('notifications/tools/list_changed', () => { heard.listChanged++ })
    client.setNotificationHandler('notifications/resources/updated', n => { heard.updated.push((n as { params: { uri: string } }).params.uri) })
    await client.connect(new TransportV2(new URL(`${s.gw.url}/mcp/full`), { requestInit: { headers: await headersOf(s, subject) } }))
    t.teardown(async () => { await client.close().catch(() => {}) })
    const lists = await client.listen({ toolsListChanged: true })
    const resources = await client.listen({ resourceSubscriptions: ['test://counter'] })
    t.match(resources.honoredFilter, { resourceSubscriptions: ['test://counter'] }, `${subject}'s subscription is acknowledged`)
    return { client, heard, close: async () => { await lists.close(); await resources.close() } }
  }
  const alice = await open('alice')
  const bob = await open('bob')

  await triggerUntil('alice\'s stream hears her list_changed', async () => await alice.client.callTool({ name: 'add-tool', arguments: {} }), () => alice.heard.listChanged > 0)
  await triggerUntil('alice\'s stream hears her resources/updated', async () => await alice.client.callTool({ name: 'touch-resource', arguments: { uri: 'test://counter' } }), () => alice.heard.updated.length > 0)
  await sleep(QUIET_MS)
  t.equal(bob.heard.listChanged, 0, 'bob\'s stream does not hear alice\'s list_changed')
  t.same(bob.heard.updated, [], 'nor her resources/updated of the same URI')

  const aliceHeard = { ...alice.heard, updated: [...alice.heard.updated] }
  await triggerUntil('bob\'s stream hears his list_changed', async () => await bob.client.callTool({ name: 'add-tool', arguments: {} }), () => bob.heard.listChanged > 0)
  await triggerUntil('bob\'s stream hears his resources/updated', async () => await bob.client.callTool({ name: 'touch-resource', arguments: { uri: 'test://counter' } }), () => bob.heard.updated.length > 0)
  await sleep(QUIET_MS)
  t.same(alice.heard, aliceHeard, 'alice\'s streams hear nothing of bob\'s child')
  await alice.close()
  await bob.close()
})

t.test('aggregate sessions: a per-user pooled member\'s list_changed reaches its own user\'s aggregate session only', async t => {
  const s = await setup(t, { sessions: 'pooled' }, 'agg')
  const open = async (subject: string): Promise<{ client: Client, heard: Heard }> => {
    const client = new Client({ name: `agg-${subject}`, version: '1.0.0' })
    const heard: Heard = { listChanged: 0, updated: [] }
    client.setNotificationHandler(ToolListChangedNotificationSchema, () => { heard.listChanged++ })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${s.gw.url}/mcp/agg`), { requestInit: { headers: await headersOf(s, subject) } }))
    t.teardown(async () => { await client.close().catch(() => {}) })
    return { client, heard }
  }
  const alice = await open('alice')
  const bob = await open('bob')
  t.ok((await bob.client.listTools()).tools.some(tool => tool.name === 'full__add-tool'), 'the member\'s tools are listed')
  await triggerUntil('alice\'s aggregate session hears her member\'s list_changed', async () => await alice.client.callTool({ name: 'full__add-tool', arguments: {} }), () => alice.heard.listChanged > 0)
  await sleep(QUIET_MS)
  t.equal(bob.heard.listChanged, 0, 'bob\'s aggregate session does not')
  const aliceBefore = alice.heard.listChanged
  await triggerUntil('bob\'s aggregate session hears his member\'s list_changed', async () => await bob.client.callTool({ name: 'full__add-tool', arguments: {} }), () => bob.heard.listChanged > 0)
  await sleep(QUIET_MS)
  t.equal(alice.heard.listChanged, aliceBefore, 'alice\'s hears nothing of bob\'s child')
})
