// What the admin API answers (docs/console.md), across every replica through the session store:
// - each replica publishes a small summary (sessions and children by server, pools, the last
//   minutes of calls, errors and latency per server and of calls and refusals per tenant, event-loop
//   delay, draining, last reload) every SUMMARY_EVERY_MS, kept a few periods;
// - sessions are listed from the store's session index (SessionStore.sessionIndex, kept by
//   create, touch and delete: no write of its own per call), at most SESSION_INDEX_READ_MAX read.
// A session id works as a bearer secret: the API shows its shortHash, and an operator ends a
// session by that digest.
import { monitorEventLoopDelay, type IntervalHistogram } from 'node:perf_hooks'
import type { Logger } from 'pino'
import type { Config } from '../../config/schema.js'
import type { ServerSource } from '../../config/live.js'
import { GATEWAY_VERSION } from '../../core/version.js'
import { isAggregateConfig, kindNameOf, type KindName } from '../../config/server-kind.js'
import type { Router } from '../../routing/router.js'
import type { PoolStats } from '../../routing/upstream/pool.js'
import { GET_STREAM, LEGACY_STREAM } from '../../state/event-log.js'
import { SESSION_INDEX_READ_MAX, type SessionRecord, type SessionStore } from '../../state/session-store.js'
import type { SessionTask, SessionTasks } from '../../state/session-tasks.js'
import { SLOTS, type AdminStats, type SeriesSnapshot, type TenantSnapshot } from '../../telemetry/admin-stats.js'
import { shortHash } from '../../telemetry/logger.js'

/** What the console calls each kind of session (a routed session is a dedicated one). */
const MODE_OF_KIND: Record<KindName, string> = { routed: 'dedicated', aggregate: 'aggregate', direct: 'direct', pooled: 'pooled' }

/** How often a replica publishes its summary; it is kept SUMMARY_TTL_FACTOR times as long. */
export const SUMMARY_EVERY_MS = 2000
const SUMMARY_TTL_FACTOR = 3
/** How long one read of the session index and records serves the API's calls (the console polls). */
const SESSIONS_CACHE_MS = 1000
/** Records read from the store at once while listing. */
const READ_BATCH = 200
/** Slots in "per minute" (SLOT_MS is ten seconds). */
const MINUTE_SLOTS = 6

export interface ReloadResult { ok: boolean, errors?: string[] }
export type ReloadFn = (trigger: string) => Promise<ReloadResult>

/** One replica as it last published itself. */
export interface ReplicaSummary {
  id: string
  version: string
  startedAt: number
  at: number
  draining: boolean
  eventLoopDelayMs: number
  sessions: Record<string, number>
  children: Record<string, number>
  pools: PoolStats[]
  servers: Record<string, SeriesSnapshot>
  tenants: Record<string, TenantSnapshot>
  lastReload: { at: number, trigger: string, ok: boolean, errors?: string[] } | null
}

/** A session as the API shows it: never its id. */
export interface SessionView {
  session: string
  server: string
  tenant: string | null
  subject: string | null
  transport: string
  protocolVersion: string
  client: string | null
  pooled: boolean
  createdAt: number
  lastActivityAt: number
  owner: string | null
  holder: string | null
}

export interface AdminServiceOptions {
  replicaId: string
  config: Readonly<Config>
  live: ServerSource & { readonly current: Readonly<Config> }
  store: SessionStore
  router: Router
  stats: AdminStats
  log: Logger
  children: () => Map<string, number>
  pools: () => PoolStats[]
  draining: () => boolean
  /** The sessions' task view (what clients were told of their tasks); none: no task is shown. */
  sessionTasks?: SessionTasks
}

const sum = (values: readonly number[], last = values.length): number => values.slice(-last).reduce((a, b) => a + b, 0)
const toRecord = (map: Map<string, number>): Record<string, number> => Object.fromEntries(map)

function clientName (record: SessionRecord): string | null {
  const info = (record.initializeParams as { clientInfo?: { name?: unknown } } | null)?.clientInfo
  return typeof info?.name === 'string' ? info.name.slice(0, 64) : null
}

/**
 * A replica's count or series for a configured name. Summaries arrive as parsed JSON, whose
 * objects inherit `constructor`, `toString` and the like, which are valid server and tenant names.
 */
function own<T> (map: Readonly<Record<string, T>>, name: string): T | undefined {
  return Object.hasOwn(map, name) ? map[name] : undefined
}

/** Adds `b`'s slots into `a`'s where both cover the same clock slots. */
function addSlots (into: number[], from: number, values: readonly number[], valuesFrom: number, max = false): void {
  values.forEach((v, i) => {
    const at = valuesFrom + i - from
    if (at < 0 || at >= into.length) return
    into[at] = max ? Math.max(into[at] ?? 0, v) : (into[at] ?? 0) + v
  })
}

export class AdminService {
  readonly #options: AdminServiceOptions
  readonly #startedAt = Date.now()
  readonly #loop: IntervalHistogram
  #loopDelayMs = 0
  #timer: NodeJS.Timeout | undefined
  #reload: ReloadFn | undefined
  #lastReload: ReplicaSummary['lastReload'] = null
  #sessions: { at: number, list: Promise<Array<{ record: SessionRecord, expiresAt: number }>> } | undefined

  constructor (options: AdminServiceOptions) {
    this.#options = options
    this.#loop = monitorEventLoopDelay({ resolution: 20 })
  }

  start (): void {
    this.#loop.enable()
    const publish = (): void => { this.#publish().catch(err => this.#options.log.warn({ err }, 'admin summary not published')) }
    publish()
    this.#timer = setInterval(publish, SUMMARY_EVERY_MS)
    this.#timer.unref()
  }

  stop (): void {
    clearInterval(this.#timer)
    this.#loop.disable()
  }

  /** main.ts hands over the config reloader (it knows the file); until then reload is refused. */
  setReloader (reload: ReloadFn): void {
    this.#reload = reload
  }

  /** This replica's summary, as of now. */
  summary (): ReplicaSummary {
    const sessions = new Map(this.#options.router.ownedSessions())
    for (const [server, n] of this.#options.router.pooledSessions()) sessions.set(server, (sessions.get(server) ?? 0) + n)
    return {
      id: this.#options.replicaId,
      version: GATEWAY_VERSION,
      startedAt: this.#startedAt,
      at: Date.now(),
      draining: this.#options.draining() || this.#options.router.stopping,
      eventLoopDelayMs: this.#loopDelayMs,
      sessions: toRecord(sessions),
      children: toRecord(this.#options.children()),
      pools: this.#options.pools(),
      servers: this.#options.stats.servers(),
      tenants: this.#options.stats.tenants(),
      lastReload: this.#lastReload
    }
  }

  async #publish (): Promise<void> {
    // The 99th percentile of the loop's delay over the last period, then a fresh period.
    this.#loopDelayMs = Math.round(this.#loop.percentile(99) / 1e5) / 10
    this.#loop.reset()
    await this.#options.store.publishSummary(this.#options.replicaId, JSON.stringify(this.summary()), SUMMARY_EVERY_MS * SUMMARY_TTL_FACTOR)
  }

  /** Every live replica's summary; this replica's is taken fresh. */
  async replicas (): Promise<ReplicaSummary[]> {
    const texts = await this.#options.store.summaries()
    const out = new Map<string, ReplicaSummary>()
    for (const text of texts) {
      try {
        const summary = JSON.parse(text) as ReplicaSummary
        if (typeof summary.id === 'string') out.set(summary.id, summary)
      } catch { /* a summary from another version: left out */ }
    }
    out.set(this.#options.replicaId, this.summary())
    return [...out.values()].sort((a, b) => a.id.localeCompare(b.id))
  }

  /** Replicas, servers and tenants in one answer (what the console polls). */
  async overview (): Promise<{ at: number, replica: string, replicas: unknown[], servers: unknown[], tenants: unknown[], sessions: { total: number, truncated: boolean } }> {
    const [replicas, sessions] = await Promise.all([this.replicas(), this.#allSessions()])
    return {
      at: Date.now(),
      replica: this.#options.replicaId,
      replicas: replicas.map(r => this.#replicaView(r)),
      servers: this.#serverViews(replicas),
      tenants: this.#tenantViews(replicas, sessions),
      sessions: { total: sessions.length, truncated: sessions.length >= SESSION_INDEX_READ_MAX }
    }
  }

  #replicaView (r: ReplicaSummary): Record<string, unknown> {
    return {
      id: r.id,
      self: r.id === this.#options.replicaId,
      version: r.version,
      uptimeS: Math.round((r.at - r.startedAt) / 1000),
      draining: r.draining,
      sessions: sum(Object.values(r.sessions)),
      children: sum(Object.values(r.children)),
      eventLoopDelayMs: r.eventLoopDelayMs,
      lastReload: r.lastReload,
      seenAt: r.at
    }
  }

  #serverViews (replicas: ReplicaSummary[]): Array<Record<string, unknown>> {
    const servers = this.#options.live.servers
    const now = Math.floor(Date.now() / 10_000)
    const from = now - SLOTS + 1
    return Object.entries(servers).map(([name, server]) => {
      const calls = new Array<number>(SLOTS).fill(0)
      const errors = new Array<number>(SLOTS).fill(0)
      const latencySum = new Array<number>(SLOTS).fill(0)
      const latencyMax = new Array<number>(SLOTS).fill(0)
      let sessions = 0
      let children = 0
      const pool = { inUse: 0, warm: 0, waiting: 0 }
      for (const r of replicas) {
        sessions += own(r.sessions, name) ?? 0
        children += own(r.children, name) ?? 0
        for (const p of r.pools) {
          if (p.server !== name) continue
          pool.inUse += p.busy
          pool.warm += Math.max(0, p.connections - p.busy)
          pool.waiting += p.waiting
        }
        const s = own(r.servers, name)
        if (s === undefined) continue
        addSlots(calls, from, s.calls, s.from)
        addSlots(errors, from, s.errors, s.from)
        addSlots(latencySum, from, s.latencySum, s.from)
        addSlots(latencyMax, from, s.latencyMax, s.from, true)
      }
      const callsPerMinute = sum(calls, MINUTE_SLOTS)
      const errorsPerMinute = sum(errors, MINUTE_SLOTS)
      const latencySumMinute = sum(latencySum, MINUTE_SLOTS)
      const mode = MODE_OF_KIND[kindNameOf(server)]
      return {
        name,
        transport: server.transport,
        mode,
        members: isAggregateConfig(server) ? server.members.map(m => m.server) : [],
        sessions,
        children,
        pool,
        callsPerMinute,
        errorsPerMinute,
        latencyMsAvg: callsPerMinute === 0 ? null : Math.round(latencySumMinute / callsPerMinute),
        health: callsPerMinute === 0 ? 'idle' : errorsPerMinute * 2 > callsPerMinute ? 'failing' : errorsPerMinute * 20 > callsPerMinute ? 'degraded' : 'ok',
        series: {
          from: from * 10_000,
          slotMs: 10_000,
          calls,
          errors,
          latencyMsAvg: calls.map((n, i) => n === 0 ? null : Math.round((latencySum[i] ?? 0) / n)),
          latencyMsMax: latencyMax
        }
      }
    })
  }

  #tenantViews (replicas: ReplicaSummary[], sessions: Array<{ record: SessionRecord }>): Array<Record<string, unknown>> {
    const names = new Set(Object.keys(this.#options.live.current.tenants ?? {}))
    const bySessions = new Map<string, number>()
    for (const { record } of sessions) if (record.tenant != null) bySessions.set(record.tenant, (bySessions.get(record.tenant) ?? 0) + 1)
    return [...names].sort().map(name => {
      let calls = 0
      let rateLimited = 0
      let quota = 0
      for (const r of replicas) {
        const t = own(r.tenants, name)
        if (t === undefined) continue
        calls += sum(t.calls, MINUTE_SLOTS)
        rateLimited += sum(t.rateLimited, MINUTE_SLOTS)
        quota += sum(t.quota, MINUTE_SLOTS)
      }
      return { name, sessions: bySessions.get(name) ?? 0, callsPerMinute: calls, rateLimitedPerMinute: rateLimited, quotaRefusedPerMinute: quota }
    })
  }

  /** The live sessions' records, read once a second at most, most recently active first. */
  async #allSessions (): Promise<Array<{ record: SessionRecord, expiresAt: number }>> {
    const cached = this.#sessions
    if (cached !== undefined && Date.now() - cached.at < SESSIONS_CACHE_MS) return await cached.list
    const list = (async () => {
      const index = await this.#options.store.sessionIndex(SESSION_INDEX_READ_MAX)
      const out: Array<{ record: SessionRecord, expiresAt: number }> = []
      for (let i = 0; i < index.length; i += READ_BATCH) {
        const batch = index.slice(i, i + READ_BATCH)
        const records = await Promise.all(batch.map(async e => await this.#options.store.get(e.id)))
        records.forEach((record, j) => { if (record !== null) out.push({ record, expiresAt: batch[j]?.expiresAt ?? 0 }) })
      }
      return out
    })()
    this.#sessions = { at: Date.now(), list }
    list.catch(() => { if (this.#sessions?.list === list) this.#sessions = undefined })
    return await list
  }

  /** Sessions, filtered by tenant and server, paged. */
  async sessions (filter: { tenant?: string | undefined, server?: string | undefined, offset: number, limit: number }): Promise<{ total: number, offset: number, limit: number, truncated: boolean, sessions: SessionView[] }> {
    const all = await this.#allSessions()
    const matching = all.filter(({ record }) =>
      (filter.tenant === undefined || record.tenant === filter.tenant) && (filter.server === undefined || record.server === filter.server))
    // Most recently active first, by the client's last message: idle clients sink to the end.
    const lastActive = (record: SessionRecord): number => record.lastActiveAt ?? record.createdAt
    matching.sort((a, b) => lastActive(b.record) - lastActive(a.record))
    const page = matching.slice(filter.offset, filter.offset + filter.limit)
    const { store, router } = this.#options
    const sessions = await Promise.all(page.map(async ({ record }) => {
      // A pooled session has no owner lease: its read finds none.
      const [owner, holder] = await Promise.all([
        store.getOwner(record.id).catch(() => null),
        store.getHolder(record.id, record.transport === 'legacy' ? LEGACY_STREAM : GET_STREAM).catch(() => null)
      ])
      return {
        session: shortHash(record.id),
        server: record.server,
        tenant: record.tenant ?? null,
        subject: record.subjectDigest ?? null,
        transport: record.transport,
        protocolVersion: record.protocolVersion,
        client: clientName(record),
        pooled: router.kindNameOf(record.server) === 'pooled',
        createdAt: record.createdAt,
        // The client's last message, not the idle TTL's renewal, which an open stream's
        // keep-alive moves too (every session with a GET stream would look active).
        lastActivityAt: lastActive(record),
        owner,
        holder
      }
    }))
    return { total: matching.length, offset: filter.offset, limit: filter.limit, truncated: all.length >= SESSION_INDEX_READ_MAX, sessions }
  }

  /**
   * Ends the session whose digest this is, as a DELETE would (everywhere, through the bus).
   * Returns the session's server and tenant, or null when no live session has that digest.
   */
  /** The tasks a session's client was told of, by the session's digest; null when no live session has it. */
  async sessionTasks (digest: string): Promise<{ session: string, server: string, tasks: SessionTask[] } | null> {
    const index = await this.#options.store.sessionIndex(SESSION_INDEX_READ_MAX)
    const entry = index.find(e => shortHash(e.id) === digest)
    if (entry === undefined) return null
    const record = await this.#options.store.get(entry.id)
    if (record === null) return null
    return { session: digest, server: record.server, tasks: await this.#options.sessionTasks?.list(entry.id) ?? [] }
  }

  async endSession (digest: string): Promise<{ server: string, tenant: string | null } | null> {
    this.#sessions = undefined
    const index = await this.#options.store.sessionIndex(SESSION_INDEX_READ_MAX)
    const entry = index.find(e => shortHash(e.id) === digest)
    if (entry === undefined) return null
    const record = await this.#options.store.get(entry.id)
    if (record === null) return null
    await this.#options.router.endSession(entry.id, 'ended by an operator')
    return { server: record.server, tenant: record.tenant ?? null }
  }

  /** Reloads this replica's config file (a reload asked here or by another replica). */
  async reloadLocal (trigger: string): Promise<ReloadResult> {
    if (this.#reload === undefined) return { ok: false, errors: ['this replica has no config file to reload'] }
    const outcome = await this.#reload(trigger)
    this.#lastReload = { at: Date.now(), trigger, ok: outcome.ok, ...(outcome.errors !== undefined ? { errors: outcome.errors } : {}) }
    return outcome
  }

  /** Asks every other live replica to reload (bus envelopes), then reloads here. */
  async reloadAll (): Promise<{ local: ReloadResult, notified: string[] }> {
    const others = (await this.replicas()).map(r => r.id).filter(id => id !== this.#options.replicaId)
    const notified: string[] = []
    for (const id of others) {
      try {
        await this.#options.router.sendEnvelope(id, { kind: 'admin-reload', from: this.#options.replicaId })
        notified.push(id)
      } catch (err) {
        this.#options.log.warn({ err, replica: id }, 'admin reload not sent to a replica')
      }
    }
    return { local: await this.reloadLocal('admin'), notified }
  }
}
