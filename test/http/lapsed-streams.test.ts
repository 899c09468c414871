// A long session's list of streams stays bounded (EventLog.prune): every SSE-answered call lists
// its stream in the session's stream set and seq hash, so deleting the session finds its log; the
// log and holder lease expire by themselves, but the entries stayed until the session ended (one
// per call, and a delete script naming three keys for each). Raw HTTP against a real gateway, a
// real stdio server and a real Redis.
import t from 'tap'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { sessionKeys } from '../../src/state/redis/keys.js'
import { PRUNE_EVERY } from '../../src/routing/replica/streams.js'
import { eventually } from '../helpers/wait.js'
import { SseReader } from '../helpers/sse-client.js'
import { call, open, post } from '../helpers/raw-session.js'

t.test('with Redis: streams whose keys lapsed are dropped from the session\'s list as calls go on; live ones stay listed', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') }, redis: { url: redis.url, keyPrefix: prefix }, http: { lazySseMs: 0 } })
  const inspect = await testRedis(t, redis.url)
  const session = await open(gw, '2025-11-25') // SSE at once (lazySseMs 0): each call's stream is resumable, so listed
  const keys = sessionKeys(prefix, session.sid)
  let lastPriming = ''
  const calls = async (from: number, count: number): Promise<void> => {
    for (let id = from; id < from + count; id++) {
      const reader = new SseReader(await post(gw, call(id, 'echo', { text: `c${id}` }), session))
      await reader.finished
      t.same(reader.messages().map(m => m.id), [id], `call ${id} answered once`)
      lastPriming = reader.events[0]?.id ?? ''
    }
  }
  const requestStreams = async (): Promise<string[]> => (await inspect.smembers(keys.streams)).filter(s => s.startsWith('r'))

  await calls(1, 40)
  const first = await requestStreams()
  t.ok(first.length >= 40, `every SSE call's stream is listed while its log lives (${first.length})`)
  // As if their log TTL (60 s) and holder lease had run out: the keys go, the list cannot see it.
  for (const id of first) await inspect.del(keys.events(id), keys.holder(id), keys.cursor(id))

  await calls(41, PRUNE_EVERY + 1)
  const later = (await requestStreams()).filter(s => !first.includes(s))
  t.ok(later.length >= PRUNE_EVERY, `the new calls' streams are listed (${later.length})`)
  const left = await eventually('lapsed streams forgotten', async () => {
    const stillListed = (await requestStreams()).filter(s => first.includes(s))
    return stillListed.length <= first.length - 20 ? stillListed : undefined
  })
  t.ok(left.length <= first.length - 20, `most lapsed streams are no longer listed (${left.length} of ${first.length} left for a later sample)`)
  const ordinals = await inspect.hkeys(keys.seq)
  t.same(ordinals.filter(s => first.includes(s) && !left.includes(s)), [], 'their ordinals went with them')
  const unlisted: string[] = []
  for (const id of later) {
    if ((await inspect.exists(keys.events(id), keys.holder(id))) > 0 && (await inspect.sismember(keys.streams, id)) === 0) unlisted.push(id)
  }
  t.same(unlisted, [], 'every stream whose keys live is still listed')
  const resumed = await fetch(`${gw.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version, 'last-event-id': lastPriming } })
  t.equal(resumed.status, 200, 'the last call\'s stream still resumes')
  const replay = new SseReader(resumed)
  await replay.finished
  t.same(replay.messages().map(m => m.id), [41 + PRUNE_EVERY], 'with its answer')

  const del = await fetch(`${gw.url}/mcp/full`, { method: 'DELETE', headers: { 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version } })
  t.equal(del.status, 200)
  await eventually('the session\'s keys gone', async () => (await inspect.keys(`${prefix}:{${session.sid}}:*`)).length === 0 ? true : undefined)
  t.pass('deleting the session still removes every key it has')
})
