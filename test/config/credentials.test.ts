// `credentials` blocks: each source's required fields, where a block may stand, which servers can
// carry a per-user credential, and which block applies to a tenant's users.
import t from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { credentialsConfigOf } from '../../src/config/credentials-check.js'

const base = (servers: Record<string, unknown>, tenantServers: Record<string, unknown> = { api: {} }): Record<string, unknown> => ({
  auth: { publicUrl: 'https://gw.example' },
  tenants: { acme: { apiKeys: [{ id: 'k', sha256: 'a'.repeat(64) }], servers: tenantServers } },
  servers
})
const problemsOf = (raw: unknown): string => {
  try { parseConfig(raw, {}); return '' } catch (err) { return (err as Error).message }
}

t.test('a complete block of each source passes, with defaults filled in', async t => {
  const config = parseConfig(base({
    api: { transport: 'streamable-http', url: 'https://api.example/mcp', credentials: { source: 'token-exchange', issuer: 'https://as.example', clientId: 'gw', clientSecret: 's', audience: 'api' } },
    cc: { transport: 'sse', url: 'https://cc.example/sse', credentials: { source: 'client-credentials', tokenEndpoint: 'https://as.example/token', clientId: 'gw', clientSecret: 's', scopes: ['read'] } },
    ua: { transport: 'streamable-http', url: 'https://ua.example/mcp', credentials: { source: 'user-authorization', issuer: 'https://as.example', clientId: 'gw', redirectBaseUrl: 'https://gw.example' } },
    st: { transport: 'streamable-http', url: 'https://st.example/mcp', credentials: { source: 'static' } }
  }), {})
  const api = config.servers.api
  t.equal(api?.transport, 'streamable-http')
  if (api?.transport !== 'streamable-http') return
  t.same(api.credentials, {
    source: 'token-exchange', issuer: 'https://as.example', clientId: 'gw', clientSecret: 's', audience: 'api',
    header: 'authorization', scheme: 'Bearer', clientAuth: 'client_secret_basic', scopes: [],
    subjectTokenType: 'urn:ietf:params:oauth:token-type:access_token',
    refreshBeforeMs: 30_000, defaultLifetimeMs: 300_000, refusalCacheMs: 10_000, timeoutMs: 5000
  })
})

t.test('each source says which fields it misses, and which it does not use', async t => {
  const message = problemsOf(base({
    a: { transport: 'streamable-http', url: 'https://a.example/mcp', credentials: { source: 'token-exchange', clientId: 'gw' } },
    b: { transport: 'streamable-http', url: 'https://b.example/mcp', credentials: { source: 'client-credentials', issuer: 'https://as.example', clientId: 'gw', redirectBaseUrl: 'https://gw.example' } },
    c: { transport: 'streamable-http', url: 'https://c.example/mcp', credentials: { source: 'user-authorization', clientId: 'gw', tokenEndpoint: 'https://as.example/t' } },
    d: { transport: 'streamable-http', url: 'https://d.example/mcp', credentials: { source: 'static', header: 'mcp-session-id' } }
  }, {}))
  t.match(message, '/servers/a/credentials/issuer: is required for source token-exchange (or tokenEndpoint)')
  t.match(message, '/servers/a/credentials/clientSecret: is required for source token-exchange')
  t.match(message, '/servers/a/credentials/audience: is required for source token-exchange (or resource)')
  t.match(message, '/servers/b/credentials/clientSecret: is required for source client-credentials')
  t.match(message, '/servers/b/credentials/redirectBaseUrl: is not used by source client-credentials')
  t.match(message, '/servers/c/credentials/issuer: is required for source user-authorization (or resource, whose protected resource metadata names it, or both authorizationEndpoint and tokenEndpoint)')
  t.match(message, '/servers/c/credentials/redirectBaseUrl: is required for source user-authorization')
  t.match(message, '/servers/d/credentials/header: is set by the gateway')
})

t.test('a secret is never echoed, and plain http is for loopback only', async t => {
  const message = problemsOf(base({
    a: { transport: 'streamable-http', url: 'https://a.example/mcp', credentials: { source: 'client-credentials', tokenEndpoint: 'http://as.example/token', clientId: 'gw', clientSecret: 'hunter2-secret', audience: 'x', requestedTokenType: 'y' } }
  }, {}))
  t.match(message, '/servers/a/credentials/tokenEndpoint: must be https (http only for a loopback host)')
  t.match(message, '/servers/a/credentials/requestedTokenType: is not used by source client-credentials')
  t.notMatch(message, 'hunter2')
  t.equal(problemsOf(base({
    a: { transport: 'streamable-http', url: 'https://a.example/mcp', credentials: { source: 'client-credentials', tokenEndpoint: 'http://127.0.0.1:9/token', clientId: 'gw', clientSecret: 's' } }
  }, {})), '')
})

t.test('per-user sources need tenants and a streamable-http or stdio server; a stdio block names its env; aggregates take none', async t => {
  const te = { source: 'token-exchange', tokenEndpoint: 'https://as.example/t', clientId: 'gw', clientSecret: 's', audience: 'x' }
  const noTenants = problemsOf({ servers: { a: { transport: 'streamable-http', url: 'https://a.example/mcp', credentials: te } } })
  t.match(noTenants, '/servers/a/credentials/source: token-exchange needs tenants')
  const message = problemsOf(base({
    s: { transport: 'sse', url: 'https://s.example/sse', credentials: te },
    p: { transport: 'stdio', command: 'x' },
    g: { transport: 'aggregate', members: [{ server: 'p' }] }
  }, { p: { credentials: te }, g: { credentials: te } }))
  t.match(message, '/servers/s/credentials/source: token-exchange needs a streamable-http server')
  t.match(message, '/tenants/acme/servers/p/credentials/env: is required on a stdio server')
  t.match(message, '/tenants/acme/servers/g/credentials: applies to the members')
  const stdio = problemsOf({ servers: { p: { transport: 'stdio', command: 'x', env: { TOKEN: 'x' }, credentials: { ...te, env: 'TOKEN' } } } })
  t.match(stdio, '/servers/p/credentials/env: names a variable the server\'s env already sets')
  t.match(stdio, '/servers/p/credentials/source: token-exchange needs tenants')
  t.match(problemsOf(base({ a: { transport: 'streamable-http', url: 'https://a.example/mcp', credentials: { ...te, env: 'TOKEN' } } })), '/servers/a/credentials/env: applies to stdio servers only')
  t.match(problemsOf(base({ a: { transport: 'streamable-http', url: 'https://a.example/mcp', credentials: { ...te, envTemplate: 'x {token}' } } })), '/servers/a/credentials/envTemplate: applies to stdio servers only')
})

t.test('a tenant\'s block replaces the server\'s for its users', async t => {
  const own = { source: 'client-credentials', tokenEndpoint: 'https://acme.example/t', clientId: 'acme', clientSecret: 's' }
  const config = parseConfig({
    auth: { publicUrl: 'https://gw.example' },
    tenants: {
      acme: { apiKeys: [{ id: 'k', sha256: 'a'.repeat(64) }], servers: { api: { credentials: own } } },
      other: { apiKeys: [{ id: 'k', sha256: 'b'.repeat(64) }], servers: { api: {} } }
    },
    servers: { api: { transport: 'streamable-http', url: 'https://api.example/mcp', credentials: { source: 'token-exchange', issuer: 'https://as.example', clientId: 'gw', clientSecret: 's', audience: 'api' } } }
  }, {})
  t.equal(credentialsConfigOf(config, 'acme', 'api')?.clientId, 'acme')
  t.equal(credentialsConfigOf(config, 'other', 'api')?.source, 'token-exchange')
  t.equal(credentialsConfigOf(config, null, 'api')?.source, 'token-exchange')
  t.equal(credentialsConfigOf(config, 'acme', 'nope'), undefined)
})
