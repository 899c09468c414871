// Raw 2026-07-28 requests for tests: one POST with the standard headers and the `_meta` envelope,
// its whole answer read (one JSON body, or every SSE event).
import { createParser } from 'eventsource-parser'

export const MODERN_VERSION = '2026-07-28'

/** A request's `_meta` envelope: the version, these capabilities, a client info, and `extra` keys. */
export const envelope = (capabilities: Record<string, unknown> = {}, extra: Record<string, unknown> = {}): Record<string, unknown> => ({
  'io.modelcontextprotocol/protocolVersion': MODERN_VERSION,
  'io.modelcontextprotocol/clientCapabilities': capabilities,
  'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' },
  ...extra
})

export interface Answer {
  status: number
  headers: Headers
  contentType: string
  /** Every JSON-RPC message of the body (one for JSON, each event for SSE). */
  messages: Array<Record<string, unknown>>
}

/** POSTs one modern request (Mcp-Name from params.name, params.uri or params.taskId); the response, unread. */
export async function modernFetch (url: string, method: string, params: Record<string, unknown>, id: number | string = 1, headers: Record<string, string> = {}, signal?: AbortSignal): Promise<Response> {
  const name = [params.name, params.uri, params.taskId].find((v): v is string => typeof v === 'string')
  return await fetch(url, {
    method: 'POST',
    ...(signal !== undefined ? { signal } : {}),
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-protocol-version': MODERN_VERSION,
      'mcp-method': method,
      ...(name !== undefined ? { 'mcp-name': name } : {}),
      ...headers
    },
    body: JSON.stringify({ jsonrpc: '2.0', id, method, params })
  })
}

/** POSTs one modern request (see modernFetch) and reads the whole answer. */
export async function modernPost (url: string, method: string, params: Record<string, unknown>, id: number | string = 1, headers: Record<string, string> = {}, signal?: AbortSignal): Promise<Answer> {
  const res = await modernFetch(url, method, params, id, headers, signal)
  const contentType = res.headers.get('content-type') ?? ''
  const text = await res.text()
  const messages: Array<Record<string, unknown>> = []
  if (contentType.includes('text/event-stream')) {
    const parser = createParser({ onEvent: e => { if (e.data !== '') messages.push(JSON.parse(e.data) as Record<string, unknown>) } })
    parser.feed(text)
  } else if (text !== '') {
    messages.push(JSON.parse(text) as Record<string, unknown>)
  }
  return { status: res.status, headers: res.headers, contentType, messages }
}

/** The last message of an answer (its response). */
export const last = (a: Answer): Record<string, unknown> => a.messages[a.messages.length - 1] ?? {}
export const resultOf = (a: Answer): Record<string, unknown> => last(a).result as Record<string, unknown>

/** Reads an SSE answer as it comes (a listen stream): its messages so far, and the reading's end. */
export function readEvents (res: Response): { events: Array<Record<string, unknown>>, reading: Promise<void> } {
  const events: Array<Record<string, unknown>> = []
  const parser = createParser({ onEvent: e => { if (e.data !== '') events.push(JSON.parse(e.data) as Record<string, unknown>) } })
  const reading = (async () => {
    const decoder = new TextDecoder()
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) parser.feed(decoder.decode(chunk, { stream: true }))
  })().catch(() => {})
  return { events, reading }
}
