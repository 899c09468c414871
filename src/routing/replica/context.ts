// The services every part of the routing layer works with on one replica (wired in app.ts).
import type { Logger } from 'pino'
import type { Config } from '../../config/schema.js'
import type { Bus } from '../../state/bus.js'
import type { EventLog } from '../../state/event-log.js'
import type { SessionStore } from '../../state/session-store.js'
import type { TaskStore } from '../../state/task-store.js'
import type { GatewayMetrics } from '../../telemetry/metrics.js'

export interface ReplicaContext {
  replicaId: string
  /**
   * The config the process started with: read process settings from it (http, sessions, redis).
   * Routing settings (servers, auth, tenants) change on a reload: read them through a LiveConfig.
   */
  config: Readonly<Config>
  store: SessionStore
  /** The records of the tasks the gateway mints ids for, read by every replica. */
  tasks: TaskStore
  eventLog: EventLog
  bus: Bus
  log: Logger
  /** This instance's metrics (NO_METRICS when off). */
  metrics: GatewayMetrics
}
