// The vault's sealing: AES-256-GCM (node:crypto) under keys from the environment, each sealed
// value prefixed by the id of the key that sealed it, so keys can rotate: the first configured key
// seals, every configured key opens. GCM authenticates: a value altered in Redis, or moved to
// another entry (the entry's name is the additional data), opens to nothing rather than to garbage.
//
// No library: node:crypto's AES-GCM is the whole of it (a random 96-bit nonce, the 128-bit tag),
// and a JWE (jose, `dir` + A256GCM) would carry the same parts in a format nobody else reads here.
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto'
import { GW_ERR_CONFIG_INVALID } from '../core/errors.js'

/** The environment variable holding the vault's keys: `kid:base64,kid:base64`, the first one writes. */
export const VAULT_KEYS_VARIABLE = 'MCPGW_VAULT_KEYS'

const KEY_ID = /^[A-Za-z0-9_-]{1,32}$/
const VERSION = 'v1'
const IV_BYTES = 12
const TAG_BYTES = 16

export interface VaultKeyRing {
  /** Id of the key new values are sealed with. */
  readonly writeKeyId: string
  seal (plaintext: string, context: string): string
  /** The plaintext, or undefined when no configured key opens it (unknown id, altered, another entry's). */
  open (sealed: string, context: string): string | undefined
  /** The id of the key that sealed `sealed` (listings: how far a rotation got). */
  keyIdOf (sealed: string): string | undefined
}

/**
 * The key ring from `MCPGW_VAULT_KEYS`-style text. Each key is 32 bytes, base64 (or base64url).
 * The message never quotes a key.
 */
export function parseVaultKeys (text: string | undefined): VaultKeyRing {
  if (text === undefined || text.trim() === '') throw new GW_ERR_CONFIG_INVALID(`${VAULT_KEYS_VARIABLE} is not set: credential sources that obtain tokens need a vault key (kid:base64 of 32 random bytes; e.g. k1:$(openssl rand -base64 32))`)
  const keys = new Map<string, Buffer>()
  let writeKeyId: string | undefined
  for (const [i, part] of text.split(',').map(p => p.trim()).filter(p => p !== '').entries()) {
    const colon = part.indexOf(':')
    const id = colon === -1 ? '' : part.slice(0, colon)
    if (!KEY_ID.test(id)) throw new GW_ERR_CONFIG_INVALID(`${VAULT_KEYS_VARIABLE}: entry ${i + 1} needs a key id (letters, digits, _ or -, up to 32) before ':'`)
    const key = Buffer.from(part.slice(colon + 1), 'base64')
    if (key.length !== 32) throw new GW_ERR_CONFIG_INVALID(`${VAULT_KEYS_VARIABLE}: key ${id} must be 32 bytes in base64 (it has ${key.length})`)
    if (keys.has(id)) throw new GW_ERR_CONFIG_INVALID(`${VAULT_KEYS_VARIABLE}: key id ${id} is given twice`)
    keys.set(id, key)
    writeKeyId ??= id
  }
  if (writeKeyId === undefined) throw new GW_ERR_CONFIG_INVALID(`${VAULT_KEYS_VARIABLE} holds no key`)
  return keyRing(writeKeyId, keys)
}

function keyRing (writeKeyId: string, keys: ReadonlyMap<string, Buffer>): VaultKeyRing {
  const writeKey = keys.get(writeKeyId) as Buffer
  return {
    writeKeyId,
    seal (plaintext, context) {
      const iv = randomBytes(IV_BYTES)
      const cipher = createCipheriv('aes-256-gcm', writeKey, iv, { authTagLength: TAG_BYTES })
      cipher.setAAD(Buffer.from(context, 'utf8'))
      const body = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final(), cipher.getAuthTag()])
      return `${VERSION}.${writeKeyId}.${iv.toString('base64url')}.${body.toString('base64url')}`
    },
    open (sealed, context) {
      const [version, id, ivText, bodyText] = sealed.split('.')
      if (version !== VERSION || id === undefined || ivText === undefined || bodyText === undefined) return undefined
      const key = keys.get(id)
      if (key === undefined) return undefined
      const iv = Buffer.from(ivText, 'base64url')
      const body = Buffer.from(bodyText, 'base64url')
      if (iv.length !== IV_BYTES || body.length < TAG_BYTES) return undefined
      try {
        const decipher = createDecipheriv('aes-256-gcm', key, iv, { authTagLength: TAG_BYTES })
        decipher.setAAD(Buffer.from(context, 'utf8'))
        decipher.setAuthTag(body.subarray(body.length - TAG_BYTES))
        return Buffer.concat([decipher.update(body.subarray(0, body.length - TAG_BYTES)), decipher.final()]).toString('utf8')
      } catch {
        return undefined
      }
    },
    keyIdOf (sealed) {
      const [version, id] = sealed.split('.')
      return version === VERSION ? id : undefined
    }
  }
}
