// An MCP client on the host talking to the gateway in a container (tools/container/run.sh):
// initialize, tools/list, tools/call, and, as asked:
//   --kill-child CONTAINER        SIGKILL the session's stdio child inside CONTAINER; a new session works
//   --across A,B                  ten calls through the balancer; the replicas' metrics show that
//                                 requests crossed between them (bus envelopes)
//   --stop-mid-session PROJECT    stop compose service gateway-a mid-session; the session goes on
//   --api-key KEY                 send it as a bearer token
//   --host NAME                   send this Host (the connection still goes to the URL's address)
//   --metrics-token TOKEN         /metrics needs it (401 without) and answers a scrape addressed to an IP
// Exit 0 when everything held; otherwise the failure is printed and the exit is 1.
import { execFileSync } from 'node:child_process'
import { connect as netConnect } from 'node:net'
import { parseArgs } from 'node:util'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { Agent, fetch as undiciFetch } from 'undici'

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    'kill-child': { type: 'string' },
    across: { type: 'string' },
    'stop-mid-session': { type: 'string' },
    'api-key': { type: 'string' },
    host: { type: 'string' },
    'metrics-token': { type: 'string' }
  }
})
const base = new URL(positionals[0] ?? 'http://127.0.0.1:8080')
const docker = process.env.DOCKER ?? '/usr/bin/docker'
const say = text => { process.stdout.write(`# container: ${text}\n`) }
const fail = text => { throw new Error(text) }

// With --host: the request names that host (URL and Host header) but connects to the given address.
const dispatcher = values.host === undefined
  ? undefined
  : new Agent({
    connect: (_opts, cb) => {
      const socket = netConnect(Number(base.port), base.hostname)
      socket.once('connect', () => { cb(null, socket) })
      socket.once('error', err => { cb(err, null) })
    }
  })
const endpointBase = values.host === undefined ? base : new URL(`http://${values.host}:${base.port}`)
const doFetch = (url, init = {}) => undiciFetch(url, { ...init, dispatcher })
const auth = values['api-key'] === undefined ? {} : { authorization: `Bearer ${values['api-key']}` }

async function session (name) {
  const client = new Client({ name, version: '1.0.0' }, { capabilities: {} })
  const transport = new StreamableHTTPClientTransport(new URL('/mcp/everything', endpointBase), { requestInit: { headers: auth }, fetch: doFetch })
  await client.connect(transport)
  return client
}

async function echo (client, text) {
  const result = await client.callTool({ name: 'echo', arguments: { message: text } })
  const got = result.content?.[0]?.text ?? ''
  if (!got.includes(text)) fail(`echo answered ${JSON.stringify(got)}`)
}

/** Sum of one metric's samples on a replica, read from inside its container. */
function metricOf (container, metric) {
  const text = execFileSync(docker, ['exec', container, 'node', '-e', "fetch('http://127.0.0.1:8080/metrics').then(r => r.text()).then(t => process.stdout.write(t))"], { encoding: 'utf8' })
  return text.split('\n').filter(l => l.startsWith(metric)).reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0)
}

function childPids (container) {
  // `node …server-everything…` only: the searching shell's own command line names it too.
  const script = 'for d in /proc/[0-9]*; do case "$(tr "\\0" " " < $d/cmdline 2>/dev/null)" in "node "*server-everything*) echo ${d#/proc/};; esac; done'
  const out = execFileSync(docker, ['exec', container, 'sh', '-c', script], { encoding: 'utf8' })
  return out.split('\n').filter(Boolean)
}

async function main () {
  const client = await session('container-check')
  const { tools } = await client.listTools()
  if (tools.length === 0) fail('tools/list is empty')
  await echo(client, 'hello through the container')
  say(`MCP session: ${tools.length} tools, echo answered`)

  if (values['kill-child'] !== undefined) {
    const container = values['kill-child']
    const pids = childPids(container)
    if (pids.length === 0) fail('no stdio child found in the container')
    execFileSync(docker, ['exec', container, 'sh', '-c', `kill -KILL ${pids.join(' ')}`])
    await new Promise(resolve => setTimeout(resolve, 500))
    const next = await session('after-kill')
    await echo(next, 'after the child was killed')
    await next.close()
    say(`SIGKILLed the stdio child (pid ${pids.join(', ')}); a new session works`)
  }

  if (values.across !== undefined) {
    const replicas = values.across.split(',')
    for (let i = 0; i < 10; i++) await echo(client, `call ${i}`)
    const crossed = replicas.map(r => metricOf(r, 'mcpgw_bus_envelopes_sent_total'))
    if (crossed.every(n => n === 0)) fail('no request crossed between the replicas (no bus envelope sent)')
    say(`one session over both replicas: bus envelopes sent ${crossed.join(' / ')}`)
    if (values['stop-mid-session'] !== undefined) {
      const started = Date.now()
      execFileSync('docker-compose', ['-p', values['stop-mid-session'], 'stop', 'gateway-a'], { stdio: 'ignore' })
      say(`gateway-a stopped mid-session in ${((Date.now() - started) / 1000).toFixed(1)} s`)
      for (let i = 0; i < 10; i++) await echo(client, `after the stop ${i}`)
      say('the session went on through gateway-b: 10 calls answered')
    }
  }

  if (values['metrics-token'] !== undefined) {
    const scrape = async headers => (await doFetch(new URL('/metrics', base), { headers })).status
    const withToken = await scrape({ authorization: `Bearer ${values['metrics-token']}` })
    const without = await scrape({})
    if (withToken !== 200 || without !== 401) fail(`/metrics: ${withToken} with the token, ${without} without (want 200, 401)`)
    say('/metrics: 200 with the token on an IP Host, 401 without')
  }
  await client.close()
}

main().then(() => { process.exit(0) }, err => {
  process.stderr.write(`# container: FAILED: ${err instanceof Error ? err.message : String(err)}\n`)
  process.exit(1)
})
