// The admin API's consent routes inside its authenticated scope: 401 without the admin token; the
// listing shows metadata only (memory vault: scope, key id), other sources' entries left out; a
// revocation whose authorization server cannot be reached still removes the entry (and says so).
import { randomBytes } from 'node:crypto'
import Fastify, { type FastifyBaseLogger } from 'fastify'
import t from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { parseVaultKeys } from '../../src/credentials/cipher.js'
import { ConsentAdmin } from '../../src/credentials/consent-admin.js'
import { MemoryConsentStore } from '../../src/credentials/consent-store.js'
import { CredentialSources } from '../../src/credentials/sources.js'
import { userAuthorizationFactory, userAuthorizationOf } from '../../src/credentials/user-authorization.js'
import { MemoryVault } from '../../src/credentials/vault-memory.js'
import httpAdmin from '../../src/http/admin/plugin.js'
import type { AdminService } from '../../src/http/admin/service.js'
import { closedPort } from '../fixtures/http-upstreams.js'
import { capturedLog, lookups } from '../credentials/oauth-fixture.js'

t.test('consent routes: admin token required, metadata only, revocation removes the entry where the server offers none', async t => {
  const port = await closedPort()
  const live = parseConfig({
    auth: { publicUrl: 'https://gw.example' },
    tenants: { acme: { apiKeys: [{ id: 'k', sha256: 'a'.repeat(64) }], servers: { ua: {}, cc: {} } } },
    servers: {
      ua: { transport: 'streamable-http', url: 'https://ua.example/mcp', credentials: { source: 'user-authorization', clientId: 'gw', authorizationEndpoint: `http://127.0.0.1:${port}/authorize`, tokenEndpoint: `http://127.0.0.1:${port}/token`, redirectBaseUrl: 'https://gw.example', timeoutMs: 500 } },
      cc: { transport: 'streamable-http', url: 'https://cc.example/mcp', credentials: { source: 'client-credentials', clientId: 'gw', clientSecret: 's', tokenEndpoint: `http://127.0.0.1:${port}/token` } }
    }
  }, {})
  const vault = new MemoryVault(parseVaultKeys(`k7:${randomBytes(32).toString('base64')}`))
  const captured = capturedLog()
  const sources = new CredentialSources({ vault, log: captured.log, metrics: lookups().metrics })
  sources.register('user-authorization', userAuthorizationFactory({ consents: new MemoryConsentStore() }))
  t.teardown(() => { sources.close() })
  const sourceOf = userAuthorizationOf(sources, live)
  await vault.put({ tenant: 'acme', server: 'ua', subjectDigest: 'alice' }, { accessToken: 'secret-access-1', refreshToken: 'secret-refresh-1', expiresAt: Date.now() + 60_000, scope: 'crm.read' })
  await vault.put({ tenant: 'acme', server: 'cc', subjectDigest: null }, { accessToken: 'secret-cc', expiresAt: Date.now() + 60_000 })

  const app = Fastify({ loggerInstance: captured.log as FastifyBaseLogger })
  await app.register(httpAdmin, {
    token: 'admin-token',
    service: {} as AdminService,
    addressOf: () => '127.0.0.1',
    consents: new ConsentAdmin({ vault, tenants: () => ['acme'], sourceOf })
  })
  t.teardown(async () => { await app.close() })
  const auth = { authorization: 'Bearer admin-token' }

  t.equal((await app.inject({ url: '/admin/api/consents' })).statusCode, 401)
  const listed = await app.inject({ url: '/admin/api/consents', headers: auth })
  t.equal(listed.statusCode, 200)
  t.notMatch(listed.body, 'secret-')
  t.same(listed.json(), { consents: [{ tenant: 'acme', server: 'ua', subjectDigest: 'alice', expiresAt: Number(listed.json().consents[0].expiresAt), scope: 'crm.read', keyId: 'k7' }] }, 'the client-credentials entry is not a consent')

  t.equal((await app.inject({ method: 'DELETE', url: '/admin/api/consents/acme/ua/alice' })).statusCode, 401)
  const revoked = await app.inject({ method: 'DELETE', url: '/admin/api/consents/acme/ua/alice', headers: auth })
  t.same(revoked.json(), { tenant: 'acme', server: 'ua', subjectDigest: 'alice', found: true, revokedAtServer: false })
  t.equal(await vault.get({ tenant: 'acme', server: 'ua', subjectDigest: 'alice' }), undefined)
  t.same((await app.inject({ url: '/admin/api/consents?tenant=acme&server=ua', headers: auth })).json(), { consents: [] })
  t.equal((await app.inject({ method: 'DELETE', url: '/admin/api/consents/acme/cc/alice', headers: auth })).statusCode, 404, 'not a user-authorization server')
  t.equal((await app.inject({ method: 'DELETE', url: '/admin/api/consents/acme/ua/bad%20digest', headers: auth })).statusCode, 400)
  t.notMatch(captured.lines.join(''), 'secret-')
  t.match(captured.lines.join(''), '"action":"consent.revoke"')
})
