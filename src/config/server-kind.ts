// What kind of sessions a server's config gives (docs/architecture.md, "Session kinds"): the one
// mapping from config to kind. routing/kinds/ picks each message's kind with it, from the live
// config; everything else that must tell an aggregate from a backend server uses the guards below.
import type { ServerSource } from './live.js'
import type { AggregateServerConfig, BackendServerConfig, ServerConfig } from './schema.js'

export type KindName = 'routed' | 'aggregate' | 'direct' | 'pooled'

/** The kind of a server's 2025-era sessions (a removed server: routed, whose owner still ends it). */
export function kindNameOf (config: ServerConfig | undefined): KindName {
  if (config === undefined) return 'routed'
  switch (config.transport) {
    case 'aggregate': return 'aggregate'
    case 'streamable-http': return 'direct'
    case 'stdio': return config.sessions === 'pooled' ? 'pooled' : 'routed'
    default: return 'routed'
  }
}

/**
 * Whether each of a server's client sessions takes a backend connection of its own, so the
 * supervisor refuses one past maxSessions. A pooled server's children are the pool's, bounded by
 * poolMax per tenant (routing/upstream/pool.ts); its maxSessions counts client sessions
 * (routing/kinds/pooled-sessions.ts).
 */
export function countsTowardMaxSessions (config: ServerConfig): boolean {
  return kindNameOf(config) !== 'pooled'
}

/** A server's config now, safe for any name (a name that is an Object.prototype member is just absent). */
export function serverConfigOf (live: ServerSource, server: string): ServerConfig | undefined {
  return Object.hasOwn(live.servers, server) ? live.servers[server] : undefined
}

/** An aggregate's config: members, no backend of its own. */
export function isAggregateConfig (config: ServerConfig | undefined): config is AggregateServerConfig {
  return config?.transport === 'aggregate'
}

/** A server with a backend of its own (stdio or HTTP), or undefined for an aggregate or an unknown name. */
export function backendConfigOf (config: ServerConfig | undefined): BackendServerConfig | undefined {
  return config === undefined || isAggregateConfig(config) ? undefined : config
}
