// API keys and credential parsing, pure logic.
import t from 'tap'
import { API_KEY_PREFIX, apiKeyConfigLine, apiKeyDigest, generateApiKey, matchApiKey } from '../../src/auth/api-keys.js'
import { credentialOf } from '../../src/auth/authenticate.js'
import { principalOf } from '../../src/auth/principal.js'

t.test('generated keys: prefix, 256 random bits, base64url, all different', async t => {
  const keys = new Set(Array.from({ length: 50 }, () => generateApiKey()))
  t.equal(keys.size, 50)
  for (const key of keys) {
    t.ok(key.startsWith(API_KEY_PREFIX))
    const body = key.slice(API_KEY_PREFIX.length)
    t.match(body, /^[A-Za-z0-9_-]{43}$/)
    t.equal(Buffer.from(body, 'base64url').length, 32)
  }
})

t.test('digest and config line', async t => {
  t.equal(apiKeyDigest('abc'), 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad')
  t.equal(apiKeyConfigLine('ci-bot', 'abc'), '- { id: ci-bot, sha256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" }')
})

t.test('matching compares digests and finds the right entry', async t => {
  const a = generateApiKey()
  const b = generateApiKey()
  const entries = [
    { tenant: 'acme', id: 'one', digest: Buffer.from(apiKeyDigest(a), 'hex') },
    { tenant: 'beta', id: 'two', digest: Buffer.from(apiKeyDigest(b), 'hex') }
  ]
  t.match(matchApiKey(entries, a), { tenant: 'acme', id: 'one' })
  t.match(matchApiKey(entries, b), { tenant: 'beta', id: 'two' })
  t.equal(matchApiKey(entries, `${a}x`), null)
  t.equal(matchApiKey(entries, ''), null)
  t.equal(matchApiKey([], a), null)
})

t.test('credentials come from headers only, one at a time', async t => {
  t.equal(credentialOf({}), null)
  t.same(credentialOf({ authorization: 'Bearer mcpgw_abc' }), { type: 'api-key', value: 'mcpgw_abc' })
  t.same(credentialOf({ authorization: 'bearer  mcpgw_abc ' }), { type: 'api-key', value: 'mcpgw_abc' }, 'scheme is case-insensitive')
  t.same(credentialOf({ 'x-api-key': 'mcpgw_abc' }), { type: 'api-key', value: 'mcpgw_abc' })
  t.same(credentialOf({ authorization: 'Bearer aaa.bbb.ccc' }), { type: 'jwt', value: 'aaa.bbb.ccc' })
  t.same(credentialOf({ authorization: 'Bearer aaa.bbb.' }), { type: 'jwt', value: 'aaa.bbb.' }, 'an unsigned token is still a JWT (refused later)')
  t.same(credentialOf({ 'x-api-key': 'aaa.bbb.ccc' }), { type: 'api-key', value: 'aaa.bbb.ccc' }, 'X-API-Key is never a JWT')
  // Another scheme is no Bearer credential (RFC 6750 section 3): ignored, not malformed.
  t.equal(credentialOf({ authorization: 'Basic dXNlcjpwYXNz' }), null)
  t.same(credentialOf({ authorization: 'Basic dXNlcjpwYXNz', 'x-api-key': 'k' }), { type: 'api-key', value: 'k' })
  t.equal(credentialOf({ authorization: 'Bearer' }), 'malformed')
  t.equal(credentialOf({ authorization: 'Bearer a b' }), 'malformed')
  t.equal(credentialOf({ authorization: 'Bearer one', 'x-api-key': 'two' }), 'malformed', 'two different credentials')
  t.same(credentialOf({ authorization: 'Bearer same', 'x-api-key': 'same' }), { type: 'api-key', value: 'same' })
})

t.test('principals carry a digest of the subject, never the subject', async t => {
  const p = principalOf('acme', 'key:ci-bot', 'api-key')
  t.equal(p.tenant, 'acme')
  t.match(p.subjectDigest, /^[0-9a-f]{32}$/)
  t.equal(p.key, `acme:${p.subjectDigest}`)
  t.notMatch(p.key, 'ci-bot')
  t.not(principalOf('beta', 'key:ci-bot', 'api-key').subjectDigest, p.subjectDigest, 'the same subject in another tenant is another principal')
  t.equal(principalOf('acme', 'key:ci-bot', 'jwt').key, p.key, 'the digest depends on tenant and subject only')
})
