"""`slidedp.train`: validate, build the host state, launch one process per rank, collect metrics, export.

The calling process never touches CUDA (it can be a web worker's job process or a notebook); it owns the host
state's shared memory (creates it, initialises weights, writes checkpoints, removes it at exit) and starts the
rank processes with slidedp.ranks (fresh interpreters joined through a file:// rendezvous in a private directory).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue as queue_mod
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slidedp import atomic_file
from slidedp.config import ConfigError, JobConfig, is_model_path
from slidedp.health import HealthMonitor, finite_json
from slidedp.model_shape import ModelOnDemand, read_shape
from slidedp.planning import observed
from slidedp.planning.resolve import detect_early, early_cast_process, resolve_policy
from slidedp.policy import ExecutionPolicy
from slidedp.ranks import Launch
from slidedp.run_spec import RunSpec
from slidedp.startup import Startup
from slidedp.step.layout import HostLayout, plan_layout
from slidedp.trackers import Trackers, requested
from slidedp.train_result import ExportFailed, TrainError, TrainResult, UnhealthyRun

__all__ = ["ExportFailed", "StateCache", "TrainError", "TrainResult", "UnhealthyRun", "host_layout", "train"]

if TYPE_CHECKING:
    from slidedp.step.host_fill import MomentPager


def _log(on_log: Callable[[str], None] | None, line: str) -> None:
    if on_log is not None:
        on_log(line)


def _format_step(r: dict, steps: int) -> str:
    """One step's log line. TFLOP/s and peak HBM only for a GPU run: a CPU run's record has no HBM figures
    (hbm_peak_gib is empty), and its model FLOP rate says nothing useful."""
    rss = r.get("host_rss_gib") or 0.0
    gpu = f"{r['tflops']:.1f} TFLOP/s | hbm {max(r['hbm_peak_gib']):.1f} GiB | " if r.get("hbm_peak_gib") else ""
    evals = ""
    if r.get("eval_loss_start") is not None:
        evals += f" | eval before {r['eval_loss_start']:.4f} (ppl {r['eval_ppl_start']:.1f})"
    if r.get("eval_loss") is not None:
        evals += f" | eval {r['eval_loss']:.4f} (ppl {r['eval_ppl']:.1f})"
    return (f"step {r['step']:>5}/{steps} | loss {r['loss']:.4f} | lr {r['lr']:.2e} | gnorm {r['grad_norm']:.3f}"
            f"{' (clipped)' if r['clipped'] else ''} | {r['step_time_s']:.3f} s | {r['tokens_per_s']:,.0f} tok/s | "
            f"{gpu}rss {rss:.1f} GiB{evals}")


def _rss_gib(pids: list[int], shared_bytes: int) -> float:
    """Private resident memory of the rank processes plus the shared host state they map."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith("RssAnon:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return (total + shared_bytes) / 2**30


def _cpu_threads(cfg: JobConfig) -> int:
    from slidedp.planning.job import rank_threads

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return rank_threads(cfg, cores)


def _metrics_prediction(plan: dict) -> dict:
    if not plan:
        return {}
    from slidedp.planning.autopolicy import metrics_prediction

    return metrics_prediction(plan)


def host_layout(cfg: JobConfig, unit_numels: list[int], policy: ExecutionPolicy) -> HostLayout:
    """Shared-memory layout of a job (slidedp.step.layout.plan_layout, the one rule of the host state's size)."""
    return plan_layout(unit_numels, cfg.world_size, policy, cfg.precision, cfg.optimizer.max_grad_norm > 0,
                       grad_accum=cfg.grad_accum)


def _rewind_metrics(path: str, step: int) -> None:
    """Keep the records of steps up to the resumed checkpoint: steps after it run again and are written again."""
    if not os.path.exists(path):
        return
    kept = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                if int(json.loads(line)["step"]) <= step:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a killed run
    atomic_file.write_text(path, "".join(kept), durable=True)


def _init_host_state(cfg: JobConfig, adapter, state, progress: Callable[[int, int], None] | None = None,
                     threads: int | None = None) -> None:
    """Fill a fresh host state from the job's model: a local directory's weights, or a preset's random initial
    weights from cfg.seed; one thread per core (slidedp.step.host_fill), the same bytes whatever the count."""
    from slidedp.step.host_fill import fill_host_state

    fill_host_state(adapter, state, cfg.seed, cfg.model if is_model_path(cfg.model) else None, progress, threads)


class StateCache:
    """One host state kept across train() calls, for benchmarks that time many policies on one model.

    Creating a Qwen3-8B state (115 GB touched, weights initialised) takes about a minute; a run given a cache whose
    state has the same units and precision trains on it as it is: weights and moments left by the previous run,
    the step count starting again at 1. That is a different run from a fresh one, so only timing uses it.
    """

    def __init__(self) -> None:
        self.layout: HostLayout | None = None

    def fits(self, layout: HostLayout) -> bool:
        return (self.layout is not None and self.layout.unit_numels == layout.unit_numels
                and self.layout.delivery_dtype == layout.delivery_dtype)

    def close(self) -> None:
        from slidedp.step.host_state import unlink

        if self.layout is not None:
            unlink(self.layout)
            self.layout = None


def _export_or_keep(cfg: JobConfig, adapter, state, ckpt_root: str, last: int, data_state: dict | None,
                    on_log, room=None) -> dict:
    """Export final/; when that fails, keep the trained state in a checkpoint of the last step (written into the
    room reserved for it, `room`, when the run kept one) and raise ExportFailed naming it. Every existing
    checkpoint is kept."""
    from slidedp.persist import checkpoint as ckpt
    from slidedp.persist.export import ExportError, export_hf

    try:
        return export_hf(os.path.join(cfg.output_dir, "final"), cfg, adapter, state)
    except ExportError as exc:
        error = exc
    _log(on_log, f"export failed: {error}")
    kept, save_error = None, None
    latest = ckpt.latest(ckpt_root)
    if latest is not None and ckpt.step_of(latest) == last:
        kept = latest
    else:
        try:  # keep every checkpoint there is, and add the last step's
            kept = ckpt.save(ckpt_root, last, cfg, state, data_state, keep=len(ckpt.list_checkpoints(ckpt_root)) + 1,
                             room=room)
            _log(on_log, f"checkpoint of step {last} written to {kept}, to export from")
        except Exception as exc:  # noqa: BLE001 - reported in the error below
            save_error = exc
    if kept is not None:
        where = (f"the trained state is kept in checkpoint {kept}: retry with `slidedp export --checkpoint {kept}` "
                 "(or run the job again with resume: true, which goes straight to the export)")
    else:
        where = f"the trained state could not be kept in a checkpoint either ({type(save_error).__name__}: " \
                f"{save_error}), so it is lost"
    raise ExportFailed(f"all {last} steps trained, but the export failed: {error}. {where}", kept, error) from error


def train(config: dict | JobConfig, on_step: Callable[[dict], None] | None = None,
          on_log: Callable[[str], None] | None = None,
          should_stop: Callable[[], Any] | None = None, state_cache: StateCache | None = None,
          plan: dict | None = None, on_stage: Callable[[dict], None] | None = None,
          run_name: str | None = None, predict_explicit: bool = False) -> TrainResult:
    """Train a job to the end (or until should_stop() is truthy); see docs/interfaces.md §2.

    run_name: what the experiment trackers (config report_to, slidedp.trackers) call the run; default: the name
    of the output folder.

    on_stage: called as each start-up stage begins (slidedp.startup), with progress while the host state is
    filled, and with stage "training" and the durations once the first step is done.

    plan: a plan made for this job before (docs/interfaces.md §5), used when its basis is this run's
    (resolve_policy); TrainResult.plan is the plan the run used, with "replanned" saying why when it was made
    again. predict_explicit: plan a config that fixes every choice too, for the prediction its records carry
    (`slidedp bench`).

    The stages, as the start-up log names them: planning (_plan), checks (_start_point), allocating the host
    state (_allocate), spawning the ranks and filling or loading the state (_fill_or_load), starting the ranks and
    training (_run_ranks), then a stop's checkpoint and the export (_save_and_export)."""
    called = time.perf_counter()  # the time to first step counts from the call, imports and validation included
    from slidedp.step.host_state import unlink

    cfg = config if isinstance(config, JobConfig) else JobConfig.from_dict(config)
    detected = detect_early(cfg, predict_explicit)  # the host detected on a thread of its own from here on
    beside = early_cast_process(cfg, predict_explicit, plan)  # plans the host cast (its imports start now)
    try:
        _check_request(cfg)
        startup = Startup(on_stage, on_log, t0=called)
        # The ranks are spawned as soon as the host is measured (resolve_policy's `measured`): their interpreters
        # and imports overlap the planning, the checks and the allocation; they are sent the run once it exists.
        ranks = Launch("slidedp.step.rank:run", cfg.world_size, prefix="slidedp-pg-")
    except BaseException:
        if beside is not None:
            beside.close()
        raise
    try:
        policy, plan, layout = _plan(cfg, startup, on_log, plan, detected, predict_explicit,
                                     measured=lambda: _spawn(ranks, cfg, startup), beside=beside)
        adapter = ModelOnDemand(cfg.model, layout.unit_numels)
        ckpt_root = os.path.join(cfg.output_dir, "checkpoints")
        resume_from, init_source = _start_point(cfg, layout, ckpt_root, on_log)
        reuse = (state_cache is not None and resume_from is None and init_source is None
                 and state_cache.fits(layout))
        if state_cache is not None:
            if reuse:
                layout = dataclasses.replace(layout, run=state_cache.layout.run)
            else:
                state_cache.close()  # free the old state before the new one is touched: both may not fit in RAM
        if should_stop is not None and should_stop():  # asked while starting: nothing is allocated yet
            _log(on_log, "stopped before the host state was allocated")
            ranks.close()
            return TrainResult("stopped", 0, [], cfg.output_dir, None, None, policy, plan)
        # the run as every rank receives it, typed (slidedp.run_spec): no rank parses the config again
        spec = RunSpec(cfg, policy, layout, _metrics_prediction(plan), _cpu_threads(cfg))
        startup.mark("checks")
        state, room = _allocate(cfg, layout, reuse)
    except BaseException:
        ranks.close()
        if beside is not None:  # refused before resolve_policy, which closes it once it planned
            beside.close()
        raise
    run = _Run(spec, state, ckpt_root, os.path.join(cfg.output_dir, "metrics.jsonl"), startup, on_log, ranks)
    trackers: Trackers | None = None
    ended = "failed"  # how the trackers' run ends, unless a return below says otherwise
    try:
        startup.mark("allocating_host_state")
        if state_cache is not None:
            state_cache.layout = layout
        start_step, data_state = _fill_or_load(run, adapter, resume_from, init_source, reuse)
        monitor = HealthMonitor(cfg)
        if set(requested(cfg.report_to)) - {"tensorboard"}:  # W&B and MLflow take seconds (a login, a store)
            startup.enter("opening_trackers")
        trackers = Trackers(cfg, start_step, run_name, on_log)

        def on_record(record: dict) -> None:  # each metrics record, as metrics.jsonl has it, to both
            trackers.log(record)
            if on_step is not None:
                on_step(record)

        records: list[dict] = []
        if start_step >= cfg.steps:  # the checkpoint is of the last step: nothing to train, no rank to start
            _log(on_log, f"step {start_step} of {cfg.steps} is the last: no step to run")
            last, last_data_state = start_step, data_state
        else:
            if state.fresh and resume_from is None:
                from slidedp.step.host_fill import MomentPager

                # fresh moments are paged in while the ranks start, not by the first step's update
                run.pager = MomentPager([state.exp_avg, state.exp_avg_sq], state.board,
                                        stripe_bytes=layout.stripe_bytes)
            last, last_data_state = _run_ranks(run, start_step, data_state, records, on_record, should_stop, monitor)
            if monitor.stop_reason is not None:  # nothing is saved or exported from the state after it
                raise UnhealthyRun(monitor.stop_reason, monitor.diverged_step)
            if last is None:  # stopped before any rank read the host state
                ended = "stopped"
                return TrainResult("stopped", start_step, [], cfg.output_dir, None,
                                   ckpt_root if os.path.isdir(ckpt_root) else None, policy, plan)
        status, final_dir, files = _save_and_export(run, adapter, start_step, last, last_data_state, room)
        ended = status
        check = observed.check_run(cfg, plan, detected, records, on_log)  # once the trained state is saved
        return TrainResult(status, last, records, cfg.output_dir, final_dir,
                           ckpt_root if os.path.isdir(ckpt_root) else None, policy, plan,
                           exported_files=files, warnings=monitor.warnings, prediction_check=check)
    finally:
        if run.pager is not None:  # before the state is unmapped
            run.pager.close()
        run.ranks.close()  # ends the ranks still running (killed after 10 s)
        unlink(layout, keep_state=state_cache is not None)
        if room is not None:
            room.release()
        if trackers is not None:
            trackers.close(ended)


@dataclass
class _Run:
    """A run once its host state exists: what its later stages share (the launcher's side)."""

    spec: RunSpec
    state: Any  # slidedp.step.host_state.HostState
    ckpt_root: str
    metrics_path: str
    startup: Startup
    on_log: Callable[[str], None] | None
    ranks: Launch  # spawned while the plan was made; sent the run by _fill_or_load (a resumed run: _run_ranks)
    pager: MomentPager | None = None


def _spawn(ranks: Launch, cfg: JobConfig, startup: Startup) -> None:
    """The ranks spawned (resolve_policy's `measured`), unless the run resumes a checkpoint of its last step: with
    no step to train, no rank starts."""
    from slidedp.persist import checkpoint as ckpt

    last = ckpt.latest(os.path.join(cfg.output_dir, "checkpoints")) if cfg.resume else None
    if last is None or ckpt.step_of(last) < cfg.steps:
        ranks.spawn()
        startup.mark("spawning_ranks")


def _check_request(cfg: JobConfig) -> None:
    """What no planning can change: a web-only key, the job's own checks (slidedp.validation), the GPU count."""
    import torch

    from slidedp.validation import check_job

    if cfg.init_from is not None and cfg.init_from.job is not None:
        raise ConfigError([{"loc": "init_from.job", "msg": f"names workbench job {cfg.init_from.job}, which only the "
                            "web service resolves: the runtime needs the checkpoint's path in init_from.checkpoint "
                            "(and job null)"}])
    check_job(cfg)
    if cfg.gpus > 0 and torch.cuda.device_count() < cfg.gpus:
        raise ConfigError([{"loc": "gpus", "msg": f"asks for {cfg.gpus} GPUs, this host has "
                                                  f"{torch.cuda.device_count()}; lower gpus or use 0 for CPU"}])
    os.makedirs(cfg.output_dir, exist_ok=True)


def _plan(cfg: JobConfig, startup: Startup, on_log, plan: dict | None, detected, predict_explicit: bool,
          measured: Callable[[], Any], beside=None):
    """The planning stage: the model's shape read (a preset's figures or config.json, slidedp.model_shape: no
    transformers, no model built), the host's detection (`detected`: resolve.detect_early's, started before the
    request's checks) waited for, the ranks spawned once the host is measured (`measured`), the policy resolved
    (the host cast searched by `beside`, resolve.early_cast_process's), segments of killed runs removed, the host state laid out. (policy, plan, layout)."""
    from slidedp.step.host_state import cleanup_orphans

    startup.enter("planning")
    shape = read_shape(cfg.model)
    startup.mark("model_config")
    policy, plan = resolve_policy(cfg, shape.num_layers, on_log, plan, startup=startup, detected=detected,
                                  predict_explicit=predict_explicit, measured=measured, beside=beside)
    removed = cleanup_orphans()
    startup.mark("removing_orphans")
    if removed:
        _log(on_log, f"removed {len(removed)} shared-memory segments left by a killed run")
    return policy, plan, host_layout(cfg, list(shape.unit_numels), policy)


def _start_point(cfg: JobConfig, layout: HostLayout, ckpt_root: str, on_log) -> tuple[str | None, str | None]:
    """Where the run starts, checked before anything is allocated: (the checkpoint it resumes, or None; the
    checkpoint whose weights it starts from, or None). Refuses a disk without room for its checkpoints and a
    checkpoint of another model."""
    from slidedp.persist import checkpoint as ckpt

    if cfg.checkpoint.interval:  # refuse now rather than after hours of training, at the first checkpoint
        try:
            ckpt.check_free_disk(cfg.output_dir, layout.total)
        except OSError as exc:
            raise ConfigError([{"loc": "checkpoint.interval", "msg": str(exc)}]) from None
    resume_from = ckpt.latest(ckpt_root) if cfg.resume else None
    if resume_from is not None:  # a checkpoint of another model fails here, before anything is allocated
        meta = ckpt.check_resumable(resume_from, cfg, layout.unit_numels)
        changed = ckpt.changed_settings(meta, cfg)
        if changed:
            _log(on_log, f"resuming with settings changed since the checkpoint: {', '.join(changed)} "
                         "(the run continues, but is no longer the same run)")
    elif cfg.resume:
        _log(on_log, f"resume asked, but {ckpt_root} holds no complete checkpoint: starting at step 0")
    init_source = None
    if cfg.init_from is not None:
        if resume_from is not None:
            _log(on_log, f"init_from {cfg.init_from.checkpoint} not used: the run resumes its own checkpoint")
        else:
            init_source = cfg.init_from.checkpoint
            ckpt.check_init_from(init_source, cfg.output_dir, layout.unit_numels)
    return resume_from, init_source


def _allocate(cfg: JobConfig, layout: HostLayout, reuse: bool):
    """The host state, created (or the kept one mapped, `reuse`), and the disk room held for the last checkpoint
    when the run writes no other (None otherwise): (state, room). Refuses a shared-memory folder too small."""
    from slidedp.persist import checkpoint as ckpt
    from slidedp.step import host_state

    short = host_state.space_error(layout, keep_state=reuse)
    if short is not None:
        raise ConfigError([short])
    # With no checkpoints along the way, the state of a finished run whose export fails survives only in the one
    # checkpoint written then: its room is taken now, and refused now when the disk does not have it.
    room = ckpt.Reserve(cfg.output_dir, layout.total) if cfg.export and not cfg.checkpoint.interval else None
    if room is not None:
        room.hold()
    try:
        return host_state.HostState.create(layout, keep_state=reuse), room
    except BaseException:
        if room is not None:
            room.release()
        raise


def _fill_or_load(run: _Run, adapter: ModelOnDemand, resume_from: str | None, init_source: str | None,
                  reuse: bool) -> tuple[int, dict | None]:
    """The host state made whole: a resumed checkpoint loaded, or (a run from step 0) the ranks sent the run first
    and the state filled beside their start, from init_from's weights, a kept state or the model. (start step, data
    position)."""
    from slidedp.persist import checkpoint as ckpt
    from slidedp.step.rank import RankArgs

    cfg, state, policy, on_log = run.spec.config, run.state, run.spec.policy, run.on_log
    start_step, data_state = 0, None
    t0 = time.perf_counter()
    if resume_from is not None:
        run.startup.enter("loading_checkpoint")
        start_step, data_state = ckpt.load(resume_from, cfg, state)
        _rewind_metrics(run.metrics_path, start_step)
        _log(on_log, f"resumed from step {start_step} ({resume_from})")
    else:
        # A run from step 0 sends its ranks (spawned while the plan was made) the run now: their CUDA and process
        # group, attaching and page-locking the host state overlap its filling, and each waits for Board.HOST_READY
        # before it reads the state. A resumed run learns its step and data position from the checkpoint first.
        # the moments start at zero unless a kept state brings its own (benchmark): ranks need not copy them
        run.ranks.start(RankArgs(run.spec, 0, None, zero_moments=not reuse))
        run.startup.mark("sending_the_run")
        if init_source is not None:  # that run's weights; moments zero, step 0, the data from the start
            run.startup.enter("loading_checkpoint")
            source_step = ckpt.load_weights(init_source, state, zero_moments=not state.fresh)
            _log(on_log, f"initial weights from step {source_step} of {init_source} (AdamW moments zero)")
        elif reuse:
            _log(on_log, "host state kept from the previous run (benchmark): weights and moments as it left them")
        else:
            run.startup.enter("loading_weights" if is_model_path(cfg.model) else "building_host_state")
            model = adapter.get()  # transformers imported beside the ranks' start
            run.startup.mark("meta_model")
            _init_host_state(cfg, model, state, run.startup.progress)
        if os.path.exists(run.metrics_path):
            os.unlink(run.metrics_path)
        stale = ckpt.clear(run.ckpt_root)  # a fresh run must never be resumed from an earlier run's state
        if stale:
            _log(on_log, f"removed {len(stale)} checkpoints of an earlier run in {run.ckpt_root} (resume is false)")
    for u in range(len(run.spec.layout.unit_numels)):
        for r in range(cfg.world_size):
            state.board.set_updated(u, r, start_step)
    _log(on_log, f"host state: {run.spec.layout.total / 1e6:.1f} M params, {state.state_bytes() / 2**30:.2f} GiB "
                 f"shared ({time.perf_counter() - t0:.1f} s); policy: delivery={policy.delivery} "
                 f"grad_reduce={policy.grad_reduce} window={policy.window} ranks={cfg.world_size}"
                 + (" edge_update=gpu" if policy.edge_update == "gpu" else "")
                 + (f" device_layers={policy.device_layers}" if policy.device_layers else ""))
    return start_step, data_state


def _save_and_export(run: _Run, adapter: ModelOnDemand, start_step: int, last: int, last_data_state: dict | None,
                     room) -> tuple[str, str | None, list[dict]]:
    """After the ranks: a stop asked with save writes the last step's checkpoint (unless one is there); a
    completed run exports final/. (status, final_dir, exported files)."""
    from slidedp.persist import checkpoint as ckpt

    cfg, state, on_log = run.spec.config, run.state, run.on_log
    status = "completed" if last >= cfg.steps else "stopped"
    if status == "stopped" and state.board.get(state.board.SAVE_REQUEST) and last > start_step:
        latest = ckpt.latest(run.ckpt_root)
        if latest is None or ckpt.step_of(latest) != last:
            # every rank has finished step `last`'s update before reporting done: the host state is final
            path = ckpt.save(run.ckpt_root, last, cfg, state, last_data_state, keep=cfg.checkpoint.keep, room=room)
            _log(on_log, f"stopped after step {last}; checkpoint written to {path}")
    final_dir, files = None, []
    if status == "completed" and cfg.export:
        exported = _export_or_keep(cfg, adapter.get(), state, run.ckpt_root, last, last_data_state, on_log, room)
        final_dir, files = exported["final_dir"], exported["files"]
        _log(on_log, f"exported a Hugging Face model to {final_dir}")
    return status, final_dir, files


def _run_ranks(run: _Run, start_step: int, data_state: dict | None, records: list[dict], on_step, should_stop,
               monitor: HealthMonitor) -> tuple[int | None, dict | None]:
    """Let the rank processes train (started already while the host state was filled, or started here; the caller
    ends them by closing `ranks`), relay their records and checkpoint requests until each reports
    done; (last step finished, data position after it), or (None, None) when a stop came before any rank read the
    host state. Each record passes the health monitor first: a diverged step, or a warning with on_warning stop,
    asks the ranks to stop at their next boundary, and no checkpoint is written after it."""
    from slidedp.persist import checkpoint as ckpt
    from slidedp.step.rank import CKPT_DONE, RankArgs

    spec, state, ranks, pager, startup, on_log = run.spec, run.state, run.ranks, run.pager, run.startup, run.on_log
    ckpt_root, metrics_path = run.ckpt_root, run.metrics_path
    cfg = spec.config
    world = cfg.world_size
    best = ckpt.BestKeeper(ckpt_root, cfg.eval.keep_best)
    if should_stop is not None and should_stop():  # asked while the host state was filled: nothing trained
        _log(on_log, "stopped before training began")
        return None, None
    startup.enter("starting_ranks")
    if not ranks.args_sent:  # a resumed run: its step and data position came from the checkpoint
        ranks.start(RankArgs(spec, start_step, data_state))
    state.board.set(state.board.HOST_READY, 1)
    if pager is not None:
        pager.start()
    done: dict[int, dict] = {}
    stop_sent = False
    rank_startup: dict[str, float] | None = None  # rank 0's own start-up parts, for the first record
    paged_reported = False
    while len(done) < world:
        if pager is not None and pager.error is not None:
            state.board.set(state.board.STOP_REQUEST, 2)
            raise TrainError(f"paging in the AdamW moments failed: {pager.error}") from pager.error
        if should_stop is not None and not stop_sent:
            want = should_stop()
            if want:
                if want == "save":  # written by this process once every rank has stopped (below)
                    state.board.set(state.board.SAVE_REQUEST, 1)
                state.board.set(state.board.STOP_REQUEST, 1)
                stop_sent = True
        try:
            kind, rank, payload = ranks.get(timeout=0.1)
        except queue_mod.Empty:
            dead = ranks.failed()
            if dead:
                state.board.set(state.board.STOP_REQUEST, 2)
                for kind, rank, payload in ranks.drain(0.5):  # its last words, when it had time for them
                    if kind == "error":
                        raise TrainError(f"rank {rank} failed:\n{payload['traceback']}") from None
                raise TrainError(f"rank {dead[0][0]} exited with code {dead[0][1]} before reporting") from None
            continue
        if kind == "stage":  # rank 0 is about to run its first step
            startup.enter(payload["stage"])
            if payload.get("rank_startup_s"):
                rank_startup = {k: round(v, 3) for k, v in payload["rank_startup_s"].items()}
                _log(on_log, "rank 0 start-up: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f} s"
                                                             for k, v in rank_startup.items()))
            continue
        if kind == "record":
            if not startup.done:
                payload["startup_s"] = startup.finish()
                payload["time_to_first_step_s"] = startup.total_s
                if rank_startup is not None:
                    payload["rank_startup_s"] = rank_startup
                parts = startup.parts_s()
                if parts:
                    payload["startup_parts_s"] = parts
            if pager is not None and not paged_reported and pager.elapsed_s is not None:
                # the first record after the paging ended: the first, unless its update ran beside the paging
                payload["moments_paged_s"], paged_reported = pager.elapsed_s, True
            payload["host_rss_gib"] = _rss_gib(ranks.pids, state.shared_bytes())
            diverged, raised = monitor.check(payload)
            if raised:
                payload["warnings"] = raised
            if diverged:
                payload["diverged"] = diverged
            records.append(payload)
            with open(metrics_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(finite_json(payload)) + "\n")
            _log(on_log, _format_step(payload, cfg.steps))
            for w in raised:
                _log(on_log, f"warning: {w['message']}")
            if on_step is not None:
                on_step(payload)
            if monitor.stop_reason is not None and not stop_sent:
                _log(on_log, f"{monitor.stop_reason}: stopping the ranks at their next step boundary")
                state.board.set(state.board.STOP_REQUEST, 1)
                stop_sent = True
        elif kind == "checkpoint":
            if monitor.stop_reason is None:
                # while the run may be dying the new checkpoint may hold a dead state: rotate none of the earlier
                # ones away for it (a run cannot have more checkpoints than steps)
                path = ckpt.save(ckpt_root, payload["step"], cfg, state, payload["data_state"],
                                 keep=cfg.steps if monitor.suspect else cfg.checkpoint.keep)
                _log(on_log, f"checkpoint of step {payload['step']} written to {path}")
                kept = best.written(payload["step"], path, records)
                if kept is not None:
                    _log(on_log, f"checkpoint of step {payload['step']} has the lowest eval loss so far: kept "
                                 f"as {kept}")
            else:  # the earlier checkpoints stay as they are: nothing rotates them away
                _log(on_log, f"checkpoint of step {payload['step']} not written: {monitor.stop_reason}")
            state.board.set(CKPT_DONE, payload["step"])
        elif kind == "error":
            state.board.set(state.board.STOP_REQUEST, 2)
            raise TrainError(f"rank {rank} failed:\n{payload['traceback']}")
        elif kind == "done":
            done[rank] = payload
    ranks.wait(timeout=60)
    return done[0]["last_step"], done[0]["data_state"]
