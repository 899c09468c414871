// The checks of `credentials` blocks the schema cannot say (docs/credentials.md): which fields
// each source needs, where a block may stand, and which servers can carry a per-user credential.
// Like every config check, a problem names the path only, never the value (a secret may sit there).
import { isLoopbackAddress } from '../core/loopback.js'
import type { Config, CredentialsConfig, ServerConfig } from './schema.js'

export type AddProblem = (path: string, reason: string) => void

const pointer = (base: string, key: string): string => `${base}/${key.replaceAll('~', '~0').replaceAll('/', '~1')}`
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/
// Headers the backend connection sets itself; the credential cannot take their place.
const MANAGED = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade',
  'content-length', 'host', 'content-type', 'accept', 'mcp-session-id', 'mcp-protocol-version', 'last-event-id', 'mcp-method', 'mcp-name'])

/**
 * Whether `tenant`'s users of `server` each need backend connections of their own: a per-user
 * source. A pool is then kept per (server, tenant, subject) (routing/upstream/pool.ts).
 */
export function needsOwnConnections (config: Pick<Config, 'servers' | 'tenants'>, tenant: string | null, server: string): boolean {
  return isPerUserSource(credentialsConfigOf(config, tenant, server))
}

/**
 * Whether `tenant`'s requests to `server` need the caller's own JWT at hand: a token-exchange
 * source on the server, or on a member of it when it is an aggregate (its members' credentials
 * are exchanged for the aggregate's caller).
 */
export function wantsCallerToken (config: Pick<Config, 'servers' | 'tenants'>, tenant: string | null, server: string): boolean {
  const serverConfig = Object.hasOwn(config.servers, server) ? config.servers[server] : undefined
  if (serverConfig?.transport === 'aggregate') return serverConfig.members.some(m => credentialsConfigOf(config, tenant, m.server)?.source === 'token-exchange')
  return credentialsConfigOf(config, tenant, server)?.source === 'token-exchange'
}

/** Sources whose credential belongs to one user (not to the tenant). */
export function isPerUserSource (config: CredentialsConfig | undefined): boolean {
  return config?.source === 'token-exchange' || config?.source === 'user-authorization'
}

type Field = 'issuer' | 'tokenEndpoint' | 'authorizationEndpoint' | 'clientId' | 'clientSecret' | 'audience' | 'resource' | 'requestedTokenType' | 'redirectBaseUrl'

// The optional fields each source reads; any other one set is a mistake worth saying.
const FIELDS: Record<CredentialsConfig['source'], readonly Field[]> = {
  static: [],
  'token-exchange': ['issuer', 'tokenEndpoint', 'clientId', 'clientSecret', 'audience', 'resource', 'requestedTokenType'],
  'client-credentials': ['issuer', 'tokenEndpoint', 'clientId', 'clientSecret', 'audience', 'resource'],
  'user-authorization': ['issuer', 'tokenEndpoint', 'authorizationEndpoint', 'clientId', 'clientSecret', 'resource', 'redirectBaseUrl']
}
const ALL_FIELDS: readonly Field[] = ['issuer', 'tokenEndpoint', 'authorizationEndpoint', 'clientId', 'clientSecret', 'audience', 'resource', 'requestedTokenType', 'redirectBaseUrl']

/** One `credentials` block at `path`, for `server` (its config). */
export function checkCredentials (path: string, credentials: CredentialsConfig, server: ServerConfig, add: AddProblem): void {
  const { source } = credentials
  if (server.transport === 'aggregate') {
    add(path, 'applies to the members (set it on the member servers)')
    return
  }
  if (server.transport === 'stdio') {
    // A child takes its credential in its environment, once, when it starts: no header.
    if (source !== 'static' && credentials.env === undefined) add(`${path}/env`, `is required on a stdio server (the child's variable the ${source} credential goes in)`)
    if (credentials.env !== undefined && Object.hasOwn(server.env, credentials.env)) add(`${path}/env`, 'names a variable the server\'s env already sets')
  } else {
    if (!TOKEN.test(credentials.header)) add(`${path}/header`, 'is not a valid header name')
    else if (MANAGED.has(credentials.header.toLowerCase())) add(`${path}/header`, 'is set by the gateway and cannot carry a credential')
    for (const field of ['env', 'envTemplate'] as const) {
      if (credentials[field] !== undefined) add(`${path}/${field}`, 'applies to stdio servers only (an HTTP backend takes the credential in `header`)')
    }
  }
  for (const field of ALL_FIELDS) {
    if (credentials[field] !== undefined && !FIELDS[source].includes(field)) add(`${path}/${field}`, `is not used by source ${source}`)
  }
  for (const field of ['issuer', 'tokenEndpoint', 'authorizationEndpoint', 'resource', 'redirectBaseUrl'] as const) {
    const problem = urlProblem(credentials[field])
    if (problem !== undefined) add(`${path}/${field}`, problem)
  }
  const need = (field: Field, why: string): void => {
    if (credentials[field] === undefined) add(`${path}/${field}`, `is required for source ${source} (${why})`)
  }
  switch (source) {
    case 'static':
      return
    case 'token-exchange':
      needEndpoint(path, credentials, add)
      need('clientId', 'the gateway authenticates its exchanges')
      need('clientSecret', 'the gateway authenticates its exchanges')
      if (credentials.audience === undefined && credentials.resource === undefined) add(`${path}/audience`, 'is required for source token-exchange (or resource): the token asked for must name the backend')
      break
    case 'client-credentials':
      needEndpoint(path, credentials, add)
      need('clientId', 'the gateway is that client')
      need('clientSecret', 'a client credentials grant needs a confidential client')
      break
    case 'user-authorization':
      // Without either, the authorization server is found from the backend's protected resource
      // metadata at `resource` (RFC 9728), as an MCP client finds it.
      if (credentials.issuer === undefined && credentials.resource === undefined && (credentials.authorizationEndpoint === undefined || credentials.tokenEndpoint === undefined)) {
        add(`${path}/issuer`, 'is required for source user-authorization (or resource, whose protected resource metadata names it, or both authorizationEndpoint and tokenEndpoint)')
      }
      need('clientId', 'the user consents to the gateway as that client')
      need('redirectBaseUrl', 'the authorization server sends the user back there')
      break
  }
  // A legacy SSE session's backend connection lives on one replica, but each request's client
  // token arrives wherever its POST lands: a per-user credential could not follow it.
  if (isPerUserSource(credentials) && server.transport === 'sse') add(`${path}/source`, `${source} needs a streamable-http server (a legacy SSE connection cannot take each user's credential per request)`)
}

function needEndpoint (path: string, credentials: CredentialsConfig, add: AddProblem): void {
  if (credentials.issuer === undefined && credentials.tokenEndpoint === undefined) add(`${path}/issuer`, `is required for source ${credentials.source} (or tokenEndpoint)`)
}

/** https, or http to a loopback host only: tokens and client secrets travel there. */
function urlProblem (text: string | undefined): string | undefined {
  if (text === undefined) return undefined
  let url: URL
  try { url = new URL(text) } catch { return 'must be a valid URL' }
  if (url.hostname === '') return 'must be a valid URL'
  if (url.protocol === 'http:' && !isLoopbackAddress(url.hostname.replace(/^\[|\]$/g, ''))) return 'must be https (http only for a loopback host)'
  return undefined
}

/** Every `credentials` block of the config: servers' and tenants' own. */
export function checkAllCredentials (config: Config, add: AddProblem): void {
  for (const [name, server] of Object.entries(config.servers)) {
    if (server.transport === 'aggregate' || server.credentials === undefined) continue
    const path = `${pointer('/servers', name)}/credentials`
    checkCredentials(path, server.credentials, server, add)
    // Without tenants every caller is the one anonymous principal: there is no user to act for.
    if (config.tenants === undefined && server.credentials.source !== 'static') add(`${path}/source`, `${server.credentials.source} needs tenants (callers with an identity)`)
  }
  for (const [tenant, settings] of Object.entries(config.tenants ?? {})) {
    for (const [name, entry] of Object.entries(settings.servers)) {
      const server = Object.hasOwn(config.servers, name) ? config.servers[name] : undefined
      if (server === undefined || entry.credentials === undefined) continue
      checkCredentials(`${pointer(`${pointer('/tenants', tenant)}/servers`, name)}/credentials`, entry.credentials, server, add)
    }
  }
}

/**
 * The credentials config that applies to `tenant`'s users of `server`: the tenant's own block,
 * else the server's; undefined means static (configured headers only).
 */
export function credentialsConfigOf (config: Pick<Config, 'servers' | 'tenants'>, tenant: string | null, server: string): CredentialsConfig | undefined {
  const tenantConfig = tenant !== null && config.tenants !== undefined && Object.hasOwn(config.tenants, tenant) ? config.tenants[tenant] : undefined
  const own = tenantConfig !== undefined && Object.hasOwn(tenantConfig.servers, server) ? tenantConfig.servers[server]?.credentials : undefined
  if (own !== undefined) return own
  const serverConfig = Object.hasOwn(config.servers, server) ? config.servers[server] : undefined
  return serverConfig === undefined || serverConfig.transport === 'aggregate' ? undefined : serverConfig.credentials
}

/** Whether any server or tenant has a credential source beyond static. */
export function hasCredentialSources (config: Pick<Config, 'servers' | 'tenants'>): boolean {
  const blocks = [
    ...Object.values(config.servers).map(s => s.transport === 'aggregate' ? undefined : s.credentials),
    ...Object.values(config.tenants ?? {}).flatMap(t => Object.values(t.servers).map(s => s.credentials))
  ]
  return blocks.some(b => b !== undefined && b.source !== 'static')
}
