// Audit lines: one structured info line per decision that matters (issue 8): sessions created
// and ended, requests refused and why, tool calls with their outcome. Each carries `audit: <event>`
// so a log pipeline can select them. They name tenants and subject digests only, never a key, a
// token, a full subject or a message body.
/** The part of a logger an audit line needs (pino's and Fastify's request loggers both fit). */
export interface AuditLog { info: (obj: object, msg: string) => void }

export type AuditEvent = 'session.created' | 'session.ended' | 'request.refused' | 'tools.call'

export interface AuditFields {
  tenant?: string | null
  subject?: string
  server?: string
  [field: string]: unknown
}

export function audit (log: AuditLog, event: AuditEvent, fields: AuditFields): void {
  log.info({ audit: event, ...fields }, `audit: ${event}`)
}

/** Lines waiting for the end of this turn of the event loop. */
let deferred: Array<[AuditLog, AuditEvent, AuditFields]> = []

/**
 * The same line, written once this turn of the event loop is over: the audit line of a tools/call
 * is logged when its answer arrives, and serialising it there delayed the answer (issue 10).
 * Everything logged in one turn is written by one setImmediate.
 */
export function auditSoon (log: AuditLog, event: AuditEvent, fields: AuditFields): void {
  if (deferred.push([log, event, fields]) > 1) return
  setImmediate(() => {
    const lines = deferred
    deferred = []
    for (const [l, e, f] of lines) audit(l, e, f)
  })
}
