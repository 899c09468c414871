// The chaos run (docs/replicas.md): three gateway replicas on a Sentinel-managed Redis behind a
// non-sticky round-robin balancer, many SDK sessions calling in a loop (stdio and Streamable HTTP
// backends; plain calls, progress, sampling) while replicas are SIGKILLed and restarted and the
// Redis primary is killed and failed over. Every call is counted: answered correctly, answered with
// an error, never answered, answered twice, answered to the wrong caller.
// Short run: test/integration/chaos.test.ts; full run: `npm run chaos` (test/chaos/full.ts).
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CreateMessageRequestSchema, McpError, type JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'
import { startStreamableUpstream } from '../fixtures/http-upstreams.js'
import { stdioFixture } from '../helpers/gateway.js'
import { randomPrefix } from '../helpers/redis-server.js'
import { startSentinelSetup } from '../helpers/redis-topologies.js'
import { startReplica, startRoundRobinProxy, type ReplicaProcess } from '../helpers/replicas.js'
import { textOf } from '../helpers/wait.js'

export interface ChaosOptions {
  sessions: number
  /** How long the sessions call; the chaos events fall inside it. */
  durationMs: number
  /** Replica kills (each followed by a restart of that replica). */
  kills: number
  /** Deadline of one call: no answer by then counts as never answered. */
  callTimeoutMs?: number
  log?: (line: string) => void
}

export interface ChaosFigures {
  calls: number
  correct: number
  errors: number
  neverAnswered: number
  duplicated: number
  misrouted: number
  /**
   * Progress calls answered with their own result whose progress notifications all went missing:
   * written to a Sentinel primary that died before replicating them (docs/replicas.md, Limits).
   * Lost, not misrouted: the result is the caller's own.
   */
  progressLost: number
  /** Error answers by JSON-RPC code (or 'transport' for a failed HTTP exchange). */
  errorCodes: Record<string, number>
  /**
   * Calls answered -32007 (lost with the replica running their backend) that never reached a
   * backend (stdio echo calls, whose text the backend logs on arrival): there must be none.
   */
  lostUnreached: number
  /** Sessions that had to be created again (their old one answered 404). */
  sessionsRenewed: number
  /** Sessions created before the first kill that still answered at the end. */
  survivors: number
  before: number
  events: string[]
}

interface Session {
  index: number
  http: boolean
  client: Client
  sent: Set<string | number>
  answered: Map<string | number, number>
  /** The first answer of each id, for the log line of a duplicate. */
  firstAnswers: Map<string | number, string>
  createdBeforeChaos: boolean
  renewed: boolean
}

export async function runChaos (t: Test, options: ChaosOptions): Promise<ChaosFigures> {
  const log = options.log ?? (() => {})
  const callTimeoutMs = options.callTimeoutMs ?? 30_000
  const sentinel = await startSentinelSetup(t)
  const callDir = await mkdtemp(join(tmpdir(), 'mcpgw-chaos-'))
  t.teardown(async () => { await rm(callDir, { recursive: true, force: true }) })
  const callLog = join(callDir, 'calls.log')
  /** Texts of stdio echo calls answered -32007: each must be in the backends' call log. */
  const lostTexts: string[] = []
  const upstream = await startStreamableUpstream({ record: false })
  t.teardown(async () => { await upstream.close() })
  const config = {
    redis: { url: sentinel.primary.url, sentinels: [sentinel.sentinel.url], name: sentinel.name, keyPrefix: randomPrefix(), connectTimeoutMs: 3000 },
    // The gateway's own deadline is shorter than the clients': a call whose answer is lost
    // upstream (e.g. a sampling answer POSTed to a replica that died) still gets one, -32006.
    servers: {
      full: stdioFixture('full-server', ['--call-log', callLog], { requestTimeoutMs: 10_000 }),
      remote: { transport: 'streamable-http', url: upstream.url, requestTimeoutMs: 10_000 }
    }
  }
  const replicas: ReplicaProcess[] = await Promise.all(['A', 'B', 'C'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const figures: ChaosFigures = { calls: 0, correct: 0, errors: 0, neverAnswered: 0, duplicated: 0, misrouted: 0, progressLost: 0, errorCodes: {}, lostUnreached: 0, sessionsRenewed: 0, survivors: 0, before: 0, events: [] }
  const event = (what: string): void => { figures.events.push(`${new Date().toISOString()} ${what}`); log(what) }

  async function open (index: number, createdBeforeChaos: boolean): Promise<Session> {
    const http = index % 2 === 1
    let client: Client
    let transport: StreamableHTTPClientTransport
    // A new client for each attempt, as a client application starts over: a failed connect leaves
    // the SDK client attached to its transport until its close() settles ("Already connected").
    for (let attempt = 0; ; attempt++) {
      client = new Client({ name: `chaos-${index}`, version: '1' }, { capabilities: { sampling: {} } })
      client.setRequestHandler(CreateMessageRequestSchema, async () => ({ role: 'assistant', model: 'chaos', content: { type: 'text', text: `s${index}` } }))
      try {
        transport = new StreamableHTTPClientTransport(new URL(`${proxy.url}/mcp/${http ? 'remote' : 'full'}`))
        await client.connect(transport)
        break
      } catch (err) {
        await client.close().catch(() => {})
        if (attempt >= 20) throw err
        await sleep(250)
      }
    }
    const session: Session = { index, http, client, sent: new Set(), answered: new Map(), firstAnswers: new Map(), createdBeforeChaos, renewed: false }
    // What the transport gives up on (a resume that failed its last retry) explains an unanswered call.
    const onerror = transport.onerror
    transport.onerror = (err: Error) => {
      if (/Maximum reconnection|Failed to reconnect/.test(err.message)) event(`transport of session ${index}: ${err.message.slice(0, 200)}`)
      onerror?.call(transport, err)
    }
    // Every response the transport hands the client is counted by id: twice is a duplicate,
    // an id this client never sent is misrouted.
    const deliver = transport.onmessage
    transport.onmessage = (message: JSONRPCMessage) => {
      if ('id' in message && !('method' in message)) {
        const id = message.id as string | number
        if (!session.sent.has(id)) { figures.misrouted++; event(`misrouted: session ${session.index} got an answer to id ${String(id)}, which it never sent`) }
        const seen = (session.answered.get(id) ?? 0) + 1
        session.answered.set(id, seen)
        if (seen === 1) session.firstAnswers.set(id, JSON.stringify(message).slice(0, 300))
        if (seen === 2) {
          figures.duplicated++
          log(`duplicate answer on session ${index}, id ${id}: first ${session.firstAnswers.get(id) ?? '?'}, then ${JSON.stringify(message).slice(0, 300)}`)
        }
      }
      deliver?.call(transport, message)
    }
    const send = transport.send.bind(transport)
    transport.send = async (message, opts) => {
      if ('id' in message && 'method' in message) session.sent.add(message.id as string | number)
      await send(message, opts)
    }
    t.teardown(async () => { await client.close().catch(() => {}) })
    return session
  }

  /** One call; returns false when the session is gone (404) and must be created again. */
  async function call (s: Session, n: number): Promise<boolean> {
    const kind = n % 5 < 3 ? 'echo' : n % 5 === 3 ? 'progress' : 'sample'
    const text = `s${s.index}-${n}`
    figures.calls++
    let progress = 0
    const timeout = { timeout: callTimeoutMs, onprogress: () => { progress++ } }
    try {
      let ok: boolean
      let got: string
      if (kind === 'echo') {
        got = textOf(await s.client.callTool(s.http ? { name: 'echo', arguments: { message: text } } : { name: 'echo', arguments: { text } }, undefined, timeout))
        ok = got === (s.http ? `echo: ${text}` : text)
      } else if (kind === 'progress') {
        got = textOf(await s.client.callTool(s.http ? { name: 'progress-log', arguments: {} } : { name: 'progress', arguments: { steps: 2, delayMs: 5 } }, undefined, timeout))
        ok = (s.http ? got === 'done' : /^done 2 steps/.test(got)) && progress >= 1
      } else {
        got = textOf(await s.client.callTool(s.http ? { name: 'ask-sampling', arguments: {} } : { name: 'sample', arguments: { prompt: text } }, undefined, timeout))
        ok = got.includes(`s${s.index}`)
      }
      if (ok) figures.correct++
      else if (kind === 'progress' && progress === 0 && (s.http ? got === 'done' : /^done 2 steps/.test(got))) {
        figures.correct++
        figures.progressLost++
        event(`progress lost on session ${s.index}${s.http ? ' (http)' : ''}, call ${n}: its own result, no notification`)
      } else { figures.misrouted++; event(`wrong answer on session ${s.index}${s.http ? ' (http)' : ''}, call ${n} (${kind}): ${got.slice(0, 80)}, ${progress} progress`) }
      return true
    } catch (err) {
      if (err instanceof McpError && err.code === -32001 && /timed out/i.test(err.message)) {
        figures.neverAnswered++
        event(`never answered: session ${s.index}, call ${n} (${kind})`)
        return true
      }
      figures.errors++
      if (err instanceof McpError && err.code === -32007 && kind === 'echo' && !s.http) lostTexts.push(text)
      // The SDK reports an HTTP error answer with its JSON-RPC body: classify by that code.
      const code = err instanceof McpError ? String(err.code) : /404|Session not found/.test(String(err)) ? '404' : `http ${/"code":(-?\d+)/.exec(String(err))?.[1] ?? 'transport'}`
      figures.errorCodes[code] = (figures.errorCodes[code] ?? 0) + 1
      if (figures.errorCodes[code] <= 2) log(`error ${code} on session ${s.index}: ${String(err).slice(0, 160)}`)
      // A client backs off a little after an error before it calls again.
      await sleep(250)
      return code !== '404'
    }
  }

  const sessions: Session[] = []
  for (let i = 0; i < options.sessions; i++) sessions.push(await open(i, true))
  figures.before = sessions.length
  event(`${sessions.length} sessions open`)

  const stopAt = Date.now() + options.durationMs
  const loops = sessions.map(async (first, i) => {
    let s = first
    for (let n = 0; Date.now() < stopAt; n++) {
      if (!await call(s, n)) {
        // The session is gone: what a client does then is initialize again.
        figures.sessionsRenewed++
        s.renewed = true
        s = await open(s.index, false)
        sessions[i] = s
      }
    }
  })

  // The chaos, spread over the run: replica kills (each restarted a little later) and one
  // Redis primary failover in the middle.
  const chaos = (async () => {
    const steps = options.kills + 1
    const slice = options.durationMs / (steps + 1)
    let killed = 0
    for (let step = 1; step <= steps && Date.now() < stopAt; step++) {
      // Kills at random points of the calls' paths: the calls run back to back, so a
      // random offset lands before, in or after the owner's inbox, backend or append.
      await sleep(Math.max(0, slice * (0.75 + Math.random() / 2)))
      if (step === Math.ceil(steps / 2)) {
        event(`Redis primary (port ${sentinel.primaryPort()}) SIGKILLed`)
        await sentinel.primary.kill()
        while (sentinel.primaryPort() !== sentinel.replica.port) await sleep(200)
        event(`Sentinel promoted port ${sentinel.replica.port}`)
        continue
      }
      if (killed >= options.kills) continue
      killed++
      const index = Math.floor(Math.random() * replicas.length)
      const victim = replicas[index]!
      event(`replica ${victim.name} SIGKILLed`)
      await victim.kill()
      // The balancer's health check takes the dead replica out...
      proxy.setTargets(replicas.filter(r => r !== victim).map(r => r.url))
      await sleep(2000)
      // ...and the restarted one back in.
      // On a loaded machine a start can be slow: try again rather than end the run.
      let restarted: ReplicaProcess | undefined
      for (let attempt = 1; restarted === undefined; attempt++) {
        try {
          restarted = await startReplica(t, `${victim.name}'`, config)
        } catch (err) {
          if (attempt >= 3) throw err
          event(`replica ${victim.name} restart attempt ${attempt} failed; retrying`)
        }
      }
      replicas[index] = restarted
      proxy.setTargets(replicas.map(r => r.url))
      event(`replica ${victim.name} restarted as ${restarted.name}`)
    }
  })()
  await Promise.all([...loops, chaos])

  // Every session that existed before the chaos still works (or was renewed after a 404).
  for (const s of sessions) {
    if (!s.createdBeforeChaos || s.renewed) continue
    try {
      await s.client.callTool(s.http ? { name: 'echo', arguments: { message: 'final' } } : { name: 'echo', arguments: { text: 'final' } }, undefined, { timeout: callTimeoutMs })
      figures.survivors++
    } catch { /* counted by its absence */ }
  }
  const reached = new Set((await readFile(callLog, 'utf8').catch(() => '')).split('\n'))
  for (const text of lostTexts) {
    if (reached.has(text)) continue
    figures.lostUnreached++
    event(`-32007 for a call that never reached a backend: ${text}`)
  }
  event(`done: ${JSON.stringify({ ...figures, events: undefined })}`)
  return figures
}
