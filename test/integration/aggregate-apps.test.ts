// MCP Apps (`io.modelcontextprotocol/ui`) through an aggregate: two members that both
// serve `ui://shared/view.html` (unlisted) and name it in their tools' `_meta.ui.resourceUri`.
// Real stdio servers (test/fixtures/apps-server.ts), real SDK clients (v1 with a session, v2 pinned
// to 2026-07-28) over real sockets. Rules: docs/behaviour.md, "Aggregating servers", MCP Apps.
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { textOf } from '../helpers/wait.js'

interface Readable { readResource: (p: { uri: string }) => Promise<{ contents: Array<{ uri: string, text?: string }> }> }

async function connect (t: Test, gw: RunningGateway, server: string): Promise<Client> {
  const client = new Client({ name: 'apps-test', version: '1' }, { capabilities: {} })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/${server}`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

async function errorOf (p: Promise<unknown>): Promise<{ code?: number, message?: string } | null> {
  try { await p; return null } catch (err) { return err as { code?: number } }
}

/** What a read shows: [uri in the contents, the text (which copy answered, and the URI it was asked)]. */
async function read (client: Readable, uri: string): Promise<[string | undefined, string | undefined]> {
  const { contents } = await client.readResource({ uri })
  return [contents[0]?.uri, contents[0]?.text]
}

const servers = {
  a: stdioFixture('apps-server', ['a']),
  b: stdioFixture('apps-server', ['b']),
  // A loaded machine may take seconds to start a child: not the point here.
  agg: { transport: 'aggregate', members: [{ server: 'a' }, { server: 'b' }], memberTimeoutMs: 30_000 },
  flat: { transport: 'aggregate', members: [{ server: 'a', prefix: '' }, { server: 'b' }], memberTimeoutMs: 30_000 }
}

t.test('ui:// resources resolve to their own member: rewritten in lists, routed back, read under the aggregate\'s URI', async t => {
  const gw = await startGateway(t, { servers })
  const client = await connect(t, gw, 'agg')
  const tools = new Map((await client.listTools()).tools.map(tool => [tool.name, tool._meta]))
  t.match(tools.get('a__show'), { ui: { resourceUri: 'ui://a__shared/view.html' } }, 'a tool\'s UI resource carries its member\'s prefix')
  t.match(tools.get('b__show'), { ui: { resourceUri: 'ui://b__shared/view.html' } }, 'the same URI of the other member is another URI')
  t.match(tools.get('b__refresh'), { ui: { resourceUri: 'ui://b__shared/view.html', visibility: ['app'] } }, 'visibility passes through (the host applies it)')
  t.match(tools.get('a__legacy'), { 'ui/resourceUri': 'ui://a__a/old.html' }, 'the older flat key too')

  t.same(await read(client, 'ui://a__shared/view.html'), ['ui://a__shared/view.html', '<!doctype html><p>a ui://shared/view.html</p>'], 'the tool\'s resourceUri reads member a\'s view, asked under its own URI, shown under the aggregate\'s')
  t.same(await read(client, 'ui://b__shared/view.html'), ['ui://b__shared/view.html', '<!doctype html><p>b ui://shared/view.html</p>'], 'and member b\'s')
  t.same(await read(client, 'ui://b__b/never-listed.html'), ['ui://b__b/never-listed.html', '<!doctype html><p>b ui://b/never-listed.html</p>'], 'an unlisted ui:// URI of b resolves to b (two members have resources)')

  const listed = (await client.listResources()).resources.map(r => r.uri)
  t.same(listed.sort(), ['ui://a__shared/listed.html', 'ui://b__shared/listed.html'], 'listed ui:// resources are rewritten the same way: both stay reachable')
  t.same(await read(client, 'ui://b__shared/listed.html'), ['ui://b__shared/listed.html', '<!doctype html><p>b ui://shared/listed.html</p>'])

  t.equal((await errorOf(client.readResource({ uri: 'ui://shared/view.html' })))?.code, -32002, 'a ui:// URI no member\'s prefix names, with no prefix-less member: not found, never a guess')
})

t.test('an app calls its tools by its server\'s own names: routed to the one member that has that app-callable tool', async t => {
  const gw = await startGateway(t, { servers })
  const client = await connect(t, gw, 'agg')
  t.equal(textOf(await client.callTool({ name: 'b__refresh', arguments: {} })), 'b:refresh', 'the exposed name')
  t.equal(textOf(await client.callTool({ name: 'refresh_b', arguments: {} })), 'b:refresh_b', 'b\'s own name of an app-only tool only b has reaches b')
  t.equal(textOf(await client.callTool({ name: 'refresh_a', arguments: {} })), 'a:refresh_a')
  const both = await errorOf(client.callTool({ name: 'refresh', arguments: {} }))
  t.match(both, { code: -32602, message: /Unknown tool: refresh/ }, 'an own name two members have is refused: the gateway cannot tell whose app called')
  t.match(await errorOf(client.callTool({ name: 'nothing', arguments: {} })), { code: -32602 }, 'and a name no member has')
})

t.test('a member with prefix "" keeps its ui:// URIs; the other\'s are rewritten; an unprefixed unlisted ui:// is the prefix-less member\'s', async t => {
  const gw = await startGateway(t, { servers })
  const client = await connect(t, gw, 'flat')
  const tools = new Map((await client.listTools()).tools.map(tool => [tool.name, tool._meta]))
  t.match(tools.get('show'), { ui: { resourceUri: 'ui://shared/view.html' } })
  t.match(tools.get('b__show'), { ui: { resourceUri: 'ui://b__shared/view.html' } })
  t.same(await read(client, 'ui://shared/view.html'), ['ui://shared/view.html', '<!doctype html><p>a ui://shared/view.html</p>'])
  t.same(await read(client, 'ui://b__shared/view.html'), ['ui://b__shared/view.html', '<!doctype html><p>b ui://shared/view.html</p>'])
  t.same(await read(client, 'ui://elsewhere/x.html'), ['ui://elsewhere/x.html', '<!doctype html><p>a ui://elsewhere/x.html</p>'])
})

t.test('2026-07-28 requests to an aggregate: the same URIs, read through the members\' pools', async t => {
  const gw = await startGateway(t, { servers })
  const client = new ClientV2({ name: 'apps-modern', version: '1' }, { capabilities: {}, versionNegotiation: { mode: { pin: '2026-07-28' } } })
  await client.connect(new TransportV2(new URL(`${gw.url}/mcp/agg`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  const tools = new Map((await client.listTools()).tools.map(tool => [tool.name, tool._meta]))
  t.match(tools.get('b__show'), { ui: { resourceUri: 'ui://b__shared/view.html' } })
  t.same(await read(client as unknown as Readable, 'ui://b__shared/view.html'), ['ui://b__shared/view.html', '<!doctype html><p>b ui://shared/view.html</p>'])
  t.same(await read(client as unknown as Readable, 'ui://a__a/never-listed.html'), ['ui://a__a/never-listed.html', '<!doctype html><p>a ui://a/never-listed.html</p>'], 'unlisted, by prefix')
  t.equal(textOf(await client.callTool({ name: 'refresh_b', arguments: {} })), 'b:refresh_b', 'an app\'s own name')
  t.match(await errorOf(client.readResource({ uri: 'ui://shared/view.html' })), { code: -32602 }, 'not found (this era\'s code)')
  t.match(await errorOf(client.readResource({ uri: 'ui://b__b/missing' })), { code: -32602 }, 'a member\'s own refusal of a rewritten URI comes back as its error')
})
