#!/usr/bin/env bash
# Runs the compiled test suite (dist/, built by `npm run build`) under Node.js lines besides the
# machine's own, from tools/runtimes (npm packages that ship the binary).
#   tools/runtimes/run-suite.sh [22] [24] [26] [-- test files]
# Default: the whole suite on 22 and 24 (the supported lines besides 20). After `--`, only the
# given compiled test files run (CI runs the integration files on 26, the image's Node). Each run's
# tap output goes to stdout; the exit code is non-zero if any run failed.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
[ -d tools/runtimes/node_modules ] || npm ci --no-audit --no-fund --prefix tools/runtimes >/dev/null || exit 1
lines=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do lines+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#lines[@]} -gt 0 ] || lines=(22 24)
rc=0
for v in "${lines[@]}"; do
  bin="$root/tools/runtimes/node_modules/node$v/bin"
  [ -x "$bin/node" ] || { echo "no Node $v in tools/runtimes"; rc=1; continue; }
  echo "# ---- test suite on Node $("$bin/node" --version)${1:+ (${#} files)} ----"
  # The gateway processes the tests spawn use process.execPath, so they run on this Node too.
  PATH="$bin:$PATH" "$bin/node" "$root/node_modules/.bin/tap" "$@" || rc=1
done
exit $rc
