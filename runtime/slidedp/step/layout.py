"""The host state's layout and size: what the shared-memory segments of one run hold, as plain data (no torch).

One rule for the host state's size, used by the engine (slidedp.step.host_state maps these segments), the
launcher, validation (host RAM and shared-memory space before anything is allocated) and the memory model
(the plan's host bytes): the fp32 master weights and AdamW moments (12 B/param), the bf16 delivery copy where
the cast is made on the host (2 B/param), gradient staging (per rank, a few slots of one unit or one shard), and the
reduced gradient held for exact clipping.

The held gradient is kept only for the units updated on the host (a unit updated on the GPUs never sends its
gradient here), and in bf16 where that loses nothing: with one rank, no gradient accumulation and bf16 layers, a
decoder layer's gradient is a bf16 tensor the engine widens to fp32 for the trip, so its bf16 copy holds the same
numbers in half the bytes (Qwen3-8B: 13 GiB instead of 26 GiB for the layers). The embedding and head accumulate
in fp32 (loss chunks, tied weights) and several ranks' sums are fp32 sums: those are held in fp32.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from slidedp.policy import ExecutionPolicy

SHM_PREFIX = "slidedp-"
# A segment larger than this is kept in several files of this size, mapped back to back into one range
# (slidedp.step.host_state): the kernel hands out a shared-memory file's fresh pages under a lock of that file,
# so one file filled on every core took its pages at 4.9 GB/s on the one-GPU machine, and 16 files at 16-24 GB/s
# (scripts/probe_paging.py). A multiple of the page size.
STRIPE_BYTES = 1 << 30
STATE_BYTES_PER_PARAM = 12  # fp32 master weights and the two AdamW moments
GIB = 2**30


def shm_dir() -> str:
    return os.environ.get("SLIDEDP_SHM_DIR", "/dev/shm")


def pid_alive(pid: int) -> bool:
    """Whether the process that owns a run's segments (or a checkpoint writer's temporary folder) still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class HostLayout:
    """Everything a rank needs to map the host state; passed to rank processes as plain data."""

    run: str  # segment name prefix, unique per run
    directory: str
    unit_numels: list[int]
    world: int
    delivery_dtype: str  # "bfloat16" | "float32" (float32: the master itself is delivered)
    staging_slots: int
    hold_gradient: bool  # exact clipping holds the reduced gradient until the norm is known
    # with hold_gradient: the units whose gradient is held in bf16 (losslessly, see the module's docstring) and
    # those never held (updated on the GPUs); every other unit is held in fp32
    held_bf16: tuple[int, ...] = ()
    not_held: tuple[int, ...] = ()
    staging_numel: int = 0  # elements per staging slot: a whole unit (host route) or one shard (gpu route)
    stripe_bytes: int = STRIPE_BYTES  # bytes per file of a segment larger than this (a multiple of the page size)

    def __post_init__(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        if self.stripe_bytes <= 0 or self.stripe_bytes % page:
            raise ValueError(f"stripe_bytes must be a positive multiple of the page size ({page}), "
                             f"got {self.stripe_bytes}")

    @property
    def offsets(self) -> list[int]:
        out, acc = [], 0
        for n in self.unit_numels:
            out.append(acc)
            acc += n
        return out

    @property
    def total(self) -> int:
        return sum(self.unit_numels)

    @property
    def max_unit(self) -> int:
        return max(self.unit_numels)

    @property
    def slot_numel(self) -> int:
        return self.staging_numel or self.max_unit

    def held_places(self) -> dict[int, tuple[str, int]]:
        """Where each held unit's gradient lives: (segment kind, element offset) — "held" (fp32) or "held16"
        (bf16), each unit packed after the previous one of its kind. Empty without hold_gradient."""
        if not self.hold_gradient:
            return {}
        places, ends = {}, {"held": 0, "held16": 0}
        bf16, skip = set(self.held_bf16), set(self.not_held)
        for u, n in enumerate(self.unit_numels):
            if u in skip:
                continue
            kind = "held16" if u in bf16 else "held"
            places[u] = (kind, ends[kind])
            ends[kind] += n
        return places

    def held_numels(self) -> dict[str, int]:
        """Elements of each held-gradient segment: {"held": fp32 elements, "held16": bf16 elements}."""
        out = {"held": 0, "held16": 0}
        for u, (kind, _) in self.held_places().items():
            out[kind] += self.unit_numels[u]
        return out

    def path(self, kind: str) -> str:
        return os.path.join(self.directory, f"{self.run}.{kind}")

    def files(self, kind: str, nbytes: int) -> list[tuple[str, int]]:
        """The files that hold a segment of `nbytes` and the bytes of each: path(kind) itself up to stripe_bytes,
        else path(kind).0, .1, ... of stripe_bytes each, the last one what remains."""
        if nbytes <= self.stripe_bytes:
            return [(self.path(kind), nbytes)]
        return [(f"{self.path(kind)}.{k}", min(self.stripe_bytes, nbytes - lo))
                for k, lo in enumerate(range(0, nbytes, self.stripe_bytes))]

    def parts(self) -> dict[str, int]:
        """Bytes of each part of the run's segments once touched."""
        return {
            "master_and_moments": self.total * STATE_BYTES_PER_PARAM,
            "delivery_copy": self.total * 2 if self.delivery_dtype == "bfloat16" else 0,
            "gradient_staging": self.world * self.staging_slots * self.slot_numel * 4,
            "held_gradient": self.held_numels()["held"] * 4 + self.held_numels()["held16"] * 2,
        }

    def shared_bytes(self, keep_state: bool = False) -> int:
        """Bytes the run's segments take once touched (keep_state: the state exists already, only the per-run
        segments are new). The files are sparse, so a folder too small shows only when a page is first
        written — as a SIGBUS that kills the process — which is why this is checked before creating them."""
        parts = self.parts()
        state = parts["master_and_moments"] + parts["delivery_copy"]
        return (0 if keep_state else state) + parts["gradient_staging"] + parts["held_gradient"]


# Elements per chunk of a layer streamed through the GPU after the norm (slidedp.step.streamed_update):
# 4 x 4 B x 16M = 256 MiB per buffer set, two sets.
STREAM_CHUNK = 1 << 24


def chunk_elements(shard_lens: list[int]) -> int:
    """Elements per streamed chunk: STREAM_CHUNK, or less where no unit's shard is that long."""
    return max(1, min(STREAM_CHUNK, max(shard_lens, default=1)))


def held_in_bf16(world: int, precision: str, grad_accum: int, layers: int) -> tuple[int, ...]:
    """The units whose held gradient is exactly a bf16 tensor: the decoder layers with one rank, bf16 layers and
    no gradient accumulation (an accumulated or rank-summed gradient is an fp32 sum, and the embedding's and
    head's gradients are accumulated in fp32 over loss chunks)."""
    if world != 1 or precision != "bf16" or grad_accum != 1:
        return ()
    return tuple(range(1, layers + 1))


def streamed_weights_stay(world: int, delivery: str) -> bool:
    """Whether streamed layers' updated weights stay on the device for the next forward
    (slidedp.step.streamed_update.StreamedUpdate.weights): with one rank, or with sharded delivery, whose
    all-gather completes each rank's shard; replicated delivery reads whole units from the host."""
    return world == 1 or delivery == "sharded"


def plan_layout(unit_numels: list[int], world: int, policy: ExecutionPolicy, precision: str, clip: bool,
                directory: str | None = None, run: str | None = None, grad_accum: int = 1) -> HostLayout:
    """The layout of a run: the state, plus gradient staging sized by the gradient route and by the units that send
    their gradients to the host (a unit updated on the GPUs never does: with the embedding and head there, a
    Qwen3-8B slot holds a 0.2B-param layer instead of the 0.62B-param head), and with clipping the held gradient
    of the units updated on the host, in bf16 where that is lossless (held_in_bf16)."""
    layers = len(unit_numels) - 2
    # updated on the GPUs, or streamed through them after the norm: their gradients stay there
    on_device = policy.device_units(layers) | policy.streamed_units()
    sent = [n for u, n in enumerate(unit_numels) if u not in on_device] or [1]
    shard = max(-(-n // world) for n in sent)
    staging = shard if (policy.grad_reduce == "gpu" and world > 1) else max(sent)
    # with the cast on the GPU the master itself is delivered: no bf16 copy on the host
    host_cast = precision == "bf16" and policy.delivery_cast == "host"
    return HostLayout(run=run or f"{SHM_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}",
                      directory=directory or shm_dir(), unit_numels=list(unit_numels), world=world,
                      delivery_dtype="bfloat16" if host_cast else "float32", staging_slots=policy.staging_slots,
                      hold_gradient=clip, held_bf16=held_in_bf16(world, precision, grad_accum, layers) if clip else (),
                      not_held=tuple(sorted(on_device)) if clip else (), staging_numel=staging,
                      stripe_bytes=STRIPE_BYTES)
