// Legacy HTTP+SSE (protocol 2024-11-05, docs/spec-rules.md §6; docs/architecture.md):
// GET /sse/<server> opens the session's only stream and names the messages URL in an
// `endpoint` event; POSTs there answer 202 and their answers flow into that stream.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { ServerSource } from '../config/live.js'
import { GW_ERR_BAD_REQUEST, GW_ERR_INVALID_REQUEST, GW_ERR_SESSION_NOT_FOUND } from '../core/errors.js'
import { LEGACY_STREAM } from '../state/event-log.js'
import { clientHeaders, decodeBody, replyHeaders, serverOf } from './request.js'
import { isRequest } from '../core/jsonrpc.js'
import { LEGACY_SSE_VERSION, negotiateVersion } from '../core/protocol-version.js'
import type { Router } from '../routing/router.js'

export interface HttpLegacySseOptions {
  /** The servers as configured now (live reload). */
  live: ServerSource
  router: Router
}

interface ServerParams { server: string }
interface MessagesQuery { sessionId?: string }

export default async function httpLegacySse (app: FastifyInstance, opts: HttpLegacySseOptions): Promise<void> {
  const { live, router } = opts

  app.get('/sse/:server', async (req: FastifyRequest<{ Params: ServerParams }>, reply: FastifyReply) => {
    const server = serverOf(live, req)
    const record = await router.createSession({
      server,
      principal: req.principal.key,
      tenant: req.principal.tenant,
      subjectDigest: req.principal.subjectDigest,
      transport: 'legacy',
      protocolVersion: LEGACY_SSE_VERSION,
      initializeParams: null
    }, clientHeaders(req))
    req.log.info({ server }, 'legacy SSE session created')
    // A relative URL: the SDK client resolves it against the SSE URL and rejects other origins (S-2).
    const endpoint = `/sse/${encodeURIComponent(server)}/messages?sessionId=${record.id}`
    const writer = await router.openStream({
      res: reply.raw,
      sid: record.id,
      streamId: LEGACY_STREAM,
      mode: 'legacy',
      cursor: null,
      headers: replyHeaders(reply),
      preamble: `event: endpoint\ndata: ${endpoint}\n\n`,
      log: req.log
    }, record)
    reply.hijack()
    await writer.start()
  })

  app.post('/sse/:server/messages', async (req: FastifyRequest<{ Params: ServerParams, Querystring: MessagesQuery }>, reply: FastifyReply) => {
    const server = serverOf(live, req)
    const sid = req.query.sessionId
    if (sid === undefined || sid === '') throw new GW_ERR_BAD_REQUEST('sessionId query parameter is required')
    const record = await router.getSession(sid, req.principal.key)
    if (record === null || record.server !== server || record.transport !== 'legacy') throw new GW_ERR_SESSION_NOT_FOUND()
    const { messages } = decodeBody(req, false)
    const message = messages[0]
    if (message === undefined) throw new GW_ERR_BAD_REQUEST('empty body')
    if (isRequest(message) && message.method === 'initialize') {
      if (record.initializeParams !== null) throw new GW_ERR_INVALID_REQUEST('Server already initialized')
      const params = (typeof message.params === 'object' && message.params !== null && !Array.isArray(message.params)) ? message.params : {}
      const patch = { protocolVersion: negotiateVersion(params.protocolVersion), initializeParams: params }
      await router.updateSession(record.id, patch)
      // The record read above is what routes this initialize: a pooled session answers it from
      // the record (its version), as a dedicated one answers from what the client asked.
      Object.assign(record, patch)
    }
    await router.fromClient(record, message, isRequest(message) ? LEGACY_STREAM : null, undefined, req.headers)
    reply.code(202).type('text/plain').send('Accepted')
  })
}
