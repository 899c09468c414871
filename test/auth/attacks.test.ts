// Adversarial review of authentication (docs/authentication.md): odd routes and encodings,
// Authorization variants, hostile JWTs and hostile key sets, against a real gateway with a real
// stdio backend. Every refusal must be a clean 4xx/503 with a JSON-RPC body, never a 2xx, a 500 or
// a hang, and no credential may reach the logs.
import { createSign, KeyObject } from 'node:crypto'
import { request as httpRequest } from 'node:http'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import t, { type Test } from 'tap'
import { CompactEncrypt, exportJWK, generateKeyPair, SignJWT } from 'jose'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { bearer, initMessage, newKey, openSession, post, PUBLIC_URL } from '../helpers/auth.js'
import { startIssuer, type TestIssuer } from '../helpers/jwks.js'
import { createLogger } from '../../src/telemetry/logger.js'

const acmeKey = newKey('ci-bot')
const ISSUER = 'https://login.acme.test/'
const AUD = `${PUBLIC_URL}/mcp/full`

/** Every log line of every gateway of this file, to prove no credential reaches them. */
const logLines: string[] = []
const secrets: string[] = [acmeKey.key]

async function gateway (t: Test, issuer?: TestIssuer, extra: Record<string, unknown> = {}): Promise<RunningGateway> {
  const log = createLogger('debug', 'attacks', { write: (line: string) => { logLines.push(line) } })
  return await startGateway(t, {
    // These cases are about what verification answers, from one address: no failure budget
    // (failure-budget.test.ts covers it).
    auth: { publicUrl: PUBLIC_URL, failures: { burst: 0 } },
    tenants: {
      acme: {
        apiKeys: [acmeKey.entry],
        jwt: issuer === undefined ? [] : [{ issuer: issuer.issuer, jwksUri: issuer.jwksUri, algorithms: ['RS256'] }],
        servers: { full: {} }
      }
    },
    servers: { full: stdioFixture('full-server') },
    ...extra
  }, { log })
}

interface Answer { status: number, headers: Headers, text: string, json: { jsonrpc?: string, error?: { code: number, data?: { code?: string } } } | null }

async function answer (res: Response): Promise<Answer> {
  const text = await res.text()
  let json = null
  try { json = JSON.parse(text) as Answer['json'] } catch {}
  return { status: res.status, headers: res.headers, text, json }
}

function assertRefusal (t: Test, a: Answer, statuses: number[], what: string): void {
  t.ok(statuses.includes(a.status), `${what}: status ${a.status} is one of ${statuses.join('/')}`)
  if (a.status !== 431) t.equal(a.json?.jsonrpc, '2.0', `${what}: a JSON-RPC error body`)
}

/** A raw request, for what fetch normalises away (repeated headers, odd paths). */
async function raw (url: string, method: string, path: string, headers: Record<string, string | string[]>, body?: string): Promise<{ status: number, headers: Record<string, unknown>, text: string }> {
  const { hostname, port } = new URL(url)
  return await new Promise((resolve, reject) => {
    const req = httpRequest({ host: hostname, port, method, path, headers }, res => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (c: string) => { text += c })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text }))
    })
    req.on('error', reject)
    req.end(body)
  })
}

t.test('odd routes, methods and encodings never reach a session without a credential', async t => {
  const gw = await gateway(t)
  const init = JSON.stringify(initMessage())
  const cases: Array<[string, string, number[]]> = [
    ['POST', '/MCP/full', [404]],
    ['POST', '/mcp/FULL', [401, 404]],
    ['POST', '/mcp/full/', [404]],
    ['POST', '//mcp/full', [404]],
    ['POST', '/mcp//full', [404]],
    ['POST', '/mcp/%66ull', [401]],
    ['POST', '/mcp/full%2F', [404]],
    ['POST', '/mcp/full%00', [404, 400]],
    ['POST', '/mcp/full?x=1&access_token=' + acmeKey.key, [401]],
    ['POST', '/mcp/full;x=1', [404]],
    ['POST', '/mcp/./full', [404]],
    ['POST', '/mcp/x/../full', [404]],
    ['HEAD', '/mcp/full', [401]],
    ['HEAD', '/sse/full', [404]],
    ['PUT', '/mcp/full', [401]],
    ['PATCH', '/mcp/full', [401]],
    ['OPTIONS', '/mcp/full', [404, 204]],
    ['GET', '/sse/%66ull', [401]],
    ['GET', '/sse/full/', [404]],
    ['POST', '/sse/full/messages?sessionId=a&sessionId=b', [401]],
    ['POST', '/sse/%66ull/messages?sessionId=abc', [401]],
    ['POST', '/sse/full/messages/?sessionId=abc', [404]],
    ['GET', '/sse/full/messages?sessionId=abc', [404]],
    ['DELETE', '/sse/full', [404]]
  ]
  for (const [method, path, statuses] of cases) {
    const r = await raw(gw.url, method, path, { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, method === 'POST' ? init : undefined)
    t.ok(statuses.includes(r.status), `${method} ${path}: ${r.status} is one of ${statuses.join('/')}`)
    if (method !== 'HEAD' && r.status !== 204) t.match(JSON.parse(r.text), { jsonrpc: '2.0', error: {} }, `${method} ${path}: JSON-RPC body`)
  }
  t.equal([...gw.gateway.router.ownedSessions().values()].reduce((a, b) => a + b, 0), 0, 'no session was created')
})

t.test('Authorization variants', async t => {
  const gw = await gateway(t)
  const challenge = `Bearer resource_metadata="${PUBLIC_URL}/.well-known/oauth-protected-resource/mcp/full"`
  // Accepted: the scheme is case-insensitive (RFC 9110 11.1), spaces after it tolerated.
  for (const authorization of [`bearer ${acmeKey.key}`, `BEARER ${acmeKey.key}`, `Bearer   ${acmeKey.key}`, `Bearer ${acmeKey.key} `]) {
    const res = await post(gw.url, '/mcp/full', initMessage(), { authorization })
    t.equal(res.status, 200, `accepted: ${authorization.replace(acmeKey.key, 'KEY')}`)
    await res.body?.cancel()
  }
  // Another scheme is no Bearer credential at all: 401 with only the discovery challenge
  // (RFC 6750 section 3: an unsupported authentication method gets no error code).
  for (const authorization of [`Basic ${Buffer.from(`x:${acmeKey.key}`).toString('base64')}`, `Digest username="x"`, `Token ${acmeKey.key}`, acmeKey.key]) {
    const a = await answer(await post(gw.url, '/mcp/full', initMessage(), { authorization }))
    assertRefusal(t, a, [401], `scheme ${authorization.slice(0, 6)}`)
    t.equal(a.headers.get('www-authenticate'), challenge, 'only resource_metadata')
  }
  // Another scheme beside an X-API-Key: the key is the credential.
  const both = await post(gw.url, '/mcp/full', initMessage(), { authorization: 'Basic dXNlcjpwYXNz', 'x-api-key': acmeKey.key })
  t.equal(both.status, 200, 'Basic (for some proxy) + X-API-Key: the key counts')
  await both.body?.cancel()
  // Malformed Bearer: 400 invalid_request.
  for (const authorization of ['Bearer', 'Bearer ', `Bearer ${acmeKey.key} extra`, `Bearer ${acmeKey.key}, Bearer x`, `Bearer "${acmeKey.key}"`]) {
    const a = await answer(await post(gw.url, '/mcp/full', initMessage(), { authorization }))
    assertRefusal(t, a, [400, 401], `malformed: ${authorization.replace(acmeKey.key, 'KEY')}`)
    t.match(a.headers.get('www-authenticate'), /^Bearer /, 'a challenge')
  }
  // Bearer and X-API-Key that differ: 400.
  const differ = await answer(await post(gw.url, '/mcp/full', initMessage(), { ...bearer(acmeKey.key), 'x-api-key': 'mcpgw_other' }))
  assertRefusal(t, differ, [400], 'two different credentials')
  // Repeated headers: Node keeps the first Authorization; X-API-Key values are joined and match nothing.
  const twoAuth = await raw(gw.url, 'POST', '/mcp/full', { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: ['Bearer mcpgw_bad', `Bearer ${acmeKey.key}`] }, JSON.stringify(initMessage()))
  t.equal(twoAuth.status, 401, 'two Authorization headers: the first (bad) one is judged')
  const twoKeys = await raw(gw.url, 'POST', '/mcp/full', { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'x-api-key': [acmeKey.key, 'mcpgw_bad'] }, JSON.stringify(initMessage()))
  t.equal(twoKeys.status, 401, 'two X-API-Key headers: refused')
  // Very long and non-ASCII credentials.
  const long = await raw(gw.url, 'POST', '/mcp/full', { 'content-type': 'application/json', authorization: `Bearer ${'a'.repeat(20_000)}` }, '{}')
  t.equal(long.status, 431, 'a header beyond Node\'s limit: 431 from Node')
  const big = await answer(await post(gw.url, '/mcp/full', initMessage(), bearer('a'.repeat(12_000))))
  assertRefusal(t, big, [401], 'a 12 KB key')
  const latin = await answer(await post(gw.url, '/mcp/full', initMessage(), { authorization: 'Bearer caf\u00e9\u00ff', 'x-api-key': 'caf\u00e9' }))
  assertRefusal(t, latin, [400, 401], 'non-ASCII credential')
  const latinKey = await answer(await post(gw.url, '/mcp/full', initMessage(), { 'x-api-key': `${acmeKey.key}\u00e9` }))
  assertRefusal(t, latinKey, [401], 'non-ASCII tail on a good key')
  t.equal((await fetch(`${gw.url}/healthz`)).status, 200, 'the gateway is still up')
})

t.test('hostile JWTs are 401, never accepted', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', aud: AUD })
  const gw = await gateway(t, issuer)
  const good = await issuer.mint()
  t.equal((await openSession(gw.url, 'full', bearer(good))).sid.length > 0, true, 'a good token works')
  const published = issuer.keys[0]
  if (published === undefined) throw new Error('no key')
  const attacker = await generateKeyPair('RS256', { extractable: true })
  const attackerJwk = { ...await exportJWK(attacker.publicKey), kid: 'k1', alg: 'RS256' }
  // A JWKS the attacker controls, which must never be fetched.
  let attackerFetches = 0
  const evil: Server = createServer((_req, res) => { attackerFetches++; res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ keys: [attackerJwk] })) })
  await new Promise<void>(resolve => evil.listen(0, '127.0.0.1', resolve))
  t.teardown(async () => { evil.closeAllConnections(); await new Promise<void>(resolve => evil.close(() => resolve())) })
  const evilUrl = `http://127.0.0.1:${(evil.address() as AddressInfo).port}/jwks.json`
  const sign = async (header: Record<string, unknown>, key: Parameters<SignJWT['sign']>[0] = attacker.privateKey, claims: Record<string, unknown> = {}): Promise<string> =>
    await new SignJWT({ sub: 'alice', aud: AUD, ...claims }).setProtectedHeader({ alg: 'RS256', ...header } as { alg: string }).setIssuer(ISSUER).setIssuedAt().setExpirationTime('5m').sign(key)
  const part = (value: unknown): string => Buffer.from(JSON.stringify(value)).toString('base64url')
  /** Signs by hand with the issuer's own key: jose refuses to sign some headers tested here. */
  const handSigned = (header: Record<string, unknown>, claims: Record<string, unknown> = {}): string => {
    const input = `${part({ alg: 'RS256', kid: 'k1', ...header })}.${part({ sub: 'alice', aud: AUD, iss: ISSUER, exp: Math.floor(Date.now() / 1000) + 300, ...claims })}`
    return `${input}.${createSign('RSA-SHA256').update(input).sign(KeyObject.from(published.privateKey)).toString('base64url')}`
  }
  t.equal((await post(gw.url, '/mcp/full', initMessage(), bearer(handSigned({})))).status, 200, 'a hand-signed token is good (the helper works)')
  const [h, p, s] = good.split('.')
  // HS256 keyed with the issuer's public key, as bytes of its JWK and of its modulus (alg confusion).
  const hmacKeys = [new TextEncoder().encode(JSON.stringify(published.jwk)), Buffer.from(String(published.jwk.n), 'base64url')]
  const confused = await Promise.all(hmacKeys.map(async k => await new SignJWT({ sub: 'alice', aud: AUD }).setProtectedHeader({ alg: 'HS256', kid: 'k1' }).setIssuer(ISSUER).setExpirationTime('5m').sign(k)))
  // A nested JWE carrying the good token.
  const encryption = await generateKeyPair('RSA-OAEP-256')
  const jwe = await new CompactEncrypt(new TextEncoder().encode(good)).setProtectedHeader({ alg: 'RSA-OAEP-256', enc: 'A256GCM', cty: 'JWT', kid: 'k1' }).encrypt(encryption.publicKey)
  const cases: Array<[string, string]> = [
    ['alg none', `${part({ alg: 'none' })}.${p ?? ''}.`],
    ['alg None', `${part({ alg: 'None', kid: 'k1' })}.${p ?? ''}.`],
    ['alg none with the good signature', `${part({ alg: 'none', kid: 'k1' })}.${p ?? ''}.${s ?? ''}`],
    ['HS256 with the public JWK as secret', confused[0] ?? ''],
    ['HS256 with the modulus as secret', confused[1] ?? ''],
    ['embedded jwk header', await sign({ kid: 'k1', jwk: attackerJwk })],
    ['jku header to the attacker', await sign({ kid: 'k1', jku: evilUrl })],
    ['x5u header to the attacker', await sign({ kid: 'k1', x5u: evilUrl })],
    ['kid path injection', await sign({ kid: '../../../../dev/null' })],
    ['kid SQL-ish injection', await sign({ kid: "k1' OR '1'='1" })],
    ['kid of the issuer, attacker key', await sign({ kid: 'k1' })],
    ['unknown crit', handSigned({ crit: ['x-gw'], 'x-gw': 1 })],
    ['crit naming a missing header', handSigned({ crit: ['exp'] })],
    ['crit empty', handSigned({ crit: [] })],
    ['b64 false', handSigned({ crit: ['b64'], b64: false })],
    ['payload swapped under the good signature', `${h ?? ''}.${part({ sub: 'mallory', aud: AUD, iss: ISSUER, exp: 9999999999 })}.${s ?? ''}`],
    ['nested JWE', jwe],
    ['no exp', await issuer.mint({ exp: undefined }, { expiresIn: undefined })],
    ['exp as a string', await issuer.mint({ exp: '9999999999' as unknown as number })],
    ['iss as an array', handSigned({}, { iss: [ISSUER] })],
    ['iss with a trailing space', handSigned({}, { iss: `${ISSUER} ` })],
    ['aud as an object', handSigned({}, { aud: { 0: AUD } })],
    ['exp NaN-ish', handSigned({}, { exp: 'soon' })],
    ['nbf in the future', await issuer.mint({ nbf: Math.floor(Date.now() / 1000) + 3600 })],
    ['a 6 KB token', await issuer.mint({ pad: 'x'.repeat(6000), aud: 'https://elsewhere.example/' })],
    ['ID-token-like (aud is a client id)', await issuer.mint({ aud: 'client-123' }, { header: { typ: 'JWT' } })],
    ['sub as a number', await issuer.mint({ sub: 42 as unknown as string })],
    ['three dots', `${h ?? ''}.${p ?? ''}.${s ?? ''}.`],
    ['header not JSON', `${Buffer.from('{alg').toString('base64url')}.${p ?? ''}.${s ?? ''}`]
  ]
  for (const [what, token] of cases) {
    const a = await answer(await post(gw.url, '/mcp/full', initMessage(), bearer(token)))
    assertRefusal(t, a, [401], what)
    t.match(a.headers.get('www-authenticate'), /^Bearer error="invalid_token"/, `${what}: invalid_token`)
    secrets.push(token)
  }
  t.equal(attackerFetches, 0, 'no header made the gateway fetch a key set of the attacker')
  secrets.push(good)
})

async function hostileJwks (t: Test, handler: (req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse) => void): Promise<string> {
  const server = createServer(handler)
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(async () => { server.closeAllConnections(); await new Promise<void>(resolve => server.close(() => resolve())) })
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/jwks.json`
}

t.test('hostile key sets: slow, silent, garbage; 503 with Retry-After or 401, bounded, never 500', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', aud: AUD })
  const token = await issuer.mint()
  const garbage: Array<[string, (res: import('node:http').ServerResponse) => void, number[]]> = [
    ['not JSON', res => { res.writeHead(200, { 'content-type': 'application/json' }).end('<html>hi</html>') }, [503]],
    ['keys not a list', res => { res.writeHead(200, { 'content-type': 'application/json' }).end('{"keys":"x"}') }, [503]],
    ['a broken RSA key', res => { res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ keys: [{ kty: 'RSA', kid: 'k1', alg: 'RS256', n: 'AA', e: 'AQAB' }] })) }, [401, 503]],
    ['an oct key under the kid', res => { res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ keys: [{ kty: 'oct', kid: 'k1', k: 'c2VjcmV0' }] })) }, [401, 503]],
    ['a redirect', res => { res.writeHead(302, { location: 'http://169.254.169.254/' }).end() }, [503]],
    ['10 MB of keys', res => { res.writeHead(200, { 'content-type': 'application/json' }); res.end(`{"keys":[${Array.from({ length: 20_000 }, () => JSON.stringify({ kty: 'EC', crv: 'P-256', x: 'x'.repeat(200), y: 'y' })).join(',')}]}`) }, [401, 503]],
    ['headers, then a body that never comes', res => { res.writeHead(200, { 'content-type': 'application/json' }); res.write('{"keys":[') }, [503]],
    ['never answers', () => {}, [503]]
  ]
  for (const [what, handle, statuses] of garbage) {
    const jwksUri = await hostileJwks(t, (_req, res) => handle(res))
    const gw = await gateway(t, { ...issuer, jwksUri })
    const started = Date.now()
    // Two at once: both get the same bounded answer.
    const answers = await Promise.all([0, 1].map(async () => await answer(await post(gw.url, '/mcp/full', initMessage(), bearer(token)))))
    for (const a of answers) {
      assertRefusal(t, a, statuses, what)
      if (a.status === 503) t.match(a.headers.get('retry-after'), /^[1-9][0-9]*$/, `${what}: an integer Retry-After`)
    }
    t.ok(Date.now() - started < 15_000, `${what}: answered within the fetch deadline (${Date.now() - started} ms)`)
    await gw.close()
  }
})

t.test('no credential reaches the logs', async t => {
  t.ok(logLines.length > 0, 'logs were captured')
  const all = logLines.join('\n')
  for (const secret of secrets) t.notOk(all.includes(secret), `secret ${secret.slice(0, 12)}… not logged`)
  t.notOk(all.includes('ci-bot'), 'nor the key id')
})
