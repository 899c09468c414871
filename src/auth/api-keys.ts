// API keys: random bearer strings the gateway never stores. The config holds only the hex SHA-256
// of each key; a presented key is hashed and compared in constant time against every digest, so
// neither the comparison nor the position of a match in the list shows in the timing.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto'

/** Every generated key starts with this, so a leaked key is recognisable (secret scanners). */
export const API_KEY_PREFIX = 'mcpgw_'
/** Random bytes in a generated key (256 bits). */
export const API_KEY_BYTES = 32

export function generateApiKey (): string {
  return `${API_KEY_PREFIX}${randomBytes(API_KEY_BYTES).toString('base64url')}`
}

/** The hex SHA-256 of a key: what the config holds. */
export function apiKeyDigest (key: string): string {
  return createHash('sha256').update(key, 'utf8').digest('hex')
}

/** The config line for a key, ready to paste under the tenant's `apiKeys`. */
export function apiKeyConfigLine (id: string, key: string): string {
  return `- { id: ${id}, sha256: "${apiKeyDigest(key)}" }`
}

export interface ApiKeyEntry {
  tenant: string
  /** The key's id from config: the subject of its principal. */
  id: string
  digest: Buffer
}

/** Finds the entry whose digest matches the presented key; every entry is compared. */
export function matchApiKey<E extends ApiKeyEntry> (entries: readonly E[], presented: string): E | null {
  const digest = createHash('sha256').update(presented, 'utf8').digest()
  let found: E | null = null
  for (const entry of entries) {
    // No early exit: the time taken does not depend on where (or whether) the key matches.
    if (timingSafeEqual(entry.digest, digest) && found === null) found = entry
  }
  return found
}
