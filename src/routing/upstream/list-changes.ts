// A pool connection's `list_changed` reaches the sessions only when the list really changed: the
// list is read from that connection and a digest of it compared with the last list of the
// (server, tenant) the sessions could have seen (the first connection's, read as it opens). A
// server that registers tools after `initialized` (server-everything does) announces a change on
// every new child; forwarded as is, a burst that opens one child would make every session of the
// server list again.
import { createHash } from 'node:crypto'
import { isNotification, isRecord, type JsonRpcMessage, type JsonRpcResponse } from '../../core/jsonrpc.js'
import type { BackendInfo } from './gateway-relay.js'
import { LIST_KEY_PREFIX, type PoolConnection } from './pool-connection.js'

/** The list a `list_changed` notification is about, by its method. */
const LIST_OF: Readonly<Record<string, string>> = {
  'notifications/tools/list_changed': 'tools/list',
  'notifications/prompts/list_changed': 'prompts/list',
  'notifications/resources/list_changed': 'resources/list'
}
/** Pages read of one list to tell whether it changed; a longer list counts as changed. */
const LIST_PAGES_MAX = 50

/** The digest of each list (by its method) of one (server, tenant) as its sessions could last have seen it. */
export class ListDigests {
  readonly #digests = new Map<string, string>()
  /** The first connection's lists being read (the baseline a list_changed is compared with). */
  #baseline: Promise<void> | null = null

  /** The first connection's lists (those its backend says may change), read before it serves anyone; later connections add nothing. */
  async baselineFrom (conn: PoolConnection, info: BackendInfo): Promise<void> {
    if (this.#baseline !== null) return
    await (this.#baseline = this.#readBaseline(conn, info))
  }

  /** Whether `digest` (null: unreadable) differs from what the sessions last saw; it becomes what they saw. */
  async changed (list: string, digest: string | null): Promise<boolean> {
    await this.#baseline
    if (digest === null) return true
    if (this.#digests.get(list) === digest) return false
    this.#digests.set(list, digest)
    return true
  }

  async #readBaseline (conn: PoolConnection, info: BackendInfo): Promise<void> {
    for (const [method, list] of Object.entries(LIST_OF)) {
      const kind = method.split('/')[1] ?? ''
      const declared = info.capabilities[kind]
      if (!isRecord(declared) || declared.listChanged !== true) continue
      const digest = await listDigest(conn, list, false)
      if (digest !== null && !this.#digests.has(list)) this.#digests.set(list, digest)
    }
  }
}

/**
 * A notification of a connection's that belongs to no request: `forward` gets it, except a
 * list_changed whose list is unchanged (compared with `lists`, the digests of the connection's
 * (server, tenant); undefined when its pool has ended: then forwarded).
 */
export function forwardIfChanged (conn: PoolConnection, message: JsonRpcMessage, lists: ListDigests | undefined, forward: (message: JsonRpcMessage) => void): void {
  const list = isNotification(message) ? LIST_OF[message.method] : undefined
  if (list === undefined) { forward(message); return }
  // Announced again while its list is read: read once more after (a burst of registrations).
  if (conn.listChecks.has(list)) { conn.listChecks.set(list, true); return }
  conn.listChecks.set(list, false)
  checkList(conn, list, lists, () => { forward(message) })
    .catch(err => { conn.relay.log.warn({ err, list }, 'list change not checked') })
    .finally(() => { conn.listChecks.delete(list) })
}

/** Reads the list a list_changed is about and forwards the notification if its digest differs. */
async function checkList (conn: PoolConnection, list: string, lists: ListDigests | undefined, forward: () => void): Promise<void> {
  do {
    conn.listChecks.set(list, false)
    const digest = await listDigest(conn, list, true)
    if (lists !== undefined && !await lists.changed(list, digest)) {
      conn.relay.log.debug({ list }, 'list_changed of a pooled backend with an unchanged list not forwarded')
      continue
    }
    forward()
  } while (conn.listChecks.get(list) === true)
}

/**
 * A digest of a connection's whole list (every page), or null if it cannot be read. `idle`: read
 * between the connection's requests (one that serves nobody yet is read at once).
 */
async function listDigest (conn: PoolConnection, list: string, idle: boolean): Promise<string | null> {
  const hash = createHash('sha256')
  let cursor: string | undefined
  for (let page = 0; page < LIST_PAGES_MAX; page++) {
    const params = cursor === undefined ? {} : { cursor }
    const answer = await new Promise<JsonRpcResponse>(resolve => {
      if (idle) conn.whenIdle(list, params, resolve, LIST_KEY_PREFIX)
      else conn.request(list, params, resolve, LIST_KEY_PREFIX)
    })
    if ('error' in answer || !isRecord(answer.result)) return null
    const { nextCursor, _meta: _ignored, ...items } = answer.result
    hash.update(JSON.stringify(items)).update('\n')
    if (typeof nextCursor !== 'string') return hash.digest('base64url')
    cursor = nextCursor
  }
  return null
}
