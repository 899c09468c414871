// What an aggregate does with a client's request: a page of a merged list it answers itself, the
// member that serves a name, URI or ref (with the request's params made that member's own), or an
// error. One decision for aggregate sessions (relay.ts) and 2026-07-28 requests (stateless.ts);
// it reads the catalogue and sends nothing: running the request is the caller's.
// docs/behaviour.md, "Aggregating servers", says how names, URIs and refs find their member.
import { JSONRPC_METHOD_NOT_FOUND, isRecord } from '../../core/jsonrpc.js'
import { LIST_METHOD, type AggregateCatalogue, type CatalogueMember, type ListKind } from './catalogue.js'

/** MCP's error for an unknown resource. */
const RESOURCE_NOT_FOUND = -32002
const INVALID_PARAMS = -32602

export type AggregateRoute<M> =
  /** A page of a merged list. */
  | { to: 'list', kind: ListKind, page: Record<string, unknown> }
  | {
    to: 'member'
    member: M
    /** The request's params under the member's own name, URI or ref. */
    params: Record<string, unknown>
    /** tools/call: the exposed name (the aggregate's metrics label). */
    tool: string | undefined
    /**
     * resources/read: its result's `ui://` URIs are to be shown as the aggregate's; `renamed` when
     * the member knows the resource under another URI than the one asked for (a prefixed `ui://`).
     */
    read: { renamed: boolean } | undefined
  }
  | { to: 'error', code: number, message: string }

export interface RouteOptions {
  /**
   * Whether resources/subscribe and unsubscribe are routed to their member: a session has them; a
   * 2026-07-28 request does not (a listen stream names its resources).
   */
  subscriptions: boolean
}

const LIST_KIND_OF = new Map((Object.keys(LIST_METHOD) as ListKind[]).map(kind => [LIST_METHOD[kind], kind]))

/** The route of a request (`method`, `params`) to the aggregate whose merged lists are `catalogue`. */
export async function routeRequest<M extends CatalogueMember> (
  catalogue: AggregateCatalogue<M>,
  method: string,
  params: Record<string, unknown>,
  options: RouteOptions
): Promise<AggregateRoute<M>> {
  const error = (code: number, message: string): AggregateRoute<M> => ({ to: 'error', code, message })
  const member = (m: M, own: Record<string, unknown>, tool?: string, read?: { renamed: boolean }): AggregateRoute<M> =>
    ({ to: 'member', member: m, params: own, tool, read })
  const kind = LIST_KIND_OF.get(method)
  if (kind !== undefined) {
    const page = await catalogue.page(kind, params.cursor)
    return page === null ? error(INVALID_PARAMS, 'Invalid params: unknown cursor') : { to: 'list', kind, page }
  }
  switch (method) {
    case 'tools/call':
    case 'prompts/get': {
      const name = params.name
      if (typeof name !== 'string') return error(INVALID_PARAMS, 'Invalid params: name must be a string')
      const tools = method === 'tools/call'
      const routed = await catalogue.byName(tools ? 'tools' : 'prompts', name)
      if (routed === null) return error(INVALID_PARAMS, tools ? `Unknown tool: ${name}` : `Unknown prompt: ${name}`)
      return member(routed.member, { ...params, name: routed.name }, tools ? name : undefined)
    }
    case 'resources/read':
    case 'resources/subscribe':
    case 'resources/unsubscribe': {
      // A subscription goes where a read of its URI would.
      if (method !== 'resources/read' && !options.subscriptions) break
      const uri = params.uri
      if (typeof uri !== 'string') return error(INVALID_PARAMS, 'Invalid params: uri must be a string')
      const routed = await catalogue.byUri(uri)
      if (routed === null) return error(RESOURCE_NOT_FOUND, `Resource not found: ${uri}`)
      return member(routed.member, { ...params, uri: routed.uri }, undefined, method === 'resources/read' ? { renamed: routed.uri !== uri } : undefined)
    }
    case 'completion/complete': {
      const ref = isRecord(params.ref) ? params.ref : {}
      if (ref.type === 'ref/prompt' && typeof ref.name === 'string') {
        const routed = await catalogue.byName('prompts', ref.name)
        return routed === null ? error(INVALID_PARAMS, `Unknown prompt: ${ref.name}`) : member(routed.member, { ...params, ref: { ...ref, name: routed.name } })
      }
      if (ref.type === 'ref/resource' && typeof ref.uri === 'string') {
        const routed = await catalogue.byUri(ref.uri)
        return routed === null ? error(RESOURCE_NOT_FOUND, `Resource not found: ${ref.uri}`) : member(routed.member, { ...params, ref: { ...ref, uri: routed.uri } })
      }
      return error(INVALID_PARAMS, 'Invalid params: ref must name a prompt or a resource')
    }
  }
  return error(JSONRPC_METHOD_NOT_FOUND, `Method not found: ${method}`)
}
