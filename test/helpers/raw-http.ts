// Raw HTTP on a socket of its own, for what fetch cannot send: malformed requests, slow clients.
import { connect } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'

export interface RawAnswer { text: string, status: number, body: string, closed: boolean }

/**
 * Writes `bytes` and collects what comes back until the gateway closes the socket (or `waitMs`).
 * With `giveUpMs`, the client closes after that long instead, as a slow client that gives up.
 */
export async function rawExchange (base: string, bytes: string, opts: { waitMs?: number, giveUpMs?: number } = {}): Promise<RawAnswer> {
  const url = new URL(base)
  const socket = connect(Number(url.port), url.hostname)
  let text = ''
  socket.on('data', chunk => { text += String(chunk) })
  socket.on('error', () => {})
  socket.write(bytes)
  let closed = false
  if (opts.giveUpMs !== undefined) await sleep(opts.giveUpMs)
  else closed = await Promise.race([new Promise<boolean>(resolve => socket.once('close', () => resolve(true))), sleep(opts.waitMs ?? 3000, false)])
  socket.destroy()
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0)
  return { text, status, body: text.slice(text.indexOf('\r\n\r\n') + 4), closed }
}
