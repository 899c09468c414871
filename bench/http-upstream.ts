// The benchmark's Streamable HTTP upstream: the test fixture's SDK server (stateful, one McpServer
// per session, `echo` among its tools) with request recording off, in its own process so it does
// not share an event loop with the benchmark's clients.
//
//   node dist/bench/http-upstream.js   prints {"url": "http://127.0.0.1:<port>/mcp"} once listening;
//                                      exits on SIGTERM/SIGINT or when stdin closes (parent gone).
import { startStreamableUpstream } from '../test/fixtures/http-upstreams.js'
import { serveAsChild } from './child-lifecycle.js'

const upstream = await startStreamableUpstream({ record: false })

serveAsChild(upstream.url, upstream.close)
