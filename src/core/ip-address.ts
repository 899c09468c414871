// IP addresses and CIDRs as the config names them (`http.trustedProxies`): what config checks them
// with and what the HTTP layer matches client addresses against.
import { isIP, isIPv4 } from 'node:net'

/** `::ffff:10.0.0.1` (an IPv4 peer on a dual-stack socket) is `10.0.0.1`. */
export function normalize (address: string): string {
  const lower = address.toLowerCase()
  if (lower.startsWith('::ffff:') && isIPv4(lower.slice(7))) return lower.slice(7)
  return lower
}

/** Why an entry of `http.trustedProxies` is not an address or CIDR, or undefined when it is one. */
export function trustedProxyProblem (entry: string): string | undefined {
  const [address = '', bits, ...rest] = entry.split('/')
  const family = isIP(address)
  if (family === 0 || rest.length > 0) return 'must be an IPv4 or IPv6 address, or a CIDR such as 10.0.0.0/8 or fd00::/8'
  if (bits === undefined) return undefined
  const max = family === 4 ? 32 : 128
  if (!/^\d{1,3}$/.test(bits) || Number(bits) > max) return `has a prefix length that is not 0 to ${max}`
  return undefined
}
