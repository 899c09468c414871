// Once a DELETE is answered, the session is gone on every replica: two gateway
// processes on one Redis, alternating as a balancer without stickiness would. A DELETE on one
// replica, then DELETE, POST and GET on the other are 404, and the reverse; the session's GET
// stream held on the other replica ends. Calls in flight while the DELETE runs add streams to the
// session (the delete used to give up on a session whose streams kept changing, leaving its
// record). Real replicas, a real Redis, a real stdio server (dedicated and pooled).
import t from 'tap'
import { ACCEPT_BOTH, openSession } from '../helpers/auth.js'
import { stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, type ReplicaProcess } from '../helpers/replicas.js'
import { eventually } from '../helpers/wait.js'

const ROUNDS = 8

interface Session { sid: string, version: string }

const headersOf = (session: Session): Record<string, string> => ({ 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version })

async function status (url: string, init: RequestInit): Promise<number> {
  const res = await fetch(url, init)
  await res.body?.cancel()
  return res.status
}

const call = (id: number): string => JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'echo', arguments: { text: `c${id}` } } })

t.test('a session deleted on one replica is 404 on the other at once, both ways', async t => {
  const redis = await startRedis(t)
  const config = {
    redis: { url: redis.url, keyPrefix: randomPrefix() },
    servers: {
      full: stdioFixture('full-server', [], { maxSessions: 50 }),
      pooled: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1 })
    }
  }
  const a = await startReplica(t, 'a', config)
  const b = await startReplica(t, 'b', config)
  for (const server of ['full', 'pooled']) {
    for (let round = 0; round < ROUNDS; round++) {
      const [first, second] = (round % 2 === 0 ? [a, b] : [b, a]) as [ReplicaProcess, ReplicaProcess]
      const label = `${server}, round ${round}: deleted on ${first.name}`
      const session = await openSession(first.url, server, {})
      const endpoint = (replica: ReplicaProcess): string => `${replica.url}/mcp/${server}`
      // The session's GET stream, held by the other replica.
      const get = await fetch(endpoint(second), { headers: { accept: 'text/event-stream', ...headersOf(session) } })
      t.equal(get.status, 200, `${label}: GET stream open on ${second.name}`)
      const getEnded = get.text().then(() => true, () => true)
      // Calls in flight on both replicas while the DELETE runs: each adds a stream to the session.
      const inFlight = [first, second, first, second].map(async (replica, i) => await status(endpoint(replica), { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, ...headersOf(session) }, body: call(i + 1) }).catch(() => 0))
      t.equal(await status(endpoint(first), { method: 'DELETE', headers: headersOf(session) }), 200, `${label}: DELETE answered 200`)
      t.equal(await status(endpoint(second), { method: 'DELETE', headers: headersOf(session) }), 404, `${label}: a second DELETE on ${second.name} is 404`)
      t.equal(await status(endpoint(second), { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, ...headersOf(session) }, body: call(9) }), 404, `${label}: a POST on ${second.name} is 404`)
      t.equal(await status(endpoint(second), { headers: { accept: 'text/event-stream', ...headersOf(session) } }), 404, `${label}: a GET on ${second.name} is 404`)
      t.equal(await status(endpoint(first), { method: 'DELETE', headers: headersOf(session) }), 404, `${label}: and a DELETE on ${first.name} again`)
      await Promise.all(inFlight)
      t.ok(await eventually(`${label}: the GET stream on ${second.name} ended`, async () => await Promise.race([getEnded, new Promise<undefined>(resolve => setTimeout(() => resolve(undefined), 100))])), `${label}: the GET stream held on ${second.name} ended`)
    }
  }
  // Every stream the gateway ended is logged with why.
  const ended = [...a.logs, ...b.logs].filter(line => line.msg === 'client stream ended' && line.stream === 'get')
  t.ok(ended.length >= ROUNDS * 2, `the GET streams' ends are logged (${ended.length})`)
  t.ok(ended.every(line => line.reason === 'session-ended' && typeof line.why === 'string' && typeof line.sid === 'string' && (line.sid as string).length < 20), 'with reason, why, and a short hash of the session id')
})
