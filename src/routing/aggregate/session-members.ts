// The members of one aggregate session, each with its link (member-link.ts), and whether each is
// up. A member still starting is not down: the session's initialize waits for it memberTimeoutMs,
// and every request after that (lists, calls) waits for its start to end, within
// memberStartTimeoutMs (a cold gateway under load may take seconds to initialise a child). A member
// that fails, then, is down: left out of lists (a warning, a metric), its calls failing at once,
// tried again in the background; its fall and its return change the lists, which the session
// announces with list_changed.
import type { Logger } from 'pino'
import type { AggregateMemberConfig, AggregateServerConfig } from '../../config/schema.js'
import type { GatewayMetrics } from '../../telemetry/metrics.js'
import type { MemberLink } from './member-link.js'
import { MEMBER_RETRY_MS, markDown, markUp, memberOf, startWithin, type MemberState } from './member-state.js'
import type { BackendInfo } from '../upstream/pool.js'

export interface SessionMember extends MemberState {
  link: MemberLink
  info: BackendInfo | null
  /** Its next start, while it is down. */
  retry: NodeJS.Timeout | undefined
  /** Its first start, while it runs (bounded by memberStartTimeoutMs): requests wait for it. */
  starting: Promise<void> | null
}

export interface SessionMembersOptions {
  /** The aggregate server's name (metrics). */
  aggregate: string
  config: AggregateServerConfig
  /** Makes a member's link, once, when the session opens. */
  link: (member: AggregateMemberConfig) => MemberLink
  /** A member fell or came back: every merged list may have changed. */
  listsChanged: () => void
  /** The session's logger. */
  log: Logger
  metrics: GatewayMetrics
}

export class SessionMembers {
  /** In their configured (priority) order. */
  readonly all: readonly SessionMember[]
  readonly #options: SessionMembersOptions
  #closed = false

  constructor (options: SessionMembersOptions) {
    this.#options = options
    this.all = options.config.members.map(m => ({ ...memberOf(m), link: options.link(m), info: null, retry: undefined, starting: null }))
  }

  byServer (server: string): SessionMember | undefined {
    return this.all.find(m => m.server === server)
  }

  /**
   * Starts every member, waiting for each at most memberTimeoutMs: one still starting then goes on
   * starting (within memberStartTimeoutMs), and the requests that need it wait for it. Those that
   * fail are tried again later.
   */
  async open (): Promise<void> {
    const waitMs = this.#options.config.memberTimeoutMs
    await Promise.all(this.all.map(async m => {
      const started = this.#start(m, false)
      m.starting = started
      started.finally(() => { if (m.starting === started) m.starting = null }).catch(() => {})
      let timer: NodeJS.Timeout | undefined
      await Promise.race([started, new Promise<void>(resolve => { timer = setTimeout(resolve, waitMs) })])
      clearTimeout(timer)
    }))
  }

  /** Members still in their first start: what a request needs of them waits for it (bounded). */
  async started (): Promise<void> {
    const starting = this.all.flatMap(m => m.starting === null ? [] : [m.starting])
    if (starting.length > 0) await Promise.all(starting)
  }

  async #start (member: SessionMember, announce: boolean): Promise<void> {
    if (this.#closed) return
    const { memberTimeoutMs, memberStartTimeoutMs } = this.#options.config
    // A start may take longer than a list (a cold child under load): it is bounded by
    // memberStartTimeoutMs. Nothing is answered without a member still in its first start (every
    // request but ping waits for it), so its end needs no announcement.
    const boundMs = Math.max(memberTimeoutMs, memberStartTimeoutMs)
    try {
      member.info = await startWithin(member.server, member.link.start(), boundMs)
      const was = member.down
      markUp(member)
      if (announce && was !== null) {
        this.#options.log.info({ member: member.server }, 'aggregate member is back')
        this.#options.listsChanged()
      }
    } catch (err) {
      this.down(member.server, err instanceof Error ? err.message : String(err), err)
    }
  }

  /**
   * A member failed to start or went away: out of lists until it comes back. `cause`: the error
   * that took it down (a credential's own is what requests routed to it get meanwhile).
   */
  down (server: string, reason: string, cause?: unknown): void {
    const member = this.byServer(server)
    if (member === undefined || this.#closed) return
    const wasUp = member.down === null
    if (markDown(member, reason, cause)) {
      this.#options.log.warn({ member: member.server, reason }, 'aggregate member is down: left out of lists, its calls fail at once')
      this.#options.metrics.aggregateMemberLeftOut(this.#options.aggregate, member.server, 'down')
    }
    if (wasUp) this.#options.listsChanged()
    clearTimeout(member.retry)
    member.retry = setTimeout(() => {
      member.retry = undefined
      member.link.close().then(async () => { await this.#start(member, true) }).catch(() => {})
    }, MEMBER_RETRY_MS)
    member.retry.unref()
  }

  /** Stops every member's connection of this session (pooled members have none) and its retries. */
  async close (): Promise<void> {
    this.#closed = true
    for (const m of this.all) clearTimeout(m.retry)
    await Promise.all(this.all.map(async m => { await m.link.close().catch(() => {}) }))
  }
}
