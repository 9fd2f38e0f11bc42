"""The job as the planner sees it: its model's units and shape, its ranks, precision and the host it runs on.

`Job.from_config(cfg, topology)` derives it from a JobConfig and a topology (planning/topology.py). The memory
model (what a policy holds), the cost model (what it costs in time) and the calibration matching (shape.py) all
read it, so it lives apart from each of them. It holds no policy choice: what depends on one (the delivery cast's
bytes per parameter) is asked of it with the choice of the ExecutionPolicy being priced, so one Job prices every
policy. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slidedp.config import GPU_CONTEXT_BYTES
from slidedp.model_sizing import sizing_config
from slidedp.presets import model_config_dict, unit_param_counts

GIB = 2**30
HBM_BUDGET_FRACTION = 0.92  # of each GPU's memory: the CUDA context, NCCL and fragmentation live in the rest
# Under a gpu_memory_gib cap: what each rank's CUDA context and NCCL take outside PyTorch's allocator
# (slidedp.config.GPU_CONTEXT_BYTES), and the share of the rest the planner plans on (fragmentation lives in the
# remainder).
CONTEXT_BYTES = GPU_CONTEXT_BYTES
CAP_BUDGET_FRACTION = 0.95
# Host DRAM bytes per parameter of one host update (slidedp.step.optimizer.update_shard_): fused AdamW reads param,
# grad, m, v and writes param, m, v (28); the bf16 delivery copy reads 4 and writes 2. The gradient norm costs the
# host nothing on the gpu route (reduced on the GPUs).
UPDATE_DRAM_BYTES = {"bf16": 34, "fp32": 28}
# A clipped step's update after the norm in two passes (policy.post_norm_passes 2, slidedp.step.optimizer.Updater
# ._post_norm): each pass's seconds as a share of the one-pass update, measured (scripts/probe_update_passes.py,
# docs/results/s22: 16 threads, 1e9 parameters, the engine's 4 Mi-element chunks, bf16-held gradient and bf16 copy:
# one pass 0.356 s, the weights pass 0.424 s, the moments pass 0.253 s per 1e9). Fewer DRAM bytes (20 of AdamW's 28
# before the forward) did not make the weights pass faster: copying the moments into the scratch costs more than
# their write-back saved. Host DRAM bytes are charged by the same shares, and the cast on the GPU by the same too;
# together more than the whole, of which the next forward waits for the first only.
POST_NORM_PASS_SHARES = (0.424 / 0.356, 0.253 / 0.356)


def cap_budget(cap_bytes: int) -> int:
    """The planner's HBM budget under a gpu_memory_gib cap of cap_bytes (0 when the cap holds only the context)."""
    return max(0, int((cap_bytes - CONTEXT_BYTES) * CAP_BUDGET_FRACTION))


def smallest_cap_gib(hbm_peak_bytes: float) -> float:
    """The smallest gpu_memory_gib (rounded up to 0.5 GiB) whose budget holds a plan of this HBM peak."""
    need = hbm_peak_bytes / CAP_BUDGET_FRACTION + CONTEXT_BYTES
    return -(-need // (GIB / 2)) / 2


def rank_threads(cfg: Any, cores: int) -> int:
    """Threads per rank (torch's intra-op team) unless the config sets cpu_threads: the one rule the launcher, the
    calibration and the cost model share.

    A GPU job's rank threads run the host update only, and split every core between the ranks. A CPU job's run its
    forward and backward as well, and leave one core to the rest of the rank (the updater, data and waiting threads)
    and of the host: an OpenMP team on every core stops at each of its thousands of barriers per step whenever one
    member loses its core. The CPU demo on two cores took 0.085 s a step with two threads on an idle host and 1-4.6 s
    with one other busy process; with one thread, 0.10-0.13 s either way (docs/planning.md, CPU hosts)."""
    if cfg.cpu_threads:
        return cfg.cpu_threads
    spare = 0 if cfg.gpus > 0 else 1
    return max(1, (cores - spare) // cfg.world_size)


@dataclass
class Job:
    """The workload and its hardware, as the planner sees them (derived from a JobConfig and a topology); no policy
    choice, which the ExecutionPolicy priced carries."""

    units: list[int]  # parameters per unit: embedding, decoder layers 1..L, final norm + lm_head
    hidden: int
    vocab: int
    tied: bool
    arch: str
    micro_batch: int
    seq: int
    grad_accum: int
    world: int
    on_gpu: bool
    precision: str
    clip: bool
    cpu_threads: int
    cores: int
    hbm_bytes: int | None
    host_limit_bytes: int
    host_limit_source: str
    interconnect: str  # nvlink | pcie-p2p | pcie-host | none
    model_cfg: dict[str, Any] = field(repr=False, default_factory=dict)
    hbm_cap_bytes: int | None = None  # the job's gpu_memory_gib: what it may use of each GPU, context included

    @classmethod
    def from_config(cls, cfg: Any, topology: dict[str, Any], model_cfg: dict[str, Any] | None = None) -> Job:
        from slidedp.planning.topology import job_gpus, job_interconnect

        mc = sizing_config(model_cfg if model_cfg is not None else model_config_dict(cfg.model), cfg.model)
        world = cfg.world_size
        cores = int(topology.get("cpu", {}).get("cores") or 1)
        gpus = job_gpus(topology, cfg.gpus)
        hbm = min(g["hbm_bytes"] for g in gpus) if cfg.gpus and len(gpus) >= cfg.gpus else None
        ram = topology.get("host_ram", {})
        if cfg.host_ram_gib is not None:
            limit, source = int(cfg.host_ram_gib * GIB), "configured (host_ram_gib)"
        else:
            limit, source = int(ram.get("limit_bytes") or 0), str(ram.get("source", "unknown"))
        return cls(
            units=unit_param_counts(mc),
            hidden=int(mc["hidden_size"]),
            vocab=int(mc["vocab_size"]),
            tied=bool(mc.get("tie_word_embeddings", False)),
            arch=str(mc.get("model_type", "")),
            micro_batch=cfg.micro_batch_size,
            seq=cfg.seq_len,
            grad_accum=cfg.grad_accum,
            world=world,
            on_gpu=cfg.gpus > 0,
            precision=cfg.precision,
            clip=cfg.optimizer.max_grad_norm > 0,
            cpu_threads=rank_threads(cfg, cores),
            cores=cores,
            hbm_bytes=hbm,
            host_limit_bytes=limit,
            host_limit_source=source,
            interconnect=job_interconnect(topology, cfg.gpus) if cfg.gpus else "none",
            model_cfg=mc,
            hbm_cap_bytes=int(cfg.gpu_memory_gib * GIB) if getattr(cfg, "gpu_memory_gib", None) else None,
        )

    @property
    def layers(self) -> int:
        return len(self.units) - 2

    @property
    def params(self) -> int:
        return sum(self.units)

    @property
    def pbytes(self) -> int:
        return 2 if self.precision == "bf16" else 4

    def host_cast(self, cast: str) -> bool:
        """bf16 precision with the bf16 copy made on the host by the update, under the policy's delivery_cast
        `cast` (host or gpu)."""
        return self.precision == "bf16" and cast == "host"

    def delivered_bytes(self, cast: str) -> int:
        """Bytes per parameter crossing PCIe host->GPU under delivery_cast `cast`: the bf16 copy, or the fp32
        master cast on the GPU."""
        return 2 if self.host_cast(cast) else 4

    def update_table(self, cast: str) -> str:
        """The calibration's `cpu` table of one host update under delivery_cast `cast`: AdamW with the bf16 cast
        (update_s_per_1e9), or AdamW alone (adamw_s_per_1e9) where the GPUs make the bf16 weights."""
        return "update_s_per_1e9" if self.host_cast(cast) or self.precision != "bf16" else "adamw_s_per_1e9"

    def update_dram_bytes(self, cast: str) -> int:
        """Host DRAM bytes per parameter of one host update under delivery_cast `cast` (UPDATE_DRAM_BYTES)."""
        return UPDATE_DRAM_BYTES["bf16" if self.host_cast(cast) else "fp32"]

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.seq * self.world * self.grad_accum

    @property
    def hbm_budget(self) -> int | None:
        """Bytes of each GPU the plan may fill: HBM_BUDGET_FRACTION of the card, or under a cap what the rank's
        allocator may hold (the cap less CONTEXT_BYTES), CAP_BUDGET_FRACTION of it, whichever is smaller."""
        if not self.hbm_bytes:
            return None
        card = int(self.hbm_bytes * HBM_BUDGET_FRACTION)
        return card if self.hbm_cap_bytes is None else min(card, cap_budget(self.hbm_cap_bytes))

    @property
    def hbm_limit_bytes(self) -> int | None:
        """What each GPU offers the job: the card, or the job's cap when that is smaller."""
        if self.hbm_cap_bytes is None:
            return self.hbm_bytes
        return min(self.hbm_cap_bytes, self.hbm_bytes) if self.hbm_bytes else self.hbm_cap_bytes

    def padded(self, u: int) -> int:
        return -(-self.units[u] // self.world) * self.world  # units are padded to a multiple of the world
