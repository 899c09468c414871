// The pino root: JSON logs with this replica's id, secrets redacted at the root.
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
 * own CPU per call, the audit line of every tools/call included (docs/performance.md). `flushMs: 0`
 * writes each line as it is logged. A SIGKILL loses at most `flushMs` of lines.
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
 * (a backend's logger is a child of its session's, which may name the backend already), made
 * when it first logs (lazyChild). For loggers made once per session or connection, not per
 * request: bindings() parses.
 */
export function childLogger (log: Logger, bindings: Record<string, unknown>): Logger {
  return lazyChild(log, newBindings(log, bindings))
}

/** The bindings `log` does not hold yet (childLogger). */
export function newBindings (log: Logger, bindings: Record<string, unknown>): Record<string, unknown> {
  const bound = log.bindings()
  return Object.fromEntries(Object.entries(bindings).filter(([key]) => !Object.hasOwn(bound, key)))
}

/** Session ids are bearer-like: logs carry a short hash, never the id itself. */
export function shortHash (value: string): string {
  return createHash('sha256').update(value).digest('base64url').slice(0, 10)
}

/** pino's levels, lowest first (Logger.isLevelEnabled takes these names). */
type LevelName = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal'
type LogArgs = [obj: unknown, msg?: string, ...rest: unknown[]]

/** Lines a lazy child writes through its parent before it makes a pino child of its own. */
const LINES_BEFORE_CHILD = 4

/**
 * A child logger made only when it is needed: it keeps the parent and the bindings. Its first lines
 * (LINES_BEFORE_CHILD) go through the parent with the bindings as their first fields, which writes
 * what a child would (a key given twice appears once, the line's own value); a logger that logs
 * more, is asked for a child or a level change, or logs an Error by itself makes the real pino
 * child. Fastify builds a logger for every request, and a pino child per request cost about 1.5 %
 * of the gateway's CPU per call; a session and its stdio child each kept one for their lives, about
 * 350 bytes apiece (heap per idle session), for a line or two at their start.
 */
class LazyChildLogger {
  readonly #parent: Logger
  readonly #bindings: Record<string, unknown>
  #child: Logger | undefined
  #lines = 0

  constructor (parent: Logger, bindings: Record<string, unknown>) {
    this.#parent = parent
    this.#bindings = bindings
  }

  #real (): Logger {
    this.#child ??= this.#parent.child(this.#bindings)
    return this.#child
  }

  #log (level: LevelName, args: LogArgs): void {
    const log = this.#child ?? this.#parent
    if (!log.isLevelEnabled(level)) return
    if (this.#child === undefined && this.#lines < LINES_BEFORE_CHILD) {
      const [first, ...rest] = args
      const through: (...a: unknown[]) => void = this.#parent[level]
      if (typeof first === 'string') {
        this.#lines++
        through.call(this.#parent, { ...this.#bindings }, first, ...rest)
        return
      }
      if (isPlainObject(first)) {
        this.#lines++
        through.call(this.#parent, { ...this.#bindings, ...first }, ...rest)
        return
      }
    }
    // The call exactly as made: pino reads its arguments by count and type.
    const write: (...a: unknown[]) => void = this.#real()[level]
    write.apply(this.#child, args)
  }

  get level (): string { return (this.#child ?? this.#parent).level }
  set level (level: string) { this.#real().level = level }
  isLevelEnabled (level: string): boolean { return (this.#child ?? this.#parent).isLevelEnabled(level) }
  child (bindings: Record<string, unknown>, options?: Parameters<Logger['child']>[1]): FastifyBaseLogger { return this.#real().child(bindings, options) }
  bindings (): Record<string, unknown> { return this.#child?.bindings() ?? { ...this.#parent.bindings(), ...this.#bindings } }
  trace (...args: LogArgs): void { this.#log('trace', args) }
  debug (...args: LogArgs): void { this.#log('debug', args) }
  info (...args: LogArgs): void { this.#log('info', args) }
  warn (...args: LogArgs): void { this.#log('warn', args) }
  error (...args: LogArgs): void { this.#log('error', args) }
  fatal (...args: LogArgs): void { this.#log('fatal', args) }
  silent (): void {}
}

function isPlainObject (value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && Object.getPrototypeOf(value) === Object.prototype
}

/**
 * A child of `log` with these bindings, made when it is needed (LazyChildLogger). Only the
 * methods the gateway calls exist: the levels, child, bindings, level and isLevelEnabled.
 */
export function lazyChild (log: Logger, bindings: Record<string, unknown>): Logger {
  return new LazyChildLogger(log, bindings) as unknown as Logger
}

/**
 * Fastify's per-request child logger factory: a LazyChildLogger over a pino logger, a real child
 * with route options (a route's log level or serializers) or any other parent.
 */
export function requestChildLogger (): NonNullable<FastifyServerOptions['childLoggerFactory']> {
  return function (logger, bindings, options) {
    if (Object.keys(options).length > 0 || !isPino(logger)) return logger.child(bindings, options)
    return new LazyChildLogger(logger, bindings) as unknown as FastifyBaseLogger
  }
}

function isPino (logger: FastifyBaseLogger): logger is Logger {
  return typeof (logger as Partial<Logger>).isLevelEnabled === 'function' && typeof (logger as Partial<Logger>).bindings === 'function'
}
