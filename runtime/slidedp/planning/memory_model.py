"""The memory model: what a job holds under a policy — each rank's peak HBM and the host's RAM, part by part.

Imports no torch (the web API checks fits with it). It follows how the engine allocates (slidedp/step: engine,
window, host_state), so a plan that fits does not run out of memory:

    mem = memory(job, pol, ActivationSizes.of(job, calibration))     # bytes per part, GPU and host

Saved-activation sizes come from calibration where its shape matches the job (planning/shape.py), otherwise
from a count of what a decoder layer keeps for backward (flagged as estimated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slidedp.planning.compiled_choice import measured
from slidedp.planning.job import Job
from slidedp.planning.shape import shape_matches
from slidedp.policy import ExecutionPolicy
from slidedp.step.layout import chunk_elements, held_in_bf16, plan_layout

ALLOCATOR_SLACK = 0.10  # the caching allocator's rounding and fragmentation over what tensors need
# Host memory a GPU rank process holds of its own, beside the shared host state: the CUDA runtime, torch, the model
# code and its small buffers. Measured as RssAnon of one-GPU Qwen3-4B ranks on the H200: 3.4-4.35 GiB. A Qwen3-8B
# job planned 2.7 GiB under its 128 GiB limit without it was killed by the kernel at its first step.
GPU_RANK_PROCESS_BYTES = int(4.5 * 2**30)
LAUNCHER_PROCESS_BYTES = 2**29  # the launching process (torch and transformers imported, no CUDA): ~0.35 GiB


# ---------------------------------------------------------------------------- activations
@dataclass
class ActivationSizes:
    """Bytes one decoder layer saves for backward at the job's (micro-batch, seq), and the loss head's transient
    bytes per token of a chunk; measured by calibration or, without it, estimated (and flagged)."""

    keep: float
    checkpoint: float
    head_per_token: (
        float  # loss head peak grows with the chunk's tokens (logits, their fp32 forms, gradients)
    )
    head_fixed: float  # and has a part that does not (the lm_head weight gradient of a chunk)
    measured: bool

    @classmethod
    def of(cls, job: Job, calibration: dict[str, Any] | None, compiled: bool = False) -> ActivationSizes:
        """`compiled`: a layer's saved bytes as the compiled layer keeps them, where calibration measured it."""
        unit = (calibration or {}).get("unit") if shape_matches(job, calibration) else None
        if unit and compiled:
            unit = measured(calibration) or unit
        head = (calibration or {}).get("loss_head") if unit else None
        # per token of a chunk: logits, their fp32 copy, the saved log-softmax, the fp32 gradient and its cast
        est_tok = job.vocab * (2 * job.pbytes + 12)
        est_fixed = job.vocab * job.hidden * job.pbytes
        if unit:
            head = head or {}
            return cls(
                float(unit["saved_keep_bytes"]),
                float(unit["saved_checkpoint_bytes"]),
                float(head.get("peak_bytes_per_token") or est_tok),
                float(head.get("peak_fixed_bytes", est_fixed)),
                True,
            )
        return cls(
            float(estimate_saved_bytes(job)),
            float(job.tokens_per_micro_batch * job.hidden * job.pbytes),
            float(est_tok),
            float(est_fixed),
            False,
        )


def estimate_saved_bytes(job: Job) -> int:
    """Saved-activation bytes of one decoder layer without calibration, by counting what a HF decoder layer
    (RMSNorm in fp32, SDPA attention, SwiGLU MLP) keeps for backward per token: two norms (fp32 input + their
    output, 6h bytes each in bf16 precision), the attention and MLP inputs (2h each), q/k norms (Qwen3), q, k, v
    and the attention output, and gate, up, act(gate) and the down-projection input (8f). Within 1% of the
    Qwen3-8B layer measured on our GPU machine; calibration replaces it."""
    mc, p = job.model_cfg, job.pbytes
    h, f = job.hidden, int(mc["intermediate_size"])
    hd = int(mc.get("head_dim") or h // mc["num_attention_heads"])
    qd, kvd = int(mc["num_attention_heads"]) * hd, int(mc["num_key_value_heads"]) * hd
    per_tok = 2 * (4 + p) * h + 2 * p * h + p * (qd + 2 * kvd) + p * qd + 4 * p * f
    if job.arch == "qwen3":
        per_tok += (4 + p) * (qd + kvd)
    return int(per_tok * job.tokens_per_micro_batch)


# ---------------------------------------------------------------------------- memory model
def gradient_bytes(job: Job, pol: ExecutionPolicy) -> int:
    """The gradient buffers of one rank's device (slidedp.step.engine): per parity, a layer's gradient in the
    compute dtype, its fp32 copy (bf16 precision only) and, where several ranks reduce on the GPUs, the
    reduce-scatter's shard of the largest unit; plus the fp32 accumulators of the embedding and head."""
    L, p, N = job.layers, job.pbytes, job.world
    max_layer = max((job.padded(u) for u in range(1, L + 1)), default=0)
    max_unit = max(job.padded(u) for u in range(L + 2))
    fp32_copy = max_layer * 4 if p != 4 else 0
    shard = -(-max_unit // N) * 4 if (pol.grad_reduce == "gpu" and N > 1) else 0
    return 2 * (max_layer * p + fp32_copy + shard) + (job.padded(0) + job.padded(L + 1)) * 4


def device_gradients_bf16(job: Job) -> set[int]:
    """The layers whose gradient, where they are updated on the device, waits there in bf16 (held_in_bf16:
    slidedp.step.device_update)."""
    return set(held_in_bf16(job.world, job.precision, job.grad_accum, job.layers))


def gpu_parts(
    job: Job, pol: ExecutionPolicy, acts: ActivationSizes, offload_backlog: int | None = None
) -> dict[str, float]:
    """Bytes one rank's device holds at its peak, by part (before allocator slack)."""
    L, p, N = job.layers, job.pbytes, job.world
    head = L + 1
    resident = [i + 1 for i in range(L) if pol.resident[i]]
    streamed = [u for u in range(1, L + 1) if u not in resident]
    boundary = job.tokens_per_micro_batch * job.hidden * p
    counts = pol.counts()
    n_off = counts["offload"]
    backlog = n_off if offload_backlog is None else min(n_off, offload_backlog)
    parts = {
        "window": pol.window * max((job.padded(u) for u in streamed), default=0) * p if streamed else 0,
        "embedding_and_head": (job.padded(0) + job.padded(head)) * p,
        "resident_layers": sum(job.padded(u) for u in resident) * p,
        "gradients": gradient_bytes(job, pol),
        "accumulation": sum(job.padded(u) for u in range(1, L + 1)) * 4 if job.grad_accum > 1 else 0,
        "activations": counts["keep"] * acts.keep + counts["checkpoint"] * acts.checkpoint,
        # offloaded activations leave through the d2h stream; those not yet copied still occupy the GPU
        "offload_in_flight": backlog * acts.keep,
        "hidden_states": 4 * boundary,  # the layer input/output, the head's gradient and its flat view
    }
    head_peak = acts.head_fixed + min(pol.loss_chunk_tokens, job.tokens_per_micro_batch) * acts.head_per_token
    # offloaded activations come back into two slots the engine keeps for the run (one with a single such layer)
    parts["offload_fetch_slots"] = min(2, n_off) * acts.keep
    # during backward: a checkpointed layer's recompute
    backward_peak = acts.keep if counts["checkpoint"] else 0.0
    parts["transient"] = max(head_peak, backward_peak)
    # units updated on the GPUs: fp32 master and both moments of 1/N of each, and its reduced gradient (with one
    # rank the embedding's and head's accumulators serve, a layer's gradient is copied out of the parity buffers,
    # in bf16 where exact, and widened into one fp32 chunk at a time for the update: slidedp.step.device_update)
    on_device = pol.device_units(L)
    if on_device:
        bf16 = device_gradients_bf16(job) & set(on_device)
        parts["device_state"] = sum(job.padded(u) / N * (12 + (0 if N == 1 and u in (0, head) else
                                                               2 if u in bf16 else 4)) for u in on_device)
        if bf16:
            parts["device_state"] += chunk_elements([job.padded(u) for u in bf16]) * 4
    # the delivery cast's ring of fp32 scratch (policy.cast_scratch_mb, slidedp.step.cast_ring), held for the run;
    # the default, one transfer chunk, is within the allocator's slack
    if job.on_gpu and job.pbytes != 4 and pol.delivery_cast == "gpu" and pol.cast_scratch_mb:
        parts["cast_scratch"] = float(pol.cast_scratch_mb << 20)
    # layers streamed through the GPUs after the norm (slidedp.step.streamed_update): their gradients wait here
    # (bf16 where exact), and two sets of chunk buffers carry their master, moments, gradient and bf16 copy
    streamed_units = pol.streamed_units()
    if streamed_units:
        bf16 = set(held_in_bf16(N, job.precision, job.grad_accum, L))
        shard = {u: -(-job.padded(u) // N) for u in streamed_units}
        chunk = chunk_elements(list(shard.values()))
        parts["streamed_gradients"] = sum(n * (2 if u in bf16 else 4) for u, n in shard.items())
        host_cast = job.precision == "bf16" and pol.delivery_cast == "host"
        parts["streamed_buffers"] = 2 * chunk * (16 + (2 if host_cast else 0))
    return parts


def host_parts(job: Job, pol: ExecutionPolicy, acts: ActivationSizes) -> dict[str, float]:
    """Bytes of host RAM the whole job holds (all ranks), by part."""
    N = job.world
    max_unit = max(job.padded(u) for u in range(len(job.units)))
    # the shared segments, by the rule the engine lays them out with
    layout = plan_layout(list(job.units), N, pol, job.precision, job.clip, directory="", grad_accum=job.grad_accum)
    parts = {
        **{k: float(v) for k, v in layout.parts().items()},
        "host_reduce_scratch": float(N * -(-max_unit // N) * 4)
        if pol.grad_reduce == "host" and N > 1
        else 0.0,
        "offloaded_activations": float(N * pol.counts()["offload"] * acts.keep),
    }
    if not job.on_gpu:  # CPU training: each rank's working set is host memory too
        parts["rank_working_sets"] = N * sum(gpu_parts(job, pol, acts).values()) * (1 + ALLOCATOR_SLACK)
    else:
        parts["rank_processes"] = float(N * GPU_RANK_PROCESS_BYTES + LAUNCHER_PROCESS_BYTES)
    return parts


def memory(
    job: Job, pol: ExecutionPolicy, acts: ActivationSizes, offload_backlog: int | None = None
) -> dict[str, Any]:
    g = gpu_parts(job, pol, acts, offload_backlog)
    h = host_parts(job, pol, acts)
    peak = sum(g.values()) * (1 + ALLOCATOR_SLACK) if job.on_gpu else 0.0
    return {"hbm_peak_bytes": peak, "hbm_parts": g, "host_bytes": sum(h.values()), "host_parts": h}
