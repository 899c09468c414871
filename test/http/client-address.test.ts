// The client address behind trusted proxies (docs/authentication.md): X-Forwarded-For or RFC 7239
// Forwarded is believed only from `http.trustedProxies`, read right to left, so a client cannot
// choose its address (and so its failed-authentication budget) by sending the header itself.
import type { FastifyRequest } from 'fastify'
import t from 'tap'
import { clientAddresses, type ClientAddressSettings } from '../../src/http/client-address.js'
import { trustedProxyProblem } from '../../src/core/ip-address.js'
import { parseConfig } from '../../src/config/load.js'

function req (peer: string, headers: Record<string, string> = {}): FastifyRequest {
  return { raw: { socket: { remoteAddress: peer } }, headers } as unknown as FastifyRequest
}

const xff = (trustedProxies: string[]): ClientAddressSettings => ({ trustedProxies, forwardedHeader: 'x-forwarded-for' })

t.test('nothing trusted (the default): the TCP peer, whatever the headers say', async t => {
  const of = clientAddresses(xff([]))
  t.equal(of(req('10.0.0.5', { 'x-forwarded-for': '1.2.3.4' })), '10.0.0.5')
  t.equal(of(req('::ffff:10.0.0.5')), '10.0.0.5', 'an IPv4 peer on a dual-stack socket')
})

t.test('X-Forwarded-For: right to left, trusted hops skipped, the first untrusted is the client', async t => {
  const of = clientAddresses(xff(['10.0.0.0/8', '192.168.1.1', 'fd00::/8']))
  t.equal(of(req('10.1.2.3', { 'x-forwarded-for': '203.0.113.7' })), '203.0.113.7', 'one proxy')
  t.equal(of(req('::ffff:10.1.2.3', { 'x-forwarded-for': '203.0.113.7' })), '203.0.113.7', 'a mapped peer matches an IPv4 CIDR')
  t.equal(of(req('10.1.2.3', { 'x-forwarded-for': '6.6.6.6, 203.0.113.7, 192.168.1.1' })), '203.0.113.7', 'two proxies; the client\'s own entry is ignored')
  t.equal(of(req('10.1.2.3', { 'x-forwarded-for': '6.6.6.6,203.0.113.7:5555' })), '203.0.113.7', 'a port is dropped')
  t.equal(of(req('fd00::1', { 'x-forwarded-for': '2001:DB8::9' })), '2001:db8::9', 'IPv6')
  t.equal(of(req('10.1.2.3', { 'x-forwarded-for': '10.0.0.9, 10.0.0.8' })), '10.0.0.9', 'every hop trusted: the farthest')
  t.equal(of(req('10.1.2.3', { 'x-forwarded-for': 'garbage, 10.0.0.8' })), '10.0.0.8', 'garbage: the last address known')
  t.equal(of(req('10.1.2.3')), '10.1.2.3', 'no header: the proxy itself')
  t.equal(of(req('', { 'x-forwarded-for': '1.2.3.4' })), '', 'a socket already gone: no address, nothing believed')
  t.equal(of(req('203.0.113.50', { 'x-forwarded-for': '1.2.3.4' })), '203.0.113.50', 'an untrusted peer\'s header is not believed')
  t.equal(of(req('10.1.2.3', { forwarded: 'for=1.2.3.4' })), '10.1.2.3', 'the other header is not read')
})

t.test('Forwarded (RFC 7239)', async t => {
  const of = clientAddresses({ trustedProxies: ['10.0.0.0/8'], forwardedHeader: 'forwarded' })
  t.equal(of(req('10.0.0.1', { forwarded: 'for=192.0.2.60;proto=http;by=203.0.113.43' })), '192.0.2.60')
  t.equal(of(req('10.0.0.1', { forwarded: 'for=6.6.6.6, for="[2001:db8:cafe::17]:4711"' })), '2001:db8:cafe::17', 'quoted IPv6 with a port')
  t.equal(of(req('10.0.0.1', { forwarded: 'for="192.0.2.43:47011", for=10.0.0.7' })), '192.0.2.43')
  t.equal(of(req('10.0.0.1', { forwarded: 'for=unknown' })), '10.0.0.1', 'unknown: the proxy stands for it')
  t.equal(of(req('10.0.0.1', { forwarded: 'for=_hidden, for=10.0.0.2' })), '10.0.0.2', 'obfuscated')
  t.equal(of(req('10.0.0.1', { forwarded: 'proto=https;for="a,b", for=198.51.100.1' })), '198.51.100.1', 'a quoted comma does not split')
  t.equal(of(req('10.0.0.1', { 'x-forwarded-for': '1.2.3.4' })), '10.0.0.1', 'X-Forwarded-For is not read')
})

t.test('config: entries are checked, with a message per bad one', async t => {
  t.equal(trustedProxyProblem('10.0.0.1'), undefined)
  t.equal(trustedProxyProblem('fd00::/8'), undefined)
  t.equal(trustedProxyProblem('0.0.0.0/0'), undefined)
  t.match(trustedProxyProblem('10.0.0.0/33'), /prefix length that is not 0 to 32/)
  t.match(trustedProxyProblem('nginx'), /IPv4 or IPv6 address, or a CIDR/)
  t.match(trustedProxyProblem('10.0.0.0/8/1'), /IPv4 or IPv6/)
  t.match(trustedProxyProblem('10.0.0.0/x'), /prefix length/)
  const cfg = parseConfig({ http: { trustedProxies: ['172.16.0.0/12'] }, servers: { s: { transport: 'stdio', command: 'node' } } })
  t.same(cfg.http.trustedProxies, ['172.16.0.0/12'])
  t.equal(cfg.http.forwardedHeader, 'x-forwarded-for', 'X-Forwarded-For by default')
  t.same(parseConfig({ servers: { s: { transport: 'stdio', command: 'node' } } }).http.trustedProxies, [], 'nothing trusted by default')
  t.throws(() => parseConfig({ http: { trustedProxies: ['10.0.0.0/8', 'proxy.internal', '::1/129'] }, servers: { s: { transport: 'stdio', command: 'node' } } }), /http\/trustedProxies\/1.*IPv4 or IPv6[^]*trustedProxies\/2.*0 to 128/)
})
