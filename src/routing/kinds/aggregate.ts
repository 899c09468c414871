// Aggregate sessions (docs/architecture.md, "An aggregate call"): a routed session whose relay is
// made of member links (routing/aggregate/relay.ts), one per dedicated member and the pool of each
// pooled member, all on the session's owner. Routing, ownership and takeover are the routed kind's;
// what differs is the relay it opens, and that its pooled members' session-level events reach it.
import type { ToolPolicyLookup } from '../../auth/tool-policy.js'
import { GW_ERR_BACKEND_CAPACITY, GW_ERR_SERVER_NOT_FOUND, withRetryAfter } from '../../core/errors.js'
import type { JsonRpcMessage } from '../../core/jsonrpc.js'
import type { SessionRecord } from '../../state/session-store.js'
import { principalOfRecord } from '../../auth/principal.js'
import { lazyChild, shortHash } from '../../telemetry/logger.js'
import { AggregateRelay } from '../aggregate/relay.js'
import type { BackendSupervisor, CredentialLookup, UpstreamLookup } from '../upstream/ports.js'
import type { ConnectionPool } from '../upstream/pool.js'
import { capabilitiesOf, type RelayHost } from '../upstream/relay.js'
import { serverConfigOf, type KindName } from './kind.js'
import { RoutedKind, type RelayKindOptions } from './routed.js'

/** Retry-After of a new session refused at an aggregate's maxSessions. */
const CAPACITY_RETRY_AFTER_S = 5

export interface AggregateKindOptions extends RelayKindOptions {
  backends: BackendSupervisor
  pool: ConnectionPool
  host: RelayHost
  upstream: UpstreamLookup | undefined
  /** Each session owner's credential toward a member (credentials/); none when static. */
  credentials?: CredentialLookup
  toolPolicy: ToolPolicyLookup | undefined
}

export class AggregateKind extends RoutedKind {
  override readonly name: KindName = 'aggregate'
  readonly #options: AggregateKindOptions
  /** The aggregate relays open here. */
  readonly #relays = new Set<AggregateRelay>()

  constructor (options: AggregateKindOptions) {
    super(options)
    this.#options = options
  }

  protected override async openRelay (record: SessionRecord): Promise<AggregateRelay> {
    const config = serverConfigOf(this.#options.live, record.server)
    // Removed by a reload since the session was looked up: the client sees 404.
    if (config?.transport !== 'aggregate') throw new GW_ERR_SERVER_NOT_FOUND(record.server)
    let open = 0
    for (const relay of this.#relays) if (relay.server === record.server) open++
    if (open >= config.maxSessions) throw withRetryAfter(new GW_ERR_BACKEND_CAPACITY(record.server, config.maxSessions), CAPACITY_RETRY_AFTER_S)
    const options = this.#options
    const relay = new AggregateRelay({
      sid: record.id,
      server: record.server,
      legacy: record.transport === 'legacy',
      protocolVersion: record.protocolVersion,
      clientCapabilities: capabilitiesOf(record.initializeParams),
      requestTimeoutMs: config.requestTimeoutMs,
      metrics: options.metrics.forSession(record.server, record.tenant),
      gatewayMetrics: options.metrics,
      createdAt: record.createdAt,
      host: options.host,
      principal: principalOfRecord(record),
      log: lazyChild(options.log, { sid: shortHash(record.id), backend: record.server }),
      config: options.config,
      aggregate: config,
      live: options.live,
      backends: options.backends,
      pool: options.pool,
      tenant: record.tenant ?? null,
      // The owner's, from the record: every replica that takes the session over opens its members
      // for the same user, never for the caller of the request that triggered the takeover.
      subjectDigest: record.subjectDigest,
      upstream: options.upstream,
      credentials: options.credentials,
      toolPolicy: options.toolPolicy
    })
    const stop = async (): Promise<void> => {
      this.#relays.delete(relay)
      await relay.close()
    }
    this.#relays.add(relay)
    options.ownership.register(relay, stop)
    try {
      await relay.open()
    } catch (err) {
      options.ownership.forget(relay)
      await stop()
      throw err
    }
    return relay
  }

  /** A session-level notification of `server`'s pool on this replica: to the aggregates here that have it as a pooled member. */
  poolEvent (server: string, tenant: string | null, subject: string | null, message: JsonRpcMessage): void {
    for (const relay of this.#relays) if (relay.hasPooledMember(server)) relay.poolEvent(server, tenant, subject, message)
  }
}
