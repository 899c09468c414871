// Per-client-stream event logs: every message for a client is appended here first and the
// stream's holder pulls after its cursor (docs/architecture.md). Event ids shown to
// clients are `<streamId>.<entryId>`; they name their stream and are parsed strictly (H-RES-1/2).
import type { JsonRpcMessage, RequestId } from '../core/jsonrpc.js'
import type { PreparedWake } from './bus.js'

/** One entry; a null message is a priming event (an id and empty data, H-POST-7). */
export interface LogEntry {
  entryId: string
  message: JsonRpcMessage | null
  /** The message as the log stores it (JSON text; '' for priming), so writers need not re-serialise it. */
  json: string
  /**
   * The entry's ordinal in its stream, counting from 1 with no gaps: a reader whose next entry is
   * more than one past the last it delivered knows how many were trimmed before delivery
   * (`mcpgw_event_log_lost_total`). It may start again at 1 when a silent stream expired and was
   * created anew.
   */
  seq: number
}

export interface AppendResult {
  /** The new entry's id; '' when nothing was written: the request was answered already (`answers`). */
  entryId: string
  /** The replica holding the stream at append time, or null: the entry waits in the log. */
  holder: string | null
  /**
   * The entry as a reader would get it, when written: a holder on this replica whose last entry
   * was the one before (LogEntry.seq) takes it without reading the log back.
   */
  entry?: LogEntry
  /** The prepared wake (append `wake`) was written with the entry: the holder needs no other. */
  woken?: boolean
}

/** The replica that holds a client stream, and for how long (EventLog.markPending). */
export interface StreamHolder { replicaId: string, leaseMs: number }

/** A request still waiting for its answer (a pending marker; see EventLog.markPending). */
export interface PendingRequest {
  streamId: string
  id: RequestId
}

export interface EventLog {
  /**
   * Appends one entry (bounded log, TTL refreshed) and reports the stream's holder. With
   * `answers`, the entry is the answer to that request of the stream, and a request gets exactly
   * one answer whoever races to give it (the backend, a timeout, an owner-loss error): written when
   * its pending marker is there (taken in the same step); not when the request was settled
   * otherwise (a tombstone) or the session is gone; with no marker at all (answered already, or
   * the marker was lost with a Redis primary that failed over) only if the log holds no answer to it.
   * `json`: the message as JSON, when the caller has it already (so it is not serialised twice).
   * `wake`: written in the same step when the stream's holder is the replica it was prepared for
   * (Bus.prepareWake; AppendResult.woken). Only the Redis twin is given one.
   */
  append (sid: string, streamId: string, message: JsonRpcMessage | null, ttlMs: number, answers?: RequestId, json?: string, wake?: PreparedWake): Promise<AppendResult>
  /**
   * Records the requests of a client POST as pending, with the time of recording and the replica
   * that serves them (`servedBy`: the one whose relay sends them to the backend, so that when it
   * is gone its markers can be claimed, claimOrphans `of`), and appends the stream's priming entry
   * when `priming`; returns that entry's id, else null. With `holder`, the POST's stream is new
   * and that replica becomes its holder for `leaseMs`, in the same step (SessionStore.claimHolder
   * without a previous one). The Redis twin records nothing and throws GW_ERR_SESSION_NOT_FOUND
   * when the session's record is gone, checked in the same step: a POST to a session owned here
   * may then skip reading the record (Sessions.get). The memory twin shares its process with the
   * store, where that POST reads the record anyway.
   */
  markPending (sid: string, streamId: string, ids: RequestId[], ttlMs: number, priming: boolean, servedBy: string, holder?: StreamHolder): Promise<string | null>
  /**
   * Takes the pending markers of requests whose answers can no longer come: every marker recorded
   * up to now (the session's owner is gone), or those naming one serving replica (`of`, gone: its
   * requests died with it). The caller answers each; no later answer is written. Without `of`,
   * markers naming `except` stay: requests a takeover took from the lost owner's inbox and
   * delivers again (Bus.takeUnread). `minAgeMs`: markers recorded less than that ago stay (see
   * ORPHAN_MIN_AGE_MS in routing/kinds/delivery.ts).
   */
  claimOrphans (sid: string, of?: string, except?: string, minAgeMs?: number): Promise<PendingRequest[]>
  /** The replicas the session's pending markers name (each serves its requests). */
  pendingReplicas (sid: string): Promise<string[]>
  /** Settles one request (it was answered without the log, while that was unreachable). */
  claim (sid: string, streamId: string, id: RequestId, ttlMs: number): Promise<boolean>
  /** Entries strictly after `cursor` (null: from the start), oldest first, at most `limit`. */
  readAfter (sid: string, streamId: string, cursor: string | null, limit: number): Promise<LogEntry[]>
  /** The ordinal of an entry (LogEntry.seq), or null when the log no longer knows it (trimmed, expired). */
  seqOf (sid: string, streamId: string, entryId: string): Promise<number | null>
  /** Whether the stream has ever had an entry (and has not expired). */
  hasStream (sid: string, streamId: string): Promise<boolean>
  /** Shortens (or extends) how long a stream's log is kept (0: drops it now); no-op for a stream that is gone. */
  expire (sid: string, streamId: string, ttlMs: number): Promise<void>
  /**
   * A completed POST stream that no client can resume (it was answered as one JSON body, so no
   * event id of it was sent) goes now, in one step: its log (as expire 0), `holder`'s lease on it
   * (SessionStore.releaseHolder), and the pending markers of `answered`: requests its writer
   * answered as one JSON body, never in the log (StreamWriter.answerDirectly). A settled marker
   * (tombstone) stays.
   */
  discard (sid: string, streamId: string, holder: string, answered: RequestId[]): Promise<void>
  /**
   * Forgets streams of a session that have lapsed (log, holder lease and cursor all expired),
   * looking at up to `sample` of them (the Redis twin picks them at random, the memory twin takes
   * the oldest), and returns how many it forgot. Expiry drops each key by itself, but the Redis
   * twin's list of a session's streams (kept so deleting the session finds every key) and their
   * ordinals would otherwise stay until the session ends: one entry per SSE-answered call. A
   * stream used again later starts its ordinals afresh, as in the memory twin.
   */
  prune (sid: string, sample: number): Promise<number>
  /** Drops every stream of a session. */
  deleteSession (sid: string): Promise<void>
}

const STREAM_ID = /^[A-Za-z0-9_-]{1,64}$/
// Memory twin: a decimal sequence; Redis twin: a stream entry id `<ms>-<seq>`. The bounds keep a
// client-sent id inside what both twins can compare (Redis rejects parts above uint64).
const ENTRY_ID = /^\d{1,16}(-\d{1,19})?$/

export function isStreamId (value: string): boolean {
  return STREAM_ID.test(value)
}

/** Whether a string has the shape of an entry id either twin mints (a log cursor). */
export function isEntryId (value: string): boolean {
  return ENTRY_ID.test(value)
}

export function formatEventId (streamId: string, entryId: string): string {
  return `${streamId}.${entryId}`
}

/**
 * The entry id of answers written straight to a POST stream, not through the log (the store was
 * unreachable, or the session ended). Neither twin mints it (the Redis twin's milliseconds would
 * be 300,000 years from now). A client resuming from it has every answer of that stream already:
 * clients resume after an error answer too (the v1 SDK does), and must not get a second one.
 */
export const ANSWERED_DIRECTLY = '9999999999999999'

/** Strict parse of a client-sent Last-Event-ID; null when it is not one the gateway minted. */
export function parseEventId (value: string): { streamId: string, entryId: string } | null {
  if (value.length > 128) return null
  const dot = value.indexOf('.')
  if (dot < 1) return null
  const streamId = value.slice(0, dot)
  const entryId = value.slice(dot + 1)
  if (!STREAM_ID.test(streamId) || !ENTRY_ID.test(entryId)) return null
  return { streamId, entryId }
}

/** The standalone GET stream's id, and the legacy HTTP+SSE stream's id. */
export const GET_STREAM = 'get'
export const LEGACY_STREAM = 'legacy'

/** Orders entry ids of either twin (`7` or `1700000000000-3`); only ids of one stream are compared. */
export function compareEntryIds (a: string, b: string): number {
  const [a1 = '0', a2 = '0'] = a.split('-')
  const [b1 = '0', b2 = '0'] = b.split('-')
  const major = BigInt(a1) - BigInt(b1)
  if (major !== 0n) return major < 0n ? -1 : 1
  const minor = BigInt(a2) - BigInt(b2)
  return minor === 0n ? 0 : minor < 0n ? -1 : 1
}

/** The pending-marker field of one request of a stream: `<streamId> <n|s><id>`. */
export function pendingField (streamId: string, id: RequestId): string {
  return `${streamId} ${typeof id === 'number' ? 'n' : 's'}${id}`
}

export function parsePendingField (field: string): PendingRequest | null {
  const space = field.indexOf(' ')
  if (space < 1) return null
  const kind = field[space + 1]
  const raw = field.slice(space + 2)
  return { streamId: field.slice(0, space), id: kind === 'n' ? Number(raw) : raw }
}
