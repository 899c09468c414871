// The aggregate catalogue's MCP Apps rules (docs/behaviour.md, "Aggregating servers"), as pure
// logic over members' lists: the members here are plain objects answering list requests (the
// integration test, test/integration/aggregate-apps.test.ts, runs the same rules through real
// servers and clients).
import { pino } from 'pino'
import t from 'tap'
import { AggregateCatalogue, type CatalogueMember } from '../../src/routing/aggregate/catalogue.js'
import type { GatewayMetrics } from '../../src/telemetry/metrics.js'

type Lists = Record<string, Array<Record<string, unknown>>>

type Member = CatalogueMember & { lists: Lists }

function catalogue (members: Array<{ server: string, prefix: string, lists: Lists }>): AggregateCatalogue<Member> {
  return new AggregateCatalogue<Member>({
    aggregate: 'agg',
    separator: '__',
    memberTimeoutMs: 1000,
    members: members.map((m): Member => ({ ...m, tools: undefined, down: null, info: { capabilities: { tools: {}, resources: {} } } })),
    fetch: async (member, method) => ({ [method === 'tools/list' ? 'tools' : method === 'resources/list' ? 'resources' : 'resourceTemplates']: member.lists[method] ?? [] }),
    toolPolicy: () => null,
    log: pino({ level: 'silent' }),
    metrics: { aggregateMemberLeftOut: () => {} } as unknown as GatewayMetrics
  })
}

const app = (name: string, visibility?: string[]): Record<string, unknown> => ({ name, _meta: { ui: { resourceUri: 'ui://v/index.html', ...(visibility !== undefined ? { visibility } : {}) } } })

t.test('ui:// URIs: shown with the member\'s prefix, resolved back to it listed or not; other schemes untouched', async t => {
  const c = catalogue([
    { server: 'a', prefix: 'a', lists: { 'tools/list': [app('show'), { name: 'old', _meta: { 'ui/resourceUri': 'ui://v/old.html' } }], 'resources/list': [{ uri: 'ui://v/index.html' }, { uri: 'file:///x' }], 'resources/templates/list': [{ uriTemplate: 'ui://v/{page}' }] } },
    { server: 'b', prefix: '', lists: { 'tools/list': [app('show')], 'resources/list': [{ uri: 'ui://v/index.html' }] } }
  ])
  const tools = (await c.page('tools', undefined))?.tools as Array<{ name: string, _meta: Record<string, unknown> }>
  t.same(tools.map(tool => [tool.name, tool._meta.ui ?? tool._meta['ui/resourceUri']]), [
    ['a__show', { resourceUri: 'ui://a__v/index.html' }],
    ['a__old', 'ui://a__v/old.html'],
    ['show', { resourceUri: 'ui://v/index.html' }]
  ])
  t.same(((await c.page('resources', undefined))?.resources as Array<{ uri: string }>).map(r => r.uri), ['ui://a__v/index.html', 'file:///x', 'ui://v/index.html'], 'both members\' same URI are two resources')
  t.same(((await c.page('resourceTemplates', undefined))?.resourceTemplates as Array<{ uriTemplate: string }>).map(r => r.uriTemplate), ['ui://a__v/{page}'])

  const at = async (uri: string): Promise<[string, string] | null> => { const hit = await c.byUri(uri); return hit === null ? null : [hit.member.server, hit.uri] }
  t.same(await at('ui://a__v/index.html'), ['a', 'ui://v/index.html'], 'listed')
  t.same(await at('ui://v/index.html'), ['b', 'ui://v/index.html'], 'the prefix-less member\'s own')
  t.same(await at('ui://a__v/page-2'), ['a', 'ui://v/page-2'], 'by the rewritten template')
  t.same(await at('ui://a__never/listed'), ['a', 'ui://never/listed'], 'unlisted: by prefix')
  t.same(await at('ui://other/x'), ['b', 'ui://other/x'], 'unlisted, no prefix: the prefix-less member')
  t.same(await at('file:///x'), ['a', 'file:///x'], 'other schemes as before')
  const a = (await c.byUri('ui://a__v/index.html'))?.member
  if (a === undefined) throw new Error('no member')
  t.same(c.exposeReadResult(a, { contents: [{ uri: 'ui://v/index.html', text: 'x' }, 'junk'] }), { contents: [{ uri: 'ui://a__v/index.html', text: 'x' }, 'junk'] }, 'a read\'s contents under the aggregate\'s URI')
})

t.test('an unlisted ui:// URI with only prefixed members and no prefix in it: not found', async t => {
  const c = catalogue([
    { server: 'a', prefix: 'a', lists: {} },
    { server: 'b', prefix: 'b', lists: {} }
  ])
  t.equal(await c.byUri('ui://v/index.html'), null)
  t.same((await c.byUri('ui://b__v/index.html'))?.member.server, 'b')
})

t.test('an app\'s call by its server\'s own tool name: the one member with that app-callable tool', async t => {
  const c = catalogue([
    { server: 'a', prefix: 'a', lists: { 'tools/list': [app('refresh', ['app']), app('only_a', ['app']), { name: 'plain' }, app('model_only', ['model'])] } },
    { server: 'b', prefix: 'b', lists: { 'tools/list': [app('refresh', ['app']), app('only_b')] } }
  ])
  const at = async (name: string): Promise<[string, string] | null> => { const hit = await c.byName('tools', name); return hit === null ? null : [hit.member.server, hit.name] }
  t.same(await at('b__refresh'), ['b', 'refresh'], 'exposed names first')
  t.same(await at('only_a'), ['a', 'only_a'], 'an app-only tool one member has')
  t.same(await at('only_b'), ['b', 'only_b'], 'visibility absent means model and app')
  t.equal(await at('refresh'), null, 'two members have it: refused')
  t.equal(await at('plain'), null, 'a tool without UI metadata is not an app\'s')
  t.equal(await at('model_only'), null, 'nor one an app may not call')
})
