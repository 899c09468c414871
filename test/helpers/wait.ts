// Small helpers the integration tests share.
import { once } from 'node:events'
import { createServer } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'

/** Polls `probe` every `everyMs` until it returns something other than undefined, or throws after `ms`. */
export async function eventually<T> (what: string, probe: () => T | undefined | Promise<T | undefined>, ms = 10_000, everyMs = 50): Promise<T> {
  const deadline = Date.now() + ms
  for (;;) {
    const value = await probe()
    if (value !== undefined) return value
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(everyMs)
  }
}

/** The text of a tool result's first content block. */
export const textOf = (result: unknown): string => ((result as { content: Array<{ text?: string }> }).content[0]?.text ?? '')

/** A loopback port that was free a moment ago. */
export async function freePort (): Promise<number> {
  const server = createServer()
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const address = server.address()
  server.close()
  await once(server, 'close')
  if (address === null || typeof address === 'string') throw new Error('no port')
  return address.port
}
