// The pino root: JSON logs with this replica's id, secrets redacted at the root (STYLE.md habit 9).
import { createHash } from 'node:crypto'
import type { FastifyBaseLogger, FastifyServerOptions } from 'fastify'
import { pino, type Logger, type DestinationStream } from 'pino'

export type { Logger }

/** Paths that may hold credentials in anything we log. */
const REDACT = [
  'req.headers.authorization',
  'req.headers.cookie',
  'req.headers["mcp-session-id"]',
  'req.headers["last-event-id"]',
  'headers.authorization',
  'headers.Authorization',
  'env',
  'token',
  'password'
]

/**
 * The root logger. Lines go to stdout through a buffer flushed every `flushMs` (and whenever it
 * holds 4 KiB, and synchronously at exit): a write(2) per line cost about a tenth of the gateway's
 * own CPU per call, the audit line of every tools/call included (issue 10). `flushMs: 0` writes
 * each line as it is logged. A SIGKILL loses at most `flushMs` of lines.
 */
export function createLogger (level: string, replicaId: string, destination?: DestinationStream, flushMs = 0): Logger {
  const options = {
    level,
    base: { replica: replicaId },
    redact: { paths: REDACT, censor: '[redacted]' },
    timestamp: pino.stdTimeFunctions.isoTime
  }
  if (destination !== undefined) return pino(options, destination)
  if (flushMs <= 0) return pino(options)
  // pino registers a synchronous flush of this destination at process exit.
  return pino(options, pino.destination({ dest: 1, sync: false, minLength: LOG_BUFFER_BYTES, periodicFlush: flushMs }))
}

const LOG_BUFFER_BYTES = 4096

/**
 * A child with only the bindings its parent does not hold yet, so no key appears twice in a line
 * (a backend's logger is a child of its session's, which may name the backend already). For
 * loggers made once per session or connection, not per request: bindings() parses.
 */
export function childLogger (log: Logger, bindings: Record<string, unknown>): Logger {
  const bound = log.bindings()
  return log.child(Object.fromEntries(Object.entries(bindings).filter(([key]) => !Object.hasOwn(bound, key))))
}

/** Session ids are bearer-like: logs carry a short hash, never the id itself. */
export function shortHash (value: string): string {
  return createHash('sha256').update(value).digest('base64url').slice(0, 10)
}

/**
 * Fastify's per-request child logger (the `reqId` binding), made on pino's fast path. Fastify's
 * default passes an options object, even an empty one, which sends pino through its slow path
 * (formatters rebuilt for every request); a child of a child that has no bindings of its own
 * reuses its parent's. Route options (a route's log level or serializers) still take the full path.
 */
export function requestChildLogger (): NonNullable<FastifyServerOptions['childLoggerFactory']> {
  const bases = new WeakMap<FastifyBaseLogger, FastifyBaseLogger>()
  return function (logger, bindings, options) {
    if (Object.keys(options).length > 0) return logger.child(bindings, options)
    let base = bases.get(logger)
    if (base === undefined) {
      base = logger.child({})
      bases.set(logger, base)
    }
    return base.child(bindings)
  }
}
