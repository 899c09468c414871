// What a backend request needs to carry a credential of the caller's own (docs/credentials.md):
// a CredentialSource per (tenant, server) that answers "which header, which value, until when"
// for one caller, and a Vault where the tokens it obtained rest, encrypted.
//
// The names here are what other modules (routing, backends, the user-authorization source) build
// on: keep them stable.
import type { CredentialsConfig } from '../config/schema.js'

export type { CredentialsConfig }

/** The four ways a server's backend requests get their credential (config `credentials.source`). */
export type CredentialSourceKind = 'static' | 'token-exchange' | 'client-credentials' | 'user-authorization'

/**
 * Who a credential is for. `tenant` and `subjectDigest` are the Principal's (auth/principal.ts);
 * `subject` (the JWT's subject or the API key id) and `token` (the client's verified JWT, as it was
 * presented) exist only while the client request that carried them is being handled: neither is
 * ever stored, logged or put in a session record.
 */
export interface CredentialCaller {
  tenant: string | null
  subjectDigest: string
  subject?: string
  /** The client's verified bearer JWT: the subject token of an RFC 8693 exchange. */
  token?: string
}

/** One credential for one backend request. */
export interface Credential {
  /** The header it goes in, lower-cased (`authorization` unless the config names another). */
  header: string
  /** The header's whole value (`Bearer <token>` for the authorization header). */
  value: string
  /** Epoch ms after which it must not be sent; null: no known expiry. */
  expiresAt: number | null
  /**
   * Where a stdio child takes it: the variable the block's `env` names and its value (`envTemplate`
   * with the bare token). Set by every source when the block names `env` (credential.ts).
   */
  env?: { name: string, value: string }
}

/** The server a credential is asked for: its name and the config that says how. */
export interface CredentialTarget {
  server: string
  config: CredentialsConfig
}

/**
 * A source of backend credentials, one per (tenant, server) config (credentials/sources.ts makes
 * them). `credentialFor` answers from its cache when it can; it never hangs (every call to an
 * authorization server has a deadline) and fails with a typed error from core/errors.ts:
 * GW_ERR_CREDENTIAL_ISSUER_UNAVAILABLE (authorization server unreachable, slow or broken),
 * GW_ERR_CREDENTIAL_REFUSED (it refused the grant), GW_ERR_CREDENTIAL_REQUIRED (nothing to
 * exchange: no client token on this request), GW_ERR_CREDENTIAL_CONSENT_REQUIRED (the user must
 * authorise at a URL first).
 */
export interface CredentialSource {
  readonly kind: CredentialSourceKind
  /** null: nothing to add (static: the configured headers/env already carry it). */
  credentialFor (who: CredentialCaller, target: CredentialTarget, signal?: AbortSignal): Promise<Credential | null>
  /**
   * The backend answered 401 to `rejected`: forget it (cache and vault), so the next credentialFor
   * obtains a new one. The caller retries once, then fails with GW_ERR_CREDENTIAL_REJECTED.
   */
  invalidate (who: CredentialCaller, target: CredentialTarget, rejected: Credential): Promise<void>
  /** Stops timers and drops in-memory caches (a reload replaced the config, or shutdown). */
  close (): void
}

/**
 * What a backend connection holds to authenticate its requests as one caller: the source and
 * target bound to that caller. HTTP backends call `current()` before each request and `rejected()`
 * once on a 401; `update()` hands in the newest client token (each POST carries one).
 */
export interface CallerCredential {
  readonly caller: CredentialCaller
  current (signal?: AbortSignal): Promise<Credential | null>
  rejected (credential: Credential): Promise<void>
  /** The client's newest verified token (a later POST of the same session); the subject must match. */
  update (token: string | undefined): void
}

/**
 * Where a vault entry is filed. `subjectDigest` null: the tenant's own credential toward the
 * server (client-credentials), shared by its users. `audience` tells apart the tokens one user
 * holds toward several audiences of one server config (token-exchange caches per (subject, audience)).
 */
export interface VaultKey {
  tenant: string | null
  server: string
  subjectDigest: string | null
  audience?: string
}

/** What rests in the vault: the secret fields are encrypted as one sealed value; the rest is metadata. */
export interface VaultEntry {
  /** The access token (secret). */
  accessToken: string
  /** A refresh token, when the grant gave one (secret; user-authorization). */
  refreshToken?: string
  /** Epoch ms; null when the token said nothing. */
  expiresAt: number | null
  /** Granted scopes, as the authorization server reported them (not secret). */
  scope?: string
}

/** What an admin listing shows of one entry: never the secret fields. */
export interface VaultListing {
  key: VaultKey
  expiresAt: number | null
  /** Id of the encryption key the entry was sealed with (rotation progress). */
  keyId: string
  /** Granted scopes, when the authorization server reported them. */
  scope?: string
}

/** Encrypted storage of backend tokens: a memory twin and a Redis twin (credentials/vault-*.ts). */
export interface Vault {
  /** Stores `entry` under `key`, sealed with the current write key; kept at most `ttlMs` (0: until expiresAt, else for good). */
  put (key: VaultKey, entry: VaultEntry, ttlMs?: number): Promise<void>
  /** The entry, opened with whichever configured key sealed it; undefined when absent or unreadable (unknown key id, tampered). */
  get (key: VaultKey): Promise<VaultEntry | undefined>
  delete (key: VaultKey): Promise<void>
  /** Entries of one tenant (and server), for the admin API: metadata only. */
  list (filter: { tenant: string | null, server?: string }): Promise<VaultListing[]>
}

/** Outcome label of a credential lookup (metrics `mcpgw_credential_requests_total{outcome}`). */
export type CredentialOutcome = 'cached' | 'issued' | 'refused' | 'refused_cached' | 'unavailable' | 'missing' | 'consent_required' | 'rejected'

/** Where the user-authorization source's redirect comes back, under its `redirectBaseUrl`. */
export const AUTHORIZATION_CALLBACK_PATH = '/oauth/callback'

// The user-authorization source's consent flow (the link, the callback, revocation) is
// UserAuthorizationSource's own (user-authorization.ts), served by http/oauth-consent.ts: its
// callback needs the pending authorization and the browser's binding, which no caller-level
// interface here would carry.
