// What the admin console shows of the last minutes (docs/console.md): calls, errors and latency per
// server, calls and refusals per tenant, in ten-second slots aligned on the clock, so every
// replica's slots line up and the admin API adds them up. Kept whether or not Prometheus metrics
// are on; each record is an array write, no allocation (the relay records every answer).
import type { GatewayMetrics, MetricSources, SessionMetrics, StreamKind, BackendErrorKind, UpkeepPass } from './metrics.js'
import type { Bus } from '../state/bus.js'
import type { Redis } from '../state/redis/client.js'

/** One slot's width, and how many slots are kept (five minutes). */
export const SLOT_MS = 10_000
export const SLOTS = 30

/** Counts per slot, oldest first, from slot `from` (ms since the epoch / SLOT_MS). */
export interface SeriesSnapshot {
  from: number
  calls: number[]
  errors: number[]
  /** Sum and maximum of call durations in the slot (ms). */
  latencySum: number[]
  latencyMax: number[]
}

export interface TenantSnapshot {
  from: number
  calls: number[]
  rateLimited: number[]
  quota: number[]
}

/** A ring of SLOTS slots; a slot is zeroed when the clock comes back to it. */
class Ring {
  readonly #slot = new Array<number>(SLOTS).fill(-1)
  readonly values: number[][]

  constructor (fields: number) {
    this.values = Array.from({ length: fields }, () => new Array<number>(SLOTS).fill(0))
  }

  /** The index of `now`'s slot, zeroed first if it held an older one. */
  at (now: number): number {
    const slot = Math.floor(now / SLOT_MS)
    const i = slot % SLOTS
    if (this.#slot[i] !== slot) {
      this.#slot[i] = slot
      for (const field of this.values) field[i] = 0
    }
    return i
  }

  /** Each field's slots, oldest first, ending with `now`'s; slots not written since are 0. */
  snapshot (now: number): { from: number, fields: number[][] } {
    const last = Math.floor(now / SLOT_MS)
    const from = last - SLOTS + 1
    const fields = this.values.map(() => new Array<number>(SLOTS).fill(0))
    for (let s = from; s <= last; s++) {
      const i = s % SLOTS
      if (this.#slot[i] !== s) continue
      this.values.forEach((field, f) => { fields[f]![s - from] = field[i] ?? 0 })
    }
    return { from, fields }
  }
}

const CALLS = 0
const ERRORS = 1
const LAT_SUM = 2
const LAT_MAX = 3
const RATE_LIMITED = 1
const QUOTA = 2

export class AdminStats {
  readonly #servers = new Map<string, Ring>()
  readonly #tenants = new Map<string, Ring>()
  readonly #now: () => number

  constructor (now: () => number = Date.now) {
    this.#now = now
  }

  /** One request answered by a server's backend in `ms`; `failed`: an error or a tool error. */
  call (server: string, tenant: string | null | undefined, ms: number, failed: boolean): void {
    const now = this.#now()
    const ring = this.#ring(this.#servers, server, 4)
    const i = ring.at(now)
    const v = ring.values
    v[CALLS]![i]! += 1
    if (failed) v[ERRORS]![i]! += 1
    v[LAT_SUM]![i]! += ms
    if (ms > v[LAT_MAX]![i]!) v[LAT_MAX]![i] = ms
    if (tenant != null) {
      const t = this.#ring(this.#tenants, tenant, 3)
      t.values[CALLS]![t.at(now)]! += 1
    }
  }

  /** A tenant's request refused by a limit (the typed error's code says which). */
  refused (tenant: string | null | undefined, code: string): void {
    if (tenant == null) return
    const field = code === 'GW_ERR_SESSION_QUOTA' ? QUOTA : code === 'GW_ERR_RATE_LIMITED' || code === 'GW_ERR_TOO_MANY_CONCURRENT' ? RATE_LIMITED : -1
    if (field < 0) return
    const ring = this.#ring(this.#tenants, tenant, 3)
    ring.values[field]![ring.at(this.#now())]! += 1
  }

  servers (): Record<string, SeriesSnapshot> {
    const now = this.#now()
    const out: Record<string, SeriesSnapshot> = {}
    for (const [name, ring] of this.#servers) {
      const { from, fields } = ring.snapshot(now)
      out[name] = { from, calls: fields[CALLS]!, errors: fields[ERRORS]!, latencySum: fields[LAT_SUM]!.map(Math.round), latencyMax: fields[LAT_MAX]!.map(Math.round) }
    }
    return out
  }

  tenants (): Record<string, TenantSnapshot> {
    const now = this.#now()
    const out: Record<string, TenantSnapshot> = {}
    for (const [name, ring] of this.#tenants) {
      const { from, fields } = ring.snapshot(now)
      out[name] = { from, calls: fields[CALLS]!, rateLimited: fields[RATE_LIMITED]!, quota: fields[QUOTA]! }
    }
    return out
  }

  /** A server or tenant removed by a reload: its history goes with it (the label sets stay bounded). */
  retain (servers: Iterable<string>, tenants: Iterable<string>): void {
    const keep = (map: Map<string, Ring>, names: Iterable<string>): void => {
      const set = new Set(names)
      for (const name of map.keys()) if (!set.has(name)) map.delete(name)
    }
    keep(this.#servers, servers)
    keep(this.#tenants, tenants)
  }

  #ring (map: Map<string, Ring>, name: string, fields: number): Ring {
    let ring = map.get(name)
    if (ring === undefined) map.set(name, ring = new Ring(fields))
    return ring
  }
}

/** Records into both: the Prometheus session metrics and the admin stats. */
class TeeSessionMetrics implements SessionMetrics {
  constructor (readonly inner: SessionMetrics, readonly stats: AdminStats, readonly server: string, readonly tenant: string | null | undefined) {}
  operation (method: string, tool: string | undefined, errorType: string, startedAt: number): void {
    this.inner.operation(method, tool, errorType, startedAt)
    this.stats.call(this.server, this.tenant, performance.now() - startedAt, errorType !== '')
  }

  toolsListed (result: unknown): void { this.inner.toolsListed(result) }
  backendError (kind: BackendErrorKind): void { this.inner.backendError(kind) }
  sessionEnded (createdAt: number): void { this.inner.sessionEnded(createdAt) }
  childRestarted (): void { this.inner.childRestarted() }
}

/** The gateway's metrics, with every answered request also counted in the admin stats. */
export class AdminStatsMetrics implements GatewayMetrics {
  constructor (readonly inner: GatewayMetrics, readonly stats: AdminStats) {}
  get registry (): GatewayMetrics['registry'] { return this.inner.registry }
  forSession (server: string, tenant: string | null | undefined): SessionMetrics {
    return new TeeSessionMetrics(this.inner.forSession(server, tenant), this.stats, server, tenant)
  }

  childStarted (server: string): void { this.inner.childStarted(server) }
  childCrashed (server: string): void { this.inner.childCrashed(server) }
  httpRefusal (status: number, code: string): void { this.inner.httpRefusal(status, code) }
  eventLogLost (kind: StreamKind, count: number): void { this.inner.eventLogLost(kind, count) }
  resumeCursorMissing (kind: StreamKind): void { this.inner.resumeCursorMissing(kind) }
  aggregateMemberLeftOut (aggregate: string, member: string, why: 'down' | 'slow' | 'error'): void { this.inner.aggregateMemberLeftOut(aggregate, member, why) }
  upkeepPass (pass: UpkeepPass, seconds: number): void { this.inner.upkeepPass(pass, seconds) }
  taskCreated (server: string, tenant: string | null | undefined): void { this.inner.taskCreated(server, tenant) }
  taskStatus (server: string, status: string): void { this.inner.taskStatus(server, status) }
  credentialLookup (server: string, source: string, outcome: string, grantSeconds?: number): void { this.inner.credentialLookup(server, source, outcome, grantSeconds) }
  observe (sources: MetricSources): void { this.inner.observe(sources) }
  reconfigure (servers: Iterable<string>, tenants: Iterable<string>): void {
    const s = [...servers]
    const t = [...tenants]
    this.inner.reconfigure(s, t)
    this.stats.retain(s, t)
  }

  instrumentRedis (redis: Redis): void { this.inner.instrumentRedis(redis) }
  instrumentBus (bus: Bus): Bus { return this.inner.instrumentBus(bus) }
}
