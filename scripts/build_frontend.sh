#!/usr/bin/env bash
# Build frontend/dist from the committed lockfile; skipped when dist is newer than every source file.
set -euo pipefail
cd "$(dirname "$0")/../frontend"
if [ -f dist/index.html ] && [ -z "$(find src index.html package.json package-lock.json vite.config.* -newer dist/index.html 2>/dev/null | head -1)" ]; then
  exit 0
fi
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  # `npm ci` refuses a lockfile that lacks an optional dependency the registry could not resolve when the lock
  # was written (vite's Windows-only napi-windows-process-start-time); `npm install --no-save` then installs the
  # same locked versions without rewriting the lockfile.
  if ! npm ci --no-audit --no-fund --loglevel=error 2>/dev/null; then
    echo "build_frontend: npm ci refused the lockfile; installing its versions with npm install --no-save"
    npm install --no-save --no-audit --no-fund --loglevel=error
  fi
fi
npm run build --silent
