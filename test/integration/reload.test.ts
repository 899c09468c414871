// Live reload (docs/configuration.md), on gateway processes with live SDK sessions: the config file
// is rewritten and the process told (SIGHUP, or its file watch). Added servers are served at once,
// a removed server's sessions end (404), an unchanged server's sessions keep their backend child, a
// changed server's open sessions keep their settings while new ones get the new settings, and a bad
// file is refused with every problem logged while the old config keeps serving.
import { createHash } from 'node:crypto'
import { rename, writeFile } from 'node:fs/promises'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import t, { type Test } from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { startReplica, type ReplicaProcess } from '../helpers/replicas.js'
import { SseReader } from '../helpers/sse-client.js'
import { eventually, textOf } from '../helpers/wait.js'

// startReplica's own base settings: written again on every rewrite, so only what a test changes differs.
const BASE = { listen: { host: '127.0.0.1', port: 0 }, log: { level: 'info', flushMs: 0 }, shutdown: { drainMs: 0 } }

/** A full-server whose environment carries one marker variable (visible through its `env` tool). */
const marked = (mark: string): Record<string, unknown> => stdioFixture('full-server', [], { env: { [`RELOAD_MARK_${mark}`]: '1' } })

async function rewrite (replica: ReplicaProcess, config: Record<string, unknown>): Promise<void> {
  await writeFile(replica.file, JSON.stringify({ ...BASE, ...config }))
}

/** Waits for the next log line with this message after `from` entries. */
async function logged (replica: ReplicaProcess, from: number, msg: string): Promise<Record<string, unknown>> {
  return await eventually(`log "${msg}"`, () => replica.logs.slice(from).find(e => e.msg === msg))
}

/** Sends SIGHUP and waits for the reload's outcome line. */
async function sighup (replica: ReplicaProcess): Promise<Record<string, unknown>> {
  const from = replica.logs.length
  replica.child.kill('SIGHUP')
  return await eventually('reload outcome', () => replica.logs.slice(from).find(e =>
    typeof e.msg === 'string' && /^config reload(ed| refused)/.test(e.msg)))
}

interface Session { client: Client, transport: StreamableHTTPClientTransport }

async function connect (t: Test, url: string, server: string): Promise<Session> {
  const client = new Client({ name: 'reload-test', version: '1' })
  const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp/${server}`))
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  return { client, transport }
}

const call = async (s: Session, name: string, args: Record<string, unknown> = {}): Promise<string> =>
  textOf(await s.client.callTool({ name, arguments: args }))

const marks = async (s: Session): Promise<string[]> =>
  (JSON.parse(await call(s, 'env')) as string[]).filter(name => name.startsWith('RELOAD_MARK_'))

/** One tools/call on a session, raw, so the HTTP status is visible. */
async function rawCall (url: string, server: string, sid: string): Promise<Response> {
  return await fetch(`${url}/mcp/${server}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x' } } })
  })
}

t.test('SIGHUP: servers added, removed, changed and unchanged, with sessions open', async t => {
  const replica = await startReplica(t, 'hup', { servers: { keep: stdioFixture('full-server'), change: marked('OLD'), gone: stdioFixture('full-server') } })
  const keep = await connect(t, replica.url, 'keep')
  const change = await connect(t, replica.url, 'change')
  const gone = await connect(t, replica.url, 'gone')
  const keepPid = await call(keep, 'pid')
  const gonePid = Number(await call(gone, 'pid'))
  t.same(await marks(change), ['RELOAD_MARK_OLD'])
  const goneSid = gone.transport.sessionId ?? ''
  t.ok(goneSid !== '', 'the removed server had a session')
  // And a legacy HTTP+SSE session, whose one stream must end with it.
  const legacyAbort = new AbortController()
  t.teardown(() => { legacyAbort.abort() })
  const legacy = new SseReader(await fetch(`${replica.url}/sse/gone`, { headers: { accept: 'text/event-stream' }, signal: legacyAbort.signal }))
  const endpoint = (await legacy.until(events => events.some(e => e.event === 'endpoint'))).find(e => e.event === 'endpoint')?.data ?? ''

  await rewrite(replica, { servers: { keep: stdioFixture('full-server'), change: marked('NEW'), fresh: stdioFixture('full-server') } })
  const from = replica.logs.length
  const outcome = await sighup(replica)
  t.match(outcome, { msg: 'config reloaded', trigger: 'SIGHUP' })
  t.same(outcome.servers, { added: ['fresh'], changed: ['change'], removed: ['gone'] }, 'the diff: added, changed (env), removed; keep is unchanged')
  t.match(await logged(replica, from, 'sessions of removed servers ended'), { servers: ['gone'], sessions: 2 })

  // Added: served at once.
  const fresh = await connect(t, replica.url, 'fresh')
  t.equal(await call(fresh, 'echo', { text: 'hi' }), 'hi', 'the added server answers')

  // Removed: the session's next request is 404, its child is stopped, and the endpoint is gone.
  const res = await rawCall(replica.url, 'gone', goneSid)
  t.equal(res.status, 404, 'the removed server\'s session gets 404')
  t.match(await res.json(), { error: { code: -32000 } })
  await eventually('the removed server\'s child exits', () => {
    try { process.kill(gonePid, 0); return undefined } catch { return true }
  })
  await legacy.finished
  t.ok(legacy.done, 'the legacy session\'s SSE stream was ended by the gateway')
  const legacyPost = await fetch(new URL(endpoint, replica.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' })
  })
  t.equal(legacyPost.status, 404, 'and its message endpoint answers 404')
  await legacyPost.body?.cancel()
  const init = await fetch(`${replica.url}/mcp/gone`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'x', version: '1' } } })
  })
  t.equal(init.status, 404, 'no new session on a removed server')
  await init.body?.cancel()

  // Unchanged: the same session on the same child.
  t.equal(await call(keep, 'pid'), keepPid, 'the unchanged server\'s session kept its child')
  t.equal(await call(keep, 'echo', { text: 'still' }), 'still')

  // Changed: the open session keeps its settings; a new one gets the new ones.
  t.same(await marks(change), ['RELOAD_MARK_OLD'], 'the open session of the changed server keeps its settings')
  const changed = await connect(t, replica.url, 'change')
  t.same(await marks(changed), ['RELOAD_MARK_NEW'], 'a new session of the changed server gets the new settings')

  // A bad file: refused, every problem logged, the running config goes on.
  await writeFile(replica.file, JSON.stringify({ ...BASE, servers: { keep: { transport: 'stdio' }, other: { transport: 'carrier-pigeon' } }, sessions: { idleTimeoutMs: 5 } }))
  const refused = await sighup(replica)
  t.equal(refused.msg, 'config reload refused; the running config stays')
  const errors = refused.errors as string[]
  for (const path of ['/servers/keep/command', '/servers/other/transport', '/sessions/idleTimeoutMs']) {
    t.ok(errors.some(line => line.startsWith(path)), `the refusal names ${path}`)
  }
  t.equal(await call(keep, 'pid'), keepPid, 'after a refused reload, the session still runs on its child')
  t.equal(await call(fresh, 'echo', { text: 'on' }), 'on', 'the servers of the running config still answer')
  t.ok((await connect(t, replica.url, 'fresh')).transport.sessionId, 'and take new sessions')

  // Not even valid YAML/JSON: refused the same way.
  await writeFile(replica.file, '{ "servers": ')
  t.match(await sighup(replica), { msg: 'config reload refused; the running config stays', errors: [/not valid JSON/] })
  t.equal(await call(keep, 'echo', { text: 'alive' }), 'alive')
})

t.test('SIGHUP: a server whose sessions change kind (dedicated to pooled and back) ends its open sessions (404), new ones are of the new kind', async t => {
  const pooled = (): Record<string, unknown> => stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1 })
  const replica = await startReplica(t, 'kinds', { servers: { toPooled: stdioFixture('full-server'), toDedicated: pooled() } })
  const a = await connect(t, replica.url, 'toPooled')
  const b = await connect(t, replica.url, 'toDedicated')
  const dedicatedPid = Number(await call(a, 'pid'))
  t.equal(await call(b, 'echo', { text: 'pooled' }), 'pooled')
  const aSid = a.transport.sessionId ?? ''
  const bSid = b.transport.sessionId ?? ''

  await rewrite(replica, { servers: { toPooled: pooled(), toDedicated: stdioFixture('full-server') } })
  const from = replica.logs.length
  const outcome = await sighup(replica)
  t.equal(outcome.msg, 'config reloaded')
  t.same([...(outcome.servers as { changed: string[] }).changed].sort(), ['toDedicated', 'toPooled'], 'both servers changed')

  const aRes = await rawCall(replica.url, 'toPooled', aSid)
  t.equal(aRes.status, 404, 'the dedicated session of a server made pooled gets 404')
  await aRes.body?.cancel()
  const bRes = await rawCall(replica.url, 'toDedicated', bSid)
  t.equal(bRes.status, 404, 'the pooled session of a server made dedicated gets 404, not a takeover on a child it never had')
  await bRes.body?.cancel()
  const ended = replica.logs.slice(from).filter(e => typeof e.reason === 'string' && e.reason.startsWith("a reload changed the server's sessions"))
  t.ok(ended.length >= 2, `each ended with the reason logged (${ended.map(e => String(e.reason)).join('; ')})`)
  await eventually('the dedicated child of the ended session exits', () => {
    try { process.kill(dedicatedPid, 0); return undefined } catch { return true }
  })

  const a2 = await connect(t, replica.url, 'toPooled')
  const b2 = await connect(t, replica.url, 'toDedicated')
  t.equal(await call(a2, 'echo', { text: 'now pooled' }), 'now pooled', 'a new session of the new kind works')
  t.equal(await call(b2, 'echo', { text: 'now dedicated' }), 'now dedicated')
  t.not(Number(await call(a2, 'pid')), dedicatedPid)
})

t.test('SIGHUP: a process setting is not applied and is reported as needing a restart', async t => {
  const replica = await startReplica(t, 'process', { servers: { a: stdioFixture('full-server') } })
  await writeFile(replica.file, JSON.stringify({ ...BASE, log: { level: 'debug' }, http: { retryMs: 5 }, servers: { a: stdioFixture('full-server'), b: stdioFixture('full-server') } }))
  const from = replica.logs.length
  const outcome = await sighup(replica)
  t.match(outcome, { msg: 'config reloaded', servers: { added: ['b'] } }, 'the routing part applies')
  t.match(await logged(replica, from, 'config reload: these settings need a restart and were not applied'), { keys: ['http', 'log'] })
  const b = await connect(t, replica.url, 'b')
  t.equal(await call(b, 'echo', { text: 'b' }), 'b')
  t.notOk(replica.logs.slice(from).some(e => e.level === 20), 'the log level stayed info (no debug lines)')
})

t.test('SIGHUP: tenants added, a revoked key refused on its next request, tenants removed', async t => {
  const replica = await startReplica(t, 'tenants', { servers: { a: stdioFixture('full-server') } })
  const key = 'mcpgw_reload-test-key-0123456789abcdef'
  const sha256 = createHash('sha256').update(key).digest('hex')
  const auth = { publicUrl: 'http://127.0.0.1' }
  const tenant = { apiKeys: [{ id: 'k1', sha256 }], servers: { a: {} } }
  const initialize = async (headers: Record<string, string>): Promise<Response> => await fetch(`${replica.url}/mcp/a`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'reload-test', version: '1' } } })
  })
  const before = await initialize({})
  t.equal(before.status, 200, 'no tenants: anonymous callers are served')
  await before.body?.cancel()

  await rewrite(replica, { servers: { a: stdioFixture('full-server') }, auth, tenants: { acme: tenant } })
  let outcome = await sighup(replica)
  t.equal(outcome.msg, 'config reloaded')
  t.same(outcome.tenants, { added: ['acme'], changed: [], removed: [] })
  t.same(outcome.servers, { added: [], changed: [], removed: [] })
  const anonymous = await initialize({})
  t.equal(anonymous.status, 401, 'with tenants, a call without a credential is refused')
  await anonymous.body?.cancel()
  const keyed = await initialize({ 'x-api-key': key })
  t.equal(keyed.status, 200, 'the new tenant\'s key is accepted')
  const sid = keyed.headers.get('mcp-session-id') ?? ''
  await keyed.body?.cancel()
  t.ok(sid.length > 0)

  await rewrite(replica, { servers: { a: stdioFixture('full-server') }, auth, tenants: { acme: { ...tenant, apiKeys: [] } } })
  outcome = await sighup(replica)
  t.same(outcome.tenants, { added: [], changed: ['acme'], removed: [] }, 'a revoked key is a changed tenant')
  const revoked = await fetch(`${replica.url}/mcp/a`, { method: 'GET', headers: { accept: 'text/event-stream', 'x-api-key': key, 'mcp-session-id': sid } })
  t.equal(revoked.status, 401, 'the revoked key is refused on its next request')
  t.match(revoked.headers.get('www-authenticate') ?? '', /error="invalid_token"/)
  await revoked.body?.cancel()

  await rewrite(replica, { servers: { a: stdioFixture('full-server') } })
  outcome = await sighup(replica)
  t.same(outcome.tenants, { added: [], changed: [], removed: ['acme'] })
  t.match(await sighup(replica), { msg: 'config reloaded: no change' }, 'an unchanged file changes nothing')
})

t.test('the file watch (opt-in): an editor\'s rename-over is picked up, and a bad save is refused', async t => {
  const reload = { watch: true, debounceMs: 100 }
  const replica = await startReplica(t, 'watch', { reload, servers: { a: stdioFixture('full-server') } })
  await logged(replica, 0, 'watching the config file')
  const a = await connect(t, replica.url, 'a')
  const pid = await call(a, 'pid')

  // Save as an editor does: write a new file beside it, then rename it over the old one.
  let from = replica.logs.length
  await writeFile(`${replica.file}.swp`, JSON.stringify({ ...BASE, reload, servers: { a: stdioFixture('full-server'), b: stdioFixture('full-server') } }))
  await rename(`${replica.file}.swp`, replica.file)
  t.match(await logged(replica, from, 'config reloaded'), { trigger: 'watch', servers: { added: ['b'] } })
  t.equal(await call(await connect(t, replica.url, 'b'), 'echo', { text: 'b' }), 'b', 'the server added on disk is served')

  // A second save, in place this time, after the first one's watch fired.
  from = replica.logs.length
  await rewrite(replica, { reload, servers: { a: stdioFixture('full-server') } })
  t.match(await logged(replica, from, 'config reloaded'), { trigger: 'watch', servers: { removed: ['b'] } })

  from = replica.logs.length
  await rewrite(replica, { reload, servers: {} })
  t.match(await logged(replica, from, 'config reload refused; the running config stays'), { trigger: 'watch', errors: [/^\/servers/] })
  t.equal(await call(a, 'pid'), pid, 'the session goes on after the refused save')
})

t.test('a session whose backend is starting when its server is removed does not survive', async t => {
  // Before the backend opens, the supervisor refuses the unknown server; while it starts, the
  // reload ends the session and createSession refuses it; once created, it is ended like any other.
  for (const ticks of [0, 1, 3]) {
    const running = await startGateway(t, { servers: { a: stdioFixture('full-server'), x: stdioFixture('full-server') } })
    const creating = running.gateway.router.createSession({ server: 'x', principal: 'anonymous', transport: 'streamable', protocolVersion: '2025-11-25', initializeParams: null })
    for (let i = 0; i < ticks; i++) await new Promise(resolve => setImmediate(resolve))
    const applied = running.gateway.live.apply(parseConfig({ ...running.config, servers: { a: stdioFixture('full-server') } }))
    t.same((await applied).change.servers.removed, ['x'])
    const outcome = await creating.then(record => record, (err: unknown) => err as Error)
    if (outcome instanceof Error) t.match(outcome, { statusCode: 404 }, `reload after ${ticks} turns of the event loop: the session was refused with 404`)
    else t.equal(await running.gateway.router.getSession(outcome.id, 'anonymous'), null, `reload after ${ticks} turns: the session was created first, then ended`)
    await running.close()
  }
})
