#!/usr/bin/env bash
# Runs the compiled tests (dist/, built by `npm run build`) under Node.js lines besides the
# machine's own, from tools/runtimes (npm packages that ship the binary).
#   tools/runtimes/run-suite.sh [22] [24] [26] [--all | --short | -- test files]
# Default lines: 22, 24 (the supported lines besides 20) and 26 (the Docker image's).
# Default tests: the ones that lean on the runtime most (RUNTIME_TESTS below: real SDK clients,
# HTTP backends, the process itself, the HTTP faces, JWT crypto, the Redis twins). `--all` runs
# the whole suite; after `--`, only the given compiled test files run. The whole suite runs on the
# machine's Node (`npm test`): three whole runs would not fit CI's 20 minutes on a 2-core machine.
# Each run's tap output goes to stdout; the exit code is non-zero if any run failed.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
[ -d tools/runtimes/node_modules ] || npm ci --no-audit --no-fund --prefix tools/runtimes >/dev/null || exit 1
RUNTIME_TESTS=(
  dist/test/integration/gateway-sdk.test.js dist/test/integration/gateway-http-backend.test.js
  dist/test/integration/process.test.js dist/test/http/*.test.js dist/test/auth/jwt.test.js dist/test/state/*.test.js
  dist/test/integration/pooled-sessions.test.js dist/test/integration/aggregate.test.js
)
# `--short`: the part of that list that leans on the runtime itself rather than on the gateway's
# HTTP handling (the SDK clients end to end, the process's signals and children, JWT crypto, the
# Redis twins), about half its time: what CI runs on Node 22, the line nearest the machine's 20.
SHORT_TESTS=(
  dist/test/integration/gateway-sdk.test.js dist/test/integration/process.test.js
  dist/test/auth/jwt.test.js dist/test/state/*.test.js
)
lines=()
while [ $# -gt 0 ] && [ "$1" != "--" ] && [ "$1" != "--all" ] && [ "$1" != "--short" ]; do lines+=("$1"); shift; done
files=("${RUNTIME_TESTS[@]}")
if [ "${1:-}" = "--all" ]; then files=(); shift
elif [ "${1:-}" = "--short" ]; then files=("${SHORT_TESTS[@]}"); shift
elif [ "${1:-}" = "--" ]; then shift; files=("$@"); fi
[ ${#lines[@]} -gt 0 ] || lines=(22 24 26)
rc=0
for v in "${lines[@]}"; do
  bin="$root/tools/runtimes/node_modules/node$v/bin"
  [ -x "$bin/node" ] || { echo "no Node $v in tools/runtimes"; rc=1; continue; }
  echo "# ---- tests on Node $("$bin/node" --version) (${#files[@]} files; 0: the whole suite) ----"
  # The gateway processes the tests spawn use process.execPath, so they run on this Node too.
  PATH="$bin:$PATH" "$bin/node" "$root/node_modules/.bin/tap" "${files[@]}" || rc=1
done
exit $rc
