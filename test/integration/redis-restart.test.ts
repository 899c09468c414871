// Redis goes away and comes back: calls fail fast instead of hanging,
// isReady() says so, and afterwards the clients reconnect and the bus reader delivers again,
// all without anyone restarting them.
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { RedisBus } from '../../src/state/bus-redis.js'
import { RedisEventLog } from '../../src/state/event-log-redis.js'
import { createRedis, redisReady } from '../../src/state/redis/client.js'
import { RedisSessionStore } from '../../src/state/session-store-redis.js'
import { replicaKey } from '../../src/state/redis/keys.js'
import { Inbox } from '../state/contract-bus.js'
import { sampleRecord } from '../state/contract-session-store.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { eventually } from '../helpers/wait.js'

/** Bounds for "does not hang" and "comes back": generous, they only catch hangs. */
const HANG = 5_000

async function settle<T> (call: Promise<T>): Promise<{ ok: true, value: T } | { ok: false, err: unknown } | 'hung'> {
  return await Promise.race([
    call.then(value => ({ ok: true as const, value }), (err: unknown) => ({ ok: false as const, err })),
    sleep(HANG, 'hung' as const, { ref: false })
  ])
}

async function until (what: () => boolean, bound = 15_000): Promise<boolean> {
  for (const end = Date.now() + bound; Date.now() < end; await sleep(20)) if (what()) return true
  return what()
}

t.test('a Redis restart: fail fast while down, recover by itself', async t => {
  const server = await startRedis(t)
  const prefix = randomPrefix()
  const redis = await testRedis(t, server.url)
  const store = new RedisSessionStore(redis, prefix)
  const log = new RedisEventLog(redis, prefix, 100)
  const readers: Array<ReturnType<typeof createRedis>> = []
  const newReader = (): ReturnType<typeof createRedis> => {
    const reader = createRedis(server.url, { blocking: true, maxRetryDelayMs: 200 })
    readers.push(reader)
    return reader
  }
  const [a, b] = [new RedisBus(redis, newReader, prefix, { inboxTtlMs: 60_000, maxRetryDelayMs: 200 }), new RedisBus(redis, newReader, prefix, { inboxTtlMs: 60_000 })]
  t.teardown(async () => { await a.close(); await b.close() })
  const inbox = new Inbox()
  const ra = `a-${randomUUID()}`
  await a.start(ra, inbox.handler)
  await b.send(ra, { kind: 'wake', sid: 's', streamId: 'before' })
  await inbox.until(1)
  const record = sampleRecord()
  await store.create(record, 60_000)
  t.equal(store.isReady(), true)

  await server.stop()
  t.ok(await until(() => !store.isReady()), 'isReady() turns false')

  const get = await settle(store.get(record.id))
  t.not(get, 'hung', 'a read does not hang')
  t.match(get, { ok: false, err: { code: 'GW_ERR_STORE_UNAVAILABLE', statusCode: 503 } })
  t.match(await settle(log.append(record.id, 'get', null, 60_000)), { ok: false, err: { code: 'GW_ERR_STORE_UNAVAILABLE' } }, 'a script call fails fast too')
  t.match(await settle(b.send(ra, { kind: 'wake', sid: 's', streamId: 'lost' })), { ok: false, err: { code: 'GW_ERR_STORE_UNAVAILABLE' } }, 'so does a send')

  await server.restart()
  await redisReady(redis, 15_000)
  t.equal(store.isReady(), true, 'the command client reconnected by itself')
  t.equal(await store.get(record.id), null, 'the restarted server is empty (no persistence)')
  await store.create(record, 60_000)
  t.same(await store.get(record.id), record, 'scripts run again (reloaded after NOSCRIPT)')
  t.equal((await log.append(record.id, 'get', null, 60_000)).holder, null)

  // The reader may still be in its backoff; the envelope waits in the inbox until it reads.
  await b.send(ra, { kind: 'wake', sid: 's', streamId: 'after' })
  t.same(await inbox.until(2), [{ kind: 'wake', sid: 's', streamId: 'before' }, { kind: 'wake', sid: 's', streamId: 'after' }],
    'the bus reader delivers again, and nothing stale or lost is invented')
  t.equal(readers.length, 1, 'with the reader it had: the loop survived, nobody restarted it')
})

t.test('a store made while Redis is down answers 503 and becomes ready when Redis is up', async t => {
  const server = await startRedis(t)
  await server.stop()
  const redis = createRedis(server.url, { maxRetryDelayMs: 100 })
  t.teardown(() => { redis.disconnect(false) })
  const store = new RedisSessionStore(redis, randomPrefix())
  t.equal(store.isReady(), false)
  t.match(await settle(store.getOwner('s')), { ok: false, err: { code: 'GW_ERR_STORE_UNAVAILABLE' } })
  await server.restart()
  await redisReady(redis, 15_000)
  t.equal(store.isReady(), true)
  t.equal(await store.getOwner('s'), null)
})

t.test('redisReady waits through connection errors and gives up at its bound', async t => {
  const server = await startRedis(t)
  await server.stop()
  const redis = createRedis(server.url, { maxRetryDelayMs: 50 })
  t.teardown(() => { redis.disconnect(false) })
  await t.rejects(redisReady(redis, 300), { code: 'GW_ERR_STORE_UNAVAILABLE' }, 'the bound, not the first ECONNREFUSED')
  const ready = redisReady(redis, 15_000)
  await server.restart()
  await ready
  t.equal(redis.status, 'ready')
  redis.disconnect(false)
  t.ok(await until(() => redis.status === 'end'))
  await t.rejects(redisReady(redis, 1_000), { code: 'GW_ERR_STORE_UNAVAILABLE' }, 'a closed client never becomes ready')
})

t.test('after a reconnect, a missing heartbeat is not taken for death for one heartbeat TTL', async t => {
  // A restarted server or a promoted replica may have lost every replica's short-lived
  // heartbeat: without the grace, replicas would take sessions over from live owners.
  const server = await startRedis(t)
  const prefix = randomPrefix()
  const redis = await testRedis(t, server.url)
  const store = new RedisSessionStore(redis, prefix)
  const ttlMs = 1_500
  await store.heartbeat('me', ttlMs)
  t.equal(await store.isAlive('me'), true)
  t.equal(await store.isAlive('ghost'), false, 'no grace after the first connect: a missing heartbeat is death')

  await server.restart()
  await redisReady(redis, 15_000)
  const back = Date.now()
  t.equal(await store.isAlive('ghost'), true, 'just after the reconnect, a missing heartbeat may be lost data')
  t.equal(await eventually('its own heartbeat back', async () => await redis.exists(replicaKey(prefix, 'me')) === 1 ? true : undefined, 1_000), true,
    'this replica wrote its own heartbeat again at once, not at its next beat')
  await sleep(Math.max(0, back + ttlMs + 100 - Date.now()))
  t.equal(await store.isAlive('ghost'), false, 'one heartbeat TTL later, it is death again')
})

