// A real authorization server for the user-authorization tests: oidc-provider with the
// authorization code flow and PKCE, its development login and consent pages (any login name is that
// user), refresh tokens (rotated on every use), RFC 7009 revocation and RFC 7662 introspection.
// Access tokens are opaque (or JWTs, signed with its `/jwks` keys, when asked) and bound to the resource asked for (RFC 8707), so a revoked token is
// refused by the backend fixture, which introspects every token. Also here: a browser (redirects
// and cookies followed, the provider's pages filled in) and that backend, which publishes protected
// resource metadata (RFC 9728) and reports the subject each request's token belongs to.
import type { IncomingMessage, ServerResponse } from 'node:http'
import { generateKeyPair, exportJWK } from 'jose'
import Provider, { type KoaContextWithOIDC } from 'oidc-provider'
import type { Test } from 'tap'
import { listen, readBody } from '../fixtures/http-upstreams.js'

export const UA_CLIENT = { id: 'gateway-ua', secret: 'gateway-ua-secret-0123456789abcdef' }
const BACKEND_CLIENT = { id: 'backend', secret: 'backend-secret-0123456789abcdef' }

export interface ConsentServer {
  issuer: string
  /** Lifetime of the next access tokens, in seconds. */
  ttlSeconds: number
  /** Token grants answered, by grant type (authorization_code, refresh_token). */
  grants: string[]
  /** Whether the provider takes `token` now (RFC 7662 introspection). */
  introspect: (token: string) => Promise<{ active: boolean, sub?: string, aud?: unknown, scope?: string }>
  /** RFC 7009 revocation, as the gateway's client. */
  revoke: (token: string, hint: 'refresh_token' | 'access_token') => Promise<void>
  /** A refresh as the gateway's client would make it (HTTP status and body). */
  refreshRaw: (refreshToken: string, resource: string) => Promise<{ status: number, body: Record<string, unknown> }>
}

/** Starts the provider; `redirectUris()` is read when the client is first used (the gateway's port is known later). */
export async function startConsentServer (t: Test, redirectUris: string[], options: { tokenFormat?: 'opaque' | 'jwt' } = {}): Promise<ConsentServer> {
  const { privateKey } = await generateKeyPair('RS256', { extractable: true })
  const signing = { ...(await exportJWK(privateKey)), kid: 'as-1', alg: 'RS256', use: 'sig' }
  let handler: ((req: IncomingMessage, res: ServerResponse) => void) | undefined
  const http = await listen((req, res) => { handler?.(req, res) })
  const state: ConsentServer = {
    issuer: http.url,
    ttlSeconds: 300,
    grants: [],
    introspect: async token => await form('/token/introspection', BACKEND_CLIENT, { token }) as { active: boolean },
    revoke: async (token, hint) => { await form('/token/revocation', UA_CLIENT, { token, token_type_hint: hint }) },
    refreshRaw: async (refreshToken, resource) => {
      const res = await fetch(`${http.url}/token`, { method: 'POST', headers: { authorization: basic(UA_CLIENT), 'content-type': 'application/x-www-form-urlencoded' }, body: new URLSearchParams({ grant_type: 'refresh_token', refresh_token: refreshToken, resource }) })
      return { status: res.status, body: await res.json() as Record<string, unknown> }
    }
  }
  async function form (path: string, client: { id: string, secret: string }, body: Record<string, string>): Promise<unknown> {
    const res = await fetch(`${http.url}${path}`, { method: 'POST', headers: { authorization: basic(client), 'content-type': 'application/x-www-form-urlencoded' }, body: new URLSearchParams(body) })
    const text = await res.text()
    return text === '' ? {} : JSON.parse(text)
  }
  const provider: Provider = new Provider(http.url, {
    clients: [{
      client_id: UA_CLIENT.id,
      client_secret: UA_CLIENT.secret,
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      redirect_uris: redirectUris,
      token_endpoint_auth_method: 'client_secret_basic'
    }, {
      client_id: BACKEND_CLIENT.id,
      client_secret: BACKEND_CLIENT.secret,
      grant_types: [],
      response_types: [],
      redirect_uris: []
    }],
    jwks: { keys: [signing] },
    features: {
      devInteractions: { enabled: true },
      revocation: { enabled: true },
      introspection: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => undefined as unknown as string,
        getResourceServerInfo: (_ctx: unknown, indicator: string) => ({ audience: indicator, scope: 'read write', accessTokenFormat: options.tokenFormat ?? 'opaque', accessTokenTTL: state.ttlSeconds, ...(options.tokenFormat === 'jwt' ? { jwt: { sign: { alg: 'RS256' } } } : {}) }),
        useGrantedResource: () => true
      }
    },
    scopes: ['openid', 'offline_access', 'read', 'write'],
    issueRefreshToken: async () => true,
    rotateRefreshToken: () => true,
    ttl: { AccessToken: () => state.ttlSeconds, RefreshToken: 86_400, Grant: 86_400, Session: 3600, Interaction: 600, AuthorizationCode: 60 }
  })
  provider.on('grant.success', (ctx: KoaContextWithOIDC) => { state.grants.push(String(ctx.oidc.params.grant_type)) })
  const callback = provider.callback()
  handler = (req, res) => { void callback(req, res) }
  t.teardown(http.close)
  return state
}

const basic = (client: { id: string, secret: string }): string => `Basic ${Buffer.from(`${encodeURIComponent(client.id)}:${encodeURIComponent(client.secret)}`).toString('base64')}`

/** A browser's cookie jar (names only: every test host is 127.0.0.1, and cookies ignore ports). */
export type CookieJar = Map<string, string>

export interface Visit { status: number, url: URL, text: string, visited: URL[] }

/**
 * Opens `url` as a browser would, signing in as `login` on the provider's pages; stops at the first
 * page that is not a redirect or a provider form, or before fetching a URL `stopBefore` accepts.
 */
export async function browse (url: string, login: string, options: { jar?: CookieJar, stopBefore?: (url: URL) => boolean } = {}): Promise<Visit> {
  const jar = options.jar ?? new Map<string, string>()
  const visited: URL[] = []
  let current = new URL(url)
  let body: string | undefined
  for (let hop = 0; hop < 30; hop++) {
    if (options.stopBefore?.(current) === true) return { status: 0, url: current, text: '', visited }
    visited.push(current)
    const headers: Record<string, string> = { cookie: [...jar].map(([k, v]) => `${k}=${v}`).join('; ') }
    if (body !== undefined) headers['content-type'] = 'application/x-www-form-urlencoded'
    const res = await fetch(current, { method: body === undefined ? 'GET' : 'POST', redirect: 'manual', headers, ...(body === undefined ? {} : { body }) })
    body = undefined
    for (const line of res.headers.getSetCookie()) {
      const [pair = '', ...attrs] = line.split(';')
      const eq = pair.indexOf('=')
      const name = pair.slice(0, eq).trim()
      const gone = attrs.some(a => /^\s*max-age=0\s*$/i.test(a) || /^\s*expires=.*1970/i.test(a))
      if (gone) jar.delete(name)
      else jar.set(name, pair.slice(eq + 1).trim())
    }
    const location = res.headers.get('location')
    if (res.status >= 300 && res.status < 400 && location !== null) {
      await res.body?.cancel()
      current = new URL(location, current)
      continue
    }
    const text = await res.text()
    const prompt = /name="prompt" value="(login|consent)"/.exec(text)?.[1]
    const action = /<form[^>]*action="([^"]+)"/.exec(text)?.[1]
    if (prompt !== undefined && action !== undefined) {
      body = new URLSearchParams(prompt === 'login' ? { prompt, login, password: 'any' } : { prompt }).toString()
      current = new URL(action.replaceAll('&amp;', '&'), current)
      continue
    }
    return { status: res.status, url: current, text, visited }
  }
  throw new Error('too many redirects')
}

export interface SubjectBackend {
  url: string
  /** The subject of each request's token, as introspection told it (null: refused). */
  seen: Array<string | null>
}

/** An HTTP MCP backend: answers a JSON-RPC request with the subject of its bearer token, 401 without a live one. */
export async function startSubjectBackend (t: Test, as: ConsentServer): Promise<SubjectBackend> {
  const seen: Array<string | null> = []
  const server = await listen((req, res) => {
    void (async () => {
      const path = new URL(req.url ?? '/', 'http://x').pathname
      if (path === '/.well-known/oauth-protected-resource/mcp') {
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ resource: `${server.url}/mcp`, authorization_servers: [as.issuer] }))
        return
      }
      const request = JSON.parse(await readBody(req)) as { id: unknown }
      const token = /^Bearer (\S+)$/.exec(req.headers.authorization ?? '')?.[1]
      const info = token === undefined ? { active: false } : await as.introspect(token)
      const sub = info.active && info.aud === `${server.url}/mcp` ? String((info as { sub?: string }).sub) : null
      seen.push(sub)
      if (sub === null) {
        res.writeHead(401, { 'www-authenticate': `Bearer resource_metadata="${server.url}/.well-known/oauth-protected-resource/mcp"` }).end()
        return
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: request.id, result: { content: [{ type: 'text', text: sub }] } }))
    })()
  })
  t.teardown(server.close)
  const backend: SubjectBackend = { url: server.url, seen }
  return backend
}
