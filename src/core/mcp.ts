// Facts of the MCP protocol that several layers need, in one place.

/** RFC 5424 levels, least severe first (MCP logging: `logging/setLevel`, `notifications/message`). */
export const LOG_LEVELS = ['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency'] as const
export type LogLevel = typeof LOG_LEVELS[number]

/** Whether a value is an MCP log level. */
export function isLogLevel (value: unknown): value is LogLevel {
  return (LOG_LEVELS as readonly unknown[]).includes(value)
}

/**
 * Server-to-client requests and the client capability each needs: one the client did not declare
 * is refused to the server with -32601 and never reaches the client (MCP basic/lifecycle,
 * "Capability Negotiation").
 */
export const CAPABILITY_OF_SERVER_REQUEST: Readonly<Record<string, string>> = Object.freeze({
  'sampling/createMessage': 'sampling',
  'elicitation/create': 'elicitation',
  'roots/list': 'roots'
})

/** The capability a server-to-client request needs, or undefined for any other method (safe for any name). */
export function capabilityNeededBy (method: string): string | undefined {
  return Object.hasOwn(CAPABILITY_OF_SERVER_REQUEST, method) ? CAPABILITY_OF_SERVER_REQUEST[method] : undefined
}
