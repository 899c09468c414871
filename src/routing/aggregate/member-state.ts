// Whether an aggregate's member is up, kept the same way by aggregate sessions
// (session-members.ts: each session starts its members, retries a fallen one on a timer) and by
// 2026-07-28 requests (stateless.ts: a member found down is asked again by the first request after
// its retry time). A member that is down is left out of the merged lists and its calls fail at once.
import { compileToolPolicy } from '../../auth/tool-policy.js'
import type { AggregateMemberConfig } from '../../config/schema.js'
import { GW_ERR_BACKEND_TIMEOUT } from '../../core/errors.js'
import { withTimeout, type CatalogueMember } from './catalogue.js'

/** Why a member is not up before its first start has ended. */
export const NOT_STARTED = 'not started'
/** How long a member that is down is left out before it is tried again. */
export const MEMBER_RETRY_MS = 5000

/** A configured member as the catalogue sees it, before its first start. */
export function memberOf (config: AggregateMemberConfig): CatalogueMember {
  return {
    server: config.server,
    prefix: config.prefix ?? config.server,
    tools: config.tools !== undefined ? compileToolPolicy(config.tools) : undefined,
    down: NOT_STARTED,
    info: null
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
export function markDown (member: CatalogueMember, reason: string): boolean {
  const fell = member.down === null || member.down === NOT_STARTED
  member.down = reason
  return fell
}
