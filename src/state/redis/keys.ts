// Every Redis key name the gateway uses, built from one configured prefix (docs/replicas.md;
// BullMQ's queue-keys.ts did the same). All keys of one session share the cluster hash tag `{sid}`,
// so one Lua script may touch all of them; every script gets its keys in KEYS, built here.

/** Suffixes after `<prefix>:{<sid>}:`. */
const SESSION_SUFFIX = {
  meta: 'meta',
  owner: 'owner',
  /** Set of the stream ids that have holder, cursor or event keys, so delete can find them. */
  streams: 'streams',
  holder: 'holder:',
  events: 'ev:',
  cursor: 'cur:',
  /** Hash: stream id -> ordinal of its last entry (LogEntry.seq). */
  seq: 'seq',
  /** Hash of the requests waiting for an answer: `<streamId> <id>` -> ms recorded. */
  pending: 'pending'
} as const

export interface SessionKeys {
  meta: string
  owner: string
  streams: string
  seq: string
  pending: string
  holder: (streamId: string) => string
  events: (streamId: string) => string
  cursor: (streamId: string) => string
}

export function sessionKeys (prefix: string, sid: string): SessionKeys {
  const base = `${prefix}:{${sid}}`
  return {
    meta: `${base}:${SESSION_SUFFIX.meta}`,
    owner: `${base}:${SESSION_SUFFIX.owner}`,
    streams: `${base}:${SESSION_SUFFIX.streams}`,
    seq: `${base}:${SESSION_SUFFIX.seq}`,
    pending: `${base}:${SESSION_SUFFIX.pending}`,
    holder: streamId => `${base}:${SESSION_SUFFIX.holder}${streamId}`,
    events: streamId => `${base}:${SESSION_SUFFIX.events}${streamId}`,
    cursor: streamId => `${base}:${SESSION_SUFFIX.cursor}${streamId}`
  }
}

/** A replica's heartbeat: present while the replica lives. */
export const replicaKey = (prefix: string, replicaId: string): string => `${prefix}:replica:${replicaId}`

/** The replicas holding 2026-07-28 listen streams of a topic (server and tenant): zset scored by expiry. */
export const listenKey = (prefix: string, topic: string): string => `${prefix}:listen:${topic}`

/** A replica's bus inbox (a stream). */
export const inboxKey = (prefix: string, replicaId: string): string => `${prefix}:inbox:${replicaId}`

/**
 * A rate bucket of a tenant (`bucket`: `t` for the tenant, `s:<subject digest>` per subject). All of
 * one tenant's buckets share the `{tenant}` hash tag, so one script charges them together.
 */
export const rateKey = (prefix: string, tenant: string, bucket: string): string => `${prefix}:rl:{${tenant}}:${bucket}`

/** A session-quota set of a tenant (`scope`: `t` for the tenant, `s:<subject digest>` per subject). */
export const quotaKey = (prefix: string, tenant: string, scope: string): string => `${prefix}:q:{${tenant}}:${scope}`

/**
 * The admin API's session index: a sorted set of session ids scored by when their record expires,
 * kept by create, touch and delete; entries past their score are dropped when it is read.
 */
export const sessionIndexKey = (prefix: string): string => `${prefix}:sessions`

/** The replicas that published an admin summary: a sorted set scored by when it expires. */
export const summaryIndexKey = (prefix: string): string => `${prefix}:summaries`

/** A replica's admin summary (JSON), with the TTL of a few heartbeats. */
export const summaryKey = (prefix: string, replicaId: string): string => `${prefix}:summary:${replicaId}`

/** A session's task view (session-tasks.ts): hash, task id -> JSON; in the session's slot. */
export const sessionTaskViewKey = (prefix: string, sid: string): string => `${prefix}:{${sid}}:taskview`

/** A task record (task-store-redis.ts): a hash of JSON fields, expiring with the task. */
export const taskKey = (prefix: string, taskId: string): string => `${prefix}:task:${taskId}`

/** A session's task ids, scored by when each record expires; under the session's hash tag. */
export const sessionTasksKey = (prefix: string, sid: string): string => `${prefix}:{${sid}}:tasks`

/** The task ids a replica runs, scored by when each record expires. */
export const replicaTasksKey = (prefix: string, replicaId: string): string => `${prefix}:tasks:replica:${replicaId}`

/** The replicas that run live tasks, scored by when their last record expires. */
export const taskReplicasKey = (prefix: string): string => `${prefix}:tasks:replicas`
