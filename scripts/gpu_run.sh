#!/usr/bin/env bash
# Runs on the GPU machine (nvidia-h200-x2); results under $OUT. Usage: scripts/gpu_run.sh PART...
#   topo    slidedp topology -> $OUT/topology.json
#   chunks  host update cost by chunk size (scripts/probe_update_chunks.py)
#   tests   the GPU tests (tests/gpu and the gpu-marked runtime tests), verbose into $OUT/gpu-tests.log as they
#           run (a killed run still shows which passed); the resume test first
#   plan8   calibrate and write the planner's prediction for every Qwen3-8B policy benchmarked below
#   b4      Qwen3-8B, 2 GPUs, micro-batch 4: every route, exact clipping, FSDP2 + CPUOffloadPolicy
#   b8      Qwen3-8B, 2 GPUs, micro-batch 8: SlideDP and FSDP2 GPU-resident at its best
#   one8    Qwen3-8B on one GPU, 20 steps on pattern data, and FSDP2 GPU-resident on that GPU
#   cast8   Qwen3-8B, 2 GPUs, bs8 then bs4: the bf16 cast on the host against the fp32 master cast on the GPUs
#   edge8   Qwen3-8B, 2 GPUs, bs8 then bs4: the embedding and head updated on the host against on the GPUs
#           (policy.edge_update), with and without the cast on the GPU, and AutoPolicy free to update leading
#           layers on the GPUs too (device_layers auto); FSDP2 GPU-resident at its best beside bs8
#   pcie8   Qwen3-8B, 2 GPUs, bs8 as a PCIe-only workstation (NCCL_P2P_DISABLE=1): topology, plan, the four
#           routes and AutoPolicy's choice, predicted beside measured
#   ds4     Qwen3-8B, 2 GPUs, bs4, clipping at 1.0 on both sides: SlideDP against DeepSpeed ZeRO-2 and ZeRO-3 CPU
#           offload (needs .device-wheels from scripts/build_peer_wheels.sh, carried with the working tree)
#   plan1   on one GPU (nvidia-h200, 16 cores, 128 GiB: Qwen3-4B fits its host state): calibrate and write the
#           planner's prediction for every one4 policy at micro-batch 4 and 8, before any of them runs
#   one4    Qwen3-4B on one GPU at micro-batch MBS (8): host update only, the embedding/head on the GPU, AutoPolicy
#           without and with device updates; FSDP2 GPU-resident (bs8: 16 layers keep; bs4: none checkpointed) and,
#           at bs4, FSDP2 + CPUOffloadPolicy
#   grid1   the declared one-GPU grid (docs/notebook/benchmark-history.md) for M1 at MBS (8): activations x gradient route x where
#           the update runs, offload rows last
#   otest   the offload GPU tests first (1 and 2 GPUs as present), then the one-GPU route test
#   sweep1  Qwen3-1.7B on one GPU, micro-batch 4, host update only: the update's thread count 16, 15, 14, 12 (what
#           the issuing thread's CPU time costs an update team on every core)
#   ds1     Qwen3-1.7B on one GPU, micro-batch 4, clipping at 1.0 on both sides: SlideDP (host update only, and
#           AutoPolicy) against DeepSpeed ZeRO-2 and ZeRO-3 CPU offload (needs .device-wheels, carried)
#   grid17  the declared one-GPU grid for Qwen3-1.7B (docs/notebook/benchmark-history.md) at MBS (8): activations (checkpoint,
#           keep14, off14, all keep) x where the update runs
#   again1  huge-page settings of host memory; the offload GPU test; then Qwen3-1.7B bs8 on one GPU (a fresh
#           calibration): AutoPolicy, host update only, the grid's best row and its offload twin
#   facts   what bounds a host state on this machine: /dev/shm, RAM, the cgroup limit, huge-page settings
#   grid17b Qwen3-1.7B on one GPU at MBS (8): AutoPolicy (its mix search also starts from every layer kept) against
#           the declared grid's best row, the row that did not run (everything on the GPU, every layer keeps),
#           offload into two reused slots, and the host-update base row
#   one8x1  Qwen3-8B on the one-GPU machine (128 GiB RAM): the fp32 master delivered and cast on the GPU (no bf16
#           host copy), AutoPolicy for the rest, micro-batch 8, 20 steps on pattern data; FSDP2 GPU-resident beside
#   cast17  Qwen3-1.7B on one GPU at MBS (8): the embedding/head + 7 layers on the GPU, every layer keeps (AutoPolicy's
#           choice on the third day), with the bf16 cast on the host and on the GPU: does the in-step host update
#           slow down with the cast (phases.update_cast_busy) or with the unit size?
#   gil17   the GIL and the host update: the contention probe (a thread running Python at two switch intervals), then
#           Qwen3-1.7B at MBS (8) on one GPU, AutoPolicy's third-day choice and the host-update base row, then AutoPolicy
#           and the grid's best row (everything on the GPU, every layer keeps)
#   ins17   CPU facts (lscpu); Qwen3-1.7B at MBS (8) on one GPU with a calibration of schema 5 (update_in_step):
#           AutoPolicy, its third-day choice (embedding/head + 7 layers on the GPU), everything on the GPU, and the
#           host-update base row; then the GPU calibration test
#   pol17   after the one-policy change (ExecutionPolicy resolved once): Qwen3-1.7B at MBS (8) on one GPU,
#           AutoPolicy and the host-update base row, FSDP2 GPU-resident beside them
#   pol8    after the same change: Qwen3-8B on the one-GPU machine, cast on the GPU, AutoPolicy for the rest, bs8,
#           10 steps on pattern data, FSDP2 GPU-resident beside it
#   pol4    after the one-launcher change: Qwen3-4B at MBS (8) on one GPU, AutoPolicy, FSDP2 GPU-resident (first 16
#           layers not checkpointed) beside it
#   ctx     what one process's CUDA context (and an NCCL group of one) takes on the card: mem_get_info before any
#           allocation, the allowance a gpu_memory_gib cap leaves for it (slidedp.planning.job.CONTEXT_BYTES)
#   cap4    workstation caps: Qwen3-4B on one GPU at micro-batch 4, seq 2048, under --gpu-memory-gib GPU_GIB (24):
#           SlideDP AutoPolicy without and with clipping at 1.0, then the peers CAP_PEERS (default FSDP2 +
#           CPUOffloadPolicy and DeepSpeed ZeRO-2 offload, each without and with clipping; every layer checkpointed)
#           under the same cap (needs .device-wheels, carried)
#   cap8    Qwen3-8B on one GPU under --gpu-memory-gib GPU_GIB (24): AutoPolicy with the bf16 cast where CAST (gpu:
#           the fp32 master delivered, no bf16 host copy, so the state fits the 125 GiB of the one-GPU kind), 20 steps
#           on pattern data at micro-batch MBS (1); its first record holds the time to first step (CAP8_TAG: a suffix
#           for the result file, to run it twice in one command)
#   trace4  Qwen3-4B at micro-batch 4 under GPU_GIB (24), no clipping, AutoPolicy (TRACE_POLICY), STEPS (10) steps with
#           the step timeline (SLIDEDP_TRACE, slidedp/step/trace.py) into $OUT/trace4/
#   floor   the floor of the post-norm update (scripts/probe_update_floor.py: DRAM ceiling, host update, PCIe, the update
#           streamed through the GPU and split with the host), then Qwen3-4B at micro-batch 4 under GPU_GIB (24) with the
#           step timeline, AutoPolicy, clipping at 1.0 and without, STEPS (10) steps, into $OUT/floor-clipC/
#   pair4   Qwen3-4B at micro-batch 4 under GPU_GIB (24), AutoPolicy, STEPS (10) steps, without and with clipping at 1.0
#           in one bench command (one host state): the clipped/unclipped pair of the benchmarks table; their step
#           timelines (SLIDEDP_TRACE) -> $OUT/pair4-trace/
#   first8  time to first step of the Qwen3-8B preset through scripts/first_step.py (train() alone in its process),
#           under GPU_GIB (24), the cast where CAST (gpu), twice: the calibration measured in the first run if the cache
#           lacks it, cached in the second; logs $OUT/first8-preset-1.log and -2.log (each ends with one JSON line
#           holding startup_s, rank_startup_s and moments_paged_s)
#   hdram   how steady calibration's host memory figure is: host_dram four times timed over three updates and
#           four times over one second, alternating, in one process (scripts/probe_host_dram.py) -> $OUT/host-dram.jsonl
#   observe4 Qwen3-4B at micro-batch 4 under GPU_GIB (24), AutoPolicy without and with clipping at 1.0 (pair4's rows),
#           twice in one command: each run checks its prediction and keeps the host factor it observed with the
#           calibration (slidedp.planning.observed; on 2026-12-07 the second pair was also planned with them, which
#           no plan does since); the calibration's observed_host after each
#   bf16u   the GPU case of a device layer's gradient held in bf16 (same bits as held in fp32) -> $OUT/gpu-bf16u.log
#   exact1  the one-GPU exactness tests (every route of one rank, 20 bf16 steps against autocast, the cast on the GPU,
#           streamed layers with their weights kept on the GPU) and the step records' memory figures
#   pin     where a rank's start waits (scripts/probe_rank_start.py): a filled 32 GiB shared-memory state page-locked
#           beside loading the model's config and adapter (the loading thread sampled), then alone, each in a fresh
#           process; and page-locking it again with 1 and 16 threads; then (PIN_OTHER=1) 2 x 16 GiB filled by another
#           process, page-locked as found and after MADV_POPULATE_READ
#   hf8     Qwen3-8B written as a local Hugging Face directory of bf16 safetensors (/tmp/q8b), then the time to
#           first step loading it (scripts/first_step.py), under GPU_GIB (24), the cast where CAST (gpu)
#   passes  the post-norm host update whole against its two passes (scripts/probe_update_passes.py): the weights and
#           bf16 copy first with the moments' new values dropped, then the moments; seconds per 1e9 params, same bits
#   passes4 Qwen3-4B at micro-batch 4 under GPU_GIB (24), AutoPolicy, STEPS (10) steps, in one bench command: without
#           clipping, clipped at 1.0 (AutoPolicy's post_norm_passes: two where priced faster), clipped with the
#           post-norm update fixed to one pass; step timelines -> $OUT/passes4-trace/
#   passes8 the same for Qwen3-8B at micro-batch 8 on the whole card with compiled layers fixed (COMP_STEPS, 8)
#           -> $OUT/passes8.jsonl, $OUT/passes8-trace/
#   thr4    Qwen3-4B at micro-batch 4 under GPU_GIB (24), clipped at 1.0, AutoPolicy, STEPS (10) steps, with THR_T (15 14)
#           update threads per rank, one bench command each (the issuing thread's core left to it): step timelines ->
#           $OUT/thr4-T-trace/
#   probeg  the host update with bf16 gradients widened chunk by chunk against fp32 gradients (scripts/probe_grad_bf16.py)
#   hfp     PRESET (llama3.2-3b) written as a local Hugging Face directory of bf16 safetensors (/tmp/hfp), then trained
#           HFP_STEPS (5) steps from it under GPU_GIB (24), planned with a calibration measured in that run
#   grid    the declared AutoPolicy grid (docs/notebook/benchmark-history.md) for MODEL (qwen3-8b), MBS (8), K keep, M offload
#   layers  one decoder layer of Qwen3-8B and of Llama 3.2 3B at seq 2048 (micro-batch 8) and 4096 (4), as the engine runs it
#           (scripts/layer_profile.py): per phase (kept forward, its backward, checkpointed forward, recompute) the
#           kernel time by class, the launch gaps and TFLOP/s against the 782 TFLOP/s GEMM peak -> $OUT/layers.json
#   clayers one decoder layer of Qwen3-8B at seq 2048, micro-batch 8, eager then through the engine's compiled layer
#           (policy.compiled_layers: torch.compile, inductor), the same per-phase figures for both, the compile's
#           first-iteration time, graph and graph-break counts, and the speed-up per phase -> $OUT/layers-compiled.json
#   firstc  time to first step of the Qwen3-8B preset (scripts/first_step.py) under GPU_GIB (24), the cast where CAST
#           (gpu): eager layers twice (the first run calibrates where the cache lacks it), then compiled layers twice
#           (fixed: the planner leaves a 2-step job eager, its compile would not pay) -> $OUT/firstc-all.log
#   comp8   Qwen3-8B, seq 2048, micro-batch 8, the whole card: AutoPolicy with eager layers, with compiled layers
#           (fixed: an 8-step bench is too short for the planner to compile), the same clipped at 1.0; FSDP2 GPU-resident (every
#           layer checkpointed) eager and compiled beside -> $OUT/comp8.jsonl (COMP_STEPS, 8 steps); the SlideDP rows'
#           step timelines with every layer's forward and backward (SLIDEDP_TRACE) -> $OUT/comp8-trace/, one file a row
#           in the order above (scripts/trace_report.py --layers)
#   clip8   Qwen3-8B, seq 2048, micro-batch 8, the whole card, compiled layers fixed, AutoPolicy for the rest: without
#           and with clipping at 1.0 in one bench command (one host state; COMP_STEPS, 8 steps), no peers: the
#           clipped/unclipped pair of the benchmarks table -> $OUT/clip8.jsonl, step timelines -> $OUT/clip8-trace/
#   copies  does a layer's compute slow down while both PCIe directions copy? (scripts/probe_layer_copies.py: the
#           calls calibration times, alone and beside queued copies) for Qwen3-4B mbs 4 and Qwen3-8B mbs 8, eager
#           -> $OUT/layer-copies.jsonl
#   comp3   the same for the Llama 3.2 3B preset (every layer kept by FSDP2 where it fits: COMP3_PEER_KEEP, none)
#           -> $OUT/comp3.jsonl
#   pyc     whether this machine's transformers has bytecode, and a rank's imports and model built, twice as is and
#           twice with a writable bytecode cache (PYTHONPYCACHEPREFIX): is the rank's slow model_and_data compiling?
#   sust    a Qwen3-8B layer's kept forward + backward at 8 x 2048 back to back for SUST_S (15) seconds, eager then
#           compiled, with the SM clock, power and temperature once a second (scripts/probe_layer_sustained.py): does
#           the layer slow down over a step's length? -> $OUT/sustained.jsonl
#   castcal the delivery cast's calibration figure and the ring on the GPU (tests/gpu/test_gpu_delivery_cast_figure.py,
#           test_gpu_cast_ring.py), then Qwen3-8B seq 2048 micro-batch 8 on the whole card: the castab policy fixed
#           with the default cast (calibrating its shape), then every policy field auto but compiled layers, unclipped
#           and clipped at 1.0 in one command: -> $OUT/castcal-tests.log, castcal-fixed.jsonl, castcal-auto.jsonl (step
#           timelines -> castcal-auto-trace/)
#   widen   the clipped update's pieces alone (scripts/probe_post_norm.py: the post-norm update at each chunk against
#           the unclipped update) -> $OUT/post-norm.jsonl; then Qwen3-8B seq 2048 micro-batch 8 on the whole card,
#           clipped at 1.0, every policy field auto but compiled layers: this engine, the same engine with the
#           fastest chunk of the probe as WIDEN_CHUNK (a copy under /tmp), this engine again
#           -> $OUT/widen-{old1,new,old2}.jsonl, step timelines widen-*-trace/
#   pairs   what clipping at 1.0 costs, every policy field auto but compiled layers: Qwen3-8B seq 2048 micro-batch 8
#           on the whole card, then Qwen3-4B micro-batch 4 under --gpu-memory-gib 24, each unclipped then clipped
#           (PAIRS_MODELS, default "8b 4b") -> $OUT/pairs-8b.jsonl, pairs-4b-24.jsonl, step timelines pairs-*-trace/
#   clip24  what clipping at 1.0 costs under a workstation cap, peers beside: Qwen3-4B seq 2048 micro-batch 4 under
#           --gpu-memory-gib 24, one bench command: SlideDP every policy field auto (compiled layers) unclipped and
#           clipped, the clipped row again with eager layers (CLIP24_POLICIES), then DeepSpeed ZeRO-3 offload and FSDP2 +
#           CPUOffloadPolicy, both clipping at 1.0 (needs .device-wheels, carried) -> $OUT/clip24.jsonl, SlideDP
#           step timelines -> $OUT/clip24-trace/
#   castab  Qwen3-8B, seq 2048, micro-batch 8, the whole card, no clipping, the policy CASTAB_POLICY fixed (the fp32
#           master cast on the GPU), STEPS (8) steps, one bench command per run of CASTAB_RUNS (default: new1 old
#           new2): a run named NAME=DIR runs the engine under DIR (a copy of runtime/, e.g. `git archive REV runtime
#           | tar -x -C ab_old`), `old` the one under OLD_TREE (ab_old), any other this engine; NAME:KEYS runs with
#           bench's --policy-set KEYS (e.g. ring:cast_scratch_mb=256): rows -> $OUT/castab-NAME.jsonl, step
#           timelines -> $OUT/castab-NAME-trace/
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/runtime:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Calibrations come back under $OUT; those committed under docs/results/calibration (none while the schema is new) seed the cache, named for
# this host, so a later command plans without measuring again.
export SLIDEDP_CACHE_DIR=$OUT/calibration; mkdir -p "$SLIDEDP_CACHE_DIR"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/slidedp-compiled}  # compiled kernels stay on the machine
for f in docs/results/calibration/*.json; do
  [ -e "$f" ] || continue
  key=$(basename "$f" .json); key=${key: -16}
  cp "$f" "$SLIDEDP_CACHE_DIR/$(hostname)-$key.json"
done
P4=${P4:-sharded:gpu:checkpoint:0:36,replicated:gpu:checkpoint:0:36,sharded:host:checkpoint:0:36,replicated:host:checkpoint:0:36,sharded:gpu:checkpoint:1.0:36}
P8=${P8:-sharded:gpu:checkpoint:0:36,sharded:gpu:auto:0:36,auto:auto:auto:0:auto}
BENCH="python3 -m slidedp.cli bench --model qwen3-8b --seq 2048"
M1=${M1:-qwen3-4b}; L1=${L1:-36}
P1=${P1:-replicated:gpu:checkpoint:0:$L1:host:host:0,replicated:gpu:checkpoint:0:$L1:host:gpu:0,auto:auto:auto:0:auto:host:host:0,auto:auto:auto:0:auto:host:auto:auto}
# every policy field auto: the route's three ($A), then clipping, then the rest ($R; a part adds :compiled or :eager)
A=auto:auto:auto; R=auto:auto:auto:auto:auto:auto
quiet() { grep -vE "Warning|return func|warnings.warn" | tail -"${1:-40}"; }
for part in "$@"; do
  echo "===== $part $(date +%T)"
  case $part in
    topo) python3 -m slidedp.cli topology > "$OUT/topology.json" 2>&1; nvidia-smi topo -m ;;
    chunks) timeout 90 python3 scripts/probe_update_chunks.py --threads 16,32 | tee "$OUT/update_chunks.jsonl" ;;
    tests) timeout ${TESTS_S:-560} python3 -m pytest -v -rfE --tb=short -p no:cacheprovider -m gpu tests/gpu/test_gpu_resume.py \
             tests/gpu tests/runtime > "$OUT/gpu-tests.log" 2>&1; grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" \
             "$OUT/gpu-tests.log" | tail -30 ;;
    plan8) timeout 150 $BENCH --gpus 2 --mbs 4 --threads 16 --policies "$P4" --plan-only --out "$OUT/plan.jsonl" 2>&1 | quiet 20
           timeout 150 $BENCH --gpus 2 --mbs 8 --threads 16 --policies "$P8" --plan-only --out "$OUT/plan.jsonl" 2>&1 | quiet 20 ;;
    plan1) for mbs in 4 8; do timeout 200 python3 -m slidedp.cli bench --model $M1 --seq 2048 --gpus 1 --mbs $mbs \
             --threads 16 --policies "$P1" --plan-only --out "$OUT/plan1.jsonl" 2>&1 | quiet 12; done ;;
    one4) mbs=${MBS:-8}; peers=fsdp2:16; [ "$mbs" = 4 ] && peers=fsdp2:none,fsdp2-offload:none
          timeout 560 python3 -m slidedp.cli bench --model $M1 --seq 2048 --gpus 1 --mbs $mbs --steps 6 --threads 16 \
            --policies "$P1" --peers $peers --out "$OUT/bench1-$mbs.jsonl" 2>&1 | quiet 30 ;;
    grid1) D=host:gpu:18; G=auto:auto:auto:0:auto:host:auto:auto
           for r in gpu:checkpoint:0:$L1 gpu:keep18:0:auto gpu:checkpoint:0:auto:$D gpu:keep12:0:auto:host:gpu:27 \
                    gpu:off18:0:auto host:off18:0:auto gpu:off18:0:auto:$D; do G="$G,replicated:$r"; done
           timeout ${GRID_S:-560} python3 -m slidedp.cli bench --model $M1 --seq 2048 --gpus 1 --mbs ${MBS:-8} --steps 6 \
             --threads 16 --policies "$G" --out "$OUT/grid1.jsonl" 2>&1 | quiet 24 ;;
    otest) timeout ${TESTS_S:-300} python3 -m pytest -v -rfE --tb=short -p no:cacheprovider -m gpu \
             tests/gpu/test_gpu_exactness.py -k "offload or routes_match_adamw" > "$OUT/gpu-otests.log" 2>&1
           grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/gpu-otests.log" | tail -12 ;;
    sweep1) for t in ${SWEEP_T:-16 15 14 12}; do timeout 150 python3 -m slidedp.cli bench --model qwen3-1.7b --seq 2048 \
              --gpus 1 --mbs 4 --steps 6 --threads $t --policies replicated:gpu:checkpoint:0:28:host:host:0 \
              --out "$OUT/sweep1.jsonl" 2>&1 | quiet 3; done ;;
    ds1) python3 -m pip install -q --no-index --no-deps --target /tmp/peer-pkgs .device-wheels/*.whl 2>&1 | tail -2
         PYTHONPATH=/tmp/peer-pkgs:$PYTHONPATH PATH=/tmp/peer-pkgs/bin:$PATH timeout ${DS_S:-400} python3 -m slidedp.cli \
           bench --model qwen3-1.7b --seq 2048 --gpus 1 --mbs 4 --steps 6 --threads 16 \
           --policies replicated:gpu:checkpoint:1.0:28,auto:auto:auto:1.0:auto:host:auto:auto \
           --peers ds-zero2:1.0,ds-zero3:1.0 --out "$OUT/bench-ds1.jsonl" 2>&1 | quiet 30 ;;
    ctx) python3 -c "
import os, torch, torch.distributed as dist
torch.cuda.set_device(0); f0, t = torch.cuda.mem_get_info(0)
print(f'card {t / 2**30:.2f} GiB, in use after the context: {(t - f0) / 2**30:.3f} GiB')
dist.init_process_group('nccl', init_method='file:///tmp/ctx-init', rank=0, world_size=1, device_id=torch.device('cuda', 0))
x = torch.ones(1, device='cuda'); dist.all_reduce(x); torch.cuda.synchronize(); f1, _ = torch.cuda.mem_get_info(0)
print(f'with NCCL and one all-reduce: {(t - f1) / 2**30:.3f} GiB (allocator reserved {torch.cuda.memory_reserved() / 2**20:.0f} MiB)')
" 2>&1 | quiet 5 ;;
    cap4) python3 -m pip install -q --no-index --no-deps --target /tmp/peer-pkgs .device-wheels/*.whl 2>&1 | tail -2
          PYTHONPATH=/tmp/peer-pkgs:$PYTHONPATH PATH=/tmp/peer-pkgs/bin:$PATH timeout ${CAP_S:-540} python3 -m slidedp.cli \
            bench --model qwen3-4b --seq 2048 --gpus 1 --mbs 4 --steps ${STEPS:-6} --threads 16 --data pattern \
            --gpu-memory-gib ${GPU_GIB:-24} --policies "${CAP_POLICIES-auto:auto:auto:0:auto:host:auto:auto,auto:auto:auto:1.0:auto:host:auto:auto}" \
            --peers "${CAP_PEERS-fsdp2-offload:0:0,fsdp2-offload:0:1.0,ds-zero2,ds-zero2:1.0}" \
            --out "$OUT/cap4-${GPU_GIB:-24}.jsonl" 2>&1 | quiet 30 ;;
    trace4) SLIDEDP_TRACE="$OUT/trace4" \
              timeout ${TRACE_S:-150} python3 -m slidedp.cli bench --model qwen3-4b --seq 2048 --gpus 1 --mbs 4 \
              --steps ${STEPS:-10} --threads 16 --data pattern --gpu-memory-gib ${GPU_GIB:-24} \
              --policies "${TRACE_POLICY:-auto:auto:auto:0:auto:auto:auto:auto:auto}" \
              --out "$OUT/trace4.jsonl" 2>&1 | quiet 4 ;;
    floor) timeout ${FLOOR_S:-200} python3 scripts/probe_update_floor.py --threads 16 --numel $((1 << 29)) \
             --out "$OUT/update-floor.jsonl" 2>&1 | quiet 20
           for clip in 1.0 0; do SLIDEDP_TRACE="$OUT/floor-clip$clip" timeout ${TRACE_S:-170} python3 -m slidedp.cli bench \
             --model qwen3-4b --seq 2048 --gpus 1 --mbs 4 --steps ${STEPS:-10} --threads 16 --data pattern \
             --gpu-memory-gib ${GPU_GIB:-24} --policies "auto:auto:auto:$clip:auto:auto:auto:auto:auto" \
             --out "$OUT/floor-clip$clip.jsonl" 2>&1 | quiet 6; done ;;
    pair4) SLIDEDP_TRACE=$OUT/pair4-trace timeout ${PAIR_S:-300} python3 -m slidedp.cli bench --model qwen3-4b --seq 2048 --gpus 1 --mbs 4 \
             --steps ${STEPS:-10} --threads 16 --data pattern --gpu-memory-gib ${GPU_GIB:-24} \
             --policies "auto:auto:auto:0:auto:auto:auto:auto:auto,auto:auto:auto:1.0:auto:auto:auto:auto:auto" \
             --out "$OUT/pair4-${GPU_GIB:-24}.jsonl" 2>&1 | quiet 14 ;;
    cap8) timeout ${CAP8_S:-200} python3 -m slidedp.cli bench --model qwen3-8b --seq 2048 --gpus 1 --mbs ${MBS:-1} \
            --steps 20 --warmup 3 --threads 16 --data pattern --lr ${LR:-1e-5} --gpu-memory-gib ${GPU_GIB:-24} \
            --policies auto:auto:auto:0:auto:${CAST:-gpu}:auto:auto --out "$OUT/cap8-${GPU_GIB:-24}${CAP8_TAG:-}.jsonl" 2>&1 | quiet 12 ;;
    first8) for i in 1 2; do timeout ${FIRST_S:-150} python3 scripts/first_step.py --model qwen3-8b \
              --gpu-memory-gib ${GPU_GIB:-24} --delivery-cast ${CAST:-gpu} > "$OUT/first8-preset-$i.log" 2>&1
            grep -vE "Warning|warn" "$OUT/first8-preset-$i.log" | tail -9; done ;;
    observe4) for r in 1 2; do timeout ${PAIR_S:-270} python3 -m slidedp.cli bench --model qwen3-4b --seq 2048 --gpus 1 \
              --mbs 4 --steps ${STEPS:-10} --threads 16 --data pattern --gpu-memory-gib ${GPU_GIB:-24} \
              --policies "auto:auto:auto:0:auto:auto:auto:auto:auto,auto:auto:auto:1.0:auto:auto:auto:auto:auto" \
              --out "$OUT/observe4-run$r.jsonl" 2>&1 | grep -E "prediction:|host factor|^auto|ERROR|Error" | cut -c1-700
            python3 -c "
import glob, json, os
from slidedp.cache_paths import calibration_dir
for f in glob.glob(os.path.join(calibration_dir(), '*.json')):
    c = json.load(open(f)); print(os.path.basename(f), c['shape']['model'], json.dumps(c.get('observed_host')))
"; done ;;
    hdram) timeout ${HDRAM_S:-120} python3 scripts/probe_host_dram.py --rounds 4 --out "$OUT/host-dram.jsonl" 2>&1 | quiet 12 ;;
    bf16u) timeout ${BF16U_S:-120} python3 -m pytest -v -rfE --tb=short -p no:cacheprovider -m gpu \
             tests/runtime/test_device_update.py -k held_in_bf16 > "$OUT/gpu-bf16u.log" 2>&1
           grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/gpu-bf16u.log" | tail -6 ;;
    exact1) timeout ${TESTS_S:-240} python3 -m pytest -v -rfE --tb=short -p no:cacheprovider -m gpu \
              tests/gpu/test_gpu_exactness.py tests/gpu/test_gpu_delivery_cast.py tests/gpu/test_gpu_step_figures.py \
              -k "1] or same_bits or figures" > "$OUT/gpu-exact1.log" 2>&1
            grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu-exact1.log" | tail -12 ;;
    pin)  for mode in overlap serial; do timeout ${PIN_S:-150} python3 scripts/probe_rank_start.py --mode $mode \
            --gib ${PIN_GIB:-32} --out "$OUT/probe-rank-start.jsonl" 2>&1 | grep -v Warn | cut -c1-900; done
          [ "${PIN_OTHER:-1}" = 1 ] && timeout ${PIN_S:-150} python3 scripts/probe_rank_start.py --mode other --gib 16 \
            --out "$OUT/probe-rank-start.jsonl" 2>&1 | grep -v Warn | cut -c1-900 ;;
    hf8)  timeout ${HF_S:-60} python3 scripts/first_step.py --write-hf /tmp/q8b --model qwen3-8b 2>&1 | quiet 3
          timeout ${FIRST_S:-100} python3 scripts/first_step.py --model /tmp/q8b --gpu-memory-gib ${GPU_GIB:-24} \
            --delivery-cast ${CAST:-gpu} > "$OUT/first8-hf.log" 2>&1; grep -vE "Warning|warn" "$OUT/first8-hf.log" | tail -9 ;;
    passes) timeout ${PROBE_S:-150} python3 scripts/probe_update_passes.py --params 1e9 --threads 16 \
              --out "$OUT/probe-update-passes.jsonl" 2>&1 | grep -v Warn | cut -c1-400 ;;
    passes4)
             SLIDEDP_TRACE=$OUT/passes4-trace timeout ${PAIR_S:-300} python3 -m slidedp.cli bench --model qwen3-4b \
               --seq 2048 --gpus 1 --mbs 4 --steps ${STEPS:-10} --threads 16 --data pattern --gpu-memory-gib ${GPU_GIB:-24} \
               --policies "$A:0:$R,$A:1.0:$R,$A:1.0:$R:auto:1" --out "$OUT/passes4-${GPU_GIB:-24}.jsonl" 2>&1 | quiet 16 ;;
    passes8)
             SLIDEDP_TRACE=$OUT/passes8-trace timeout ${COMP_S:-560} python3 -m slidedp.cli bench --model qwen3-8b \
               --seq 2048 --gpus 1 --mbs 8 --steps ${COMP_STEPS:-8} --threads 16 \
               --policies "$A:0:$R:compiled,$A:1.0:$R:compiled,$A:1.0:$R:compiled:1" --out "$OUT/passes8.jsonl" 2>&1 | quiet 16 ;;
    thr4) for t in ${THR_T:-15 14}; do SLIDEDP_TRACE=$OUT/thr4-$t-trace timeout ${PAIR_S:-300} python3 -m slidedp.cli bench \
            --model qwen3-4b --seq 2048 --gpus 1 --mbs 4 --steps ${STEPS:-10} --threads $t --data pattern \
            --gpu-memory-gib ${GPU_GIB:-24} --policies "auto:auto:auto:1.0:auto:auto:auto:auto:auto" \
            --out "$OUT/thr4-${GPU_GIB:-24}.jsonl" 2>&1 | quiet 6; done ;;
    probeg) timeout ${PROBE_S:-120} python3 scripts/probe_grad_bf16.py --params 1e9 --threads 16 \
              --out "$OUT/probe-grad-bf16.jsonl" 2>&1 | grep -v Warn | cut -c1-110 ;;
    hfp)  timeout ${HF_S:-90} python3 scripts/first_step.py --write-hf /tmp/hfp --model ${PRESET:-llama3.2-3b} 2>&1 | quiet 3
          timeout ${FIRST_S:-150} python3 scripts/first_step.py --model /tmp/hfp --gpu-memory-gib ${GPU_GIB:-24} \
            --steps ${HFP_STEPS:-5} > "$OUT/hfp-${PRESET:-llama3.2-3b}.log" 2>&1
          grep -vE "Warning|warn" "$OUT/hfp-${PRESET:-llama3.2-3b}.log" | tail -12 ;;
    facts) df -h /dev/shm /tmp; free -g; nproc; cat /sys/fs/cgroup/memory.max 2>/dev/null
           cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/shmem_enabled ;;
    grid17b) G=auto:auto:auto:0:auto:host:auto:auto
             for r in ${G17B_ROWS:-keep28:0:auto:host:gpu:28 keep14:0:auto:host:gpu:14 off14:0:auto:host:gpu:14 checkpoint:0:28}; do
               G="$G,replicated:gpu:$r"; done
             timeout ${GRID_S:-420} python3 -m slidedp.cli bench --model qwen3-1.7b --seq 2048 --gpus 1 --mbs ${MBS:-8} \
               --steps 6 --threads 16 --policies "$G" --out "$OUT/grid17b-${MBS:-8}.jsonl" 2>&1 | quiet 24 ;;
    pol17) timeout ${POL_S:-400} python3 -m slidedp.cli bench --model qwen3-1.7b --seq 2048 --gpus 1 --mbs ${MBS:-8} \
             --steps 8 --threads 16 --policies auto:auto:auto:0:auto:host:auto:auto,replicated:gpu:checkpoint:0:28 \
             --peers fsdp2:0 --out "$OUT/pol17.jsonl" 2>&1 | quiet 12 ;;
    pol4) timeout ${POL_S:-560} python3 -m slidedp.cli bench --model $M1 --seq 2048 --gpus 1 --mbs ${MBS:-8} --steps 8 \
            --threads 16 --policies auto:auto:auto:0:auto:host:auto:auto --peers fsdp2:16 --out "$OUT/pol4.jsonl" \
            2>&1 | quiet 12 ;;
    pol8) timeout ${POL_S:-560} $BENCH --gpus 1 --mbs 8 --steps 10 --threads 16 --data pattern --lr 1e-4 \
            --policies auto:auto:auto:0:auto:gpu:auto:auto --peers fsdp2:0 --out "$OUT/pol8.jsonl" 2>&1 | quiet 16 ;;
    one8x1) timeout ${ONE_S:-560} $BENCH --gpus 1 --mbs 8 --steps 20 --threads 16 --data pattern --lr 1e-4 \
              --policies auto:auto:auto:0:auto:gpu:auto:auto --peers fsdp2:0 --out "$OUT/bench-8b-x1.jsonl" 2>&1 | quiet 40 ;;
    cast17) P17=replicated:gpu:keep28:0:7
            timeout ${CAST_S:-300} python3 -m slidedp.cli bench --model qwen3-1.7b --seq 2048 --gpus 1 --mbs ${MBS:-8} \
              --steps 8 --threads 16 --policies $P17:host:gpu:7,$P17:gpu:gpu:7 --out "$OUT/cast17.jsonl" 2>&1 | quiet 6 ;;
    gil17) timeout 120 python3 scripts/probe_update_contention.py --threads 16 --out "$OUT/update_contention.jsonl" \
             2>&1 | quiet 14
           P17=replicated:gpu:keep28:0:7:host:gpu:7,replicated:gpu:checkpoint:0:28
           timeout ${GIL_S:-200} python3 -m slidedp.cli bench \
             --model qwen3-1.7b --seq 2048 --gpus 1 --mbs ${MBS:-8} --steps 8 --threads 16 --policies $P17 \
             --out "$OUT/gil17.jsonl" 2>&1 | quiet 4
           timeout ${GIL_S:-200} python3 -m slidedp.cli bench --model qwen3-1.7b --seq 2048 --gpus 1 --mbs ${MBS:-8} \
             --steps 8 --threads 16 --policies auto:auto:auto:0:auto:host:auto:auto,replicated:gpu:keep28:0:auto:host:gpu:28 \
             --out "$OUT/gil17-auto.jsonl" 2>&1 | quiet 4 ;;
    ins17) lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA|L2|L3"
           timeout ${INS_S:-330} python3 -m slidedp.cli bench --model qwen3-1.7b --seq 2048 --gpus 1 --mbs ${MBS:-8} \
             --steps 8 --threads 16 --out "$OUT/ins17.jsonl" --policies auto:auto:auto:0:auto:host:auto:auto,replicated:gpu:keep28:0:7:host:gpu:7,replicated:gpu:keep28:0:auto:host:gpu:28,replicated:gpu:checkpoint:0:28 \
             2>&1 | quiet 8
           timeout 120 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -m gpu tests/runtime/test_calibration.py \
             2>&1 | tail -3 ;;
    grid17) G=auto:auto:auto:0:auto:host:auto:auto
            for r in checkpoint:0:28 keep14:0:auto off14:0:auto checkpoint:0:auto:host:gpu:0 \
                     checkpoint:0:auto:host:gpu:14 keep14:0:auto:host:gpu:14 off14:0:auto:host:gpu:14 \
                     keep28:0:auto:host:gpu:28 off14:0:auto:host:gpu:28; do G="$G,replicated:gpu:$r"; done
            timeout ${GRID_S:-560} python3 -m slidedp.cli bench --model qwen3-1.7b --seq 2048 --gpus 1 --mbs ${MBS:-8} \
              --steps 6 --threads 16 --policies "$G" --out "$OUT/grid17-${MBS:-8}.jsonl" 2>&1 | quiet 24 ;;
    again1) cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/shmem_enabled
            mount | grep -E " /dev/shm " ; grep -i huge /proc/meminfo | head -4
            timeout 150 python3 -m pytest -v -rfE --tb=short -p no:cacheprovider -m gpu tests/gpu/test_gpu_exactness.py \
              -k offload > "$OUT/gpu-otests2.log" 2>&1; grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu-otests2.log" | tail -4
            timeout ${AGAIN_S:-300} python3 -m slidedp.cli bench --model qwen3-1.7b --seq 2048 --gpus 1 --mbs 8 --steps 6 \
              --threads 16 --policies auto:auto:auto:0:auto:host:auto:auto,replicated:gpu:checkpoint:0:28,replicated:gpu:keep14:0:auto:host:gpu:14,replicated:gpu:off14:0:auto:host:gpu:14 \
              --out "$OUT/again1.jsonl" 2>&1 | quiet 12 ;;
    b4) timeout 570 $BENCH --gpus 2 --mbs 4 --steps 6 --threads 16 --policies "$P4" --peers fsdp2-offload:none \
          --out "$OUT/bench.jsonl" 2>&1 | quiet 60 ;;
    b8) timeout 330 $BENCH --gpus 2 --mbs 8 --steps 6 --threads 16 --policies "$P8" --peers fsdp2:8 \
          --out "$OUT/bench.jsonl" 2>&1 | quiet 50 ;;
    one8) CUDA_VISIBLE_DEVICES=0 timeout 270 $BENCH --gpus 1 --mbs 4 --steps 20 --threads 32 --data pattern --lr 1e-4 \
          --policies replicated:host:checkpoint:0:36 --peers fsdp2:0 --out "$OUT/bench1.jsonl" 2>&1 | quiet 40 ;;
    cast8) for mbs in 8 4; do timeout 280 $BENCH --gpus 2 --mbs $mbs --steps 6 --threads 16 \
             --policies sharded:gpu:checkpoint:0:36:host,sharded:gpu:checkpoint:0:36:gpu --out "$OUT/bench-cast.jsonl" \
             2>&1 | quiet 12; done ;;
    edge8) E=sharded:gpu:checkpoint:0:36
           timeout 330 $BENCH --gpus 2 --mbs 8 --steps 6 --threads 16 --peers fsdp2:8 --out "$OUT/bench-edge.jsonl" \
             --policies $E:host:host,$E:host:gpu,$E:gpu:gpu,auto:auto:auto:0:auto:host:auto:auto 2>&1 | quiet 16
           timeout 240 $BENCH --gpus 2 --mbs 4 --steps 6 --threads 16 --out "$OUT/bench-edge.jsonl" \
             --policies $E:host:host,$E:host:gpu,auto:auto:auto:0:auto:host:auto:auto,auto:auto:auto:1.0:auto:host:auto:auto \
             2>&1 | quiet 12 ;;
    grid) L=${L:-36}; G=""; for a in checkpoint:0:$L keep${K:-27}:0:auto off${M:-18}:0:auto; do
            for r in sharded:gpu replicated:gpu sharded:host replicated:host; do G="$G,$r:$a"; done; done
          timeout 580 python3 -m slidedp.cli bench --model ${MODEL:-qwen3-8b} --seq 2048 --gpus 2 --mbs ${MBS:-8} \
            --steps 6 --threads 16 --policies "${G#,},auto:auto:auto:0:auto" --out "$OUT/grid.jsonl" 2>&1 | quiet 20 ;;
    pcie8) NCCL_P2P_DISABLE=1 python3 -m slidedp.cli topology > "$OUT/topology-pcie.json" 2>&1
           NCCL_P2P_DISABLE=1 timeout 560 $BENCH --gpus 2 --mbs 8 --steps 6 --threads 16 --out "$OUT/bench-pcie.jsonl" \
             --policies sharded:gpu:checkpoint:0:36,replicated:gpu:checkpoint:0:36,sharded:host:checkpoint:0:36,replicated:host:checkpoint:0:36,auto:auto:auto:0:auto \
             2>&1 | quiet 14 ;;
    ds4) python3 -m pip install -q --no-index --no-deps --target /tmp/peer-pkgs .device-wheels/*.whl 2>&1 | tail -2
         PYTHONPATH=/tmp/peer-pkgs:$PYTHONPATH PATH=/tmp/peer-pkgs/bin:$PATH timeout 580 $BENCH --gpus 2 --mbs 4 \
           --steps 6 --threads 16 --policies sharded:gpu:checkpoint:1.0:36 --peers ds-zero2:1.0,ds-zero3:1.0 \
           --out "$OUT/bench-ds.jsonl" 2>&1 | quiet 20 ;;
    layers) timeout 180 python3 scripts/layer_profile.py --model qwen3-8b --model llama3.2-3b --seq 2048 --seq 4096 \
              --out "$OUT/layers.json" 2>&1 | quiet 48 ;;
    clayers) timeout ${CLAYERS_S:-200} python3 scripts/layer_profile.py --model qwen3-8b --seq 2048 --mbs 8 \
              --compiled --out "$OUT/layers-compiled.json" 2>&1 | quiet 40 ;;
    firstc) for l in false false true true; do timeout ${FIRST_S:-150} python3 scripts/first_step.py --model qwen3-8b \
              --gpu-memory-gib ${GPU_GIB:-24} --delivery-cast ${CAST:-gpu} --compiled-layers $l \
              > "$OUT/firstc-$l.log" 2>&1; cat "$OUT/firstc-$l.log" >> "$OUT/firstc-all.log"
            grep -vE "Warning|warn" "$OUT/firstc-$l.log" | tail -7; done ;;
    comp8)
           SLIDEDP_TRACE=$OUT/comp8-trace timeout ${COMP_S:-560} python3 -m slidedp.cli bench --model qwen3-8b \
             --seq 2048 --gpus 1 --mbs 8 \
             --steps ${COMP_STEPS:-8} --threads 16 --policies "$A:0:$R:eager,$A:0:$R:compiled,$A:1.0:$R:compiled" \
             --peers fsdp2:0,fsdp2:0:0:compiled --out "$OUT/comp8.jsonl" 2>&1 | quiet 30 ;;
    copies) for m in qwen3-4b:4 qwen3-8b:8; do timeout ${COPIES_S:-90} python3 scripts/probe_layer_copies.py \
              --model ${m%:*} --mbs ${m#*:} --out "$OUT/layer-copies.jsonl" 2>&1 | quiet 16; done ;;
    clip8)
           SLIDEDP_TRACE=$OUT/clip8-trace timeout ${COMP_S:-560} python3 -m slidedp.cli bench --model qwen3-8b \
             --seq 2048 --gpus 1 --mbs 8 --steps ${COMP_STEPS:-8} --threads 16 \
             --policies "$A:0:$R:compiled,$A:1.0:$R:compiled" --out "$OUT/clip8.jsonl" 2>&1 | quiet 20 ;;
    comp3) K=${COMP3_PEER_KEEP:-none}
           timeout ${COMP_S:-560} python3 -m slidedp.cli bench --model llama3.2-3b --seq 2048 --gpus 1 --mbs 8 \
             --steps ${COMP_STEPS:-8} --threads 16 --policies "$A:0:$R:eager,$A:0:$R:compiled" \
             --peers fsdp2:$K,fsdp2:$K:0:compiled --out "$OUT/comp3.jsonl" 2>&1 | quiet 30 ;;
    sust) for c in "" --compiled; do timeout 120 python3 scripts/probe_layer_sustained.py --model qwen3-8b --mbs 8 \
            --seq 2048 --seconds ${SUST_S:-15} $c --out "$OUT/sustained.jsonl" 2>&1 | quiet 16; done ;;
    pyc)  python3 - <<'PY'
import glob, os, sys, transformers
d = os.path.dirname(transformers.__file__)
srcs = glob.glob(os.path.join(d, "**", "*.py"), recursive=True)
tag = sys.implementation.cache_tag
have = sum(os.path.exists(os.path.join(os.path.dirname(f), "__pycache__",
                                       os.path.basename(f)[:-3] + f".{tag}.pyc")) for f in srcs)
print(f"transformers {transformers.__version__} at {d}: {have} of {len(srcs)} modules with bytecode; "
      f"writable: {os.access(d, os.W_OK)}; dont_write_bytecode: {sys.dont_write_bytecode}")
PY
          I="import time; t=time.perf_counter(); import torch, slidedp.data, slidedp.step.engine; from transformers import AutoConfig, PreTrainedModel; from slidedp.step.model_adapter import ModelAdapter; from slidedp.step.rank import load_hf_config; ModelAdapter(load_hf_config('qwen3-8b')); print(round(time.perf_counter()-t, 2), 's')"
          for i in 1 2; do echo -n "rank imports and model, as is ($i): "; python3 -c "$I" 2>&1 | tail -1; done
          for i in 1 2; do echo -n "through the ranks' bytecode cache ($i): "
            env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$SLIDEDP_CACHE_DIR/bytecode" python3 -c "$I" 2>&1 | tail -1; done ;;
    castcal) timeout 120 python3 -m pytest -v -s -rfE --tb=short -p no:cacheprovider -m gpu \
               tests/gpu/test_gpu_delivery_cast_figure.py tests/gpu/test_gpu_cast_ring.py > "$OUT/castcal-tests.log" 2>&1
             grep -E "PASSED|FAILED|ERROR|passed|failed|forward_s" "$OUT/castcal-tests.log" | tail -12
             timeout 170 $BENCH --gpus 1 --mbs 8 --steps ${STEPS:-8} --threads 16 --data pattern \
               --policies "${CASTAB_POLICY:-replicated:host:keep8:0:7:gpu:gpu:0:auto:0:eager:1}" --out "$OUT/castcal-fixed.jsonl" 2>&1 | quiet 3
             [ "${CASTCAL_S:-300}" -gt 0 ] && SLIDEDP_TRACE=$OUT/castcal-auto-trace timeout ${CASTCAL_S:-300} $BENCH --gpus 1 --mbs 8 --steps ${STEPS:-8} --threads 16 --policies "$A:0:$R:compiled,$A:1.0:$R:compiled" \
               --out "$OUT/castcal-auto.jsonl" 2>&1 | quiet 6 ;;
    widen) timeout 150 python3 scripts/probe_post_norm.py --threads 16 --chunks 18,19,20,21,22,24 | tee "$OUT/post-norm.jsonl"
           best=$(python3 -c "import json; r=[json.loads(l) for l in open('$OUT/post-norm.jsonl')]
r=[x for x in r if x['piece'][10:].isdigit()]; print(min(r, key=lambda x: x['s'])['piece'][10:] if r else '')")
           [ -n "$best" ] || { echo "the probe gave no chunk" >&2; exit 3; }
           rm -rf /tmp/wide && mkdir -p /tmp/wide && cp -r runtime /tmp/wide/
           sed -i "s/^WIDEN_CHUNK = .*/WIDEN_CHUNK = $best/" /tmp/wide/runtime/slidedp/step/optimizer.py
           grep -n "^WIDEN_CHUNK" /tmp/wide/runtime/slidedp/step/optimizer.py
           for run in old1 new old2; do
             RT=$PWD/runtime; [ $run = new ] && RT=/tmp/wide/runtime
             PYTHONPATH=$RT:$PWD SLIDEDP_TRACE=$OUT/widen-$run-trace timeout ${WIDEN_S:-150} $BENCH --gpus 1 --mbs 8 \
               --steps ${STEPS:-8} --threads 16 --data pattern --policies "$A:1.0:$R:compiled" --out "$OUT/widen-$run.jsonl" 2>&1 | quiet 3
           done ;;
    pairs) case " ${PAIRS_MODELS:-8b 4b} " in *" 8b "*)
           SLIDEDP_TRACE=$OUT/pairs-8b-trace timeout ${PAIRS_S:-240} $BENCH --gpus 1 --mbs 8 --steps ${STEPS:-8} \
             --threads 16 --data pattern --policies "$A:0:$R:compiled,$A:1.0:$R:compiled" --out "$OUT/pairs-8b.jsonl" 2>&1 | quiet 6 ;; esac
           case " ${PAIRS_MODELS:-8b 4b} " in *" 4b "*)
           SLIDEDP_TRACE=$OUT/pairs-4b-trace timeout ${PAIRS_S:-240} python3 -m slidedp.cli bench --model qwen3-4b \
             --seq 2048 --gpus 1 --mbs 4 --steps ${STEPS:-8} --threads 16 --data pattern --gpu-memory-gib 24 \
             --policies "$A:0:$R:compiled,$A:1.0:$R:compiled" --out "$OUT/pairs-4b-24.jsonl" 2>&1 | quiet 6 ;; esac ;;
    clip24) python3 -m pip install -q --no-index --no-deps --target /tmp/peer-pkgs .device-wheels/*.whl 2>&1 | tail -2
            PYTHONPATH=/tmp/peer-pkgs:$PYTHONPATH PATH=/tmp/peer-pkgs/bin:$PATH SLIDEDP_TRACE=$OUT/clip24-trace \
              timeout ${CLIP24_S:-560} python3 -m slidedp.cli bench --model qwen3-4b --seq 2048 --gpus 1 --mbs 4 \
              --steps ${STEPS:-6} --threads 16 --data pattern --gpu-memory-gib 24 \
              --policies "${CLIP24_POLICIES:-$A:0:$R:compiled,$A:1.0:$R:compiled,$A:1.0:$R:eager}" \
              --peers ds-zero3:1.0,fsdp2-offload:0:1.0 \
              --out "$OUT/clip24.jsonl" 2>&1 | quiet 30 ;;
    castab) P=${CASTAB_POLICY:-replicated:host:keep8:0:7:gpu:gpu:0:auto:0:eager:1}
            for run in ${CASTAB_RUNS:-new1 old new2}; do
              RT=$PWD/runtime; [ $run = old ] && RT=$PWD/${OLD_TREE:-ab_old}/runtime
              SET=; case $run in *:*) SET=${run#*:}; run=${run%%:*} ;; esac
              case $run in *=*) RT=$PWD/${run#*=}/runtime; run=${run%%=*} ;; esac
              PYTHONPATH=$RT:$PWD SLIDEDP_TRACE=$OUT/castab-$run-trace timeout ${CASTAB_S:-200} python3 -m slidedp.cli \
                bench --model qwen3-8b --seq 2048 --gpus 1 --mbs 8 --steps ${STEPS:-8} --threads 16 --data pattern \
                --policies "$P" ${SET:+--policy-set "$SET"} --out "$OUT/castab-$run.jsonl" 2>&1 | quiet 3
            done ;;
    *) echo "unknown part '$part': the parts are listed at the top of scripts/gpu_run.sh" >&2; exit 2 ;;
  esac
done
rm -rf "$SLIDEDP_CACHE_DIR/bytecode"  # the ranks' bytecode (slidedp.bytecode): thousands of files, not results
echo "===== end $(date +%T)"
