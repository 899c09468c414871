// The bus between replicas: each replica reads one inbox. It only rings doorbells and carries
// client messages to the owner; the event log stays the truth (ARCHITECTURE.md principle 3).
import type { JsonRpcMessage, JsonRpcRequest } from '../core/jsonrpc.js'
import type { TraceCarrier } from '../telemetry/tracing.js'

export type Envelope =
  /** A client message for the backend, sent to the session's owner (`trace`: its SERVER span, tracing on). */
  | { kind: 'deliver', sid: string, streamId: string | null, message: JsonRpcMessage, trace?: TraceCarrier | undefined }
  /**
   * New entries in a stream's log: the holder pulls after its cursor. `entry`: the one just
   * appended (a small one), which the holder writes without reading the log back when it follows
   * the last entry it wrote (StreamWriter.offer); otherwise it pulls as usual.
   */
  | { kind: 'wake', sid: string, streamId: string, entry?: WokenEntry }
  /** Another replica took the stream (resume elsewhere): stop writing it. */
  | { kind: 'release', sid: string, streamId: string }
  /** The session was deleted or expired: stop its backend and end its streams. */
  | { kind: 'end-session', sid: string, reason: string, server?: string }
  /**
   * 2026-07-28: an MRTR retry (http/modern.ts) that landed on replica `from`, for a call parked on
   * the receiving replica: resume it there; what it sends goes back as `mrtr-out` under `ticket`.
   */
  | { kind: 'mrtr-resume', from: string, ticket: string, principal: string, request: JsonRpcRequest }
  /** A message of a resumed call for the replica holding the client's response (`finish`: the last). */
  | { kind: 'mrtr-out', ticket: string, op: 'notify' | 'finish', message: JsonRpcMessage, status?: number }
  /** The client of a forwarded retry went away: the resumed call is cancelled. */
  | { kind: 'mrtr-cancel', ticket: string }
  /** A backend's session-level notification seen by another replica's pool, for listen streams here. */
  | { kind: 'listen-event', server: string, tenant: string | null, message: JsonRpcMessage }

/** A log entry as a wake carries it: its JSON text, not the parsed message (LogEntry). */
export interface WokenEntry { entryId: string, json: string, seq: number }

export type EnvelopeHandler = (envelope: Envelope) => void

export interface Bus {
  /** Starts reading this replica's inbox. */
  start (replicaId: string, handler: EnvelopeHandler): Promise<void>
  /** Puts an envelope in another replica's inbox. */
  send (replicaId: string, envelope: Envelope): Promise<void>
  close (): Promise<void>
}
