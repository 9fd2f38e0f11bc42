#!/usr/bin/env bash
# Create .venv and install the project with what `make run` / `make test` need. Idempotent.
#   scripts/setup.sh            runtime + web stack + dev tools, frontend build
#   SETUP_BROWSER=1 ...         also Debian's Chromium for the browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv

if [ ! -x "$VENV/bin/python" ]; then
  # A torch already installed for this Python (a CUDA build on a GPU workstation) is kept: the venv sees it.
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: using the torch already installed for $PY ($("$PY" -c 'import torch; print(torch.__version__)'))"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
  "$VENV/bin/pip" install -q --upgrade pip
fi
PIP="$VENV/bin/pip"
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  # Pinned: an unpinned torch pulls several GB of CUDA wheels; this CPU build installs in seconds.
  "$PIP" install -q "torch==2.13.0"
fi
"$PIP" install -q -e ".[web,dev,data]"

# The embedded workbench runs a private redis-server; install Debian's when it is missing.
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    # Debian starts a system service on install; the workbench runs its own.
    (service redis-server stop || true) >/dev/null 2>&1
  else
    echo "setup: redis-server is missing: install it (e.g. 'sudo apt-get install redis-server')" >&2
    exit 1
  fi
fi

if [ "${SETUP_BROWSER:-0}" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "setup: the browser tests need Debian's chromium at /usr/bin/chromium" >&2
    exit 1
  fi
fi

if [ -f frontend/package.json ]; then
  scripts/build_frontend.sh
fi
