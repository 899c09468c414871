// A 2026-07-28 request relayed to a 2026-07-28 backend as it is (http/modern.ts asks the server's
// stateless kind whether it has one): the server's and the tenant's headers go upstream, and the
// caller's own credential where the server has a credentials source, never the client's. A server/discover is read whole when the gateway hosts tasks for the server
// (the extension is offered), a tools/list when a tool policy filters it; a call that may become a
// hosted task goes through modern-task-relay.ts; everything else streams back untouched.
import type { FastifyReply, FastifyRequest } from 'fastify'
import type { Dispatcher } from 'undici'
import { filterToolsList, type ToolPolicyLookup } from '../auth/tool-policy.js'
import { upstreamBaseHeaders } from '../backends/http-base.js'
import { MAX_BODY_BYTES, readText } from '../backends/http-io.js'
import { finalResponse, modernRequestHeaders, relayModern } from '../backends/modern-http.js'
import type { HttpServerConfig } from '../config/schema.js'
import { GW_ERR_BACKEND_UNAVAILABLE } from '../core/errors.js'
import { isRecord, type JsonRpcRequest } from '../core/jsonrpc.js'
import type { CredentialLookup, UpstreamLookup } from '../routing/upstream/ports.js'
import { withCallerCredential } from '../backends/caller-credential.js'
import type { RequestEnvelope } from './modern-rules.js'
import { relayHostable } from './modern-task-relay.js'
import { withTasksExtension, type ModernTasks } from './modern-tasks.js'
import { clientHeaders, replyHeaders } from './request.js'

/** What a relay needs of the face. */
export interface RelayOptions {
  upstream?: UpstreamLookup | undefined
  toolPolicy?: ToolPolicyLookup | undefined
  /** The caller's own credential toward a server (credentials/), set on each relayed request. */
  credentials?: CredentialLookup | undefined
  tasks: ModernTasks
  keepAliveMs: number
}

/**
 * A modern backend: the request goes upstream as it is and its response streams back (JSON or
 * SSE, input_required and listen streams included). The client closing the response aborts the
 * upstream request, which is the cancellation (M-11). Under a tool policy a tools/list answer is
 * read whole and filtered.
 */
export async function relayToModern (req: FastifyRequest, reply: FastifyReply, server: string, config: HttpServerConfig, message: JsonRpcRequest, envelope: RequestEnvelope, options: RelayOptions): Promise<void> {
  const fromClient = clientHeaders(req)
  const headers = { ...upstreamBaseHeaders(config, options.upstream?.(req.principal.tenant, server), fromClient), ...modernRequestHeaders(fromClient) }
  const { tasks, keepAliveMs } = options
  const credential = options.credentials?.(req.principal.tenant, req.principal.subjectDigest, server)
  // A call the gateway may host goes with the caller's credential as it stands (no renewal on a 401 there).
  const current = await credential?.current()
  if (current != null) headers[current.header] = current.value
  if (await relayHostable(reply, { tasks, keepAliveMs, server, config, headers, message, envelope, caller: { ...req.principal, principal: req.principal.key } })) return
  const abort = new AbortController()
  const res = reply.raw
  res.on('close', () => { if (!res.writableFinished) abort.abort() })
  const send = async (): Promise<Dispatcher.ResponseData> => await relayModern(server, config, headers, JSON.stringify(message), abort.signal)
  const upstream = credential === undefined ? await send() : await withCallerCredential(server, credential, headers, abort.signal, send)
  const contentType = String(upstream.headers['content-type'] ?? 'application/json')
  const policy = message.method === 'tools/list' ? options.toolPolicy?.(req.principal.tenant, server) ?? null : null
  // A backend without tasks of its own, whose calls the gateway hosts as tasks, offers the extension.
  const offersTasks = message.method === 'server/discover' && options.tasks.hosts(server)
  if (policy !== null || offersTasks) {
    let answer = finalResponse(await readText(upstream.body, MAX_BODY_BYTES))
    if (answer === null) throw new GW_ERR_BACKEND_UNAVAILABLE(server, `no readable answer to ${message.method}`)
    if ('result' in answer && isRecord(answer.result)) {
      const result = answer.result
      answer = { ...answer, result: policy !== null ? filterToolsList(result, policy) : { ...result, capabilities: withTasksExtension(isRecord(result.capabilities) ? result.capabilities : {}) } }
    }
    reply.code(upstream.statusCode).type('application/json').send(answer)
    return
  }
  reply.hijack()
  const sse = contentType.includes('text/event-stream')
  res.writeHead(upstream.statusCode, { ...replyHeaders(reply), 'content-type': contentType, ...(sse ? { 'cache-control': 'no-cache, no-transform', 'x-accel-buffering': 'no' } : {}) })
  upstream.body.on('error', () => { res.destroy() })
  upstream.body.pipe(res)
}
