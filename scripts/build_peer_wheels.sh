#!/usr/bin/env bash
# Wheels for the DeepSpeed ZeRO-Offload peer (slidedp.peers.deepspeed_zero), for a GPU machine without a package
# index: DeepSpeed itself, built here from its sdist, and the dependencies such a machine lacks, for CPython 3.12
# on manylinux x86_64. They land in .device-wheels/ at the repository root, git-ignored: copy it along with the
# working tree to the GPU machine, which is why the whole folder stays small (checked below: well under 60 MiB).
#
#   scripts/build_peer_wheels.sh                 # (re)writes .device-wheels/; prints each wheel and the total
#   scripts/build_peer_wheels.sh --local         # also installs DeepSpeed for this machine's python in .peer-pkgs/
#   PY_VERSION=3.12 PLATFORMS="manylinux_2_28_x86_64 manylinux2014_x86_64" scripts/build_peer_wheels.sh
#
# .peer-pkgs/ (git-ignored, never shipped) lets this machine check the peer against DeepSpeed itself: its config
# validation, and a two-rank run on DeepSpeed's CPU accelerator (tests/runtime/test_peer_deepspeed.py uses it when
# present). It holds what the local python (LOCAL_PYTHON, default .venv/bin/python) lacks, for its own version.
#
# On the GPU machine, install them next to the system packages, not over them, and put them on the path:
#
#   python3 -m pip install --no-index --no-deps --target /tmp/peer-pkgs .device-wheels/*.whl
#   export PYTHONPATH=/tmp/peer-pkgs:$PWD/runtime PATH=/tmp/peer-pkgs/bin:$PATH
#   python3 -m slidedp.cli bench --model qwen3-8b --gpus 2 --mbs 4 --policies '' --peers ds-zero2,ds-zero3
#
# --no-deps is needed: --target implies --ignore-installed, so pip would otherwise resolve DeepSpeed's torch, numpy,
# packaging and tqdm requirements against .device-wheels alone and fail. Those four come with torch and
# transformers on the GPU machine and must not be replaced. The folder holds exactly one consistent set (pydantic
# with the pydantic-core it pins), so installing every wheel in it without resolution is safe.
#
# DeepSpeed is built with DS_BUILD_OPS=0: pure Python, no op compiled here. Its CPU Adam op (DeepSpeedCPUAdam) is
# JIT-compiled on first use on the GPU machine, which needs a C++ compiler there and ninja on PATH; the PyPI ninja
# wheel carried here brings the binary (/tmp/peer-pkgs/bin/ninja; the peer puts the `bin` folder next to the
# installed deepspeed on the ranks' PATH when no ninja is there). The build runs in pip's isolated build environment, where torch is absent, so the wheel records no
# torch/CUDA version: it has no precompiled op whose ABI could disagree with the GPU machine's torch.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/.device-wheels}"
PIP="${PIP:-python3 -m pip}"
DEEPSPEED_VERSION="${DEEPSPEED_VERSION:-0.19.8}"
PY_VERSION="${PY_VERSION:-3.12}"
PLATFORMS="${PLATFORMS:-manylinux_2_28_x86_64 manylinux2014_x86_64}"
LIMIT_MIB=60
LOCAL=0
[ "${1:-}" = "--local" ] && LOCAL=1
LOCAL_DIR="${LOCAL_DIR:-$ROOT/.peer-pkgs}"
LOCAL_PYTHON="${LOCAL_PYTHON:-$ROOT/.venv/bin/python}"
# DeepSpeed's runtime requirements (its requirements/requirements.txt) other than torch, numpy, packaging and tqdm,
# plus nvidia-ml-py, which its CUDA accelerator imports when present. pydantic brings pydantic-core,
# annotated-types, typing-extensions and typing-inspection through resolution below.
DEPS=(hjson pydantic py-cpuinfo msgpack ninja einops psutil nvidia-ml-py)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rm -rf "$OUT"
mkdir -p "$OUT"

echo "== DeepSpeed $DEEPSPEED_VERSION from its sdist, DS_BUILD_OPS=0"
$PIP download --quiet --no-deps --no-binary :all: -d "$work/sdist" "deepspeed==$DEEPSPEED_VERSION"
DS_BUILD_OPS=0 $PIP wheel --quiet --no-deps -w "$OUT" "$work"/sdist/deepspeed-*.tar.gz

echo "== dependencies for CPython $PY_VERSION on ${PLATFORMS// /, }"
platform_args=()
for p in $PLATFORMS; do platform_args+=(--platform "$p"); done
# resolved together (not --no-deps), so that pydantic's exact pydantic-core pin and its small dependencies come
# along; none of DEPS pulls torch or numpy
$PIP download --quiet --only-binary :all: --python-version "$PY_VERSION" --implementation cp \
    "${platform_args[@]}" -d "$OUT" "${DEPS[@]}"

echo "== $OUT"
total=0
for f in "$OUT"/*.whl; do
    size=$(stat -c %s "$f")
    total=$((total + size))
    printf '%10d  %s\n' "$size" "$(basename "$f")"
done
printf 'total %.1f MiB in %d wheels\n' "$(echo "$total / 1048576" | bc -l)" "$(ls "$OUT"/*.whl | wc -l)"
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
    echo "error: more than $LIMIT_MIB MiB; the folder travels with the working tree" >&2
    exit 1
fi
for needed in deepspeed hjson pydantic pydantic_core annotated_types py_cpuinfo msgpack ninja einops psutil; do
    ls "$OUT"/"$needed"-*.whl >/dev/null 2>&1 || { echo "error: no $needed wheel in $OUT" >&2; exit 1; }
done

[ "$LOCAL" = 1 ] || exit 0
echo "== DeepSpeed for $LOCAL_PYTHON in $LOCAL_DIR"
rm -rf "$LOCAL_DIR"
local_deps=(hjson py-cpuinfo msgpack ninja einops nvidia-ml-py)
# pydantic and psutil usually come with the local environment already; a bare one gets the versions carried above
pinned() { basename "$OUT"/"$1"-*.whl | cut -d- -f2; }
"$LOCAL_PYTHON" -c "import pydantic, psutil" 2>/dev/null || local_deps+=(
    "pydantic==$(pinned pydantic)" "pydantic-core==$(pinned pydantic_core)" annotated-types typing-extensions
    typing-inspection psutil)
# one pip call (a second one into the same --target would skip its existing bin/, and with it ninja); --no-deps
# keeps torch and numpy out; the binary wheels (msgpack, ...) come for the local interpreter from the index
"$LOCAL_PYTHON" -m pip install --quiet --target "$LOCAL_DIR" --no-deps --find-links "$OUT" \
    "$OUT"/deepspeed-*.whl "${local_deps[@]}"
PYTHONPATH="$LOCAL_DIR" "$LOCAL_PYTHON" -c "import deepspeed; print('deepspeed', deepspeed.__version__, 'imports')"
