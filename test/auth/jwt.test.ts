// JWT access tokens and protected resource metadata (docs/spec-rules.md §9.1): a real JWKS server
// started here, keys generated with jose, a token minted per case, a real gateway and backend.
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { bearer, initMessage, openSession, post, PUBLIC_URL } from '../helpers/auth.js'
import { newIssuerKey, startIssuer, unsignedToken, type TestIssuer } from '../helpers/jwks.js'
import { JWKS_BACKOFF_BASE_MS } from '../../src/auth/jwt.js'
import { setTimeout as sleep } from 'node:timers/promises'

const ISSUER = 'https://login.acme.test/'
const AUD = `${PUBLIC_URL}/mcp/full`

async function gateway (t: Test, issuer: TestIssuer, jwt: Record<string, unknown> = {}): Promise<RunningGateway> {
  return await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: {
      acme: { jwt: [{ issuer: issuer.issuer, jwksUri: issuer.jwksUri, claims: { org: 'acme' }, algorithms: ['RS256'], ...jwt }], servers: { full: {} } },
      // Same issuer, told apart by the org claim.
      beta: { jwt: [{ issuer: issuer.issuer, jwksUri: issuer.jwksUri, claims: { org: 'beta' } }], servers: { other: {} } }
    },
    servers: { full: stdioFixture('full-server'), other: stdioFixture('full-server'), unused: stdioFixture('full-server') }
  })
}

async function refused (gw: RunningGateway, token: string, path = '/mcp/full'): Promise<{ status: number, challenge: string | null, code: string, retryAfter: string | null }> {
  const res = await post(gw.url, path, initMessage(), bearer(token))
  const body = await res.json() as { error: { data: { code: string } } }
  return { status: res.status, challenge: res.headers.get('www-authenticate'), code: body.error.data.code, retryAfter: res.headers.get('retry-after') }
}

t.test('a good token opens a session; the same subject is the same principal', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', aud: AUD, org: 'acme' })
  const gw = await gateway(t, issuer)
  const first = await openSession(gw.url, 'full', bearer(await issuer.mint()))
  // A later token of the same subject reaches the session; another subject's does not.
  const del = await fetch(`${gw.url}/mcp/full`, { method: 'DELETE', headers: { ...bearer(await issuer.mint()), 'mcp-session-id': first.sid, 'mcp-protocol-version': first.version } })
  t.equal(del.status, 200)
  const second = await openSession(gw.url, 'full', bearer(await issuer.mint()))
  const foreign = await fetch(`${gw.url}/mcp/full`, { method: 'DELETE', headers: { ...bearer(await issuer.mint({ sub: 'mallory' })), 'mcp-session-id': second.sid, 'mcp-protocol-version': second.version } })
  t.equal(foreign.status, 404)
  t.equal(issuer.fetches, 1, 'the key set was fetched once and cached')
})

t.test('the audience: the endpoint\'s resource URL by default, compared canonically', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', org: 'acme' })
  const gw = await gateway(t, issuer)
  t.ok((await openSession(gw.url, 'full', bearer(await issuer.mint({ aud: 'HTTPS://GW.EXAMPLE.COM/mcp/full' })))).sid, 'upper-case scheme and host')
  t.ok((await openSession(gw.url, 'full', bearer(await issuer.mint({ aud: ['https://elsewhere.example/', `${AUD}/`] })))).sid, 'one of several, trailing slash')
  for (const aud of [`${PUBLIC_URL}/mcp/other`, `${PUBLIC_URL}/sse/full`, 'https://elsewhere.example/', `${PUBLIC_URL}/MCP/full`]) {
    const r = await refused(gw, await issuer.mint({ aud }))
    t.equal(r.status, 401, aud)
    t.match(r.challenge, /error="invalid_token", error_description="audience is not this endpoint"/)
  }
  t.equal((await refused(gw, await issuer.mint({}))).status, 401, 'no audience at all')
  // The legacy endpoint is its own resource.
  const sse = await fetch(`${gw.url}/sse/full`, { headers: { accept: 'text/event-stream', ...bearer(await issuer.mint({ aud: `${PUBLIC_URL}/sse/full` })) } })
  t.equal(sse.status, 200)
  await sse.body?.cancel()
})

t.test('configured audiences replace the default', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', org: 'acme' })
  const gw = await gateway(t, issuer, { audience: ['api://mcp-gateway'] })
  t.ok((await openSession(gw.url, 'full', bearer(await issuer.mint({ aud: 'api://mcp-gateway' })))).sid)
  t.equal((await refused(gw, await issuer.mint({ aud: AUD }))).status, 401)
})

t.test('every bad token is 401 invalid_token', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', aud: AUD, org: 'acme' })
  const stranger = await startIssuer(t, 'https://login.evil.test/', { sub: 'alice', aud: AUD, org: 'acme' })
  const es = await newIssuerKey('es1', 'ES256')
  issuer.keys.push(es)
  const gw = await gateway(t, issuer)
  const now = Math.floor(Date.now() / 1000)
  const cases: Array<[string, string, RegExp]> = [
    ['expired', await issuer.mint({ exp: now - 60 }), /token expired/],
    ['not yet valid', await issuer.mint({ nbf: now + 600 }), /claim nbf not accepted/],
    ['unknown issuer', await stranger.mint(), /unknown issuer/],
    ['issuer claim of ours, signed by a stranger', await stranger.mint({ iss: ISSUER }), /no key of the issuer|signature/],
    ['algorithm not configured (ES256, key published)', await issuer.mint({}, { key: es }), /signing algorithm not accepted/],
    ['alg none', unsignedToken({ iss: ISSUER, sub: 'alice', aud: AUD, org: 'acme', exp: now + 300 }), /unsigned token/],
    ['claim mismatch', await issuer.mint({ org: 'other' }), /claim org not accepted/],
    ['no subject', await issuer.mint({ sub: undefined }), /claim sub missing/],
    ['garbage', 'aaaa.bbbb.cccc', /malformed token/],
    ['tampered payload', await (async () => { const [h, , s] = (await issuer.mint()).split('.'); return `${h ?? ''}.${Buffer.from(JSON.stringify({ iss: ISSUER, sub: 'root', aud: AUD, org: 'acme', exp: now + 300 })).toString('base64url')}.${s ?? ''}` })(), /signature does not verify/]
  ]
  for (const [name, token, description] of cases) {
    const r = await refused(gw, token)
    t.equal(r.status, 401, name)
    t.equal(r.code, 'GW_ERR_INVALID_TOKEN', name)
    t.match(r.challenge, /^Bearer error="invalid_token", error_description="[^"]+", resource_metadata="https:\/\/gw\.example\.com\/\.well-known\/oauth-protected-resource\/mcp\/full"$/, name)
    t.match(r.challenge, description, name)
  }
})

t.test('a token without exp is refused', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', aud: AUD, org: 'acme' })
  const gw = await gateway(t, issuer)
  const { SignJWT } = await import('jose')
  const key = issuer.keys[0]
  if (key === undefined) throw new Error('no key')
  const token = await new SignJWT({ sub: 'alice', aud: AUD, org: 'acme' }).setProtectedHeader({ alg: 'RS256', kid: key.kid }).setIssuer(ISSUER).sign(key.privateKey)
  const r = await refused(gw, token)
  t.equal(r.status, 401)
  t.match(r.challenge, /claim exp missing/)
})

t.test('tenants sharing an issuer are told apart by their claims', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', org: 'beta' })
  const gw = await gateway(t, issuer)
  t.ok((await openSession(gw.url, 'other', bearer(await issuer.mint({ aud: `${PUBLIC_URL}/mcp/other` })))).sid, 'beta reaches its server')
  // acme's issuer config refuses org beta; beta's accepts the token, and beta does not list full.
  const r = await post(gw.url, '/mcp/full', initMessage(), bearer(await issuer.mint({ aud: AUD })))
  t.equal(r.status, 403)
  const acme = await issuer.mint({ aud: AUD, org: 'acme' })
  t.ok((await openSession(gw.url, 'full', bearer(acme))).sid, 'org acme is acme\'s')
})

t.test('keys rotate: an unknown kid refetches the key set, no restart', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', aud: AUD, org: 'acme' })
  const gw = await gateway(t, issuer, { jwksCooldownMs: 200 })
  t.ok((await openSession(gw.url, 'full', bearer(await issuer.mint()))).sid)
  t.equal(issuer.fetches, 1)
  const next = await newIssuerKey('k2')
  issuer.keys = [next]
  await new Promise(resolve => setTimeout(resolve, 300))
  t.ok((await openSession(gw.url, 'full', bearer(await issuer.mint({}, { key: next })))).sid, 'a token signed by the new key')
  t.equal(issuer.fetches, 2, 'one refetch')
})

t.test('refetches for unknown kids are rate-limited', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', aud: AUD, org: 'acme' })
  const gw = await gateway(t, issuer, { jwksCooldownMs: 600_000 })
  t.ok((await openSession(gw.url, 'full', bearer(await issuer.mint()))).sid)
  const rogue = await newIssuerKey('rogue')
  for (let i = 0; i < 5; i++) {
    const r = await refused(gw, await issuer.mint({}, { key: rogue }))
    t.equal(r.status, 401)
    t.match(r.challenge, /no key of the issuer matches the token/)
  }
  t.equal(issuer.fetches, 1, 'no refetch inside the cooldown')
})

t.test('an unreachable key set is 503 with Retry-After, not 401', async t => {
  for (const mode of ['error', 'hang-up', 'stopped'] as const) {
    const issuer = await startIssuer(t, ISSUER, { sub: 'alice', aud: AUD, org: 'acme' })
    if (mode === 'stopped') await issuer.stop()
    else issuer.mode = mode
    const gw = await gateway(t, issuer)
    const r = await refused(gw, await issuer.mint())
    t.equal(r.status, 503, mode)
    t.equal(r.code, 'GW_ERR_AUTH_UNAVAILABLE', mode)
    t.equal(r.retryAfter, String(JWKS_BACKOFF_BASE_MS / 1000), `${mode}: Retry-After is the backoff before the next fetch`)
    t.equal(r.challenge, null, mode)
    if (mode !== 'stopped') {
      issuer.mode = 'ok'
      await sleep(JWKS_BACKOFF_BASE_MS + 50)
      t.ok((await openSession(gw.url, 'full', bearer(await issuer.mint()))).sid, `${mode}: works once the key set is back`)
    }
  }
})

t.test('while the key set cannot be fetched: held keys still verify, unknown kids fail fast', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', aud: AUD, org: 'acme' })
  const gw = await gateway(t, issuer, { jwksCooldownMs: 0 })
  t.ok((await openSession(gw.url, 'full', bearer(await issuer.mint()))).sid, 'keys fetched once')
  issuer.mode = 'error'
  const rogue = await newIssuerKey('k-new')
  const first = await refused(gw, await issuer.mint({}, { key: rogue }))
  t.equal(first.status, 503, 'an unknown kid needs a fetch, which fails: 503')
  const fetches = issuer.fetches
  const started = Date.now()
  for (let i = 0; i < 10; i++) {
    const r = await refused(gw, await issuer.mint({}, { key: rogue }))
    t.equal(r.status, 503)
    t.ok(Number(r.retryAfter) >= 1, 'with Retry-After')
  }
  t.equal(issuer.fetches, fetches, 'no fetch is tried during the backoff')
  t.ok(Date.now() - started < 2000, 'and nobody waits for one')
  t.ok((await openSession(gw.url, 'full', bearer(await issuer.mint()))).sid, 'a token of a held key is still accepted')
  // The backoff ends: the next fetch is tried, and the new key works once published.
  issuer.mode = 'ok'
  issuer.keys.push(rogue)
  await sleep(JWKS_BACKOFF_BASE_MS * 2 + 100)
  t.ok((await openSession(gw.url, 'full', bearer(await issuer.mint({}, { key: rogue })))).sid, 'after the backoff: fetched, accepted')
})

t.test('typ: checked where the issuer config names it (RFC 9068), not otherwise', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', aud: AUD, org: 'acme' })
  const strict = await gateway(t, issuer, { typ: 'at+jwt' })
  t.ok((await openSession(strict.url, 'full', bearer(await issuer.mint()))).sid, 'typ at+jwt: accepted')
  t.ok((await openSession(strict.url, 'full', bearer(await issuer.mint({}, { header: { typ: 'application/at+jwt' } })))).sid, 'application/at+jwt: the same media type')
  for (const typ of ['JWT', undefined]) {
    const r = await refused(strict, await issuer.mint({}, { header: { typ } }))
    t.equal(r.status, 401, `typ ${String(typ)}: refused`)
    t.match(r.challenge, /error="invalid_token", error_description="claim typ not accepted"/)
  }
  const lax = await gateway(t, issuer)
  t.ok((await openSession(lax.url, 'full', bearer(await issuer.mint({}, { header: { typ: 'JWT' } })))).sid, 'no typ in the config: JWT accepted')
})

t.test('protected resource metadata, one document per endpoint (RFC 9728)', async t => {
  const issuer = await startIssuer(t, ISSUER)
  const gw = await gateway(t, issuer)
  const prm = await fetch(`${gw.url}/.well-known/oauth-protected-resource/mcp/full`)
  t.equal(prm.status, 200)
  t.match(prm.headers.get('content-type'), /application\/json/)
  t.same(await prm.json(), {
    resource: `${PUBLIC_URL}/mcp/full`,
    authorization_servers: [ISSUER],
    bearer_methods_supported: ['header'],
    resource_name: 'MCP server full (Streamable HTTP)'
  })
  const sse = await (await fetch(`${gw.url}/.well-known/oauth-protected-resource/sse/other`)).json() as Record<string, unknown>
  t.equal(sse.resource, `${PUBLIC_URL}/sse/other`)
  t.same(sse.authorization_servers, [ISSUER])
  t.equal((await fetch(`${gw.url}/.well-known/oauth-protected-resource/mcp/unused`)).status, 404, 'a server no tenant may use')
  t.equal((await fetch(`${gw.url}/.well-known/oauth-protected-resource/mcp/nosuch`)).status, 404)
  // The challenge names this document.
  const r = await post(gw.url, '/mcp/full', initMessage())
  t.equal(r.headers.get('www-authenticate'), `Bearer resource_metadata="${PUBLIC_URL}/.well-known/oauth-protected-resource/mcp/full"`)
})

t.test('without tenants there is no metadata', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  t.equal((await fetch(`${gw.url}/.well-known/oauth-protected-resource/mcp/full`)).status, 404)
})
