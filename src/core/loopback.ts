// Loopback names and addresses: what the Host guard, the listen-address check and the JWKS URL
// check all mean by "this machine only".
import { isIP } from 'node:net'

const LOOPBACK_HOSTS = new Set(['localhost', '127.0.0.1', '[::1]', '::1'])

/** A loopback name or address literal. A hostname merely starting with "127." is not one. */
export function isLoopbackAddress (host: string): boolean {
  return LOOPBACK_HOSTS.has(host.toLowerCase()) || (isIP(host) === 4 && host.startsWith('127.'))
}
