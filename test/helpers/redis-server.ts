// A real redis-server per test file, on a free port (never 6379), stopped in t.teardown.
import { spawn, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { mkdtemp, rm } from 'node:fs/promises'
import { createConnection } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'
import { reap } from './reaper.js'
import { freePort } from './wait.js'
import { createRedis, redisReady, type CreateRedisOptions, type Redis } from '../../src/state/redis/client.js'

export interface RedisServer {
  url: string
  port: number
  /** Stops the server (SIGTERM, then SIGKILL); its data is gone unless it persists (startRedis). */
  stop: () => Promise<void>
  /** SIGKILL: dies at once (with `persist`, what it acknowledged is in its AOF). */
  kill: () => Promise<void>
  /** Starts it again on the same port: empty, or from its AOF with `persist`. */
  restart: () => Promise<void>
}

export interface StartRedisOptions {
  /** An append-only file fsynced on every write, in a temporary directory: a restart keeps the data. */
  persist?: boolean
}

/** True once the server answers PING on a raw socket. */
export async function pings (port: number): Promise<boolean> {
  return await new Promise(resolve => {
    const socket = createConnection({ port, host: '127.0.0.1' })
    let reply = ''
    const done = (ok: boolean): void => { socket.destroy(); resolve(ok) }
    socket.setTimeout(500, () => done(false))
    socket.on('error', () => done(false))
    socket.on('connect', () => socket.write('PING\r\n'))
    socket.on('data', chunk => {
      reply += chunk.toString()
      if (reply.includes('\r\n')) done(reply.startsWith('+PONG'))
    })
  })
}

async function stopChild (child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = once(child, 'exit')
  child.kill('SIGTERM')
  const timer = setTimeout(() => child.kill('SIGKILL'), 2_000)
  await exited
  clearTimeout(timer)
}

async function spawnRedis (port: number, dir?: string): Promise<ChildProcess> {
  const persistence = dir === undefined ? ['--appendonly', 'no'] : ['--appendonly', 'yes', '--appendfsync', 'always', '--dir', dir]
  const child = reap(spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', ...persistence, '--loglevel', 'warning'], { stdio: ['ignore', 'ignore', 'pipe'] }))
  let stderr = ''
  child.stderr?.on('data', chunk => { stderr += String(chunk) })
  for (let i = 0; i < 200; i++) {
    if (child.exitCode !== null) throw new Error(`redis-server exited with ${child.exitCode}: ${stderr}`)
    if (await pings(port)) return child
    await sleep(25)
  }
  await stopChild(child)
  throw new Error(`redis-server on port ${port} did not answer PING`)
}

export async function startRedis (t: Test, options: StartRedisOptions = {}): Promise<RedisServer> {
  let child: ChildProcess | null = null
  let port = 0
  let dir: string | undefined
  if (options.persist === true) {
    const made = await mkdtemp(join(tmpdir(), 'mcpgw-redis-'))
    dir = made
    t.teardown(async () => { await rm(made, { recursive: true, force: true }) })
  }
  for (let attempt = 0; child === null; attempt++) {
    port = await freePort()
    try {
      child = await spawnRedis(port, dir)
    } catch (err) {
      // Another process may have taken the port between our probe and the bind.
      if (attempt >= 2) throw err
    }
  }
  const stop = async (): Promise<void> => {
    if (child !== null) await stopChild(child)
  }
  t.teardown(stop)
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    stop,
    kill: async () => {
      if (child === null || child.exitCode !== null || child.signalCode !== null) return
      const exited = once(child, 'exit')
      child.kill('SIGKILL')
      await exited
    },
    restart: async () => {
      await stop()
      child = await spawnRedis(port, dir)
    }
  }
}

/** A ready client for a test, closed in t.teardown. */
export async function testRedis (t: Test, url: string, opts: CreateRedisOptions = {}): Promise<Redis> {
  const redis = createRedis(url, { maxRetryDelayMs: 200, ...opts })
  t.teardown(() => { redis.disconnect(false) })
  await redisReady(redis)
  return redis
}

/** A random key prefix, so tests sharing a server never see each other's keys. */
export const randomPrefix = (): string => `gwtest-${randomBytes(6).toString('hex')}`
