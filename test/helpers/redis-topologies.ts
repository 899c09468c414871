// Highly available Redis set-ups the tests start themselves, on free ports (never 6379): a
// primary with one replica and a Sentinel that fails it over, and a 3-master Redis Cluster.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'
import { reap } from './reaper.js'
import { pings } from './redis-server.js'
import { freePort } from './wait.js'

export interface RedisProcess {
  port: number
  url: string
  child: ChildProcess
  kill: () => Promise<void>
}

async function spawnServer (t: Test, args: string[]): Promise<RedisProcess> {
  for (let attempt = 0; ; attempt++) {
    const port = await freePort()
    const child = reap(spawn('redis-server', [...args, '--port', String(port), '--bind', '127.0.0.1', '--loglevel', 'warning'], { stdio: ['ignore', 'ignore', 'pipe'] }))
    let stderr = ''
    child.stderr?.on('data', chunk => { stderr += String(chunk) })
    let up = false
    for (let i = 0; i < 200 && child.exitCode === null; i++) {
      if (await pings(port)) { up = true; break }
      await sleep(25)
    }
    const kill = async (): Promise<void> => {
      if (child.exitCode !== null || child.signalCode !== null) return
      const exited = once(child, 'exit')
      child.kill('SIGKILL')
      await exited
    }
    if (up) {
      t.teardown(kill)
      return { port, url: `redis://127.0.0.1:${port}`, child, kill }
    }
    await kill()
    if (attempt >= 2) throw new Error(`redis-server ${args.join(' ')} did not start: ${stderr}`)
  }
}

function cli (port: number, ...args: string[]): string {
  const out = spawnSync('redis-cli', ['-p', String(port), ...args], { encoding: 'utf8', timeout: 10_000 })
  return `${out.stdout}${out.stderr}`
}

async function until (what: string, probe: () => boolean, ms: number): Promise<void> {
  const deadline = Date.now() + ms
  while (!probe()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(100)
  }
}

async function tempDir (t: Test): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-redis-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })
  return dir
}

const NO_PERSISTENCE = ['--save', '', '--appendonly', 'no']

export interface SentinelSetup {
  primary: RedisProcess
  replica: RedisProcess
  sentinel: RedisProcess
  name: string
  /** The port Sentinel names as the primary now. */
  primaryPort: () => number
}

/** A primary, one replica in sync with it, and one Sentinel (quorum 1) that fails over fast. */
export async function startSentinelSetup (t: Test): Promise<SentinelSetup> {
  const dir = await tempDir(t)
  const name = 'gwprimary'
  const primary = await spawnServer(t, ['--dir', dir, ...NO_PERSISTENCE, '--dbfilename', 'p.rdb'])
  const replica = await spawnServer(t, ['--dir', dir, ...NO_PERSISTENCE, '--dbfilename', 'r.rdb', '--replicaof', '127.0.0.1', String(primary.port)])
  await until('the replica to sync', () => /master_link_status:up/.test(cli(replica.port, 'INFO', 'replication')), 15_000)
  const file = join(dir, 'sentinel.conf')
  await writeFile(file, [
    `sentinel monitor ${name} 127.0.0.1 ${primary.port} 1`,
    `sentinel down-after-milliseconds ${name} 1000`,
    `sentinel failover-timeout ${name} 3000`,
    `sentinel parallel-syncs ${name} 1`,
    ''
  ].join('\n'))
  const sentinel = await spawnServer(t, [file, '--sentinel'])
  const primaryPort = (): number => Number(/\n(\d+)/.exec(cli(sentinel.port, 'SENTINEL', 'get-master-addr-by-name', name))?.[1] ?? 0)
  await until('Sentinel to see the replica', () => /num-slaves\n1/.test(cli(sentinel.port, 'SENTINEL', 'master', name)), 15_000)
  return { primary, replica, sentinel, name, primaryPort }
}

export interface ClusterSetup {
  nodes: RedisProcess[]
  urls: string[]
  /** Every key on every master, e.g. to check what a prefix left behind. */
  keys: (pattern: string) => string[]
}

/** Three masters, no replicas, every slot assigned; cluster_state:ok on every node. */
export async function startCluster (t: Test): Promise<ClusterSetup> {
  const dir = await tempDir(t)
  const nodes: RedisProcess[] = []
  for (let i = 0; i < 3; i++) {
    nodes.push(await spawnServer(t, ['--dir', dir, ...NO_PERSISTENCE, '--dbfilename', `n${i}.rdb`, '--cluster-enabled', 'yes', '--cluster-config-file', join(dir, `nodes-${i}-${Date.now()}.conf`), '--cluster-node-timeout', '2000']))
  }
  const created = spawnSync('redis-cli', ['--cluster', 'create', ...nodes.map(n => `127.0.0.1:${n.port}`), '--cluster-replicas', '0', '--cluster-yes'], { encoding: 'utf8', timeout: 30_000 })
  if (created.status !== 0) throw new Error(`cluster create failed: ${created.stdout}${created.stderr}`)
  await until('cluster_state:ok on every node', () => nodes.every(n => /cluster_state:ok/.test(cli(n.port, 'CLUSTER', 'INFO'))), 20_000)
  return {
    nodes,
    urls: nodes.map(n => n.url),
    keys: pattern => nodes.flatMap(n => cli(n.port, '--scan', '--pattern', pattern).split('\n').filter(l => l !== ''))
  }
}
