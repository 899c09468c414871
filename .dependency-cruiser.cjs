// The import rules of docs/architecture.md ("Layers", "Rooms inside src/routing/"), checked in the
// test suite (test/architecture.test.ts) with dependency-cruiser.

/** A rule: src/routing/<room>/ imports no other routing room than `allowed`. */
const below = (room, allowed) => ({
  name: `${room}-imports-only-below`,
  comment: `src/routing/${room}/ may import only ${allowed.join(', ') || 'nothing'} of the routing rooms`,
  severity: 'error',
  from: { path: `^src/routing/${room}/` },
  to: { path: '^src/routing/', pathNot: [`^src/routing/${room}/`, ...allowed.map(r => `^src/routing/${r}/`)] }
})

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    { name: 'no-circular', severity: 'error', comment: 'an import circle ties modules that should stand alone', from: {}, to: { circular: true } },
    { name: 'http-is-the-top', severity: 'error', comment: 'only main/app and the HTTP layer import it', from: { path: '^src/', pathNot: ['^src/http/', '^src/app\\.ts$', '^src/main\\.ts$'] }, to: { path: '^src/http/' } },
    { name: 'routing-below-http', severity: 'error', from: { path: '^src/(backends|state|auth|config|core|telemetry)/' }, to: { path: '^src/routing/' } },
    { name: 'core-imports-nothing', severity: 'error', from: { path: '^src/core/' }, to: { path: '^src/', pathNot: '^src/core/' } },
    { name: 'state-below-telemetry', severity: 'error', from: { path: '^src/state/' }, to: { path: '^src/(telemetry|auth|backends)/' } },
    { name: 'credentials-layer', severity: 'error', comment: 'src/credentials/ may import config, core, state, telemetry only', from: { path: '^src/credentials/' }, to: { path: '^src/(auth|backends|routing)/' } },
    { name: 'credentials-above-state', severity: 'error', comment: 'only routing, backends, http and app use the credential sources', from: { path: '^src/(state|config|core|telemetry|auth)/' }, to: { path: '^src/credentials/' } },
    below('upstream', []),
    below('aggregate', ['upstream']),
    below('replica', ['upstream']),
    below('kinds', ['upstream', 'aggregate', 'replica'])
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: { extensions: ['.ts', '.js'] }
  }
}
