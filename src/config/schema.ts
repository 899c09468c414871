// The configuration's JSON Schema: the one source of the runtime check (config.ts, ajv with
// useDefaults) and of the Config type (json-schema-to-ts). Defaults here are the documented
// defaults; config/gateway.example.yaml shows each of them.
import type { FromSchema } from 'json-schema-to-ts'

/** Server and tenant names: `__proto__` cannot be one (maps by name: see withNameMaps in load.ts). */
export const NAME_PATTERN = '^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$'

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

/**
 * When the replica running a session's backend dies: 'carry-on' starts the backend again on the
 * replica that gets the session's next request, replaying the client's initialize, log level and
 * subscriptions (the backend's in-memory state is lost); 'end' ends the session (404, the client
 * re-initialises).
 */
const onOwnerLossSchema = { enum: ['carry-on', 'end'], default: 'carry-on' } as const

/**
 * Tasks the gateway hosts for a server (2026-07-28 Tasks extension, io.modelcontextprotocol/tasks):
 * a tools/call of a client that declared the extension and has not answered after `hostAfterMs`
 * gets a task handle; the call goes on, and its answer is kept for `tasks/get`. Absent: off.
 */
const taskHostingSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['hostAfterMs'],
  properties: {
    hostAfterMs: { type: 'integer', minimum: 0, maximum: 600_000 },
    /** How long a hosted task (and its result) stays readable after it was created. */
    ttlMs: { type: 'integer', minimum: 1000, maximum: 604_800_000, default: 3_600_000 },
    /** The polling interval suggested to the client. */
    pollIntervalMs: { type: 'integer', minimum: 100, maximum: 600_000, default: 1000 }
  }
} as const

/**
 * Where an HTTP server's backend requests get their credential (docs/credentials.md). `static`:
 * the configured headers only (the default when absent). `token-exchange`: the client's verified
 * JWT exchanged (RFC 8693) for a token whose audience is the backend, per user. `client-credentials`:
 * the gateway's own client at the backend's authorization server (RFC 6749 section 4.4), per
 * tenant. `user-authorization`: each user's consent by URL (authorization code with PKCE), per user.
 * Which fields each source needs is checked in config/credentials-check.ts.
 */
export const credentialsSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['source'],
  properties: {
    source: { enum: ['static', 'token-exchange', 'client-credentials', 'user-authorization'] },
    /** The header the credential goes in. */
    header: { type: 'string', default: 'authorization' },
    /** Put before the token in the header's value ("" for the bare token). */
    scheme: { type: 'string', pattern: '^[!#$%&\'*+.^_`|~0-9A-Za-z-]*$', default: 'Bearer' },
    /** The authorization server's issuer: its endpoints are read from its metadata (RFC 8414, OpenID discovery). */
    issuer: { type: 'string', pattern: '^https?://' },
    /** The token endpoint, instead of discovery from `issuer`. */
    tokenEndpoint: { type: 'string', pattern: '^https?://' },
    /** user-authorization: the authorization endpoint, instead of discovery from `issuer`. */
    authorizationEndpoint: { type: 'string', pattern: '^https?://' },
    /** The gateway's client id at that authorization server. */
    clientId: { type: 'string', minLength: 1 },
    /** Its secret (use a ${ENV} or ${file:PATH} placeholder); absent: a public client (user-authorization only). */
    clientSecret: { type: 'string', minLength: 1 },
    /** How the client authenticates at the token endpoint. */
    clientAuth: { enum: ['client_secret_basic', 'client_secret_post'], default: 'client_secret_basic' },
    /** Scopes asked for. */
    scopes: { type: 'array', items: { type: 'string', pattern: '^[\\x21\\x23-\\x5b\\x5d-\\x7e]+$' }, default: [] },
    /** token-exchange (required) and client-credentials: the `audience` asked for: the backend's identifier at the authorization server. */
    audience: { type: 'string', minLength: 1 },
    /** RFC 8707 `resource` asked for (the backend's URL as a resource), besides or instead of audience. */
    resource: { type: 'string', pattern: '^https?://' },
    /** token-exchange: the type of the client's token sent as subject_token. */
    subjectTokenType: { type: 'string', default: 'urn:ietf:params:oauth:token-type:access_token' },
    /** token-exchange: the token type asked for; absent: the server's choice. */
    requestedTokenType: { type: 'string', minLength: 1 },
    /** user-authorization: the gateway's public base URL its callback is served under (`<base>/oauth/callback`). */
    redirectBaseUrl: { type: 'string', pattern: '^https?://' },
    /** stdio servers (required there): the child's environment variable the credential goes in. */
    env: { type: 'string', pattern: '^[A-Za-z_][A-Za-z0-9_]*$' },
    /** stdio servers: the variable's value, `{token}` standing for the token (default: the bare token). */
    envTemplate: { type: 'string', pattern: '\\{token\\}' },
    /** A token is renewed this long before it expires (no request starts with a token about to lapse). */
    refreshBeforeMs: { type: 'integer', minimum: 0, maximum: 3_600_000, default: 30_000 },
    /** How long a token with no `expires_in` is used. */
    defaultLifetimeMs: { type: 'integer', minimum: 1000, maximum: 86_400_000, default: 300_000 },
    /** A refused grant is remembered this long per caller: the authorization server is not asked again at once. */
    refusalCacheMs: { type: 'integer', minimum: 0, maximum: 600_000, default: 10_000 },
    /** Deadline of one call to the authorization server (metadata, token). */
    timeoutMs: { type: 'integer', minimum: 100, maximum: 120_000, default: 5000 }
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
    /**
     * Each caller's credential in the child's environment (docs/credentials.md, "stdio servers"):
     * the same sources as an HTTP server's, with `env` naming the variable. A per-user source gives
     * every subject children of its own.
     */
    credentials: credentialsSchema,
    /**
     * dedicated: each 2025-era session gets a child of its own. pooled: sessions hold no child; each
     * request borrows one of the (server, tenant) pool's children (docs/architecture.md).
     */
    sessions: { enum: ['dedicated', 'pooled'], default: 'dedicated' },
    /** Sessions at once on one replica: dedicated, children (default 100); pooled, sessions (default 10000). */
    maxSessions: { type: 'integer', minimum: 1 },
    /** Initialised children kept warm per tenant (2026-07-28 requests, and pooled sessions). */
    poolSize: { type: 'integer', minimum: 1, maximum: 64, default: 4 },
    /** Most children of the pool per tenant on one replica; a request past it waits for one (bounded). */
    poolMax: { type: 'integer', minimum: 1, maximum: 1024, default: 16 },
    /** Longest a request waits for a pooled child when all poolMax are busy; then 503 with Retry-After. */
    poolWaitMs: { type: 'integer', minimum: 0, maximum: 600_000, default: 10_000 },
    requestTimeoutMs: { type: 'integer', minimum: 1, default: 60_000 },
    maxLineBytes: { type: 'integer', minimum: 1024, default: 10_485_760 },
    stopGraceMs: { type: 'integer', minimum: 0, default: 2000 },
    /**
     * A dedicated session's child idle this long (no message either way, nothing in flight, no
     * resource subscription) is stopped; the session stays, and its next message starts a child
     * again with the session replayed into it. 0: children live as long as their sessions.
     */
    childIdleMs: { type: 'integer', minimum: 0, default: 300_000 },
    restart: restartSchema,
    onOwnerLoss: onOwnerLossSchema,
    tasks: taskHostingSchema
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
    /** Each caller's credential toward this backend (docs/credentials.md); absent: `headers` only. */
    credentials: credentialsSchema,
    maxSessions: { type: 'integer', minimum: 1, default: 1000 },
    /** Initialised backend sessions kept for 2026-07-28 (stateless) requests, per tenant. */
    poolSize: { type: 'integer', minimum: 1, maximum: 64, default: 4 },
    /** Most backend sessions of the 2026-07-28 pool per tenant on one replica (cheap: no process each). */
    poolMax: { type: 'integer', minimum: 1, maximum: 1024, default: 256 },
    /** Longest a 2026-07-28 request waits for a pooled backend session when all poolMax are busy. */
    poolWaitMs: { type: 'integer', minimum: 0, maximum: 600_000, default: 10_000 },
    connectTimeoutMs: { type: 'integer', minimum: 1, default: 10_000 },
    requestTimeoutMs: { type: 'integer', minimum: 1, default: 60_000 },
    /** Upstream connections kept per origin. */
    connections: { type: 'integer', minimum: 1, default: 64 },
    /**
     * Streamable HTTP only: the MCP era the server speaks. legacy: sessions (2025 and before;
     * 2026-07-28 requests run on the pool); modern: only 2026-07-28 (2026-07-28 requests relayed as
     * they are, 2025 sessions bridged); auto: probe with server/discover once, fall back to legacy.
     */
    protocol: { enum: ['legacy', 'modern', 'auto'], default: 'auto' },
    /** Legacy `sse` upstreams only (a Streamable HTTP backend session outlives any replica). */
    onOwnerLoss: onOwnerLossSchema,
    /** Tasks the gateway hosts (a 2025-era backend, or a 2026-07-28 one that offers no tasks). */
    tasks: taskHostingSchema,
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


const toolPolicySchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    /** Tool names (glob `*`) the tenant may see and call; absent: all. */
    allow: { type: 'array', items: { type: 'string', minLength: 1 } },
    /** Tool names (glob `*`) refused even when allowed. */
    deny: { type: 'array', items: { type: 'string', minLength: 1 }, default: [] }
  }
} as const

/** An address of its own for an operator's endpoint (`metrics.listen`, `admin.listen`): loopback by default. */
const ownListenerSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['port'],
  properties: {
    host: { type: 'string', default: '127.0.0.1' },
    port: { type: 'integer', minimum: 0, maximum: 65535 }
  }
} as const

/**
 * An aggregate server (docs/behaviour.md, Aggregating servers): one endpoint in front of several
 * configured servers, its members, whose tools and prompts it exposes under prefixed names
 * (routing/aggregate/relay.ts).
 */
const aggregateServerSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['transport', 'members'],
  properties: {
    transport: { const: 'aggregate' },
    /** In priority order: the first member that lists a resource URI serves it. */
    members: {
      type: 'array',
      minItems: 1,
      maxItems: 64,
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['server'],
        properties: {
          server: { type: 'string', pattern: NAME_PATTERN },
          /** Prefix of its tool and prompt names; default the member's server name; "" for none. */
          prefix: { type: 'string', pattern: '^[A-Za-z0-9_.-]{0,32}$' },
          /** Globs on the member's own tool names. */
          tools: toolPolicySchema
        }
      }
    },
    /** Between a prefix and a name. */
    separator: { type: 'string', pattern: '^[A-Za-z0-9_.-]{1,8}$', default: '__' },
    /** Aggregate sessions at once on one replica (each holds a backend connection per dedicated member). */
    maxSessions: { type: 'integer', minimum: 1, default: 1000 },
    /** Deadline of a request routed to a member (the member's own requestTimeoutMs applies too). */
    requestTimeoutMs: { type: 'integer', minimum: 1, default: 60_000 },
    /** A member that does not start, or list, within this is left out (down or slow) until it does. */
    memberTimeoutMs: { type: 'integer', minimum: 100, maximum: 600_000, default: 5000 },
    /**
     * Longest a member's start may take (a cold child under load) before it is down: a session's
     * requests wait for a member still starting, not leave it out. At least memberTimeoutMs.
     */
    memberStartTimeoutMs: { type: 'integer', minimum: 100, maximum: 600_000, default: 30_000 }
  }
} as const

const tenantServerSchema = {
  type: 'object',
  additionalProperties: false,
  default: {},
  properties: {
    tools: toolPolicySchema,
    /** Added to this tenant's sessions only: headers for HTTP servers, env for stdio servers. */
    upstream: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        headers: { type: 'object', additionalProperties: { type: 'string' }, default: {} },
        env: { type: 'object', additionalProperties: { type: 'string' }, default: {} }
      }
    },
    /** This tenant's credential source toward the server: replaces the server's `credentials` for its users. */
    credentials: credentialsSchema
  }
} as const

const tenantSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['servers'],
  properties: {
    /** API keys, as the hex SHA-256 of each key (never the key itself). */
    apiKeys: {
      type: 'array',
      default: [],
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['id', 'sha256'],
        properties: {
          id: { type: 'string', pattern: '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$' },
          sha256: { type: 'string', pattern: '^[0-9a-fA-F]{64}$' }
        }
      }
    },
    /** JWT issuers whose tokens this tenant accepts. */
    jwt: {
      type: 'array',
      default: [],
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['issuer', 'jwksUri'],
        properties: {
          issuer: { type: 'string', minLength: 1 },
          /** https, or http only for a loopback host. */
          jwksUri: { type: 'string', pattern: '^https?://' },
          /** Accepted `aud` values; empty: the endpoint's resource URL (RFC 8707). */
          audience: { type: 'array', items: { type: 'string' }, default: [] },
          /** Claim values that must match exactly. */
          claims: { type: 'object', additionalProperties: { anyOf: [{ type: 'string' }, { type: 'number' }, { type: 'boolean' }] }, default: {} },
          /** Accepted signing algorithms. */
          algorithms: { type: 'array', items: { enum: ['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'ES256', 'ES384', 'ES512', 'EdDSA'] }, default: ['RS256', 'ES256', 'EdDSA'] },
          /** Claim whose value is the subject. */
          subjectClaim: { type: 'string', default: 'sub' },
          /** Least time between two fetches of the key set for tokens naming an unknown key (kid). */
          jwksCooldownMs: { type: 'integer', minimum: 0, default: 30_000 },
          /** The `typ` header tokens must carry (RFC 9068: `at+jwt`; `application/` may be left off); absent: not checked. */
          typ: { type: 'string', minLength: 1 }
        }
      }
    },
    /** The servers this tenant may use; any other does not exist for it. */
    servers: { type: 'object', propertyNames: { pattern: NAME_PATTERN }, additionalProperties: tenantServerSchema },
    limits: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        /** Sustained request rate per tenant (every POST/GET/DELETE on an MCP endpoint). */
        requestsPerSecond: { type: 'number', exclusiveMinimum: 0 },
        /** Requests allowed at once before the rate applies; default: requestsPerSecond (at least 1). */
        burst: { type: 'integer', minimum: 1 },
        /** Same budget per subject inside the tenant. */
        requestsPerSecondPerSubject: { type: 'number', exclusiveMinimum: 0 },
        /** Burst of the per-subject budget; default: requestsPerSecondPerSubject (at least 1). */
        burstPerSubject: { type: 'integer', minimum: 1 },
        /** Open sessions per tenant. */
        sessions: { type: 'integer', minimum: 1 },
        /** Open sessions per subject. */
        sessionsPerSubject: { type: 'integer', minimum: 1 },
        /** JSON-RPC requests in flight at once per tenant on one replica (429 with Retry-After past it). */
        concurrentRequests: { type: 'integer', minimum: 1 },
        /** The same bound per subject inside the tenant. */
        concurrentRequestsPerSubject: { type: 'integer', minimum: 1 }
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
        level: { enum: ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'], default: 'info' },
        /**
         * Lines are buffered and written at most this many ms after they are logged (or once 4 KiB
         * are waiting, and at exit); 0 writes every line at once, one write(2) each.
         */
        flushMs: { type: 'integer', minimum: 0, maximum: 10_000, default: 100 }
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
        /**
         * responseMode sse: a POST's SSE stream opens only when something other than its answers
         * comes first, or after this many ms; answers that come sooner go out as one JSON body, in
         * one write. 0 opens every stream at once. With Redis, sessions whose streams start with a
         * resumable priming event (2025-11-25) always open at once, so that the death of the
         * replica holding the POST never strands its call.
         */
        lazySseMs: { type: 'integer', minimum: 0, maximum: 60_000, default: 50 },
        /** SSE comment keep-alive interval. */
        keepAliveMs: { type: 'integer', minimum: 1000, default: 15_000 },
        /** SSE `retry` hint sent to 2025-11-25 clients and on shutdown. */
        retryMs: { type: 'integer', minimum: 0, default: 1000 },
        /**
         * Proxies (addresses or CIDRs) whose forwarding header names the client: its address for
         * the failed-authentication budget, audit lines and logs. Empty: the TCP peer's, nothing believed.
         */
        trustedProxies: { type: 'array', items: { type: 'string' }, default: [] },
        /** The header those proxies set (only it is read): X-Forwarded-For, or RFC 7239 Forwarded. */
        forwardedHeader: { enum: ['x-forwarded-for', 'forwarded'], default: 'x-forwarded-for' }
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
    /** Live reload of the routing settings (servers, auth, tenants); SIGHUP always reloads. */
    reload: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        /** Also reload when the config file changes on disk (a rename-over by an editor included). */
        watch: { type: 'boolean', default: false },
        /** Quiet time after the last change on disk before the file is read. */
        debounceMs: { type: 'integer', minimum: 0, maximum: 60_000, default: 500 }
      }
    },
    /** GET /metrics (Prometheus text): on by default, optionally behind a bearer token or on its own address. */
    metrics: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        enabled: { type: 'boolean', default: true },
        /** Bearer token a scraper must send (compared in constant time); use a ${ENV} placeholder. */
        token: { type: 'string', minLength: 16 },
        /** Serve /metrics only on this address, and not on the main listener. */
        listen: ownListenerSchema
      }
    },
    /**
     * The operator's console and admin API (docs/console.md): off unless a token is set.
     * `Authorization: Bearer <token>`, compared in constant time; never a tenant's key or JWT. Use
     * a ${ENV} placeholder.
     */
    admin: {
      type: 'object',
      additionalProperties: false,
      required: ['token'],
      properties: {
        token: { type: 'string', minLength: 32 },
        /** Serve /admin only on this address, and not on the main listener (like metrics.listen). */
        listen: ownListenerSchema
      }
    },
    redis: {
      type: 'object',
      additionalProperties: false,
      required: ['url'],
      properties: {
        url: { type: 'string', pattern: '^rediss?://' },
        /**
         * Redis Sentinel: the sentinels' URLs; the store is the primary they monitor as `name`,
         * found again after a failover. `url` then gives only credentials, TLS and database.
         */
        sentinels: { type: 'array', items: { type: 'string', pattern: '^rediss?://' }, default: [] },
        name: { type: 'string', minLength: 1, default: 'mymaster' },
        /** Redis Cluster: seed nodes' URLs (every key of one session shares a hash slot). `url` gives credentials and TLS. */
        cluster: { type: 'array', items: { type: 'string', pattern: '^rediss?://' }, default: [] },
        keyPrefix: { type: 'string', pattern: '^[A-Za-z0-9_.-]+$', default: 'mcpgw' },
        /** Lease of an owner and of a stream holder; a replica's heartbeat lives min(leaseMs, 3000) ms. */
        leaseMs: { type: 'integer', minimum: 500, default: 10_000 },
        connectTimeoutMs: { type: 'integer', minimum: 100, default: 5000 },
        /**
         * How long Redis may be unreachable before /readyz answers 503. Every replica shares it,
         * so answering 503 at once would take them all out of a load balancer together.
         */
        readinessGraceMs: { type: 'integer', minimum: 0, default: 15_000 }
      }
    },
    /** OpenTelemetry tracing; absent: off, and the SDK is not loaded. */
    tracing: {
      type: 'object',
      additionalProperties: false,
      required: ['otlpEndpoint'],
      properties: {
        /** OTLP/HTTP collector URL; `/v1/traces` is appended unless the URL ends with it. */
        otlpEndpoint: { type: 'string', pattern: '^https?://' },
        /** Share of new traces recorded (a client's sampled flag is followed as it is). */
        sampleRatio: { type: 'number', minimum: 0, maximum: 1, default: 1 },
        serviceName: { type: 'string', minLength: 1, default: 'mcp-gateway' }
      }
    },
    auth: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        /** The origin clients use (scheme://host[:port]); resource URLs derive from it. */
        publicUrl: { type: 'string', pattern: '^https?://[^/?#]+/?$' },
        /** Without tenants, allow listening on a non-loopback address with no authentication. */
        anonymous: { type: 'boolean', default: false },
        /**
         * Failed authentication is charged per client address: `burst` failures at once,
         * `ratePerSecond` sustained, then 429 with Retry-After. Successes cost nothing. `burst: 0`: off.
         */
        failures: {
          type: 'object',
          additionalProperties: false,
          default: {},
          properties: {
            burst: { type: 'integer', minimum: 0, default: 20 },
            ratePerSecond: { type: 'number', exclusiveMinimum: 0, default: 1 }
          }
        }
      }
    },
    /** Who may call: with tenants, every MCP endpoint needs a credential. */
    tenants: {
      type: 'object',
      propertyNames: { pattern: NAME_PATTERN },
      additionalProperties: tenantSchema
    },
    servers: {
      type: 'object',
      minProperties: 1,
      propertyNames: { pattern: NAME_PATTERN },
      additionalProperties: {
        type: 'object',
        required: ['transport'],
        properties: { transport: { enum: ['stdio', 'streamable-http', 'sse', 'aggregate'] } },
        if: { properties: { transport: { const: 'stdio' } } },
        then: stdioServerSchema,
        else: {
          if: { properties: { transport: { const: 'aggregate' } } },
          then: aggregateServerSchema,
          else: httpServerSchema
        }
      }
    }
  }
} as const

/** T with every key present (defaults applied) except the ones named in Opt. */
type Defaulted<T, Opt extends keyof T = never> = Required<Omit<T, Opt>> & Partial<Pick<T, Opt>>

type RawStdio = FromSchema<typeof stdioServerSchema>
type RawHttp = FromSchema<typeof httpServerSchema>
export type StdioServerConfig = Defaulted<Omit<RawStdio, 'restart' | 'credentials'>, 'cwd' | 'onOwnerLoss' | 'poolSize' | 'poolMax' | 'poolWaitMs' | 'sessions' | 'childIdleMs' | 'tasks'> & { restart: Required<NonNullable<RawStdio['restart']>>, credentials?: CredentialsConfig }
export type HttpServerConfig = Defaulted<Omit<RawHttp, 'reconnect' | 'credentials'>, 'onOwnerLoss' | 'poolSize' | 'poolMax' | 'poolWaitMs' | 'protocol' | 'tasks'> & { reconnect: Required<NonNullable<RawHttp['reconnect']>>, credentials?: CredentialsConfig }

type RawCredentials = FromSchema<typeof credentialsSchema>
/** A `credentials` block, defaults applied; which optional fields a source needs is checked at load. */
export type CredentialsConfig = Defaulted<RawCredentials, 'issuer' | 'tokenEndpoint' | 'authorizationEndpoint' | 'clientId' | 'clientSecret' | 'audience' | 'resource' | 'requestedTokenType' | 'redirectBaseUrl' | 'env' | 'envTemplate'>
type RawAggregate = FromSchema<typeof aggregateServerSchema>
export type AggregateMemberConfig = RawAggregate['members'][number]
export type AggregateServerConfig = Defaulted<RawAggregate> & { poolSize?: undefined, poolMax?: undefined, poolWaitMs?: undefined, tasks?: undefined }
/** `tasks` of a server: tasks the gateway hosts for it (defaults applied). */
export type TaskHostingConfig = Required<FromSchema<typeof taskHostingSchema>>
export type ServerConfig = StdioServerConfig | HttpServerConfig | AggregateServerConfig
/** A server a client session's backend connection can be opened to (not an aggregate). */
export type BackendServerConfig = StdioServerConfig | HttpServerConfig

type RawTenant = FromSchema<typeof tenantSchema>
type RawTenantServer = FromSchema<typeof tenantServerSchema>
export type ToolPolicyConfig = FromSchema<typeof toolPolicySchema>
export type TenantServerConfig = { tools?: ToolPolicyConfig, upstream: { headers: Record<string, string>, env: Record<string, string> }, credentials?: CredentialsConfig } & Omit<RawTenantServer, 'tools' | 'upstream' | 'credentials'>
export type TenantJwtConfig = Defaulted<NonNullable<RawTenant['jwt']>[number], 'typ'>
export type TenantLimitsConfig = NonNullable<RawTenant['limits']>
export interface TenantConfig {
  apiKeys: Array<{ id: string, sha256: string }>
  jwt: TenantJwtConfig[]
  servers: Record<string, TenantServerConfig>
  limits: TenantLimitsConfig
}

type RawConfig = FromSchema<typeof configSchema>
export interface MetricsConfig {
  enabled: boolean
  token?: string
  listen?: { host: string, port: number }
}

/** `admin`: the console and admin API (http/admin/), absent when off. */
export interface AdminConfig {
  token: string
  listen?: { host: string, port: number }
}

/** The validated configuration: defaults applied, so every defaulted key is present. */
export type Config = Required<Omit<RawConfig, 'servers' | 'redis' | 'tenants' | 'auth' | 'tracing' | 'metrics' | 'admin'>> & {
  metrics: MetricsConfig
  admin?: AdminConfig
  auth: { publicUrl?: string, anonymous: boolean, failures: { burst: number, ratePerSecond: number } }
  tenants?: Record<string, TenantConfig>
  listen: Required<NonNullable<RawConfig['listen']>>
  log: Required<NonNullable<RawConfig['log']>>
  http: Required<NonNullable<RawConfig['http']>>
  sessions: Required<NonNullable<RawConfig['sessions']>>
  shutdown: Required<NonNullable<RawConfig['shutdown']>>
  reload: Required<NonNullable<RawConfig['reload']>>
  redis?: Required<NonNullable<RawConfig['redis']>>
  tracing?: Required<NonNullable<RawConfig['tracing']>>
  servers: Record<string, ServerConfig>
}
