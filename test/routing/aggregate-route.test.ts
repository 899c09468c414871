// The one routing decision of aggregate sessions and 2026-07-28 requests (routing/aggregate/route.ts),
// over a catalogue of plain members: which member serves a request and under which of its own
// names, what the merged lists answer, and the errors. The integration tests
// (test/integration/aggregate*.test.ts) run it through real servers and clients.
import { pino } from 'pino'
import t from 'tap'
import { AggregateCatalogue, type CatalogueMember } from '../../src/routing/aggregate/catalogue.js'
import { routeRequest, type AggregateRoute } from '../../src/routing/aggregate/route.js'
import type { GatewayMetrics } from '../../src/telemetry/metrics.js'

type Member = CatalogueMember & { lists: Record<string, Array<Record<string, unknown>>> }

const LIST_KEY: Record<string, string> = { 'tools/list': 'tools', 'prompts/list': 'prompts', 'resources/list': 'resources', 'resources/templates/list': 'resourceTemplates' }

const members: Member[] = [
  {
    server: 'a',
    prefix: 'a',
    tools: undefined,
    down: null,
    info: { capabilities: { tools: {}, prompts: {}, resources: {} } },
    lists: { 'tools/list': [{ name: 'echo' }], 'prompts/list': [{ name: 'greet' }], 'resources/list': [{ uri: 'ui://v/index.html' }, { uri: 'file:///a' }] }
  },
  { server: 'b', prefix: '', tools: undefined, down: null, info: { capabilities: { tools: {} } }, lists: { 'tools/list': [{ name: 'search' }] } }
]

const catalogueOf = (members: Member[]): AggregateCatalogue<Member> => new AggregateCatalogue<Member>({
  aggregate: 'agg',
  separator: '__',
  memberTimeoutMs: 1000,
  members,
  fetch: async (member, method) => ({ [LIST_KEY[method] ?? method]: member.lists[method] ?? [] }),
  toolPolicy: () => null,
  log: pino({ level: 'silent' }),
  metrics: { aggregateMemberLeftOut: () => {} } as unknown as GatewayMetrics
})
const catalogue = catalogueOf(members)

/** A route with its member shown by server name. */
const routed = async (method: string, params: Record<string, unknown>, subscriptions = true): Promise<unknown> => {
  const route: AggregateRoute<Member> = await routeRequest(catalogue, method, params, { subscriptions })
  return route.to === 'member' ? { ...route, member: route.member.server } : route
}

t.test('lists: a page of the merged list; an unknown cursor is invalid params', async t => {
  t.match(await routed('tools/list', {}), { to: 'list', kind: 'tools', page: { tools: [{ name: 'a__echo' }, { name: 'search' }] } })
  t.same(await routed('prompts/list', { cursor: 'nope' }), { to: 'error', code: -32602, message: 'Invalid params: unknown cursor' })
})

t.test('calls and prompts: to their member under its own name; the tool label is the exposed name', async t => {
  t.same(await routed('tools/call', { name: 'a__echo', arguments: { x: 1 } }), { to: 'member', member: 'a', params: { name: 'echo', arguments: { x: 1 } }, tool: 'a__echo', read: undefined })
  t.same(await routed('tools/call', { name: 'search' }), { to: 'member', member: 'b', params: { name: 'search' }, tool: 'search', read: undefined })
  t.same(await routed('prompts/get', { name: 'a__greet' }), { to: 'member', member: 'a', params: { name: 'greet' }, tool: undefined, read: undefined })
  t.same(await routed('tools/call', { name: 7 }), { to: 'error', code: -32602, message: 'Invalid params: name must be a string' })
  const prefixedOnly = await routeRequest(catalogueOf(members.slice(0, 1)), 'tools/call', { name: 'unlisted' }, { subscriptions: true })
  t.same(prefixedOnly, { to: 'error', code: -32602, message: 'Unknown tool: unlisted' }, 'no member has it, and none passes names through')
  t.same(await routed('prompts/get', { name: 'unlisted' }), { to: 'member', member: 'b', params: { name: 'unlisted' }, tool: undefined, read: undefined }, 'a name no one listed: the member whose names pass through')
})

t.test('resources: reads under the member\'s own URI, renamed or not; subscriptions only where a session has them', async t => {
  t.same(await routed('resources/read', { uri: 'ui://a__v/index.html' }), { to: 'member', member: 'a', params: { uri: 'ui://v/index.html' }, tool: undefined, read: { renamed: true } })
  t.same(await routed('resources/read', { uri: 'file:///a' }), { to: 'member', member: 'a', params: { uri: 'file:///a' }, tool: undefined, read: { renamed: false } })
  t.same(await routed('resources/subscribe', { uri: 'file:///a' }), { to: 'member', member: 'a', params: { uri: 'file:///a' }, tool: undefined, read: undefined })
  t.same(await routed('resources/subscribe', { uri: 'file:///a' }, false), { to: 'error', code: -32601, message: 'Method not found: resources/subscribe' })
  t.same(await routed('resources/read', {}), { to: 'error', code: -32602, message: 'Invalid params: uri must be a string' })
})

t.test('completions go where their ref points; other methods are not found', async t => {
  t.same(await routed('completion/complete', { ref: { type: 'ref/prompt', name: 'a__greet' }, argument: { name: 'n', value: '' } }),
    { to: 'member', member: 'a', params: { ref: { type: 'ref/prompt', name: 'greet' }, argument: { name: 'n', value: '' } }, tool: undefined, read: undefined })
  t.same(await routed('completion/complete', { ref: { type: 'ref/resource', uri: 'ui://a__v/index.html' } }),
    { to: 'member', member: 'a', params: { ref: { type: 'ref/resource', uri: 'ui://v/index.html' } }, tool: undefined, read: undefined })
  t.same(await routed('completion/complete', { ref: {} }), { to: 'error', code: -32602, message: 'Invalid params: ref must name a prompt or a resource' })
  t.same(await routed('initialize', {}), { to: 'error', code: -32601, message: 'Method not found: initialize' })
})
