// A stdio child's credential (docs/credentials.md, "stdio servers"): the session owner's, obtained
// when the child starts and put in the variable its server's `credentials.env` names. A child
// cannot take a new one while it runs: once it lapses, the supervised session starts a new child
// (with a fresh credential) for the next request (supervised-session.ts).
import { GW_ERR_INTERNAL } from '../core/errors.js'
import type { CallerCredential } from '../credentials/types.js'

/** What a child's environment adds for its credential, and when that credential lapses. */
export interface ChildCredential {
  env: Record<string, string>
  /** Epoch ms; null: no known expiry. */
  expiresAt: number | null
}

/**
 * The variable of the owner's credential. A failure is the source's typed error (consent needed,
 * refused, nothing to exchange, issuer down): the child is not started, and the request that
 * wanted it (an initialize, a takeover's first request) gets that error.
 */
export async function childCredential (server: string, credential: CallerCredential | undefined): Promise<ChildCredential> {
  if (credential === undefined) return { env: {}, expiresAt: null }
  const current = await credential.current()
  if (current === null) return { env: {}, expiresAt: null }
  // The config check requires `env` on a stdio server's non-static block: a missing one is a bug.
  if (current.env === undefined) throw new GW_ERR_INTERNAL(`server '${server}': the credential names no environment variable`)
  return { env: { [current.env.name]: current.env.value }, expiresAt: current.expiresAt }
}

/** Whether a credential given to a child has lapsed by `now`. */
export function credentialLapsed (expiresAt: number | null | undefined, now = Date.now()): boolean {
  return expiresAt !== null && expiresAt !== undefined && expiresAt <= now
}
