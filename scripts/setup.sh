#!/usr/bin/env bash
# Create .venv and install the project with what `make run` / `make test` need. Idempotent.
#   scripts/setup.sh            runtime + web stack + dev tools + experiment trackers, frontend build
#   SETUP_BROWSER=1 ...         also Debian's Chromium for the browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv

STAMP=$VENV/.setup-done  # written by the Makefile after a complete set-up

# Each stage says what it starts and how long it took: a first set-up downloads for minutes.
START=$SECONDS
stage() { STAGE=$1 STAGE_T0=$SECONDS; echo "setup: $1: $2 ..."; }
stage_done() { echo "setup: $STAGE: done in $((SECONDS - STAGE_T0)) s"; }

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "setup: $PY is $("$PY" -V 2>&1 || echo missing); SlideDP needs Python >= 3.10 (set PYTHON=python3.12 ...)" >&2
  exit 1
fi

if [ ! -x "$VENV/bin/pip" ]; then
  rm -rf "$VENV"  # a venv left half-made by an interrupted or failed run
  stage "Python environment" "creating $VENV with $("$PY" -V 2>&1) ($PY)"
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
  stage_done
fi
PIP="$VENV/bin/pip"
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  # Pinned: an unpinned torch pulls several GB of CUDA wheels; this CPU build installs in seconds.
  stage torch "installing torch 2.13.0 (the CPU build) into $VENV"
  "$PIP" install -q "torch==2.13.0"
  stage_done
fi
# Skipped when a complete set-up is newer than pyproject.toml (`make test` calls this again for the browser).
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ scripts/setup.sh -nt "$STAMP" ]; then
  stage dependencies "installing the project (editable) with its web, dev, data and trackers extras into $VENV"
  "$PIP" install -q -e ".[web,dev,data,trackers]"
  stage_done
else
  echo "setup: dependencies: $VENV is up to date with pyproject.toml"
fi

# The embedded workbench runs a private redis-server; install Debian's when it is missing.
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    stage redis-server "installing Debian's redis-server (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    # Debian starts a system service on install; the workbench runs its own.
    (service redis-server stop || true) >/dev/null 2>&1
    stage_done
  else
    echo "setup: redis-server is missing: install it (e.g. 'sudo apt-get install redis-server')" >&2
    exit 1
  fi
else
  echo "setup: redis-server: $(command -v redis-server)"
fi

if [ "${SETUP_BROWSER:-0}" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    stage chromium "installing Debian's chromium (apt-get) for the browser tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    stage_done
  else
    echo "setup: the browser tests need Debian's chromium at /usr/bin/chromium" >&2
    exit 1
  fi
fi

if [ -f frontend/package.json ]; then
  scripts/build_frontend.sh  # says when Node.js >= 20.19 with npm is missing
fi
echo "setup: ready in $((SECONDS - START)) s"
