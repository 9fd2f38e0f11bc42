#!/usr/bin/env bash
# Runs on the GPU machine: GPU exactness tests, then benchmarks. Usage: scripts/gpu_run.sh PART... (tests|small|8b4|8b8)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/runtime:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for part in "$@"; do
  case $part in
    topo) python3 -m slidedp.cli topology > "$OUT/topology.json" 2>&1; nvidia-smi topo -m ;;
    tests) timeout 300 python3 -m pytest -q -m gpu tests/gpu 2>&1 | tail -25 ;;
    small) timeout 240 python3 -m slidedp.cli bench --model qwen3-1.7b --gpus 2 --mbs 8 --steps 6 \
             --policies sharded:gpu,replicated:host --threads 16 --out "$OUT/bench.jsonl" 2>&1 | grep -vE "Warning|return func" | tail -30 ;;
    8b4) timeout 420 python3 -m slidedp.cli bench --model qwen3-8b --gpus 2 --mbs 4 --steps 7 \
             --policies ${POL8:-sharded:gpu} --threads 16 --out "$OUT/bench.jsonl" 2>&1 | grep -vE "Warning|return func" | tail -40 ;;
    8b8) timeout 420 python3 -m slidedp.cli bench --model qwen3-8b --gpus 2 --mbs 8 --steps 6 \
             --policies ${POL8:-sharded:gpu} --threads 16 --out "$OUT/bench.jsonl" 2>&1 | grep -vE "Warning|return func" | tail -40 ;;
  esac
done
