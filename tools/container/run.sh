#!/usr/bin/env bash
# The gateway as an operator deploys it, proven on this machine: builds the project's Dockerfile as
# shipped, runs the image (health, readiness, an MCP session from the host, the unprivileged user,
# tini reaping orphans, SIGTERM draining to exit 0, the HEALTHCHECK on the configured port), the
# compose topology (two replicas behind nginx and Redis, one session across both, a replica stopped
# mid-session), and the Kubernetes base (every overlay rendered and validated against the API
# schemas, its ConfigMap and Secret run in the image).
#
#   tools/container/run.sh [image] [compose] [kubernetes]     (default: all three, in that order)
#
# Needs root (it starts a private dockerd; see engine.sh) on Debian with the mirror and the npm
# registry reachable; no container registry is used: the base images are built locally
# (debootstrap) under the names the Dockerfile and compose expect. Exit 0 when everything held;
# otherwise the first failure is printed and the exit is 1. Everything it started is stopped.
# Timings of each phase are printed ("# container: ... (N s since start)").
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
HERE=$REPO/tools/container
. "$HERE/engine.sh"

steps=("$@")
[ "${#steps[@]}" -eq 0 ] && steps=(image compose kubernetes)
for s in "${steps[@]}"; do
  case $s in image|compose|kubernetes) ;; *) echo "usage: $0 [image] [compose] [kubernetes]" >&2; exit 2 ;; esac
done
[ "$(id -u)" -eq 0 ] || die "needs root (it starts its own dockerd)"

IMAGE=mcp-gateway:ci
PROJECT=mcpgwci
WORK=$(mktemp -d /tmp/mcpgw-container.XXXXXX)
ENGINE_PID=

cleanup () {
  local rc=$?
  if [ -n "${ENGINE_PID:-}" ]; then
    if [ -f "$WORK/compose-up" ]; then
      (cd "$REPO" && docker-compose -p "$PROJECT" down -v --remove-orphans >/dev/null 2>&1) || true
    fi
    engine_stop
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port () { node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})"; }

# Waits for a container's HEALTHCHECK to say healthy; prints the seconds it took.
wait_healthy () {
  local name=$1 limit=${2:-60} started=$SECONDS status
  while :; do
    status=$("$DOCKER" inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$name" 2>/dev/null) || die "container $name is gone"
    [ "$status" = healthy ] && { echo $((SECONDS - started)); return 0; }
    [ "$("$DOCKER" inspect -f '{{.State.Running}}' "$name")" = true ] || { "$DOCKER" logs --tail 30 "$name" >&2; die "container $name exited (logs above)"; }
    [ $((SECONDS - started)) -ge "$limit" ] && { "$DOCKER" logs --tail 30 "$name" >&2; die "container $name not healthy within $limit s (status $status)"; }
    sleep 0.5
  done
}

# Process states inside a container, from /proc (the image has no ps): "PID COMM STATE" lines.
procs () { "$DOCKER" exec "$1" sh -c 'for f in /proc/[0-9]*/stat; do cat "$f" 2>/dev/null; echo; done' | sed -nE 's/^([0-9]+) \((.*)\) ([A-Za-z]) .*/\1 \2 \3/p'; }

build_image () {
  phase "building the image from the Dockerfile as shipped"
  local t0=$SECONDS
  "$DOCKER" build --network host -t "$IMAGE" "$REPO" >"$WORK/build.log" 2>&1 || { tail -n 40 "$WORK/build.log" >&2; die "docker build failed (log above)"; }
  say "image built in $((SECONDS - t0)) s ($("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}'))"
}

check_image () {
  phase "image: one replica"
  "$DOCKER" network create "$PROJECT-net" >/dev/null || die "cannot create a network"
  "$DOCKER" run -d --name "$PROJECT-redis" --network "$PROJECT-net" "$REDIS_IMAGE_TAG" >/dev/null || die "cannot start Redis"
  local port gw=$PROJECT-gw
  port=$(free_port)
  "$DOCKER" run -d --name "$gw" --network "$PROJECT-net" -p "127.0.0.1:$port:8080" \
    -e REDIS_URL="redis://$PROJECT-redis:6379/0" "$IMAGE" >/dev/null || die "cannot start the gateway container"
  say "healthy in $(wait_healthy "$gw") s (the image's HEALTHCHECK)"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")" = 200 ] || die "/readyz is not 200"
  [ "$("$DOCKER" inspect -f '{{.Config.User}}' "$IMAGE")" = 1000:1000 ] || die "the image's USER is not 1000:1000"
  [ "$("$DOCKER" exec "$gw" id -u)" = 1000 ] || die "the gateway does not run as uid 1000"
  [ "$("$DOCKER" exec "$gw" cat /proc/1/comm)" = tini ] || die "PID 1 is not tini"
  # An orphan: the shell exits at once, its sleep is reparented to PID 1, which must reap it.
  "$DOCKER" exec "$gw" sh -c 'sleep 1 & exit 0'
  node "$HERE/check-session.mjs" "http://127.0.0.1:$port" --kill-child "$gw" || die "the MCP session through the container failed"
  sleep 2
  local zombies
  zombies=$(procs "$gw" | awk '$NF == "Z"')
  [ -z "$zombies" ] || die "zombies in the container: $zombies"
  say "uid 1000, tini is PID 1, no zombie after an orphan and a SIGKILLed stdio child"
  local t0=$SECONDS
  "$DOCKER" stop -t 30 "$gw" >/dev/null
  local took=$((SECONDS - t0)) code
  code=$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$gw")
  [ "$code" = 0 ] || { "$DOCKER" logs --tail 20 "$gw" >&2; die "SIGTERM: exit code $code, not 0"; }
  [ "$took" -lt 30 ] || die "SIGTERM: took $took s, the grace period"
  # Read whole, then searched: `grep -q` would close the pipe early and pipefail report docker's SIGPIPE.
  local logs
  logs=$("$DOCKER" logs "$gw" 2>&1)
  grep -q '"signal":"SIGTERM","drainMs":5000' <<<"$logs" || die "no drain logged at SIGTERM"
  say "SIGTERM: drained and exited 0 in $took s"

  # The HEALTHCHECK follows the configured port (MCP_GATEWAY_CONFIG names another file).
  mkdir -p "$WORK/port"
  sed -E 's/^  port: 8080$/  port: 9191/' config/gateway.docker.yaml >"$WORK/port/gateway.yaml"
  grep -q 'port: 9191' "$WORK/port/gateway.yaml" || die "could not derive a config on port 9191"
  chmod -R a+rX "$WORK/port"
  "$DOCKER" run -d --name "$gw-9191" --network "$PROJECT-net" -v "$WORK/port:/etc/mcp-gateway:ro" \
    -e MCP_GATEWAY_CONFIG=/etc/mcp-gateway/gateway.yaml -e REDIS_URL="redis://$PROJECT-redis:6379/0" "$IMAGE" >/dev/null || die "cannot start the gateway on port 9191"
  say "listening on 9191: healthy in $(wait_healthy "$gw-9191") s"
  "$DOCKER" rm -f "$gw-9191" "$gw" "$PROJECT-redis" >/dev/null
  "$DOCKER" network rm "$PROJECT-net" >/dev/null
}

check_compose () {
  phase "compose: Redis, two replicas, nginx"
  local port
  port=$(free_port)
  export MCP_GATEWAY_IMAGE=$IMAGE REDIS_IMAGE=$REDIS_IMAGE_TAG NGINX_IMAGE=$NGINX_IMAGE_TAG MCP_GATEWAY_PUBLISH="127.0.0.1:$port"
  local t0=$SECONDS
  touch "$WORK/compose-up"
  docker-compose -p "$PROJECT" up -d --no-build >"$WORK/compose.log" 2>&1 || { cat "$WORK/compose.log" >&2; die "docker-compose up failed"; }
  local c
  for c in redis gateway-a gateway-b lb; do
    c=$(docker-compose -p "$PROJECT" ps -q "$c")
    [ -n "$c" ] || die "compose service missing"
  done
  for c in gateway-a gateway-b; do wait_healthy "$(docker-compose -p "$PROJECT" ps -q "$c")" 90 >/dev/null; done
  for _ in $(seq 1 60); do curl -fsS -o /dev/null "http://127.0.0.1:$port/readyz" && break; sleep 0.5; done
  curl -fsS -o /dev/null "http://127.0.0.1:$port/readyz" || { docker-compose -p "$PROJECT" logs --tail 20 >&2; die "nginx does not answer /readyz"; }
  say "up and ready through nginx in $((SECONDS - t0)) s"
  local a b
  a=$(docker-compose -p "$PROJECT" ps -q gateway-a)
  b=$(docker-compose -p "$PROJECT" ps -q gateway-b)
  node "$HERE/check-session.mjs" "http://127.0.0.1:$port" --across "$a,$b" --stop-mid-session "$PROJECT" || { docker-compose -p "$PROJECT" logs --tail 30 >&2; die "the session across the replicas failed"; }
  t0=$SECONDS
  docker-compose -p "$PROJECT" stop >/dev/null 2>&1 || die "docker-compose stop failed"
  say "compose stopped in $((SECONDS - t0)) s"
  for c in $a $b; do
    [ "$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$c")" = 0 ] || die "a replica exited non-zero at stop"
  done
  docker-compose -p "$PROJECT" down -v >/dev/null 2>&1
  rm -f "$WORK/compose-up"
}

check_kubernetes () {
  phase "kubernetes: render and validate every overlay"
  node "$HERE/check-kubernetes.mjs" --out "$WORK/k8s" || die "the Kubernetes manifests failed validation"
  phase "kubernetes: the trial overlay's ConfigMap and Secret in the image"
  "$DOCKER" network create "$PROJECT-net" >/dev/null || die "cannot create a network"
  # Stands in for the Redis the Secret's URL names, under that host name.
  "$DOCKER" run -d --name "$PROJECT-k8s-redis" --network "$PROJECT-net" --network-alias "$(cat "$WORK/k8s/redis-host")" "$REDIS_IMAGE_TAG" >/dev/null || die "cannot start Redis"
  local port gw=$PROJECT-k8s-gw args
  port=$(free_port)
  chmod -R a+rX "$WORK/k8s"
  # As the Deployment runs it: its mounts (the ConfigMap's folder, the Secret's files, emptyDirs
  # for /tmp and HOME), its variables, its user, a read-only root, no capability.
  mapfile -t args <"$WORK/k8s/docker-args"
  "$DOCKER" run -d --name "$gw" --network "$PROJECT-net" -p "127.0.0.1:$port:8080" "${args[@]}" "$IMAGE" >/dev/null \
    || die "cannot start the gateway with the Kubernetes config"
  say "healthy in $(wait_healthy "$gw") s with the rendered ConfigMap and Secret"
  node "$HERE/check-session.mjs" "http://127.0.0.1:$port" --api-key "$(cat "$WORK/k8s/api-key")" --host "$(cat "$WORK/k8s/host")" --metrics-token "$(cat "$WORK/k8s/metrics-token")" \
    || { "$DOCKER" logs --tail 30 "$gw" >&2; die "the session with the Kubernetes config failed"; }
  # The admin API on the pod's loopback (admin.listen), with the token from the Secret's file.
  "$DOCKER" exec -e "TOKEN=$(cat "$WORK/k8s/secrets/admin-token")" "$gw" node -e \
    "fetch('http://127.0.0.1:9090/admin/api/overview', { headers: { authorization: 'Bearer ' + process.env.TOKEN } }).then(r => process.exit(r.status === 200 ? 0 : 1), () => process.exit(1))" \
    || die "the admin API on the pod's loopback refused the Secret's token"
  say "the admin API answers on the pod's loopback with the Secret's token"
  # A rotated secret: the Secret's file changes and a reload (SIGHUP to tini, which passes it on)
  # reads it again. API keys are reloadable (tenants); the Redis URL, admin and metrics tokens need
  # a restart.
  local old new digest host
  old=$(cat "$WORK/k8s/api-key")
  new=mgw_rotated_$(node -e "process.stdout.write(require('crypto').randomBytes(24).toString('hex'))")
  digest=$(printf '%s' "$new" | sha256sum | cut -d' ' -f1)
  host=$(cat "$WORK/k8s/host")
  init_as () {
    curl -s -o /dev/null -w '%{http_code}' -H "host: $host:$port" -H "authorization: Bearer $1" -H 'content-type: application/json' \
      -H 'accept: application/json, text/event-stream' --max-time 10 "http://127.0.0.1:$port/mcp/everything" \
      -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"rotation","version":"1"}}}'
  }
  [ "$(init_as "$old")" = 200 ] || die "the API key from the Secret is refused"
  printf '%s\n' "$digest" >"$WORK/k8s/secrets/api-key-primary.sha256"
  "$DOCKER" kill -s HUP "$gw" >/dev/null
  for _ in $(seq 1 40); do [ "$(init_as "$new")" = 200 ] && break; sleep 0.25; done
  [ "$(init_as "$new")" = 200 ] || { "$DOCKER" logs --tail 10 "$gw" >&2; die "the rotated API key was not picked up by a reload"; }
  [ "$(init_as "$old")" = 401 ] || die "the old API key still works after the reload"
  say "a rotated Secret file is read again on reload (SIGHUP): the new API key works, the old one gets 401"
  "$DOCKER" rm -f "$gw" "$PROJECT-k8s-redis" >/dev/null
  "$DOCKER" network rm "$PROJECT-net" >/dev/null
}

engine_packages
command -v kubectl >/dev/null 2>&1 || die "kubectl is not installed (it renders the kustomizations)"
phase "engine"
engine_start
phase "base images"
base_images
build_image
for s in "${steps[@]}"; do "check_$s"; done
phase "all held"
