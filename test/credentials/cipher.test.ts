import t from 'tap'
import { parseVaultKeys } from '../../src/credentials/cipher.js'
import { newKey } from './contract-vault.js'

t.test('keys are checked without being quoted', async t => {
  t.throws(() => parseVaultKeys(undefined), /MCPGW_VAULT_KEYS is not set/)
  t.throws(() => parseVaultKeys('nokeyid'), /entry 1 needs a key id/)
  t.throws(() => parseVaultKeys('k1:c2hvcnQ='), /key k1 must be 32 bytes/)
  const key = newKey()
  t.throws(() => parseVaultKeys(`a:${key},a:${key}`), /given twice/)
  try { parseVaultKeys('k1:c2VjcmV0LWtleS1zZWNyZXQ=') } catch (err) { t.notMatch((err as Error).message, 'c2VjcmV0') }
})

t.test('a sealed value opens only with its context, and not once altered', async t => {
  const ring = parseVaultKeys(`k1:${newKey()}`)
  const sealed = ring.seal('the-secret', 'ctx-a')
  t.match(sealed, /^v1\.k1\./)
  t.notMatch(sealed, 'the-secret')
  t.equal(ring.open(sealed, 'ctx-a'), 'the-secret')
  t.equal(ring.open(sealed, 'ctx-b'), undefined)
  const parts = sealed.split('.')
  const body = Buffer.from(parts[3]!, 'base64url')
  body[0] = body[0]! ^ 1
  t.equal(ring.open([...parts.slice(0, 3), body.toString('base64url')].join('.'), 'ctx-a'), undefined)
  t.equal(ring.open('garbage', 'ctx-a'), undefined)
  t.not(ring.seal('the-secret', 'ctx-a'), sealed, 'a fresh nonce each time')
})
