// Failed authentication is charged to a budget per client address. Guessing is
// throttled (429 with Retry-After), successes cost nothing, and another address is never refused
// because of it. With Redis, two replicas draw on one budget. Once an address's budget
// is spent, a credential that verifies from what the gateway holds still passes (clients behind one
// proxy share an address); a refused one, or a JWT that would need a key set fetched, is 429.
import { request } from 'node:http'
import t from 'tap'
import { ACCEPT_BOTH, bearer, newKey, PUBLIC_URL } from '../helpers/auth.js'
import { newIssuerKey, startIssuer } from '../helpers/jwks.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { AuthFailureBudget } from '../../src/auth/failure-budget.js'
import { MemoryRateLimiter } from '../../src/auth/rate-limit.js'

/** A DELETE of a session that does not exist, from a given local address: 404 once authenticated. */
async function attempt (base: string, key: string, from = '127.0.0.1', headers: Record<string, string> = { 'x-api-key': key }): Promise<{ status: number, retryAfter: string | undefined, code: string | undefined }> {
  const url = new URL(`${base}/mcp/full`)
  return await new Promise((resolve, reject) => {
    const req = request({ host: url.hostname, port: url.port, path: url.pathname, method: 'DELETE', localAddress: from, headers: { ...headers, 'mcp-session-id': 'nope', accept: ACCEPT_BOTH } }, res => {
      let text = ''
      res.on('data', chunk => { text += String(chunk) })
      res.on('end', () => {
        const code = (JSON.parse(text || '{}') as { error?: { data?: { code?: string } } }).error?.data?.code
        resolve({ status: res.statusCode ?? 0, retryAfter: res.headers['retry-after'], code })
      })
    })
    req.on('error', reject)
    req.end()
  })
}

function tenantConfig (failures: Record<string, unknown>): { key: string, config: Record<string, unknown> } {
  const good = newKey('good')
  return {
    key: good.key,
    config: {
      auth: { publicUrl: PUBLIC_URL, failures },
      tenants: { acme: { apiKeys: [good.entry], servers: { full: {} } } },
      servers: { full: stdioFixture('full-server') }
    }
  }
}

const BAD = 'mcpgw_not-a-key-of-anybody-at-all-000000000000000'

t.test('guessing from one address: throttled after the burst; that address only; successes free', async t => {
  const { key, config } = tenantConfig({ burst: 5, ratePerSecond: 0.5 })
  const gw = await startGateway(t, config)
  for (let i = 0; i < 30; i++) {
    if ((await attempt(gw.url, key)).status !== 404) { t.fail('a valid credential was refused'); break }
  }
  t.pass('30 successes from one address: none charged')
  const statuses: number[] = []
  for (let i = 0; i < 5; i++) statuses.push((await attempt(gw.url, BAD)).status)
  t.same(statuses, [401, 401, 401, 401, 401], 'the burst: five failures answered 401')
  const sixth = await attempt(gw.url, BAD)
  t.equal(sixth.status, 429, 'the sixth: 429')
  t.equal(sixth.code, 'GW_ERR_AUTH_THROTTLED')
  t.ok(Number(sixth.retryAfter) >= 1, 'with Retry-After')
  t.equal((await attempt(gw.url, BAD)).status, 429, 'the address\'s refused credentials stay throttled')
  t.equal((await attempt(gw.url, key)).status, 404, 'a valid key from the same address still passes (another client behind the same proxy)')
  t.equal((await attempt(gw.url, BAD)).status, 429, 'and does not reopen the budget for the guesser')
  t.equal((await attempt(gw.url, key, '127.0.0.2')).status, 404, 'a valid credential from another address is never refused')
  t.equal((await attempt(gw.url, BAD, '127.0.0.2')).status, 401, 'and another address has a budget of its own')
})

t.test('a spent budget: a JWT signed by a key held passes; one needing a key-set fetch is 429 and fetches nothing', async t => {
  const aud = `${PUBLIC_URL}/mcp/full`
  const issuer = await startIssuer(t, 'https://login.acme.test/', { sub: 'alice', aud })
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL, failures: { burst: 3, ratePerSecond: 0.1 } },
    tenants: { acme: { jwt: [{ issuer: issuer.issuer, jwksUri: issuer.jwksUri, jwksCooldownMs: 0 }], servers: { full: {} } } },
    servers: { full: stdioFixture('full-server') }
  })
  const jwt = async (token: string): Promise<number> => (await attempt(gw.url, '', '127.0.0.1', bearer(token))).status
  t.equal(await jwt(await issuer.mint()), 404, 'a good token: the key set is fetched and held')
  t.equal(issuer.fetches, 1)
  const statuses: number[] = []
  for (let i = 0; i < 4; i++) statuses.push(await jwt(await issuer.mint({ sub: `x${i}` }, { expiresIn: -60 })))
  t.same(statuses, [401, 401, 401, 429], 'expired tokens spend the budget')
  t.equal(await jwt(await issuer.mint({ sub: 'bob' })), 404, 'a token signed by the key held still passes')
  t.equal(await jwt(await issuer.mint({}, { expiresIn: -60 })), 429, 'a refused one: 429')
  const rotated = await newIssuerKey('k2')
  issuer.keys.push(rotated)
  t.equal(await jwt(await issuer.mint({}, { key: rotated })), 429, 'a token naming a kid not held (a fetch): 429')
  t.equal(issuer.fetches, 1, 'and no fetch was made for it')
  t.equal((await attempt(gw.url, '', '127.0.0.2', bearer(await issuer.mint({}, { key: rotated })))).status, 404, 'from another address the same token refetches and passes')
  t.equal(issuer.fetches, 2)
})

t.test('burst 0 turns the budget off', async t => {
  const { config } = tenantConfig({ burst: 0 })
  const gw = await startGateway(t, config)
  for (let i = 0; i < 25; i++) {
    const r = await attempt(gw.url, BAD)
    if (r.status !== 401) { t.fail(`failure ${i}: ${r.status}`); return }
  }
  t.pass('25 failures, each a 401')
})

t.test('the defaults: 20 failures at once', async t => {
  const { config } = tenantConfig({})
  const gw = await startGateway(t, config)
  let first429 = 0
  for (let i = 1; i <= 25 && first429 === 0; i++) if ((await attempt(gw.url, BAD)).status === 429) first429 = i
  t.equal(first429, 21, 'the 21st failure is throttled')
})

t.test('with Redis: two replicas draw on one budget', async t => {
  const redis = await startRedis(t)
  const { key, config } = tenantConfig({ burst: 6, ratePerSecond: 0.5 })
  const shared = { ...config, redis: { url: redis.url, keyPrefix: randomPrefix() } }
  const a = await startGateway(t, shared, { replicaId: 'a' })
  const b = await startGateway(t, shared, { replicaId: 'b' })
  for (let i = 0; i < 3; i++) t.equal((await attempt(a.url, BAD)).status, 401)
  for (let i = 0; i < 3; i++) t.equal((await attempt(b.url, BAD)).status, 401)
  t.equal((await attempt(a.url, BAD)).status, 429, 'the seventh failure, whichever replica: 429')
  t.equal((await attempt(b.url, key, '127.0.0.2')).status, 404, 'another address with a good key: served')
})

t.test('unit: a limiter that fails charges nothing; an address is released after its wait', async t => {
  let now = 1_000_000
  const broken = new AuthFailureBudget({ consume: async () => { throw new Error('down') }, close: async () => {} }, { burst: 1, ratePerSecond: 1 }, () => now)
  t.equal(await broken.charge('x'), 0, 'unreachable limiter: not throttled')
  const budget = new AuthFailureBudget(new MemoryRateLimiter(() => now * 1000), { burst: 1, ratePerSecond: 1 }, () => now)
  t.equal(await budget.charge('x'), 0)
  const wait = await budget.charge('x')
  t.ok(wait >= 1, 'second failure within a second: throttled')
  t.equal(budget.blocked('x'), wait)
  t.equal(budget.blocked('y'), 0, 'another address is not')
  now += wait * 1000
  t.equal(budget.blocked('x'), 0, 'released once the wait has passed')
})
