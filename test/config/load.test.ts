// Loading the config: YAML and JSON, ${ENV} placeholders, defaults, every refusal named by its path.
// Over 500 lines on purpose: one case per rule of the one schema, kept together so a new key gets
// its default and its refusals side by side.
import t from 'tap'
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { loadConfig, parseArgs, parseConfig, CONFIG_PATH_VARIABLE, DEFAULT_CONFIG_PATH, USAGE } from '../../src/config/load.js'
import { configSchema, type StdioServerConfig, type HttpServerConfig } from '../../src/config/schema.js'
import { isGatewayError } from '../../src/core/errors.js'

// dist/test/config/load.test.js -> the repository root
const repo = fileURLToPath(new URL('../../../', import.meta.url))
const shipped = (name: string): string => join(repo, 'config', name)

/** The `path: reason` lines of the GW_ERR_CONFIG_INVALID that `fn` throws. */
function problemsOf (fn: () => unknown): string[] {
  try {
    fn()
  } catch (err) {
    if (isGatewayError(err) && err.code === 'GW_ERR_CONFIG_INVALID') return err.message.split('\n').slice(1).map(line => line.trim())
    throw err
  }
  throw new Error('expected GW_ERR_CONFIG_INVALID, nothing was thrown')
}

async function problemsOfAsync (fn: () => Promise<unknown>): Promise<{ message: string, lines: string[] }> {
  try {
    await fn()
  } catch (err) {
    if (isGatewayError(err) && err.code === 'GW_ERR_CONFIG_INVALID') return { message: err.message, lines: err.message.split('\n').slice(1).map(line => line.trim()) }
    throw err
  }
  throw new Error('expected GW_ERR_CONFIG_INVALID, nothing was thrown')
}

const stdio = { transport: 'stdio', command: 'node' }
const minimal = (servers: Record<string, unknown> = { x: stdio }): Record<string, unknown> => ({ servers })

t.test('defaults are applied everywhere the schema has one', async t => {
  const config = parseConfig({
    servers: { x: stdio, h: { transport: 'streamable-http', url: 'http://127.0.0.1:9/mcp' } },
    redis: { url: 'redis://127.0.0.1:6379' }
  }, {})
  t.same(config.listen, { host: '127.0.0.1', port: 8080 })
  t.same(config.log, { level: 'info', flushMs: 100 })
  t.same(config.http, { bodyLimit: 4_194_304, allowedOrigins: [], allowedHosts: [], responseMode: 'sse', lazySseMs: 50, keepAliveMs: 15_000, retryMs: 1000, trustedProxies: [], forwardedHeader: 'x-forwarded-for' })
  t.same(config.sessions, { idleTimeoutMs: 1_800_000, eventLogMaxLen: 1000, clientRequestTimeoutMs: 300_000 })
  t.same(config.redis, { url: 'redis://127.0.0.1:6379', sentinels: [], name: 'mymaster', cluster: [], keyPrefix: 'mcpgw', leaseMs: 10_000, connectTimeoutMs: 5000, readinessGraceMs: 15_000 })
  t.same(config.servers.x, {
    transport: 'stdio',
    command: 'node',
    args: [],
    env: {},
    inheritEnv: [],
    sessions: 'dedicated',
    maxSessions: 100,
    poolSize: 4,
    poolMax: 16,
    poolWaitMs: 10_000,
    requestTimeoutMs: 60_000,
    maxLineBytes: 10_485_760,
    stopGraceMs: 2000,
    childIdleMs: 300_000,
    restart: { maxRestarts: 3, windowMs: 60_000, baseDelayMs: 250, maxDelayMs: 30_000 },
    onOwnerLoss: 'carry-on'
  })
  t.notOk('cwd' in (config.servers.x as StdioServerConfig), 'cwd has no default: the gateway\'s working directory applies')
  t.same(config.servers.h, {
    transport: 'streamable-http',
    url: 'http://127.0.0.1:9/mcp',
    headers: {},
    forwardHeaders: [],
    maxSessions: 1000,
    poolSize: 4,
    poolMax: 256,
    poolWaitMs: 10_000,
    protocol: 'auto',
    connectTimeoutMs: 10_000,
    requestTimeoutMs: 60_000,
    connections: 64,
    onOwnerLoss: 'carry-on',
    reconnect: { maxAttempts: 5, baseDelayMs: 500, maxDelayMs: 30_000 }
  })
})

t.test('without a redis block there is no redis (memory mode)', async t => {
  t.equal(parseConfig(minimal(), {}).redis, undefined)
})

t.test('the input is not modified', async t => {
  const raw = { servers: { x: { transport: 'stdio', command: 'node', env: { A: '${A}' } } } }
  parseConfig(raw, { A: 'a' })
  t.same(raw, { servers: { x: { transport: 'stdio', command: 'node', env: { A: '${A}' } } } })
})

t.test('placeholders', async t => {
  t.test('expand in every string value, nested and in arrays; keys stay as written', async t => {
    const config = parseConfig({
      servers: {
        x: {
          transport: 'stdio',
          command: '${BIN}',
          args: ['--token=${TOKEN}', '${TOKEN}${TOKEN}'],
          env: { '${TOKEN}': 'pre-${TOKEN}-post' }
        }
      }
    }, { BIN: 'node', TOKEN: 's3' })
    const x = config.servers.x as StdioServerConfig
    t.equal(x.command, 'node')
    t.same(x.args, ['--token=s3', 's3s3'])
    t.same(x.env, { '${TOKEN}': 'pre-s3-post' })
  })

  t.test('${NAME:-default} uses the default when NAME is unset or empty, the value otherwise', async t => {
    const env = { SET: 'value', EMPTY: '' }
    const config = parseConfig(minimal({
      x: { ...stdio, env: { A: '${UNSET:-fallback}', B: '${EMPTY:-fallback}', C: '${SET:-fallback}', D: '${UNSET:-}', E: '${UNSET:-a:-b}' } }
    }), env)
    t.same((config.servers.x as StdioServerConfig).env, { A: 'fallback', B: 'fallback', C: 'value', D: '', E: 'a:-b' })
  })

  t.test('a set but empty variable without a default expands to the empty string', async t => {
    const config = parseConfig(minimal({ x: { ...stdio, env: { A: '${EMPTY}' } } }), { EMPTY: '' })
    t.equal((config.servers.x as StdioServerConfig).env.A, '')
  })

  t.test('$${ is a literal ${ and is not expanded', async t => {
    const config = parseConfig(minimal({ x: { ...stdio, args: ['$${HOME}', 'a$${B:-c}d', '$$', '$$${X}', '$ ${X}'] } }), { HOME: '/root', X: 'x' })
    // The leftmost `$${` is the escape, so `$$${X}` is `$` + `$${` + `X}`.
    t.same((config.servers.x as StdioServerConfig).args, ['${HOME}', 'a${B:-c}d', '$$', '$${X}', '$ x'])
  })

  t.test('an unset variable without a default is an error naming the path and the variable', async t => {
    const lines = problemsOf(() => parseConfig(minimal({ x: { ...stdio, env: { TOKEN: 'Bearer ${TOKEN}' } } }), {}))
    t.same(lines, ['/servers/x/env/TOKEN: environment variable TOKEN is not set'])
  })

  t.test('every missing variable is reported, not only the first', async t => {
    const lines = problemsOf(() => parseConfig({
      servers: { x: { ...stdio, command: '${A}', args: ['${B}'] } },
      redis: { url: '${C}' }
    }, {}))
    t.same(lines, [
      '/redis/url: environment variable C is not set',
      '/servers/x/args/0: environment variable B is not set',
      '/servers/x/command: environment variable A is not set'
    ])
  })

  t.test('a malformed placeholder is an error that does not echo the text', async t => {
    for (const bad of ['x${', '${}', '${1ABC}', '${A B}', '${A:default}', 'sekrit${']) {
      const lines = problemsOf(() => parseConfig(minimal({ x: { ...stdio, env: { V: bad } } }), { A: 'a' }))
      t.equal(lines.length, 1, bad)
      t.match(lines[0], /^\/servers\/x\/env\/V: malformed placeholder/, bad)
      t.notMatch(lines[0], 'sekrit', bad)
    }
  })

  t.test('a placeholder in a numeric option is coerced to the number the schema asks for', async t => {
    const config = parseConfig({ ...minimal(), listen: { port: '${PORT:-9000}' } }, {})
    t.equal(config.listen.port, 9000)
    t.same(problemsOf(() => parseConfig({ ...minimal(), listen: { port: '${PORT}' } }, { PORT: 'eighty' })), ['/listen/port: must be integer'])
  })

  t.test('numbers YAML reads in string lists become strings', async t => {
    const config = parseConfig(minimal({ x: { ...stdio, args: ['--port', 3000], env: { DEBUG: 1, FLAG: true } } }), {})
    const x = config.servers.x as StdioServerConfig
    t.same(x.args, ['--port', '3000'])
    t.same(x.env, { DEBUG: '1', FLAG: 'true' })
  })
})

t.test('a bad config lists every bad path in one error', async t => {
  const lines = problemsOf(() => parseConfig({
    listen: { port: 70000, host: 1 },
    log: { level: 'loud' },
    http: { responseMode: 'xml', keepAliveMs: 10 },
    redis: { url: 'http://not-redis' },
    servers: {
      everything: { transport: 'stdio', command: ['node'], args: 'not-a-list' },
      'bad name!': stdio
    }
  }, {}))
  t.same(lines, [
    '/http/keepAliveMs: must be >= 1000',
    '/http/responseMode: must be one of: sse, json',
    '/listen/port: must be <= 65535',
    '/log/level: must be one of: fatal, error, warn, info, debug, trace, silent',
    '/redis/url: must match pattern "^rediss?://"',
    '/servers/bad name!: is not a valid name: a letter or digit, then letters, digits, - or _ (64 at most)',
    '/servers/everything/args: must be array',
    '/servers/everything/command: must be string'
  ])
})

t.test('the error says how many problems there are', async t => {
  t.throws(() => parseConfig({ servers: {} }, {}), { code: 'GW_ERR_CONFIG_INVALID', message: 'Invalid configuration: 1 problem\n  /servers: must NOT have fewer than 1 properties' })
  t.throws(() => parseConfig({}, {}), { code: 'GW_ERR_CONFIG_INVALID', message: /1 problem\n {2}\/servers: is required$/ })
})

t.test('unknown keys are rejected at every level', async t => {
  const lines = problemsOf(() => parseConfig({
    listn: {},
    http: { bodylimit: 1 },
    servers: {
      x: { ...stdio, restart: { maxRestart: 1 }, timeout: 5 },
      h: { transport: 'sse', url: 'http://h/sse', reconnect: { attempts: 1 } }
    }
  }, {}))
  t.same(lines, [
    '/http/bodylimit: is not a known option',
    '/listn: is not a known option',
    '/servers/h/reconnect/attempts: is not a known option',
    '/servers/x/restart/maxRestart: is not a known option',
    '/servers/x/timeout: is not a known option'
  ])
})

t.test('null (an empty YAML value) is rejected, not coerced to 0 or ""', async t => {
  t.same(problemsOf(() => parseConfig({ ...minimal(), listen: { port: null } }, {})), ['/listen/port: must not be empty (give it a value or remove the key)'])
  t.same(problemsOf(() => parseConfig({ ...minimal(), redis: null }, {})), ['/redis: must not be empty (give it a value or remove the key)'])
  t.same(problemsOf(() => parseConfig(null, {})), ['/: must not be empty (give it a value or remove the key)'])
})

t.test('stdio and HTTP servers each have their own shape', async t => {
  t.test('stdio: command required, HTTP options unknown', async t => {
    const lines = problemsOf(() => parseConfig(minimal({ s: { transport: 'stdio', url: 'http://x/mcp', headers: {} } }), {}))
    t.same(lines, ['/servers/s/command: is required', '/servers/s/headers: is an option of HTTP servers (streamable-http, sse) only', '/servers/s/url: is an option of HTTP servers (streamable-http, sse) only'])
  })

  t.test('streamable-http and sse: url required, stdio options unknown', async t => {
    for (const transport of ['streamable-http', 'sse']) {
      const lines = problemsOf(() => parseConfig(minimal({ h: { transport, command: 'node', restart: {} } }), {}))
      t.same(lines, ['/servers/h/command: is an option of stdio servers only', '/servers/h/restart: is an option of stdio servers only', '/servers/h/url: is required'], transport)
    }
  })

  t.test('an HTTP url must be http(s) and parse', async t => {
    t.same(problemsOf(() => parseConfig(minimal({ h: { transport: 'sse', url: 'ftp://h/sse' } }), {})), ['/servers/h/url: must match pattern "^https?://"'])
    t.same(problemsOf(() => parseConfig(minimal({ h: { transport: 'sse', url: 'http://' } }), {})), ['/servers/h/url: must be a valid URL'])
  })

  t.test('a missing or unknown transport is the only problem reported for that server', async t => {
    t.same(problemsOf(() => parseConfig(minimal({ a: { command: 'node' }, b: { transport: 'websocket', url: 'ws://x' } }), {})), [
      '/servers/a/transport: is required',
      '/servers/b/transport: must be one of: stdio, streamable-http, sse, aggregate'
    ])
  })

  t.test('both shapes validate side by side', async t => {
    const config = parseConfig(minimal({
      s: { ...stdio, args: ['server.js'], cwd: 'rel/dir', env: { A: 'b' }, inheritEnv: ['HOME'] },
      h: { transport: 'streamable-http', url: 'https://mcp.example.com/mcp', headers: { Authorization: 'Bearer x' }, forwardHeaders: ['X-Trace'] },
      l: { transport: 'sse', url: 'http://legacy.example.com/sse' }
    }), {})
    t.equal(config.servers.s?.transport, 'stdio')
    t.equal((config.servers.s as StdioServerConfig).cwd, 'rel/dir', 'a relative cwd is not rewritten')
    t.equal((config.servers.h as HttpServerConfig).headers.Authorization, 'Bearer x')
    t.equal(config.servers.l?.transport, 'sse')
  })

  t.test('a relative command is left as written', async t => {
    const config = parseConfig(minimal({ s: { transport: 'stdio', command: './bin/server', args: ['../data'] } }), {})
    t.equal((config.servers.s as StdioServerConfig).command, './bin/server')
    t.same((config.servers.s as StdioServerConfig).args, ['../data'])
  })
})

t.test('semantic checks the schema cannot express', async t => {
  t.test('delay bounds', async t => {
    const lines = problemsOf(() => parseConfig(minimal({
      s: { ...stdio, restart: { baseDelayMs: 1000, maxDelayMs: 10 } },
      h: { transport: 'sse', url: 'http://h/sse', reconnect: { baseDelayMs: 1000, maxDelayMs: 999 } }
    }), {}))
    t.same(lines, ['/servers/h/reconnect/maxDelayMs: must be at least baseDelayMs', '/servers/s/restart/maxDelayMs: must be at least baseDelayMs'])
  })

  t.test('redis url must parse', async t => {
    t.same(problemsOf(() => parseConfig({ ...minimal(), redis: { url: 'redis://' } }, {})), ['/redis/url: must be a valid URL'])
  })

  t.test('headers: names are tokens, gateway-managed ones are refused, values have no CR/LF; values are never shown', async t => {
    const secret = 'hunter2-very-secret'
    const lines = problemsOf(() => parseConfig(minimal({
      h: {
        transport: 'streamable-http',
        url: 'http://h/mcp',
        headers: { Authorization: 'Bearer ${TOKEN}', 'Mcp-Session-Id': 'x', 'bad name': 'y' },
        forwardHeaders: ['Authorization', 'Host', 'bad:name']
      }
    }), { TOKEN: `${secret}\r\nX-Injected: 1` }))
    t.same(lines, [
      '/servers/h/forwardHeaders/0: is a client credential and never goes upstream (set upstream credentials in headers, or per tenant)',
      '/servers/h/forwardHeaders/1: is set by the gateway and cannot be forwarded',
      '/servers/h/forwardHeaders/2: is not a valid header name',
      '/servers/h/headers/Authorization: value must not contain CR, LF or NUL',
      '/servers/h/headers/Mcp-Session-Id: is set by the gateway and cannot be configured',
      '/servers/h/headers/bad name: is not a valid header name'
    ])
    t.notMatch(lines.join('\n'), secret)
  })

  t.test('stdio: NUL bytes and bad variable names are caught before spawn() would throw', async t => {
    const lines = problemsOf(() => parseConfig(minimal({ s: { ...stdio, args: ['ok', 'a\0b'], env: { 'A=B': 'x', C: 's\0cret' } } }), {}))
    t.same(lines, ['/servers/s/args/1: must not contain NUL', '/servers/s/env/A=B: is not a valid variable name', '/servers/s/env/C: must not contain NUL'])
    t.notMatch(lines.join('\n'), 'cret')
  })

  t.test('a server name with "/" or "~" is escaped in the path', async t => {
    t.same(problemsOf(() => parseConfig(minimal({ 'a/b~c': stdio }), {})), ['/servers/a~1b~0c: is not a valid name: a letter or digit, then letters, digits, - or _ (64 at most)'])
  })
})

t.test('auth and tenants: cross-checks', async t => {
  const digest = 'a'.repeat(64)
  const http = { transport: 'streamable-http', url: 'http://127.0.0.1:9/mcp' }

  t.test('without tenants, a non-loopback listen address needs auth.anonymous', async t => {
    t.same(problemsOf(() => parseConfig({ ...minimal(), listen: { host: '0.0.0.0' } }, {})), [
      '/listen/host: is not a loopback address and no tenants are configured, so anyone reaching it could use every server: configure tenants, or set auth.anonymous: true to allow it'
    ])
    t.equal(parseConfig({ ...minimal(), listen: { host: '0.0.0.0' }, auth: { anonymous: true } }, {}).listen.host, '0.0.0.0')
    for (const host of ['127.0.0.1', '127.0.0.2', 'localhost', '::1']) t.equal(parseConfig({ ...minimal(), listen: { host } }, {}).listen.host, host)
  })

  t.test('with tenants: publicUrl required, servers must exist, anonymous contradicts', async t => {
    t.same(problemsOf(() => parseConfig({
      ...minimal(),
      listen: { host: '0.0.0.0' },
      auth: { anonymous: true },
      tenants: { acme: { apiKeys: [{ id: 'k', sha256: digest }, { id: 'k', sha256: digest }], servers: { x: {}, nosuch: {} } } }
    }, {})), [
      '/auth/anonymous: must be false when tenants are configured (every MCP endpoint then needs a credential)',
      '/auth/publicUrl: is required when tenants are configured (resource URLs and the 401 challenge derive from it)',
      '/tenants/acme/apiKeys/1/id: is used twice in this tenant',
      '/tenants/acme/servers/nosuch: names no configured server'
    ])
    const config = parseConfig({ ...minimal(), listen: { host: '0.0.0.0' }, auth: { publicUrl: 'https://mcp.example.com' }, tenants: { acme: { apiKeys: [{ id: 'k', sha256: digest }], servers: { x: {} } } } }, {})
    t.same(config.tenants?.acme?.servers.x, { upstream: { headers: {}, env: {} } })
    t.same(config.tenants?.acme?.limits, {})
  })

  t.test('jwksUri: https, or http for a loopback host only', async t => {
    const jwt = (jwksUri: string): Record<string, unknown> => ({ issuer: 'https://login.example.com/', jwksUri })
    t.same(problemsOf(() => parseConfig({
      ...minimal(),
      auth: { publicUrl: 'https://mcp.example.com' },
      tenants: { acme: { jwt: [jwt('http://login.example.com/jwks'), jwt('http://127.0.0.1:9/jwks'), jwt('https://login.example.com/jwks'), jwt('http://localhost/jwks')], servers: { x: {} } } }
    }, {})), ['/tenants/acme/jwt/0/jwksUri: must be https (http only for a loopback host)'])
  })

  t.test('upstream: headers for HTTP servers, env for stdio servers, both checked like the server\'s own', async t => {
    t.same(problemsOf(() => parseConfig({
      ...minimal({ x: stdio, h: http }),
      auth: { publicUrl: 'https://mcp.example.com' },
      tenants: {
        acme: {
          servers: {
            x: { upstream: { headers: { A: 'b' }, env: { 'A=B': 'c' } } },
            h: { upstream: { env: { A: 'b' }, headers: { 'Mcp-Session-Id': 'x', Authorization: 'Bearer ${T}' } } }
          }
        }
      }
    }, { T: 'x\r\ny' })), [
      '/tenants/acme/servers/h/upstream/env: applies to stdio servers only (use upstream.headers for an HTTP server)',
      '/tenants/acme/servers/h/upstream/headers/Authorization: value must not contain CR, LF or NUL',
      '/tenants/acme/servers/h/upstream/headers/Mcp-Session-Id: is set by the gateway and cannot be configured',
      '/tenants/acme/servers/x/upstream/env/A=B: is not a valid variable name',
      '/tenants/acme/servers/x/upstream/headers: applies to HTTP servers only (use upstream.env for a stdio server)'
    ])
  })
})

t.test('the result is deeply frozen', async t => {
  const config = parseConfig(minimal({ x: { ...stdio, args: ['a'] } }), {})
  t.ok(Object.isFrozen(config))
  // ESM is strict mode: writing to a frozen object throws instead of being ignored.
  t.throws(() => { (config.listen as { port: number }).port = 1 }, TypeError)
  t.throws(() => { (config.servers as Record<string, unknown>).y = {} }, TypeError)
  t.throws(() => { (config.servers.x as StdioServerConfig).args.push('b') }, TypeError)
  t.throws(() => { (config.servers.x as { restart: { maxRestarts: number } }).restart.maxRestarts = 9 }, TypeError)
  t.equal(config.listen.port, 8080)
})

t.test('loadConfig', async t => {
  const dir = t.testdir({
    'gw.json': JSON.stringify({ listen: { port: 9001 }, servers: { x: { transport: 'stdio', command: 'node', env: { T: '${T}' } } } }),
    'gw.yml': 'listen:\n  port: 9002\nservers:\n  x: { transport: stdio, command: node }\n',
    'gw.conf': '{"servers": {"x": {"transport": "stdio", "command": "node"}}}',
    'bad.json': '{"servers": {"x": {"env": {"K": "sekrit-value" x}}}}',
    'bad.yaml': 'servers:\n  x:\n    env: { K: sekrit-value\n  y: [\n',
    'dup.yaml': 'servers:\n  x: { transport: stdio, command: a }\n  x: { transport: stdio, command: b }\n',
    'multi.yaml': 'servers: {}\n---\nservers: {}\n',
    'empty.yaml': '',
    'invalid.yaml': 'servers:\n  x:\n    transport: stdio\n'
  })

  t.test('reads JSON by extension, with placeholders expanded', async t => {
    const config = await loadConfig(join(dir, 'gw.json'), { T: 'tok' })
    t.equal(config.listen.port, 9001)
    t.equal((config.servers.x as StdioServerConfig).env.T, 'tok')
    t.ok(Object.isFrozen(config.servers.x))
  })

  t.test('reads YAML (.yml), and any other extension as YAML, which accepts JSON too', async t => {
    t.equal((await loadConfig(join(dir, 'gw.yml'), {})).listen.port, 9002)
    t.equal((await loadConfig(join(dir, 'gw.conf'), {})).servers.x?.transport, 'stdio')
  })

  t.test('a JSON syntax error names the file and position but not the text', async t => {
    const { message } = await problemsOfAsync(() => loadConfig(join(dir, 'bad.json'), {}))
    t.match(message, `${join(dir, 'bad.json')}:1:`)
    t.match(message, 'not valid JSON')
    t.notMatch(message, 'sekrit')
  })

  t.test('a YAML syntax error names file, line and column but not the text', async t => {
    const { message, lines } = await problemsOfAsync(() => loadConfig(join(dir, 'bad.yaml'), {}))
    t.match(message, 'not valid YAML')
    t.match(lines[0], new RegExp(`^${join(dir, 'bad.yaml').replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:\\d+:\\d+: `))
    t.notMatch(message, 'sekrit')
  })

  t.test('duplicate keys and multiple documents are errors', async t => {
    t.match((await problemsOfAsync(() => loadConfig(join(dir, 'dup.yaml'), {}))).message, /dup\.yaml:3:3: Map keys must be unique/)
    t.match((await problemsOfAsync(() => loadConfig(join(dir, 'multi.yaml'), {}))).message, /multi\.yaml:\d+:\d+: .*document/)
  })

  t.test('an empty file and a schema failure are reported like any other', async t => {
    t.same((await problemsOfAsync(() => loadConfig(join(dir, 'empty.yaml'), {}))).lines, ['/: must not be empty (give it a value or remove the key)'])
    t.same((await problemsOfAsync(() => loadConfig(join(dir, 'invalid.yaml'), {}))).lines, ['/servers/x/command: is required'])
  })

  t.test('a missing file', async t => {
    await t.rejects(loadConfig(join(dir, 'nope.yaml'), {}), { code: 'GW_ERR_CONFIG_INVALID', message: /cannot read .*nope\.yaml: ENOENT/ })
  })
})

t.test('the shipped configs validate', async t => {
  t.test('config/gateway.yaml: loopback, the demo server, no Redis', async t => {
    const config = await loadConfig(shipped('gateway.yaml'), {})
    t.same(config.listen, { host: '127.0.0.1', port: 8080 })
    t.equal(config.redis, undefined)
    t.match(config.servers.everything, { transport: 'stdio', command: 'node', args: ['node_modules/@modelcontextprotocol/server-everything/dist/index.js', 'stdio'] })
  })

  t.test('config/gateway.docker.yaml needs REDIS_URL', async t => {
    const config = await loadConfig(shipped('gateway.docker.yaml'), { REDIS_URL: 'redis://redis:6379/0' })
    t.same(config.listen, { host: '0.0.0.0', port: 8080 })
    t.equal(config.auth.anonymous, true, 'no tenants on 0.0.0.0: said explicitly')
    t.equal(config.redis?.url, 'redis://redis:6379/0')
    t.equal(config.servers.everything?.transport, 'stdio')
    t.same((await problemsOfAsync(() => loadConfig(shipped('gateway.docker.yaml'), {}))).lines, ['/redis/url: environment variable REDIS_URL is not set'])
  })

  // The example documents every option with its default. Its switched-off lines ("# key: ...")
  // are switched on here, so the commented redis block and HTTP servers are checked too.
  // An editor modeline (`# yaml-language-server: $schema=…`) is a comment, not a switched-off option.
  const enable = (text: string): string => text.replace(/^(\s*)# (?!yaml-language-server:)(?=( *)([A-Za-z][A-Za-z0-9_-]*:(\s|$)|- ))/gm, '$1')

  t.test('config/gateway.example.yaml validates as shipped', async t => {
    const config = await loadConfig(shipped('gateway.example.yaml'), {})
    t.equal(config.redis, undefined)
    t.same(Object.keys(config.servers), ['everything'])
  })

  t.test('config/gateway.example.yaml validates with every switched-off option enabled', async t => {
    const dir = t.testdir({ 'all.yaml': enable(await readFile(shipped('gateway.example.yaml'), 'utf8')) })
    const env = { REDIS_URL: 'redis://127.0.0.1:6379/0', REMOTE_TOKEN: 'r', LEGACY_API_KEY: 'l', METRICS_TOKEN: 'metrics-token-0123456789', ADMIN_TOKEN: 'admin-token-0123456789-0123456789-01' }
    const config = await loadConfig(join(dir, 'all.yaml'), env)
    t.same(Object.keys(config.servers), ['everything', 'remote', 'legacy', 'workspace'])
    t.equal(config.redis?.url, env.REDIS_URL)
    t.equal((config.servers.remote as HttpServerConfig).headers.Authorization, 'Bearer r')
    t.equal(config.servers.legacy?.transport, 'sse')
    t.equal((config.servers.everything as StdioServerConfig).cwd, '.')
  })

  t.test('config/gateway.example.yaml shows every option of the schema, each at its default', async t => {
    const { parse } = await import('yaml')
    const raw = parse(enable(await readFile(shipped('gateway.example.yaml'), 'utf8'))) as Record<string, unknown>
    interface Node { properties?: Record<string, Node>, default?: unknown, then?: Node, else?: Node, additionalProperties?: Node | boolean, items?: Node }
    const missing: string[] = []
    const notDefault: string[] = []
    const walk = (schema: Node, value: unknown, path: string): void => {
      if (schema.default !== undefined && typeof schema.default !== 'object' && value !== schema.default) notDefault.push(path)
      for (const [key, sub] of Object.entries(schema.properties ?? {})) {
        const record = value as Record<string, unknown>
        if (!(key in record)) missing.push(`${path}/${key}`)
        else walk(sub, record[key], `${path}/${key}`)
      }
    }
    const root = configSchema as unknown as Node
    walk({ properties: Object.fromEntries(Object.entries(root.properties ?? {}).filter(([k]) => k !== 'servers')) }, raw, '')
    const servers = raw.servers as Record<string, unknown>
    const serverSchema = root.properties?.servers?.additionalProperties as Node
    // Credential sources each need their own fields (docs/credentials.md): the example shows one.
    const withoutCredentials = (node: Node): Node => ({ properties: Object.fromEntries(Object.entries(node.properties ?? {}).filter(([k]) => k !== 'credentials')) })
    walk(withoutCredentials(serverSchema.then as Node), servers.everything, '/servers/everything')
    walk(withoutCredentials((serverSchema.else as Node).else as Node), servers.remote, '/servers/remote')
    walk((serverSchema.else as Node).then as Node, servers.workspace, '/servers/workspace')
    // A tenant: its own keys, one JWT issuer and one server's settings. Tool policy and limits
    // are documented on their own (docs/authentication.md, Limits and tool policy).
    const tenantSchema = root.properties?.tenants?.additionalProperties as Node
    const without = (node: Node, ...keys: string[]): Node => ({ properties: Object.fromEntries(Object.entries(node.properties ?? {}).filter(([k]) => !keys.includes(k))) })
    const acme = (raw.tenants as Record<string, Record<string, unknown>>).acme ?? {}
    walk(without(tenantSchema, 'limits'), acme, '/tenants/acme')
    walk(tenantSchema.properties?.jwt?.items as Node, (acme.jwt as unknown[])[0], '/tenants/acme/jwt/0')
    walk(without(tenantSchema.properties?.servers?.additionalProperties as Node, 'tools', 'credentials'), (acme.servers as Record<string, unknown>).everything, '/tenants/acme/servers/everything')
    t.same(missing, [], 'options missing from the example')
    t.same(notDefault, [], 'options shown with a value other than their default')
  })
})

t.test('parseArgs', async t => {
  t.same(parseArgs([]), { configPath: DEFAULT_CONFIG_PATH, help: false, version: false, checkOnly: false })
  t.equal(DEFAULT_CONFIG_PATH, 'config/gateway.yaml')
  t.same(parseArgs(['--config', 'a.yaml']), { configPath: 'a.yaml', help: false, version: false, checkOnly: false })
  t.same(parseArgs(['--config=b.json']), { configPath: 'b.json', help: false, version: false, checkOnly: false })
  t.same(parseArgs(['-c', 'c.yaml']), { configPath: 'c.yaml', help: false, version: false, checkOnly: false })
  t.same(parseArgs(['--config', 'a.yaml', '--config', 'last.yaml']), { configPath: 'last.yaml', help: false, version: false, checkOnly: false }, 'the last one wins')
  t.same(parseArgs(['--help']), { configPath: DEFAULT_CONFIG_PATH, help: true, version: false, checkOnly: false })
  t.same(parseArgs(['-h', '-c', 'x.yaml']), { configPath: 'x.yaml', help: true, version: false, checkOnly: false })
  t.match(USAGE, '--config FILE')
  t.same(parseArgs(['--version']), { configPath: DEFAULT_CONFIG_PATH, help: false, version: true, checkOnly: false })
  t.same(parseArgs(['-V']).version, true)
  t.throws(() => parseArgs(['--verbose']), { code: 'GW_ERR_CONFIG_INVALID', message: /Unknown option '--verbose'[\s\S]*Usage:/ })
  t.throws(() => parseArgs(['-x']), { code: 'GW_ERR_CONFIG_INVALID', message: /Unknown option '-x'/ })
  t.throws(() => parseArgs(['gateway.yaml']), { code: 'GW_ERR_CONFIG_INVALID', message: /Unexpected argument 'gateway.yaml'/ })
  t.throws(() => parseArgs(['--config']), { code: 'GW_ERR_CONFIG_INVALID', message: /argument missing/ })
  t.throws(() => parseArgs(['--config=']), { code: 'GW_ERR_CONFIG_INVALID', message: /--config needs a file name/ })
  t.same(parseArgs(['--check-config', 'mine.yaml']), { configPath: 'mine.yaml', help: false, version: false, checkOnly: true })
  t.throws(() => parseArgs(['--check-config=']), { code: 'GW_ERR_CONFIG_INVALID', message: /--check-config needs a file name/ })
  t.throws(() => parseArgs(['--check-config', 'a.yaml', '--config', 'b.yaml']), { code: 'GW_ERR_CONFIG_INVALID', message: /do not go together/ })
})

t.test('parseArgs: MCP_GATEWAY_CONFIG names the file when no --config is given', async t => {
  t.equal(CONFIG_PATH_VARIABLE, 'MCP_GATEWAY_CONFIG')
  const env = { MCP_GATEWAY_CONFIG: '/etc/mcp-gateway/gateway.yaml' }
  t.same(parseArgs([], env), { configPath: '/etc/mcp-gateway/gateway.yaml', help: false, version: false, checkOnly: false })
  t.same(parseArgs(['--config', 'a.yaml'], env), { configPath: 'a.yaml', help: false, version: false, checkOnly: false }, '--config wins')
  t.same(parseArgs(['--check-config', 'b.yaml'], env), { configPath: 'b.yaml', help: false, version: false, checkOnly: true }, '--check-config wins')
  t.same(parseArgs([], { MCP_GATEWAY_CONFIG: '' }), { configPath: DEFAULT_CONFIG_PATH, help: false, version: false, checkOnly: false }, 'empty is unset')
  t.same(parseArgs([], {}), { configPath: DEFAULT_CONFIG_PATH, help: false, version: false, checkOnly: false })
  t.match(USAGE, '$MCP_GATEWAY_CONFIG')
})

t.test('${file:PATH} placeholders: a mounted secret file', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-file-placeholder-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })
  await writeFile(join(dir, 'token'), 's3cret\n')
  await writeFile(join(dir, 'crlf'), 'two\r\n')
  await writeFile(join(dir, 'lines'), 'a\nb\n\n')
  await writeFile(join(dir, 'bare'), 'no-newline')

  t.test('the file\'s content, one trailing newline dropped; mixed with text and env placeholders', async t => {
    const config = parseConfig(minimal({
      x: { ...stdio, env: { A: `\${file:${join(dir, 'token')}}`, B: `Bearer \${file:${join(dir, 'crlf')}}!`, C: `\${file:${join(dir, 'lines')}}`, D: `\${file:${join(dir, 'bare')}}-\${E}` } }
    }), { E: 'e' })
    t.same((config.servers.x as StdioServerConfig).env, { A: 's3cret', B: 'Bearer two!', C: 'a\nb\n', D: 'no-newline-e' })
  })

  t.test('the content is not expanded again', async t => {
    await writeFile(join(dir, 'dollar'), '${NOT_A_PLACEHOLDER}')
    const config = parseConfig(minimal({ x: { ...stdio, env: { A: `\${file:${join(dir, 'dollar')}}` } } }), {})
    t.equal((config.servers.x as StdioServerConfig).env.A, '${NOT_A_PLACEHOLDER}')
  })

  t.test('a numeric option from a file is coerced like an env placeholder', async t => {
    await writeFile(join(dir, 'port'), '9123\n')
    const config = parseConfig({ listen: { port: `\${file:${join(dir, 'port')}}` }, servers: { x: stdio } }, {})
    t.equal(config.listen.port, 9123)
  })

  t.test('an unreadable file is an error naming the path and the file, never content', async t => {
    const missing = join(dir, 'missing')
    const lines = problemsOf(() => parseConfig(minimal({ x: { ...stdio, env: { A: `\${file:${missing}}`, B: `\${file:${dir}}` } } }), {}))
    t.same(lines, [`/servers/x/env/A: cannot read file ${missing}: ENOENT`, `/servers/x/env/B: cannot read file ${dir}: EISDIR`])
  })

  t.test('${file:} with nothing after it is malformed', async t => {
    const lines = problemsOf(() => parseConfig(minimal({ x: { ...stdio, env: { A: '${file:}' } } }), {}))
    t.match(lines[0], /^\/servers\/x\/env\/A: malformed placeholder/)
  })
})

t.test('pooled sessions: maxSessions defaults by mode', async t => {
  const pooled = parseConfig(minimal({ x: { ...stdio, sessions: 'pooled' } }), {})
  t.equal((pooled.servers.x as StdioServerConfig).maxSessions, 10_000, 'pooled: sessions, 10000 by default')
  t.equal((pooled.servers.x as StdioServerConfig).poolMax, 16)
  const dedicated = parseConfig(minimal({ x: stdio }), {})
  t.equal((dedicated.servers.x as StdioServerConfig).maxSessions, 100, 'dedicated: children, 100 by default')
  t.equal((parseConfig(minimal({ x: { ...stdio, sessions: 'pooled', maxSessions: 50 } }), {}).servers.x as StdioServerConfig).maxSessions, 50, 'a given maxSessions stands')
  t.equal((parseConfig(minimal({ x: { ...stdio, poolMax: 2 } }), {}).servers.x as StdioServerConfig).poolSize, 2, 'an unset poolSize is at most the poolMax given')
  t.throws(() => parseConfig(minimal({ x: { ...stdio, sessions: 'shared' } }), {}), /sessions.*must be one of: dedicated, pooled/)
  t.same(problemsOf(() => parseConfig(minimal({ h: { transport: 'streamable-http', url: 'http://127.0.0.1:9/mcp', sessions: 'pooled' } }), {})),
    ['/servers/h/sessions: is an option of stdio servers only'], 'only stdio servers have a mode, and the message says so')
  t.same(problemsOf(() => parseConfig(minimal({ a: { transport: 'aggregate', members: [{ server: 'x' }], poolSize: 2 }, x: stdio }), {})),
    ['/servers/a/poolSize: is an option of stdio servers and HTTP servers (streamable-http, sse) only'])
})

t.test('poolMax below poolSize is refused with both named', async t => {
  t.same(problemsOf(() => parseConfig(minimal({ x: { ...stdio, poolSize: 8, poolMax: 4 } }), {})),
    ['/servers/x/poolMax: must be at least poolSize (poolMax is 4, poolSize 8; unset, poolMax is 16 for this transport)'])
  t.same(problemsOf(() => parseConfig(minimal({ x: { ...stdio, poolSize: 20 } }), {})),
    ['/servers/x/poolMax: must be at least poolSize (poolMax is 16, poolSize 20; unset, poolMax is 16 for this transport)'], 'the default poolMax counts')
  t.same(problemsOf(() => parseConfig(minimal({ h: { transport: 'streamable-http', url: 'http://127.0.0.1:9/mcp', poolSize: 64, poolMax: 32 } }), {})),
    ['/servers/h/poolMax: must be at least poolSize (poolMax is 32, poolSize 64; unset, poolMax is 256 for this transport)'])
  const equal = parseConfig(minimal({ x: { ...stdio, poolSize: 4, poolMax: 4 } }), {}).servers.x as StdioServerConfig
  t.same([equal.poolSize, equal.poolMax], [4, 4], 'equal is fine')
})

t.test('aggregate prefixes and separators: limits in words, the default prefix held to them', async t => {
  const long = 'a'.repeat(33)
  t.same(problemsOf(() => parseConfig(minimal({ agg: { transport: 'aggregate', members: [{ server: long }] }, [long]: stdio }), {})),
    [`/servers/agg/members/0/prefix: is required for a server whose name is longer than 32 characters (the default prefix is the server name; must be at most 32 characters, each a letter, digit, "_", "." or "-" ("" for no prefix))`])
  t.doesNotThrow(() => parseConfig(minimal({ agg: { transport: 'aggregate', members: [{ server: long, prefix: 'short' }] }, [long]: stdio }), {}), 'an explicit prefix stands in for the long name')
  t.doesNotThrow(() => parseConfig(minimal({ agg: { transport: 'aggregate', members: [{ server: 'a'.repeat(32) }] }, ['a'.repeat(32)]: stdio }), {}), '32 characters is the limit')
  t.same(problemsOf(() => parseConfig(minimal({ agg: { transport: 'aggregate', members: [{ server: 'x', prefix: 'has space' }], separator: '' }, x: stdio }), {})), [
    '/servers/agg/members/0/prefix: must be at most 32 characters, each a letter, digit, "_", "." or "-" ("" for no prefix)',
    '/servers/agg/separator: must be 1 to 8 characters, each a letter, digit, "_", "." or "-"'
  ])
})
