// The few parts of oidc-provider (which ships no types) the test authorization server uses.
declare module 'oidc-provider' {
  import type { IncomingMessage, ServerResponse } from 'node:http'

  export interface KoaContextWithOIDC {
    oidc: { params: Record<string, unknown>, client: unknown }
    body: unknown
  }

  interface ResourceServerInfo {
    audience: string
    scope: string
    accessTokenFormat: 'jwt' | 'opaque'
    accessTokenTTL: number
    jwt?: { sign?: { alg: string } }
  }

  class ResourceServerClass {
    constructor (identifier: string, info: ResourceServerInfo)
  }

  class AccessTokenClass {
    constructor (fields: { accountId: string, client: unknown, gty: string, scope: string, resourceServer: ResourceServerClass })
    readonly expiration: number
    save (): Promise<string>
  }

  class OidcError extends Error {
    constructor (description?: string)
  }

  export const errors: { InvalidGrant: typeof OidcError, InvalidTarget: typeof OidcError }

  export default class Provider {
    constructor (issuer: string, configuration: Record<string, unknown>)
    ResourceServer: typeof ResourceServerClass
    AccessToken: typeof AccessTokenClass
    on (event: string, listener: (ctx: KoaContextWithOIDC) => void): this
    registerGrantType (name: string, handler: (ctx: KoaContextWithOIDC) => Promise<void>, params?: string[]): void
    callback (): (req: IncomingMessage, res: ServerResponse) => Promise<void>
  }
}
