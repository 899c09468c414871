// The merged lists of an aggregate server and the routing they give: which member serves an
// exposed tool or prompt name, a resource URI, a template (docs/behaviour.md, "Aggregating
// servers"). Shared by aggregate sessions (relay.ts, lists fetched over the session's member links)
// and 2026-07-28 requests to an aggregate (stateless.ts, lists fetched over the members' pools):
// `fetch` says how.
import type { Logger } from 'pino'
import { filterToolsListOf, type ToolPolicy } from '../../auth/tool-policy.js'
import { GW_ERR_BACKEND_TIMEOUT, isGatewayError } from '../../core/errors.js'
import { isRecord } from '../../core/jsonrpc.js'
import type { GatewayMetrics } from '../../telemetry/metrics.js'
import { exposeNames, templateMatches, type Exposed } from './names.js'
import type { BackendInfo } from '../upstream/pool.js'

/** Entries of a merged list per page (the cursor is the gateway's). */
export const AGGREGATE_PAGE_SIZE = 100
/** Pages of one member's list read for a merged list, at most. */
const MAX_MEMBER_PAGES = 50
/** `_meta` key naming the member an entry comes from. */
export const META_MEMBER = 'io.mcp-gateway/member'
/** MCP Apps (`io.modelcontextprotocol/ui`): the scheme of a server's UI resources, and the older flat key of a tool's one. */
const UI_SCHEME = 'ui://'
const FLAT_UI_RESOURCE = 'ui/resourceUri'

/** Whether an MCP App may call a tool: it has UI metadata and its visibility (default both) includes "app". */
function isAppCallable (tool: Record<string, unknown>): boolean {
  const meta = isRecord(tool._meta) ? tool._meta : {}
  if (!isRecord(meta.ui) && typeof meta[FLAT_UI_RESOURCE] !== 'string') return false
  const visibility = isRecord(meta.ui) ? meta.ui.visibility : undefined
  return !Array.isArray(visibility) || visibility.includes('app')
}

export type ListKind = 'tools' | 'prompts' | 'resources' | 'resourceTemplates'
export const LIST_METHOD: Record<ListKind, string> = {
  tools: 'tools/list',
  prompts: 'prompts/list',
  resources: 'resources/list',
  resourceTemplates: 'resources/templates/list'
}
const KIND_CAPABILITY: Record<ListKind, string> = { tools: 'tools', prompts: 'prompts', resources: 'resources', resourceTemplates: 'resources' }
export const ALL_KINDS: ListKind[] = ['tools', 'prompts', 'resources', 'resourceTemplates']

/** What the catalogue needs of a member. */
export interface CatalogueMember {
  server: string
  prefix: string
  /** The member's own tool filter (members[].tools). */
  tools: ToolPolicy | undefined
  /** Why it is out of lists, while it is; null when up. */
  down: string | null
  /** What it said of itself when initialised (its capabilities say which lists it has). */
  info: { capabilities: Record<string, unknown> } | null
}

export interface CatalogueOptions<M extends CatalogueMember> {
  aggregate: string
  separator: string
  memberTimeoutMs: number
  members: readonly M[]
  /** One request to a member; its result, or throws. */
  fetch: (member: M, method: string, params: Record<string, unknown>) => Promise<Record<string, unknown>>
  /** The tenant's tool policy on the aggregate (exposed names), if any. */
  toolPolicy: () => ToolPolicy | null
  log: Logger
  metrics: GatewayMetrics
}

type Entry<M> = Exposed<Record<string, unknown>> & { member: M }

export class AggregateCatalogue<M extends CatalogueMember> {
  readonly #options: CatalogueOptions<M>
  /** The last merged lists (made again on a list, or when a name or URI is not in them). */
  readonly #lists = new Map<ListKind, Array<Entry<M>>>()

  constructor (options: CatalogueOptions<M>) {
    this.#options = options
  }

  /** One page of a merged list; null for a cursor the gateway did not make for this list. */
  async page (kind: ListKind, cursor: unknown): Promise<Record<string, unknown> | null> {
    let offset = 0
    if (cursor !== undefined) {
      const decoded = decodeCursor(cursor, kind)
      if (decoded === null) return null
      offset = decoded
    }
    const all = offset === 0 || !this.#lists.has(kind) ? await this.#merge(kind) : this.#lists.get(kind) ?? []
    const slice = all.slice(offset, offset + AGGREGATE_PAGE_SIZE)
    let items: unknown = slice.map(e => {
      if (kind === 'tools' || kind === 'prompts') {
        const meta = { ...(isRecord(e.entry._meta) ? e.entry._meta : {}), [META_MEMBER]: e.server }
        return { ...e.entry, name: e.exposed, _meta: kind === 'tools' ? this.#exposeToolUi(e.member, meta) : meta }
      }
      return kind === 'resources' ? { ...e.entry, uri: e.exposed } : { ...e.entry, uriTemplate: e.exposed }
    })
    if (kind === 'tools') items = (filterToolsListOf('tools/list', { tools: items }, this.#options.toolPolicy()) as { tools: unknown[] }).tools
    const next = offset + AGGREGATE_PAGE_SIZE < all.length ? { nextCursor: encodeCursor(kind, offset + AGGREGATE_PAGE_SIZE) } : {}
    return { [kind]: items, ...next }
  }

  /** The member and its own name behind an exposed tool or prompt name; null when none has it. */
  async byName (kind: 'tools' | 'prompts', exposed: string): Promise<{ member: M, name: string } | null> {
    const find = (): { member: M, name: string } | null => {
      const hit = this.#lists.get(kind)?.find(e => e.exposed === exposed)
      return hit === undefined ? null : { member: hit.member, name: hit.name }
    }
    const cached = find()
    if (cached !== null) return cached
    await this.#merge(kind)
    return find() ?? this.#unlisted(kind, exposed)
  }

  /**
   * A name no member listed: a server may serve names it does not list (some only to clients that
   * declared an extension). Its prefix says the member; else, for a tool, the one member that
   * lists an app-callable tool by that own name (an MCP App calls its server's tools by their own
   * names: the app's code cannot know the aggregate's); else the first member whose names pass
   * through unchanged (`prefix: ""`) gets it. A member's own tool filter still applies.
   */
  #unlisted (kind: 'tools' | 'prompts', exposed: string): { member: M, name: string } | null {
    const { members } = this.#options
    const byPrefix = this.#prefixed(exposed, '')
    const hit = byPrefix !== null
      ? { member: byPrefix.member, name: byPrefix.rest }
      : (kind === 'tools' ? this.#appCallable(exposed) : null) ??
        (() => { const m = members.find(m => m.prefix === ''); return m === undefined ? null : { member: m, name: exposed } })()
    if (hit === null || (kind === 'tools' && hit.member.tools !== undefined && !hit.member.tools.allows(hit.name))) return null
    return hit
  }

  /** The member whose prefix (and separator) starts `text` after `scheme`, and the rest. */
  #prefixed (text: string, scheme: string): { member: M, rest: string } | null {
    const { members, separator } = this.#options
    if (!text.startsWith(scheme)) return null
    const body = text.slice(scheme.length)
    const member = members.find(m => m.prefix !== '' && body.startsWith(`${m.prefix}${separator}`) && body.length > m.prefix.length + separator.length)
    return member === undefined ? null : { member, rest: body.slice(member.prefix.length + separator.length) }
  }

  /** The one member listing a tool whose own name is `name` and that an app may call; null if none or several. */
  #appCallable (name: string): { member: M, name: string } | null {
    const owners = new Set((this.#lists.get('tools') ?? []).filter(e => e.name === name && isAppCallable(e.entry)).map(e => e.member))
    if (owners.size > 1) this.#options.log.warn({ tool: name, members: [...owners].map(m => m.server) }, 'aggregate: an app called a tool by its own name, which several members have: refused')
    const [only] = owners
    return owners.size === 1 && only !== undefined ? { member: only, name } : null
  }

  /**
   * The member serving a URI, and the URI it knows: the first that listed it, else the first whose
   * template matches it, else (MCP Apps: a server may leave its `ui://` resources out of its lists)
   * the member whose prefix the `ui://` URI carries (`uiUri`).
   */
  async byUri (uri: string): Promise<{ member: M, uri: string } | null> {
    const find = (): { member: M, uri: string } | null => {
      const listed = this.#lists.get('resources')?.find(e => e.exposed === uri)
      if (listed !== undefined) return { member: listed.member, uri: listed.name }
      const templated = this.#lists.get('resourceTemplates')?.find(e => templateMatches(e.exposed, uri))
      return templated === undefined ? null : { member: templated.member, uri: this.#ownUri(templated.member, uri) }
    }
    let hit = find()
    if (hit !== null) return hit
    await Promise.all([this.#merge('resources'), this.#merge('resourceTemplates')])
    hit = find()
    if (hit !== null) return hit
    const ui = this.#prefixed(uri, UI_SCHEME)
    if (ui !== null) return { member: ui.member, uri: `${UI_SCHEME}${ui.rest}` }
    // Listed nowhere (a server may serve URIs it does not list): a ui:// URI with no member's
    // prefix is a `prefix: ""` member's; else the only member with resources, if one.
    const withResources = this.#options.members.filter(m => m.down === null && m.info?.capabilities.resources !== undefined)
    const unprefixed = uri.startsWith(UI_SCHEME) ? withResources.find(m => m.prefix === '') : undefined
    const only = unprefixed ?? (withResources.length === 1 ? withResources[0] : undefined)
    return only === undefined ? null : { member: only, uri }
  }

  /** A member's `ui://` URI as the aggregate shows it: `ui://<prefix><separator><rest>`; others as they are. */
  uiUri (member: M, uri: string): string {
    return member.prefix === '' || !uri.startsWith(UI_SCHEME) ? uri : `${UI_SCHEME}${member.prefix}${this.#options.separator}${uri.slice(UI_SCHEME.length)}`
  }

  /** The member's own URI behind an exposed one (the inverse of uiUri). */
  #ownUri (member: M, uri: string): string {
    const head = `${UI_SCHEME}${member.prefix}${this.#options.separator}`
    return member.prefix !== '' && uri.startsWith(head) ? `${UI_SCHEME}${uri.slice(head.length)}` : uri
  }

  /** A member's resources/read result with its `ui://` URIs as the aggregate shows them. */
  exposeReadResult (member: M, result: Record<string, unknown>): Record<string, unknown> {
    if (member.prefix === '' || !Array.isArray(result.contents)) return result
    return { ...result, contents: result.contents.map(c => isRecord(c) && typeof c.uri === 'string' ? { ...c, uri: this.uiUri(member, c.uri) } : c) }
  }

  /** A tool's `_meta` with its UI resource (`ui.resourceUri`, and the older flat `ui/resourceUri`) made the aggregate's. */
  #exposeToolUi (member: M, meta: Record<string, unknown>): Record<string, unknown> {
    if (member.prefix === '') return meta
    const out = { ...meta }
    if (isRecord(meta.ui) && typeof meta.ui.resourceUri === 'string') out.ui = { ...meta.ui, resourceUri: this.uiUri(member, meta.ui.resourceUri) }
    if (typeof meta[FLAT_UI_RESOURCE] === 'string') out[FLAT_UI_RESOURCE] = this.uiUri(member, meta[FLAT_UI_RESOURCE])
    return out
  }

  invalidate (kinds: readonly ListKind[] = ALL_KINDS): void {
    for (const kind of kinds) this.#lists.delete(kind)
  }

  /** Every up member's whole list, merged under exposed names. */
  async #merge (kind: ListKind): Promise<Array<Entry<M>>> {
    const { members, memberTimeoutMs, aggregate, log, metrics } = this.#options
    const lists = await Promise.all(members.map(async m => {
      if (m.down !== null || m.info === null || m.info.capabilities[KIND_CAPABILITY[kind]] === undefined) return { member: m, entries: [] as Array<Record<string, unknown>> }
      try {
        const entries = await withTimeout(this.#listAll(m, kind), memberTimeoutMs, () => new GW_ERR_BACKEND_TIMEOUT(m.server, memberTimeoutMs))
        return { member: m, entries }
      } catch (err) {
        log.warn({ member: m.server, list: kind, reason: err instanceof Error ? err.message : String(err) }, 'aggregate member left out of a list (slow or failing)')
        metrics.aggregateMemberLeftOut(aggregate, m.server, isGatewayError(err) && err.code === 'GW_ERR_BACKEND_TIMEOUT' ? 'slow' : 'error')
        return { member: m, entries: [] as Array<Record<string, unknown>> }
      }
    }))
    let merged: Array<Entry<M>>
    if (kind === 'tools' || kind === 'prompts') {
      const named = lists.map(l => ({
        server: l.member.server,
        prefix: l.member.prefix,
        entries: l.entries.filter((e): e is Record<string, unknown> & { name: string } => typeof e.name === 'string' && (kind !== 'tools' || l.member.tools === undefined || l.member.tools.allows(e.name)))
      }))
      const exposed = exposeNames(named, this.#options.separator, (e, plain) => {
        log.warn({ [kind === 'tools' ? 'tool' : 'prompt']: plain, member: e.server, exposedAs: e.exposed }, 'aggregate name collision: the later member\'s entry is exposed under another name')
      })
      const byServer = new Map(members.map(m => [m.server, m]))
      merged = exposed.map(e => ({ ...e, member: byServer.get(e.server) as M }))
    } else {
      // Resources keep their URIs (templates their uriTemplate): the first member to list one serves it.
      const key = kind === 'resources' ? 'uri' : 'uriTemplate'
      const seen = new Set<string>()
      merged = []
      for (const l of lists) {
        for (const entry of l.entries) {
          const own = entry[key]
          if (typeof own !== 'string') continue
          const id = this.uiUri(l.member, own)
          if (seen.has(id)) continue
          seen.add(id)
          merged.push({ exposed: id, server: l.member.server, name: own, entry, member: l.member })
        }
      }
    }
    this.#lists.set(kind, merged)
    return merged
  }

  /** A member's whole list (every page). */
  async #listAll (member: M, kind: ListKind): Promise<Array<Record<string, unknown>>> {
    const out: Array<Record<string, unknown>> = []
    let cursor: string | undefined
    for (let page = 0; page < MAX_MEMBER_PAGES; page++) {
      const result = await this.#options.fetch(member, LIST_METHOD[kind], cursor !== undefined ? { cursor } : {})
      const items = result[kind]
      if (Array.isArray(items)) for (const item of items) if (isRecord(item)) out.push(item)
      if (typeof result.nextCursor !== 'string' || result.nextCursor === '') break
      cursor = result.nextCursor
    }
    return out
  }
}

function encodeCursor (kind: ListKind, offset: number): string {
  return Buffer.from(JSON.stringify({ k: kind, o: offset })).toString('base64url')
}

function decodeCursor (cursor: unknown, kind: ListKind): number | null {
  if (typeof cursor !== 'string' || cursor.length > 200) return null
  try {
    const value: unknown = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'))
    if (!isRecord(value) || value.k !== kind || typeof value.o !== 'number' || !Number.isInteger(value.o) || value.o < 0) return null
    return value.o
  } catch {
    return null
  }
}

export async function withTimeout<T> (work: Promise<T>, ms: number, error: () => Error): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  try {
    return await Promise.race([work, new Promise<never>((_resolve, reject) => { timer = setTimeout(() => { reject(error()) }, ms); timer.unref() })])
  } finally {
    clearTimeout(timer)
  }
}

/**
 * What an aggregate says of itself (initialize, server/discover): its members' capabilities united
 * (tools always, with listChanged: lists change whenever a member goes or comes back), its own
 * serverInfo, and the members' instructions each under a heading with its name.
 */
export function unitedInfo (aggregate: string, members: ReadonlyArray<{ server: string, info: BackendInfo | null }>, protocolVersion: string): BackendInfo {
  const up = members.filter((m): m is { server: string, info: BackendInfo } => m.info !== null)
  const has = (capability: string): boolean => up.some(m => m.info.capabilities[capability] !== undefined)
  const capabilities: Record<string, unknown> = { tools: { listChanged: true } }
  if (has('prompts')) capabilities.prompts = { listChanged: true }
  if (has('resources')) {
    const subscribe = up.some(m => isRecord(m.info.capabilities.resources) && m.info.capabilities.resources.subscribe === true)
    capabilities.resources = { listChanged: true, ...(subscribe ? { subscribe: true } : {}) }
  }
  if (has('logging')) capabilities.logging = {}
  if (has('completions')) capabilities.completions = {}
  const instructions = up.filter(m => typeof m.info.instructions === 'string' && m.info.instructions !== '')
    .map(m => `## ${m.server}\n\n${m.info.instructions ?? ''}`).join('\n\n')
  return {
    protocolVersion,
    capabilities,
    serverInfo: { name: aggregate, version: '0.1.0' },
    ...(instructions !== '' ? { instructions } : {})
  }
}
