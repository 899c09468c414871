// Every Redis key name the gateway uses, built from one configured prefix (ARCHITECTURE.md
// section 4, BullMQ's queue-keys.ts). All keys of one session share the cluster hash tag `{sid}`,
// so one Lua script may touch all of them; scripts that find a session's stream keys at run time
// build them from the same suffixes exported here, so the names still have one home.

/** Suffixes after `<prefix>:{<sid>}:`; the Lua scripts interpolate these, never literals. */
export const SESSION_SUFFIX = {
  meta: 'meta',
  owner: 'owner',
  /** Set of the stream ids that have holder, cursor or event keys, so delete can find them. */
  streams: 'streams',
  holder: 'holder:',
  events: 'ev:',
  cursor: 'cur:'
} as const

export interface SessionKeys {
  /** `<prefix>:{<sid>}`: the base the scripts append suffixes to. */
  base: string
  meta: string
  owner: string
  streams: string
  holder: (streamId: string) => string
  events: (streamId: string) => string
  cursor: (streamId: string) => string
}

export function sessionKeys (prefix: string, sid: string): SessionKeys {
  const base = `${prefix}:{${sid}}`
  return {
    base,
    meta: `${base}:${SESSION_SUFFIX.meta}`,
    owner: `${base}:${SESSION_SUFFIX.owner}`,
    streams: `${base}:${SESSION_SUFFIX.streams}`,
    holder: streamId => `${base}:${SESSION_SUFFIX.holder}${streamId}`,
    events: streamId => `${base}:${SESSION_SUFFIX.events}${streamId}`,
    cursor: streamId => `${base}:${SESSION_SUFFIX.cursor}${streamId}`
  }
}

/** A replica's heartbeat: present while the replica lives. */
export const replicaKey = (prefix: string, replicaId: string): string => `${prefix}:replica:${replicaId}`

/** A replica's bus inbox (a stream). */
export const inboxKey = (prefix: string, replicaId: string): string => `${prefix}:inbox:${replicaId}`
