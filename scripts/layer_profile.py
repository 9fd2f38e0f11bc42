"""Where one decoder layer's time goes: its kernels by class, the launch gaps between them, and the arithmetic.

    PYTHONPATH=runtime python3 scripts/layer_profile.py --model qwen3-8b --model llama3.2-3b --seq 2048 --seq 4096 \
        --out layers.json

One layer of a preset (random init, no download) runs as the step engine runs it: its parameters are views of one
flat bf16 buffer, the rotary embedding is computed once outside the layer, and each phase goes through
RankEngine's own `_layer_forward` / `_layer_backward` (borrowed by a class holding only what those two read), so
the profile sees the engine's graph, saved-tensor hooks and gradient buffers. With --compiled each layer is
profiled twice: eager, then through the engine's compiled layer (slidedp.step.compiled: policy.compiled_layers;
inductor on CUDA, aot_eager on the CPU), whose run sits under the eager run's "compiled" key with the same
figures, plus what the compile took (`compile`: the first iteration's seconds, dynamo's graph and graph-break
counts) and `speedup` (eager wall / compiled wall per phase). Phases, each timed alone:

* `forward`: a kept layer's forward (autograd graph and activations kept);
* `backward`: the backward of that forward, into the layer's flat gradient buffer;
* `checkpoint_forward`: a checkpointed layer's forward (no graph);
* `recompute`: a checkpointed layer's backward: the forward re-run under autograd, then its backward.

After --warmup untimed iterations, --iters iterations are timed without the profiler (CUDA events: `wall_ms`) and
--iters more under torch.profiler; every figure is a per-iteration mean. Each device kernel is classified by its
name, the aten ops that launched it and the layer part it ran for (module hooks and a wrapped
apply_rotary_pos_emb label the forward ops; a backward op takes the label of the forward op whose autograd node
it runs; a compiled layer has no layer-part labels, as module hooks would change its graph: its fused Triton
kernels are classed by the ops in their names, `fused` when those span several classes). `gaps_ms` is the profiled phase's wall time less the union of its kernels' busy time: launch latency
and host-side stalls. On the CPU the "kernels" are the aten ops' own (self) time.

FLOPs are the layer's GEMMs (q, k, v, o, gate, up, down: 2 per multiply-add) and attention (QK^T and PV, causal:
half the square), the backward twice the forward (as slidedp.presets.flops_per_token counts), the recompute
three times; TFLOP/s per class are that class's FLOPs over its kernel time, and `ideal_ms` is the time at
--peak-tflops.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from slidedp.step.compiled import layer_function
from slidedp.step.devices import Streams
from slidedp.step.engine import RankEngine
from slidedp.step.model_adapter import ModelAdapter, load_hf_config

PHASES = ("forward", "backward", "checkpoint_forward", "recompute")
CLASSES = ("gemm", "attention", "norm", "activation", "rope", "cast", "copy", "reduction", "fused", "other")
# FLOPs of a phase in units of the layer's forward FLOPs
PHASE_FORWARDS = {"forward": 1, "backward": 2, "checkpoint_forward": 1, "recompute": 3}
DEFAULT_MODELS = ("qwen3-8b", "llama3.2-3b")
DEFAULT_SEQS = (2048, 4096)
DEFAULT_TOKENS = 16384  # micro-batch 8 at seq 2048, as the benchmark rows run
PHASE_MARK = "layer_profile:"
LABEL_MARK = "layer_part:"

# ---------------------------------------------------------------------------------------------- classification
# Kernel-name fragments (lower case), checked in this order: attention before gemm, as some attention kernels
# are cutlass kernels.
NAME_RULES = (
    ("attention", ("flash", "fmha", "sdpa", "scaled_dot_product", "attention", "attn")),
    ("gemm", ("gemm", "cutlass", "cublas", "nvjet", "xmma", "sm90_", "sm80_", "matmul", "aten::mm", "aten::addmm",
              "aten::bmm", "aten::baddbmm", "aten::_addmm_activation")),
    ("norm", ("rms_norm", "rmsnorm", "layer_norm", "layernorm", "rowwisemoments")),
    ("activation", ("silu", "gelu", "swiglu")),
    ("rope", ("rotary", "rope")),
)
# aten ops that mean "this kernel belongs to a GEMM" (split-K reductions, bias epilogues)
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
# aten ops whose kernels are attention's, whatever their names (cuDNN's pre- and post-processing kernels)
ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")
# layer parts (module labels) and the class their non-GEMM kernels count as
LABEL_CLASSES = {"norm": "norm", "activation": "activation", "mlp": "activation", "rope": "rope"}
COPY_FRAGMENTS = ("copy", "catarray", "aten::cat", "clone", "contiguous", "index")
REDUCTION_FRAGMENTS = ("reduce", "reduction")
REDUCTION_OPS = frozenset({"aten::sum", "aten::mean", "aten::amax", "aten::max", "aten::norm", "aten::var"})
# aten ops that only make views or allocate: they launch no kernel, so on the CPU they are no "kernel" either
METADATA_OPS = frozenset({
    "aten::view", "aten::as_strided", "aten::transpose", "aten::t", "aten::reshape", "aten::_reshape_alias",
    "aten::slice", "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::detach", "aten::empty",
    "aten::empty_like", "aten::empty_strided", "aten::_unsafe_view", "aten::resolve_conj", "aten::resolve_neg",
    "aten::narrow", "aten::result_type", "aten::permute", "aten::alias", "aten::select", "aten::split",
    "aten::chunk", "aten::lift_fresh", "aten::_has_compatible_shallow_copy_type", "aten::is_nonzero",
    "aten::to", "aten::matmul", "aten::linear", "aten::scaled_dot_product_attention",
})


# Fused Triton kernels (inductor's, named triton_<kind>_fused_<op>_<op>..._<n>): the ops in the name that mark
# a class, checked in this order; a kernel whose ops mark none of them but a cast is a cast, else it is `fused`.
TRITON_RULES = (
    ("norm", ("rsqrt",)),
    ("activation", ("silu", "sigmoid")),
    ("rope", ("neg", "cos", "sin")),
)


def classify_triton(name: str) -> str:
    """The class of one generated Triton kernel from the ops its name lists."""
    ops = set(name.lower().split("fused_", 1)[-1].split("_"))
    for cls, marks in TRITON_RULES:
        if ops & set(marks):
            return cls
    if ops <= {"to", "copy", "", *{str(i) for i in range(100)}}:
        return "cast"
    return "fused"


def classify(name: str, ops: tuple[str, ...] = (), label: str | None = None) -> str:
    """The class of one kernel from its name, the aten ops above it (innermost first) and its layer part.

    A name that says what it computes wins (GEMM, attention, a fused norm or activation); then the op that
    launched it (attention's and GEMMs' helper kernels); then a dtype cast (an aten::_to_copy anywhere above it:
    aten::to reaches _to_copy only when the dtype changes); then the layer part the op ran for (the SwiGLU
    product and the norms' elementwise kernels have generic names); then a copy, a reduction, or other.
    """
    low = name.lower()
    if low.startswith("triton_"):
        return classify_triton(low)
    for cls, fragments in NAME_RULES:
        if any(f in low for f in fragments):
            return cls
    if any(f in op for op in ops for f in ATTENTION_OPS):
        return "attention"
    if any(op in GEMM_OPS for op in ops):
        return "gemm"
    if "aten::_to_copy" in ops:  # a cast's backward is one too: ToCopyBackward0 runs aten::to
        return "cast"
    if label in LABEL_CLASSES:
        return LABEL_CLASSES[label]
    first_op = ops[0].lower() if ops else ""
    if any(f in low or f in first_op for f in COPY_FRAGMENTS):
        return "copy"
    if any(f in low for f in REDUCTION_FRAGMENTS) or first_op in REDUCTION_OPS:
        return "reduction"
    return "other"


# ---------------------------------------------------------------------------------------------- the layer
class EngineLayerCalls:
    """The step engine's own per-layer forward and backward (RankEngine's methods), on an object that holds only
    what they read: the adapter, the layer's activation policy, the streams, the window buffer."""

    _leaves = RankEngine._leaves
    _layer_forward = RankEngine._layer_forward
    _layer_backward = RankEngine._layer_backward

    def __init__(self, adapter: ModelAdapter, buf: torch.Tensor, device: torch.device, compiled: bool = False):
        self.adapter, self.buf = adapter, buf
        self.layer_fn = layer_function(adapter, compiled, device)  # the engine's: eager, or its compiled layer
        self.activations = ["keep"]
        self.streams = Streams(device)
        self.routes = SimpleNamespace(bytes=None)  # byte counters: only offload counts (not profiled here)

    def _lookup(self, u: int) -> torch.Tensor:
        return self.buf


@dataclass
class Layer:
    """One decoder layer as the engine holds it: a bf16 flat buffer, its gradient buffer, the inputs."""

    adapter: ModelAdapter
    engine: EngineLayerCalls
    buf: torch.Tensor
    gflat: torch.Tensor
    h: torch.Tensor
    grad_out: torch.Tensor
    ctx: dict


def build_layer(model: str, mbs: int, seq: int, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Layer:
    adapter = ModelAdapter(load_hf_config(model))
    spec = adapter.units[1]
    host = torch.empty(spec.numel, dtype=torch.float32)
    adapter.init_unit(spec, host, seed)
    buf = host.to(device=device, dtype=dtype)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    h = torch.randn(mbs, seq, adapter.hidden, generator=gen).to(device=device, dtype=dtype)
    grad_out = (torch.randn(mbs, seq, adapter.hidden, generator=gen) * 1e-3).to(device=device, dtype=dtype)
    pos = torch.arange(seq, device=device).unsqueeze(0).expand(mbs, seq)
    ctx = {"position_ids": pos, "attention_mask": None}
    ctx["position_embeddings"] = adapter.rotary(device)(h, pos)  # once per micro-batch, outside the layers
    engine = EngineLayerCalls(adapter, buf, device)
    gflat = torch.empty(spec.numel, dtype=dtype, device=device)
    return Layer(adapter, engine, buf, gflat, h, grad_out, ctx)


def _forward(layer: Layer, policy: str):
    layer.engine.activations[0] = policy
    return layer.engine._layer_forward(1, layer.buf, layer.h, layer.ctx)[1]


def _backward(layer: Layer, saved) -> None:
    layer.engine._layer_backward(1, layer.buf, saved, layer.grad_out, layer.ctx, layer.gflat)


def run_iteration(layer: Layer, clock) -> dict[str, float]:
    """The four phases once, each timed alone by `clock`; seconds per phase."""
    out = {}
    saved = clock.time("forward", lambda: _forward(layer, "keep"), out)
    clock.time("backward", lambda: _backward(layer, saved), out)  # frees the kept activations
    ckpt = clock.time("checkpoint_forward", lambda: _forward(layer, "checkpoint"), out)
    clock.time("recompute", lambda: _backward(layer, ckpt), out)
    return out


class PhaseClock:
    """Times one phase alone: the device drained before and after, CUDA events on the GPU (perf_counter on the
    CPU), inside a profiler range named for the phase."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, phase: str, fn, out: dict[str, float]):
        self._sync()
        with torch.profiler.record_function(PHASE_MARK + phase):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                result = fn()
                end.record()
                end.synchronize()
                out[phase] = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                result = fn()
                out[phase] = time.perf_counter() - t0
        return result


# ---------------------------------------------------------------------------------------------- layer-part labels
def _part_of(module: torch.nn.Module, name: str) -> str | None:
    kind = type(module).__name__.lower()
    if "norm" in kind:
        return "norm"
    if isinstance(module, torch.nn.Linear):
        return "linear"
    if name.endswith("act_fn") or "activation" in kind:
        return "activation"
    if name == "mlp":
        return "mlp"
    if name == "self_attn":
        return "self_attn"
    return None


@contextlib.contextmanager
def part_labels(adapter: ModelAdapter):
    """Profiler ranges named for the layer part each forward op runs in (norm, linear, activation, mlp,
    self_attn, rope), on the adapter's own template: module hooks, and apply_rotary_pos_emb of the layer's
    transformers module wrapped (it is a function, not a module). Removed on exit."""
    handles, open_ranges = [], []

    def enter(label):
        def hook(*_):
            rf = torch.profiler.record_function(LABEL_MARK + label)
            rf.__enter__()
            open_ranges.append(rf)
        return hook

    def leave(*_):
        open_ranges.pop().__exit__(None, None, None)

    for name, module in adapter.layer_template.named_modules():
        label = _part_of(module, name)
        if label is not None:
            handles.append(module.register_forward_pre_hook(enter(label)))
            handles.append(module.register_forward_hook(leave))
    module = sys.modules[type(adapter.layer_template).__module__]
    original = getattr(module, "apply_rotary_pos_emb", None)
    if original is not None:
        def rope(*args, **kwargs):
            with torch.profiler.record_function(LABEL_MARK + "rope"):
                return original(*args, **kwargs)
        module.apply_rotary_pos_emb = rope
    try:
        yield
    finally:
        for hd in handles:
            hd.remove()
        if original is not None:
            module.apply_rotary_pos_emb = original


# ---------------------------------------------------------------------------------------------- profile parsing
@dataclass
class Kernel:
    name: str
    start_us: float  # when its op launched it (which phase it belongs to), on the profile's clock
    busy: tuple[float, float]  # device interval, microseconds (any origin, the same for all kernels)
    cls: str
    ops: tuple[str, ...] = ()  # the aten ops above it, innermost first
    label: str | None = None  # the layer part it ran for


def _chain(evt) -> list:
    out = []
    while evt is not None:
        out.append(evt)
        evt = evt.cpu_parent
    return out


def _forward_labels(cpu_events) -> dict[tuple[int, int], str]:
    """(thread, sequence number) of each forward op run under a layer-part label -> that label: a backward
    node carries its forward op's sequence number and thread."""
    labels = {}
    for e in cpu_events:
        if e.sequence_nr < 0 or e.name.startswith("autograd::"):
            continue
        label = _label(_chain(e))
        if label is not None:
            labels.setdefault((e.thread, e.sequence_nr), label)
    return labels


def _label(chain) -> str | None:
    for e in chain:
        if e.name.startswith(LABEL_MARK):
            return e.name[len(LABEL_MARK):]
    return None


def _context(op, fwd_labels) -> tuple[tuple[str, ...], str | None]:
    """(names of the op and its ancestors, innermost first; its layer part) of one CPU op."""
    chain = _chain(op)
    label = _label(chain)
    if label is None:
        for e in chain:
            if e.name.startswith("autograd::engine::evaluate_function") and e.sequence_nr >= 0:
                label = fwd_labels.get((e.fwd_thread or e.thread, e.sequence_nr))
                break
    return tuple(e.name for e in chain if not e.name.startswith((PHASE_MARK, LABEL_MARK))), label


def device_kernels(prof, cuda: bool) -> list[Kernel]:
    """Every device kernel of the profile (on the CPU: every aten op's own time), classified."""
    events = prof.events()
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    fwd_labels = _forward_labels(cpu)
    if not cuda:
        return _cpu_kernels(cpu, fwd_labels)
    # aten ops only: the runtime's launch events share the profile but number their ids in another space
    aten = [e for e in cpu if e.name.startswith("aten::")]
    by_id = {e.id: e for e in aten}
    results = prof.profiler.kineto_results
    origin_us = results.trace_start_ns() / 1e3
    launches = {k.correlation_id(): k.start_ns() / 1e3 - origin_us for k in results.events()
                if k.device_type() == torch.autograd.DeviceType.CPU and k.name().startswith("cu")}
    kernels = []
    for k in results.events():
        if k.device_type() != torch.autograd.DeviceType.CUDA or k.duration_ns() <= 0 or _annotation(k):
            continue
        op = by_id.get(k.linked_correlation_id())
        if op is None and k.correlation_id() in launches:
            op = _innermost_at(aten, launches[k.correlation_id()])
        ops, label = _context(op, fwd_labels) if op is not None else ((), None)
        t0 = k.start_ns() / 1e3
        start = op.time_range.start if op is not None else t0 - origin_us  # else: when it ran
        kernels.append(Kernel(k.name(), start, (t0, t0 + k.duration_ns() / 1e3), classify(k.name(), ops, label),
                              ops, label))
    return kernels


def _innermost_at(ops, t_us: float):
    """The shortest op running at t_us: the launcher of a kernel the profile did not link to its op (some
    backward kernels), found by the time its CUDA runtime call began."""
    running = [e for e in ops if e.time_range.start <= t_us <= e.time_range.end]
    return min(running, key=lambda e: e.time_range.elapsed_us(), default=None)


def _annotation(k) -> bool:
    """A profiler range drawn on the device's timeline (this script's phase and part ranges among them)."""
    if k.name().startswith((PHASE_MARK, LABEL_MARK)):
        return True
    is_annotation = getattr(k, "is_user_annotation", None)
    return bool(is_annotation()) if is_annotation is not None else False


def _cpu_kernels(cpu, fwd_labels) -> list[Kernel]:
    kernels = []
    for e in cpu:
        if not e.name.startswith("aten::") or e.name in METADATA_OPS or e.self_cpu_time_total <= 0:
            continue
        ops, label = _context(e, fwd_labels)
        t0 = e.time_range.start
        # the op's own time, as one interval: children's time is theirs
        kernels.append(Kernel(e.name, t0, (t0, t0 + e.self_cpu_time_total), classify(e.name, ops, label), ops, label))
    return kernels


def phase_windows(prof) -> list[tuple[str, float, float]]:
    """(phase, start, end) of every profiled phase range, on the profiler's CPU clock."""
    out = []
    for e in prof.events():
        if e.name.startswith(PHASE_MARK):
            out.append((e.name[len(PHASE_MARK):], e.time_range.start, e.time_range.end))
    return out


def union_us(intervals: list[tuple[float, float]], disjoint: bool) -> float:
    """Busy time of a set of intervals (their union; a plain sum where they cannot overlap)."""
    if disjoint:
        return sum(b - a for a, b in intervals)
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


# ---------------------------------------------------------------------------------------------- arithmetic
def layer_shapes(cfg) -> dict[str, int]:
    heads = cfg.num_attention_heads
    return {"hidden": cfg.hidden_size, "ffn": cfg.intermediate_size, "heads": heads,
            "kv_heads": cfg.num_key_value_heads,
            "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // heads}


def forward_flops(shapes: dict[str, int], mbs: int, seq: int) -> dict[str, float]:
    """One layer's forward FLOPs: its GEMMs and its causal attention (half of QK^T and PV)."""
    h, f, d = shapes["hidden"], shapes["ffn"], shapes["head_dim"]
    nh, nkv = shapes["heads"], shapes["kv_heads"]
    tokens = mbs * seq
    weights = h * nh * d + 2 * h * nkv * d + nh * d * h + 3 * h * f
    gemm = 2.0 * tokens * weights
    attention = 2.0 * 2.0 * mbs * seq * seq * nh * d / 2
    return {"gemm": gemm, "attention": attention}


def phase_flops(shapes: dict[str, int], mbs: int, seq: int, phase: str) -> dict[str, float]:
    fwd = forward_flops(shapes, mbs, seq)
    k = PHASE_FORWARDS[phase]
    out = {"gemm": k * fwd["gemm"], "attention": k * fwd["attention"]}
    out["total"] = out["gemm"] + out["attention"]
    return out


def _tflops(flops: float, ms: float) -> float | None:
    return flops / (ms * 1e-3) / 1e12 if ms > 0 else None


# ---------------------------------------------------------------------------------------------- one run
def phase_summary(kernels: list[Kernel], iters: int, wall_s: float, profiled_wall_s: float,
                  flops: dict[str, float], peak_tflops: float, disjoint: bool) -> dict:
    """Per-iteration means of one phase: kernel time and count per class, busy time, gaps, FLOPs, TFLOP/s."""
    profiled_ms = profiled_wall_s * 1e3
    busy_ms = union_us([k.busy for k in kernels], disjoint) / 1e3 / iters
    classes = {}
    for cls in CLASSES:
        mine = [k for k in kernels if k.cls == cls]
        ms = sum(k.busy[1] - k.busy[0] for k in mine) / 1e3 / iters
        top: dict[str, list] = {}
        for k in mine:
            t = top.setdefault(k.name, [0.0, 0])
            t[0] += (k.busy[1] - k.busy[0]) / 1e3 / iters
            t[1] += 1
        classes[cls] = {"ms": ms, "count": len(mine) / iters,
                        "share": ms / profiled_ms if profiled_ms > 0 else 0.0,
                        "top": [[n, round(v[0], 4), v[1] / iters]
                                for n, v in sorted(top.items(), key=lambda kv: -kv[1][0])[:4]]}
    for cls in ("gemm", "attention"):
        classes[cls]["tflops"] = _tflops(flops[cls], classes[cls]["ms"])
    wall_ms = wall_s * 1e3
    peak = peak_tflops * 1e12
    return {
        "wall_ms": wall_ms, "profiled_wall_ms": profiled_ms, "busy_ms": busy_ms,
        "gaps_ms": max(profiled_ms - busy_ms, 0.0), "kernels": len(kernels) / iters, "classes": classes,
        "flops": flops, "tflops": _tflops(flops["total"], wall_ms),
        "ideal_ms": {k: flops[k] / peak * 1e3 for k in ("gemm", "attention", "total")},
    }


def profile_layer(model: str, mbs: int, seq: int, device: torch.device, dtype: torch.dtype, iters: int,
                  warmup: int, peak_tflops: float, compiled: bool = False) -> dict:
    """One layer's phases, eager; with `compiled`, the same layer through the engine's compiled layer too (under
    "compiled", with the compile's figures and "speedup": eager wall / compiled wall per phase)."""
    layer = build_layer(model, mbs, seq, device, dtype)
    run = _profile_phases(layer, mbs, seq, device, iters, warmup, peak_tflops, labels=True)
    if compiled:
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        layer.engine.layer_fn = layer_function(layer.adapter, True, device)
        comp = _profile_phases(layer, mbs, seq, device, iters, warmup, peak_tflops, labels=False)
        comp["compile"] = {
            "backend": layer.engine.layer_fn.backend,
            "first_iteration_s": comp.pop("first_iteration_s"),
            "unique_graphs": int(counters["stats"]["unique_graphs"]),  # 2: the grad and the no-grad graph
            "frames_compiled": int(counters["frames"]["ok"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
        }
        comp["speedup"] = {p: run["phases"][p]["wall_ms"] / comp["phases"][p]["wall_ms"] for p in PHASES}
        run["compiled"] = comp
    return run


def _profile_phases(layer: Layer, mbs: int, seq: int, device: torch.device, iters: int, warmup: int,
                    peak_tflops: float, labels: bool) -> dict:
    clock = PhaseClock(device)
    t0 = time.perf_counter()
    run_iteration(layer, clock)  # the first warm-up iteration (at least one): library set-up, or the compile
    first_s = time.perf_counter() - t0
    for _ in range(warmup - 1):
        run_iteration(layer, clock)
    timed = [run_iteration(layer, clock) for _ in range(iters)]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if clock.cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with part_labels(layer.adapter) if labels else contextlib.nullcontext(), \
            torch.profiler.profile(activities=activities) as prof:
        profiled = [run_iteration(layer, clock) for _ in range(iters)]
    kernels = device_kernels(prof, clock.cuda)
    windows = phase_windows(prof)
    shapes = layer_shapes(layer.adapter.config)
    phases = {}
    for phase in PHASES:
        spans = [(a, b) for p, a, b in windows if p == phase]
        mine = [k for k in kernels if any(a <= k.start_us <= b for a, b in spans)]
        phases[phase] = phase_summary(
            mine, iters, sum(t[phase] for t in timed) / iters, sum(t[phase] for t in profiled) / iters,
            phase_flops(shapes, mbs, seq, phase), peak_tflops, disjoint=not clock.cuda)
    return {"mbs": mbs, "seq": seq, "tokens": mbs * seq, "shapes": shapes, "phases": phases,
            "first_iteration_s": first_s}


# ---------------------------------------------------------------------------------------------- output
def _fmt_tflops(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}" if x >= 10 else f"{x:.2g}"[:6]


def print_table(model: str, run: dict, out=sys.stdout, title: str = "") -> None:
    """Milliseconds per phase: wall (unprofiled), profiled wall, kernels' busy union, gaps, then each class; a
    compiled run after its eager one."""
    s = run["shapes"]
    print(f"\n{model}{title}  seq {run['seq']}  micro-batch {run['mbs']}  ({run['tokens']} tokens; hidden "
          f"{s['hidden']}, ffn {s['ffn']}, heads {s['heads']}/{s['kv_heads']} x {s['head_dim']})", file=out)
    print(f"{'phase ms':<19}{'wall':>8}{'TF/s':>7}{'prof':>8}{'busy':>8}{'gaps':>7}"
          + "".join(f"{c[:6]:>8}" for c in CLASSES), file=out)
    for phase, r in run["phases"].items():
        cells = "".join(f"{r['classes'][c]['ms']:>8.2f}" for c in CLASSES)
        print(f"{phase:<19}{r['wall_ms']:>8.2f}{_fmt_tflops(r['tflops']):>7}{r['profiled_wall_ms']:>8.2f}"
              f"{r['busy_ms']:>8.2f}{r['gaps_ms']:>7.2f}{cells}", file=out)
    for phase, r in run["phases"].items():
        g, a = r["classes"]["gemm"], r["classes"]["attention"]
        print(f"  {phase:<19} gemm {_fmt_tflops(g['tflops'])} TF/s (ideal {r['ideal_ms']['gemm']:.2f} ms), "
              f"attention {_fmt_tflops(a['tflops'])} TF/s (ideal {r['ideal_ms']['attention']:.2f} ms), "
              f"{r['kernels']:.0f} kernels", file=out)
    if "compile" in run:
        c = run["compile"]
        print(f"  {c['backend']}: first iteration {c['first_iteration_s']:.1f} s, {c['unique_graphs']} graphs, "
              f"{c['graph_breaks']} graph breaks; speedup "
              + ", ".join(f"{p} {x:.2f}x" for p, x in run["speedup"].items()), file=out)
    if "compiled" in run:
        print_table(model, run["compiled"], out, title="  compiled")


def default_mbs(seq: int) -> int:
    """The micro-batch that keeps the benchmark rows' token count (8 at seq 2048, 4 at 4096), at least 1."""
    return max(1, DEFAULT_TOKENS // seq)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help=f"preset (repeatable; default {' '.join(DEFAULT_MODELS)})")
    ap.add_argument("--seq", action="append", type=int, help="sequence length (repeatable; default 2048 4096)")
    ap.add_argument("--mbs", type=int, default=None,
                    help=f"micro-batch for every seq (default {DEFAULT_TOKENS} tokens: 8 at 2048, 4 at 4096)")
    ap.add_argument("--iters", type=int, default=5, help="timed and profiled iterations each (default 5)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--peak-tflops", type=float, default=782.0,
                    help="dense bf16 GEMM peak the ideal times use (default 782: measured on the H200)")
    ap.add_argument("--compiled", action="store_true",
                    help="profile each layer through the engine's compiled layer too (policy.compiled_layers), "
                    "after its eager run: under the run's 'compiled' key")
    ap.add_argument("--out", help="JSON file for the results")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "dtype": args.dtype, "iters": args.iters, "warmup": args.warmup,
              "peak_tflops": args.peak_tflops, "compiled": args.compiled, "models": {}}
    for model in args.model or DEFAULT_MODELS:
        runs = result["models"].setdefault(model, {})
        for seq in args.seq or DEFAULT_SEQS:
            mbs = args.mbs or default_mbs(seq)
            run = profile_layer(model, mbs, seq, device, dtype, args.iters, args.warmup, args.peak_tflops,
                                args.compiled)
            runs[str(seq)] = run
            print_table(model, run)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    return result


if __name__ == "__main__":
    main()
