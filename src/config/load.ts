// Reads the gateway's configuration once at boot: YAML or JSON, `${NAME}` placeholders expanded
// from the environment and `${file:PATH}` ones from files (mounted secrets), validated against schema.ts with every failing path listed in one
// error, then deep-frozen (docs/architecture.md).
//
// This is the only module that reads process.env, and only as a default parameter, so tests and
// main.ts can pass their own environment.
//
// Paths in the config are used as written, never rewritten against the config file's folder:
// - a relative stdio `command` (e.g. `./bin/server`) resolves against the server's `cwd` when one
//   is set, else against the gateway's working directory (the child chdirs before exec);
//   a bare name (`node`, `npx`) is looked up on the child's PATH;
// - a relative `cwd` resolves against the gateway's working directory;
// - `args` are handed to the child verbatim, so the child resolves them against its own cwd.
// `npm start` runs from the repository root, so the shipped configs use repo-relative paths.
import { readFileSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { extname } from 'node:path'
import { parseArgs as parseNodeArgs } from 'node:util'
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv'
import { parseDocument } from 'yaml'
import { configSchema, NAME_PATTERN, type AggregateServerConfig, type Config } from './schema.js'
import { GW_ERR_CONFIG_INVALID } from '../core/errors.js'
import { isLoopbackAddress } from '../core/loopback.js'
import { trustedProxyProblem } from '../core/ip-address.js'
import { deepFreeze } from '../core/freeze.js'
import { checkAllCredentials } from './credentials-check.js'

export type { Config }

export const DEFAULT_CONFIG_PATH = 'config/gateway.yaml'
/**
 * The config file when no --config is given: an image sets it, so an orchestrator can point at a
 * mounted file without replacing the command (and with it the init process in the entrypoint).
 */
export const CONFIG_PATH_VARIABLE = 'MCP_GATEWAY_CONFIG'

export const USAGE = `Usage: mcp-gateway [--config FILE]
       mcp-gateway --check-config FILE
       mcp-gateway key TENANT ID

Options:
  -c, --config FILE        configuration file, YAML or JSON (default: $${CONFIG_PATH_VARIABLE}
                           when set, else ${DEFAULT_CONFIG_PATH})
      --check-config FILE  validate FILE (every problem listed), print the result and exit:
                           0 valid, 1 invalid; nothing is started
  -h, --help               print this help and exit
  -V, --version            print the version and exit

Commands:
  key TENANT ID            print a new API key for TENANT (key id ID) and the config line
                           holding its SHA-256; the key itself is stored nowhere
`

export interface CliArgs {
  configPath: string
  /** --help was given: the caller prints USAGE and exits 0. */
  help: boolean
  /** --version was given: the caller prints it and exits 0. */
  version: boolean
  /** --check-config FILE: validate configPath and exit without starting. */
  checkOnly: boolean
}

/**
 * Parses the gateway's command line (argv without the node binary and script, i.e.
 * `process.argv.slice(2)`). Unknown options and stray positionals are GW_ERR_CONFIG_INVALID.
 * Without --config, the file is $MCP_GATEWAY_CONFIG when set and not empty, else the default.
 */
export function parseArgs (argv: string[], env: NodeJS.ProcessEnv = process.env): CliArgs {
  let parsed
  try {
    parsed = parseNodeArgs({
      args: argv,
      options: {
        config: { type: 'string', short: 'c' },
        'check-config': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
        version: { type: 'boolean', short: 'V' }
      },
      strict: true,
      allowPositionals: false
    })
  } catch (err) {
    throw new GW_ERR_CONFIG_INVALID(`${(err as Error).message}\n${USAGE}`, { cause: err })
  }
  const check = parsed.values['check-config']
  if (check !== undefined && parsed.values.config !== undefined) throw new GW_ERR_CONFIG_INVALID(`--check-config and --config do not go together\n${USAGE}`)
  const fromEnv = env[CONFIG_PATH_VARIABLE]
  const configPath = check ?? parsed.values.config ?? (fromEnv === undefined || fromEnv === '' ? DEFAULT_CONFIG_PATH : fromEnv)
  if (configPath === '') throw new GW_ERR_CONFIG_INVALID(`${check !== undefined ? '--check-config' : '--config'} needs a file name\n${USAGE}`)
  return { configPath, help: parsed.values.help === true, version: parsed.values.version === true, checkOnly: check !== undefined }
}

/** The vault's keys from the environment (`MCPGW_VAULT_KEYS`, credentials/cipher.ts); undefined when unset or empty. */
export function vaultKeysFrom (env: NodeJS.ProcessEnv = process.env): string | undefined {
  const text = env.MCPGW_VAULT_KEYS
  return text === undefined || text.trim() === '' ? undefined : text
}

/**
 * Reads, expands, validates and freezes the configuration at `path`. `.json` files are parsed as
 * JSON; anything else as YAML (which also accepts JSON). Every problem is reported at once in a
 * single GW_ERR_CONFIG_INVALID whose message lists one `/json/pointer: reason` per line.
 */
export async function loadConfig (path: string, env: NodeJS.ProcessEnv = process.env): Promise<Readonly<Config>> {
  let text: string
  try {
    text = await readFile(path, 'utf8')
  } catch (err) {
    throw new GW_ERR_CONFIG_INVALID(`cannot read ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`, { cause: err })
  }
  return parseConfig(extname(path).toLowerCase() === '.json' ? parseJson(path, text) : parseYaml(path, text), env)
}

/**
 * Expands placeholders in `raw` (which is not modified), validates the result, applies the
 * schema's defaults and returns it deep-frozen. Its only I/O is reading the files that
 * `${file:PATH}` placeholders name, so a reload sees a rotated secret.
 */
export function parseConfig (raw: unknown, env: NodeJS.ProcessEnv = process.env): Readonly<Config> {
  const problems = new Problems()
  const expanded = expand(raw, '', env, problems)
  // Read before validation fills in defaults: whether poolSize was written decides below.
  const poolSizeGiven = serversSetting(expanded, 'poolSize')
  const validate = validator()
  if (!validate(expanded)) {
    for (const e of relevantErrors(validate.errors ?? [])) problems.add(...renderAjvError(e))
  } else {
    checkSemantics(expanded as Config, poolSizeGiven, problems)
  }
  problems.throwIfAny()
  applyModeDefaults(expanded as Config, poolSizeGiven)
  return deepFreeze(withNameMaps(expanded as Config))
}

/**
 * The maps keyed by configured names (servers, tenants, a tenant's servers) without a prototype:
 * a server or tenant may be named `constructor`, `toString` or `valueOf`, and `servers[name]` must
 * then read that server, and `servers.toString` (for a name nobody configured) nothing, wherever
 * the code looks a name up.
 */
function withNameMaps (config: Config): Config {
  const bare = <T>(map: Record<string, T>): Record<string, T> => Object.assign(Object.create(null) as Record<string, T>, map)
  config.servers = bare(config.servers)
  if (config.tenants !== undefined) {
    config.tenants = bare(config.tenants)
    for (const tenant of Object.values(config.tenants)) tenant.servers = bare(tenant.servers)
  }
  return config
}

/** Default sessions per replica of a stdio server: children when dedicated, sessions when pooled. */
export const DEDICATED_MAX_SESSIONS = 100
export const POOLED_MAX_SESSIONS = 10_000

/**
 * Defaults that depend on another key (the schema cannot say them): maxSessions by mode, and a
 * poolSize left unset is at most poolMax (`poolMax: 2` alone means a pool of at most 2).
 */
function applyModeDefaults (config: Config, poolSizeGiven: ReadonlySet<string>): void {
  for (const [name, server] of Object.entries(config.servers)) {
    if (server.transport === 'aggregate') continue
    if (!poolSizeGiven.has(name) && server.poolSize !== undefined && server.poolMax !== undefined && server.poolSize > server.poolMax) {
      (server as { poolSize: number }).poolSize = server.poolMax
    }
    if (server.transport !== 'stdio') continue
    const mutable = server as { maxSessions?: number }
    mutable.maxSessions ??= server.sessions === 'pooled' ? POOLED_MAX_SESSIONS : DEDICATED_MAX_SESSIONS
  }
}

/** The servers (by name) whose settings, as written, have `key`. */
function serversSetting (raw: unknown, key: string): Set<string> {
  const servers = isPlainObject(raw) && isPlainObject(raw.servers) ? raw.servers : {}
  return new Set(Object.entries(servers).filter(([, s]) => isPlainObject(s) && Object.hasOwn(s, key)).map(([name]) => name))
}

// strict: true rejects unknown keywords, ignored defaults and type-less keywords in the schema
// itself, so a schema typo fails at boot instead of silently loosening validation; the schema's
// if/then/else passes it because each branch declares its type.
// coerceTypes: placeholders always expand to strings (`port: ${PORT:-8080}`), and YAML reads
// `args: [--port, 3000]` as a number; coercion turns each into the type the schema asks for.
// Its one lax case, null -> 0 / '' / false, is closed by expand(), which rejects null values.
// Compiled on first use, not at import: the image's HEALTHCHECK imports this module every few
// seconds for readListenAddress() alone, and the compile is most of an import's cost.
let compiled: ValidateFunction | undefined
function validator (): ValidateFunction {
  compiled ??= new Ajv({ allErrors: true, useDefaults: true, coerceTypes: true, strict: true }).compile(configSchema)
  return compiled
}

/**
 * The address the config at `path` listens on (placeholders expanded, the schema's defaults),
 * without validating the rest of the file: cheap enough for a health check run every few seconds.
 */
export async function readListenAddress (path: string, env: NodeJS.ProcessEnv = process.env): Promise<{ host: string, port: number }> {
  let text: string
  try {
    text = await readFile(path, 'utf8')
  } catch (err) {
    throw new GW_ERR_CONFIG_INVALID(`cannot read ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`, { cause: err })
  }
  const raw = extname(path).toLowerCase() === '.json' ? parseJson(path, text) : parseYaml(path, text)
  const listen = isPlainObject(raw) && isPlainObject(raw.listen) ? raw.listen : {}
  const problems = new Problems()
  const expanded = expand({ host: listen.host ?? configSchema.properties.listen.properties.host.default, port: listen.port ?? configSchema.properties.listen.properties.port.default }, '/listen', env, problems) as { host: unknown, port: unknown }
  problems.throwIfAny()
  const port = Number(expanded.port)
  if (typeof expanded.host !== 'string' || !Number.isInteger(port) || port < 0 || port > 65535) throw new GW_ERR_CONFIG_INVALID('/listen: not a valid host and port')
  return { host: expanded.host, port }
}

class Problems {
  readonly #lines = new Set<string>()
  // Paths already reported by expand(); ajv's errors at or below them are consequences.
  readonly #reported: string[] = []

  add (path: string, reason: string): void {
    if (this.#reported.some(p => path === p || path.startsWith(`${p}/`))) return
    this.#lines.add(`${path === '' ? '/' : path}: ${reason}`)
  }

  addRoot (path: string, reason: string): void {
    this.add(path, reason)
    this.#reported.push(path)
  }

  throwIfAny (): void {
    if (this.#lines.size === 0) return
    const n = this.#lines.size
    // Sorted, so the problems of one server read together.
    const lines = [...this.#lines].sort()
    throw new GW_ERR_CONFIG_INVALID(`${n} problem${n === 1 ? '' : 's'}\n  ${lines.join('\n  ')}`)
  }
}

const pointer = (base: string, key: string | number): string =>
  `${base}/${String(key).replaceAll('~', '~0').replaceAll('/', '~1')}`

// `$${` is a literal `${` (the leftmost match wins: `$$${X}` is `$` then a literal `${X}`);
// `${NAME}` or `${NAME:-default}` is a placeholder; a `${` that matches neither is reported
// rather than passed on, since it is almost always a typo. Other `$` characters are kept.
// `${file:PATH}` is the content of the file at PATH (relative to the working directory), one
// trailing newline dropped: a secret mounted as a file (a Kubernetes Secret volume, a compose
// secret) can be rotated without restarting, as every reload reads it again.
const PLACEHOLDER = /\$\$\{|\$\{([^}]*)\}|\$\{/g
const INNER = /^([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?$/s
const FILE_INNER = /^file:(.+)$/s

/** Copies `value` with every string expanded; records nulls, non-JSON values and bad placeholders. */
function expand (value: unknown, path: string, env: NodeJS.ProcessEnv, problems: Problems): unknown {
  if (typeof value === 'string') return expandString(value, path, env, problems)
  if (typeof value === 'number' || typeof value === 'boolean') return value
  if (value === null) {
    // YAML reads `port:` with nothing after it as null; ajv would coerce that to 0 or ''.
    problems.addRoot(path, 'must not be empty (give it a value or remove the key)')
    return value
  }
  if (Array.isArray(value)) return value.map((item, i) => expand(item, pointer(path, i), env, problems))
  if (isPlainObject(value)) {
    const out: Record<string, unknown> = {}
    for (const [key, item] of Object.entries(value)) {
      // defineProperty: a key named __proto__ stays a key instead of replacing the prototype.
      Object.defineProperty(out, key, { value: expand(item, pointer(path, key), env, problems), enumerable: true, writable: true, configurable: true })
    }
    return out
  }
  problems.addRoot(path, 'must be a string, number, boolean, array or mapping')
  return value
}

function isPlainObject (value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null) return false
  const proto: unknown = Object.getPrototypeOf(value)
  return proto === Object.prototype || proto === null
}

function expandString (text: string, path: string, env: NodeJS.ProcessEnv, problems: Problems): string {
  return text.replace(PLACEHOLDER, (match: string, inner: string | undefined) => {
    if (match === '$${') return '${'
    const file = inner === undefined ? null : FILE_INNER.exec(inner)
    if (file !== null) return readPlaceholderFile(file[1] as string, path, problems)
    const m = inner === undefined ? null : INNER.exec(inner)
    if (m === null) {
      // The text is not echoed: it may sit next to a secret.
      problems.addRoot(path, 'malformed placeholder: use ${NAME} or ${NAME:-default}, and $${ for a literal ${')
      return match
    }
    const name = m[1] as string
    const fallback = m[2]
    const found = env[name]
    // Shell semantics: `:-` also replaces a variable that is set but empty.
    if (fallback !== undefined) return found === undefined || found === '' ? fallback : found
    if (found === undefined) {
      problems.addRoot(path, `environment variable ${name} is not set`)
      return ''
    }
    return found
  })
}

function readPlaceholderFile (file: string, path: string, problems: Problems): string {
  let text: string
  try {
    text = readFileSync(file, 'utf8')
  } catch (err) {
    // The file's name is said, never its content.
    problems.addRoot(path, `cannot read file ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`)
    return ''
  }
  // `echo secret > file` and `kubectl create secret --from-file` keep the newline the value lacks.
  return text.endsWith('\r\n') ? text.slice(0, -2) : text.endsWith('\n') ? text.slice(0, -1) : text
}

// An `if` error only says "must match then/else" next to the branch's real errors; a
// `propertyNames` error only wraps the name's own error.
const NOISE = new Set(['if', 'propertyNames'])
const SERVER_TRANSPORT = /^#\/properties\/servers\/additionalProperties\/(?:properties\/transport|required)/

function relevantErrors (errors: ErrorObject[]): ErrorObject[] {
  // A server whose transport is missing or unknown gets that one error: the stdio-vs-http
  // branch errors next to it would be guesses about a shape the author did not choose.
  const badTransport = new Set(errors
    .filter(e => SERVER_TRANSPORT.test(e.schemaPath) && (e.keyword !== 'required' || e.params.missingProperty === 'transport'))
    .map(e => e.keyword === 'required' ? e.instancePath : e.instancePath.replace(/\/transport$/, '')))
  return errors.filter(e => {
    if (NOISE.has(e.keyword)) return false
    if (/\/(?:then|else)\//.test(e.schemaPath)) {
      const server = /^\/servers\/[^/]+/.exec(e.instancePath)?.[0]
      if (server !== undefined && badTransport.has(server)) return false
    }
    return true
  })
}

/** The longest aggregate member prefix, and the separator's length range (schema.ts patterns). */
export const MAX_PREFIX = 32
const PREFIX_WORDS = `must be at most ${MAX_PREFIX} characters, each a letter, digit, "_", "." or "-" ("" for no prefix)`
const SEPARATOR_WORDS = 'must be 1 to 8 characters, each a letter, digit, "_", "." or "-"'
// Patterns told in words: a regular expression is no way to tell an author a limit.
const PATTERN_WORDS: Array<[RegExp, string]> = [
  [/\/members\/items\/properties\/prefix\/pattern$/, PREFIX_WORDS],
  [/\/properties\/separator\/pattern$/, SEPARATOR_WORDS]
]

// Each server option and the transports it belongs to, so an option set on the wrong kind of
// server says where it belongs instead of only that it is unknown here.
const SERVER_BRANCHES = configSchema.properties.servers.additionalProperties
const SERVER_KINDS: Array<{ label: string, keys: string[] }> = [
  { label: 'stdio servers', keys: Object.keys(SERVER_BRANCHES.then.properties) },
  { label: 'HTTP servers (streamable-http, sse)', keys: Object.keys(SERVER_BRANCHES.else.else.properties) },
  { label: 'aggregate servers', keys: Object.keys(SERVER_BRANCHES.else.then.properties) }
]

function unknownOption (instancePath: string, key: string): string {
  if (!/^\/servers\/[^/]+$/.test(instancePath)) return 'is not a known option'
  const owners = SERVER_KINDS.filter(k => k.keys.includes(key)).map(k => k.label)
  return owners.length === 0 ? 'is not a known option' : `is an option of ${owners.join(' and ')} only`
}

/** One ajv error as [path, reason]. Reasons never include the offending value (it may be a secret). */
function renderAjvError (e: ErrorObject): [string, string] {
  const params = e.params as Record<string, unknown>
  if (e.propertyName !== undefined && e.keyword === 'pattern' && params.pattern === NAME_PATTERN) return [pointer(e.instancePath, e.propertyName), 'is not a valid name: a letter or digit, then letters, digits, - or _ (64 at most)']
  if (e.propertyName !== undefined) return [pointer(e.instancePath, e.propertyName), `name ${e.message ?? 'is invalid'}`]
  switch (e.keyword) {
    case 'required': return [pointer(e.instancePath, String(params.missingProperty)), 'is required']
    case 'additionalProperties': return [pointer(e.instancePath, String(params.additionalProperty)), unknownOption(e.instancePath, String(params.additionalProperty))]
    case 'pattern': {
      const words = PATTERN_WORDS.find(([re]) => re.test(e.schemaPath))?.[1]
      return [e.instancePath, words ?? e.message ?? 'fails pattern']
    }
    case 'enum': return [e.instancePath, `must be one of: ${(params.allowedValues as unknown[]).map(String).join(', ')}`]
    case 'const': return [e.instancePath, `must be ${String(params.allowedValue)}`]
    default: return [e.instancePath, e.message ?? `fails ${e.keyword}`]
  }
}

// Header names a backend connection sets itself: hop-by-hop and framing headers, and the MCP
// transport headers the gateway manages per session (a static or forwarded one would break it).
const MANAGED_HEADERS = new Set([
  'connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade',
  'content-length', 'host', 'mcp-session-id', 'mcp-protocol-version', 'last-event-id'
])
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/
const BEARER_TOKEN = /^[\x21-\x7e]+$/
// The client's own credentials never go upstream (A-UP-1: no token passthrough); the backends drop
// them too.
const CLIENT_CREDENTIALS = new Set(['authorization', 'x-api-key', 'cookie', 'proxy-authorization'])

/** Checks the schema cannot express. Each names the path only, never the value. */
function checkSemantics (config: Config, poolSizeGiven: ReadonlySet<string>, problems: Problems): void {
  if (config.redis !== undefined && !isUrl(config.redis.url)) problems.add('/redis/url', 'must be a valid URL')
  if (config.tracing !== undefined && !isUrl(config.tracing.otlpEndpoint)) problems.add('/tracing/otlpEndpoint', 'must be a valid URL')
  // `Authorization: Bearer <token>` carries one run of visible ASCII: a token with a space can never
  // be presented, and one with other characters arrives in another encoding than it was sent in.
  for (const [path, token] of [['/admin/token', config.admin?.token], ['/metrics/token', config.metrics.token]] as const) {
    if (token !== undefined && !BEARER_TOKEN.test(token)) problems.add(path, 'can never be presented in `Authorization: Bearer`: use visible ASCII characters only, no spaces (e.g. openssl rand -base64 32)')
  }
  config.http.trustedProxies.forEach((entry, i) => {
    const problem = trustedProxyProblem(entry)
    if (problem !== undefined) problems.add(`/http/trustedProxies/${i}`, problem)
  })
  for (const [name, server] of Object.entries(config.servers)) {
    const base = pointer('/servers', name)
    // A poolSize written above poolMax (given or default) is a contradiction: which one was meant
    // cannot be guessed. Unset, poolSize follows poolMax (applyModeDefaults).
    if (server.transport !== 'aggregate' && poolSizeGiven.has(name) && server.poolMax !== undefined && server.poolSize !== undefined && server.poolMax < server.poolSize) {
      const defaultMax = server.transport === 'stdio' ? SERVER_BRANCHES.then.properties.poolMax.default : SERVER_BRANCHES.else.else.properties.poolMax.default
      problems.add(`${base}/poolMax`, `must be at least poolSize (poolMax is ${server.poolMax}, poolSize ${server.poolSize}; unset, poolMax is ${defaultMax} for this transport)`)
    }
    if (server.transport === 'stdio') {
      checkDelays(`${base}/restart`, server.restart, problems)
      // spawn() throws on these at the first session; better to say so at boot.
      if (server.command.includes('\0')) problems.add(`${base}/command`, 'must not contain NUL')
      if (server.cwd?.includes('\0') === true) problems.add(`${base}/cwd`, 'must not contain NUL')
      server.args.forEach((arg, i) => { if (arg.includes('\0')) problems.add(`${base}/args/${i}`, 'must not contain NUL') })
      checkEnv(`${base}/env`, server.env, problems)
    } else if (server.transport === 'aggregate') {
      checkMembers(base, server, config.servers, problems)
    } else {
      checkDelays(`${base}/reconnect`, server.reconnect, problems)
      if (!isUrl(server.url)) problems.add(`${base}/url`, 'must be a valid URL')
      checkHeaders(`${base}/headers`, server.headers, problems)
      server.forwardHeaders.forEach((key, i) => {
        const at = `${base}/forwardHeaders/${i}`
        if (!TOKEN.test(key)) problems.add(at, 'is not a valid header name')
        else if (MANAGED_HEADERS.has(key.toLowerCase())) problems.add(at, 'is set by the gateway and cannot be forwarded')
        else if (CLIENT_CREDENTIALS.has(key.toLowerCase())) problems.add(at, 'is a client credential and never goes upstream (set upstream credentials in headers, or per tenant)')
      })
    }
  }
  checkAuth(config, problems)
  checkAllCredentials(config, (path, reason) => { problems.add(path, reason) })
}

/** An aggregate's members: configured servers, none an aggregate, each once. */
function checkMembers (base: string, server: AggregateServerConfig, servers: Config['servers'], problems: Problems): void {
  const seen = new Set<string>()
  server.members.forEach((member, i) => {
    const at = `${base}/members/${i}/server`
    const target = Object.hasOwn(servers, member.server) ? servers[member.server] : undefined
    if (target === undefined) problems.add(at, 'names no configured server')
    else if (target.transport === 'aggregate') problems.add(at, 'names an aggregate server: an aggregate cannot be a member of another')
    if (seen.has(member.server)) problems.add(at, 'names a server that is already a member')
    seen.add(member.server)
    // The default prefix is the server name (up to 64 characters): held to an explicit prefix's
    // limit, since past it every exposed name would be shortened to a digest with no trace of the
    // tool's own name (routing/aggregate/names.ts rule 2), leaving the model nothing to choose by.
    if (member.prefix === undefined && member.server.length > MAX_PREFIX) {
      problems.add(`${base}/members/${i}/prefix`, `is required for a server whose name is longer than ${MAX_PREFIX} characters (the default prefix is the server name; ${PREFIX_WORDS})`)
    }
  })
}

/**
 * Who may call. Without tenants nobody is authenticated, so the gateway may listen beyond
 * loopback only when `auth.anonymous` says so. With tenants, `auth.publicUrl` is required: each
 * endpoint's resource URL (RFC 9728 metadata, the 401 challenge, the default JWT audience) derives
 * from it, and deriving it from a request's Host header would let a caller choose it.
 */
function checkAuth (config: Config, problems: Problems): void {
  const tenants = config.tenants
  if (tenants === undefined) {
    if (!config.auth.anonymous && !isLoopbackAddress(config.listen.host)) {
      problems.add('/listen/host', 'is not a loopback address and no tenants are configured, so anyone reaching it could use every server: configure tenants, or set auth.anonymous: true to allow it')
    }
    return
  }
  if (config.auth.anonymous) problems.add('/auth/anonymous', 'must be false when tenants are configured (every MCP endpoint then needs a credential)')
  if (config.auth.publicUrl === undefined) problems.add('/auth/publicUrl', 'is required when tenants are configured (resource URLs and the 401 challenge derive from it)')
  else if (!isUrl(config.auth.publicUrl)) problems.add('/auth/publicUrl', 'must be a valid URL')
  for (const [name, tenant] of Object.entries(tenants)) {
    const base = pointer('/tenants', name)
    const ids = new Set<string>()
    tenant.apiKeys.forEach((key, i) => {
      if (ids.has(key.id)) problems.add(`${base}/apiKeys/${i}/id`, 'is used twice in this tenant')
      ids.add(key.id)
    })
    tenant.jwt.forEach((jwt, i) => {
      const at = `${base}/jwt/${i}`
      let url: URL | undefined
      try { url = new URL(jwt.jwksUri) } catch { problems.add(`${at}/jwksUri`, 'must be a valid URL') }
      // Keys fetched over plain HTTP could be swapped by anyone on the path.
      if (url !== undefined && url.protocol === 'http:' && !isLoopbackAddress(url.hostname)) problems.add(`${at}/jwksUri`, 'must be https (http only for a loopback host)')
      if (jwt.algorithms.length === 0) problems.add(`${at}/algorithms`, 'must list at least one algorithm')
    })
    for (const [server, settings] of Object.entries(tenant.servers)) {
      const at = pointer(`${base}/servers`, server)
      const target = Object.hasOwn(config.servers, server) ? config.servers[server] : undefined
      if (target === undefined) { problems.add(at, 'names no configured server'); continue }
      const { headers, env } = settings.upstream
      if (target.transport === 'aggregate') {
        if (Object.keys(headers).length + Object.keys(env).length > 0) problems.add(`${at}/upstream`, 'applies to the members (set it under their own names in this tenant)')
      } else if (target.transport === 'stdio') {
        if (Object.keys(headers).length > 0) problems.add(`${at}/upstream/headers`, 'applies to HTTP servers only (use upstream.env for a stdio server)')
        checkEnv(`${at}/upstream/env`, env, problems)
      } else {
        if (Object.keys(env).length > 0) problems.add(`${at}/upstream/env`, 'applies to stdio servers only (use upstream.headers for an HTTP server)')
        checkHeaders(`${at}/upstream/headers`, headers, problems)
      }
    }
  }
}

function checkEnv (path: string, env: Record<string, string>, problems: Problems): void {
  for (const [key, value] of Object.entries(env)) {
    if (key === '' || key.includes('=') || key.includes('\0')) problems.add(pointer(path, key), 'is not a valid variable name')
    if (value.includes('\0')) problems.add(pointer(path, key), 'must not contain NUL')
  }
}

function checkHeaders (path: string, headers: Record<string, string>, problems: Problems): void {
  for (const [key, value] of Object.entries(headers)) {
    const at = pointer(path, key)
    if (!TOKEN.test(key)) problems.add(at, 'is not a valid header name')
    else if (MANAGED_HEADERS.has(key.toLowerCase())) problems.add(at, 'is set by the gateway and cannot be configured')
    // CR/LF would split the request; a placeholder's value is the usual way one sneaks in.
    if (/[\r\n\0]/.test(value)) problems.add(at, 'value must not contain CR, LF or NUL')
  }
}

function checkDelays (path: string, policy: { baseDelayMs: number, maxDelayMs: number }, problems: Problems): void {
  if (policy.maxDelayMs < policy.baseDelayMs) problems.add(`${path}/maxDelayMs`, 'must be at least baseDelayMs')
}

function isUrl (text: string): boolean {
  try {
    return new URL(text).hostname !== ''
  } catch {
    return false
  }
}

// Parse errors name file, line and column but never quote the source: a literal secret may sit on
// that line. V8's JSON messages quote the text around the error, so that error is not attached.
function parseJson (path: string, text: string): unknown {
  try {
    return JSON.parse(text)
  } catch (err) {
    const position = /position (\d+)/.exec((err as Error).message)?.[1]
    const where = position === undefined ? '' : `:${lineCol(text, Number(position))}`
    throw new GW_ERR_CONFIG_INVALID(`${path}${where}: not valid JSON`)
  }
}

function parseYaml (path: string, text: string): unknown {
  // prettyErrors: false keeps the source excerpt out of each error's message.
  const doc = parseDocument(text, { prettyErrors: false, uniqueKeys: true })
  if (doc.errors.length > 0) {
    const lines = doc.errors.map(e => `${path}:${lineCol(text, e.pos[0])}: ${e.message}`)
    throw new GW_ERR_CONFIG_INVALID(`not valid YAML\n  ${lines.join('\n  ')}`, { cause: doc.errors[0] })
  }
  try {
    // maxAliasCount bounds alias expansion ("billion laughs"); 100 is yaml's own default, stated.
    return doc.toJS({ maxAliasCount: 100 })
  } catch (err) {
    throw new GW_ERR_CONFIG_INVALID(`${path}: ${(err as Error).message}`, { cause: err })
  }
}

function lineCol (text: string, offset: number): string {
  const before = text.slice(0, offset)
  const line = before.split('\n').length
  return `${line}:${offset - before.lastIndexOf('\n')}`
}

