import t from 'tap'
import { MemoryVault, type HeldEntry } from '../../src/credentials/vault-memory.js'
import { entryName } from '../../src/credentials/vault.js'
import { vaultContract } from './contract-vault.js'

// One map per test, so a test's second vault (another key ring) reads the first one's entries.
const maps = new WeakMap<object, Map<string, HeldEntry>>()
const mapOf = new WeakMap<MemoryVault, Map<string, HeldEntry>>()

vaultContract(t, {
  async make (t, ring) {
    let entries = maps.get(t)
    if (entries === undefined) { entries = new Map(); maps.set(t, entries) }
    const vault = new MemoryVault(ring, { entries })
    mapOf.set(vault, entries)
    return vault
  },
  async dump (vault) {
    return JSON.stringify([...(mapOf.get(vault as MemoryVault)?.values() ?? [])])
  },
  async swap (vault, from, to) {
    const entries = mapOf.get(vault as MemoryVault)!
    const source = entries.get(entryName(from))!
    const target = entries.get(entryName(to))!
    target.stored = { ...target.stored, sealed: source.stored.sealed }
  }
})
