// The user-authorization source against a real authorization server (oidc-provider: login and
// consent pages, PKCE, rotated refresh tokens, revocation, introspection) and a backend that
// introspects every token: two gateway replicas on one real Redis, the consent link opened on one
// and the callback landing on the other; each user's token their own; refresh with rotation, one
// refresh across replicas, a refused refresh asking for consent again; states used once, expiring,
// bound to the browser; the admin listing (no tokens) and revocation. The source is asked directly
// here, as a backend connection asks it; gateway-user-authorization.test.ts runs it through the gateway.
import { randomBytes } from 'node:crypto'
import Fastify, { type FastifyBaseLogger } from 'fastify'
import t, { type Test } from 'tap'
import { toJsonRpcError, type GatewayError } from '../../src/core/errors.js'
import { parseConfig } from '../../src/config/load.js'
import type { Config } from '../../src/config/schema.js'
import { parseVaultKeys } from '../../src/credentials/cipher.js'
import { ConsentAdmin } from '../../src/credentials/consent-admin.js'
import { consentErrorFor } from '../../src/core/consent-error.js'
import { RedisConsentStore } from '../../src/credentials/consent-store-redis.js'
import { CredentialSources } from '../../src/credentials/sources.js'
import type { Credential, CredentialCaller } from '../../src/credentials/types.js'
import { userAuthorizationFactory, userAuthorizationOf } from '../../src/credentials/user-authorization.js'
import { RedisVault } from '../../src/credentials/vault-redis.js'
import { consentRoutes } from '../../src/http/admin/consents.js'
import httpOAuthConsent from '../../src/http/oauth-consent.js'
import { browse, startConsentServer, startSubjectBackend, UA_CLIENT, type ConsentServer, type SubjectBackend } from '../helpers/oauth-consent-server.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { capturedLog, lookups, type CapturedLog } from './oauth-fixture.js'

const redisServer = await startRedis(t)

interface Replica {
  url: string
  sources: CredentialSources
  consents: RedisConsentStore
  vault: RedisVault
}

interface World {
  a: Replica
  b: Replica
  as: ConsentServer
  backend: SubjectBackend
  captured: CapturedLog
  live: () => Readonly<Config>
}

async function world (t: Test, extra: Record<string, unknown> = {}): Promise<World> {
  const prefix = randomPrefix()
  const ring = parseVaultKeys(`k1:${randomBytes(32).toString('base64')}`)
  const captured = capturedLog()
  const holder: { live?: Readonly<Config> } = {}
  const live = (): Readonly<Config> => holder.live as Readonly<Config>
  const replicas: Replica[] = []
  for (let i = 0; i < 2; i++) {
    const redis = await testRedis(t, redisServer.url)
    const vault = new RedisVault(redis, ring, prefix)
    const consents = new RedisConsentStore(redis, prefix)
    const sources = new CredentialSources({ vault, log: captured.log, metrics: lookups().metrics })
    sources.register('user-authorization', userAuthorizationFactory({ consents }))
    const sourceOf = userAuthorizationOf(sources, { get servers () { return live().servers }, get tenants () { return live().tenants } })
    const app = Fastify({ loggerInstance: captured.log as FastifyBaseLogger })
    await app.register(httpOAuthConsent, { consents, sourceOf })
    const admin = new ConsentAdmin({ vault, tenants: () => Object.keys(live().tenants ?? {}), sourceOf })
    await app.register(async api => { consentRoutes(api, admin, () => '127.0.0.1') }, { prefix: '/admin/api' })
    const url = await app.listen({ port: 0, host: '127.0.0.1' })
    t.teardown(async () => { sources.close(); await app.close() })
    replicas.push({ url, sources, consents, vault })
  }
  const [a, b] = replicas as [Replica, Replica]
  const as = await startConsentServer(t, [`${b.url}/oauth/callback`])
  const backend = await startSubjectBackend(t, as)
  holder.live = parseConfig({
    auth: { publicUrl: 'https://gw.example' },
    tenants: { acme: { apiKeys: [{ id: 'k', sha256: 'a'.repeat(64) }], servers: { api: {} } } },
    servers: {
      api: {
        transport: 'streamable-http',
        url: `${backend.url}/mcp`,
        // No issuer: the authorization server is found from the backend's protected resource metadata.
        credentials: { source: 'user-authorization', clientId: UA_CLIENT.id, clientSecret: UA_CLIENT.secret, resource: `${backend.url}/mcp`, redirectBaseUrl: b.url, scopes: ['read'], timeoutMs: 3000, ...extra }
      }
    }
  }, {})
  return { a, b, as, backend, captured, live }
}

const caller = (subjectDigest: string): CredentialCaller => ({ tenant: 'acme', subjectDigest })

async function credentialOn (w: World, replica: Replica, who: CredentialCaller): Promise<Credential> {
  const bound = replica.sources.sourceFor(w.live(), 'acme', 'api')
  if (bound === undefined) throw new Error('no source')
  const found = await bound.source.credentialFor(who, bound.target)
  if (found === null) throw new Error('no credential')
  return found
}

async function consentNeeded (t: Test, w: World, replica: Replica, who: CredentialCaller): Promise<GatewayError> {
  try {
    await credentialOn(w, replica, who)
  } catch (err) {
    t.equal((err as GatewayError).code, 'GW_ERR_CREDENTIAL_CONSENT_REQUIRED')
    return err as GatewayError
  }
  throw new Error('a credential came without consent')
}

/** The consent link opened on replica A; the authorization server sends the browser back to B. */
async function consent (w: World, link: string, login: string): Promise<{ status: number, text: string, callback: URL | undefined, authorize: URL | undefined }> {
  const visit = await browse(link.replace(w.b.url, w.a.url), login)
  return { status: visit.status, text: visit.text, callback: visit.visited.find(u => u.pathname === '/oauth/callback'), authorize: visit.visited.find(u => u.origin === w.as.issuer && u.searchParams.has('code_challenge')) }
}

const linkOf = (err: GatewayError): string => String(err.data?.authorizationUrl)

async function callBackend (w: World, credential: Credential): Promise<{ status: number, subject?: string }> {
  const res = await fetch(`${w.backend.url}/mcp`, { method: 'POST', headers: { [credential.header]: credential.value, 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'whoami' } }) })
  if (res.status !== 200) { await res.body?.cancel(); return { status: res.status } }
  const body = await res.json() as { result: { content: Array<{ text: string }> } }
  return { status: 200, subject: body.result.content[0]?.text }
}

t.test('consent by URL: opened on one replica, called back on another; each user then carries their own token', async t => {
  const w = await world(t)
  const alice = caller('alice-digest')
  const bob = caller('bob-digest')
  const err = await consentNeeded(t, w, w.a, alice)
  const rpc = toJsonRpcError(err, 7)
  t.equal(rpc.error.code, -32014)
  t.match(rpc.error.data, { server: 'api', source: 'gateway', code: 'GW_ERR_CREDENTIAL_CONSENT_REQUIRED' })
  const link = linkOf(err)
  t.match(link, `${w.b.url}/oauth/consent/`, 'a gateway URL under redirectBaseUrl')
  t.equal(linkOf(await consentNeeded(t, w, w.a, alice)), link, 'a retry gets the same link')
  t.match(String(err.data?.action), `Open ${link} in a browser`, 'the error says what to do')

  // A 2025-11-25 client that declared URL-mode elicitation gets the spec's -32042 error instead.
  const asElicitation = consentErrorFor(err, { protocolVersion: '2025-11-25', capabilities: { elicitation: { url: {} } } }) as GatewayError
  const elicited = toJsonRpcError(asElicitation, 7)
  t.equal(elicited.error.code, -32042)
  t.match(elicited.error.data, { elicitations: [{ mode: 'url', url: link, elicitationId: err.data?.elicitationId }] })
  t.equal(consentErrorFor(err, { protocolVersion: '2025-11-25', capabilities: { elicitation: {} } }), err, 'form-only elicitation: unchanged')
  t.equal(consentErrorFor(err, { protocolVersion: '2026-07-28', capabilities: { elicitation: { url: {} } } }), err, '-32042 is a 2025-11-25 code only')

  const done = await consent(w, link, 'alice')
  t.equal(done.status, 200)
  t.match(done.text, 'Access granted')
  t.equal(done.callback?.origin, new URL(w.b.url).origin, 'the callback landed on the other replica')
  const asked = done.authorize?.searchParams
  t.equal(asked?.get('code_challenge_method'), 'S256', 'PKCE S256')
  t.equal(asked?.get('resource'), `${w.backend.url}/mcp`, 'the RFC 8707 resource')
  t.equal(asked?.get('redirect_uri'), `${w.b.url}/oauth/callback`)
  t.equal(asked?.get('client_id'), UA_CLIENT.id)
  t.notOk(asked?.has('code_verifier'), 'the verifier stays in the gateway')
  t.ok((asked?.get('state') ?? '').length >= 32, 'an unguessable state')
  const token = await credentialOn(w, w.a, alice)
  t.notMatch(done.text, token.value.replace('Bearer ', ''), 'the page carries no token')
  t.same(await callBackend(w, token), { status: 200, subject: 'alice' }, 'the backend sees alice')
  t.same(await callBackend(w, await credentialOn(w, w.b, alice)), { status: 200, subject: 'alice' }, 'and from the other replica too')

  await consentNeeded(t, w, w.b, bob)
  const bobDone = await consent(w, linkOf(await consentNeeded(t, w, w.b, bob)), 'bob')
  t.equal(bobDone.status, 200)
  const bobToken = await credentialOn(w, w.a, bob)
  t.not(bobToken.value, token.value)
  t.same(await callBackend(w, bobToken), { status: 200, subject: 'bob' })
  t.same(await callBackend(w, await credentialOn(w, w.b, alice)), { status: 200, subject: 'alice' }, 'alice still has her own')
  t.same(w.as.grants.filter(g => g === 'authorization_code').length, 2)

  const log = w.captured.lines.join('')
  t.notMatch(log, token.value.replace('Bearer ', ''), 'no token in the log')
  t.match(log, '"audit":"credential.consent"')
  t.match(log, '"outcome":"granted"')
})

t.test('a state is used once, expires, and must come back to the browser that opened the link', async t => {
  const w = await world(t)
  const alice = caller('alice-digest')
  const link = linkOf(await consentNeeded(t, w, w.a, alice))
  // Another browser delivers the callback: refused, nothing filed.
  const stopped = await browse(link, 'alice', { stopBefore: u => u.pathname === '/oauth/callback' })
  const elsewhere = await fetch(stopped.url)
  t.equal(elsewhere.status, 400)
  t.match(await elsewhere.text(), 'another browser')
  await consentNeeded(t, w, w.a, alice)

  // The right browser, then the same callback again: the second is refused.
  const jar = new Map<string, string>()
  const first = await browse(linkOf(await consentNeeded(t, w, w.a, alice)), 'alice', { jar, stopBefore: u => u.pathname === '/oauth/callback' })
  const cookies = [...jar].map(([k, v]) => `${k}=${v}`).join('; ')
  const ok = await fetch(first.url, { headers: { cookie: cookies } })
  t.equal(ok.status, 200)
  await ok.body?.cancel()
  const again = await fetch(first.url.href.replace(w.b.url, w.a.url), { headers: { cookie: cookies } })
  t.equal(again.status, 400)
  t.match(await again.text(), 'expired or was already used')
  t.ok(await credentialOn(w, w.a, alice))

  // The user declines at the authorization server: a clear page, an audit line, nothing filed.
  const carol = caller('carol-digest')
  const carolJar = new Map<string, string>()
  const carolStop = await browse(linkOf(await consentNeeded(t, w, w.a, carol)), 'carol', { jar: carolJar, stopBefore: u => u.pathname === '/oauth/callback' })
  const declined = await fetch(`${carolStop.url.origin}/oauth/callback?error=access_denied&state=${carolStop.url.searchParams.get('state') ?? ''}`, { headers: { cookie: [...carolJar].map(([k, v]) => `${k}=${v}`).join('; ') } })
  t.equal(declined.status, 400)
  t.match(await declined.text(), 'did not grant access (access_denied)')
  t.match(w.captured.lines.join(''), '"outcome":"refused","oauthError":"access_denied"')
  await consentNeeded(t, w, w.a, carol)

  // Expired records: a link and a state past their time.
  const past = Date.now() - 1
  await w.a.consents.put(`l.${'x'.repeat(32)}`, { kind: 'link', link: { tenant: 'acme', subjectDigest: 'carol', server: 'api', expiresAt: past } }, 60_000)
  const oldLink = await fetch(`${w.a.url}/oauth/consent/${'x'.repeat(32)}`, { redirect: 'manual' })
  t.equal(oldLink.status, 400)
  t.match(await oldLink.text(), 'expired')
  await w.a.consents.put(`s.${'y'.repeat(32)}`, { kind: 'state', pending: { tenant: 'acme', subjectDigest: 'carol', server: 'api', expiresAt: past, verifier: 'v', browserDigest: 'd', redirectUri: `${w.b.url}/oauth/callback` } }, 60_000)
  const oldState = await fetch(`${w.b.url}/oauth/callback?state=${'y'.repeat(32)}&code=c`)
  t.equal(oldState.status, 400)
  await oldState.body?.cancel()
  const unknown = await fetch(`${w.b.url}/oauth/consent/not-a-link-at-all-zzzzzzzz`, { redirect: 'manual' })
  t.equal(unknown.status, 400)
  await unknown.body?.cancel()
})

t.test('refresh before expiry with a rotated refresh token, one refresh across replicas; a refused refresh asks for consent again', async t => {
  const w = await world(t, { refreshBeforeMs: 1000 })
  w.as.ttlSeconds = 2
  const alice = caller('alice-digest')
  await consent(w, linkOf(await consentNeeded(t, w, w.a, alice)), 'alice')
  const first = await credentialOn(w, w.a, alice)
  const key = { tenant: 'acme', server: 'api', subjectDigest: 'alice-digest', audience: `${w.backend.url}/mcp` }
  const before = await w.a.vault.get(key)
  t.ok(before?.refreshToken, 'a refresh token is kept')
  await new Promise(resolve => setTimeout(resolve, 1100))
  // Both replicas at once: one refreshes, the other waits for it and reads the result.
  const [onA, onB] = await Promise.all([credentialOn(w, w.a, alice), credentialOn(w, w.b, alice)])
  t.equal(w.as.grants.filter(g => g === 'refresh_token').length, 1, 'one refresh for both replicas')
  t.equal(onA.value, onB.value)
  t.not(onA.value, first.value, 'a new access token')
  const after = await w.a.vault.get(key)
  t.not(after?.refreshToken, before?.refreshToken, 'the rotated refresh token is stored')
  t.same(await callBackend(w, onA), { status: 200, subject: 'alice' })
  t.equal((await w.as.refreshRaw(before?.refreshToken ?? '', `${w.backend.url}/mcp`)).body.error, 'invalid_grant', 'the old refresh token no longer works')

  // The old token's reuse revoked the grant (rotation's theft detection): the next refresh is refused.
  await new Promise(resolve => setTimeout(resolve, 1100))
  const err = await consentNeeded(t, w, w.b, alice)
  t.ok(linkOf(err).includes('/oauth/consent/'))
  t.equal(await w.a.vault.get(key), undefined, 'the refused entry is gone')
  t.match(w.captured.lines.join(''), '"oauthError":"invalid_grant"')
  t.match(w.captured.lines.join(''), '"audit":"credential.refreshed"')
  // Consent again: tokens again.
  await consent(w, linkOf(err), 'alice')
  t.same(await callBackend(w, await credentialOn(w, w.a, alice)), { status: 200, subject: 'alice' })
})

t.test('admin: consents listed without tokens, revoked at the authorization server and in the vault', async t => {
  const w = await world(t)
  const alice = caller('alice-digest')
  const bob = caller('bob-digest')
  await consent(w, linkOf(await consentNeeded(t, w, w.a, alice)), 'alice')
  await consent(w, linkOf(await consentNeeded(t, w, w.a, bob)), 'bob')
  const aliceToken = await credentialOn(w, w.a, alice)
  const listed = await fetch(`${w.b.url}/admin/api/consents?tenant=acme`)
  const text = await listed.text()
  t.notMatch(text, aliceToken.value.replace('Bearer ', ''), 'no token in the listing')
  const { consents } = JSON.parse(text) as { consents: Array<Record<string, unknown>> }
  t.same(consents.map(c => c.subjectDigest).sort(), ['alice-digest', 'bob-digest'])
  t.match(consents[0], { tenant: 'acme', server: 'api', keyId: 'k1', scope: 'read', expiresAt: Number })

  const revoked = await fetch(`${w.b.url}/admin/api/consents/acme/api/alice-digest`, { method: 'DELETE' })
  t.same(await revoked.json(), { tenant: 'acme', server: 'api', subjectDigest: 'alice-digest', found: true, revokedAtServer: true })
  t.equal((await w.as.introspect(aliceToken.value.replace('Bearer ', ''))).active, false, 'the provider no longer takes the token')
  t.same(await callBackend(w, aliceToken), { status: 401 })
  // The replica that still has it in memory: the backend's 401 drops it, and consent is asked again.
  const source = w.a.sources.sourceFor(w.live(), 'acme', 'api')!
  await source.source.invalidate(alice, source.target, aliceToken)
  await consentNeeded(t, w, w.a, alice)
  const left = await (await fetch(`${w.a.url}/admin/api/consents`)).json() as { consents: Array<{ subjectDigest: string }> }
  t.same(left.consents.map(c => c.subjectDigest), ['bob-digest'])
  t.same(await callBackend(w, await credentialOn(w, w.a, bob)), { status: 200, subject: 'bob' }, 'bob is untouched')
  t.match(w.captured.lines.join(''), '"audit":"credential.revoked"')
  const missing = await fetch(`${w.b.url}/admin/api/consents/acme/nope/alice-digest`, { method: 'DELETE' })
  t.equal(missing.status, 404)
  await missing.body?.cancel()
})
