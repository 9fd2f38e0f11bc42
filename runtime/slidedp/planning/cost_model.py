"""The cost model: what a job costs under a policy — peak HBM, host RAM and (with calibration) step time.

Imports no torch: the web API prices jobs with a worker's reported topology and calibration.

    job = Job.from_config(cfg, topology)
    pol = ExecutionPolicy.default(job.layers)
    pred = predict(job, pol, Rates(calibration, job))                 # step time, phases, exposure

and planning/memory_model.py what they hold (peak HBM, host RAM) under that policy; both read the job as
planning/job.py defines it. Time comes from the overlap model (planning/overlap.py; a long step extended by
planning/long_step.py) fed with microbenchmarks of this host (planning/calibration.py); nothing here is fitted to
training runs.
docs/planning.md explains the model.
"""

from __future__ import annotations

import math
from typing import Any

from slidedp.planning import long_step, overlap
from slidedp.planning.compiled_choice import measured
from slidedp.planning.job import GIB as GIB
from slidedp.planning.job import POST_NORM_PASS_SHARES, Job
from slidedp.planning.job import UPDATE_DRAM_BYTES as UPDATE_DRAM_BYTES
from slidedp.planning.memory_model import ActivationSizes
from slidedp.planning.shape import shape_matches
from slidedp.policy import DELIVERY_CASTS, ExecutionPolicy
from slidedp.step.layout import held_in_bf16, streamed_weights_stay

PHASES = ("data", "forward", "backward", "update_tail", "delivery_wait")
# A decoder layer's backward on a GPU inside a training step over its calibrated time alone (the layer's kernels on
# the compute stream, from the step timelines' `layer` events: scripts/trace_report.py --layers). Measured 1.01-1.09,
# median 1.06, over the 13 timelines kept from five sessions on the H200 machine and four H100 hosts (checkpointed
# and kept layers, eager and compiled, clipped and not; tests/runtime/test_in_step_backward.py reads them; docs/
# planning.md "A layer inside the step"); the forward ranged 0.90-1.06 and stays as calibrated.
IN_STEP_BACKWARD = 1.06
# With clipping, the first host unit updated after the norm ends this much later after the backward's end than its
# own update takes, in every clipped step timeline kept (0.025-0.086 s; nine timelines: the H200 machine's s21 and
# H100 hosts of s22-s28; tests/runtime/test_post_norm_start.py reads them; docs/planning.md "The first unit after
# the norm"): their median, charged to the updater before its first post-norm unit in a GPU job's clipped step.
POST_NORM_START_S = 0.05


class Uncalibrated(ValueError):
    """The calibration lacks a figure this prediction needs (named in the message)."""


# ---------------------------------------------------------------------------- rates from calibration
def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear in x, clamped at the ends (figures are never extrapolated beyond what was measured)."""
    pts = sorted(zip(xs, ys))
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


class Rates:
    """Calibration figures turned into seconds for this job (raises Uncalibrated for a missing figure). The job
    holds no policy choice: what depends on the delivery cast (the host update's rate) is held for each cast and
    asked for with the cast of the policy being priced, so one Rates prices every policy of the job."""

    def __init__(self, calibration: dict[str, Any], job: Job):
        if not calibration:
            raise Uncalibrated("no calibration")
        if not shape_matches(job, calibration):
            s = calibration.get("shape", {})
            raise Uncalibrated(
                f"the calibration is for micro_batch {s.get('micro_batch')} x seq {s.get('seq')} "
                f"of hidden {s.get('hidden')} in {s.get('precision')}, not this job's shape"
            )
        self.c, self.job = calibration, job
        cpu = calibration["cpu"]
        self.threads = [float(t) for t in cpu["threads"]]
        # the update as each delivery cast runs it: AdamW and the bf16 cast, or AdamW alone when the GPU casts
        self.in_step = self.in_step_factor(calibration)
        self.update_per_param = {
            cast: [v / 1e9 * self.in_step for v in cpu[job.update_table(cast)]] for cast in DELIVERY_CASTS
        }
        self.copy_bps = [v * 1e9 for v in cpu["copy_GBps"]]

    def host_update_summary(self, cast: str) -> dict[str, float]:
        """The host update rate the plan charges under delivery_cast `cast`, for the plan's reader: per 1e9 params
        at the rank's threads, the `cpu` figure it comes from and the factor update_in_step applied to it."""
        t = self.job.cpu_threads
        charged = self._cpu(self.update_per_param[cast], t) * 1e9
        return {"threads": t, "s_per_1e9": charged, "cpu_s_per_1e9": charged / self.in_step,
                "in_step_factor": self.in_step}

    def in_step_factor(self, calibration: dict[str, Any]) -> float:
        """How much slower the host update runs in a step than `cpu` times it alone: update_in_step's rate beside
        the issuing thread's load over the `cpu` update rate at the same thread count (1 when not measured, as in
        calibrations before schema 5 and on the CPU, where the ranks' compute has cores of its own)."""
        ins = calibration.get("update_in_step")
        if not ins or not ins.get("beside_load_s_per_1e9"):
            return 1.0
        cpu = calibration["cpu"]
        table = cpu["update_s_per_1e9"] if ins.get("cast", True) else cpu["adamw_s_per_1e9"]
        return ins["beside_load_s_per_1e9"] / self._cpu(table, float(ins["threads"]))

    # host work ---------------------------------------------------------------
    def _cpu(self, table: list[float], threads: float) -> float:
        return _interp(self.threads, table, threads)

    def update_s(self, numel: int, cast: str) -> float:
        """Every rank's shard of one unit under delivery_cast `cast`: ranks run in parallel, each with cpu_threads
        threads, but they share host memory, so the whole unit takes at least what all their threads together
        need."""
        j, table = self.job, self.update_per_param[cast]
        one_rank = numel / j.world * self._cpu(table, j.cpu_threads)
        together = numel * self._cpu(table, min(j.world * j.cpu_threads, j.cores))
        return max(one_rank, together)

    def copy_s(self, traffic: float) -> float:
        """Host memory work of `traffic` bytes read plus written, at the measured copy rate (which counts
        both the bytes read and the bytes written, as a STREAM copy does)."""
        j = self.job
        return traffic / self._cpu(self.copy_bps, min(j.world * j.cpu_threads, j.cores))

    # transfers ---------------------------------------------------------------
    def transfer_s(self, direction: str, nbytes: float, chunk_mb: int) -> float:
        j = self.job
        if not j.on_gpu:
            return self.copy_s(2 * nbytes)  # CPU mode: a memcpy in the rank's thread
        t = self.c.get("transfers") or {}
        key = (
            f"{direction}_all_GBps" if j.world > 1 and t.get(f"{direction}_all_GBps") else f"{direction}_GBps"
        )
        if not t.get(key):
            raise Uncalibrated(f"{direction.upper()} bandwidth")
        chunks = [math.log(c) for c in t["chunk_mib"]]
        bw = _interp(chunks, t[key], math.log(min(chunk_mb, nbytes / 2**20) if nbytes > 2**20 else 1.0))
        return nbytes / (bw * 1e9) + t.get("latency_s", 0.0)

    def cast_figure(self, pol: ExecutionPolicy) -> dict[str, Any] | None:
        """Calibration's timing of a decoder layer's delivery with the bf16 cast on the GPU (`delivery_cast`: alone
        and beside the layer's forward) that this policy's deliveries run as: through the cast scratch where the
        policy holds at least the scratch measured at the chunk it was measured with (the ring's buffers are half a
        chunk), else the default cast at the transfer chunk nearest the policy's; None where the GPUs make no cast
        (host cast, fp32, CPU ranks) or it was not measured."""
        d = self.c.get("delivery_cast")
        if not d or "error" in d or not self.job.on_gpu or self.job.pbytes == 4 or pol.delivery_cast != "gpu":
            return None
        if pol.cast_scratch_mb >= d["ring_mib"] and pol.chunk_mb == d["ring_chunk_mib"]:
            return d["ring"]
        chunks = d["chunk_mib"]
        return d["default"][min(range(len(chunks)), key=lambda i: abs(math.log(chunks[i] / max(1, pol.chunk_mb))))]

    def deliver_s(self, nbytes: float, pol: ExecutionPolicy) -> float:
        """One delivery of nbytes host->GPU alone: the link's time at the policy's chunk, or where the GPUs cast,
        no less than calibration's delivery of a layer through the same cast took per byte alone."""
        t = self.transfer_s("h2d", nbytes, pol.chunk_mb)
        fig = self.cast_figure(pol)
        if fig is None:
            return t
        return max(t, nbytes * fig["alone_s"] / self.c["delivery_cast"]["bytes"])

    def cast_beside_compute(self, pol: ExecutionPolicy) -> float:
        """How many times longer a delivery with the cast on the GPU takes while the compute stream runs than
        alone (calibration's `delivery_cast`, beside the layer's forward); 1 where no cast or not measured."""
        fig = self.cast_figure(pol)
        return max(1.0, fig["beside_s"] / fig["alone_s"]) if fig and fig["alone_s"] > 0 else 1.0

    def collective_s(self, op: str, nbytes: float) -> float:
        coll = self.c.get("collectives") or {}
        rows = coll.get(op)
        if not rows or coll.get("world") != self.job.world:
            raise Uncalibrated(
                f"{op.replace('_', '-')} over {self.job.world} ranks (collectives not measured)"
            )
        xs = [r["bytes"] for r in rows]
        big = max(rows, key=lambda r: r["bytes"])
        if nbytes > big["bytes"]:  # beyond the largest size, the largest size's bandwidth
            return big["s"] * nbytes / big["bytes"]
        return _interp(xs, [r["s"] for r in rows], nbytes)

    def device_update_s(self, numel: int, cast: str) -> float:
        """One rank's device-side update of its 1/N of a unit (policy.edge_update: gpu): fused AdamW and the copy
        into the unit's buffer, on the GPU at the calibrated rate; on the CPU in the rank's own threads, as the
        host update runs under delivery_cast `cast`."""
        j = self.job
        shard = numel / j.world
        if not j.on_gpu:
            return shard * self._cpu(self.update_per_param[cast], j.cpu_threads)
        rate = (self.c.get("device_update") or {}).get("adamw_cast_s_per_1e9")
        if not rate:
            raise Uncalibrated("the device AdamW rate (device_update: calibrated before edge_update existed)")
        return shard * rate / 1e9

    def device_copy_s(self, numel: int) -> float:
        """One rank's copy of its 1/N of a unit in the compute dtype within device memory (a streamed layer's
        kept weights into the window): read and written once (device_traffic_s)."""
        j = self.job
        return self.device_traffic_s(numel / j.world * j.pbytes * 2)

    def device_traffic_s(self, nbytes: float) -> float:
        """Seconds of elementwise work that moves `nbytes` through device memory, at the memory rate the device's
        fused AdamW and cast reached when calibrated (30 B/param: master, gradient and moments read, master,
        moments and the bf16 copy written); 0 where the calibration has no device AdamW rate; on CPU ranks a host
        copy of those bytes."""
        if not self.job.on_gpu:
            return self.copy_s(nbytes)
        rate = (self.c.get("device_update") or {}).get("adamw_cast_s_per_1e9")
        return nbytes / 30 * rate / 1e9 if rate else 0.0

    def gradient_out_s(self, numel: int) -> float:
        """What the step's compute stream does with a decoder layer's gradient in each micro-batch beyond the
        layer's backward as calibration times it (slidedp.step.engine `_layer_backward`, `_layer_gradient_out`):
        the flat gradient buffer zeroed before it (its dtype), then either added into the layer's fp32
        accumulator (gradient accumulation: read, and the sum read and written) or, in bf16 without accumulation,
        widened to fp32 for the trip (read, written in fp32)."""
        j = self.job
        if j.grad_accum > 1:
            per_param = j.pbytes + j.pbytes + 8.0
        elif j.pbytes < 4:
            per_param = j.pbytes + j.pbytes + 4.0
        else:
            per_param = j.pbytes
        return self.device_traffic_s(numel * per_param)

    def pools(self) -> tuple[float | None, float | None]:
        """(host DRAM capacity, one GPU link's both-direction capacity) in bytes/s; None when not measured."""
        if not self.job.on_gpu:
            return None, None
        dram = (self.c.get("host_dram") or {}).get("capacity_GBps")
        pcie = (self.c.get("transfers") or {}).get("bidir_GBps")
        return (dram * 1e9 if dram else None), (pcie * 1e9 if pcie else None)

    def dram_update_weight(self) -> float:
        """How much more of host memory the host update keeps than a copy beside it, per byte of demand: the
        calibration's pair (`host_dram`: the update alone and beside copies, the copies alone and beside the
        update) as the ratio of the shares each kept, within [0.5, 2]; 1 (proportional) where not measured."""
        h = self.c.get("host_dram") or {}
        try:
            kept_update = h["update_alone_s_per_1e9"] / h["update_with_dma_s_per_1e9"]
            kept_copies = h["dma_with_update_GBps"] / h["dma_alone_GBps"]
        except (KeyError, TypeError, ZeroDivisionError):
            return 1.0
        if not kept_update > 0 or not kept_copies > 0:
            return 1.0
        return min(2.0, max(0.5, kept_update / kept_copies))

    def copies_beside_update(self) -> float | None:
        """Bytes/s that host<->GPU copies moved together beside the host update when calibrated (`host_dram`
        .dma_with_update_GBps); None off the GPU or when not measured."""
        if not self.job.on_gpu:
            return None
        v = (self.c.get("host_dram") or {}).get("dma_with_update_GBps")
        return v * 1e9 if v else None

    def direction_capacity(self, direction: str) -> float | None:
        """One direction of one GPU's link in bytes/s: the fastest this calibration measured that direction at
        (no copy alone goes faster, so only copies sharing the direction are slowed by it); None off the GPU or
        when not measured."""
        t = self.c.get("transfers") or {}
        if not self.job.on_gpu or not t.get(f"{direction}_GBps"):
            return None
        return max(t[f"{direction}_GBps"]) * 1e9

    # compute -----------------------------------------------------------------
    def layer_s(self, compiled: bool = False) -> tuple[dict[str, float], dict[str, float]]:
        """(forward, backward) seconds of one decoder layer by activation policy; `compiled`: the layer through
        policy.compiled_layers where calibration timed it (planning/compiled_choice.py), else the eager layer."""
        u = (measured(self.c) if compiled else None) or self.c["unit"]
        fwd = {"keep": u["fwd_keep_s"], "offload": u["fwd_keep_s"], "checkpoint": u["fwd_checkpoint_s"]}
        f = IN_STEP_BACKWARD if self.job.on_gpu else 1.0
        bwd = {"keep": u["bwd_keep_s"] * f, "offload": u["bwd_keep_s"] * f, "checkpoint": u["bwd_checkpoint_s"] * f}
        return fwd, bwd

    def head_s(self, chunk_tokens: int) -> float:
        """The loss head of one micro-batch (final norm, lm_head and cross-entropy, forward and backward) in
        chunks of `chunk_tokens`, each chunk's weight gradient added into the step's fp32 sum."""
        h = self.c["loss_head"]
        tokens = self.job.tokens_per_micro_batch
        chunks = math.ceil(tokens / max(1, chunk_tokens))
        per_chunk = h.get("s_per_chunk", 0.0)
        if not h.get("accumulates"):
            per_chunk += self.head_accumulate_s()
        return tokens * h["s_per_token"] + chunks * per_chunk

    def head_accumulate_s(self) -> float:
        """One chunk's lm_head weight gradient (vocab x hidden, compute dtype) added into the step's fp32 sum:
        read, and the sum read and written, at the memory rate the device's fused AdamW reached when calibrated
        (30 B/param, as device_copy_s); on CPU ranks a host copy of those bytes. For calibrations whose loss head
        was timed without it (recorded before `loss_head.accumulates`)."""
        j = self.job
        return self.device_traffic_s(j.vocab * j.hidden * (j.pbytes + 8.0))


# ---------------------------------------------------------------------------- time
def durations(job: Job, pol: ExecutionPolicy, rates: Rates, zero: frozenset = frozenset()) -> overlap.Durations:
    """Seconds of every piece of the step under this policy (the delivery cast's bytes and host update rate
    are the policy's)."""
    N, p, cast = job.world, job.pbytes, pol.delivery_cast
    sharded = pol.delivery == "sharded" and N > 1
    gpu_reduce = pol.grad_reduce == "gpu" and N > 1
    gbytes = 4  # gradients travel and are reduced in fp32
    n_units = len(job.units)
    fwd, bwd = rates.layer_s(pol.compiled_layers)
    if "recompute" in zero:
        bwd = dict(bwd, checkpoint=bwd["keep"])
    deliver_bytes = [job.padded(u) * job.delivered_bytes(cast) / (N if sharded else 1) for u in range(n_units)]
    grad_bytes = [job.padded(u) * gbytes / (N if gpu_reduce else 1) for u in range(n_units)]
    coll_bytes = [float(job.padded(u) * p) for u in range(n_units)]
    update = [rates.update_s(job.units[u], cast) for u in range(n_units)]
    upd_bytes = [float(job.units[u] * job.update_dram_bytes(cast)) for u in range(n_units)]
    # units updated on the GPUs (edge_update gpu, device_layers): reduce-scattered (fp32) and updated on the
    # device, then all-gathered into their buffers; no delivery, no gradient copy, no host update
    on_device = pol.device_units(job.layers)
    device_update = [0.0] * n_units
    for u in on_device:
        gather = rates.collective_s("all_gather", coll_bytes[u]) if N > 1 else 0.0
        device_update[u] = rates.device_update_s(job.units[u], cast) + gather
        deliver_bytes[u] = grad_bytes[u] = update[u] = upd_bytes[u] = 0.0
    # layers streamed through the GPUs after the norm (policy.streamed_layers): their gradient stays on the
    # device (reduce-scattered there with several ranks) and their update is this rank's shard of the master and
    # moments in and out over its link (12 B/param each way, and the bf16 copy out where the host keeps one),
    # the device AdamW beside it; no host update, hold or gradient copy
    streamed = pol.streamed_units()
    streamed_s = [0.0] * n_units
    streamed_bytes = [0.0] * n_units
    streamed_in = [0.0] * n_units
    for u in streamed:
        shard = job.units[u] / N
        out_bytes = shard * (12 + (2 if job.host_cast(cast) else 0))
        streamed_s[u] = max(rates.transfer_s("h2d", shard * 12, pol.chunk_mb),
                            rates.transfer_s("d2h", out_bytes, pol.chunk_mb)) + rates.device_update_s(job.units[u],
                                                                                                      cast)
        streamed_bytes[u] = shard * 12 + out_bytes
        streamed_in[u] = shard * 12
        grad_bytes[u] = update[u] = upd_bytes[u] = 0.0
    # ... whose updated weights stay on the device for the next forward where the engine keeps them
    weights_kept = frozenset(streamed) if streamed_weights_stay(N, pol.delivery) else frozenset()
    device_copy = [rates.device_copy_s(job.units[u]) if u in weights_kept else 0.0 for u in range(n_units)]
    on_device = on_device | streamed  # from here on: units that send nothing to the host
    # the host route sums N copies of each shard as it lands (one copy and N-1 adds of fp32), then reads the sum
    # once more for the gradient norm; on the gpu route and with one rank the norm is reduced on the GPUs
    host_sum = pol.grad_reduce == "host" and N > 1
    sum_traffic = [0.0 if u in on_device or not host_sum else job.units[u] * 4.0 * 3 * N for u in range(n_units)]
    # exact clipping (slidedp.step.optimizer): as each gradient lands the updater sums it (host route) and copies
    # it into the held gradient (4 B read, 4 B written per parameter, or 2 written where it is held in bf16:
    # slidedp.step.layout.held_in_bf16); the update runs after the norm is known.
    # Without clipping the summation precedes the update in the same handoff.
    bf16_held = set(held_in_bf16(N, job.precision, job.grad_accum, job.layers))
    hold_traffic = [0.0 if u in on_device else job.units[u] * (6.0 if u in bf16_held else 8.0) + sum_traffic[u]
                    for u in range(n_units)]
    hold = [rates.copy_s(b) for b in hold_traffic]
    if not job.clip:
        update = [t + (rates.copy_s(b) if b else 0.0) for t, b in zip(update, sum_traffic)]
        upd_bytes = [a + b for a, b in zip(upd_bytes, sum_traffic)]
    moments = moments_bytes = [0.0] * n_units
    if job.clip:
        # after the norm, in two passes (POST_NORM_PASS_SHARES): the weights (and the bf16 copy), then the moments.
        # The clip factor scales the held gradient in the weights pass (read and written again, 8 B/param); a bf16
        # one is widened and scaled a cache-sized chunk at a time in each pass, where only its 2 B/param read
        # reaches DRAM
        two = pol.post_norm_passes == 2
        first, second = POST_NORM_PASS_SHARES if two else (1.0, 0.0)
        scale = [0.0 if u in on_device else job.units[u] * (2.0 if u in bf16_held else 8.0) for u in range(n_units)]
        # the moments pass widens a bf16 one again; an fp32 one it reads as scaled
        again = [b if u in bf16_held and two else 0.0 for u, b in enumerate(scale)]
        moments = [t * second + rates.copy_s(b) for t, b in zip(update, again)]
        moments_bytes = [b * second + extra for b, extra in zip(upd_bytes, again)]
        update = [t * first + rates.copy_s(b) for t, b in zip(update, scale)]
        upd_bytes = [b * first + extra for b, extra in zip(upd_bytes, scale)]
    dram, pcie = rates.pools()
    # Without P2P a collective crosses host memory: every rank writes its part there and reads the others'.
    through_host = job.on_gpu and job.interconnect == "pcie-host"
    coll_loads = {"dram": 2.0 * (N - 1) / N * N, "pcie": 2.0 * (N - 1) / N} if through_host else {}
    act_bytes = ActivationSizes.of(job, rates.c, pol.compiled_layers).keep
    return overlap.Durations(
        world=N,
        units=list(job.units),
        activations=list(pol.activations),
        resident=list(pol.resident),
        window=pol.window,
        staging_slots=pol.staging_slots,
        micro_batches=job.grad_accum,
        clip=job.clip,
        sharded=sharded,
        gpu_reduce=gpu_reduce,
        embed_fwd=rates.c["embedding"]["fwd_s"],
        embed_bwd=rates.c["embedding"]["bwd_s"],
        head=rates.head_s(pol.loss_chunk_tokens),
        layer_fwd=fwd,
        layer_bwd=bwd,
        gradient_out=[rates.gradient_out_s(job.padded(u)) if 0 < u < n_units - 1 else 0.0 for u in range(n_units)],
        deliver=[rates.deliver_s(b, pol) if b else 0.0 for b in deliver_bytes],
        cast_beside_compute=rates.cast_beside_compute(pol),
        deliver_bytes=deliver_bytes,
        all_gather=[rates.collective_s("all_gather", b) if sharded else 0.0 for b in coll_bytes],
        grad_d2h=[rates.transfer_s("d2h", b, pol.chunk_mb) if b else 0.0 for b in grad_bytes],
        grad_bytes=grad_bytes,
        reduce_scatter=[
            rates.collective_s("reduce_scatter", b * (4 if u in on_device else gbytes) / p) if gpu_reduce else 0.0
            for u, b in enumerate(coll_bytes)
        ],
        device_update=device_update,
        streamed=streamed_s,
        streamed_bytes=streamed_bytes,
        streamed_in_bytes=streamed_in,
        weights_kept=weights_kept,
        device_copy=device_copy,
        moments=moments,
        moments_bytes=moments_bytes,
        act_d2h=rates.transfer_s("d2h", act_bytes, pol.chunk_mb) if "offload" in pol.activations else 0.0,
        act_h2d=rates.transfer_s("h2d", act_bytes, pol.chunk_mb) if "offload" in pol.activations else 0.0,
        act_bytes=act_bytes,
        update=update,
        update_bytes=upd_bytes,
        hold=hold,
        hold_bytes=hold_traffic,
        collective_loads=coll_loads,
        coll_bytes=coll_bytes,
        dram_capacity=dram,
        dram_update_weight=rates.dram_update_weight(),
        copies_beside_update=rates.copies_beside_update(),
        pcie_capacity=pcie,
        h2d_capacity=rates.direction_capacity("h2d"),
        d2h_capacity=rates.direction_capacity("d2h"),
        cpu_mode=not job.on_gpu,
        zero=zero,
        post_norm_start=POST_NORM_START_S if job.on_gpu and job.clip else 0.0,
    )


def predict(job: Job, pol: ExecutionPolicy, rates: Rates, exposure: bool = False) -> dict[str, Any]:
    """Step time, phases and (with exposure=True) the exposed seconds of each resource: how much shorter the
    step would be if that resource's work took no time, everything else unchanged."""
    base = long_step.simulate(durations(job, pol, rates))
    out: dict[str, Any] = {
        "step_time_s": base.step_time_s,
        "phases": base.phases,
        "spans": base.spans,
        "busy": base.busy,
        "tokens_per_s": job.tokens_per_step / base.step_time_s if base.step_time_s > 0 else None,
    }
    if exposure:
        exposed = {}
        for name, kinds in overlap.EXPOSURE_KINDS.items():
            exposed[name] = base.step_time_s - long_step.simulate(durations(job, pol, rates, kinds)).step_time_s
        if "checkpoint" in pol.activations:
            free = long_step.simulate(durations(job, pol, rates, frozenset({"recompute"})))
            exposed["recompute"] = base.step_time_s - free.step_time_s
        if job.on_gpu:
            free = long_step.simulate(durations(job, pol, rates, frozenset({"host_dram"})))
            exposed["host_dram"] = base.step_time_s - free.step_time_s
        out["exposed"] = {k: max(0.0, v) for k, v in exposed.items()}
    return out


def offload_backlog(job: Job, pol: ExecutionPolicy, rates: Rates | None) -> int | None:
    """How many offloaded layers' activations wait on the GPU for the d2h stream at once (None: all of them)."""
    if rates is None or "offload" not in pol.activations:
        return None
    fwd, _ = rates.layer_s(pol.compiled_layers)
    out = rates.transfer_s("d2h", ActivationSizes.of(job, rates.c, pol.compiled_layers).keep, pol.chunk_mb)
    drained = fwd["keep"] / max(out, 1e-12)  # layers' copies finished while one more layer runs forward
    if drained >= 1.0:
        return 1  # each layer's copy is done before the next layer's is queued
    # the copies fall behind the forward: by the end of the offloaded block, all but the drained share still wait
    # (Qwen3-1.7B bs8 on one H200: a layer's 1.9 GB take 38 ms to copy out after a 5 ms forward; the run held
    # 78 GiB where one layer in flight predicted 50)
    n_off = pol.counts()["offload"]
    return min(n_off, math.ceil(n_off * (1.0 - drained)) + 1)

