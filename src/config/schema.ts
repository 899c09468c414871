// The configuration's JSON Schema: the one source of the runtime check (config.ts, ajv with
// useDefaults) and of the Config type (json-schema-to-ts). Defaults here are the documented
// defaults; config/gateway.example.yaml shows each of them.
import type { FromSchema } from 'json-schema-to-ts'

const serverName = '^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$'

const restartSchema = {
  type: 'object',
  additionalProperties: false,
  default: {},
  properties: {
    /** Restarts allowed within windowMs before the session is ended (404). */
    maxRestarts: { type: 'integer', minimum: 0, default: 3 },
    windowMs: { type: 'integer', minimum: 1000, default: 60_000 },
    baseDelayMs: { type: 'integer', minimum: 0, default: 250 },
    maxDelayMs: { type: 'integer', minimum: 0, default: 30_000 }
  }
} as const

const stdioServerSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['transport', 'command'],
  properties: {
    transport: { const: 'stdio' },
    command: { type: 'string', minLength: 1 },
    args: { type: 'array', items: { type: 'string' }, default: [] },
    cwd: { type: 'string' },
    /** Variables set for the child (values may use ${ENV} placeholders). */
    env: { type: 'object', additionalProperties: { type: 'string' }, default: {} },
    /** Names of the gateway's own variables the child inherits, beyond the safe base set. */
    inheritEnv: { type: 'array', items: { type: 'string', pattern: '^[A-Za-z_][A-Za-z0-9_]*$' }, default: [] },
    maxSessions: { type: 'integer', minimum: 1, default: 100 },
    requestTimeoutMs: { type: 'integer', minimum: 1, default: 60_000 },
    maxLineBytes: { type: 'integer', minimum: 1024, default: 10_485_760 },
    stopGraceMs: { type: 'integer', minimum: 0, default: 2000 },
    restart: restartSchema
  }
} as const

const httpServerSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['transport', 'url'],
  properties: {
    transport: { enum: ['streamable-http', 'sse'] },
    url: { type: 'string', pattern: '^https?://' },
    /** Headers sent upstream (values may use ${ENV} placeholders). */
    headers: { type: 'object', additionalProperties: { type: 'string' }, default: {} },
    /** Client request headers passed upstream; none by default (no token passthrough). */
    forwardHeaders: { type: 'array', items: { type: 'string' }, default: [] },
    maxSessions: { type: 'integer', minimum: 1, default: 1000 },
    connectTimeoutMs: { type: 'integer', minimum: 1, default: 10_000 },
    requestTimeoutMs: { type: 'integer', minimum: 1, default: 60_000 },
    /** Upstream connections kept per origin. */
    connections: { type: 'integer', minimum: 1, default: 64 },
    reconnect: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        maxAttempts: { type: 'integer', minimum: 0, default: 5 },
        baseDelayMs: { type: 'integer', minimum: 0, default: 500 },
        maxDelayMs: { type: 'integer', minimum: 0, default: 30_000 }
      }
    }
  }
} as const

export const configSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['servers'],
  properties: {
    listen: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        host: { type: 'string', default: '127.0.0.1' },
        port: { type: 'integer', minimum: 0, maximum: 65535, default: 8080 }
      }
    },
    log: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        level: { enum: ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'], default: 'info' }
      }
    },
    http: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        /** Largest accepted request body in bytes (413 beyond). */
        bodyLimit: { type: 'integer', minimum: 1024, default: 4_194_304 },
        /** Origins allowed to connect (and for CORS). Empty: only loopback origins. */
        allowedOrigins: { type: 'array', items: { type: 'string' }, default: [] },
        /** Host header values allowed. Empty: loopback names when listening on loopback, any otherwise. */
        allowedHosts: { type: 'array', items: { type: 'string' }, default: [] },
        /** How a POSTed request is answered: an SSE stream (carries progress/logs) or one JSON body. */
        responseMode: { enum: ['sse', 'json'], default: 'sse' },
        /** SSE comment keep-alive interval. */
        keepAliveMs: { type: 'integer', minimum: 1000, default: 15_000 },
        /** SSE `retry` hint sent to 2025-11-25 clients and on shutdown. */
        retryMs: { type: 'integer', minimum: 0, default: 1000 }
      }
    },
    sessions: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        /** A session with no traffic and no open stream for this long is ended. */
        idleTimeoutMs: { type: 'integer', minimum: 1000, default: 1_800_000 },
        /** Entries kept per client stream for resumption. */
        eventLogMaxLen: { type: 'integer', minimum: 10, default: 1000 },
        /** Deadline for the client to answer a server-to-client request. */
        clientRequestTimeoutMs: { type: 'integer', minimum: 1, default: 300_000 }
      }
    },
    shutdown: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        /**
         * After SIGTERM, /readyz answers 503 for this long while requests are still served, so a
         * load balancer stops sending before streams end. SIGINT (a terminal's Ctrl-C) skips it.
         */
        drainMs: { type: 'integer', minimum: 0, default: 5000 },
        /** After the drain, the time streams, requests and children get before the process exits anyway. */
        deadlineMs: { type: 'integer', minimum: 1000, default: 15_000 }
      }
    },
    redis: {
      type: 'object',
      additionalProperties: false,
      required: ['url'],
      properties: {
        url: { type: 'string', pattern: '^rediss?://' },
        keyPrefix: { type: 'string', pattern: '^[A-Za-z0-9_.-]+$', default: 'mcpgw' },
        /** Lease of a replica's heartbeat, of an owner and of a stream holder. */
        leaseMs: { type: 'integer', minimum: 500, default: 10_000 },
        connectTimeoutMs: { type: 'integer', minimum: 100, default: 5000 }
      }
    },
    servers: {
      type: 'object',
      minProperties: 1,
      propertyNames: { pattern: serverName },
      additionalProperties: {
        type: 'object',
        required: ['transport'],
        properties: { transport: { enum: ['stdio', 'streamable-http', 'sse'] } },
        if: { properties: { transport: { const: 'stdio' } } },
        then: stdioServerSchema,
        else: httpServerSchema
      }
    }
  }
} as const

/** T with every key present (defaults applied) except the ones named in Opt. */
type Defaulted<T, Opt extends keyof T = never> = Required<Omit<T, Opt>> & Partial<Pick<T, Opt>>

type RawStdio = FromSchema<typeof stdioServerSchema>
type RawHttp = FromSchema<typeof httpServerSchema>
export type StdioServerConfig = Defaulted<Omit<RawStdio, 'restart'>, 'cwd'> & { restart: Required<NonNullable<RawStdio['restart']>> }
export type HttpServerConfig = Defaulted<Omit<RawHttp, 'reconnect'>> & { reconnect: Required<NonNullable<RawHttp['reconnect']>> }
export type ServerConfig = StdioServerConfig | HttpServerConfig

type RawConfig = FromSchema<typeof configSchema>
/** The validated configuration: defaults applied, so every defaulted key is present. */
export type Config = Required<Omit<RawConfig, 'servers' | 'redis'>> & {
  listen: Required<NonNullable<RawConfig['listen']>>
  log: Required<NonNullable<RawConfig['log']>>
  http: Required<NonNullable<RawConfig['http']>>
  sessions: Required<NonNullable<RawConfig['sessions']>>
  shutdown: Required<NonNullable<RawConfig['shutdown']>>
  redis?: Required<NonNullable<RawConfig['redis']>>
  servers: Record<string, ServerConfig>
}
