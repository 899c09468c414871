// The owner lease of a session's backend connection, when this replica could not renew it in time
// (its event loop blocked past the lease: a burst of 50 stdio spawns on a loaded 2-core machine
// blocked one for 10 s and dropped the sessions opened first, in one process). A lease that lapsed
// and that nobody took is claimed back and the backend carries on; one another replica holds
// means the session moved, and the backend here stops. The lapse is made by freeing the lease in
// the store, as its expiry would; a real gateway, a real stdio server, a real Redis.
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { call, open, post, type RawSession } from '../helpers/raw-session.js'
import { eventually } from '../helpers/wait.js'
import { SseReader } from '../helpers/sse-client.js'
import { sessionKeys } from '../../src/state/redis/keys.js'
import { MemorySessionStore } from '../../src/state/session-store-memory.js'
import { MemoryEventLog } from '../../src/state/event-log-memory.js'

// The router's upkeep runs every quarter of the idle timeout when that is shorter than a third of
// the lease: every second here.
const IDLE_MS = 4000
const TICK_MS = 1000

async function pidOf (gw: RunningGateway, session: RawSession, id: number): Promise<string> {
  const res = await post(gw, call(id, 'pid'), session)
  // One JSON body, or an SSE stream when the answer took longer than the lazy-SSE window (a loaded machine).
  const sse = (res.headers.get('content-type') ?? '').includes('text/event-stream')
  const body = (sse ? await (async () => { const reader = new SseReader(res); await reader.finished; return reader.messages().find(m => 'result' in m || 'error' in m) ?? {} })() : await res.json()) as { result?: { content?: Array<{ text?: string }> }, error?: unknown }
  if (body.result?.content?.[0]?.text === undefined) throw new Error(`pid call failed: ${JSON.stringify(body)}`)
  return body.result.content[0].text
}

const settle = async (): Promise<void> => { await new Promise(resolve => setTimeout(resolve, 2.5 * TICK_MS)) }

async function memoryGateway (t: Test): Promise<{ gw: RunningGateway, store: MemorySessionStore }> {
  const store = new MemorySessionStore()
  const eventLog = new MemoryEventLog(store, 1000)
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') }, sessions: { idleTimeoutMs: IDLE_MS } }, { replicaId: 'r1', memory: { store, eventLog } })
  return { gw, store }
}

t.test('one process: a lease that lapsed and nobody took is claimed back; the backend and its session carry on', async t => {
  const { gw, store } = await memoryGateway(t)
  const session = await open(gw, '2025-11-25')
  const before = await pidOf(gw, session, 1)
  await store.releaseOwner(session.sid, 'r1')
  t.equal(await store.getOwner(session.sid), null, 'the lease is free, as after a stall past it')
  await eventually('the lease to be claimed back', async () => await store.getOwner(session.sid) === 'r1' ? true : undefined, 5 * TICK_MS)
  await settle()
  t.equal(await pidOf(gw, session, 2), before, 'the same backend child answers: it was not stopped and restarted')
  t.equal(await store.getOwner(session.sid), 'r1')
})

t.test('one store, another replica holding the lease: the backend here stops, and the next request takes the session over', async t => {
  const { gw, store } = await memoryGateway(t)
  const session = await open(gw, '2025-11-25')
  const before = await pidOf(gw, session, 1)
  await store.releaseOwner(session.sid, 'r1')
  t.equal(await store.claimOwner(session.sid, 'r2', 60_000), 'r2', 'another replica took the lapsed lease (it has no heartbeat: it is gone)')
  await settle()
  t.equal(gw.gateway.router.ownedSessions().get('full') ?? 0, 0, 'the relay here was dropped')
  const after = await pidOf(gw, session, 2)
  t.not(after, before, 'a new backend child answers: the session was taken over from the gone replica')
  t.equal(await store.getOwner(session.sid), 'r1', 'and this replica holds the lease again')
})

t.test('Redis: a lease that lapsed and nobody took is claimed back; the backend carries on', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') }, sessions: { idleTimeoutMs: IDLE_MS }, redis: { url: redis.url, keyPrefix: prefix } }, { replicaId: 'r1' })
  const inspect = await testRedis(t, redis.url)
  const session = await open(gw, '2025-11-25')
  const before = await pidOf(gw, session, 1)
  const ownerKey = sessionKeys(prefix, session.sid).owner
  t.equal(await inspect.get(ownerKey), 'r1')
  t.equal(await inspect.del(ownerKey), 1, 'the lease is gone, as after a stall past it')
  await eventually('the lease to be claimed back', async () => await inspect.get(ownerKey) === 'r1' ? true : undefined, 5 * TICK_MS)
  t.ok(await inspect.pttl(ownerKey) > 0, 'with a TTL')
  await settle()
  t.equal(await pidOf(gw, session, 2), before, 'the same backend child answers')
})
