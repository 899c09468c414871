// The token-exchange and client-credentials sources against a real authorization server
// (oidc-provider): per-user tokens for the right audience and subject, caching, one grant in flight
// per caller, expiry, refusals cached briefly, invalidation, an authorization server down or silent.
import { createRemoteJWKSet, jwtVerify } from 'jose'
import t from 'tap'
import { parseConfig } from '../../src/config/load.js'
import type { Config } from '../../src/config/schema.js'
import type { Credential, CredentialCaller } from '../../src/credentials/types.js'
import type { BoundSource } from '../../src/credentials/sources.js'
import { listen } from '../fixtures/http-upstreams.js'
import { GATEWAY_CLIENT, TOKEN_EXCHANGE } from '../helpers/oauth-server.js'
import { world, type World } from './oauth-fixture.js'

const AUDIENCE = 'https://api.example/mcp'

function configOf (w: World, credentials: Record<string, unknown>): Readonly<Config> {
  return parseConfig({
    auth: { publicUrl: 'https://gw.example' },
    tenants: { acme: { apiKeys: [{ id: 'k', sha256: 'a'.repeat(64) }], servers: { api: {} } } },
    servers: { api: { transport: 'streamable-http', url: 'http://127.0.0.1:9/mcp', credentials: credentials.source === 'static' ? credentials : { clientId: GATEWAY_CLIENT.id, clientSecret: GATEWAY_CLIENT.secret, ...credentials } } }
  }, {})
}
const exchange = (w: World, extra: Record<string, unknown> = {}): Readonly<Config> =>
  configOf(w, { source: 'token-exchange', issuer: w.as.issuer, audience: AUDIENCE, timeoutMs: 2000, ...extra })

async function claimsOf (w: World, headerValue: string): Promise<Record<string, unknown>> {
  const { payload } = await jwtVerify(headerValue.replace(/^Bearer /, ''), createRemoteJWKSet(new URL(w.as.jwksUri)), { issuer: w.as.issuer })
  return payload
}

const caller = (subjectDigest: string, token?: string): CredentialCaller => ({ tenant: 'acme', subjectDigest, ...(token === undefined ? {} : { token }) })
async function cred (bound: BoundSource, who: CredentialCaller): Promise<Credential> {
  const found = await bound.source.credentialFor(who, bound.target)
  if (found === null) throw new Error('no credential')
  return found
}
const exchanges = (w: World): number => w.as.grants.filter(g => g.grantType === TOKEN_EXCHANGE).length

t.test('token exchange: each user gets a token of their own for the backend, cached, one exchange at a time', async t => {
  const w = await world(t)
  const live = exchange(w)
  const alice = caller('alice-digest', await w.users.mint('alice'))
  const bob = caller('bob-digest', await w.users.mint('bob'))
  const bound = w.sources.sourceFor(live, 'acme', 'api')!
  const results = await Promise.all([...Array(5).fill(alice), ...Array(5).fill(bob)].map(async who => await cred(bound, who)))
  t.equal(exchanges(w), 2, 'one exchange per user, however many asked at once')
  const [a, b] = [results[0]!, results[5]!]
  t.equal(a.header, 'authorization')
  t.ok(results.slice(0, 5).every(r => r.value === a.value) && results.slice(5).every(r => r.value === b.value))
  t.not(a.value, b.value)
  const ca = await claimsOf(w, a.value)
  const cb = await claimsOf(w, b.value)
  t.equal(ca.sub, 'alice')
  t.equal(cb.sub, 'bob')
  t.equal(ca.aud, AUDIENCE)
  await cred(bound, alice)
  t.equal(exchanges(w), 2, 'cached')
  t.ok(w.counted.calls.some(c => c[2] === 'issued') && w.counted.calls.some(c => c[2] === 'cached'))
  const log = w.captured.lines.join('')
  t.match(log, 'audit: credential.issued')
  for (const r of results) t.notMatch(log, r.value.slice(7), 'no token in the log')
  t.notMatch(log, alice.token!, 'no client token in the log')
})

t.test('token exchange: renewed before it expires, and found in the vault without the client token', async t => {
  const w = await world(t)
  w.as.ttlSeconds = 2
  const live = exchange(w, { refreshBeforeMs: 1000 })
  const token = await w.users.mint('alice')
  const bound = w.sources.sourceFor(live, 'acme', 'api')!
  const first = await cred(bound, caller('alice-digest', token))
  t.ok(first.expiresAt !== null && first.expiresAt - Date.now() <= 2000)
  // A GET stream's request: no client token, the cached one serves.
  t.equal((await cred(bound, caller('alice-digest'))).value, first.value)
  // Another replica's source (same vault) finds it too.
  w.sources.reconfigure(exchange(w, { refreshBeforeMs: 999 }))
  const other = w.sources.sourceFor(exchange(w, { refreshBeforeMs: 999 }), 'acme', 'api')!
  t.equal((await cred(other, caller('alice-digest'))).value, first.value, 'read from the vault')
  await new Promise(resolve => setTimeout(resolve, 1100))
  const err = await cred(other, caller('alice-digest')).catch((e: unknown) => e)
  t.match(err, { code: 'GW_ERR_CREDENTIAL_REQUIRED', statusCode: 401 }, 'expired, and nothing to exchange')
  const second = await cred(other, caller('alice-digest', token))
  t.not(second.value, first.value, 're-exchanged')
  t.equal(exchanges(w), 2)
})

t.test('token exchange: a refusal is typed, cached briefly, and a rejected credential is replaced', async t => {
  const w = await world(t)
  const live = exchange(w, { refusalCacheMs: 300 })
  w.as.refused.add('mallory')
  const bound = w.sources.sourceFor(live, 'acme', 'api')!
  const mallory = caller('mallory-digest', await w.users.mint('mallory'))
  const err = await cred(bound, mallory).catch((e: unknown) => e)
  t.match(err, { code: 'GW_ERR_CREDENTIAL_REFUSED', statusCode: 403, data: { oauthError: 'invalid_grant', server: 'api' } })
  const again = await cred(bound, mallory).catch((e: unknown) => e)
  t.match(again, { code: 'GW_ERR_CREDENTIAL_REFUSED' })
  t.equal(w.as.grants.length, 0, 'the refusal was remembered: no second request')
  t.ok(w.counted.calls.some(c => c[2] === 'refused_cached'))
  await new Promise(resolve => setTimeout(resolve, 350))
  w.as.refused.delete('mallory')
  const issued = await cred(bound, mallory)
  t.equal((await claimsOf(w, issued.value)).sub, 'mallory')
  await bound.source.invalidate(mallory, bound.target, issued)
  const renewed = await cred(bound, mallory)
  t.not(renewed.value, issued.value, 'a new exchange after the backend refused the old one')
  t.equal(await w.vault.get({ tenant: 'acme', server: 'api', subjectDigest: 'mallory-digest', audience: AUDIENCE }).then(e => `Bearer ${e?.accessToken ?? ''}`), renewed.value)
  t.match(w.captured.lines.join(''), /"audit":"credential.failed".*"oauthError":"invalid_grant"/)
})

t.test('client credentials: one token per tenant, the gateway\'s own', async t => {
  const w = await world(t)
  const live = configOf(w, { source: 'client-credentials', tokenEndpoint: w.as.tokenEndpoint, resource: AUDIENCE, scopes: ['read'] })
  const bound = w.sources.sourceFor(live, 'acme', 'api')!
  const [a, b] = await Promise.all([cred(bound, caller('alice-digest')), cred(bound, caller('bob-digest'))])
  t.equal(a.value, b.value, 'the tenant\'s users share it')
  const claims = await claimsOf(w, a.value)
  t.equal(claims.aud, AUDIENCE)
  t.equal(claims.client_id, GATEWAY_CLIENT.id)
  t.equal(w.as.grants.length, 1)
})

t.test('the authorization server down, or silent: a clear error within the deadline', async t => {
  const w = await world(t)
  const live = exchange(w, { timeoutMs: 500 })
  const bound = w.sources.sourceFor(live, 'acme', 'api')!
  await cred(bound, caller('alice-digest', await w.users.mint('alice')))
  await w.as.stop()
  const started = Date.now()
  const err = await cred(bound, caller('bob-digest', await w.users.mint('bob'))).catch((e: unknown) => e)
  t.match(err, { code: 'GW_ERR_CREDENTIAL_ISSUER_UNAVAILABLE', statusCode: 503, retryAfter: 5 })
  t.ok(Date.now() - started < 2000)
  t.ok((await cred(bound, caller('alice-digest'))).value.startsWith('Bearer '), 'a cached token still serves')

  const silent = await listen(() => {})
  t.teardown(silent.close)
  const hang = configOf(w, { source: 'client-credentials', tokenEndpoint: `${silent.url}/token`, timeoutMs: 300 })
  const hung = w.sources.sourceFor(hang, 'acme', 'api')!
  const before = Date.now()
  const late = await cred(hung, caller('x')).catch((e: unknown) => e)
  t.match(late, { code: 'GW_ERR_CREDENTIAL_ISSUER_UNAVAILABLE' })
  t.ok(Date.now() - before < 1500, `answered in ${Date.now() - before} ms`)
  // Metadata discovery from a silent issuer: the same deadline.
  const discovering = exchange(w, { issuer: silent.url, timeoutMs: 300 })
  const d = w.sources.sourceFor(discovering, 'acme', 'api')!
  const at = Date.now()
  const none = await cred(d, caller('y', await w.users.mint('y'))).catch((e: unknown) => e)
  t.match(none, { code: 'GW_ERR_CREDENTIAL_ISSUER_UNAVAILABLE' })
  t.ok(Date.now() - at < 900, `discovery gave up in ${Date.now() - at} ms`)
})

t.test('a reload keeps a source whose block is unchanged and replaces a changed one', async t => {
  const w = await world(t)
  const live = exchange(w)
  const first = w.sources.sourceFor(live, 'acme', 'api')!
  t.equal(w.sources.sourceFor(exchange(w), 'acme', 'api')!.source, first.source, 'an equal block after a reload: the same source')
  w.sources.reconfigure(exchange(w, { scopes: ['read'] }))
  const changed = w.sources.sourceFor(exchange(w, { scopes: ['read'] }), 'acme', 'api')!
  t.not(changed.source, first.source)
  t.same(changed.target.config.scopes, ['read'])
  t.equal(w.sources.sourceFor(configOf(w, { source: 'static' }), 'acme', 'api'), undefined, 'static: no source')
  t.equal(w.sources.bind(configOf(w, { source: 'static' }), { tenant: 'acme', subjectDigest: 'x' }, 'api'), undefined)
})
