// docs/grafana/mcp-gateway.json imports as is, and every metric it queries is one a
// running gateway serves: a renamed or removed metric fails here, not on an operator's screen.
import { readFile } from 'node:fs/promises'
import t from 'tap'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { openSession, callTool } from '../helpers/auth.js'

interface Panel { id: number, type: string, title: string, gridPos: { x: number, y: number, w: number, h: number }, targets?: Array<{ expr: string, refId: string, datasource: { uid: string } }> }
interface Dashboard { title: string, uid: string, schemaVersion: number, panels: Panel[], templating: { list: Array<{ name: string, type: string }> }, __inputs?: unknown[] }

const FILE = new URL('../../../docs/grafana/mcp-gateway.json', import.meta.url)

t.test('the Grafana dashboard queries only metrics the gateway serves', async t => {
  const dashboard = JSON.parse(await readFile(FILE, 'utf8')) as Dashboard
  t.equal(dashboard.uid, 'mcp-gateway')
  t.ok(dashboard.schemaVersion >= 36, 'a current dashboard schema')
  const variables = dashboard.templating.list.map(v => v.name)
  t.ok(variables.includes('datasource') && variables.includes('server'), 'a data source and a server variable')
  const ids = dashboard.panels.map(p => p.id)
  t.equal(new Set(ids).size, ids.length, 'panel ids are unique')
  const queries = dashboard.panels.flatMap(p => p.targets ?? [])
  t.ok(queries.length >= 20, `${queries.length} queries`)
  for (const p of dashboard.panels) {
    t.ok(p.gridPos.w > 0 && p.gridPos.x + p.gridPos.w <= 24, `${p.title}: inside the 24-column grid`)
    if (p.type !== 'row') t.ok((p.targets ?? []).length > 0, `${p.title}: has a query`)
  }
  t.ok(queries.every(q => q.datasource.uid === '${datasource}'), 'every query uses the chosen data source')

  // A gateway with some traffic, so the histograms have series too.
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const session = await openSession(gw.url, 'full', {})
  await callTool(gw.url, 'full', {}, session, 'echo', { text: 'x' })
  const text = await (await fetch(`${gw.url}/metrics`)).text()
  const served = new Set([...text.matchAll(/^# TYPE (\S+) /gm)].map(m => m[1]))
  const referenced = new Set(queries.flatMap(q => [...q.expr.replace(/\bby \([^)]*\)/g, '').matchAll(/\b(mcp_[a-z_]+|mcpgw_[a-z_]+)\b/g)].map(m => (m[1] ?? '').replace(/_(bucket|count|sum)$/, ''))))
  t.ok(referenced.size >= 15, `${referenced.size} metrics referenced`)
  for (const name of referenced) t.ok(served.has(name), `${name} is served`)
  t.ok(referenced.has('mcp_server_operation_duration_seconds'), 'the MCP semconv operation histogram is charted')
})
