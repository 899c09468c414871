import t from 'tap'
import { RedisVault } from '../../src/credentials/vault-redis.js'
import { entryName } from '../../src/credentials/vault.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import type { Redis } from '../../src/state/redis/client.js'
import { vaultContract } from './contract-vault.js'

const server = await startRedis(t)
// One prefix per test, so a test's second vault (another key ring) reads the first one's entries.
const prefixes = new WeakMap<object, { redis: Redis, prefix: string }>()
const of = new WeakMap<RedisVault, { redis: Redis, prefix: string }>()

vaultContract(t, {
  async make (t, ring) {
    let where = prefixes.get(t)
    if (where === undefined) { where = { redis: await testRedis(t, server.url), prefix: randomPrefix() }; prefixes.set(t, where) }
    const vault = new RedisVault(where.redis, ring, where.prefix)
    of.set(vault, where)
    return vault
  },
  async dump (vault) {
    const { redis, prefix } = of.get(vault as RedisVault)!
    const keys = await redis.keys(`${prefix}:*`)
    const out: unknown[] = []
    for (const key of keys) out.push(key, await redis.hgetall(key))
    return JSON.stringify(out)
  },
  async swap (vault, from, to) {
    const { redis, prefix } = of.get(vault as RedisVault)!
    const sealed = await redis.hget(`${prefix}:vault:{${from.tenant}}:${entryName(from)}`, 's')
    await redis.hset(`${prefix}:vault:{${to.tenant}}:${entryName(to)}`, 's', sealed!)
  }
})

t.test('entries carry the tenant as hash tag and expire in Redis', async t => {
  const { parseVaultKeys } = await import('../../src/credentials/cipher.js')
  const { newKey } = await import('./contract-vault.js')
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const vault = new RedisVault(redis, parseVaultKeys(`k:${newKey()}`), prefix)
  const key = { tenant: 'acme', server: 'api', subjectDigest: 'd'.repeat(32) }
  await vault.put(key, { accessToken: 'x', expiresAt: Date.now() + 60_000 })
  const ttl = await redis.pttl(`${prefix}:vault:{acme}:${entryName(key)}`)
  t.ok(ttl > 50_000 && ttl <= 60_000, `ttl ${ttl}`)
})
