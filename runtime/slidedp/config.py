"""The job config: one schema for the CLI, the Python API, the web API and the UI.

Imports no torch (and no pydantic): the web API validates jobs with it in a process without torch,
and the GPU machine has no pydantic. Every key is a dataclass field whose metadata (``doc`` and the range
checks) is the only documentation of it: ``slidedp.config_schema.schema_doc()`` lists the keys, ``slidedp config-schema`` prints them
as Markdown or as a JSON Schema (slidedp.config_schema), docs/interfaces.md §1 holds that Markdown
(``slidedp config-schema --write-docs docs/interfaces.md`` regenerates it), and the web API's OpenAPI schema is
built from the same fields (slidedp_web.job_schema).

    cfg = JobConfig.from_dict(yaml.safe_load(open("job.yaml")))   # raises ConfigError

Every value is bounded so that nothing the config accepts fails later with a raw error: integers fit a signed
64-bit integer (and most keys have a tighter `le` a real job never reaches), numbers are finite, and strings
hold neither a NUL character nor a lone UTF-16 surrogate (which cannot be written as UTF-8).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

from slidedp.config_parse import INT64_MAX, build, cross_checks

MAX_STEPS = 10**9  # steps, warmup, checkpoint interval
MAX_WORLD = 4096  # ranks, GPUs, CPU threads: the web API applies tighter limits for its hosts
MAX_TOKENS = 2**24  # seq_len, loss_chunk_tokens
MAX_LAYERS = 65536  # per-layer counts (device_layers, keep_layers, offload_layers, resident_units)
MAX_HOST_RAM_GIB = 2**20  # 1 PiB
MAX_GPU_MEMORY_GIB = 2**14  # 16 TiB per GPU: far above any card, a bound for the schema
# What each rank's CUDA context and NCCL take outside PyTorch's allocator, which a gpu_memory_gib cap must hold
# besides the allocator's limit (slidedp.step.devices.apply_memory_cap) and the planner's budget. Measured on the
# H200 with torch 2.11: the context alone 0.51 GiB, with one NCCL communicator 1.15 GiB, and a one-GPU SlideDP rank
# (its process group and two more communicators) 2.07 GiB in use beyond its allocator's reserved memory
# (docs/benchmarks.md, workstation caps).
GPU_CONTEXT_BYTES = int(2.25 * 2**30)


class ConfigError(ValueError):
    """One or more config keys are wrong. ``errors`` lists {"loc": "optimizer.lr", "msg": "..."}."""

    def __init__(self, errors: list[dict[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" for e in errors))


def _f(default: Any = dataclasses.MISSING, doc: str = "", *, factory: Any = None, **checks: Any) -> Any:
    """A config key. ``checks``: gt/ge/lt/le bound a number (from_dict checks them, the web API's schema shows
    them); item_ge/item_lt bound each number of a list and not_blank marks a string that may not be blank (both
    checked in slidedp.config_parse.cross_checks, and shown by schema_doc and the JSON Schema)."""
    meta = {"doc": doc, **checks}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class DataConfig:
    path: str = _f(
        doc="Dataset file (.jsonl, .json, .parquet or .txt) on the host that runs the job; `demo:NAME` names a "
        "dataset shipped with slidedp (slidedp.data.demo_paths()).",
        not_blank=True,
    )
    format: Literal["tokens", "text", "prompt_completion", "chat", "alpaca"] = _f(
        "tokens",
        doc="tokens: jsonl lines {input_ids, labels?} of length seq_len (labels aligned with input_ids, "
        "-100 = ignored; the model shifts). text: documents packed into seq_len blocks. "
        "prompt_completion / chat / alpaca: supervised examples, loss on the answer only.",
    )
    shuffle: bool = _f(True, doc="Shuffle sequences each epoch with `seed` (off: file order).")
    seed: int = _f(0, doc="Seed of the data order.", ge=0, le=INT64_MAX)
    text_field: str = _f("text", doc="Field holding the text for format=text in json/jsonl/parquet files.")
    pack: bool = _f(
        True,
        doc="Supervised formats: pack several examples into one seq_len row (attention never crosses "
        "example boundaries) instead of padding one example per row.",
    )


@dataclass
class OptimizerConfig:
    lr: float = _f(1e-5, doc="Peak learning rate of AdamW.", gt=0.0)
    weight_decay: float = _f(0.0, doc="Decoupled weight decay (AdamW).", ge=0.0)
    betas: tuple[float, float] = _f((0.9, 0.95), doc="AdamW (beta1, beta2).", item_ge=0.0, item_lt=1.0)
    eps: float = _f(1e-8, doc="AdamW epsilon.", gt=0.0)
    max_grad_norm: float = _f(
        1.0,
        doc="> 0: exact global-norm clipping (as torch.nn.utils.clip_grad_norm_ on the whole model; updates "
        "wait for the norm); 1.0 by default, as in the tools fine-tuning jobs usually come from. 0: no clipping "
        "(the norm is still reported).",
        ge=0.0,
    )


@dataclass
class ScheduleConfig:
    warmup_steps: int = _f(0, doc="Linear warmup from 0 to optimizer.lr over this many steps (at most `steps`).",
                           ge=0, le=MAX_STEPS)
    decay: Literal["constant", "linear", "cosine"] = _f("constant", doc="Shape after warmup.")
    min_lr_ratio: float = _f(0.0, doc="Floor of linear/cosine decay as a fraction of lr.", ge=0.0, le=1.0)


MAX_HOLDOUT = 0.5  # eval.holdout lies in [0, MAX_HOLDOUT)


@dataclass
class EvalConfig:
    """Held-out evaluation: on when `path` is set or `holdout` > 0. Evaluated before the first step, after every
    `interval`-th step and after the last, on the training ranks, forward only (no optimizer state is touched)."""

    path: Optional[str] = _f(
        None,
        doc="Evaluation dataset file, read like data.path (.jsonl, .json, .parquet or .txt, or `demo:NAME`) in the "
        "same data.format, seq_len and text_field; null: none. Exclusive with holdout.",
        not_blank=True,
    )
    holdout: float = _f(
        0.0,
        doc="Fraction of the training dataset's rows (after tokenising and packing) held out for evaluation and "
        "never trained on, chosen with data.seed before the training order is drawn (at least one row when > 0). "
        "0: none. Exclusive with path.",
        ge=0.0,
        lt=MAX_HOLDOUT,
    )
    interval: int = _f(
        0,
        doc="Evaluate after every this many steps; 0: only before the first step and after the last.",
        ge=0,
        le=MAX_STEPS,
    )
    max_batches: int = _f(
        8,
        doc="Micro-batches per rank per evaluation (micro_batch_size rows each): every evaluation reads the same "
        "first max_batches x micro_batch_size x ranks rows of the evaluation set, in order.",
        ge=1,
        le=1_000_000,
    )
    keep_best: bool = _f(
        False,
        doc="Keep the checkpoint with the lowest eval loss as output_dir/checkpoints/best (never rotated away by "
        "checkpoint.keep). Needs evaluation on, checkpoint.interval > 0, interval > 0 and checkpoint.interval a "
        "multiple of interval, so every checkpoint step is evaluated.",
    )

    @property
    def enabled(self) -> bool:
        return self.path is not None or self.holdout > 0


@dataclass
class PolicyConfig:
    """The execution policy a job asks for; `auto` and unset knobs are AutoPolicy's to choose. The resolved form,
    with every choice made, is slidedp.policy.ExecutionPolicy; its constants (WINDOW, CHUNK_MB, LOSS_CHUNK_TOKENS)
    are these defaults, and fixed() is the one answer to which keys the user fixed."""

    # Keys older configs may hold (stored jobs, checkpoints' meta.json): their one value loads as a no-op.
    RETIRED: ClassVar[dict[str, tuple[Any, str]]] = {
        "reduce_dtype": ("fp32", "gradients are always reduced and returned in fp32"),
    }

    delivery: Literal["auto", "replicated", "sharded"] = _f(
        "auto",
        doc="Parameter route host->GPU. replicated: every rank copies the whole unit over its own PCIe link. "
        "sharded: each rank copies 1/N, then all-gather between GPUs.",
    )
    grad_reduce: Literal["auto", "gpu", "host"] = _f(
        "auto",
        doc="Gradient route. gpu: reduce-scatter between GPUs, each rank returns its 1/N. "
        "host: each rank returns the whole unit gradient and the host sums.",
    )
    delivery_cast: Literal["host", "gpu", "auto"] = _f(
        "auto",
        doc="Where bf16 weights are made from the fp32 master (bf16 precision). host: the update writes a bf16 "
        "copy in host memory (2 B/param more host RAM, 6 B/param more host memory traffic per step) and 2 B/param "
        "cross PCIe. gpu: the fp32 master itself crosses PCIe (4 B/param) and is cast on the GPU. auto (default): "
        "AutoPolicy plans the job both ways and takes the faster that fits (the host when neither is timed, in "
        "fp32 or on the CPU).",
    )
    edge_update: Literal["host", "gpu", "auto"] = _f(
        "auto",
        doc="Where the embedding and loss-head units (the two largest: 15% of Qwen3-8B) are updated. host: CPU "
        "AdamW on the host state like every other unit. gpu: each rank keeps 1/N of their fp32 weights and AdamW "
        "moments in GPU memory (16 B/param / N), reduces, updates and all-gathers them there: no host traffic for "
        "them; needs grad_reduce gpu with several GPUs; the host state is written back before every checkpoint. "
        "On CPU ranks the 'device' is the rank itself: the update runs in the rank's own thread. "
        "auto (default): AutoPolicy chooses; without a calibration that has the device AdamW rate "
        "(`--no-calibration` plans) it stays host.",
    )
    device_layers: Optional[int] = _f(
        None,
        doc="Leading decoder layers updated on the GPUs like edge_update gpu does the embedding and head: 1/N of "
        "their fp32 weights and AdamW moments per GPU (16 B/param / N), their bf16 weights resident, no host "
        "traffic for them. Spare HBM spent on host bytes, the step's bottleneck when the host update binds. "
        "0: none. None (default): AutoPolicy chooses, 0 without a calibration that has the device AdamW rate. "
        "More than 0 needs grad_reduce gpu (or auto) with more than one rank.",
        ge=0,
        le=MAX_LAYERS,
    )
    streamed_layers: Optional[int] = _f(
        None,
        doc="With clipping: how many decoder layers, right after the device layers (layers device_layers + 1 … "
        "device_layers + streamed_layers; the last layers before 2026-12-05), have their update after the gradient "
        "norm run on the GPUs instead of the host CPU, which updates the last layers. Their gradients wait in GPU "
        "memory (bf16 where exact, else fp32, 1/N per rank); once the norm is known each rank streams its shard's "
        "fp32 master and AdamW moments in, applies the same AdamW there and streams them back (12 B/param each way "
        "over PCIe) while the CPU updates the other layers: the GPUs and links that would idle waiting for the host "
        "update share it. The host state stays the one authoritative copy. 0: none. None (default): AutoPolicy "
        "chooses (0 where it cannot price it). More than 0 needs grad_reduce gpu (or auto) with more than one rank; "
        "with device_layers, at most the layers left above them.",
        ge=0,
        le=MAX_LAYERS,
    )
    post_norm_passes: Optional[int] = _f(
        None,
        doc="With clipping: how the host CPU runs its update after the gradient norm. 1: one pass per layer. 2: "
        "two passes, every layer's new weights (and bf16 copy) first, with the new AdamW moments kept in a small "
        "scratch, then the moments written back beside the next forward (the same numbers, bit for bit); measured "
        "slower so far, the first pass taking longer than one whole pass. None (default): AutoPolicy chooses, "
        "pricing both as measured (one pass on every job so far).",
        ge=1,
        le=2,
    )
    activations: Literal["auto", "checkpoint", "keep", "offload"] = _f(
        "auto",
        doc="Activation placement for every decoder layer. checkpoint: save the unit input, recompute in "
        "backward. keep: keep activations on the GPU. offload: keep them in host memory. auto: AutoPolicy "
        "mixes them per unit (checkpoint where no plan is available).",
    )
    keep_layers: Optional[int] = _f(
        None, doc="With activations=auto (set otherwise, it is an error): force how many leading layers keep "
        "activations (None: planner).", ge=0,
        le=MAX_LAYERS,
    )
    offload_layers: Optional[int] = _f(
        None, doc="With activations=auto: force how many layers offload activations (None: planner).", ge=0,
        le=MAX_LAYERS,
    )
    window: int = _f(3, doc="GPU unit buffers in the working window (>= 2: one computing, one arriving).", ge=2,
                     le=1024)
    chunk_mb: int = _f(64, doc="Transfer chunk size in MiB for host<->GPU copies.", ge=1, le=65536)
    cast_scratch_mb: Optional[int] = _f(
        None, doc="With delivery_cast gpu: MiB of fp32 scratch on each GPU that the cast of the delivered weights "
        "reads from, in buffers of half a transfer chunk on a CUDA stream of its own above compute's priority, so the "
        "link runs on while a cast waits for a long compute kernel (a Qwen3-8B step at micro-batch 8 on an H100 "
        "machine: 2.434 s with 256 MiB against 2.578-2.616 s with the default, in one command). Counted in the "
        "plan's GPU memory. 0: one transfer chunk, cast on the copy stream. None (default): AutoPolicy's choice, "
        "the 256 MiB its calibration timed (`delivery_cast`) where the plan with it fits and, at the transfer chunk "
        "and window finally chosen, is faster, else 0.",
        ge=0, le=65536,
    )
    loss_chunk_tokens: int = _f(
        4096, doc="Tokens per chunk of the lm_head + cross-entropy (full fp32 logits never exist).", ge=1,
        le=MAX_TOKENS,
    )
    resident_units: Optional[int] = _f(
        None,
        doc="Decoder layers whose bf16 weights stay on the GPU between forward and backward (None: planner).",
        ge=0,
        le=MAX_LAYERS,
    )
    staging_slots: Optional[int] = _f(
        None,
        doc="Gradient staging slots per rank in page-locked host memory, each the size of the largest unit updated "
        "on the host: how many units the backward may run ahead of the host update. More let the host update "
        "keep working through the next forward, at one unit of host RAM each (and the time to page-lock it at "
        "start). At least 4 and window + 1. None (default): AutoPolicy chooses: max(8, window + 1), more where "
        "they make the step faster, fewer (down to 4) where only fewer let the host state fit its RAM; without a plan "
        "max(8, window + 1).",
        ge=4,
        le=MAX_LAYERS,
    )
    compiled_layers: Optional[bool] = _f(
        None,
        doc="Run each decoder layer's forward through torch.compile (inductor) on CUDA ranks instead of eager "
        "PyTorch: one graph per input shape serves every layer and window slot (the weights are its inputs), its "
        "backward is compiled with it, so norms, RoPE and casts are fused around the GEMMs. The first step pays the "
        "compile (tens of seconds). The same numbers as eager up to kernel rounding; kept, checkpointed and "
        "offloaded layers alike. On CPU ranks the same graphs run without generated kernels (aot_eager): the "
        "same numbers, no speed-up. false: eager. None (default): the planner's choice: compiled on GPUs where "
        "calibration timed the compiled layer at least 3% faster than the eager one, kept and checkpointed alike, and the job has steps enough to win the compile back (a smoke test of a few steps stays eager).",
    )

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of one policy key: `auto` or None for a choice, the constant for a knob AutoPolicy tunes."""
        return cls.__dataclass_fields__[name].default

    def fixed(self) -> dict[str, Any]:
        """The keys the user fixed, with their values: the one answer to "did the user fix this?" that AutoPolicy
        honours and `resolve` keeps. `auto` and None leave a choice to AutoPolicy, and so does a knob it tunes
        (window, chunk_mb, loss_chunk_tokens) left at its default; any other value is fixed."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) not in ("auto", None) and getattr(self, f.name) != f.default}


@dataclass
class CheckpointConfig:
    interval: int = _f(0, doc="Save host state every K steps (and at the end). 0 turns checkpointing off.", ge=0,
                       le=MAX_STEPS)
    keep: int = _f(2, doc="Keep the last M checkpoints.", ge=1, le=1_000_000)


@dataclass
class HealthConfig:
    """What counts as a sick run. A non-finite loss or gradient norm always ends the job as failed (with clipping
    that step's update is skipped). A dead run ends failed too (on_dead): its gradient norm is exactly 0 for
    zero_grad_steps steps in a row, or its loss jumps above loss_spike_factor times the lowest loss so far and is
    not back under that line within spike_recovery_steps steps. A spike that comes back is a warning; warnings stop
    the job only with on_warning: stop. Every check runs from the second step on, warm-up included."""

    on_warning: Literal["warn", "stop"] = _f(
        "warn",
        doc="warn: a warning in the metrics record, the job, the log and the UI; the run goes on. stop: the job "
        "ends as failed at the next step boundary, naming the warning (no checkpoint or export after it).",
    )
    loss_spike_factor: float = _f(
        10.0,
        doc="A step's loss above this many times the lowest loss so far is a spike: a warning, and a dead run "
        "when the loss is not back under the line within spike_recovery_steps (from the second step on, "
        "warm-up included).",
        gt=1.0,
        le=1e12,
    )
    spike_recovery_steps: int = _f(
        5,
        doc="Steps a loss spike has to come back under loss_spike_factor times the lowest loss before the run "
        "counts as dead.",
        ge=1,
        le=1_000_000,
    )
    zero_grad_steps: int = _f(
        3,
        doc="A gradient norm of exactly 0 for this many steps in a row means nothing is learning: a dead run. "
        "0 turns the check off.",
        ge=0,
        le=1_000_000,
    )
    on_dead: Literal["fail", "warn"] = _f(
        "fail",
        doc="fail: a dead run (see zero_grad_steps and spike_recovery_steps) ends failed at the next step "
        "boundary, 'diverged: ... at step N' naming the step it died at; its checkpoints from before stay and "
        "nothing is exported. warn: it is only a warning, and the run goes on.",
    )


@dataclass
class InitFromConfig:
    job: Optional[int] = _f(
        None,
        doc="Workbench job id whose newest checkpoint to start from. Only the web service resolves it, into "
        "`checkpoint` (with `job` null) before the job runs; slidedp.train() given a `job` raises ConfigError at "
        "init_from.job: it needs the checkpoint path.",
        ge=1,
    )
    checkpoint: Optional[str] = _f(
        None,
        doc="A complete checkpoint directory (docs/interfaces.md §8) of an earlier run (its "
        "output_dir/checkpoints/step-NNNNNNNN) of the same model shape. Its fp32 master weights are this run's "
        "initial weights; AdamW moments start at zero, the step count at 0 and the data from the start. Only read, "
        "never written or removed; it must lie outside this job's output_dir. validate_job reports here a missing "
        "or incomplete source, another model shape, or a source inside (or holding) the job's own output_dir. With "
        "`job` set, the web service reads it as the name of one of that job's checkpoints (not checked here) and "
        "resolves both into the path.",
        not_blank=True,
    )


@dataclass
class JobConfig:
    model: str = _f(
        doc="A local Hugging Face model directory (a value containing '/' or naming an existing directory: a "
        "missing path is an error, not an unknown preset) or otherwise a preset name (see `slidedp presets`; "
        "random init).",
        not_blank=True,
    )
    data: DataConfig = _f(doc="The dataset.")
    seq_len: int = _f(2048, doc="Tokens per sequence.", gt=0, le=MAX_TOKENS)
    micro_batch_size: int = _f(1, doc="Sequences per rank per micro-batch.", gt=0, le=65536)
    grad_accum: int = _f(1, doc="Micro-batches per optimizer step.", gt=0, le=65536)
    steps: int = _f(10, doc="Optimizer steps to run.", gt=0, le=MAX_STEPS)
    optimizer: OptimizerConfig = _f(factory=OptimizerConfig, doc="AdamW hyperparameters.")
    schedule: ScheduleConfig = _f(factory=ScheduleConfig, doc="Learning-rate schedule.")
    eval: EvalConfig = _f(factory=EvalConfig, doc="Held-out evaluation (eval loss and perplexity).")
    gpus: int = _f(0, doc="GPUs to use, one rank each. 0: train on the CPU (gloo) with `ranks` processes. Planning "
                   "refuses more GPUs than the host has.", ge=0, le=MAX_WORLD)
    ranks: int = _f(1, doc="CPU ranks when gpus = 0 (development and CI); with GPUs it is 1 or equal to gpus. "
                    "slidedp.train() accepts more ranks than cores; the web API refuses more than 4 x the cores "
                    "of the job's host.", gt=0, le=MAX_WORLD)
    precision: Literal["bf16", "fp32"] = _f(
        "bf16", doc="bf16: bf16 weights delivered and computed, fp32 master. fp32: fp32 throughout."
    )
    policy: PolicyConfig = _f(factory=PolicyConfig, doc="Execution policy (routes, window, activations).")
    checkpoint: CheckpointConfig = _f(factory=CheckpointConfig, doc="Host-state checkpoints for resume.")
    health: HealthConfig = _f(factory=HealthConfig, doc="Run health: divergence, loss spikes, dead gradients.")
    output_dir: str = _f("runs/job", doc="Where metrics.jsonl, checkpoints/ and final/ are written.")
    report_to: Optional[list[Literal["tensorboard", "wandb", "mlflow", "none"]]] = _f(
        None,
        doc="Experiment trackers that get every metrics record and the job config (slidedp.trackers): tensorboard "
        "(event files in output_dir/tensorboard), wandb (Weights & Biases; WANDB_MODE, WANDB_PROJECT as usual), "
        "mlflow (MLFLOW_TRACKING_URI, else a SQLite store in output_dir/mlflow). A named tracker whose package is "
        "missing is an error (pip install 'slidedp[trackers]'). null (default): tensorboard when its package is "
        "installed, else none (the job log says so). [] or [\"none\"]: none.",
    )
    seed: int = _f(0, doc="Seed of random initialisation (presets) and of dropout-free training RNG.", ge=0,
                   le=INT64_MAX)
    cpu_threads: Optional[int] = _f(
        None, doc="CPU threads per rank: the host update's, and on the CPU (gpus = 0) also the forward and backward's. "
        "None: a GPU job splits the host's cores over its ranks; a CPU job keeps one core for the rest of the host "
        "and splits the others (at least one thread per rank). The web API refuses more than the cores of the "
        "job's host.", gt=0,
        le=MAX_WORLD,
    )
    host_ram_gib: Optional[float] = _f(
        None, doc="Host RAM available to the job in GiB (None: the cgroup limit, else MemTotal).", gt=0,
        le=MAX_HOST_RAM_GIB,
    )
    gpu_memory_gib: Optional[float] = _f(
        None, doc="GPU memory the job may use on each of its GPUs, in GiB, CUDA context included (None: the whole "
        "card). The planner plans within it and each rank limits PyTorch's allocator to it, so a card can be shared "
        "or a smaller card's memory reproduced on a bigger one. A cap the job cannot fit in is refused before "
        "anything is allocated, naming the smallest cap that fits. It must exceed the 2.25 GiB each rank's CUDA "
        "context and NCCL take outside the allocator (GPU_CONTEXT_BYTES); a CPU job refuses it.",
        gt=GPU_CONTEXT_BYTES / 2**30, le=MAX_GPU_MEMORY_GIB,
    )
    resume: bool = _f(False, doc="Continue from the newest checkpoint in output_dir/checkpoints.")
    init_from: Optional[InitFromConfig] = _f(
        None,
        doc="Start from the weights of an earlier run's checkpoint instead of `model`'s: {job, checkpoint}, at "
        "least one of them set. With resume true and a checkpoint of this job's own in output_dir, resuming that "
        "wins.",
    )
    export: bool = _f(True, doc="Write output_dir/final/ (Hugging Face directory) at the end.")
    deterministic: bool = _f(False, doc="Deterministic kernels on GPU (slower); for bit-exact resume tests.")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, raw: Any) -> JobConfig:
        """Build and range-check a config; raise ConfigError naming every bad key path."""
        errors: list[dict[str, str]] = []
        cfg = build(cls, raw, "", errors)
        if not errors:
            cross_checks(cfg, errors)
        if errors:
            raise ConfigError(errors)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["optimizer"]["betas"] = list(self.optimizer.betas)
        return d

    @property
    def world_size(self) -> int:
        return self.gpus if self.gpus > 0 else self.ranks

    @property
    def global_batch_sequences(self) -> int:
        return self.micro_batch_size * self.world_size * self.grad_accum

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_sequences * self.seq_len


def load_config_file(path: str) -> dict[str, Any]:
    """Read a YAML or JSON job file into a dict (YAML needs pyyaml, which the GPU machine has)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if path.endswith(".json"):
        return json.loads(text)
    import yaml  # local: only YAML files need it

    return yaml.safe_load(text) or {}


def override_value(text: str) -> Any:
    """The value of a KEY=VALUE override on a command line (`slidedp train --set`, `slidedp bench --policy-set`):
    JSON where it reads as JSON (256, true, null), else the text itself (gpu)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def is_model_path(model: str) -> bool:
    """A model value containing '/' or naming an existing directory is a path; otherwise a preset name."""
    return "/" in model or os.sep in model or os.path.isdir(model)
