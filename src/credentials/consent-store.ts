// Pending consents of the user-authorization source (user-authorization.ts): short-lived records
// any replica reads, so a consent link opened on one replica and an authorization server's callback
// landing on another both find what the first one started. Two kinds of record: the consent link's
// (who asked, for which server) and the authorization request's (its state: PKCE verifier, browser
// binding). `take` reads and deletes in one step: a state is used once, whichever replica is first.
// A memory twin here, a Redis twin in consent-store-redis.ts.

/** What a consent link stands for: the user who needed it and the server it is for. */
export interface ConsentLink {
  tenant: string | null
  subjectDigest: string
  server: string
  /** Epoch ms after which the link is refused. */
  expiresAt: number
}

/** An authorization request under way: what its callback needs to finish it. */
export interface PendingAuthorization extends ConsentLink {
  /** The PKCE code verifier (RFC 7636): never leaves the gateway. */
  verifier: string
  /** SHA-256 (base64url) of the nonce in the browser's cookie: the callback must come from that browser. */
  browserDigest: string
  /** The redirect_uri sent, which the token request repeats. */
  redirectUri: string
}

export type ConsentRecord = { kind: 'link', link: ConsentLink } | { kind: 'state', pending: PendingAuthorization }

export interface ConsentStore {
  /** Keeps `record` under `id` for `ttlMs`. */
  put (id: string, record: ConsentRecord, ttlMs: number): Promise<void>
  /** The record, left in place (a consent link may be opened again until it expires). */
  get (id: string): Promise<ConsentRecord | undefined>
  /** The record, deleted in the same step: only one caller ever gets it. */
  take (id: string): Promise<ConsentRecord | undefined>
  /** Claims `name` for `ttlMs` unless someone holds it: one refresh of an entry at a time, across replicas. */
  lock (name: string, ttlMs: number): Promise<boolean>
  unlock (name: string): Promise<void>
}

export class MemoryConsentStore implements ConsentStore {
  readonly #records = new Map<string, { text: string, until: number }>()
  readonly #locks = new Map<string, number>()
  readonly #now: () => number

  constructor (now: () => number = Date.now) {
    this.#now = now
  }

  async put (id: string, record: ConsentRecord, ttlMs: number): Promise<void> {
    const now = this.#now()
    // Swept on write: a pending consent nobody finishes must not stay forever.
    for (const [key, held] of this.#records) if (held.until <= now) this.#records.delete(key)
    this.#records.set(id, { text: JSON.stringify(record), until: now + ttlMs })
  }

  async get (id: string): Promise<ConsentRecord | undefined> {
    return this.#read(id)
  }

  async take (id: string): Promise<ConsentRecord | undefined> {
    // Read and deleted before any await: no other caller can take it in between.
    const found = this.#read(id)
    this.#records.delete(id)
    return found
  }

  #read (id: string): ConsentRecord | undefined {
    const held = this.#records.get(id)
    if (held === undefined || held.until <= this.#now()) return undefined
    return parseRecord(held.text)
  }

  async lock (name: string, ttlMs: number): Promise<boolean> {
    const held = this.#locks.get(name)
    if (held !== undefined && held > this.#now()) return false
    this.#locks.set(name, this.#now() + ttlMs)
    return true
  }

  async unlock (name: string): Promise<void> {
    this.#locks.delete(name)
  }
}

/** A stored record, or undefined when it is not one (altered, or from another version). */
export function parseRecord (text: string | null | undefined): ConsentRecord | undefined {
  if (typeof text !== 'string') return undefined
  try {
    const record = JSON.parse(text) as ConsentRecord
    return record.kind === 'link' || record.kind === 'state' ? record : undefined
  } catch {
    return undefined
  }
}
