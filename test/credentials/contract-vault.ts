// What every vault twin must do: sealed round trips per key, expiry, listing without secrets, key
// rotation (old keys open, the first key seals) and refusal of values altered or moved.
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'
import { parseVaultKeys, type VaultKeyRing } from '../../src/credentials/cipher.js'
import type { Vault, VaultKey } from '../../src/credentials/types.js'

export const newKey = (): string => randomBytes(32).toString('base64')

/** A vault twin over a key ring; `raw` reads what it stored for one key, as stored. */
export interface VaultMaker {
  make: (t: Test, ring: VaultKeyRing) => Promise<Vault>
  /** Every stored byte of the vault, as text: the secrets must not be in it. */
  dump: (vault: Vault) => Promise<string>
  /** Replaces the stored sealed value of `from` by that of `to` (a value moved between entries). */
  swap: (vault: Vault, from: VaultKey, to: VaultKey) => Promise<void>
}

const alice: VaultKey = { tenant: 'acme', server: 'api', subjectDigest: 'a'.repeat(32), audience: 'https://api.example' }
const bob: VaultKey = { tenant: 'acme', server: 'api', subjectDigest: 'b'.repeat(32), audience: 'https://api.example' }
const tenantWide: VaultKey = { tenant: 'acme', server: 'cc', subjectDigest: null }

export function vaultContract (t: Test, maker: VaultMaker): void {
  const k1 = `k1:${newKey()}`
  const k2 = `k2:${newKey()}`

  t.test('entries round-trip per key, and never rest readable', async t => {
    const vault = await maker.make(t, parseVaultKeys(k1))
    await vault.put(alice, { accessToken: 'alice-secret-token', expiresAt: Date.now() + 60_000, scope: 'read' })
    await vault.put(bob, { accessToken: 'bob-secret-token', refreshToken: 'bob-refresh', expiresAt: null })
    await vault.put(tenantWide, { accessToken: 'tenant-secret-token', expiresAt: Date.now() + 60_000 })
    t.equal((await vault.get(alice))?.accessToken, 'alice-secret-token')
    t.equal((await vault.get(alice))?.scope, 'read')
    t.same(await vault.get(bob), { accessToken: 'bob-secret-token', refreshToken: 'bob-refresh', expiresAt: null })
    t.equal((await vault.get(tenantWide))?.accessToken, 'tenant-secret-token')
    t.equal(await vault.get({ ...alice, audience: 'other' }), undefined, 'another audience is another entry')
    t.equal(await vault.get({ ...alice, tenant: 'other' }), undefined, 'another tenant is another entry')
    const dump = await maker.dump(vault)
    for (const secret of ['alice-secret-token', 'bob-secret-token', 'bob-refresh', 'tenant-secret-token']) t.notMatch(dump, secret, `${secret} is not stored in clear`)
    await vault.delete(alice)
    t.equal(await vault.get(alice), undefined)
    t.equal((await vault.get(bob))?.accessToken, 'bob-secret-token')
  })

  t.test('an entry lasts until its token expires (or its ttl)', async t => {
    const vault = await maker.make(t, parseVaultKeys(k1))
    await vault.put(alice, { accessToken: 'x', expiresAt: Date.now() + 150 })
    await vault.put(bob, { accessToken: 'y', expiresAt: null }, 150)
    t.ok(await vault.get(alice))
    await sleep(300)
    t.equal(await vault.get(alice), undefined)
    t.equal(await vault.get(bob), undefined)
  })

  t.test('the listing names entries and their key id, no secret', async t => {
    const vault = await maker.make(t, parseVaultKeys(k1))
    await vault.put(alice, { accessToken: 'alice-secret-token', expiresAt: 4_000_000_000_000 })
    await vault.put(tenantWide, { accessToken: 'tenant-secret-token', expiresAt: 4_000_000_000_000 })
    await vault.put({ ...alice, tenant: 'other' }, { accessToken: 'z', expiresAt: null })
    const all = await vault.list({ tenant: 'acme' })
    t.same(all.map(l => l.key.server).sort(), ['api', 'cc'])
    t.same(all.map(l => l.keyId), ['k1', 'k1'])
    t.notMatch(JSON.stringify(all), 'secret')
    const api = await vault.list({ tenant: 'acme', server: 'api' })
    t.same(api, [{ key: alice, expiresAt: 4_000_000_000_000, keyId: 'k1' }])
  })

  t.test('rotation: a new first key seals, the old one still opens; a retired key opens nothing', async t => {
    const old = await maker.make(t, parseVaultKeys(k1))
    await old.put(alice, { accessToken: 'sealed-by-k1', expiresAt: null })
    // The same store read with the rotated ring (k2 first, k1 kept).
    const rotated = await maker.make(t, parseVaultKeys(`${k2},${k1}`))
    t.equal((await rotated.get(alice))?.accessToken, 'sealed-by-k1')
    await rotated.put(bob, { accessToken: 'sealed-by-k2', expiresAt: null })
    t.same((await rotated.list({ tenant: 'acme' })).map(l => [l.key.subjectDigest, l.keyId]).sort(), [['a'.repeat(32), 'k1'], ['b'.repeat(32), 'k2']])
    const retired = await maker.make(t, parseVaultKeys(k2))
    t.equal(await retired.get(alice), undefined, 'k1 retired: its entries are unreadable')
    t.equal((await retired.get(bob))?.accessToken, 'sealed-by-k2')
  })

  t.test('a value moved to another entry does not open there', async t => {
    const vault = await maker.make(t, parseVaultKeys(k1))
    await vault.put(alice, { accessToken: 'alice-secret-token', expiresAt: null })
    await vault.put(bob, { accessToken: 'bob-secret-token', expiresAt: null })
    await maker.swap(vault, alice, bob)
    t.equal(await vault.get(bob), undefined, "alice's token cannot be read as bob's")
  })
}
