// The admin surface's door (docs/console.md): off by default; the admin token only (never a
// tenant's key), compared as digests in constant time; a missing or wrong token is 401 and charged
// to the address's failed-authentication budget like a tenant's bad key; the page is served with a
// strict CSP and has no inline script or style.
import { randomBytes } from 'node:crypto'
import t from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { bearer, newKey, openSession, PUBLIC_URL } from '../helpers/auth.js'

const TOKEN = randomBytes(24).toString('base64url')

function adminConfig (extra: Record<string, unknown> = {}): { config: Record<string, unknown>, tenantKey: string } {
  const key = newKey('acme-bot')
  return {
    tenantKey: key.key,
    config: {
      admin: { token: TOKEN },
      auth: { publicUrl: PUBLIC_URL, failures: { burst: 4, ratePerSecond: 0.01 } },
      tenants: { acme: { apiKeys: [key.entry], servers: { full: {} } } },
      servers: { full: stdioFixture('full-server') },
      ...extra
    }
  }
}

const get = async (url: string, headers: Record<string, string> = {}): Promise<Response> => await fetch(url, { headers })

t.test('off by default: no page, no API', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  t.equal((await get(`${gw.url}/admin`)).status, 404)
  t.equal((await get(`${gw.url}/admin/api/overview`, bearer(TOKEN))).status, 404)
})

t.test('the token must be at least 32 characters', async t => {
  t.throws(() => parseConfig({ admin: { token: 'x'.repeat(31) }, servers: { full: stdioFixture('full-server') } }), /admin\/token/)
  t.throws(() => parseConfig({ admin: {}, servers: { full: stdioFixture('full-server') } }), /token/)
  t.ok(parseConfig({ admin: { token: 'x'.repeat(32) }, servers: { full: stdioFixture('full-server') } }).admin)
})

t.test('a token no request can present is refused at config check', async t => {
  const servers = { full: stdioFixture('full-server') }
  t.throws(() => parseConfig({ admin: { token: 'correct horse battery staple 0123456789' }, servers }), /\/admin\/token: can never be presented/, 'spaces')
  t.throws(() => parseConfig({ admin: { token: `${'x'.repeat(32)}\u00e9t\u00e9` }, servers }), /\/admin\/token: can never be presented/, 'non-ASCII')
  t.throws(() => parseConfig({ metrics: { token: 'a metrics token with spaces' }, servers }), /\/metrics\/token: can never be presented/, 'the metrics token too')
  t.ok(parseConfig({ admin: { token: `${'x'.repeat(32)}+/=~!` }, servers }).admin, 'visible ASCII of any kind')
  // What a presentable token looks like on the wire: it passes.
  const token = `${TOKEN}+/=~!`
  const gw = await startGateway(t, { admin: { token }, servers })
  t.equal((await get(`${gw.url}/admin/api/overview`, bearer(token))).status, 200)
})

t.test('no token, a wrong one, a tenant key: 401; the admin token: 200', async t => {
  const { config, tenantKey } = adminConfig({ auth: { publicUrl: PUBLIC_URL, failures: { burst: 0 } } })
  const gw = await startGateway(t, config)
  const none = await get(`${gw.url}/admin/api/overview`)
  t.equal(none.status, 401, 'no token')
  t.match(none.headers.get('www-authenticate') ?? '', /^Bearer realm="admin"/)
  t.match(await none.json(), { error: { message: /admin token/ } })
  t.equal((await get(`${gw.url}/admin/api/overview`, bearer(`${TOKEN}x`))).status, 401, 'the token with one more character')
  t.equal((await get(`${gw.url}/admin/api/overview`, bearer(TOKEN.slice(0, -1)))).status, 401, 'the token less its last character')
  t.equal((await get(`${gw.url}/admin/api/overview`, { authorization: `Basic ${TOKEN}` })).status, 401, 'not a bearer scheme')
  // The tenant's key works on its MCP endpoint, and never on the admin surface.
  await openSession(gw.url, 'full', bearer(tenantKey))
  t.equal((await get(`${gw.url}/admin/api/overview`, bearer(tenantKey))).status, 401, 'a tenant\'s API key')
  t.equal((await get(`${gw.url}/admin/api/sessions`, { 'x-api-key': tenantKey })).status, 401, 'a tenant\'s key as X-API-Key')
  // Digests are compared, so a presented token of any length is a plain 401 (timingSafeEqual of
  // unequal lengths would throw: a 500 here would mean the raw strings were compared).
  for (const length of [1, 31, 33, 4096]) {
    t.equal((await get(`${gw.url}/admin/api/overview`, bearer('a'.repeat(length)))).status, 401, `a ${length}-character token`)
  }
  const ok = await get(`${gw.url}/admin/api/overview`, bearer(TOKEN))
  t.equal(ok.status, 200)
  t.equal(ok.headers.get('cache-control'), 'no-store', 'answers are never cached')
  const body = await ok.json() as { sessions: { total: number }, servers: Array<{ name: string }> }
  t.equal(body.sessions.total, 1, 'the tenant\'s session is listed')
  t.same(body.servers.map(s => s.name), ['full'])
})

t.test('failed admin authentication spends the address\'s budget: 429 for wrong tokens; the right one still passes', async t => {
  const { config } = adminConfig()
  const gw = await startGateway(t, config)
  const statuses: number[] = []
  for (let i = 0; i < 6; i++) statuses.push((await get(`${gw.url}/admin/api/overview`, bearer(`wrong-${i}-${TOKEN}`))).status)
  t.same(statuses.slice(0, 4), [401, 401, 401, 401], 'the burst of four is answered 401')
  t.same(statuses.slice(4), [429, 429], 'then 429')
  const refused = await get(`${gw.url}/admin/api/overview`, bearer(`wrong-7-${TOKEN}`))
  t.equal(refused.status, 429, 'a wrong token stays throttled until Retry-After')
  t.ok(Number(refused.headers.get('retry-after')) >= 1, 'with Retry-After')
  t.equal((await get(`${gw.url}/admin/api/overview`, bearer(TOKEN))).status, 200, 'the right token is never refused for another client\'s failures')
  t.equal((await get(`${gw.url}/admin/api/overview`)).status, 429, 'no token from the spent address: 429')
  t.equal((await get(`${gw.url}/admin`)).status, 200, 'the page itself (no data) still loads')
})

t.test('the page: strict CSP, no inline script or style, assets from the gateway itself', async t => {
  const { config } = adminConfig()
  const gw = await startGateway(t, config)
  const page = await get(`${gw.url}/admin`)
  t.equal(page.status, 200)
  t.match(page.headers.get('content-type') ?? '', /^text\/html/)
  const csp = page.headers.get('content-security-policy') ?? ''
  t.match(csp, /default-src 'self'/)
  t.notMatch(csp, /unsafe-inline|unsafe-eval|\*/, 'nothing inline, nothing from elsewhere')
  t.equal(page.headers.get('x-frame-options'), 'DENY')
  const html = await page.text()
  const scripts = [...html.matchAll(/<script\b([^>]*)>([\s\S]*?)<\/script>/g)]
  t.ok(scripts.length > 0)
  for (const [, attrs, body] of scripts) {
    t.match(attrs ?? '', /src="\/admin\/[a-z.]+"/, 'a script from the gateway')
    t.equal((body ?? '').trim(), '', 'with no inline code')
  }
  t.notMatch(html, /\sstyle=|\son[a-z]+=|<style|https?:\/\//, 'no inline style or handler, no remote URL')
  for (const asset of ['console.js', 'console.css']) {
    const res = await get(`${gw.url}/admin/${asset}`)
    t.equal(res.status, 200, asset)
    t.notMatch(await res.text(), /https?:\/\/(?!www\.w3\.org\/2000\/svg)/, `${asset} loads nothing from elsewhere`)
  }
})

t.test('admin.listen: the console on an address of its own, not on the main listener', async t => {
  const { config } = adminConfig({ admin: { token: TOKEN, listen: { host: '127.0.0.1', port: 0 } } })
  const gw = await startGateway(t, config)
  t.equal((await get(`${gw.url}/admin/api/overview`, bearer(TOKEN))).status, 404, 'not on the main listener')
  const adminApp = gw.gateway.adminApp
  t.ok(adminApp, 'a listener of its own')
  const address = await adminApp!.listen({ host: '127.0.0.1', port: 0 })
  t.equal((await get(`${address}/admin/api/overview`, bearer(TOKEN))).status, 200)
  t.equal((await get(`${address}/admin/api/overview`)).status, 401)
  t.equal((await get(`${address}/mcp/full`)).status, 404, 'and nothing else there')
})
