// Legacy HTTP+SSE backends (docs/spec-rules.md §6; the gateway is the client here).
import { randomUUID } from 'node:crypto'
import type { Dispatcher } from 'undici'
import type { HttpServerConfig } from '../config/schema.js'
import type { GatewayError } from '../core/errors.js'
import { isNotification, isRequest, type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse } from '../core/jsonrpc.js'
import { HttpBackend, type HttpBackendOpenOptions } from './http-base.js'
import { describe, drain, mediaType, pumpSse } from './http-io.js'

// Legacy HTTP+SSE (docs/spec-rules.md §6): GET the SSE url, wait for `endpoint`, POST every message there;
// messages come back as `message` events. A new SSE connection is a new legacy session.

interface Queued {
  message: JsonRpcMessage
  resolve: () => void
  reject: (err: Error) => void
}

export class LegacySseBackend extends HttpBackend {
  #endpoint: URL | null = null
  /** Set while a re-initialise on a fresh connection runs; only its own POSTs may pass. */
  #reiniting = false
  #queue: Queued[] = []
  #stream: AbortController | null = null
  /** The last connection attempt failed or dropped and no `endpoint` arrived since. */
  #down = false

  constructor (options: HttpBackendOpenOptions, config: HttpServerConfig) {
    super(options, config)
    this.#run().catch((err: unknown) => {
      this.log.error({ err }, 'backend SSE loop failed')
      this.unrecoverable(`the SSE connection loop failed: ${describe(err)}`)
    })
  }

  get listening (): boolean {
    return true
  }

  get backendSessionId (): string | null {
    return null
  }

  startListening (): void {}
  stopListening (): void {}

  async send (message: JsonRpcMessage): Promise<void> {
    this.assertOpen()
    if (isRequest(message)) {
      this.rememberInitialize(message)
      const p = this.track(message)
      this.#enqueue(message).catch((err: unknown) => {
        this.fail(p, err as GatewayError)
      }).finally(() => { this.exchangeEnded(p) })
      return
    }
    if (isNotification(message) && message.method === 'notifications/cancelled') this.forgetCancelled(message)
    await this.#enqueue(message)
    if (isNotification(message) && message.method === 'notifications/initialized') this.initialized = true
  }

  protected async postNotification (message: JsonRpcMessage): Promise<void> {
    await this.#enqueue(message)
  }

  get #ready (): boolean {
    return this.#endpoint !== null && !this.#reiniting
  }

  /** POSTs now when the connection is ready, else after the next (re)connect. */
  async #enqueue (message: JsonRpcMessage): Promise<void> {
    if (this.#down) throw this.unavailable('the SSE connection is down (reconnecting)')
    if (this.#ready) {
      await this.#postNow(message)
      return
    }
    await new Promise<void>((resolve, reject) => {
      this.#queue.push({ message, resolve, reject })
    })
  }

  #flush (): void {
    const queue = this.#queue
    this.#queue = []
    for (const item of queue) {
      if (isRequest(item.message) && this.pendingOf(item.message.id) === undefined) {
        item.resolve() // answered meanwhile (timeout or cancel): do not send it late
        continue
      }
      this.#postNow(item.message).then(item.resolve, item.reject)
    }
  }

  async #postNow (message: JsonRpcMessage): Promise<void> {
    const endpoint = this.#endpoint
    if (endpoint === null) throw this.unavailable('the SSE connection is not established')
    const headers = this.baseHeaders()
    headers['content-type'] = 'application/json'
    const p = isRequest(message) ? this.pendingOf(message.id) : undefined
    const signal = p === undefined ? this.lifetime : p.abort.signal
    let res: Dispatcher.ResponseData
    try {
      res = await this.request(this.requests, 'POST', endpoint, headers, signal, { body: JSON.stringify(message), bodyTimeout: this.config.requestTimeoutMs })
    } catch (err) {
      throw this.unavailable(describe(err), err)
    }
    await drain(res.body)
    if (res.statusCode >= 200 && res.statusCode < 300) return
    if (res.statusCode === 404 && this.#endpoint === endpoint) {
      // The legacy session is gone on the server: reconnect, which starts a new one.
      this.#stream?.abort()
    }
    const err = this.unavailable(`the backend answered HTTP ${res.statusCode}`)
    if (p !== undefined) {
      this.fail(p, err, { status: res.statusCode })
      return
    }
    throw err
  }

  async #run (): Promise<void> {
    let attempt = 0
    let retryMs: number | undefined
    while (!this.closed) {
      const controller = new AbortController()
      this.#stream = controller
      const signal = AbortSignal.any([controller.signal, this.lifetime])
      let reason: string
      // A server that never names its endpoint would hold the requests until their deadlines.
      const endpointDeadline = setTimeout(() => controller.abort(), this.config.requestTimeoutMs).unref()
      try {
        const headers = this.baseHeaders()
        headers.accept = 'text/event-stream'
        const res = await this.request(this.streams, 'GET', this.url, headers, signal)
        if (res.statusCode === 200 && mediaType(res.headers) === 'text/event-stream') {
          await pumpSse(res.body, event => {
            if (event.event === 'endpoint') {
              clearTimeout(endpointDeadline)
              if (this.#onEndpoint(event.data, controller)) attempt = 0
            } else if (event.event === undefined || event.event === 'message') {
              this.deliverData(event.data)
            }
          }, ms => { retryMs = ms })
          reason = 'the SSE connection ended'
        } else {
          await drain(res.body)
          reason = `the SSE connection answered HTTP ${res.statusCode}`
        }
      } catch (err) {
        reason = controller.signal.aborted && !this.lifetime.aborted
          ? 'the SSE connection was abandoned'
          : `the SSE connection failed: ${describe(err)}`
      }
      clearTimeout(endpointDeadline)
      this.#endpoint = null
      this.#reiniting = false
      if (this.closed) return
      this.#lost(reason)
      if (attempt >= this.config.reconnect.maxAttempts) {
        this.unrecoverable(`${reason}; reconnect attempts exhausted`)
        return
      }
      this.log.warn({ reason, attempt }, 'backend SSE connection lost; reconnecting')
      if (!await this.waitBeforeRetry(attempt++, retryMs, this.lifetime)) return
    }
  }

  /**
   * The legacy session is gone with its connection: nothing sent on it can be answered, and
   * what waits in the queue belonged to it too. Until the next `endpoint`, new messages fail
   * at once rather than wait through the backoff (unreachable => error now, not at the deadline).
   */
  #lost (reason: string): void {
    this.#down = true
    const err = this.unavailable(reason)
    this.failAll(err)
    this.rejectQueued(err)
  }

  protected override rejectQueued (err: GatewayError): void {
    const queue = this.#queue
    this.#queue = []
    for (const q of queue) q.reject(err)
  }

  #onEndpoint (data: string, controller: AbortController): boolean {
    let endpoint: URL
    try {
      endpoint = new URL(data.trim(), this.url)
    } catch {
      this.log.error('backend sent an endpoint that is not a URL')
      controller.abort()
      return false
    }
    if (endpoint.origin !== this.url.origin) {
      // S-2: like the SDK client, never POST to another origin than the SSE url's.
      this.log.error({ origin: endpoint.origin }, 'backend endpoint is on another origin; refused')
      controller.abort()
      return false
    }
    this.#endpoint = endpoint
    this.#down = false
    if (this.initialized && this.initParams !== undefined) {
      this.#reiniting = true
      this.#reinitialise(controller).catch((err: unknown) => {
        this.log.warn({ err }, 'backend re-initialise failed')
        controller.abort()
      })
    } else {
      this.#flush()
    }
    return true
  }

  /** A new legacy session after a reconnect: initialize + initialized as the gateway, then flush. */
  async #reinitialise (controller: AbortController): Promise<void> {
    const request: JsonRpcRequest = { jsonrpc: '2.0', id: `gw-init-${randomUUID()}`, method: 'initialize', params: this.initParams }
    const reply = await new Promise<JsonRpcResponse>((resolve, reject) => {
      this.track(request, { resolve, reject })
      this.#postNow(request).catch(reject)
    })
    if ('error' in reply) throw this.unavailable(`re-initialise failed: ${reply.error.message}`)
    await this.#postNow({ jsonrpc: '2.0', method: 'notifications/initialized' })
    if (controller.signal.aborted) return
    this.#reiniting = false
    this.log.info('backend legacy session re-initialised')
    this.#flush()
  }

  protected async shutdown (): Promise<void> {
    // Closing the SSE GET (lifetime abort) ends the legacy session; there is nothing to DELETE.
    this.#stream = null
    this.rejectQueued(this.unavailable('the connection was closed'))
  }
}
