"""The execution policy: how one job's step runs, resolved — no "auto" left in it.

`ExecutionPolicy` is the only resolved form. AutoPolicy (slidedp.planning.autopolicy) returns it, the plan JSON
carries its `to_dict()` (docs/interfaces.md §5), slidedp.launch resolves the job's config into it once
(`resolve`), and the rank engine receives it typed. The config's `policy` section (slidedp.config.PolicyConfig)
is what a user asks for, `auto` included, and decides which choices the user fixed (PolicyConfig.fixed()); the
constants here are its defaults. Imports no torch.

    policy = ExecutionPolicy.mix(layers=36, keep=4, offload=8, resident=2, delivery="sharded", grad_reduce="gpu")
    policy.to_dict()                                  # the documented JSON
    ExecutionPolicy.from_dict(d, world=2)             # back, checked; older plan JSON (reduce_dtype) loads too
    ExecutionPolicy.from_shorthand("sharded:gpu:keep4:0:2", layers=36, world=2)   # bench's colon form
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from slidedp.config import PolicyConfig
from slidedp.schedule import device_units, streamed_units

DELIVERIES = ("replicated", "sharded")
GRAD_REDUCES = ("gpu", "host")
DELIVERY_CASTS = ("host", "gpu")
EDGE_UPDATES = ("host", "gpu")
ACTIVATION_POLICIES = ("keep", "checkpoint", "offload")

# Defaults of the knobs AutoPolicy tunes: the config keys' defaults (slidedp.config.PolicyConfig, their one source).
WINDOW = PolicyConfig.default("window")  # unit buffers in the GPU window: one computing, one arriving, one spare
CHUNK_MB = PolicyConfig.default("chunk_mb")  # host<->GPU transfer chunk
LOSS_CHUNK_TOKENS = PolicyConfig.default("loss_chunk_tokens")  # tokens per chunk of the lm_head + cross-entropy
# Keys of older plan and policy JSON that no longer mean anything: ignored when their value is the only one there
# ever was, refused otherwise.
RETIRED = {"reduce_dtype": "fp32"}


def staging_slots(window: int) -> int:
    """The default count of gradient staging slots per rank in host memory: enough for the backward to run ahead
    of the host update by several units instead of waiting for it unit by unit. AutoPolicy may choose more."""
    return max(8, window + 1)


def activation_layout(layers: int, keep: int, offload: int) -> tuple[str, ...]:
    """Per decoder layer: the first `keep` keep their activations, the next `offload` offload them, the rest are
    checkpointed (how keep_layers / offload_layers counts are laid out, with a plan or without one)."""
    keep = min(keep, layers)
    offload = min(offload, layers - keep)
    return ("keep",) * keep + ("offload",) * offload + ("checkpoint",) * (layers - keep - offload)


class PolicyError(ValueError):
    """A policy that cannot run: the message names the field."""


# The choices every shorthand field names: a form that fixes them all is an ExecutionPolicy (from_shorthand).
SHORTHAND_CHOICES = ("delivery", "grad_reduce", "activations", "resident_units", "delivery_cast", "edge_update",
                     "device_layers", "staging_slots", "streamed_layers")
SHORTHAND = ("delivery:grad_reduce[:activations[:clip[:resident[:cast[:edge_update[:device_layers"
             "[:staging_slots[:streamed_layers[:layers[:passes]]]]]]]]]]")
LAYER_MODES = ("eager", "compiled")  # the shorthand's last field: compiled_layers false / true


def parse_shorthand(text: str) -> tuple[PolicyConfig, float]:
    """Bench's colon form of a policy: (the config `policy` section it asks for, as a slidedp.config.PolicyConfig,
    the clipping norm it runs with). A job config whose `policy` section is that PolicyConfig's fixed() asks for
    the same policy.

    `auto` in any field leaves that choice to AutoPolicy. activations: keep, checkpoint, offload,
    auto, or keepN / offN (the first N layers keep / offload their activations, the rest are checkpointed). clip:
    max_grad_norm (0: none; an optimizer setting, not part of the policy). resident: leading layers whose weights
    stay on the GPUs, a count or auto. cast, staging_slots and streamed_layers, omitted: AutoPolicy's choice in a
    form with `auto`
    elsewhere (as in a job config), else the cast on the host and the default slots for the window. layers: eager,
    compiled (compiled_layers) or auto (the planner's choice, as when omitted). passes: post_norm_passes, 1, 2 or
    auto (the planner's choice, as when omitted). Unlike a job
    config, whose defaults are auto and null, the other omitted fields are fixed: every layer checkpointed, nothing
    resident, every update on the host."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 12:
        raise PolicyError(f"policy {text!r}: expected {SHORTHAND}")
    parts += [""] * (12 - len(parts))
    delivery, grad, acts, clip, resident, cast, edge, device_layers, slots, streamed, layers, passes = parts

    def choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
        if value not in allowed:
            raise PolicyError(f"policy {text!r}: {name} must be one of {', '.join(allowed)}, got {value!r}")
        return value

    def count(name: str, value: str, default: int) -> int | None:
        if value == "":
            return default
        if value == "auto":
            return None
        if not value.isdigit():
            raise PolicyError(f"policy {text!r}: {name} must be a count or auto, got {value!r}")
        return int(value)

    request: dict[str, Any] = {
        "delivery": choice("delivery", delivery, ("auto", *DELIVERIES)),
        "grad_reduce": choice("grad_reduce", grad, ("auto", *GRAD_REDUCES)),
        "resident_units": count("resident", resident, 0),
        "delivery_cast": choice("cast", cast or "host", ("auto", *DELIVERY_CASTS)),
        "edge_update": choice("edge_update", edge or "host", ("auto", *EDGE_UPDATES)),
        "device_layers": count("device_layers", device_layers, 0),
        "staging_slots": count("staging_slots", slots, staging_slots(WINDOW)),
        "streamed_layers": count("streamed_layers", streamed, 0),
        # omitted or auto: the planner's choice (planning/compiled_choice.py), as in a job config
        "compiled_layers": (None if layers in ("", "auto")
                            else choice("layers", layers, LAYER_MODES) == "compiled"),
        # omitted or auto: the planner's choice, as in a job config
        "post_norm_passes": None if passes in ("", "auto") else int(choice("passes", passes, ("1", "2"))),
    }
    if "auto" in parts:  # a request for AutoPolicy: the cast, the slot count and the streamed layers are its
        # choice too, unless given
        if slots == "":
            request["staging_slots"] = None
        if cast == "":
            request["delivery_cast"] = "auto"
        if streamed == "":
            request["streamed_layers"] = None
    acts = acts or "checkpoint"
    for prefix, key, other in (("keep", "keep_layers", "offload_layers"), ("off", "offload_layers", "keep_layers")):
        if acts.startswith(prefix) and acts[len(prefix):].isdigit():
            request.update({"activations": "auto", key: int(acts[len(prefix):]), other: 0})
            break
    else:
        request["activations"] = choice("activations", acts, ("auto", *ACTIVATION_POLICIES))
    try:
        norm = float(clip or 0.0)
    except ValueError:
        norm = -1.0
    if not norm >= 0.0 or norm == float("inf"):
        raise PolicyError(f"policy {text!r}: clip must be a finite number >= 0 (0: no clipping), got {clip!r}")
    return PolicyConfig(**request), norm


@dataclass(frozen=True)
class ExecutionPolicy:
    """One job's resolved execution policy (the paper's routes, window and activation placement).

    delivery: how bf16 weights reach the GPUs — replicated (each rank copies the whole unit over its PCIe link) or
        sharded (each copies 1/N, then all-gather between GPUs). One rank: always replicated.
    grad_reduce: where gradients are summed — gpu (reduce-scatter, each rank returns 1/N) or host (each returns the
        whole unit, the host sums). One rank: always host.
    activations / resident: per decoder layer, where its activations live (keep / checkpoint / offload) and whether
        its weights stay on the GPU between forward and backward.
    edge_update / device_layers: the embedding and head (gpu) and the leading `device_layers` decoder layers are
        updated on the GPUs, their state there; every other unit is updated on the host, but for
    streamed_layers: the decoder layers right after the device layers, whose gradients wait on the GPUs and whose
        update after the norm streams their host state through the GPUs (slidedp.step.streamed_update).
    window, chunk_mb, loss_chunk_tokens: GPU unit buffers, transfer chunk, loss chunk.
    delivery_cast: where the bf16 weights are made from the fp32 master (host: a bf16 copy in host memory).
    staging_slots: gradient staging slots per rank in host memory (page-locked): how far the backward may run
        ahead of the host update, in units; at least window + 1.
    compiled_layers: the decoder layers' forward (and so their backward) runs through one torch.compile'd graph
        per shape on CUDA ranks (slidedp.step.compiled) instead of eager PyTorch.
    post_norm_passes: with clipping, the host's update after the norm in one pass per unit (1) or in two (2: every
        unit's weights first, for the next forward, then its moments; slidedp.step.optimizer.Updater._post_norm).
    cast_scratch_mb: with delivery_cast gpu, MiB of fp32 scratch on each GPU that the cast reads from, in a ring of
        buffers on a cast stream of its own (slidedp.step.cast_ring); 0: one transfer chunk, cast on the copy stream.
    """

    delivery: str
    grad_reduce: str
    activations: tuple[str, ...]
    resident: tuple[bool, ...]
    window: int = WINDOW
    chunk_mb: int = CHUNK_MB
    loss_chunk_tokens: int = LOSS_CHUNK_TOKENS
    edge_update: str = "host"
    device_layers: int = 0
    delivery_cast: str = "host"
    staging_slots: int = 0  # 0: the default for the window (staging_slots(window))
    streamed_layers: int = 0
    compiled_layers: bool = False
    post_norm_passes: int = 1
    cast_scratch_mb: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "activations", tuple(self.activations))
        object.__setattr__(self, "resident", tuple(bool(r) for r in self.resident))
        for name, allowed in (("delivery", DELIVERIES), ("grad_reduce", GRAD_REDUCES),
                              ("delivery_cast", DELIVERY_CASTS), ("edge_update", EDGE_UPDATES)):
            if getattr(self, name) not in allowed:
                raise PolicyError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        bad = sorted({a for a in self.activations if a not in ACTIVATION_POLICIES})
        if bad:
            raise PolicyError(f"activations must each be one of {', '.join(ACTIVATION_POLICIES)}, got {bad}")
        if len(self.resident) != len(self.activations):
            raise PolicyError(f"resident has {len(self.resident)} entries, activations {len(self.activations)}: "
                              "one of each per decoder layer")
        for name, low in (("window", 2), ("chunk_mb", 1), ("loss_chunk_tokens", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise PolicyError(f"{name} must be an integer of at least {low}, got {value!r}")
        if self.staging_slots == 0:
            object.__setattr__(self, "staging_slots", staging_slots(self.window))
        slots = self.staging_slots
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < self.window + 1:
            raise PolicyError(f"staging_slots must be an integer of at least window + 1 = {self.window + 1}, "
                              f"got {slots!r}")
        if isinstance(self.device_layers, bool) or not isinstance(self.device_layers, int) \
                or not 0 <= self.device_layers <= self.layers:
            raise PolicyError(f"device_layers must be in 0..{self.layers}, got {self.device_layers!r}")
        streamed = self.streamed_layers
        if isinstance(streamed, bool) or not isinstance(streamed, int) \
                or not 0 <= streamed <= self.layers - self.device_layers:
            raise PolicyError(f"streamed_layers must be in 0..{self.layers - self.device_layers} (the layers above "
                              f"the {self.device_layers} device_layers), got {streamed!r}")
        if self.post_norm_passes not in (1, 2) or isinstance(self.post_norm_passes, bool):
            raise PolicyError(f"post_norm_passes must be 1 or 2, got {self.post_norm_passes!r}")
        scratch = self.cast_scratch_mb
        if isinstance(scratch, bool) or not isinstance(scratch, int) or scratch < 0:
            raise PolicyError(f"cast_scratch_mb must be an integer of at least 0, got {scratch!r}")
        if not isinstance(self.compiled_layers, bool):
            raise PolicyError(f"compiled_layers must be true or false, got {self.compiled_layers!r}")
        # A layer updated on the GPUs keeps its bf16 weights there: the engine never re-delivers it.
        n = self.device_layers
        object.__setattr__(self, "resident", tuple(r or i < n for i, r in enumerate(self.resident)))

    # ------------------------------------------------------------------ construction
    @classmethod
    def default(cls, layers: int, **kw: Any) -> ExecutionPolicy:
        """Every layer checkpointed, nothing resident, routes of one rank (host reduction, replicated)."""
        base: dict[str, Any] = dict(delivery="replicated", grad_reduce="host", activations=("checkpoint",) * layers,
                                    resident=(False,) * layers)
        base.update(kw)
        return cls(**base)

    @classmethod
    def mix(cls, layers: int, keep: int, offload: int, resident: int, **kw: Any) -> ExecutionPolicy:
        """Leading layers keep their activations, the next ones offload, the rest checkpoint; the leading
        `resident` layers stay resident (keep_layers in the config means leading layers too)."""
        flags = (True,) * min(resident, layers) + (False,) * (layers - min(resident, layers))
        return cls.default(layers, activations=activation_layout(layers, keep, offload), resident=flags, **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any], world: int | None = None) -> ExecutionPolicy:
        """The policy of a to_dict() (a plan's "policy", a stored job's), checked; keys of older JSON that no longer
        mean anything are dropped when they hold the one value they ever had."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in d.items():
            if key in fields:
                kwargs[key] = value
            elif key in RETIRED and value == RETIRED[key]:
                continue
            else:
                raise PolicyError(f"unknown policy key {key!r}; keys: {', '.join(sorted(fields))}")
        pol = cls(**kwargs)
        return pol.for_world(world) if world is not None else pol

    @classmethod
    def from_shorthand(cls, text: str, layers: int, world: int = 1) -> ExecutionPolicy:
        """The policy bench's colon form names (parse_shorthand; its clip field is not part of a policy), resolved
        by the one rule of `resolve`. A form with `auto` in it is a request for AutoPolicy, not a policy."""
        requested, _ = parse_shorthand(text)
        fixed = requested.fixed()
        mix = "keep_layers" in fixed  # keepN / offN: the activations are fixed by the counts
        if any(name not in fixed for name in SHORTHAND_CHOICES if not (mix and name == "activations")):
            raise PolicyError(f"policy {text!r} leaves a choice to AutoPolicy (auto): plan the job to resolve it")
        return resolve(requested, layers, world)

    def for_world(self, world: int) -> ExecutionPolicy:
        """The policy as `world` ranks run it: with one rank there is nothing to shard or reduce between GPUs, so
        delivery is replicated and gradients go to the host (the one place this rule is written)."""
        if world > 1:
            return self
        return dataclasses.replace(self, delivery="replicated", grad_reduce="host")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["activations"], d["resident"] = list(self.activations), list(self.resident)
        return d

    # ------------------------------------------------------------------ derived facts
    @property
    def layers(self) -> int:
        return len(self.activations)

    @property
    def edge_units_on_gpu(self) -> bool:
        return self.edge_update == "gpu"

    def device_units(self, layers: int | None = None) -> frozenset[int]:
        """Units updated on the GPUs: the embedding and head (0 and L + 1) with edge_update gpu, layers
        1..device_layers. None of them sends a gradient to the host."""
        return device_units(self.layers if layers is None else layers, self.edge_update, self.device_layers)

    def streamed_units(self) -> frozenset[int]:
        """Layers whose update after the norm streams through the GPUs: the streamed_layers after the device
        layers. None of them sends a gradient to the host."""
        return streamed_units(self.layers, self.device_layers, self.streamed_layers)

    def counts(self) -> dict[str, int]:
        return {p: self.activations.count(p) for p in ACTIVATION_POLICIES}

    def summary(self) -> dict[str, Any]:
        """The policy in a few numbers, as a benchmark row's `chosen` shows it (docs/interfaces.md §9): the routes,
        window, cast and device updates, per-layer placements counted, and the transfer and loss chunks."""
        counts = self.counts()
        return {"delivery": self.delivery, "grad_reduce": self.grad_reduce, "window": self.window,
                "delivery_cast": self.delivery_cast, "edge_update": self.edge_update,
                "device_layers": self.device_layers, "streamed_layers": self.streamed_layers,
                "keep_layers": counts["keep"],
                "offload_layers": counts["offload"], "resident_layers": sum(self.resident),
                "compiled_layers": self.compiled_layers, "post_norm_passes": self.post_norm_passes,
                "chunk_mb": self.chunk_mb, "loss_chunk_tokens": self.loss_chunk_tokens,
                "cast_scratch_mb": self.cast_scratch_mb}

    def shorthand(self) -> str:
        """Bench's colon form of this policy (clip written as 0), which from_shorthand reads back to an equal
        policy; PolicyError when the policy has none (a layout other than leading keep or offload layers, resident
        layers that are not the leading ones, or a window, chunk or loss chunk other than the defaults)."""
        acts, n = set(self.activations), self.layers
        keep, off = self.activations.count("keep"), self.activations.count("offload")
        if len(acts) == 1:
            form = acts.pop()
        elif self.activations == activation_layout(n, keep, 0):
            form = f"keep{keep}"
        elif self.activations == activation_layout(n, 0, off):
            form = f"off{off}"
        else:
            raise PolicyError("this activation layout has no shorthand: only leading keep or offload layers do")
        resident = sum(self.resident)
        if self.resident != tuple(i < resident for i in range(n)):
            raise PolicyError("resident layers that are not the leading ones have no shorthand")
        if (self.window, self.chunk_mb, self.loss_chunk_tokens) != (WINDOW, CHUNK_MB, LOSS_CHUNK_TOKENS):
            raise PolicyError("window, chunk_mb and loss_chunk_tokens other than the defaults have no shorthand")
        slots = "" if self.staging_slots == staging_slots(self.window) else f":{self.staging_slots}"
        if self.streamed_layers or self.compiled_layers or self.post_norm_passes != 1:
            slots = f":{self.staging_slots}:{self.streamed_layers}"
        if self.compiled_layers or self.post_norm_passes != 1:
            slots += ":compiled" if self.compiled_layers else ":eager"
        if self.post_norm_passes != 1:
            slots += f":{self.post_norm_passes}"
        return (f"{self.delivery}:{self.grad_reduce}:{form}:0:{resident}:{self.delivery_cast}:{self.edge_update}:"
                f"{self.device_layers}{slots}")


def resolve(requested: PolicyConfig, layers: int, world: int,
            planned: ExecutionPolicy | None = None) -> ExecutionPolicy:
    """The policy a job runs with: what the config's `policy` section fixes (`requested.fixed()`), AutoPolicy's
    plan (`planned`) for every choice it leaves, and without a plan the defaults of `world` ranks (sharded delivery
    and GPU reduction for several)."""
    fixed = requested.fixed()
    chosen = planned.to_dict() if planned is not None else {}
    several = world > 1

    def choice(name: str, default: Any) -> Any:
        return fixed[name] if name in fixed else chosen.get(name, default)

    delivery = choice("delivery", "sharded" if several else "replicated")
    grad = choice("grad_reduce", "gpu" if several else "host")
    edge = choice("edge_update", "host")
    device_layers = min(layers, int(choice("device_layers", 0)))
    streamed = min(layers - device_layers, int(choice("streamed_layers", 0)))
    if (edge == "gpu" or device_layers or streamed) and several and grad != "gpu":  # they reduce on the GPUs
        grad = "gpu"
    if "activations" in fixed:
        acts = (fixed["activations"],) * layers
    elif len(chosen.get("activations") or ()) == layers:  # the plan honours keep_layers / offload_layers
        acts = tuple(chosen["activations"])
    else:  # no plan: the counts laid out as the planner lays them out
        acts = activation_layout(layers, fixed.get("keep_layers", 0), fixed.get("offload_layers", 0))
    if "resident_units" in fixed:
        resident = tuple(i < fixed["resident_units"] for i in range(layers))
    else:
        resident = tuple(chosen.get("resident") or (False,) * layers)
    window = int(choice("window", WINDOW))
    if "staging_slots" in fixed:
        slots = fixed["staging_slots"]
    else:  # AutoPolicy's choice where it suits the window, else the default for the window
        planned_slots = int(chosen.get("staging_slots", 0))
        slots = planned_slots if planned_slots > window else staging_slots(window)
    return ExecutionPolicy(
        delivery=delivery, grad_reduce=grad, activations=acts, resident=resident, edge_update=edge,
        device_layers=device_layers, streamed_layers=streamed, window=window, staging_slots=slots,
        compiled_layers=bool(choice("compiled_layers", False)), delivery_cast=choice("delivery_cast", "host"),
        post_norm_passes=int(choice("post_norm_passes", 1)), cast_scratch_mb=int(choice("cast_scratch_mb", 0)),
        chunk_mb=int(choice("chunk_mb", CHUNK_MB)), loss_chunk_tokens=int(choice("loss_chunk_tokens", LOSS_CHUNK_TOKENS)),
    ).for_world(world)
