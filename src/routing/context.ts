// The services every part of the routing layer works with on one replica (wired in app.ts).
import type { Logger } from 'pino'
import type { Config } from '../config/schema.js'
import type { Bus } from '../state/bus.js'
import type { EventLog } from '../state/event-log.js'
import type { SessionStore } from '../state/session-store.js'

export interface ReplicaContext {
  replicaId: string
  config: Readonly<Config>
  store: SessionStore
  eventLog: EventLog
  bus: Bus
  log: Logger
}
