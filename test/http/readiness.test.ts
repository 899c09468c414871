// /readyz while the shared Redis is briefly away: still 200 (saying the store is down) during
// redis.readinessGraceMs, 503 after it, 200 again once Redis is back.
import t from 'tap'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { eventually } from '../helpers/wait.js'

interface Readiness { status: number, body: { status: string, store: string } }

async function readyz (url: string): Promise<Readiness> {
  const res = await fetch(`${url}/readyz`)
  return { status: res.status, body: await res.json() as Readiness['body'] }
}

t.test('a Redis outage shorter than readinessGraceMs keeps /readyz at 200; a longer one turns it 503', async t => {
  const redis = await startRedis(t)
  const graceMs = 1500
  const gw = await startGateway(t, { redis: { url: redis.url, keyPrefix: randomPrefix(), connectTimeoutMs: 500, readinessGraceMs: graceMs }, servers: { full: stdioFixture('full-server') } })
  t.same(await readyz(gw.url), { status: 200, body: { status: 'ready', store: 'up', shuttingDown: false } }, 'ready with Redis up')
  await redis.stop()
  const away = await eventually('the store to be seen away', async () => {
    const r = await readyz(gw.url)
    return r.body.store === 'down' ? r : undefined
  })
  const seenAt = Date.now()
  t.equal(away.status, 200, 'still ready at the start of the outage')
  t.equal(away.body.status, 'ready')
  const late = await eventually('/readyz to turn 503', async () => {
    const r = await readyz(gw.url)
    return r.status === 503 ? r : undefined
  }, 10_000)
  t.ok(Date.now() - seenAt >= graceMs - 50, `503 only after the grace (${Date.now() - seenAt} ms)`)
  t.same(late.body, { status: 'not ready', store: 'down', shuttingDown: false })
  await redis.restart()
  await eventually('/readyz back to 200', async () => (await readyz(gw.url)).status === 200 ? true : undefined, 15_000)
  t.pass('ready again once Redis is back')
})

t.test('readinessGraceMs 0: 503 as soon as the store is away', async t => {
  const redis = await startRedis(t)
  const gw = await startGateway(t, { redis: { url: redis.url, keyPrefix: randomPrefix(), connectTimeoutMs: 500, readinessGraceMs: 0 }, servers: { full: stdioFixture('full-server') } })
  t.equal((await readyz(gw.url)).status, 200)
  await redis.stop()
  const r = await eventually('the store to be seen away', async () => {
    const r = await readyz(gw.url)
    return r.body.store === 'down' ? r : undefined
  })
  t.equal(r.status, 503, 'the first /readyz that finds the store away answers 503')
})
