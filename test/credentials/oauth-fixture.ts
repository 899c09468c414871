// What the credential tests share: a "user" issuer whose JWTs clients present, the authorization
// server, and a captured pino log to assert no secret reaches.
import { randomBytes } from 'node:crypto'
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey } from 'jose'
import { pino, type Logger } from 'pino'
import type { Test } from 'tap'
import { parseVaultKeys } from '../../src/credentials/cipher.js'
import { MemoryVault } from '../../src/credentials/vault-memory.js'
import { CredentialSources } from '../../src/credentials/sources.js'
import type { GatewayMetrics } from '../../src/telemetry/metrics.js'
import { startOAuthServer, type OAuthServer } from '../helpers/oauth-server.js'

export const USER_ISSUER = 'https://users.example'

export interface UserIssuer {
  /** A JWT for `subject`, as a client presents it to the gateway. */
  mint: (subject: string, expiresInS?: number) => Promise<string>
  jwks: { keys: Array<Record<string, unknown>> }
}

export async function userIssuer (): Promise<UserIssuer> {
  const { privateKey, publicKey } = await generateKeyPair('RS256', { extractable: true })
  const jwk = { ...(await exportJWK(publicKey)), kid: 'user-1', alg: 'RS256' }
  return {
    jwks: { keys: [jwk] },
    mint: async (subject, expiresInS = 3600) => await new SignJWT({}).setProtectedHeader({ alg: 'RS256', kid: 'user-1' })
      .setIssuer(USER_ISSUER).setSubject(subject).setAudience('https://gw.example/mcp/api').setIssuedAt()
      .setExpirationTime(Math.floor(Date.now() / 1000) + expiresInS).sign(privateKey as CryptoKey)
  }
}

export interface CapturedLog { log: Logger, lines: string[] }

export function capturedLog (): CapturedLog {
  const lines: string[] = []
  return { lines, log: pino({ level: 'debug' }, { write: (line: string) => { lines.push(line) } }) }
}

export interface Lookups { calls: Array<[string, string, string]>, metrics: Pick<GatewayMetrics, 'credentialLookup'> }
export function lookups (): Lookups {
  const calls: Array<[string, string, string]> = []
  return { calls, metrics: { credentialLookup: (server, source, outcome) => { calls.push([server, source, outcome]) } } }
}

export interface World {
  users: UserIssuer
  as: OAuthServer
  captured: CapturedLog
  counted: Lookups
  vault: MemoryVault
  sources: CredentialSources
}

export async function world (t: Test): Promise<World> {
  const users = await userIssuer()
  const as = await startOAuthServer(t, users.jwks as never, USER_ISSUER)
  const captured = capturedLog()
  const counted = lookups()
  const vault = new MemoryVault(parseVaultKeys(`k1:${randomBytes(32).toString('base64')}`))
  const sources = new CredentialSources({ vault, log: captured.log, metrics: counted.metrics })
  t.teardown(() => { sources.close() })
  return { users, as, captured, counted, vault, sources }
}
