// Every key the gateway writes has a TTL: after a realistic sequence of
// operations, no key under the prefix is without one. SCAN is fine here; it is never on a hot path.
import { randomUUID } from 'node:crypto'
import t from 'tap'
import { RedisBus } from '../../src/state/bus-redis.js'
import { RedisEventLog } from '../../src/state/event-log-redis.js'
import { createRedis, type Redis } from '../../src/state/redis/client.js'
import { RedisSessionStore } from '../../src/state/session-store-redis.js'
import { Inbox } from '../state/contract-bus.js'
import { sampleRecord } from '../state/contract-session-store.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'

const server = await startRedis(t)

async function keysOf (redis: Redis, prefix: string): Promise<string[]> {
  const keys: string[] = []
  let cursor = '0'
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000)
    keys.push(...batch)
    cursor = next
  } while (cursor !== '0')
  return keys.sort()
}

async function withoutTtl (redis: Redis, keys: string[]): Promise<string[]> {
  const missing: string[] = []
  for (const key of keys) if (await redis.pttl(key) < 0) missing.push(key)
  return missing
}

t.test('no key lives forever', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const store = new RedisSessionStore(redis, prefix)
  const log = new RedisEventLog(redis, prefix, 50)
  const newReader = (): Redis => createRedis(server.url, { blocking: true })
  const [busA, busB] = [new RedisBus(redis, newReader, prefix, { inboxTtlMs: 30_000 }), new RedisBus(redis, newReader, prefix, { inboxTtlMs: 30_000 })]
  t.teardown(async () => { await busA.close(); await busB.close() })
  const inbox = new Inbox()
  await busA.start('replica-a', inbox.handler)

  // Session 1: the full life of a session with a request stream and a GET stream.
  const s1 = sampleRecord()
  await store.create(s1, 60_000)
  await store.heartbeat('replica-a', 15_000)
  await store.claimOwner(s1.id, 'replica-a', 20_000)
  await store.renewOwner(s1.id, 'replica-a', 20_000)
  await store.update(s1.id, { backendSessionId: 'backend-1' })
  await store.touch(s1.id, 60_000)
  await store.claimHolder(s1.id, 'req-1', 'replica-a', 20_000)
  await log.append(s1.id, 'req-1', null, 60_000)
  await log.append(s1.id, 'req-1', { jsonrpc: '2.0', id: 1, result: {} }, 60_000)
  await store.setCursor(s1.id, 'req-1', '1-0', 60_000)
  await store.releaseHolder(s1.id, 'req-1', 'replica-a')
  await store.claimHolder(s1.id, 'get', 'replica-a', 20_000)
  await store.claimHolder(s1.id, 'get', 'replica-b', 20_000)
  await store.renewHolder(s1.id, 'get', 'replica-b', 20_000)
  await log.append(s1.id, 'get', { jsonrpc: '2.0', method: 'notifications/tools/list_changed' }, 60_000)
  await busB.send('replica-a', { kind: 'wake', sid: s1.id, streamId: 'get' })
  await busB.send('replica-b', { kind: 'release', sid: s1.id, streamId: 'get' })
  await inbox.until(1)

  // Session 2: leases and logs for a session whose record expired or never existed.
  const s2 = randomUUID()
  await store.claimHolder(s2, 'legacy', 'replica-a', 20_000)
  await store.setCursor(s2, 'legacy', '3-0', 60_000)
  await log.append(s2, 'legacy', null, 60_000)
  await store.update(s2, { server: 'x' })

  // Session 3: created and deleted.
  const s3 = sampleRecord()
  await store.create(s3, 60_000)
  await store.claimOwner(s3.id, 'replica-a', 20_000)
  await store.claimHolder(s3.id, 'get', 'replica-a', 20_000)
  await log.append(s3.id, 'get', null, 60_000)
  await store.delete(s3.id)

  const keys = await keysOf(redis, prefix)
  t.same(await withoutTtl(redis, keys), [], 'every key has a TTL')
  t.same(keys, [
    `${prefix}:inbox:replica-a`,
    `${prefix}:inbox:replica-b`,
    `${prefix}:replica:replica-a`,
    // The admin API's session index: ids scored by their records' expiry, with a TTL.
    `${prefix}:sessions`,
    `${prefix}:{${s1.id}}:cur:req-1`,
    `${prefix}:{${s1.id}}:ev:get`,
    `${prefix}:{${s1.id}}:ev:req-1`,
    `${prefix}:{${s1.id}}:holder:get`,
    `${prefix}:{${s1.id}}:meta`,
    `${prefix}:{${s1.id}}:owner`,
    `${prefix}:{${s1.id}}:seq`,
    `${prefix}:{${s1.id}}:streams`,
    `${prefix}:{${s2}}:cur:legacy`,
    `${prefix}:{${s2}}:ev:legacy`,
    `${prefix}:{${s2}}:holder:legacy`,
    `${prefix}:{${s2}}:seq`,
    `${prefix}:{${s2}}:streams`
  ].sort(), 'exactly the keys ARCHITECTURE.md section 4 names, and the session index; a deleted session leaves none')

  const streamsTtl = await redis.pttl(`${prefix}:{${s1.id}}:streams`)
  for (const key of [`${prefix}:{${s1.id}}:cur:req-1`, `${prefix}:{${s1.id}}:ev:get`, `${prefix}:{${s1.id}}:holder:get`]) {
    t.ok(await redis.pttl(key) <= streamsTtl, `the stream set outlives ${key.slice(prefix.length)}`)
  }

  await store.delete(s1.id)
  await log.deleteSession(s2)
  t.same((await keysOf(redis, prefix)).filter(k => k.includes(`{${s1.id}}`) || k.includes(`{${s2}}:ev:`) || k.includes(`{${s2}}:seq`)), [], 'delete finds every key of a session')
})
