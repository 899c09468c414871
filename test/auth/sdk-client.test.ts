// The official v1 SDK client against a gateway with tenants: an API key in
// requestInit.headers (Streamable HTTP and legacy SSE), a JWT as a Bearer header, a JWT from an
// OAuthClientProvider (the SDK's own auth path), and the SDK's discovery reading our metadata.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { discoverOAuthProtectedResourceMetadata, extractResourceMetadataUrl, type OAuthClientProvider } from '@modelcontextprotocol/sdk/client/auth.js'
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { bearer, initMessage, newKey, post, PUBLIC_URL } from '../helpers/auth.js'
import { startIssuer, type TestIssuer } from '../helpers/jwks.js'
import { textOf } from '../helpers/wait.js'

const key = newKey('sdk-bot')
const ISSUER = 'https://login.acme.test/'

async function gateway (t: Test, issuer: TestIssuer): Promise<RunningGateway> {
  return await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [key.entry], jwt: [{ issuer: issuer.issuer, jwksUri: issuer.jwksUri }], servers: { full: {} } } },
    servers: { full: stdioFixture('full-server') }
  })
}

async function use (t: Test, transport: Transport): Promise<Client> {
  const client = new Client({ name: 'sdk-auth-test', version: '1.0.0' })
  await client.connect(transport)
  t.teardown(async () => {
    if (transport instanceof StreamableHTTPClientTransport) await transport.terminateSession().catch(() => {})
    await client.close().catch(() => {})
  })
  return client
}

t.test('the SDK client with an API key, a JWT header, and a token provider', async t => {
  const issuer = await startIssuer(t, ISSUER, { sub: 'alice', aud: `${PUBLIC_URL}/mcp/full` })
  const gw = await gateway(t, issuer)
  const mcp = new URL(`${gw.url}/mcp/full`)

  t.test('API key in requestInit.headers (Streamable HTTP)', async t => {
    const client = await use(t, new StreamableHTTPClientTransport(mcp, { requestInit: { headers: { 'X-API-Key': key.key } } }))
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'with a key' } })), 'with a key')
    t.ok((await client.listTools()).tools.some(tool => tool.name === 'echo'))
  })

  t.test('API key as Bearer in requestInit.headers (legacy SSE: the GET and every POST)', async t => {
    const headers = bearer(key.key)
    const client = await use(t, new SSEClientTransport(new URL(`${gw.url}/sse/full`), {
      requestInit: { headers },
      eventSourceInit: { fetch: async (url, init) => await fetch(url, { ...init, headers: { ...Object.fromEntries(new Headers(init?.headers).entries()), ...headers } }) }
    }))
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'legacy' } })), 'legacy')
  })

  t.test('a JWT in requestInit.headers', async t => {
    const client = await use(t, new StreamableHTTPClientTransport(mcp, { requestInit: { headers: bearer(await issuer.mint()) } }))
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'with a jwt' } })), 'with a jwt')
  })

  t.test('a JWT from an OAuthClientProvider (the SDK adds the header itself)', async t => {
    const token = await issuer.mint()
    let tokensAsked = 0
    const provider: OAuthClientProvider = {
      redirectUrl: 'http://127.0.0.1/callback',
      clientMetadata: { redirect_uris: ['http://127.0.0.1/callback'], client_name: 'sdk-auth-test' },
      clientInformation: () => ({ client_id: 'sdk-auth-test' }),
      tokens: () => { tokensAsked++; return { access_token: token, token_type: 'Bearer' } },
      saveTokens: () => {},
      redirectToAuthorization: () => { throw new Error('no interactive authorization in a test') },
      saveCodeVerifier: () => {},
      codeVerifier: () => 'unused'
    }
    const client = await use(t, new StreamableHTTPClientTransport(mcp, { authProvider: provider }))
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'provider' } })), 'provider')
    t.ok(tokensAsked > 0, 'the token came from the provider')
  })

  t.test('without a credential the SDK client fails with the 401', async t => {
    const client = new Client({ name: 'sdk-auth-test', version: '1.0.0' })
    await t.rejects(client.connect(new StreamableHTTPClientTransport(mcp)), { code: 401, message: /Unauthorized: a credential is required/ })
    await client.close().catch(() => {})
  })

  t.test('the SDK finds and parses our metadata from the challenge', async t => {
    const res = await post(gw.url, '/mcp/full', initMessage())
    t.equal(extractResourceMetadataUrl(res)?.href, `${PUBLIC_URL}/.well-known/oauth-protected-resource/mcp/full`)
    // Discovery from the endpoint URL itself: the path-inserted well-known location.
    const metadata = await discoverOAuthProtectedResourceMetadata(mcp)
    t.equal(metadata.resource, `${PUBLIC_URL}/mcp/full`)
    t.same(metadata.authorization_servers, [ISSUER])
    t.same(metadata.bearer_methods_supported, ['header'])
  })
})
