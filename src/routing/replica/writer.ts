// What the client streams of a replica (streams.ts) need of a stream writer, and how they get one:
// the HTTP layer, which owns the response, hands a factory down (app.ts), so this room never
// imports it. http/sse.ts's StreamWriter is the one implementation.
import type { ServerResponse } from 'node:http'
import type { FastifyBaseLogger } from 'fastify'
import type { GatewayError } from '../../core/errors.js'
import type { JsonRpcResponse, RequestId } from '../../core/jsonrpc.js'
import type { EventLog, LogEntry } from '../../state/event-log.js'
import type { GatewayMetrics } from '../../telemetry/metrics.js'

export type WriterMode =
  /** Streamable HTTP SSE (POST response stream or GET stream). */
  | 'sse'
  /** Legacy HTTP+SSE: `event: message` frames. */
  | 'legacy'
  /** One JSON body with the response(s), written when all have arrived. */
  | 'json'

export type WriterEndReason = 'complete' | 'client-closed' | 'released' | 'shutdown' | 'session-ended' | 'error'

export interface WriterOptions {
  res: ServerResponse
  sid: string
  streamId: string
  eventLog: EventLog
  mode: WriterMode
  /** Entries strictly after this one are written; null: from the oldest retained entry. */
  cursor: string | null
  /** Responses after which the stream ends; Infinity for GET and legacy streams. */
  expectedResponses: number
  /** A POST stream: the ids of its requests, so they can be answered here if the log is unreachable. */
  requestIds?: RequestId[]
  /** JSON mode: answer with an array (the POST was a batch). */
  batch?: boolean
  /**
   * A new POST stream: nothing can be in its log before start() (messages are delivered after),
   * so the first read is skipped; the first wake pulls.
   */
  fresh?: boolean
  /** Extra response headers (Mcp-Session-Id). */
  headers: Record<string, string>
  keepAliveMs: number
  /** `retry` sent with priming events (2025-11-25 sessions), in ms. */
  retryMs?: number
  /** Written right after the headers, before any log entry (the legacy `endpoint` event). */
  preamble?: string
  /**
   * SSE mode, a POST stream: hold the headers up to this many ms. If every answer comes first,
   * they go out as one JSON body in one write; anything else first (a notification, a server
   * request), the delay running out, or the stream ending opens the SSE stream as usual.
   */
  lazyMs?: number
  /** Called exactly once when the writer stops, with its last written entry id. */
  onEnd: (writer: ClientWriter, reason: WriterEndReason) => void
  log: FastifyBaseLogger
  /** When set, entries trimmed from the log before this writer delivered them are counted. */
  metrics?: GatewayMetrics | undefined
}

/** One client stream's writer on this replica (see http/sse.ts for what each member does). */
export interface ClientWriter {
  readonly sid: string
  readonly streamId: string
  /** Appends to this stream started here and not yet done: an answer must not overtake one. */
  appending: number
  /** Settles once the stream's mark (or the verdict on the session) was applied. */
  marking: Promise<void> | undefined
  /** A stream not marked yet: marks it (once). */
  markLater: (() => void) | undefined
  readonly cursor: string | null
  readonly advanced: boolean
  readonly ended: boolean
  readonly resumable: boolean
  readonly clientCanResume: boolean
  readonly answeredDirectly: RequestId[]
  readonly awaitsAnswers: boolean
  primed (cursor: string | null, preamble: string | undefined): void
  start (): Promise<void>
  keepAlive (): void
  wake (): Promise<void>
  offer (entry: LogEntry): Promise<void>
  answerDirectly (message: JsonRpcResponse, json: string): 'json' | 'sse' | undefined
  end (reason: WriterEndReason, retryMs?: number): void
  refuse (err: GatewayError): boolean
  failUnanswered (answer: (id: RequestId) => JsonRpcResponse): RequestId[]
}

/** Makes the writer of a client stream (the HTTP layer's StreamWriter). */
export type WriterFactory = (options: WriterOptions) => ClientWriter
