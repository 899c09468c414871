// Isolation (SEC-SH-1, SEC-SH-2): a session belongs to the tenant and subject
// that created it. Another tenant, or another subject of the same tenant, presenting its id - on
// POST, GET, GET with Last-Event-ID, DELETE, or the legacy messages URL - gets exactly the 404 an
// unknown session gets, and the owner's session and streams go on untouched. In one process
// (memory store) and on two replicas sharing one Redis, each foreign request tried on each replica.
import t, { type Test } from 'tap'
import { startGateway } from '../helpers/gateway.js'
import { bearer, callTool, initMessage, isolationTenants, openSession, post, type TestKey } from '../helpers/auth.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { startReplica, startRoundRobinProxy } from '../helpers/replicas.js'
import { SseReader } from '../helpers/sse-client.js'

const { owner, sibling, stranger, config: tenantsConfig } = isolationTenants()

interface Answer { status: number, body: unknown }

async function answer (res: Response): Promise<Answer> {
  const text = await res.text()
  return { status: res.status, body: text === '' ? '' : JSON.parse(text) as unknown }
}

/**
 * The isolation checks against `entry` (where the owner works: one gateway, or a balancer) and
 * `replicas` (every place a foreign request is tried).
 */
async function isolation (t: Test, entry: string, replicas: string[]): Promise<void> {
  const mine = bearer(owner.key)
  const session = await openSession(entry, 'full', mine)
  const headers = { 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version }

  // The owner's streams: the GET stream, and a POST stream whose event id a thief could replay.
  const get = await fetch(`${entry}/mcp/full`, { headers: { ...mine, ...headers, accept: 'text/event-stream' } })
  t.equal(get.status, 200, 'owner GET stream open')
  const getReader = new SseReader(get)
  const call = await post(entry, '/mcp/full', { jsonrpc: '2.0', id: 5, method: 'tools/call', params: { name: 'echo', arguments: { text: 'secret-result' } } }, { ...mine, ...headers })
  const callReader = new SseReader(call)
  await callReader.finished
  const eventId = callReader.events.find(e => e.id !== undefined && e.id !== '')?.id
  t.ok(eventId, 'the owner holds an event id')

  // Legacy session of the owner: its messages URL is all a thief needs to know.
  const legacy = await fetch(`${entry}/sse/full`, { headers: { ...mine, accept: 'text/event-stream' } })
  const legacyReader = new SseReader(legacy)
  const [endpointEvent] = await legacyReader.until(ev => ev.some(e => e.event === 'endpoint'))
  const messagesPath = endpointEvent?.data ?? ''
  t.match(messagesPath, /^\/sse\/full\/messages\?sessionId=/)

  // What an unknown session gets, per method: the foreign answers must be identical.
  const unknown = { 'mcp-session-id': 'Z'.repeat(32), 'mcp-protocol-version': session.version }
  const unknownSid = 'Z'.repeat(32)
  const attempts = (cred: Record<string, string>, sidHeaders: Record<string, string>, messages: string): Array<[string, (base: string) => Promise<Response>]> => [
    ['POST', async base => await post(base, '/mcp/full', { jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x' } } }, { ...cred, ...sidHeaders })],
    ['POST notification', async base => await post(base, '/mcp/full', { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 5 } }, { ...cred, ...sidHeaders })],
    ['GET', async base => await fetch(`${base}/mcp/full`, { headers: { ...cred, ...sidHeaders, accept: 'text/event-stream' } })],
    ['GET with Last-Event-ID', async base => await fetch(`${base}/mcp/full`, { headers: { ...cred, ...sidHeaders, accept: 'text/event-stream', 'last-event-id': eventId ?? '' } })],
    ['DELETE', async base => await fetch(`${base}/mcp/full`, { method: 'DELETE', headers: { ...cred, ...sidHeaders } })],
    ['legacy messages', async base => await post(base, messages, { jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x' } } }, cred)]
  ]
  for (const [who, key] of [['another tenant', stranger], ['another subject of the tenant', sibling]] as Array<[string, TestKey]>) {
    const cred = bearer(key.key)
    const foreign = attempts(cred, headers, messagesPath)
    const baseline = attempts(cred, unknown, `/sse/full/messages?sessionId=${unknownSid}`)
    for (const [i, [method, send]] of foreign.entries()) {
      const expected = await answer(await (baseline[i]?.[1] ?? send)(replicas[0] ?? entry))
      t.equal(expected.status, 404, `${method}: an unknown session is 404`)
      for (const [r, base] of replicas.entries()) {
        const got = await answer(await send(base))
        t.same(got, expected, `${who}, ${method}, replica ${r}: exactly the unknown-session answer`)
      }
    }
  }

  // The owner's session and streams are untouched.
  t.notOk(getReader.done, 'owner GET stream still open')
  t.notOk(legacyReader.done, 'owner legacy stream still open')
  const again = await callTool(entry, 'full', mine, session, 'echo', { text: 'still mine' }, 11)
  t.match(again.message, { id: 11, result: { content: [{ text: 'still mine' }] } }, 'owner calls still work')
  const legacyInit = await post(entry, messagesPath, initMessage(1, '2024-11-05'), mine)
  t.equal(legacyInit.status, 202, 'owner legacy messages still accepted')
  await legacyReader.until(ev => ev.some(e => e.data.includes('"result"')))
  t.notMatch(JSON.stringify(getReader.events), 'secret-result', 'nothing of the owner leaked to the GET stream either')
  // The owner's resume works where the thief's did not.
  const resume = await fetch(`${entry}/mcp/full`, { headers: { ...mine, ...headers, accept: 'text/event-stream', 'last-event-id': eventId ?? '' } })
  t.equal(resume.status, 200, 'owner resumes with its event id')
  const resumed = new SseReader(resume)
  await resumed.until(ev => ev.some(e => e.data.includes('secret-result')))
  await resume.body?.cancel().catch(() => {})
  const del = await fetch(`${entry}/mcp/full`, { method: 'DELETE', headers: { ...mine, ...headers } })
  t.equal(del.status, 200, 'owner deletes its session')
  await get.body?.cancel().catch(() => {})
  await legacy.body?.cancel().catch(() => {})
}

t.test('one process, memory store', async t => {
  // POST answers as SSE streams at once: the test replays the owner's event id.
  const gw = await startGateway(t, { ...tenantsConfig, http: { lazySseMs: 0 } })
  await isolation(t, gw.url, [gw.url])
})

t.test('two replicas on one Redis, behind a non-sticky balancer', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const config = { ...tenantsConfig, redis: { url: redis.url, keyPrefix: prefix, leaseMs: 1500, connectTimeoutMs: 2000 } }
  const replicas = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  await isolation(t, proxy.url, replicas.map(r => r.url))
  t.ok(proxy.counts.every(c => c > 0), `both replicas served the owner: ${proxy.counts.join(',')}`)

  // Nothing secret at rest: Redis holds tenant names and subject digests, never a key or key id.
  const client = await testRedis(t, redis.url)
  const dump: string[] = []
  const session = await openSession(proxy.url, 'full', bearer(owner.key))
  for (const key of await client.keys(`${prefix}*`)) {
    dump.push(key)
    const type = await client.type(key)
    if (type === 'hash') dump.push(JSON.stringify(await client.hgetall(key)))
    else if (type === 'string') dump.push(String(await client.get(key)))
    else if (type === 'stream') dump.push(JSON.stringify(await client.xrange(key, '-', '+')))
    else if (type === 'set') dump.push(JSON.stringify(await client.smembers(key)))
  }
  const text = dump.join('\n')
  t.match(text, 'acme:', 'the principal (tenant and digest) is stored')
  t.notMatch(text, owner.key, 'no API key')
  t.notMatch(text, owner.entry.sha256, 'not even its digest')
  t.notMatch(text, 'owner-bot', 'no key id (the subject)')
  t.ok(session.sid)
  // Logs of both replicas: no key, no key id.
  const logs = JSON.stringify(replicas.flatMap(r => r.logs))
  t.notMatch(logs, owner.key)
  t.notMatch(logs, stranger.key)
  t.notMatch(logs, 'owner-bot')
})
