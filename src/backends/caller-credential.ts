// The session owner's own credential on a backend request (credentials/, docs/credentials.md).
import type { Dispatcher } from 'undici'
import { GW_ERR_CREDENTIAL_REJECTED, withData } from '../core/errors.js'
import type { CallerCredential } from '../credentials/types.js'
import { drain } from './http-io.js'

/**
 * Sends a request with the caller's credential in `headers` (set in place). A 401 answer to it:
 * the credential is dropped, a fresh one obtained and the request sent once more; a second 401 is
 * GW_ERR_CREDENTIAL_REJECTED. Shared by the session transports and the 2026-07-28 relay.
 */
export async function withCallerCredential (server: string, credential: CallerCredential, headers: Record<string, string>,
  signal: AbortSignal | undefined, send: () => Promise<Dispatcher.ResponseData>): Promise<Dispatcher.ResponseData> {
  let used = await credential.current(signal)
  if (used !== null) headers[used.header] = used.value
  const res = await send()
  if (res.statusCode !== 401 || used === null) return res
  await drain(res.body)
  await credential.rejected(used)
  used = await credential.current(signal)
  if (used !== null) headers[used.header] = used.value
  const again = await send()
  if (again.statusCode !== 401) return again
  await drain(again.body)
  await credential.rejected(used ?? { header: '', value: '', expiresAt: null })
  throw withData(new GW_ERR_CREDENTIAL_REJECTED(server), { server, status: 401 })
}

