// A tools/call relayed to a 2026-07-28 backend that offers no tasks of its own, on a server whose
// calls the gateway hosts as tasks (config `tasks`; docs/behaviour.md "2026-07-28 Tasks"). The
// backend's answer is read whole (its notifications are not streamed: a call that may become a
// task has no stream to send them on) and handed to the host: the client gets it as it is when it
// comes within hostAfterMs, a task handle otherwise. Cancelling the task aborts the upstream
// request, which is this era's cancellation (M-11).
import type { FastifyReply } from 'fastify'
import { finalResponse, relayModern } from '../backends/modern-http.js'
import { MAX_BODY_BYTES, readText } from '../backends/http-io.js'
import type { HttpServerConfig } from '../config/schema.js'
import { GW_ERR_BACKEND_UNAVAILABLE, GW_ERR_INTERNAL, isGatewayError } from '../core/errors.js'
import { isRecord, type JsonRpcRequest } from '../core/jsonrpc.js'
import { META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_PROTOCOL_VERSION, MODERN_VERSION } from '../core/protocol-version.js'
import { ModernResponse } from './modern-response.js'
import { declaresTasks, TASKS_EXTENSION, type ModernTasks, type TaskCaller } from './modern-tasks.js'
import type { RequestEnvelope } from './modern-rules.js'
import { replyHeaders } from './request.js'

/** Whether each backend (by its config object: a reload makes a new one) offers the extension. */
const offers = new WeakMap<HttpServerConfig, Promise<boolean>>()

/** Whether a 2026-07-28 backend offers the Tasks extension (asked once with server/discover, kept). */
async function offersTasks (server: string, config: HttpServerConfig, headers: Record<string, string>): Promise<boolean> {
  let known = offers.get(config)
  if (known === undefined) {
    known = askOffersTasks(server, config, headers)
    offers.set(config, known)
    known.catch(() => { offers.delete(config) })
  }
  return await known
}

async function askOffersTasks (server: string, config: HttpServerConfig, headers: Record<string, string>): Promise<boolean> {
  const body = JSON.stringify({
    jsonrpc: '2.0',
    id: 'gw-tasks-probe',
    method: 'server/discover',
    params: { _meta: { [META_PROTOCOL_VERSION]: MODERN_VERSION, [META_CLIENT_CAPABILITIES]: {}, [META_CLIENT_INFO]: { name: 'mcp-gateway', version: '0.1.0' } } }
  })
  // The call's own routing headers (Mcp-Name, Mcp-Param-*) are not the probe's.
  const probe: Record<string, string> = { 'mcp-protocol-version': MODERN_VERSION, 'mcp-method': 'server/discover' }
  for (const [name, value] of Object.entries(headers)) if (!name.startsWith('mcp-')) probe[name] = value
  const res = await relayModern(server, config, probe, body, AbortSignal.timeout(config.connectTimeoutMs))
  const answer = finalResponse(await readText(res.body, MAX_BODY_BYTES))
  if (answer === null || !('result' in answer)) throw new GW_ERR_BACKEND_UNAVAILABLE(server, 'no readable answer to server/discover')
  const capabilities = isRecord(answer.result) && isRecord(answer.result.capabilities) ? answer.result.capabilities : {}
  return isRecord(capabilities.extensions) && isRecord(capabilities.extensions[TASKS_EXTENSION])
}

export interface HostedRelay {
  tasks: ModernTasks
  keepAliveMs: number
  server: string
  config: HttpServerConfig
  /** The headers the request goes upstream with. */
  headers: Record<string, string>
  message: JsonRpcRequest
  envelope: RequestEnvelope
  caller: TaskCaller & { principal: string }
}

/**
 * Relays the call through the task host when it may become a hosted task; false (nothing written)
 * when it may not: the server hosts no tasks, the client did not declare the extension, or the
 * backend offers tasks itself (its own are relayed as they are).
 */
export async function relayHostable (reply: FastifyReply, relay: HostedRelay): Promise<boolean> {
  const { tasks, server, config, headers, message, envelope } = relay
  if (message.method !== 'tools/call' || !tasks.hosts(server) || !declaresTasks(envelope)) return false
  if (await offersTasks(server, config, headers)) return false
  reply.hijack()
  const abort = new AbortController()
  const sink = tasks.host(new ModernResponse(reply.raw, replyHeaders(reply), relay.keepAliveMs), message, envelope, { ...relay.caller, server, resumable: false })
  sink.onClientGone = () => { abort.abort() }
  try {
    const upstream = await relayModern(server, config, headers, JSON.stringify(message), abort.signal)
    const answer = finalResponse(await readText(upstream.body, MAX_BODY_BYTES))
    if (answer === null) sink.fail(new GW_ERR_BACKEND_UNAVAILABLE(server, 'no readable answer to tools/call'), message.id)
    else sink.finish({ ...answer, id: message.id }, upstream.statusCode)
  } catch (err) {
    // Aborted: the client went away before a handle, or the task was cancelled.
    if (abort.signal.aborted) return true
    sink.fail(isGatewayError(err) ? err : new GW_ERR_INTERNAL('request not relayed', { cause: err }), message.id)
  }
  return true
}
