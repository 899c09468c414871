// The client's address, for the failed-authentication budget, audit lines and logs. By default it
// is the TCP peer's. Behind a proxy, load balancer or NAT every client would share the proxy's
// address (and its budget), so `http.trustedProxies` names the proxies whose forwarding header is
// believed: the header is read right to left, each hop the proxies added is skipped while the
// address that sent it is trusted, and the first untrusted address is the client (the algorithm of
// proxy-addr and of nginx's real_ip_recursive). Anything left of that is the client's own text and
// never believed, so a client cannot pick its address, and therefore its budget.
//
// Hand-written rather than Fastify's `trustProxy` (proxy-addr): that also makes `request.host` and
// `request.protocol` believe X-Forwarded-Host and X-Forwarded-Proto, which the Host guard must not
// (it checks what the client sent to this listener); it reads only X-Forwarded-For, not RFC 7239
// `Forwarded`; and the admin listener, a Fastify instance of its own, needs the same answer.
// `net.BlockList` does the CIDR matching.
import { BlockList, isIP, isIPv4 } from 'node:net'
import { normalize } from '../core/ip-address.js'
import type { FastifyRequest } from 'fastify'

/** Which header a trusted proxy sets: only that one is read (a client can send the other). */
export type ForwardedHeader = 'x-forwarded-for' | 'forwarded'

export interface ClientAddressSettings {
  /** Addresses or CIDRs of proxies whose forwarding header is believed; empty: none. */
  trustedProxies: readonly string[]
  forwardedHeader: ForwardedHeader
}

/** The client address of a request. */
export type AddressOf = (req: FastifyRequest) => string

/** Hops read at most from one header: a longer chain is a client's padding, not proxies. */
const MAX_HOPS = 32

function blockListOf (entries: readonly string[]): BlockList {
  const list = new BlockList()
  for (const entry of entries) {
    const [address = '', bits] = entry.split('/')
    const normal = normalize(address)
    const type = isIPv4(normal) ? 'ipv4' : 'ipv6'
    if (bits === undefined) list.addAddress(normal, type)
    else list.addSubnet(normal, type === 'ipv4' && !isIPv4(address) ? Math.max(0, Number(bits) - 96) : Number(bits), type)
  }
  return list
}

/** The address of a node: `192.0.2.1`, `192.0.2.1:8080`, `[2001:db8::1]:4711`, `2001:db8::1`. */
function hostOf (node: string): string {
  if (node.startsWith('[')) return node.slice(1, node.indexOf(']') < 0 ? undefined : node.indexOf(']'))
  const colon = node.indexOf(':')
  return colon >= 0 && node.indexOf(':', colon + 1) < 0 ? node.slice(0, colon) : node
}

/** The addresses of an X-Forwarded-For value, left (the farthest) to right (the nearest). */
function xForwardedFor (value: string): string[] {
  return value.split(',').slice(-MAX_HOPS).map(hop => hostOf(hop.trim()))
}

/**
 * The `for=` nodes of a Forwarded value (RFC 7239 section 4), left to right; an element without
 * one is '' (an unknown hop). A node is `192.0.2.1`, `"192.0.2.1:8080"`, `"[2001:db8::1]:4711"`,
 * `unknown` or an obfuscated `_name`; only the address part is kept.
 */
function forwarded (value: string): string[] {
  const elements: string[] = []
  let current = ''
  let quoted = false
  for (const ch of value) {
    if (ch === '"') quoted = !quoted
    if (ch === ',' && !quoted) { elements.push(current); current = '' } else current += ch
  }
  elements.push(current)
  return elements.slice(-MAX_HOPS).map(element => {
    for (const pair of element.split(';')) {
      const eq = pair.indexOf('=')
      if (eq < 0 || pair.slice(0, eq).trim().toLowerCase() !== 'for') continue
      let node = pair.slice(eq + 1).trim()
      if (node.startsWith('"') && node.endsWith('"') && node.length >= 2) node = node.slice(1, -1)
      return hostOf(node)
    }
    return ''
  })
}

/** The function that tells a request's client address under these settings. */
export function clientAddresses (settings: ClientAddressSettings): AddressOf {
  const peerOf = (req: FastifyRequest): string => normalize(req.raw.socket.remoteAddress ?? '')
  if (settings.trustedProxies.length === 0) return peerOf
  const trusted = blockListOf(settings.trustedProxies)
  const isTrusted = (address: string): boolean => isIP(address) !== 0 && trusted.check(address, isIPv4(address) ? 'ipv4' : 'ipv6')
  const header = settings.forwardedHeader
  const parse = header === 'forwarded' ? forwarded : xForwardedFor
  return req => {
    let address = peerOf(req)
    if (!isTrusted(address)) return address
    const value = req.headers[header]
    if (typeof value !== 'string' || value === '') return address
    const hops = parse(value)
    for (let i = hops.length - 1; i >= 0; i--) {
      const hop = normalize(hops[i] ?? '')
      // `unknown`, an obfuscated name, a port or garbage: a trusted proxy could not tell who sent
      // it, so the last address that is known stands for the client.
      if (isIP(hop) === 0) return address
      address = hop
      if (!isTrusted(address)) return address
    }
    return address
  }
}
