// The consent store's Redis twin (consent-store.ts): one string per record with its TTL; `take` is
// GETDEL, so of two replicas handed the same state only one finishes the authorization.
import type { Redis } from '../state/redis/client.js'
import { parseRecord, type ConsentRecord, type ConsentStore } from './consent-store.js'

export class RedisConsentStore implements ConsentStore {
  readonly #redis: Redis
  readonly #prefix: string

  constructor (redis: Redis, keyPrefix: string) {
    this.#redis = redis
    this.#prefix = `${keyPrefix}:consent:`
  }

  async put (id: string, record: ConsentRecord, ttlMs: number): Promise<void> {
    await this.#redis.set(this.#prefix + id, JSON.stringify(record), 'PX', Math.max(1, ttlMs))
  }

  async get (id: string): Promise<ConsentRecord | undefined> {
    return parseRecord(await this.#redis.get(this.#prefix + id))
  }

  async take (id: string): Promise<ConsentRecord | undefined> {
    return parseRecord(await this.#redis.getdel(this.#prefix + id))
  }

  async lock (name: string, ttlMs: number): Promise<boolean> {
    return await this.#redis.set(`${this.#prefix}lock:${name}`, '1', 'PX', Math.max(1, ttlMs), 'NX') === 'OK'
  }

  async unlock (name: string): Promise<void> {
    await this.#redis.del(`${this.#prefix}lock:${name}`)
  }
}
