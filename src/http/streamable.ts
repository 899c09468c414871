// Streamable HTTP (2025-03-26 … 2025-11-25) on /mcp/<server>: POST, GET, DELETE
// (docs/spec-rules.md §5; docs/architecture.md).
import { consentErrorFor } from '../core/consent-error.js'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { Config } from '../config/schema.js'
import type { ServerSource } from '../config/live.js'
import {
  GW_ERR_BAD_REQUEST, GW_ERR_CONFLICT, GW_ERR_INVALID_REQUEST, GW_ERR_METHOD_NOT_ALLOWED,
  GW_ERR_SESSION_NOT_FOUND, GW_ERR_SESSION_REQUIRED, isGatewayError, toJsonRpcError, GW_ERR_INTERNAL
} from '../core/errors.js'
import { formatEventId, GET_STREAM, parseEventId } from '../state/event-log.js'
import { checkAccept, GET_ACCEPTS, POST_ACCEPTS, clientHeaders, decodeBody, header, replyHeaders, serverOf } from './request.js'
import { isRequest, type JsonRpcMessage, type JsonRpcRequest } from '../core/jsonrpc.js'
import { allowsBatches, allowsPriming, checkVersionHeader, negotiateVersion } from '../core/protocol-version.js'
import type { Router } from '../routing/router.js'
import { newRequestStreamId } from '../routing/replica/streams.js'
import type { SessionRecord } from '../state/session-store.js'
import { classifyPost } from './modern-rules.js'
import { modernHeaders, type ModernFace } from './modern.js'

export interface HttpStreamableOptions {
  config: Readonly<Config>
  /** The servers as configured now (live reload). */
  live: ServerSource
  router: Router
  /** The 2026-07-28 face: POSTs classified modern are served there, statelessly. */
  modern: ModernFace
}

interface ServerParams { server: string }

/** The lazy-SSE window of an initialize (see lazyMsOf in httpStreamable). */
export const INITIALIZE_LAZY_MS = 10_000

export default async function httpStreamable (app: FastifyInstance, opts: HttpStreamableOptions): Promise<void> {
  const { config, live, router, modern } = opts

  /** `checkedLater`: requests follow, whose marking checks that the session exists (Sessions.get). */
  async function sessionOf (req: FastifyRequest, server: string, checkedLater = false): Promise<SessionRecord> {
    const sid = header(req, 'mcp-session-id')
    if (sid === undefined || sid === '') throw new GW_ERR_SESSION_REQUIRED()
    const record = await router.getSession(sid, req.principal.key, checkedLater)
    // Unknown, expired, another principal's, another server's: all the same 404 (H-SES-3, G-5).
    if (record === null || record.server !== server || record.transport !== 'streamable') throw new GW_ERR_SESSION_NOT_FOUND()
    return record
  }

  /**
   * The backend's deadline for a POST stream's catch-all (ClientStreams.openPost), with Redis only:
   * what it catches is a request lost on the way to another replica's relay. In one process a
   * request reaches its relay in the same call or fails there, and the relay's own timer answers.
   */
  function deadlineOf (server: string): { server: string, timeoutMs: number } | undefined {
    if (config.redis === undefined) return undefined
    const serverConfig = Object.hasOwn(live.servers, server) ? live.servers[server] : undefined
    return serverConfig === undefined ? undefined : { server, timeoutMs: serverConfig.requestTimeoutMs }
  }

  /**
   * How long a POST's SSE stream may stay unopened (lazy SSE). An initialize waits for a backend
   * that is often still starting (a stdio child takes hundreds of ms), so with the usual 50 ms its
   * answer opened an SSE stream whose log was then kept for a resume nobody makes (a client
   * without a session id cannot resume it): 1 KB and a keep-alive timer per new session for a
   * minute. Nothing but the answer comes on an initialize's stream, so it waits up to
   * INITIALIZE_LAZY_MS for one JSON body. `lazySseMs: 0` still opens every stream at once.
   */
  function lazyMsOf (requests: JsonRpcRequest[]): number {
    const lazyMs = config.http.lazySseMs
    return lazyMs > 0 && requests.length === 1 && requests[0]?.method === 'initialize' ? Math.max(lazyMs, INITIALIZE_LAZY_MS) : lazyMs
  }

  /** Opens the response stream for the requests of one POST, then hands every message to the owner. */
  async function answer (reply: FastifyReply, record: SessionRecord, messages: JsonRpcMessage[], batch: boolean, req: FastifyRequest, ownerRead?: Promise<string | null>): Promise<void> {
    const requests = messages.filter(isRequest)
    const mode = config.http.responseMode
    const streamId = newRequestStreamId(mode, requests.length)
    const priming = mode === 'sse' && allowsPriming(record.protocolVersion)
    // Everything that can fail comes before hijack, so the error handler still answers with an
    // HTTP status: the route (a session whose owner is gone is taken over, or is a plain 404),
    // then the requests recorded as pending (each gets exactly one answer, whatever fails later),
    // in the same step as the stream's holder and its priming entry. That entry is appended before
    // the stream starts, so nobody is woken to read it back: its frame is written directly with
    // the id the log gave it (H-POST-7).
    // Asked before admit() awaits anything: whether the record came from the store just now.
    const recordRead = router.recordRead(record)
    const admission = await router.admit(record, ownerRead, requests)
    // The requests need not wait for their mark (ClientStreams.openPost) when they go to the
    // backend from this replica (SessionKind.sendsFromHere), or to the owner's relay on another
    // replica through a bus that delivers only after the mark (Bus.ordered). A direct session
    // still initialising sends them to the replica holding its lease: they wait.
    const servedHere = admission.sendsFromHere
    const servedBy = admission.servedBy
    const writer = await router.openPost({
      // Requests served by the session's owner: a marker names it, so when it is gone with
      // requests in flight, whoever watches the session can answer them (router.ts).
      servedBy,
      mark: servedHere ? 'when-needed' : servedBy !== undefined && router.busOrdered ? 'alongside' : 'first',
      recordRead,
      deadline: deadlineOf(record.server),
      res: reply.raw,
      sid: record.id,
      streamId,
      mode,
      priming,
      batch,
      requestIds: requests.map(r => r.id),
      headers: replyHeaders(reply, { 'mcp-session-id': record.id }),
      preamble: primingId => `id: ${formatEventId(streamId, primingId)}\nretry: ${config.http.retryMs}\ndata: \n\n`,
      // Lazy, except a 2025-11-25 stream whose answers may come from another replica: its priming
      // event goes at once, so if this replica dies mid-call the client resumes elsewhere and gets
      // the answer from the log. Served here, the backend connection would die with this replica.
      ...(mode === 'sse' && (config.redis === undefined || !priming || servedHere) ? { lazyMs: lazyMsOf(requests) } : {}),
      log: req.log
    }).catch((err: unknown) => {
      // The connections a pooled session's requests took go back to the pool.
      router.release(admission)
      throw err
    })
    reply.hijack()
    try {
      await writer.start()
      for (const message of messages) await router.fromClient(record, message, isRequest(message) ? streamId : null, admission, req.headers)
    } catch (err) {
      // The stream is open: answer each request on it rather than leave the client waiting. An
      // answer is written only while its request is pending (a deleted session has none left).
      // A consent the user must give reaches a client that declared URL elicitation as one (-32042).
      const gwErr = consentErrorFor(isGatewayError(err) ? err : new GW_ERR_INTERNAL('message not delivered', { cause: err }),
        { protocolVersion: record.protocolVersion, capabilities: record.initializeParams?.capabilities })
      req.log.warn({ err }, 'message not delivered')
      // Pool connections taken for requests that never went out go back.
      router.release(admission)
      for (const request of requests) {
        await router.append(record.id, streamId, toJsonRpcError(gwErr, request.id)).catch(() => {
          writer.failUnanswered(id => toJsonRpcError(gwErr, id))
        })
      }
    }
  }

  async function post (req: FastifyRequest<{ Params: ServerParams }>, reply: FastifyReply): Promise<void> {
    const server = serverOf(live, req)
    checkAccept(req, POST_ACCEPTS)
    // Body first, as the SDKs classify (M-14): a modern request carries no session.
    const headers = modernHeaders(req)
    if (classifyPost(req.body, headers).era === 'modern') {
      const [message] = decodeBody(req, false).messages
      if (message !== undefined) await modern.serve(req, reply, server, message, headers)
      return
    }
    const { messages, batch } = decodeBody(req, true)
    const initialize = messages.find((m): m is JsonRpcRequest => isRequest(m) && m.method === 'initialize')
    if (initialize !== undefined) {
      if (batch) throw new GW_ERR_INVALID_REQUEST('initialize must not be part of a JSON-RPC batch')
      if (header(req, 'mcp-session-id') !== undefined) throw new GW_ERR_INVALID_REQUEST('Server already initialized: initialize starts a new session and carries no Mcp-Session-Id')
      const params = (typeof initialize.params === 'object' && initialize.params !== null && !Array.isArray(initialize.params)) ? initialize.params : {}
      const record = await router.createSession({
        server,
        principal: req.principal.key,
        tenant: req.principal.tenant,
        subjectDigest: req.principal.subjectDigest,
        transport: 'streamable',
        protocolVersion: negotiateVersion(params.protocolVersion),
        initializeParams: params
      }, clientHeaders(req))
      req.log.info({ server, protocolVersion: record.protocolVersion }, 'session created')
      await answer(reply, record, messages, false, req)
      return
    }
    const hasRequests = messages.some(isRequest)
    const ownerRead = router.prefetchOwner(header(req, 'mcp-session-id'), server)
    const record = await sessionOf(req, server, hasRequests)
    checkVersionHeader(req.headers['mcp-protocol-version'])
    if (batch && !allowsBatches(record.protocolVersion)) {
      throw new GW_ERR_INVALID_REQUEST(`JSON-RPC batches are not supported in protocol version ${record.protocolVersion}`)
    }
    // Every answer of a batch must fit in its stream's bounded log, or a slow reader could lose some.
    const maxBatch = Math.min(9999, config.sessions.eventLogMaxLen - 1)
    if (batch && messages.length > maxBatch) throw new GW_ERR_INVALID_REQUEST(`a batch holds at most ${maxBatch} messages`)
    if (!hasRequests) {
      // Only notifications and responses: accepted with 202 and no body (H-POST-3).
      const admission = await router.admit(record, ownerRead)
      for (const message of messages) await router.fromClient(record, message, null, admission)
      reply.code(202).send()
      return
    }
    await answer(reply, record, messages, batch, req, ownerRead)
  }

  async function get (req: FastifyRequest<{ Params: ServerParams }>, reply: FastifyReply): Promise<void> {
    const server = serverOf(live, req)
    checkAccept(req, GET_ACCEPTS)
    const record = await sessionOf(req, server)
    checkVersionHeader(req.headers['mcp-protocol-version'])
    const lastEventId = header(req, 'last-event-id')
    let streamId = GET_STREAM
    let cursor: string | null
    if (lastEventId !== undefined && lastEventId !== '') {
      // Resume (flow 4): the id names its stream; replay only that stream (H-RES-2).
      const parsed = parseEventId(lastEventId)
      if (parsed === null || (parsed.streamId !== GET_STREAM && !(await router.streamExists(record.id, parsed.streamId)))) {
        throw new GW_ERR_BAD_REQUEST('Last-Event-ID does not name an event of this session')
      }
      streamId = parsed.streamId
      cursor = parsed.entryId
    } else {
      if (await router.hasLiveStream(record.id, GET_STREAM)) throw new GW_ERR_CONFLICT('Only one GET stream is allowed per session')
      cursor = await router.streamCursor(record.id, GET_STREAM)
    }
    const priming = allowsPriming(record.protocolVersion)
    const writer = await router.openStream({
      res: reply.raw,
      sid: record.id,
      streamId,
      mode: 'sse',
      cursor,
      headers: replyHeaders(reply, { 'mcp-session-id': record.id }),
      exclusive: streamId === GET_STREAM && (lastEventId === undefined || lastEventId === ''),
      // 2025-11-25: a priming event first, so the client holds an id to resume from. Its id is the
      // stream's current cursor, so it needs no log entry (H-POST-7).
      // A resumed stream gets only the retry hint: the client already holds an id of it.
      ...(priming ? { preamble: streamId === GET_STREAM && lastEventId === undefined ? `id: ${formatEventId(streamId, cursor ?? '0')}\nretry: ${config.http.retryMs}\ndata: \n\n` : `retry: ${config.http.retryMs}\n\n` } : {}),
      log: req.log
    }, streamId === GET_STREAM ? record : undefined)
    reply.hijack()
    await writer.start()
  }

  async function del (req: FastifyRequest<{ Params: ServerParams }>, reply: FastifyReply): Promise<void> {
    const server = serverOf(live, req)
    const record = await sessionOf(req, server)
    checkVersionHeader(req.headers['mcp-protocol-version'])
    await router.endSession(record.id, 'client DELETE')
    req.log.info({ server }, 'session deleted by client')
    reply.code(200).send()
  }

  app.post('/mcp/:server', post)
  app.get('/mcp/:server', get)
  app.delete('/mcp/:server', del)
  app.route({
    method: ['PUT', 'PATCH', 'HEAD'],
    url: '/mcp/:server',
    handler: async (_req, reply) => {
      reply.header('allow', 'GET, POST, DELETE')
      throw new GW_ERR_METHOD_NOT_ALLOWED()
    }
  })
}
