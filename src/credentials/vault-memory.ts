// The vault's in-memory twin (one process, no Redis): the same sealing as the Redis twin, so what
// rests in memory is no more readable in a heap dump than in Redis.
import type { VaultKeyRing } from './cipher.js'
import type { Vault, VaultEntry, VaultKey, VaultListing } from './types.js'
import { entryName, keepMs, openEntry, sealEntry, type StoredEntry } from './vault.js'

/** One entry as held: its key, its stored (sealed) form, when it goes. */
export interface HeldEntry { key: VaultKey, stored: StoredEntry, until: number }
type Held = HeldEntry

export class MemoryVault implements Vault {
  readonly #ring: VaultKeyRing
  readonly #entries: Map<string, Held>
  readonly #now: () => number

  /** `entries`: the map to hold them in (tests read one map with several key rings). */
  constructor (ring: VaultKeyRing, options: { now?: () => number, entries?: Map<string, HeldEntry> } = {}) {
    this.#ring = ring
    this.#now = options.now ?? Date.now
    this.#entries = options.entries ?? new Map()
  }

  async put (key: VaultKey, entry: VaultEntry, ttlMs?: number): Promise<void> {
    const keep = keepMs(entry, ttlMs, this.#now())
    this.#entries.set(entryName(key), { key: { ...key }, stored: sealEntry(this.#ring, key, entry), until: keep === 0 ? Infinity : this.#now() + keep })
  }

  async get (key: VaultKey): Promise<VaultEntry | undefined> {
    const held = this.#live(entryName(key))
    return held === undefined ? undefined : openEntry(this.#ring, key, held.stored)
  }

  async delete (key: VaultKey): Promise<void> {
    this.#entries.delete(entryName(key))
  }

  async list (filter: { tenant: string | null, server?: string }): Promise<VaultListing[]> {
    const out: VaultListing[] = []
    for (const name of [...this.#entries.keys()]) {
      const held = this.#live(name)
      if (held === undefined || held.key.tenant !== filter.tenant || (filter.server !== undefined && held.key.server !== filter.server)) continue
      out.push({ key: { ...held.key }, expiresAt: held.stored.expiresAt, keyId: this.#ring.keyIdOf(held.stored.sealed) ?? '?', ...(held.stored.scope === undefined ? {} : { scope: held.stored.scope }) })
    }
    return out
  }

  #live (name: string): Held | undefined {
    const held = this.#entries.get(name)
    if (held !== undefined && held.until <= this.#now()) {
      this.#entries.delete(name)
      return undefined
    }
    return held
  }
}
