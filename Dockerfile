# mcp-gateway image: build with dev dependencies, run with production ones only.
#   docker compose up --build      two replicas behind nginx with a shared Redis (docker-compose.yml)
#   docker build -t mcp-gateway . && docker run --rm -p 8080:8080 -e REDIS_URL=redis://HOST:6379/0 mcp-gateway
# The default config (config/gateway.docker.yaml) needs REDIS_URL; mount another file over it or
# pass `node dist/src/main.js --config FILE` as the command to change it.

# Node 26, the Active LTS line since October 2026 (CI runs the runtime-heavy tests on it; the whole
# suite runs on 20.18+, 22 and 24, tools/runtimes). Node 20 reached end of life in April 2026.
# Another supported line: --build-arg NODE_IMAGE=node:24-bookworm-slim (or node:22-bookworm-slim).
ARG NODE_IMAGE=node:26-bookworm-slim

# ---- build: compile TypeScript to dist/ ----
FROM ${NODE_IMAGE} AS build
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
# The image's unprivileged user; the app files stay root-owned, so the gateway cannot rewrite them.
USER node
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:8080/healthz').then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["node", "dist/src/main.js", "--config", "/app/config/gateway.docker.yaml"]
