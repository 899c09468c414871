#!/usr/bin/env bash
# Runs the compiled test suite (dist/, built by `npm run build`) under each Node.js line the gateway
# supports besides the machine's own: 22 and 24, from tools/runtimes (npm packages that ship the
# binary). Usage: tools/runtimes/run-suite.sh [22] [24]   (default: both). Each run's tap output
# goes to stdout; the exit code is non-zero if any run failed.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
[ -d tools/runtimes/node_modules ] || npm ci --no-audit --no-fund --prefix tools/runtimes >/dev/null || exit 1
rc=0
for line in "${@:-22 24}"; do
  for v in $line; do
    bin="$root/tools/runtimes/node_modules/node$v/bin"
    [ -x "$bin/node" ] || { echo "no Node $v in tools/runtimes"; rc=1; continue; }
    echo "# ---- test suite on Node $("$bin/node" --version) ----"
    # The gateway processes the tests spawn use process.execPath, so they run on this Node too.
    PATH="$bin:$PATH" "$bin/node" "$root/node_modules/.bin/tap" || rc=1
  done
done
exit $rc
