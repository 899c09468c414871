// A small OTLP/HTTP trace receiver for tests: a real node:http server accepting the JSON encoding
// (what @opentelemetry/exporter-trace-otlp-http sends) on /v1/traces, keeping every span.
import { once } from 'node:events'
import { createServer, type IncomingMessage } from 'node:http'
import type { Test } from 'tap'

export interface ReceivedSpan {
  traceId: string
  spanId: string
  parentSpanId: string
  name: string
  /** OTLP SpanKind: 2 SERVER, 3 CLIENT. */
  kind: number
  attributes: Record<string, string | number | boolean>
  /** OTLP status code: 0 unset, 1 ok, 2 error. */
  status: number
  /** service.instance.id of the resource (the replica). */
  instance: string
  /** service.name of the resource. */
  service: string
}

export const SERVER = 2
export const CLIENT = 3

export interface OtlpReceiver {
  /** The endpoint to configure (tracing.otlpEndpoint). */
  url: string
  spans: ReceivedSpan[]
  /** Paths and content types of the export requests. */
  requests: Array<{ path: string, contentType: string }>
}

interface OtlpValue { stringValue?: string, intValue?: string | number, boolValue?: boolean, doubleValue?: number }
interface OtlpKeyValue { key: string, value: OtlpValue }
interface OtlpSpan { traceId: string, spanId: string, parentSpanId?: string, name: string, kind: number, attributes?: OtlpKeyValue[], status?: { code?: number } }
interface OtlpExport { resourceSpans?: Array<{ resource?: { attributes?: OtlpKeyValue[] }, scopeSpans?: Array<{ spans?: OtlpSpan[] }> }> }

function valueOf (value: OtlpValue): string | number | boolean {
  if (value.stringValue !== undefined) return value.stringValue
  if (value.boolValue !== undefined) return value.boolValue
  if (value.intValue !== undefined) return Number(value.intValue)
  return value.doubleValue ?? ''
}

const attributesOf = (list: OtlpKeyValue[] | undefined): Record<string, string | number | boolean> =>
  Object.fromEntries((list ?? []).map(kv => [kv.key, valueOf(kv.value)]))

async function bodyOf (req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of req) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks).toString('utf8')
}

export async function startOtlpReceiver (t: Test): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = []
  const requests: OtlpReceiver['requests'] = []
  const server = createServer((req, res) => {
    bodyOf(req).then(body => {
      requests.push({ path: req.url ?? '', contentType: String(req.headers['content-type']) })
      const data = JSON.parse(body) as OtlpExport
      for (const rs of data.resourceSpans ?? []) {
        const resource = attributesOf(rs.resource?.attributes)
        for (const ss of rs.scopeSpans ?? []) {
          for (const span of ss.spans ?? []) {
            spans.push({
              traceId: span.traceId,
              spanId: span.spanId,
              parentSpanId: span.parentSpanId ?? '',
              name: span.name,
              kind: span.kind,
              attributes: attributesOf(span.attributes),
              status: span.status?.code ?? 0,
              instance: String(resource['service.instance.id'] ?? ''),
              service: String(resource['service.name'] ?? '')
            })
          }
        }
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
    }, () => { res.writeHead(400).end() })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const address = server.address()
  if (address === null || typeof address === 'string') throw new Error('no address')
  t.teardown(async () => { server.closeAllConnections(); server.close() })
  return { url: `http://127.0.0.1:${address.port}`, spans, requests }
}
