// Redis twin of the bus: each replica reads its own inbox stream `<prefix>:inbox:<id>` with
// XREADGROUP BLOCK NOACK on a connection of its own. Envelopes are JSON. The loop outlives Redis
// restarts (it retries with capped backoff and resumes after the last entry it saw) and close()
// ends it at once by disconnecting the blocking connection.
//
// Why consumer groups (docs/design-notes.md, Routing): a second group, never read from, records how
// far the reader has handed client messages on (`deliver` envelopes: the handler gives them to a
// backend in the same turn): after each batch that held one, its last delivered id is moved there
// (XGROUP SETID, sent behind the batch on the reader's connection, never awaited; a batch of wakes
// sends nothing). When the replica dies, what lies past it never reached its backends, read or not:
// whoever takes its sessions over delivers those again (takeUnread) instead of failing them for the
// backend's loss. The reader itself reads through a group (XREADGROUP NOACK, the cost of an XREAD)
// only so that both groups live and die with the inbox key alike.
import { setTimeout as sleep } from 'node:timers/promises'
import type { Bus, DeliverEnvelope, Envelope, EnvelopeHandler, PreparedWake } from './bus.js'
import { compareEntryIds } from './event-log.js'
import type { Logger } from 'pino'
import { reconnectDelay, redisReady, storeCall, type Redis } from './redis/client.js'
import { inboxKey, sessionKeys } from './redis/keys.js'
import { defineScripts } from './redis/scripts.js'

export interface RedisBusOptions {
  /** Bus.ordered: the command connection is the event log's too, to one server (not a Cluster). Default false. */
  ordered?: boolean
  /** TTL of an inbox, refreshed by every send: the inbox of a replica that died expires. */
  inboxTtlMs: number
  /** Approximate bound of an inbox (XADD MAXLEN ~). */
  inboxMaxLen?: number
  /** How long one XREAD blocks before it is issued again. */
  blockMs?: number
  /** Upper bound of the read loop's retry backoff while Redis is away. */
  maxRetryDelayMs?: number
  /** How long start() waits for the reader connection. */
  readyTimeoutMs?: number
  log?: Logger
  /** Called when the handler throws (else it is logged, else rethrown); the loop goes on. */
  onHandlerError?: (err: unknown, envelope: Envelope) => void
}

/** The field holding the envelope JSON. */
const FIELD = 'e'
const BATCH = 100
/** The consumer group (and its one consumer) an inbox is read through. */
const GROUP = 'r'
/** The group recording how far client messages were handed on to backends (never read from). */
const HANDED = 'h'

function parseEnvelope (fields: string[]): Envelope | null {
  const at = fields.indexOf(FIELD)
  const json = at >= 0 && at % 2 === 0 ? fields[at + 1] : undefined
  if (json === undefined) return null
  try {
    const value: unknown = JSON.parse(json)
    return typeof value === 'object' && value !== null && typeof (value as { kind?: unknown }).kind === 'string' ? value as Envelope : null
  } catch {
    return null
  }
}

export class RedisBus implements Bus {
  readonly ordered: boolean
  readonly #redis: Redis
  readonly #newReader: () => Redis
  readonly #prefix: string
  readonly #opts: Required<Pick<RedisBusOptions, 'inboxTtlMs' | 'inboxMaxLen' | 'blockMs' | 'maxRetryDelayMs' | 'readyTimeoutMs'>> & RedisBusOptions
  #reader: Redis | null = null
  #loop: Promise<void> | null = null
  readonly #stop = new AbortController()

  /**
   * @param redis the replica's command connection (shared; not closed here)
   * @param newReader makes the dedicated blocking connection, e.g.
   *   `() => createRedis(url, { blocking: true })`; the bus owns and closes it
   */
  constructor (redis: Redis, newReader: () => Redis, prefix: string, opts: RedisBusOptions) {
    this.#redis = redis
    this.#newReader = newReader
    this.#prefix = prefix
    this.#opts = { inboxMaxLen: 10_000, blockMs: 5_000, maxRetryDelayMs: 1_000, readyTimeoutMs: 10_000, ...opts }
    this.ordered = opts.ordered === true
    defineScripts(redis)
  }

  async start (replicaId: string, handler: EnvelopeHandler): Promise<void> {
    if (this.#reader !== null) throw new Error('bus already started')
    if (this.#stop.signal.aborted) throw new Error('bus closed')
    const key = inboxKey(this.#prefix, replicaId)
    const reader = this.#newReader()
    this.#reader = reader
    defineScripts(reader)
    await redisReady(reader, this.#opts.readyTimeoutMs)
    // Only what arrives from now on: envelopes left in the inbox by an earlier life of this
    // replica id are stale. The group starts after the inbox's last entry, so anything sent
    // between start() resolving and the first read reaching Redis is delivered too.
    const last = await storeCall(this.#redis.openInbox(key, GROUP, HANDED, '', this.#opts.inboxTtlMs))
    this.#loop = this.#read(reader, key, last, handler)
  }

  async takeUnread (dead: string, sid: string, servedBy: string): Promise<DeliverEnvelope[]> {
    // The inbox and the session's markers in one step: only on one server (see the interface).
    if (!this.ordered) return []
    const taken = await storeCall(this.#redis.takeUnread(inboxKey(this.#prefix, dead), sessionKeys(this.#prefix, sid).pending, HANDED, sid, servedBy))
    return taken.map(json => JSON.parse(json) as DeliverEnvelope)
  }

  async send (replicaId: string, envelope: Envelope): Promise<void> {
    await storeCall(this.#redis.sendEnvelope(inboxKey(this.#prefix, replicaId), this.#opts.inboxMaxLen, this.#opts.inboxTtlMs, JSON.stringify(envelope)))
  }

  prepareWake (replicaId: string, sid: string, streamId: string, json: string, stamp?: { sentAt: number }): PreparedWake | undefined {
    if (!this.ordered) return undefined
    // The envelope's JSON with `entry` last, cut where its ordinal and id go: `…,"entry":{"json":…`
    // + `,"seq":` n `,"entryId":"` id `"}}`. Entry ids are `<ms>-<seq>`, safe in a JSON string as they are.
    const whole = JSON.stringify({ kind: 'wake', sid, streamId, ...stamp, entry: { json } })
    return {
      replicaId,
      inbox: inboxKey(this.#prefix, replicaId),
      maxLen: this.#opts.inboxMaxLen,
      ttlMs: this.#opts.inboxTtlMs,
      head: `${whole.slice(0, -2)},"seq":`,
      mid: ',"entryId":"',
      tail: '"}}',
      sent: () => {}
    }
  }

  async close (): Promise<void> {
    if (!this.#stop.signal.aborted) this.#stop.abort()
    // Disconnecting rejects the pending XREAD BLOCK, so the loop ends now, not after blockMs.
    this.#reader?.disconnect(false)
    await this.#loop
  }

  async #read (reader: Redis, key: string, lastId: string, handler: EnvelopeHandler): Promise<void> {
    const { signal } = this.#stop
    let failures = 0
    while (!signal.aborted) {
      let reply: Array<[string, Array<[string, string[]]>]> | null
      try {
        reply = await reader.xreadgroup('GROUP', GROUP, GROUP, 'COUNT', BATCH, 'BLOCK', this.#opts.blockMs, 'NOACK', 'STREAMS', key, '>') as typeof reply
        failures = 0
      } catch (err) {
        if (signal.aborted) break
        // The group went with its key: the inbox expired while nobody sent to it (a blocked read
        // is then ended with UNBLOCKED), or Redis came back without its data. It is made again
        // after the last entry handled here.
        if (err instanceof Error && /^(NOGROUP|UNBLOCKED)/.test(err.message)) {
          const made = await reader.openInbox(key, GROUP, HANDED, lastId, this.#opts.inboxTtlMs).then(() => true, () => false)
          if (made) continue
        }
        // Redis is away (the client reconnects by itself) or the read failed: wait and resume
        // after the last entry handled, so nothing that reached the inbox is skipped.
        if (failures++ === 0) this.#opts.log?.warn({ err }, 'bus inbox read failed; retrying')
        await sleep(reconnectDelay(failures, this.#opts.maxRetryDelayMs), undefined, { signal }).catch(() => {})
        continue
      }
      let handed: string | undefined
      for (const [, entries] of reply ?? []) {
        for (const [id, fields] of entries) {
          // A Redis restarted from a snapshot older than the last read may deliver entries again.
          if (compareEntryIds(id, lastId) <= 0) continue
          lastId = id
          if (signal.aborted) return
          const envelope = parseEnvelope(fields)
          if (envelope === null) {
            this.#opts.log?.warn({ id }, 'bus envelope is not valid JSON; dropped')
            continue
          }
          if (envelope.kind === 'deliver') handed = id
          try {
            handler(envelope)
          } catch (err) {
            if (this.#opts.onHandlerError !== undefined) this.#opts.onHandlerError(err, envelope)
            else if (this.#opts.log !== undefined) this.#opts.log.error({ err, kind: envelope.kind }, 'bus handler threw')
            else setImmediate(() => { throw err })
          }
        }
      }
      // Handed on: the next read leaves behind it on this connection, so it costs no wait.
      if (handed !== undefined) reader.xgroup('SETID', key, HANDED, handed).catch((err: unknown) => { this.#opts.log?.debug({ err }, 'inbox position not recorded') })
    }
  }
}
