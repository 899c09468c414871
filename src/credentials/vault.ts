// What both vault twins share (vault-memory.ts, vault-redis.ts): an entry's name, and the sealing of
// its secret fields into one value whose additional data is that name.
import { createHash } from 'node:crypto'
import type { VaultKeyRing } from './cipher.js'
import type { VaultEntry, VaultKey } from './types.js'

/**
 * The entry's name: tenant, server, subject digest (`*`: the tenant's own) and a digest of the
 * audience. Tenant and server names cannot hold `/` (config NAME_PATTERN); the audience may hold
 * anything, hence its digest.
 */
export function entryName (key: VaultKey): string {
  const audience = key.audience === undefined ? '-' : createHash('sha256').update(key.audience).digest('base64url').slice(0, 22)
  return `${key.tenant ?? '-'}/${key.server}/${key.subjectDigest ?? '*'}/${audience}`
}

/** What an entry's sealed value holds. */
interface SecretPart { a: string, r?: string }

/** The stored form: the sealed secret and the plain metadata. */
export interface StoredEntry {
  sealed: string
  expiresAt: number | null
  scope?: string
  audience?: string
}

export function sealEntry (ring: VaultKeyRing, key: VaultKey, entry: VaultEntry): StoredEntry {
  const secret: SecretPart = entry.refreshToken === undefined ? { a: entry.accessToken } : { a: entry.accessToken, r: entry.refreshToken }
  const stored: StoredEntry = { sealed: ring.seal(JSON.stringify(secret), entryName(key)), expiresAt: entry.expiresAt }
  if (entry.scope !== undefined) stored.scope = entry.scope
  if (key.audience !== undefined) stored.audience = key.audience
  return stored
}

/** The entry, or undefined when its value does not open (a retired key, an altered or moved value). */
export function openEntry (ring: VaultKeyRing, key: VaultKey, stored: StoredEntry): VaultEntry | undefined {
  const text = ring.open(stored.sealed, entryName(key))
  if (text === undefined) return undefined
  let secret: SecretPart
  try {
    secret = JSON.parse(text) as SecretPart
  } catch {
    return undefined
  }
  if (typeof secret.a !== 'string') return undefined
  const entry: VaultEntry = { accessToken: secret.a, expiresAt: stored.expiresAt }
  if (typeof secret.r === 'string') entry.refreshToken = secret.r
  if (stored.scope !== undefined) entry.scope = stored.scope
  return entry
}

/** How long an entry is kept: the ttl asked for, else until it expires; 0 for no bound. */
export function keepMs (entry: VaultEntry, ttlMs: number | undefined, now = Date.now()): number {
  if (ttlMs !== undefined && ttlMs > 0) return ttlMs
  // A refresh token outlives its access token: such an entry is kept until deleted.
  if (entry.expiresAt === null || entry.refreshToken !== undefined) return 0
  return Math.max(1, entry.expiresAt - now)
}
