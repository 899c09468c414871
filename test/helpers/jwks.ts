// A JWT issuer for tests: key pairs generated with jose, a JWKS endpoint on a free loopback port
// that counts its fetches and can rotate keys or fail, and tokens minted per case.
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { Test } from 'tap'
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey, type JWK, type JWTPayload } from 'jose'

export interface IssuerKey { kid: string, alg: string, privateKey: CryptoKey, jwk: JWK }

export async function newIssuerKey (kid: string, alg = 'RS256'): Promise<IssuerKey> {
  const { privateKey, publicKey } = await generateKeyPair(alg, { extractable: true })
  return { kid, alg, privateKey, jwk: { ...await exportJWK(publicKey), kid, alg, use: 'sig' } }
}

export interface TestIssuer {
  issuer: string
  jwksUri: string
  /** Fetches of the key set so far. */
  fetches: number
  /** The keys the JWKS endpoint publishes. */
  keys: IssuerKey[]
  /** 'ok', or answer 500, or close connections without answering. */
  mode: 'ok' | 'error' | 'hang-up'
  /** Signs a token with `key` (default the first published key); claims override the defaults. */
  mint: (claims?: JWTPayload, options?: { key?: IssuerKey, header?: Record<string, unknown>, expiresIn?: string | number }) => Promise<string>
  stop: () => Promise<void>
}

export async function startIssuer (t: Test, issuer: string, defaults: JWTPayload = {}): Promise<TestIssuer> {
  const state: TestIssuer = {
    issuer,
    jwksUri: '',
    fetches: 0,
    keys: [await newIssuerKey('k1')],
    mode: 'ok',
    mint: async (claims = {}, options = {}) => {
      const key = options.key ?? state.keys[0]
      if (key === undefined) throw new Error('no key')
      const jwt = new SignJWT({ ...defaults, ...claims })
        .setProtectedHeader({ alg: key.alg, kid: key.kid, typ: 'at+jwt', ...options.header })
        .setIssuer(typeof claims.iss === 'string' ? claims.iss : issuer)
        .setIssuedAt()
      if (options.expiresIn !== undefined) jwt.setExpirationTime(options.expiresIn)
      else if (!('exp' in claims)) jwt.setExpirationTime('5m')
      return await jwt.sign(key.privateKey)
    },
    stop: async () => {}
  }
  const server: Server = createServer((req, res) => {
    state.fetches++
    if (state.mode === 'hang-up') { req.socket.destroy(); return }
    if (state.mode === 'error') { res.writeHead(500).end('down'); return }
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ keys: state.keys.map(k => k.jwk) }))
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  state.jwksUri = `http://127.0.0.1:${(server.address() as AddressInfo).port}/jwks.json`
  state.stop = async () => {
    server.closeAllConnections()
    await new Promise<void>(resolve => server.close(() => resolve()))
  }
  t.teardown(state.stop)
  return state
}

/** An unsigned token (`alg: none`), which must never be accepted. */
export function unsignedToken (payload: JWTPayload): string {
  const part = (value: unknown): string => Buffer.from(JSON.stringify(value)).toString('base64url')
  return `${part({ alg: 'none', typ: 'JWT' })}.${part(payload)}.`
}
