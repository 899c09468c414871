# mcp-gateway image: build with dev dependencies, run with production ones only.
#   docker compose up --build      two replicas behind nginx with a shared Redis (docker-compose.yml)
#   docker build -t mcp-gateway . && docker run --rm -p 8080:8080 -e REDIS_URL=redis://HOST:6379/0 mcp-gateway
# The default config (config/gateway.docker.yaml) needs REDIS_URL; point MCP_GATEWAY_CONFIG at another
# file (e.g. a mounted ConfigMap) to change it, without replacing the command.
# An npm mirror for both installs: --build-arg NPM_CONFIG_REGISTRY=https://npm.example.internal/
# (never a token here: build arguments stay in the image's history; use a BuildKit secret for one).
# Without a registry: tools/container/run.sh builds a local base image and runs this file (docs/deploying.md).

# Node 26, the Active LTS line since October 2026 (CI runs the runtime-heavy tests on it; the whole
# suite runs on 20.18+, 22 and 24, tools/runtimes). Node 20 reached end of life in April 2026.
# Another supported line: --build-arg NODE_IMAGE=node:24-bookworm-slim (or node:22-bookworm-slim).
ARG NODE_IMAGE=node:26-bookworm-slim

# ---- build: compile TypeScript to dist/ ----
FROM ${NODE_IMAGE} AS build
ARG NPM_CONFIG_REGISTRY
WORKDIR /app
COPY package.json package-lock.json ./
# --ignore-scripts: `prepare` runs tsc, and the sources are not copied yet (this layer is cached
# until the lockfile changes). No dependency needs an install script.
RUN npm ci --ignore-scripts
COPY tsconfig.json ./
COPY src ./src
RUN npm run build

# ---- runtime ----
FROM ${NODE_IMAGE} AS runtime
ARG NPM_CONFIG_REGISTRY
# tini is PID 1: it forwards SIGTERM to node (which stops its stdio children itself, gracefully)
# and reaps any process that is orphaned, so no zombies pile up. No -g: signalling the whole
# group would kill the children before the gateway's own stop ladder runs.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*
ENV NODE_ENV=production
WORKDIR /app
COPY package.json package-lock.json ./
# Production dependencies only, which include the demo backend
# @modelcontextprotocol/server-everything; --ignore-scripts skips `prepare` (tsc is not here).
RUN npm ci --omit=dev --ignore-scripts && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY config ./config
# The config file, unless --config is given: an orchestrator sets this rather than the command,
# which would drop tini from the entrypoint.
ENV MCP_GATEWAY_CONFIG=/app/config/gateway.docker.yaml
# The image's unprivileged user (node, uid 1000), by number so that Kubernetes' runAsNonRoot can
# verify it; the app files stay root-owned, so the gateway cannot rewrite them.
USER 1000:1000
EXPOSE 8080
# Asks /healthz on the port of the config the gateway runs (the same MCP_GATEWAY_CONFIG).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["node", "dist/src/healthcheck.js"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["node", "dist/src/main.js"]
