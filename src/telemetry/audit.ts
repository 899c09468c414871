// Audit lines: one structured info line per decision that matters (docs/authentication.md):
// sessions created and ended, requests refused and why, tool calls with their outcome. Each carries
// `audit: <event>` so a log pipeline can select them. They name tenants and subject digests only,
// never a key, a token, a full subject or a message body.
/** The part of a logger an audit line needs (pino's and Fastify's request loggers both fit). */
export interface AuditLog { info: (obj: object, msg: string) => void }

/** A logger that can make a child with fixed fields (pino's). */
export interface AuditParent { child: (bindings: Record<string, unknown>) => AuditLog }

export type AuditEvent = 'session.created' | 'session.ended' | 'request.refused' | 'tools.call' | 'admin.action' | 'task.created' | 'task.cancel' | 'credential.issued' | 'credential.failed' | 'credential.consent' | 'credential.refreshed' | 'credential.revoked'

export interface AuditFields {
  tenant?: string | null
  subject?: string
  server?: string
  [field: string]: unknown
}

const MESSAGES: Record<AuditEvent, string> = {
  'session.created': 'audit: session.created',
  'session.ended': 'audit: session.ended',
  'request.refused': 'audit: request.refused',
  'tools.call': 'audit: tools.call',
  'admin.action': 'audit: admin.action',
  'task.created': 'audit: task.created',
  'task.cancel': 'audit: task.cancel',
  'credential.issued': 'audit: credential.issued',
  'credential.failed': 'audit: credential.failed',
  'credential.consent': 'audit: credential.consent',
  'credential.refreshed': 'audit: credential.refreshed',
  'credential.revoked': 'audit: credential.revoked'
}

export function audit (log: AuditLog, event: AuditEvent, fields: AuditFields): void {
  log.info({ audit: event, ...fields }, MESSAGES[event])
}

/**
 * A logger for many audit lines of one event whose leading fields never change (a session's
 * tools/call lines: tenant, subject, server): pino serialises a child's bindings once, so each
 * line then serialises only its own fields (auditSoon with `bound`).
 */
export function auditChild (log: AuditParent, event: AuditEvent, fields: AuditFields): AuditLog {
  return log.child({ audit: event, ...fields })
}

/** Lines waiting for the end of this turn of the event loop: logger, fields, message. */
let deferred: Array<[AuditLog, object, string]> = []

/**
 * An audit line written once this turn of the event loop is over: the audit line of a tools/call is
 * logged when its answer arrives, and serialising it there delayed the answer. Everything logged in
 * one turn is written by one setImmediate. `bound`: `log` came from auditChild(…, event, …), so the
 * event and its fixed fields are in it already.
 */
export function auditSoon (log: AuditLog, event: AuditEvent, fields: AuditFields, bound = false): void {
  if (deferred.push([log, bound ? fields : { audit: event, ...fields }, MESSAGES[event]]) > 1) return
  setImmediate(() => {
    const lines = deferred
    deferred = []
    for (const [l, f, m] of lines) l.info(f, m)
  })
}
