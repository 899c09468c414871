// What the admin API shows and does about users' consents (http/admin/consents.ts): who has
// consented to which server, until when, with which scope and under which vault key; and revoking
// one (at the authorization server where it offers RFC 7009 revocation, and in the vault). Never a
// token: the listing reads the vault's metadata only.
import type { UserAuthorizationSource } from './user-authorization.js'
import type { Vault } from './types.js'

export interface ConsentListing {
  tenant: string | null
  server: string
  subjectDigest: string
  expiresAt: number | null
  scope: string | null
  keyId: string
}

export interface ConsentAdminDeps {
  vault: Vault
  /** The tenants configured now (null: the one anonymous tenant, without tenants). */
  tenants: () => Array<string | null>
  sourceOf: (tenant: string | null, server: string) => UserAuthorizationSource | undefined
}

export class ConsentAdmin {
  readonly #deps: ConsentAdminDeps

  constructor (deps: ConsentAdminDeps) {
    this.#deps = deps
  }

  async list (filter: { tenant?: string | undefined, server?: string | undefined }): Promise<ConsentListing[]> {
    const tenants = filter.tenant === undefined ? this.#deps.tenants() : [filter.tenant]
    const out: ConsentListing[] = []
    for (const tenant of tenants) {
      for (const entry of await this.#deps.vault.list({ tenant, ...(filter.server === undefined ? {} : { server: filter.server }) })) {
        const { key } = entry
        if (key.subjectDigest === null || this.#deps.sourceOf(tenant, key.server) === undefined) continue
        out.push({ tenant, server: key.server, subjectDigest: key.subjectDigest, expiresAt: entry.expiresAt, scope: entry.scope ?? null, keyId: entry.keyId })
      }
    }
    return out
  }

  /** undefined: the server has no user-authorization source for that tenant now. */
  async revoke (tenant: string | null, server: string, subjectDigest: string): Promise<{ found: boolean, revokedAtServer: boolean } | undefined> {
    const source = this.#deps.sourceOf(tenant, server)
    return await source?.revoke(source.keyOf(tenant, subjectDigest))
  }
}
