// A request that runs on a connection shared by many clients (a pool's connection, an aggregate's
// member link) goes out under a gateway key: its id, and its `_meta.progressToken` when it carries
// one, are replaced by that key, so two clients' tokens can never meet on the connection. The
// backend's `notifications/progress` then name the key, and go back to the client under its own
// token. Progress is the MCP spec's "Progress" utility: a token is a string or an integer.
import { isRecord, progressTokenOf, type JsonRpcNotification, type JsonRpcRequest, type RequestId } from '../../core/jsonrpc.js'

/**
 * The request as it goes out under `key`: its id replaced by the key, and its progress token too
 * when it carries a valid one (anything else in `_meta` is kept).
 */
export function underGatewayKey (request: JsonRpcRequest, key: string): JsonRpcRequest {
  const params = request.params
  if (!isRecord(params) || progressTokenOf(request) === undefined) return { ...request, id: key }
  return { ...request, id: key, params: { ...params, _meta: { ...(params._meta as Record<string, unknown>), progressToken: key } } }
}

/**
 * A progress notification of the backend's, under the client's own token again; undefined when
 * the client's request carried none (nobody asked for its progress: it is dropped).
 */
export function progressForClient (notification: JsonRpcNotification, clientToken: RequestId | undefined): JsonRpcNotification | undefined {
  if (clientToken === undefined) return undefined
  const params = isRecord(notification.params) ? notification.params : {}
  return { ...notification, params: { ...params, progressToken: clientToken } }
}
