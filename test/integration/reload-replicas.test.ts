// Live reload with Redis (docs/configuration.md): each replica reloads on its own signal. While a
// change rolls across replicas, a replica that does not know a session's server answers 404 for it,
// and a removed server's session ends when the replica owning its backend reloads. This is the
// order the "Live reload" section of docs/configuration.md gives: reload every replica before
// clients use an added server.
import { writeFile } from 'node:fs/promises'
import t from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, type ReplicaProcess } from '../helpers/replicas.js'
import { SseReader } from '../helpers/sse-client.js'
import { eventually } from '../helpers/wait.js'

const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-11-25' }

async function openSession (replica: ReplicaProcess, server: string): Promise<string> {
  const init = await fetch(`${replica.url}/mcp/${server}`, {
    method: 'POST',
    headers: HEADERS,
    body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'roll', version: '1' } } })
  })
  if (init.status !== 200) throw new Error(`initialize on ${replica.name} answered ${init.status}`)
  const sid = init.headers.get('mcp-session-id') ?? ''
  await new SseReader(init).finished
  const done = await fetch(`${replica.url}/mcp/${server}`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid }, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) })
  await done.body?.cancel()
  return sid
}

/** The `pid` tool through `replica`: the backend child's pid, or the HTTP status when refused. */
async function pidVia (replica: ReplicaProcess, server: string, sid: string): Promise<string | number> {
  const res = await fetch(`${replica.url}/mcp/${server}`, {
    method: 'POST',
    headers: { ...HEADERS, 'mcp-session-id': sid },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'pid', arguments: {} } })
  })
  if (res.status !== 200) { await res.body?.cancel(); return res.status }
  const reader = new SseReader(res)
  await reader.finished
  const answer = reader.messages().find(m => m.id === 1) as { result?: { content: Array<{ text: string }> } } | undefined
  return answer?.result?.content[0]?.text ?? 'no result'
}

async function reloadWith (replica: ReplicaProcess, base: Record<string, unknown>, servers: Record<string, unknown>): Promise<Record<string, unknown>> {
  await writeFile(replica.file, JSON.stringify({ ...base, servers }))
  const from = replica.logs.length
  replica.child.kill('SIGHUP')
  return await eventually(`reload of ${replica.name}`, () => replica.logs.slice(from).find(e => e.msg === 'config reloaded'))
}

t.test('rolling a reload across two replicas on one Redis', async t => {
  const redis = await startRedis(t)
  const base = {
    listen: { host: '127.0.0.1', port: 0 },
    log: { level: 'info' },
    shutdown: { drainMs: 0 },
    redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 1500, connectTimeoutMs: 2000 }
  }
  const before = { full: stdioFixture('full-server'), gone: stdioFixture('full-server') }
  const after = { full: stdioFixture('full-server'), fresh: stdioFixture('full-server') }
  const a = await startReplica(t, 'A', { ...base, servers: before })
  const b = await startReplica(t, 'B', { ...base, servers: before })

  const full = await openSession(a, 'full')
  const fullPid = await pidVia(a, 'full', full)
  const gone = await openSession(a, 'gone')
  const gonePid = await pidVia(a, 'gone', gone)
  t.match(String(fullPid), /^\d+$/, 'the tool answers with a pid')
  t.not(gonePid, fullPid, 'one child per session')
  t.equal(await pidVia(b, 'gone', gone), gonePid, 'B serves A\'s session through the bus before any reload')

  // B first: it no longer knows `gone`, and already knows `fresh`.
  t.match(await reloadWith(b, base, after), { servers: { added: ['fresh'], removed: ['gone'] } })
  t.equal(await pidVia(b, 'gone', gone), 404, 'through B (reloaded), the removed server\'s session is 404')
  t.equal(await pidVia(a, 'gone', gone), gonePid, 'through A (not yet reloaded), it still runs on A\'s child')
  const fresh = await openSession(b, 'fresh')
  const freshPid = await pidVia(b, 'fresh', fresh)
  t.match(String(freshPid), /^\d+$/, 'B serves the added server')
  t.equal(await pidVia(a, 'fresh', fresh), 404, 'A does not know the added server yet: 404, hence "reload every replica before use"')

  // Then A: the session of the removed server, owned here, ends everywhere.
  const from = a.logs.length
  t.match(await reloadWith(a, base, after), { servers: { added: ['fresh'], removed: ['gone'] } })
  t.match(await eventually('A ended the removed server\'s session', () => a.logs.slice(from).find(e => e.msg === 'sessions of removed servers ended')), { sessions: 1 })
  t.equal(await pidVia(a, 'gone', gone), 404)
  t.equal(await pidVia(b, 'gone', gone), 404)
  t.equal(await pidVia(a, 'fresh', fresh), freshPid, 'once both reloaded, A serves the added server\'s session (owned by B)')
  t.equal(await pidVia(b, 'full', full), fullPid, 'the unchanged server\'s session kept its child through both reloads')
  t.equal(await pidVia(a, 'full', full), fullPid)
})
