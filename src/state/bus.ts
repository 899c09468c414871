// The bus between replicas: each replica reads one inbox. It only rings doorbells and carries
// client messages to the owner; the event log stays the truth (docs/architecture.md).
import type { JsonRpcMessage, JsonRpcRequest } from '../core/jsonrpc.js'
import type { TraceCarrier } from '../core/trace-context.js'

export type Envelope =
  /**
   * A client message for the backend, sent to the session's owner (`trace`: its SERVER span,
   * tracing on). `holder`: the sender, when it holds the request's stream (it took the POST): the
   * answer's wake can then go with its append (Bus.prepareWake).
   */
  | { kind: 'deliver', sid: string, streamId: string | null, message: JsonRpcMessage, trace?: TraceCarrier | undefined, holder?: string }
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
  /** `subject`: the one subject whose pool saw the event (a per-user credential); absent or null: the tenant's. */
  | { kind: 'listen-event', server: string, tenant: string | null, subject?: string | null, message: JsonRpcMessage }
  /** 2026-07-28: a client cancelled a task the gateway hosts on the receiving replica: its call is cancelled. */
  | { kind: 'task-cancel', taskId: string }
  /** 2026-07-28: tasks/update answers for a hosted task whose call waits, parked, on the receiving replica. */
  | { kind: 'task-update', taskId: string, inputResponses: Record<string, unknown> }
  /** An operator asked (admin API, replica `from`) that every replica re-read its config file. */
  | { kind: 'admin-reload', from: string }

/** A log entry as a wake carries it: its JSON text, not the parsed message (LogEntry). */
export interface WokenEntry { entryId: string, json: string, seq: number }

/**
 * A wake written by the event log in the same step as the append it announces (EventLog.append
 * `wake`), if the stream's holder then is `replicaId`: a round trip less between a backend's
 * answer and the replica that holds its client's stream.
 */
export interface PreparedWake {
  replicaId: string
  /** That replica's inbox, its bound (approximate) and TTL. */
  inbox: string
  maxLen: number
  ttlMs: number
  /** The envelope's JSON: head + the entry's ordinal + mid + the entry's id + tail (known only in that step). */
  head: string
  mid: string
  tail: string
  /** Called once the wake was written (metrics count it as sent). */
  sent: () => void
}

/** A client message for a backend, as sent to the session's owner. */
export type DeliverEnvelope = Extract<Envelope, { kind: 'deliver' }>

export type EnvelopeHandler = (envelope: Envelope) => void

export interface Bus {
  /**
   * Whether an envelope sent after a write to the event log or session store (a call issued
   * earlier, even one not answered yet) is read by its receiver only once that write is applied:
   * true when both go over one connection to one server, in order (Redis standalone or Sentinel).
   * Redis Cluster (keys on several nodes) and the memory bus (a later turn, not a later write)
   * promise nothing, so their senders await such a write first.
   */
  readonly ordered: boolean
  /** Starts reading this replica's inbox. */
  start (replicaId: string, handler: EnvelopeHandler): Promise<void>
  /** Puts an envelope in another replica's inbox. */
  send (replicaId: string, envelope: Envelope): Promise<void>
  /**
   * The wake of an entry about to be appended to a stream, for the event log to write in the
   * same step (the entry carried, as in a wake envelope); undefined unless the bus and the log
   * share one server (`ordered`), as one step can touch both only there. `stamp`: fields the
   * envelope carries besides (metrics: its send time).
   */
  prepareWake (replicaId: string, sid: string, streamId: string, json: string, stamp?: { sentAt: number }): PreparedWake | undefined
  /**
   * A replica is gone: the requests and notifications of session `sid` that it never handed on to
   * a backend (still in its inbox, read or not) leave that inbox and are returned, oldest first; the
   * pending marker of each request names `servedBy` from then on (the replica that delivers them
   * again), in the same step. Requests already answered are left out. Empty when the bus cannot
   * tell what was read, or cannot change the markers in that step (not `ordered`: the memory bus,
   * where no replica dies alone, and Redis Cluster).
   */
  takeUnread (dead: string, sid: string, servedBy: string): Promise<DeliverEnvelope[]>
  close (): Promise<void>
}
