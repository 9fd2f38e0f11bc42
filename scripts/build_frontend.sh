#!/usr/bin/env bash
# Build frontend/dist from the committed lockfile; skipped when dist is newer than every source file.
# Needs Node.js >= 20.19 with npm (Vite 8), only when a build is due.
set -euo pipefail
cd "$(dirname "$0")/../frontend"
# One build at a time (parallel test workers, a wheel build): the others wait, then find dist up to date.
if command -v flock >/dev/null 2>&1; then
  exec 9<.
  flock 9
fi
if [ -f dist/index.html ] && [ -z "$(find src index.html package.json package-lock.json tsconfig.json vite.config.* -newer dist/index.html 2>/dev/null | head -1)" ]; then
  echo "frontend: the UI in frontend/dist is up to date"
  exit 0
fi
NEED="Node.js >= 20.19 with npm (https://nodejs.org or your distribution)"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "frontend: building the UI needs $NEED; node or npm is not on PATH" >&2
  exit 1
fi
if ! node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)'; then
  echo "frontend: building the UI needs $NEED; this node is $(node --version)" >&2
  exit 1
fi
T0=$SECONDS
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "frontend: installing the UI's packages (npm ci) ..."
  npm ci --no-audit --no-fund --loglevel=error
fi
echo "frontend: building the UI into frontend/dist (tsc, vite build) ..."
npm run build --silent
echo "frontend: UI built in $((SECONDS - T0)) s"
