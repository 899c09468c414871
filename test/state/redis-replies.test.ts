// The reply shapes the Redis twins rely on, under the protocol redis-client.ts chooses (RESP2),
// and the number of round trips each operation costs.
import { randomUUID } from 'node:crypto'
import t from 'tap'
import type { Command } from 'ioredis'
import { RedisBus } from '../../src/state/bus-redis.js'
import { RedisEventLog } from '../../src/state/event-log-redis.js'
import { createRedis, REDIS_PROTOCOL, type Redis } from '../../src/state/redis/client.js'
import { defineScripts } from '../../src/state/redis/scripts.js'
import { RedisSessionStore } from '../../src/state/session-store-redis.js'
import { Inbox } from './contract-bus.js'
import { sampleRecord } from './contract-session-store.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'

const server = await startRedis(t)

t.test('the client speaks the protocol chosen in redis-client.ts', async t => {
  const redis = await testRedis(t, server.url)
  t.equal(REDIS_PROTOCOL, 2)
  t.equal((redis.options as { protocol?: number }).protocol, 2)
  t.match(String(await redis.call('CLIENT', 'INFO')), /\bresp=2\b/, 'the server agrees')
})

t.test('reply shapes of the plain commands used', async t => {
  const redis = await testRedis(t, server.url)
  const p = randomPrefix()
  t.same(await redis.hgetall(`${p}:missing`), {}, 'HGETALL of a missing key: empty object')
  await redis.hset(`${p}:h`, 'a', '"x"', 'b', 'null')
  t.same(await redis.hgetall(`${p}:h`), { a: '"x"', b: 'null' }, 'HGETALL: an object of strings')
  t.equal(await redis.get(`${p}:missing`), null, 'GET of a missing key: null')
  t.equal(await redis.exists(`${p}:h`), 1, 'EXISTS: a number')
  t.equal(await redis.pexpire(`${p}:missing`, 1000), 0, 'PEXPIRE: a number')
  t.equal(await redis.pttl(`${p}:h`), -1, 'PTTL without TTL: -1')
  t.equal(await redis.pttl(`${p}:missing`), -2, 'PTTL of a missing key: -2')
  const id = await redis.xadd(`${p}:s`, '*', 'm', '')
  t.match(id, /^\d+-\d+$/)
  t.same(await redis.xrange(`${p}:s`, '-', '+', 'COUNT', 10), [[id, ['m', '']]], 'XRANGE: [id, [field, value]] pairs')
  t.same(await redis.xrange(`${p}:s`, `(${id!}`, '+', 'COUNT', 10), [], 'XRANGE with an exclusive start')
  t.same(await redis.xrange(`${p}:missing`, '-', '+'), [], 'XRANGE of a missing key: []')
  t.same(await redis.xrevrange(`${p}:missing`, '+', '-', 'COUNT', 1), [], 'XREVRANGE of a missing key: []')
  t.same(await redis.xread('COUNT', 10, 'STREAMS', `${p}:s`, '0-0'), [[`${p}:s`, [[id, ['m', '']]]]], 'XREAD: [key, entries] pairs, not a map')
  t.equal(await redis.xread('COUNT', 10, 'BLOCK', 10, 'STREAMS', `${p}:s`, id!), null, 'XREAD that times out: null')
})

t.test('reply shapes of the scripts', async t => {
  const redis = await testRedis(t, server.url)
  defineScripts(redis)
  const p = randomPrefix()
  const appended = await redis.appendEvent(`${p}:ev`, `${p}:holder`, `${p}:streams`, `${p}:pending`, `${p}:meta`, `${p}:seq`, 10, 60_000, '', 'get', '', 's', '')
  t.same(appended, [(await redis.xrange(`${p}:ev`, '-', '+'))[0]![0], null, 1], 'appendEvent without a holder: [id, null, ordinal] (Lua false is nil, mid-table too)')
  t.equal(await redis.claimHolder(`${p}:holder`, `${p}:streams`, 'r1', 60_000, 'get'), null, 'claimHolder with no previous holder: null')
  t.equal(await redis.claimHolder(`${p}:holder`, `${p}:streams`, 'r2', 60_000, 'get'), 'r1', 'claimHolder: the previous holder')
  t.same((await redis.appendEvent(`${p}:ev`, `${p}:holder`, `${p}:streams`, `${p}:pending`, `${p}:meta`, `${p}:seq`, 10, 60_000, '{}', 'get', '', 's', ''))[1], 'r2')
  t.same(await redis.appendEvent(`${p}:ev`, `${p}:holder`, `${p}:streams`, `${p}:pending`, `${p}:meta`, `${p}:seq`, 10, 60_000, '{}', 'get', 'get n1', 'n', '1'), ['', null], 'an answer for a session that does not exist: not written')
  t.equal(await redis.markPending(`${p}:ev0`, `${p}:streams`, `${p}:pending0`, `${p}:seq`, `${p}:holder:r1_w`, `${p}:metaM`, 10, 60_000, '1', 'r1_w', 'rA', 5000, 'rA', 'r1_w n1'), null, 'markPending for a session that does not exist: null (Lua false), nothing written')
  t.equal(await redis.exists(`${p}:pending0`, `${p}:holder:r1_w`, `${p}:ev0`), 0)
  await redis.hset(`${p}:metaM`, 'id', '"s"')
  t.equal(await redis.markPending(`${p}:ev`, `${p}:streams`, `${p}:pending`, `${p}:seq`, `${p}:holder:r1_x`, `${p}:metaM`, 10, 60_000, '0', 'r1_x', 'rA', 0, '', 'r1_x n1'), '', 'markPending without priming: an empty string')
  t.equal(await redis.get(`${p}:holder:r1_x`), null, 'markPending with no holder lease: no holder')
  t.match(await redis.markPending(`${p}:ev2`, `${p}:streams`, `${p}:pending2`, `${p}:seq`, `${p}:holder:r1_y`, `${p}:metaM`, 10, 60_000, '1', 'r1_y', 'rOwner', 5000, 'rA', 'r1_y n1'), /^\d+-\d+$/, 'markPending with priming: the entry id')
  t.equal(await redis.get(`${p}:holder:r1_y`), 'rA', 'markPending with a holder lease: the replica holds the new stream')
  t.match(await redis.hget(`${p}:pending2`, 'r1_y n1'), /^\d+\|rOwner$/, 'and the marker names the serving replica')
  t.ok(await redis.pttl(`${p}:holder:r1_y`) <= 5000, 'for the lease given')
  t.same(await redis.claimOrphans(`${p}:pending`, '', ''), ['r1_x n1'], 'claimOrphans: the fields taken')
  t.same(await redis.claimOrphans(`${p}:pending`, '', ''), [], 'claimOrphans: nothing twice')
  t.equal(await redis.claimOwner(`${p}:owner`, 'r1', 60_000), 'r1', 'claimOwner: a string')
  t.equal(await redis.renewLease(`${p}:owner`, 'r2', 60_000), 0, 'renewLease: 0 or 1')
  t.equal(await redis.renewLease(`${p}:owner`, 'r1', 60_000), 1)
  t.equal(await redis.createSession(`${p}:meta`, 60_000, 'id', '"x"'), 1)
  t.equal(await redis.createSession(`${p}:meta`, 60_000, 'id', '"x"'), 0)
})

/** Records the name of every command the client sends: with no pipelining, one per round trip. */
/**
 * The round trips an operation costs: commands sent in one turn of the event loop go out in one
 * write and come back together, so they count once (named `a+b+…`).
 */
function countCommands (redis: Redis): string[] {
  const names: string[] = []
  let open = false
  const send = redis.sendCommand.bind(redis)
  redis.sendCommand = (command: Command, ...rest: unknown[]) => {
    if (open) names[names.length - 1] += `+${command.name}`
    else {
      names.push(command.name)
      open = true
      setImmediate(() => { open = false })
    }
    return (send as (command: Command, ...rest: unknown[]) => unknown)(command, ...rest)
  }
  return names
}

t.test('round trips per operation', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const store = new RedisSessionStore(redis, prefix)
  const log = new RedisEventLog(redis, prefix, 100)
  const bus = new RedisBus(redis, () => createRedis(server.url, { blocking: true }), prefix, { inboxTtlMs: 60_000 })
  t.teardown(() => bus.close())
  const record = sampleRecord()
  const sid = record.id
  const ops: Array<[string, () => Promise<unknown>]> = [
    ['create', () => store.create({ ...record, id: randomUUID() }, 60_000)],
    ['get', () => store.get(sid)],
    ['update', () => store.update(sid, { backendSessionId: 'b' })],
    ['touch', () => store.touch(sid, 60_000)],
    ['claimOwner', () => store.claimOwner(sid, 'r1', 60_000)],
    ['renewOwner', () => store.renewOwner(sid, 'r1', 60_000)],
    ['getOwner', () => store.getOwner(sid)],
    ['releaseOwner', () => store.releaseOwner(sid, 'r1')],
    ['claimHolder', () => store.claimHolder(sid, 'get', 'r1', 60_000)],
    ['renewHolder', () => store.renewHolder(sid, 'get', 'r1', 60_000)],
    ['getHolder', () => store.getHolder(sid, 'get')],
    ['setCursor', () => store.setCursor(sid, 'get', '1-0', 60_000)],
    ['getCursor', () => store.getCursor(sid, 'get')],
    ['releaseHolder', () => store.releaseHolder(sid, 'get', 'r1')],
    ['heartbeat', () => store.heartbeat('r1', 60_000)],
    ['isAlive', () => store.isAlive('r1')],
    ['append', () => log.append(sid, 'get', null, 60_000)],
    ['append (an answer)', () => log.append(sid, 'r1_x', { jsonrpc: '2.0', id: 1, result: {} }, 60_000, 1)],
    ['markPending', () => log.markPending(sid, 'r1_x', [1], 60_000, true, 'r1')],
    ['markPending (and the new stream\'s holder)', () => log.markPending(sid, 'r1_y', [1], 60_000, true, 'r1', { replicaId: 'r1', leaseMs: 60_000 })],
    ['claimOrphans', () => log.claimOrphans(sid)],
    ['takeOwner', () => store.takeOwner(sid, 'r2', 'r1', 60_000)],
    ['readAfter', () => log.readAfter(sid, 'get', null, 10)],
    ['hasStream', () => log.hasStream(sid, 'get')],
    ['deleteSession (log)', () => log.deleteSession(sid)],
    ['delete', () => store.delete(sid)],
    ['send', () => bus.send('r9', { kind: 'wake', sid, streamId: 'get' })]
  ]
  await store.create(record, 60_000)
  // Warm-up: the first run of each script may cost EVALSHA + EVAL (NOSCRIPT); later runs do not.
  for (const [, op] of ops) await op()
  await store.create(record, 60_000)
  const names = countCommands(redis)
  for (const [name, op] of ops) {
    names.length = 0
    await op()
    // The deletes read the stream set first, so the script can name every key (Redis Cluster).
    const expected = name.startsWith('delete') ? 2 : 1
    t.equal(names.length, expected, `${name}: ${expected} round trip(s) (${names.join(', ')})`)
  }
  const inbox = new Inbox()
  names.length = 0
  await bus.start('r9', inbox.handler)
  t.equal(names.length, 1, 'bus start: one round trip on the command connection (the reader has its own)')
})
