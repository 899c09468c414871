// RFC 9728 protected resource metadata, one document per MCP endpoint (A-RS-1, A-RS-2):
// GET /.well-known/oauth-protected-resource/mcp/<server> (and /sse/<server>), the path-inserted
// form the 401 challenge names. `resource` is exactly that endpoint's URL, which a client must
// check (RFC 9728 section 3.3). Served only with tenants, for servers some tenant may use.
import type { FastifyInstance, FastifyRequest } from 'fastify'
import type { EndpointKind, TenantDirectory } from '../auth/tenants.js'
import { GW_ERR_SERVER_NOT_FOUND } from '../core/errors.js'

export interface HttpOauthMetadataOptions {
  tenants: TenantDirectory
}

export interface ProtectedResourceMetadata {
  resource: string
  authorization_servers: string[]
  bearer_methods_supported: string[]
  resource_name: string
}

export default async function httpOauthMetadata (app: FastifyInstance, opts: HttpOauthMetadataOptions): Promise<void> {
  const { tenants } = opts
  const serve = (kind: EndpointKind) => async (req: FastifyRequest<{ Params: { server: string } }>): Promise<ProtectedResourceMetadata> => {
    const server = req.params.server
    if (!tenants.enabled || !tenants.served(server)) throw new GW_ERR_SERVER_NOT_FOUND(server.slice(0, 64))
    return {
      resource: tenants.resourceUrl(kind, server),
      authorization_servers: tenants.authorizationServers(server),
      // Tokens only in the Authorization header, never in a query string or a form body.
      bearer_methods_supported: ['header'],
      resource_name: `MCP server ${server} (${kind === 'mcp' ? 'Streamable HTTP' : 'HTTP+SSE'})`
    }
  }
  app.get('/.well-known/oauth-protected-resource/mcp/:server', serve('mcp'))
  app.get('/.well-known/oauth-protected-resource/sse/:server', serve('sse'))
}
