// The one place ioredis clients are made, so every connection behaves alike after a Redis restart:
// reconnect forever with capped backoff, and meanwhile fail fast instead of queueing (docs/replicas.md):
// while Redis is unreachable /readyz fails and new sessions get 503; reconnecting is automatic.
import { Cluster, Redis as Standalone, type RedisOptions } from 'ioredis'
import { GW_ERR_STORE_UNAVAILABLE, isGatewayError } from '../../core/errors.js'
import type { Logger } from 'pino'

/** A connection to one server (directly, or to the primary Sentinel names) or to a Cluster. */
export type Redis = Standalone | Cluster

/**
 * Where the store lives: one server (`url`), the primary a set of Sentinels monitors under
 * `name` (`sentinels`), or a Redis Cluster (`cluster`: seed nodes). With sentinels or cluster,
 * `url` still gives the credentials, TLS (rediss:) and, for Sentinel, the database.
 */
export interface RedisTarget {
  url: string
  sentinels?: string[]
  name?: string
  cluster?: string[]
}

export interface CreateRedisOptions {
  log?: Logger
  /** Shown in CLIENT LIST; helps tell replicas' connections apart. */
  connectionName?: string
  /**
   * Rejects a command that gets no reply in time (a stalled, not closed, server). Not applied to a
   * blocking client, whose XREAD BLOCK waits on purpose.
   */
  commandTimeoutMs?: number
  /** A connection reserved for blocking reads (the bus's XREAD BLOCK). */
  blocking?: boolean
  /** Upper bound of the reconnect backoff. */
  maxRetryDelayMs?: number
}

/**
 * RESP2, chosen on purpose (ioredis 6 defaults to RESP3): the gateway uses nothing RESP3 adds
 * (no client-side caching, no push frames), Lua replies are RESP2 either way, and RESP2 keeps reply
 * shapes (HGETALL -> object, XRANGE -> [id, [field, value]] pairs, nil -> null) the ones the
 * code and test/redis-replies.test.ts expect.
 */
export const REDIS_PROTOCOL = 2

/** Exponential backoff from 50 ms, capped, with jitter; always a number: reconnect forever. */
export function reconnectDelay (attempt: number, maxMs: number): number {
  const exp = Math.min(maxMs, 50 * 2 ** Math.min(attempt, 16))
  return Math.round(exp / 2 + Math.random() * exp / 2)
}

function hostPort (url: string): { host: string, port: number } {
  const parsed = new URL(url)
  return { host: parsed.hostname, port: parsed.port === '' ? 6379 : Number(parsed.port) }
}

/** Credentials and TLS of a redis:// or rediss:// URL, for Sentinel and Cluster data nodes. */
function credentialsOf (url: string): Pick<RedisOptions, 'username' | 'password' | 'tls' | 'db'> {
  const parsed = new URL(url)
  const db = Number(parsed.pathname.slice(1))
  return {
    ...(parsed.username !== '' ? { username: decodeURIComponent(parsed.username) } : {}),
    ...(parsed.password !== '' ? { password: decodeURIComponent(parsed.password) } : {}),
    ...(parsed.protocol === 'rediss:' ? { tls: {} } : {}),
    ...(Number.isInteger(db) && db > 0 ? { db } : {})
  }
}

export function createRedis (target: string | RedisTarget, opts: CreateRedisOptions = {}): Redis {
  const { url, sentinels = [], name = 'mymaster', cluster = [] } = typeof target === 'string' ? { url: target } : target
  const maxRetryDelayMs = opts.maxRetryDelayMs ?? 2_000
  const options: RedisOptions = {
    protocol: REDIS_PROTOCOL,
    lazyConnect: false,
    // No queueing while disconnected: a call fails at once and the caller answers 503.
    enableOfflineQueue: false,
    // 0: a command in flight when the connection drops is rejected at that moment. With any
    // other value ioredis keeps it until later reconnect attempts, so the caller would hang
    // through an outage, and a resend after reconnect could apply a non-idempotent XADD twice.
    maxRetriesPerRequest: 0,
    retryStrategy: attempt => reconnectDelay(attempt, maxRetryDelayMs),
    ...(opts.connectionName !== undefined ? { connectionName: opts.connectionName } : {}),
    ...(opts.blocking !== true && opts.commandTimeoutMs !== undefined ? { commandTimeout: opts.commandTimeoutMs } : {})
  }
  let redis: Redis
  if (cluster.length > 0) {
    const { retryStrategy: _r, enableOfflineQueue: _q, ...nodeOptions } = options
    const { db: _db, ...credentials } = credentialsOf(url)
    redis = new Cluster(cluster.map(hostPort), {
      redisOptions: { ...nodeOptions, ...credentials },
      enableOfflineQueue: false,
      clusterRetryStrategy: attempt => reconnectDelay(attempt, maxRetryDelayMs),
      // A failover moves slots: retry the command on the new primary shortly, a few times.
      retryDelayOnFailover: 200,
      retryDelayOnClusterDown: 200,
      retryDelayOnTryAgain: 100
    })
  } else if (sentinels.length > 0) {
    // ioredis asks the sentinels for the primary, and again after every disconnect (a failover).
    redis = new Standalone({ ...options, ...credentialsOf(url), sentinels: sentinels.map(hostPort), name, sentinelRetryStrategy: attempt => reconnectDelay(attempt, maxRetryDelayMs) })
  } else {
    redis = new Standalone(url, options)
  }
  // Without a listener ioredis prints errors itself; log once per outage, not once per retry.
  let down = false
  redis.on('error', (err: Error) => {
    if (down) return
    down = true
    opts.log?.warn({ err }, 'redis connection error; reconnecting')
  })
  redis.on('ready', () => {
    if (down) opts.log?.info('redis connection ready again')
    down = false
  })
  return redis
}

/** Whether the client can run commands now (for isReady(), /readyz and 503s). */
export function isRedisReady (redis: Redis): boolean {
  return redis.status === 'ready'
}

/**
 * Waits until the client is ready; commands before that fail, as the offline queue is off.
 * Connection errors meanwhile are not fatal (the client keeps retrying); only the bound is.
 */
export async function redisReady (redis: Redis, timeoutMs = 10_000): Promise<void> {
  if (redis.status === 'ready') return
  if (redis.status === 'end') throw new GW_ERR_STORE_UNAVAILABLE('the Redis client was closed')
  await new Promise<void>((resolve, reject) => {
    const done = (err?: Error): void => {
      clearTimeout(timer)
      redis.off('ready', onReady)
      redis.off('end', onEnd)
      if (err === undefined) resolve()
      else reject(err)
    }
    const onReady = (): void => done()
    const onEnd = (): void => done(new GW_ERR_STORE_UNAVAILABLE('the Redis client was closed'))
    const timer = setTimeout(() => done(new GW_ERR_STORE_UNAVAILABLE(`Redis not ready within ${timeoutMs} ms`)), timeoutMs)
    redis.on('ready', onReady)
    redis.on('end', onEnd)
  })
}

/** Closes a client without waiting on a server that may be gone. */
export function closeRedis (redis: Redis): void {
  redis.disconnect(false)
}

/**
 * Runs one store call, turning a Redis failure (down, reconnecting, timed out) into
 * GW_ERR_STORE_UNAVAILABLE, which callers answer with 503.
 */
export async function storeCall<T> (call: Promise<T>): Promise<T> {
  try {
    return await call
  } catch (err) {
    if (isGatewayError(err)) throw err
    throw new GW_ERR_STORE_UNAVAILABLE(err instanceof Error ? err.message : String(err), { cause: err })
  }
}
