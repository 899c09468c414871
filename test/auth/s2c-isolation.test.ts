// Adversarial review of isolation for the answers to server-to-client requests: while a
// backend waits for the owner's answer to its sampling request, another tenant or another subject
// answering it - with the owner's session id, or from a session of its own with the request's
// opaque id - must never reach the owner's backend; the owner's own answer still does. One
// process (memory store) and two replicas on one Redis behind a non-sticky balancer.
import t, { type Test } from 'tap'
import { startGateway } from '../helpers/gateway.js'
import { bearer, isolationTenants, post, type TestKey } from '../helpers/auth.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, startRoundRobinProxy } from '../helpers/replicas.js'
import { SseReader } from '../helpers/sse-client.js'

const { owner, sibling, stranger, config: tenantsConfig } = isolationTenants()

const VERSION = '2025-11-25'

/** A session whose client declares sampling; returns the headers of its requests. */
async function samplingSession (base: string, key: TestKey): Promise<Record<string, string>> {
  const init = { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: VERSION, capabilities: { sampling: {} }, clientInfo: { name: 'raw', version: '1' } } }
  const res = await post(base, '/mcp/full', init, bearer(key.key))
  const sid = res.headers.get('mcp-session-id')
  if (res.status !== 200 || sid === null) throw new Error(`initialize got ${res.status}`)
  await new SseReader(res).until(ev => ev.some(e => e.data.includes('"result"')))
  const headers = { ...bearer(key.key), 'mcp-session-id': sid, 'mcp-protocol-version': VERSION }
  const ack = await post(base, '/mcp/full', { jsonrpc: '2.0', method: 'notifications/initialized' }, headers)
  if (ack.status !== 202) throw new Error(`initialized got ${ack.status}`)
  return headers
}

const answerOf = (id: unknown, text: string): Record<string, unknown> =>
  ({ jsonrpc: '2.0', id, result: { role: 'assistant', content: { type: 'text', text }, model: 'm', stopReason: 'endTurn' } })

async function s2cIsolation (t: Test, entry: string, replicas: string[]): Promise<void> {
  const mine = await samplingSession(entry, owner)
  const call = await post(entry, '/mcp/full', { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'sample', arguments: { prompt: 'hi' } } }, mine)
  t.equal(call.status, 200)
  const reader = new SseReader(call)
  await reader.until(ev => ev.some(e => e.data.includes('sampling/createMessage')))
  const request = reader.messages().find(m => m.method === 'sampling/createMessage')
  t.ok(request?.id, 'the backend asks the owner for a completion, under an opaque id')
  const id = request?.id

  for (const [who, key] of [['another tenant', stranger], ['another subject', sibling]] as Array<[string, TestKey]>) {
    const theirs = await samplingSession(entry, key)
    for (const [r, base] of replicas.entries()) {
      const withOwnersSid = await post(base, '/mcp/full', answerOf(id, `forged by ${who}`), { ...mine, authorization: `Bearer ${key.key}` })
      t.equal(withOwnersSid.status, 404, `${who}, replica ${r}: the owner's session id is an unknown session`)
      const fromOwnSession = await post(base, '/mcp/full', answerOf(id, `forged by ${who}`), theirs)
      t.equal(fromOwnSession.status, 202, `${who}, replica ${r}: an answer in its own session is taken (and goes nowhere)`)
    }
  }
  const genuine = await post(entry, '/mcp/full', answerOf(id, 'genuine'), mine)
  t.equal(genuine.status, 202, 'the owner answers')
  await reader.until(ev => ev.some(e => e.data.includes('"id":7')))
  const result = reader.messages().find(m => m.id === 7)
  t.match(result, { result: { content: [{ type: 'text', text: 'genuine' }] } }, 'the backend got the owner\'s answer, not a forged one')
  t.notMatch(JSON.stringify(reader.events), 'forged', 'no forged answer anywhere in the owner\'s stream')
}

t.test('one process, memory store', async t => {
  const gw = await startGateway(t, tenantsConfig)
  await s2cIsolation(t, gw.url, [gw.url])
})

t.test('two replicas on one Redis, behind a non-sticky balancer', async t => {
  const redis = await startRedis(t)
  const config = { ...tenantsConfig, redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 1500, connectTimeoutMs: 2000 } }
  const replicas = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  await s2cIsolation(t, proxy.url, replicas.map(r => r.url))
})
