#!/usr/bin/env bash
# Create .venv and install the project with what `make run` / `make test` need. Idempotent.
#   scripts/setup.sh            runtime + web stack + dev tools, frontend build
#   SETUP_BROWSER=1 ...         also Debian's Chromium for the browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv

STAMP=$VENV/.setup-done  # written by the Makefile after a complete set-up

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "setup: $PY is $("$PY" -V 2>&1 || echo missing); SlideDP needs Python >= 3.10 (set PYTHON=python3.12 ...)" >&2
  exit 1
fi

if [ ! -x "$VENV/bin/pip" ]; then
  rm -rf "$VENV"  # a venv left half-made by an interrupted or failed run
  # A torch already installed for this Python (a CUDA build on a GPU workstation) is kept: the venv sees it.
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: using the torch already installed for $PY ($("$PY" -c 'import torch; print(torch.__version__)'))"
    VENV_ARGS=--system-site-packages
  else
    VENV_ARGS=
  fi
  if ! "$PY" -m venv $VENV_ARGS "$VENV"; then
    rm -rf "$VENV"
    echo "setup: '$PY -m venv' failed; on Debian/Ubuntu install the venv module (apt-get install python3-venv)" >&2
    exit 1
  fi
  "$VENV/bin/pip" install -q --upgrade pip
fi
PIP="$VENV/bin/pip"
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  # Pinned: an unpinned torch pulls several GB of CUDA wheels; this CPU build installs in seconds.
  "$PIP" install -q "torch==2.13.0"
fi
# Skipped when a complete set-up is newer than pyproject.toml (`make test` calls this again for the browser).
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ scripts/setup.sh -nt "$STAMP" ]; then
  "$PIP" install -q -e ".[web,dev,data]"
fi

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
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup: building the UI needs Node.js >= 20.19 with npm (https://nodejs.org or your distribution)" >&2
    exit 1
  fi
  scripts/build_frontend.sh
fi
