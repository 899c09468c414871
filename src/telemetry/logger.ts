// The pino root: JSON logs with this replica's id, secrets redacted at the root (STYLE.md habit 9).
import { createHash } from 'node:crypto'
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

export function createLogger (level: string, replicaId: string, destination?: DestinationStream): Logger {
  const options = {
    level,
    base: { replica: replicaId },
    redact: { paths: REDACT, censor: '[redacted]' },
    timestamp: pino.stdTimeFunctions.isoTime
  }
  return destination === undefined ? pino(options) : pino(options, destination)
}

/** Session ids are bearer-like: logs carry a short hash, never the id itself. */
export function shortHash (value: string): string {
  return createHash('sha256').update(value).digest('base64url').slice(0, 10)
}
