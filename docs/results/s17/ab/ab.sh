export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
i=0
for v in new old; do i=$((i+2))
  (cd .snap/$v && PYTHONPATH=$PWD/runtime timeout 170 python3 -m slidedp.cli bench --model qwen3-4b --seq 2048 --gpus 1 --mbs 4 \
     --steps 8 --threads 16 --data pattern --gpu-memory-gib 24 --policies auto:auto:auto:0:auto:auto:auto:auto:auto \
     --out "$OUT/ab-$i-$v.jsonl" 2>&1 | grep -E "^auto|ERROR" | tail -2)
done
