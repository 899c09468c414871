// Whether an aggregate's member is up, kept the same way by aggregate sessions
// (session-members.ts: each session starts its members, retries a fallen one on a timer) and by
// 2026-07-28 requests (stateless.ts: a member found down is asked again by the first request after
// its retry time). A member that is down is left out of the merged lists and its calls fail at once.
import { compileToolPolicy } from '../../auth/tool-policy.js'
import type { AggregateMemberConfig } from '../../config/schema.js'
import { GW_ERR_BACKEND_TIMEOUT, GW_ERR_BACKEND_UNAVAILABLE, isGatewayError, type GatewayError } from '../../core/errors.js'
import { withTimeout, type CatalogueMember } from './catalogue.js'

/** Why a member is not up before its first start has ended. */
export const NOT_STARTED = 'not started'
/** How long a member that is down is left out before it is tried again. */
export const MEMBER_RETRY_MS = 5000

/** A member as an aggregate keeps it: what the catalogue sees, and why it is down. */
export interface MemberState extends CatalogueMember {
  /**
   * The caller's credential toward the member that could not be had (consent needed, refused,
   * nothing to exchange) while that is why it is down: requests routed to it get this error, so
   * the client learns what to do (docs/credentials.md, "Aggregates").
   */
  credentialError: GatewayError | null
}

/** A configured member as the catalogue sees it, before its first start. */
export function memberOf (config: AggregateMemberConfig): MemberState {
  return {
    server: config.server,
    prefix: config.prefix ?? config.server,
    tools: config.tools !== undefined ? compileToolPolicy(config.tools) : undefined,
    down: NOT_STARTED,
    info: null,
    credentialError: null
  }
}

/** A member's start (what it says of itself), failing with a timeout past `ms`. */
export async function startWithin<T> (server: string, start: Promise<T>, ms: number): Promise<T> {
  return await withTimeout(start, ms, () => new GW_ERR_BACKEND_TIMEOUT(server, ms))
}

/**
 * Records why a member is down. True when this is a new fall (it was up, or this was its first
 * start): worth one warning and one count of the member left out, where a retry failing again is not.
 */
export function markDown (member: MemberState, reason: string, cause?: unknown): boolean {
  const fell = member.down === null || member.down === NOT_STARTED
  member.down = reason
  // A fall told without its error (the connection of a failed start reported gone) keeps the one
  // its start gave: the credential's error stays what requests routed to the member get.
  if (cause !== undefined) member.credentialError = isCredentialError(cause) ? cause : null
  return fell
}

/** The member started: up, in lists again. */
export function markUp (member: MemberState): void {
  member.down = null
  member.credentialError = null
}

/** What a request routed to a member that is down gets: its credential's own error, else unavailable. */
export function downError (member: MemberState): GatewayError {
  return member.credentialError ?? new GW_ERR_BACKEND_UNAVAILABLE(member.server, `aggregate member is down (${member.down ?? 'up'})`)
}

/** A caller's credential that could not be had (GW_ERR_CREDENTIAL_*). */
export function isCredentialError (err: unknown): err is GatewayError {
  return isGatewayError(err) && err.code.startsWith('GW_ERR_CREDENTIAL_')
}
