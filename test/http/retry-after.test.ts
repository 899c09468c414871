// Every 503 says when to come back, as the error table of docs/behaviour.md promises: an
// initialize while Redis is down included.
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { ACCEPT_BOTH, initMessage } from '../helpers/auth.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { DEFAULT_RETRY_AFTER_S, GW_ERR_STORE_UNAVAILABLE, GW_ERR_SHUTTING_DOWN, errorHeaders, toJsonRpcError, withRetryAfter } from '../../src/core/errors.js'

t.test('unit: a 503 without its own Retry-After gets the default, in the header and in data', async t => {
  const err = new GW_ERR_STORE_UNAVAILABLE('down')
  t.same(errorHeaders(err), { 'retry-after': String(DEFAULT_RETRY_AFTER_S) })
  t.match(toJsonRpcError(err, 1).error.data, { retryAfter: DEFAULT_RETRY_AFTER_S, code: 'GW_ERR_STORE_UNAVAILABLE' })
  t.same(errorHeaders(withRetryAfter(new GW_ERR_SHUTTING_DOWN(), 7)), { 'retry-after': '7' }, "an error's own value wins")
})

t.test('initialize while Redis is down: 503 with Retry-After', async t => {
  const redis = await startRedis(t)
  // No readiness grace: /readyz is to say at once what the refusal says (readiness.test.ts has the grace).
  const gw = await startGateway(t, { redis: { url: redis.url, keyPrefix: randomPrefix(), connectTimeoutMs: 500, readinessGraceMs: 0 }, servers: { full: stdioFixture('full-server') } })
  await redis.stop()
  let res: Response | undefined
  // The client notices the loss within a moment; until then a call may still be on its way out.
  for (let i = 0; i < 50; i++) {
    res = await fetch(`${gw.url}/mcp/full`, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH }, body: JSON.stringify(initMessage()) })
    if (res.status === 503) break
    await res.body?.cancel()
    await sleep(100)
  }
  t.equal(res?.status, 503, 'refused with 503')
  t.equal(res?.headers.get('retry-after'), String(DEFAULT_RETRY_AFTER_S), 'with Retry-After')
  const body = await res?.json() as { error: { data: Record<string, unknown> } }
  t.match(body.error.data, { source: 'gateway', retryAfter: DEFAULT_RETRY_AFTER_S })
  const ready = await fetch(`${gw.url}/readyz`)
  t.equal(ready.status, 503, '/readyz says the same')
  t.equal(ready.headers.get('retry-after'), String(DEFAULT_RETRY_AFTER_S), 'with Retry-After too')
})
