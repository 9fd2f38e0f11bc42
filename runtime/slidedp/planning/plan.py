"""The plan AutoPolicy makes, typed: `Plan` and its parts (`Prediction`, `Candidate`, `JobSummary`, `Clipping`),
each frozen.

The planning modules pass and read these; the plan JSON (docs/interfaces.md §5) is what `Plan.to_dict()` writes and
`Plan.from_dict()` reads, at the edges only: `plan_job`'s answer (the CLI, the web service, a run's plan record),
a plan stored with a job. The JSON does not change with the types: a key a plan was read with is written back, in
its place, with its value (a plan of an older version keeps the keys it lacked absent, and a key this version does
not name, such as the web service's `stage`, is kept as it came), so `Plan.from_dict(d).to_dict() == d`. A key
that only some plans carry (`headroom`, `card_sweep`, `ways_out`, ...) is written only when it has a value.

    plan = Plan.from_dict(json.load(fh))   # PlanError naming the key when it is not a plan
    plan.predicted.step_time_s             # None without times
    json.dump(plan.to_dict(), fh)

Imports no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

T = TypeVar("T", bound="_Section")

_OMIT = {"omit": True}  # field metadata: a key written only when it has a value (or was read with one)


class PlanError(ValueError):
    """What is not a plan: the part and the key at fault are named."""


@dataclasses.dataclass(frozen=True)
class _Section:
    """A JSON object with named keys: read checked (the required keys present), written back as read.

    `extra`: the keys of the object this version does not name; `keys`: the keys it was read with, in order (empty
    for a section made in code); `order`: for a section made in code, the order its keys are written in where that
    is not the order of the fields. None of them takes part in comparisons."""

    WHERE: ClassVar[str] = "the plan"
    NESTED: ClassVar[dict[str, Any]] = {}  # key -> how its value is read (a section class, or a callable)

    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False, kw_only=True)
    keys: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False, kw_only=True)
    order: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False, kw_only=True)

    @classmethod
    def _named(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.name not in ("extra", "keys", "order")]

    @classmethod
    def from_dict(cls: type[T], d: Any) -> T:
        if not isinstance(d, Mapping):
            raise PlanError(f"{cls.WHERE} is not a JSON object: {type(d).__name__}")
        named = cls._named()
        missing = [f.name for f in named if f.name not in d and _required(f)]
        if missing:
            raise PlanError(f"{cls.WHERE} lacks {', '.join(repr(k) for k in missing)}")
        values = {f.name: _read(cls.NESTED.get(f.name), d[f.name]) for f in named if f.name in d}
        names = {f.name for f in named}
        out = cls(**values, extra={k: v for k, v in d.items() if k not in names}, keys=tuple(d))
        out.check()
        return out

    def check(self) -> None:
        """Raise PlanError where the keys are present but do not make a section of this kind."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self._named():
            value = getattr(self, f.name)
            if f.name in self.keys or not self._absent(f, value):
                out[f.name] = _write(value)
        out.update(self.extra)
        order = self.keys or self.order
        if not order:
            return out
        first = {k: out[k] for k in order if k in out}
        return {**first, **{k: v for k, v in out.items() if k not in first}}

    def _absent(self, f: dataclasses.Field, value: Any) -> bool:
        """Whether a key not read is left out: one only some plans carry without a value, or any key left at its
        default in a section that was read (a plan of an older version lacked it)."""
        if f.metadata.get("omit") and value is None:
            return True
        return bool(self.keys) and not _required(f) and value == _default(f)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _read(how: Any, value: Any) -> Any:
    if how is None or value is None:
        return value
    return how(value)


def _write(value: Any) -> Any:
    if isinstance(value, _Section):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_write(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class Prediction(_Section):
    """A policy's `predicted` entry: step time and its parts (None and empty without times), HBM and host RAM.
    `spans` and `busy` come with times, `bound` with times for the chosen policy only."""

    WHERE: ClassVar[str] = "the plan's prediction"

    step_time_s: float | None
    phases: Mapping[str, float] = dataclasses.field(default_factory=dict)
    exposed: Mapping[str, float] = dataclasses.field(default_factory=dict)
    tokens_per_s: float | None = None
    hbm_peak_gib: float | None = None
    host_ram_gib: float = 0.0
    hbm_parts_gib: Mapping[str, float] = dataclasses.field(default_factory=dict)
    host_parts_gib: Mapping[str, float] = dataclasses.field(default_factory=dict)
    spans: Mapping[str, float] | None = dataclasses.field(default=None, metadata=_OMIT)
    busy: Mapping[str, float] | None = dataclasses.field(default=None, metadata=_OMIT)
    bound: Mapping[str, Any] | None = dataclasses.field(default=None, metadata=_OMIT)


@dataclasses.dataclass(frozen=True)
class Candidate(_Section):
    """A policy the search weighed: the ExecutionPolicy JSON, its prediction, and whether it fits (why not)."""

    WHERE: ClassVar[str] = "a candidate of the plan"
    NESTED: ClassVar[dict[str, Any]] = {"predicted": Prediction.from_dict}

    policy: Mapping[str, Any]
    predicted: Prediction
    fits: bool
    why_not: str | None = None


@dataclasses.dataclass(frozen=True)
class JobSummary(_Section):
    """The job as the planner saw it (the plan's `job`): world, model size, the HBM budget and host RAM limit."""

    WHERE: ClassVar[str] = "the plan's job"

    world: int | None = None
    params: int | None = None
    layers: int | None = None
    tokens_per_step: int | None = None
    interconnect: str | None = None
    on_gpu: bool | None = None
    cpu_threads_per_rank: int | None = None
    hbm_budget_gib: float | None = None
    hbm_card_gib: float | None = None
    hbm_cap_gib: float | None = None
    hbm_budget_fraction: float | None = None
    allocator_slack_fraction: float | None = None
    host_limit_gib: float | None = None
    host_limit_source: str | None = None
    activation_sizes: str | None = None


@dataclasses.dataclass(frozen=True)
class Clipping(_Section):
    """What exact clipping (max_grad_norm > 0) costs the chosen plan and where its update runs (the plan's
    `clipping`, planning/clip_cost.py): the chosen step, the same policy priced without clipping (`unclipped_change`:
    what was changed for that, e.g. {"streamed_layers": 0}) and the difference; the update's split between the host
    CPU and the GPUs (device layers and the embedding and head updated there, streamed layers streamed through them
    after the norm); where the gradients wait for the norm (in host memory, held_gradient; on each GPU, the streamed
    layers'). Times are None without them."""

    WHERE: ClassVar[str] = "the plan's clipping"

    max_grad_norm: float
    step_time_s: float | None = None
    unclipped_step_time_s: float | None = None
    cost_s: float | None = None
    cost_fraction: float | None = None
    unclipped_change: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    unclipped_fits: bool | None = None
    layers: int = 0
    host_layers: int = 0
    device_layers: int = 0
    streamed_layers: int = 0
    edge_update: str = "host"
    host_params: int = 0
    device_params: int = 0
    streamed_params: int = 0
    held_gradient_gib: float = 0.0
    held_bf16_gib: float = 0.0
    gpu_waiting_gib: float = 0.0
    gpu_waiting_bf16: bool = False
    # the host's update after the norm in one pass per unit, or two (weights first: policy.post_norm_passes); plans
    # made before the field ran one
    post_norm_passes: int = 1


def _candidates(value: Any) -> tuple[Candidate, ...]:
    return tuple(Candidate.from_dict(c) for c in _list(value, "candidates"))


def _errors(value: Any) -> tuple[dict[str, str], ...]:
    return tuple(_list(value, "errors"))


def _list(value: Any, key: str) -> list:
    if not isinstance(value, list | tuple):
        raise PlanError(f"the plan's {key!r} is not a list: {type(value).__name__}")
    return list(value)


@dataclasses.dataclass(frozen=True)
class Plan(_Section):
    """The plan of a job (docs/interfaces.md §5): feasible with a policy and its prediction, or refused with
    `errors`; the candidates weighed, why, and what the plan was made on. The keys after `job` are carried by
    some plans only (None: absent)."""

    WHERE: ClassVar[str] = "the plan"
    NESTED: ClassVar[dict[str, Any]] = {"predicted": Prediction.from_dict, "candidates": _candidates,
                                        "errors": _errors, "job": JobSummary.from_dict,
                                        "clipping": Clipping.from_dict}

    feasible: bool
    policy: Mapping[str, Any] | None = None  # the ExecutionPolicy JSON; None when refused
    predicted: Prediction | None = None
    candidates: tuple[Candidate, ...] = ()
    why: str = ""
    errors: tuple[dict[str, str], ...] = ()  # {"loc", "msg"} each
    marginal: Mapping[str, Any] | None = None
    job: JobSummary | None = dataclasses.field(default=None, metadata=_OMIT)
    headroom: Mapping[str, Any] | None = dataclasses.field(default=None, metadata=_OMIT)
    host_update: Mapping[str, float] | None = dataclasses.field(default=None, metadata=_OMIT)
    calibration: str | None = dataclasses.field(default=None, metadata=_OMIT)  # measured | declared | missing
    calibration_note: str | None = dataclasses.field(default=None, metadata=_OMIT)
    smallest_gpu_memory_gib: float | None = dataclasses.field(default=None, metadata=_OMIT)
    card_sweep: list[dict[str, Any]] | None = dataclasses.field(default=None, metadata=_OMIT)
    delivery_cast_choice: Mapping[str, Any] | None = dataclasses.field(default=None, metadata=_OMIT)
    cast_scratch: Mapping[str, Any] | None = dataclasses.field(default=None, metadata=_OMIT)
    ways_out: list[dict[str, Any]] | None = dataclasses.field(default=None, metadata=_OMIT)
    declared: Mapping[str, Any] | None = dataclasses.field(default=None, metadata=_OMIT)
    basis: Mapping[str, Any] | None = dataclasses.field(default=None, metadata=_OMIT)
    replanned: str | None = dataclasses.field(default=None, metadata=_OMIT)
    clipping: Clipping | None = dataclasses.field(default=None, metadata=_OMIT)  # with max_grad_norm > 0 only
    compiled_layers: Mapping[str, Any] | None = dataclasses.field(default=None, metadata=_OMIT)

    def check(self) -> None:
        if self.feasible and not isinstance(self.policy, Mapping):
            raise PlanError("the plan is feasible but lacks 'policy'")
        if self.feasible and self.predicted is None:
            raise PlanError("the plan is feasible but lacks 'predicted'")

    @property
    def step_time_s(self) -> float | None:
        """The chosen policy's predicted step time; None when refused or without times."""
        return self.predicted.step_time_s if self.feasible and self.predicted is not None else None

    def error_words(self) -> str:
        """The refusal's messages, joined."""
        return "; ".join(e["msg"] for e in self.errors)

    def with_why(self, *sentences: str) -> Plan:
        """This plan with sentences added to its why."""
        return dataclasses.replace(self, why=" ".join([self.why, *sentences]))
