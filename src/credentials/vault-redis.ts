// The vault's Redis twin: every replica reads the tokens any replica obtained. One hash per entry
// (the sealed secret and plain metadata), expiring with its token, and one index hash per tenant
// for the admin listing; both carry the tenant as hash tag, so a Redis Cluster keeps a tenant's
// entries and index in one slot and each change is one MULTI.
import type { Redis } from '../state/redis/client.js'
import type { VaultKeyRing } from './cipher.js'
import type { Vault, VaultEntry, VaultKey, VaultListing } from './types.js'
import { entryName, keepMs, openEntry, sealEntry, type StoredEntry } from './vault.js'

export class RedisVault implements Vault {
  readonly #redis: Redis
  readonly #ring: VaultKeyRing
  readonly #prefix: string

  constructor (redis: Redis, ring: VaultKeyRing, keyPrefix: string) {
    this.#redis = redis
    this.#ring = ring
    this.#prefix = keyPrefix
  }

  #tenantPart (tenant: string | null): string {
    return `${this.#prefix}:vault:{${tenant ?? '-'}}`
  }

  #entryKey (key: VaultKey): string {
    return `${this.#tenantPart(key.tenant)}:${entryName(key)}`
  }

  #indexKey (tenant: string | null): string {
    return `${this.#tenantPart(tenant)}:index`
  }

  async put (key: VaultKey, entry: VaultEntry, ttlMs?: number): Promise<void> {
    const stored = sealEntry(this.#ring, key, entry)
    const at = this.#entryKey(key)
    const fields: Record<string, string> = { s: stored.sealed, e: stored.expiresAt === null ? '' : String(stored.expiresAt) }
    if (stored.scope !== undefined) fields.c = stored.scope
    if (stored.audience !== undefined) fields.a = stored.audience
    const keep = keepMs(entry, ttlMs)
    const tx = this.#redis.multi().del(at).hset(at, fields)
    if (keep > 0) tx.pexpire(at, keep)
    tx.hset(this.#indexKey(key.tenant), entryName(key), JSON.stringify(key))
    await tx.exec()
  }

  async get (key: VaultKey): Promise<VaultEntry | undefined> {
    const fields = await this.#redis.hgetall(this.#entryKey(key))
    const stored = storedOf(fields)
    return stored === undefined ? undefined : openEntry(this.#ring, key, stored)
  }

  async delete (key: VaultKey): Promise<void> {
    await this.#redis.multi().del(this.#entryKey(key)).hdel(this.#indexKey(key.tenant), entryName(key)).exec()
  }

  async list (filter: { tenant: string | null, server?: string }): Promise<VaultListing[]> {
    const index = this.#indexKey(filter.tenant)
    const named = await this.#redis.hgetall(index)
    const keys: VaultKey[] = []
    for (const text of Object.values(named)) {
      try {
        const key = JSON.parse(text) as VaultKey
        if (filter.server === undefined || key.server === filter.server) keys.push(key)
      } catch {}
    }
    if (keys.length === 0) return []
    const pipeline = this.#redis.pipeline()
    for (const key of keys) pipeline.hmget(this.#entryKey(key), 's', 'e', 'c')
    const replies = (await pipeline.exec()) ?? []
    const out: VaultListing[] = []
    const gone: string[] = []
    keys.forEach((key, i) => {
      const [err, value] = replies[i] ?? [null, null]
      const [sealed, expires, scope] = (err === null ? value : [null, null, null]) as [string | null, string | null, string | null]
      if (sealed === null) { gone.push(entryName(key)); return }
      out.push({ key, expiresAt: expires === null || expires === '' ? null : Number(expires), keyId: this.#ring.keyIdOf(sealed) ?? '?', ...(scope === null ? {} : { scope }) })
    })
    // Entries that expired leave their index line behind: tidied here, the one place that reads it.
    if (gone.length > 0) await this.#redis.hdel(index, ...gone)
    return out
  }
}

function storedOf (fields: Record<string, string>): StoredEntry | undefined {
  if (fields.s === undefined) return undefined
  const stored: StoredEntry = { sealed: fields.s, expiresAt: fields.e === undefined || fields.e === '' ? null : Number(fields.e) }
  if (fields.c !== undefined) stored.scope = fields.c
  if (fields.a !== undefined) stored.audience = fields.a
  return stored
}
