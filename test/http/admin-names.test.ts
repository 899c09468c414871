// Server and tenant names the schema accepts that are also properties every object
// inherits (`constructor`, `toString`, `valueOf`, `hasOwnProperty`) must work like any other name,
// through the MCP endpoints and the admin API (read as plain keys they would give a 500 on the
// overview, and counts like "0function toString() …"). `__proto__` is not a name the schema accepts.
import { randomBytes } from 'node:crypto'
import t from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { bearer, callTool, newKey, openSession, PUBLIC_URL } from '../helpers/auth.js'
import { eventually } from '../helpers/wait.js'

const NAMES = ['constructor', 'toString', 'valueOf', 'hasOwnProperty']
const TOKEN = randomBytes(24).toString('base64url')

t.test('servers and tenants named after inherited properties: MCP endpoints and the admin API', async t => {
  const keys = Object.fromEntries(NAMES.map(name => [name, newKey(`${name}-bot`)]))
  const servers = Object.fromEntries(NAMES.map(name => [name, stdioFixture('full-server')]))
  // Tenant `constructor` may use server `toString`, and so on round the list.
  const tenants = Object.fromEntries(NAMES.map((name, i) => [name, { apiKeys: [keys[name]!.entry], servers: { [NAMES[(i + 1) % NAMES.length]!]: {} } }]))
  const gw = await startGateway(t, { admin: { token: TOKEN }, auth: { publicUrl: PUBLIC_URL }, tenants, servers })
  const admin = async (path: string): Promise<Record<string, unknown>> => {
    const res = await fetch(`${gw.url}/admin/api/${path}`, { headers: bearer(TOKEN) })
    t.equal(res.status, 200, `/admin/api/${path}`)
    return await res.json() as Record<string, unknown>
  }
  // Before any traffic: no replica's summary has an entry of its own for these names.
  const idle = await admin('overview') as { servers: Array<Record<string, unknown>>, tenants: Array<Record<string, unknown>> }
  t.same(idle.servers.map(s => [s.name, s.sessions, s.children, s.callsPerMinute]).sort(), NAMES.map(name => [name, 0, 0, 0]).sort(), 'idle servers: zero counts, numbers')
  t.same(idle.tenants.map(x => [x.name, x.sessions, x.callsPerMinute]).sort(), NAMES.map(name => [name, 0, 0]).sort(), 'idle tenants: zero counts, numbers')
  for (const [i, tenant] of NAMES.entries()) {
    const server = NAMES[(i + 1) % NAMES.length]!
    const credential = { 'x-api-key': keys[tenant]!.key }
    const session = await openSession(gw.url, server, credential)
    const call = await callTool(gw.url, server, credential, session, 'echo', { text: 'hi' })
    t.match(call.message, { result: { content: [{ text: /hi/ }] } }, `tenant ${tenant} calls a tool of server ${server}`)
    const other = NAMES[(i + 2) % NAMES.length]!
    const refused = await fetch(`${gw.url}/mcp/${other}`, { method: 'POST', headers: { ...credential, 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: '{}' })
    t.equal(refused.status, 403, `tenant ${tenant} may not use server ${other}`)
  }
  const overview = await eventually('every session counted', async () => {
    const body = await admin('overview') as { servers: Array<Record<string, unknown>>, tenants: Array<Record<string, unknown>> }
    return body.servers.every(s => s.sessions === 1) ? body : undefined
  })
  t.same(overview.servers.map(s => s.name).sort(), [...NAMES].sort(), 'every server listed')
  for (const s of overview.servers) {
    t.equal(s.sessions, 1, `server ${String(s.name)}: one session, a number`)
    t.equal(typeof s.children, 'number')
    t.equal(typeof s.callsPerMinute, 'number')
  }
  t.same(overview.tenants.map(x => x.name).sort(), [...NAMES].sort(), 'every tenant listed')
  for (const x of overview.tenants) {
    t.equal(x.sessions, 1, `tenant ${String(x.name)}: one session`)
    t.equal(typeof x.callsPerMinute, 'number')
  }
  t.equal(((await admin('servers')).servers as unknown[]).length, NAMES.length)
  t.equal(((await admin('tenants')).tenants as unknown[]).length, NAMES.length)
  const sessions = await admin('sessions?tenant=toString') as { sessions: Array<{ server: string }> }
  t.same(sessions.sessions.map(s => s.server), ['valueOf'], 'the sessions of tenant toString')
})

t.test('a name nobody configured is no server, however objects are built', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  for (const name of NAMES) {
    const res = await fetch(`${gw.url}/mcp/${name}`, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'x', version: '1' } } }) })
    t.equal(res.status, 404, `/mcp/${name}: 404`)
  }
})

t.test('__proto__ is refused as a server or tenant name, with a clear message', async t => {
  const server = stdioFixture('full-server')
  t.throws(() => parseConfig(JSON.parse(`{ "servers": { "__proto__": ${JSON.stringify(server)} } }`)), /\/servers\/__proto__: is not a valid name: a letter or digit/)
  const key = newKey('k')
  t.throws(() => parseConfig(JSON.parse(`{ "auth": { "publicUrl": "${PUBLIC_URL}" }, "servers": { "full": ${JSON.stringify(server)} }, "tenants": { "__proto__": { "apiKeys": [${JSON.stringify(key.entry)}], "servers": { "full": {} } } } }`)), /\/tenants\/__proto__: is not a valid name/)
})
