// OpenTelemetry tracing, optional (docs/operating.md, Tracing; docs/architecture.md).
// `tracing` is null unless `tracing.otlpEndpoint` is configured, so the hot path pays one null
// check per message and the SDK is never loaded: every OpenTelemetry package is a dynamic import()
// below, and the types are `import type` only (erased). When enabled, startTracing() replaces the
// null with the real thing.
//
// Spans follow the OpenTelemetry MCP semantic conventions (gen-ai/mcp.md):
// - SERVER span per client JSON-RPC request, on the replica that received it, named
//   `{mcp.method.name} {target}` (target: the tool or prompt name; never the resource URI, which
//   the conventions keep out of span names by default). It ends when this replica writes the
//   answer to the client, or when the client stream ends first (error.type = why).
// - CLIENT span toward the backend, on the owner replica, child of the SERVER span (the context
//   crosses replicas in the bus envelope). Its traceparent goes in the backend request's
//   params._meta (SEP-414), so the backend's own spans join the trace.
// - The client's context is read from params._meta.traceparent/tracestate first (it names the
//   message), else from the HTTP traceparent/tracestate headers (they name the whole POST).
import type * as Api from '@opentelemetry/api'
import type { BasicTracerProvider } from '@opentelemetry/sdk-trace-base'
import type { Logger } from 'pino'
import type { IncomingHttpHeaders } from 'node:http'
import type { JsonRpcMessage, JsonRpcRequest, JsonRpcResponse } from '../core/jsonrpc.js'
import { shortHash } from './logger.js'
import { idKey, isRecord } from '../core/jsonrpc.js'
import type { TraceCarrier } from '../core/trace-context.js'

export type { TraceCarrier } from '../core/trace-context.js'

/** The `tracing` config block (schema.ts). */
export interface TracingConfig {
  otlpEndpoint: string
  sampleRatio: number
  serviceName: string
}

/** Where a client request came in (SERVER span). */
export interface ServerRequestInfo {
  sid: string
  /** The client stream its answer is written to. */
  streamId: string
  server: string
  protocolVersion: string
  headers: IncomingHttpHeaders | undefined
  /** Whether this replica writes that stream; if not, the span ends once the request is handed on. */
  writesAnswer: boolean
}

/** Where a request goes to the backend (CLIENT span). */
export interface BackendRequestInfo {
  sid: string
  server: string
  backendTransport: 'stdio' | 'streamable-http' | 'sse'
}

/** A CLIENT span in flight: ended with the backend's answer, or why there was none. */
export interface ClientSpan {
  end: (outcome: JsonRpcResponse | string) => void
}

export interface Tracing {
  /** Starts the SERVER span of a client request (nothing for other messages); its context for the next hop. */
  serverRequest: (message: JsonRpcMessage, info: ServerRequestInfo) => TraceCarrier | undefined
  /** An answer was written to a client stream: ends the SERVER span waiting for it. */
  responded: (sid: string, streamId: string, response: JsonRpcResponse) => void
  /** A client stream ended: SERVER spans still waiting on it end with the reason. */
  streamEnded: (sid: string, streamId: string, reason: string) => void
  /** Starts the CLIENT span of a request to the backend; returns the request carrying its traceparent. */
  backendRequest: (request: JsonRpcRequest, parent: TraceCarrier | undefined, info: BackendRequestInfo) => { request: JsonRpcRequest, span: ClientSpan }
  shutdown: () => Promise<void>
}

/** The facade: null while tracing is off (the default). */
export let tracing: Tracing | null = null

/** Loads the OpenTelemetry SDK and switches tracing on for this process. */
export async function startTracing (config: TracingConfig, replicaId: string, log: Logger): Promise<Tracing> {
  const [api, core, sdk, resources, otlp, semconv] = await Promise.all([
    import('@opentelemetry/api'),
    import('@opentelemetry/core'),
    import('@opentelemetry/sdk-trace-base'),
    import('@opentelemetry/resources'),
    import('@opentelemetry/exporter-trace-otlp-http'),
    import('@opentelemetry/semantic-conventions')
  ])
  // Export failures (collector down) surface as warnings instead of vanishing.
  const diagLog = log.child({ component: 'tracing' })
  api.diag.setLogger({
    error: (message: string) => { diagLog.warn(message) },
    warn: (message: string) => { diagLog.warn(message) },
    info: () => {},
    debug: () => {},
    verbose: () => {}
  }, api.DiagLogLevel.WARN)
  const provider = new sdk.BasicTracerProvider({
    resource: resources.resourceFromAttributes({
      [semconv.ATTR_SERVICE_NAME]: config.serviceName,
      'service.instance.id': replicaId
    }),
    sampler: new sdk.ParentBasedSampler({ root: new sdk.TraceIdRatioBasedSampler(config.sampleRatio) }),
    spanProcessors: [new sdk.BatchSpanProcessor(new otlp.OTLPTraceExporter({ url: tracesUrl(config.otlpEndpoint) }))]
  })
  const impl = new OtelTracing(api, new core.W3CTraceContextPropagator(), provider)
  tracing = impl
  // Only the origin: a URL may carry credentials or tokens.
  log.info({ collector: new URL(config.otlpEndpoint).origin, sampleRatio: config.sampleRatio }, 'tracing on')
  return impl
}

/** Flushes what is buffered and switches tracing off (gateway close). */
export async function stopTracing (): Promise<void> {
  const current = tracing
  tracing = null
  await current?.shutdown()
}

/** The OTLP/HTTP traces URL: the endpoint as given when it names /v1/traces, else that path appended. */
export function tracesUrl (endpoint: string): string {
  const trimmed = endpoint.replace(/\/+$/, '')
  return trimmed.endsWith('/v1/traces') ? trimmed : `${trimmed}/v1/traces`
}

// ---- the implementation (only built once the SDK is loaded) ---------------------------------

type ApiModule = typeof Api

/** Longest method, tool or prompt name put in a span name and attribute (client input). */
const MAX_NAME = 128
/** Server-side JSON-RPC codes that mean "the caller asked for something it cannot have", not a failure. */
const CALLER_CODES = new Set([-32700, -32600, -32601, -32602, -32002])

const streamKey = (sid: string, streamId: string): string => `${sid}\n${streamId}`

class OtelTracing implements Tracing {
  readonly #api: ApiModule
  readonly #propagator: Api.TextMapPropagator
  readonly #provider: BasicTracerProvider
  readonly #tracer: Api.Tracer
  /** SERVER spans waiting for their answer: by client stream, then by client request id. */
  readonly #pending = new Map<string, Map<string, Api.Span>>()

  constructor (api: ApiModule, propagator: Api.TextMapPropagator, provider: BasicTracerProvider) {
    this.#api = api
    this.#propagator = propagator
    this.#provider = provider
    this.#tracer = provider.getTracer('mcp-gateway')
  }

  serverRequest (message: JsonRpcMessage, info: ServerRequestInfo): TraceCarrier | undefined {
    if (!('id' in message) || !('method' in message)) return undefined
    const request = message
    const meta = metaOf(request)
    const carrier: Record<string, unknown> = typeof meta?.traceparent === 'string' ? meta : (info.headers ?? {})
    const span = this.#start(this.#api.SpanKind.SERVER, request, carrier, info.sid, info.server, {
      'mcp.protocol.version': info.protocolVersion,
      'network.transport': 'tcp',
      'network.protocol.name': 'http'
    })
    const out = this.#carrierOf(span)
    if (!info.writesAnswer) {
      span.end()
      return out
    }
    const key = streamKey(info.sid, info.streamId)
    const waiting = this.#pending.get(key) ?? new Map<string, Api.Span>()
    this.#pending.set(key, waiting)
    // A client reusing an id on the same stream: the earlier span ends rather than leaks.
    waiting.get(idKey(request.id))?.end()
    waiting.set(idKey(request.id), span)
    return out
  }

  responded (sid: string, streamId: string, response: JsonRpcResponse): void {
    const id = response.id
    if (id === undefined || id === null) return
    const key = streamKey(sid, streamId)
    const waiting = this.#pending.get(key)
    const span = waiting?.get(idKey(id))
    if (waiting === undefined || span === undefined) return
    waiting.delete(idKey(id))
    if (waiting.size === 0) this.#pending.delete(key)
    this.#finish(span, response, CALLER_CODES)
  }

  streamEnded (sid: string, streamId: string, reason: string): void {
    const key = streamKey(sid, streamId)
    const waiting = this.#pending.get(key)
    if (waiting === undefined) return
    this.#pending.delete(key)
    for (const span of waiting.values()) this.#finish(span, reason === 'complete' ? 'no answer' : reason, CALLER_CODES)
  }

  backendRequest (request: JsonRpcRequest, parent: TraceCarrier | undefined, info: BackendRequestInfo): { request: JsonRpcRequest, span: ClientSpan } {
    const span = this.#start(this.#api.SpanKind.CLIENT, request, parent, info.sid, info.server, info.backendTransport === 'stdio'
      ? { 'network.transport': 'pipe' }
      : { 'network.transport': 'tcp', 'network.protocol.name': 'http' })
    const handle: ClientSpan = { end: outcome => { this.#finish(span, outcome, null) } }
    const params = request.params
    // Positional params cannot carry _meta; MCP requests never use them.
    if (Array.isArray(params)) return { request, span: handle }
    // The client's traceparent named our SERVER span's parent; the backend gets our CLIENT span.
    const otherMeta = { ...(isRecord(params?._meta) ? params._meta : {}) }
    delete otherMeta.traceparent
    delete otherMeta.tracestate
    return { request: { ...request, params: { ...params, _meta: { ...otherMeta, ...this.#carrierOf(span) } } }, span: handle }
  }

  /** A span for one request, its parent read from `carrier` (W3C traceparent/tracestate keys). */
  #start (kind: Api.SpanKind, request: JsonRpcRequest, carrier: object | undefined, sid: string, server: string, extra: Api.Attributes): Api.Span {
    const api = this.#api
    const parent = carrier === undefined ? api.ROOT_CONTEXT : this.#propagator.extract(api.ROOT_CONTEXT, carrier, api.defaultTextMapGetter)
    const { name, attributes } = describe(request)
    return this.#tracer.startSpan(name, {
      kind,
      attributes: {
        ...attributes,
        'jsonrpc.request.id': String(request.id),
        // Session ids are bearer-like: the short hash the logs carry, never the id.
        'mcp.session.id': shortHash(sid),
        'mcp_gateway.server': server,
        ...extra
      }
    }, parent)
  }

  async shutdown (): Promise<void> {
    for (const waiting of this.#pending.values()) for (const span of waiting.values()) span.end()
    this.#pending.clear()
    await this.#provider.shutdown()
    this.#api.diag.disable()
  }

  #carrierOf (span: Api.Span): TraceCarrier {
    const out: Record<string, string> = {}
    this.#propagator.inject(this.#api.trace.setSpan(this.#api.ROOT_CONTEXT, span), out, this.#api.defaultTextMapSetter)
    return out.tracestate === undefined ? { traceparent: out.traceparent ?? '' } : { traceparent: out.traceparent ?? '', tracestate: out.tracestate }
  }

  /**
   * Ends a span with its outcome: a JSON-RPC error sets rpc.response.status_code, and error.type
   * when the code counts as a failure (every code for CLIENT spans; SERVER spans exempt the
   * caller's mistakes); a tool result with isError sets error.type tool_error; a string says why
   * no answer came (timeout, client-closed, ...).
   */
  #finish (span: Api.Span, outcome: JsonRpcResponse | string, exempt: Set<number> | null): void {
    const ERROR = this.#api.SpanStatusCode.ERROR
    if (typeof outcome === 'string') {
      span.setAttribute('error.type', outcome)
      span.setStatus({ code: ERROR, message: outcome })
    } else if ('error' in outcome) {
      const code = outcome.error.code
      span.setAttribute('rpc.response.status_code', String(code))
      if (exempt === null || !exempt.has(code)) {
        span.setAttribute('error.type', String(code))
        span.setStatus({ code: ERROR, message: outcome.error.message })
      }
    } else if (isRecord(outcome.result) && outcome.result.isError === true) {
      span.setAttribute('error.type', 'tool_error')
      span.setStatus({ code: ERROR })
    }
    span.end()
  }
}

/** Span name and method attributes of a request (semconv: `{mcp.method.name} {target}`). */
function describe (request: JsonRpcRequest): { name: string, attributes: Api.Attributes } {
  // The method is client input too: bounded like the names (an unknown one is answered -32601).
  const method = request.method.slice(0, MAX_NAME)
  const params = isRecord(request.params) ? request.params : {}
  const attributes: Api.Attributes = { 'mcp.method.name': method }
  let target: string | undefined
  if (method === 'tools/call' && typeof params.name === 'string') {
    target = params.name.slice(0, MAX_NAME)
    attributes['gen_ai.tool.name'] = target
    attributes['gen_ai.operation.name'] = 'execute_tool'
  } else if (method === 'prompts/get' && typeof params.name === 'string') {
    target = params.name.slice(0, MAX_NAME)
    attributes['gen_ai.prompt.name'] = target
  } else if (method.startsWith('resources/') && typeof params.uri === 'string') {
    attributes['mcp.resource.uri'] = params.uri
  }
  return { name: target === undefined ? method : `${method} ${target}`, attributes }
}

function metaOf (request: JsonRpcRequest): Record<string, unknown> | undefined {
  const params = request.params
  return isRecord(params) && isRecord(params._meta) ? params._meta : undefined
}

