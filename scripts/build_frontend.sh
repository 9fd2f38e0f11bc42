#!/usr/bin/env bash
# Build frontend/dist from the committed lockfile; skipped when dist is newer than every source file.
set -euo pipefail
cd "$(dirname "$0")/../frontend"
if [ -f dist/index.html ] && [ -z "$(find src index.html package.json package-lock.json tsconfig.json vite.config.* -newer dist/index.html 2>/dev/null | head -1)" ]; then
  exit 0
fi
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
npm run build --silent
