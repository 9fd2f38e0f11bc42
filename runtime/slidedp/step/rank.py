"""One rank process: join the group, map the host state, run steps, report metrics to the launcher.

Step boundaries are agreed through the shared board, not through collectives, so deciding whether to stop or to
checkpoint never drains the GPU queue: rank 0 reads the launcher's request and publishes its decision for boundary
t; the other ranks read it once rank 0 has passed that boundary.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from slidedp.config import JobConfig
from slidedp.model_sizing import layer_forward_flops, shape_of
from slidedp.presets import flops_per_token
from slidedp.run_spec import RunSpec
from slidedp.step import trace
from slidedp.step.host_state import Board, HostState, wait_until
from slidedp.step.model_adapter import ModelAdapter, load_hf_config
from slidedp.step.optimizer import lr_at

# Dense bf16 peak per GPU for MFU (vendor figures); SLIDEDP_PEAK_TFLOPS overrides.
PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.0, "RTX 4090": 165.2}

# The updater thread needs the GIL for a few bytecodes between GIL-free calls of milliseconds (AdamW, the cast)
# while the issuing thread runs Python almost without pause (hooks, launches, the window). A thread that wants
# the GIL waits for the holder's switch interval before it may take it (CPython's default: 5 ms), so each
# return from a long call could cost the update up to 5 ms beside a thread that never releases the GIL (4x slower
# in the contention probe). The engine's issuing thread releases it at every launch, and on the GPU machine 0.2
# against 5 ms measured no difference (docs/notebook/perf-notes.md); the short interval bounds what a Python-heavy thread
# (a data producer, say) can cost the update.
GIL_SWITCH_S = 2e-4

# Board decisions (slots above Board.FIXED are counters)
STOP_BEFORE = Board.STOP_STEP
CKPT_STEP, CKPT_DONE = 4, 5


@dataclass
class RankArgs:
    spec: RunSpec  # the run, as the launcher resolved it
    start_step: int  # the step the run resumes after (0: a fresh run)
    data_state: dict | None  # the data pipeline's position after start_step (None: the start)
    zero_moments: bool = False  # the host state's AdamW moments are all zero (a run from step 0): nothing to copy
    memory_cap: dict | None = None  # set in the rank: what the gpu_memory_gib cap set (RankLink.join)


def _setup(link, args: RankArgs, cfg: JobConfig, marks: _Marks) -> torch.device:
    """The rank's threads and numerics, then its device and process group (slidedp.ranks.RankLink.join)."""
    sys.setswitchinterval(GIL_SWITCH_S)
    torch.set_num_threads(args.spec.cpu_threads)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    if cfg.gpus > 0:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    joined = link.join(cfg.gpus > 0, cfg.gpu_memory_gib, on_device=lambda: marks.done("device"))
    args.memory_cap = joined.memory_cap
    return joined.device


def _peak_tflops(device: torch.device) -> float | None:
    if os.environ.get("SLIDEDP_PEAK_TFLOPS"):
        return float(os.environ["SLIDEDP_PEAK_TFLOPS"])
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_TFLOPS.items():
        if key in name:
            return value
    return None


def _load_model_and_data(cfg: JobConfig, args: RankArgs, rank: int, world: int) -> tuple[ModelAdapter, Any]:
    from slidedp.data import DataPipeline, load_tokenizer

    adapter = ModelAdapter(load_hf_config(cfg.model))
    pipeline = DataPipeline(cfg, load_tokenizer(cfg), rank, world)
    if args.data_state:
        pipeline.load_state_dict(args.data_state)
    return adapter, pipeline


class _Loading(threading.Thread):
    """_load_model_and_data on a daemon thread (an error of the rank's own start ends the process without waiting
    for it); result() waits for it and raises what it raised."""

    def __init__(self, cfg: JobConfig, args: RankArgs, rank: int, world: int) -> None:
        super().__init__(name="slidedp-rank-loading", daemon=True)
        self._call = (cfg, args, rank, world)
        self._out: tuple[ModelAdapter, Any] | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        if _PREPARING is not None:
            _PREPARING.join()
        try:
            self._out = _load_model_and_data(*self._call)
        except BaseException as exc:  # handed to the rank's own thread by result()
            self._error = exc

    def result(self) -> tuple[ModelAdapter, Any]:
        self.join()
        if self._error is not None:
            raise self._error
        assert self._out is not None
        return self._out


def prepare() -> None:
    """Called by a rank spawned before its plan exists (slidedp.ranks.Launch.spawn): imports what its start needs
    beyond this module on a thread (_PREPARING), while the rank waits for the run: the engine, the data pipeline,
    transformers' config and model base classes (most of what loading the model imports; the model's own modeling
    module, which the run names, stays the loading thread's). The loading thread waits for it
    before it imports anything itself: two threads importing transformers at once can see it half made."""
    global _PREPARING

    def imports() -> None:
        try:
            import slidedp.data  # noqa: F401
            import slidedp.step.engine  # noqa: F401
            from transformers import AutoConfig, PreTrainedModel  # noqa: F401 - lazy in transformers: named here
        except Exception:  # noqa: BLE001, S110 - the same import in the rank's start raises it where it is reported
            pass

    _PREPARING = threading.Thread(target=imports, name="slidedp-rank-prepare", daemon=True)
    _PREPARING.start()


_PREPARING: threading.Thread | None = None


class _Marks:
    """Seconds of each part of a rank's start-up, in the order they ran (`rank_startup_s`, docs/interfaces.md §3)."""

    def __init__(self, waited_s: float | None = None) -> None:
        import psutil

        # from the process's creation to here: the interpreter, the imports, unpickling the arguments, and (a rank
        # spawned before the plan was made) waiting for the launcher to send the run
        since = max(0.0, time.time() - psutil.Process().create_time())
        self.seconds = {"process_and_imports": max(0.0, since - (waited_s or 0.0))}
        if waited_s is not None:
            self.seconds["waiting_for_plan"] = waited_s
        self._t = time.perf_counter()

    def done(self, part: str) -> None:
        now = time.perf_counter()
        self.seconds[part] = now - self._t
        self._t = now


def rank_main(link, args: RankArgs, queue) -> None:
    """A rank's life, in the stages its start-up record names: start (device, group, host state, model and data,
    engine), the steps, then the end (the last update waited for, the host state made whole, "done")."""
    marks = _Marks(link.waited_s)
    started: _Started | None = None
    try:
        started = _start(link, args, marks, queue)
        last_done = _train(started, args, queue)
        _finish(started, last_done, queue)
    finally:
        if started is not None:
            started.state.unpin()


@dataclass
class _Started:
    """A rank ready for its first step."""

    link: Any
    cfg: JobConfig
    state: HostState
    engine: Any  # slidedp.step.engine.RankEngine
    pipeline: Any  # slidedp.data.DataPipeline
    groups: tuple
    reporter: _Reporter
    tr: Any  # the step timeline (slidedp.step.trace), or None


def _start(link, args: RankArgs, marks: _Marks, queue) -> _Started:
    """Device and process group, the host state attached, then _ready."""
    rank, world = link.rank, link.world
    cfg = args.spec.config
    # The model's config, the tokenizer and the data (importing transformers, reading and packing the rows) need no
    # device: they load on a thread of their own while this one starts CUDA and the process group, maps the host
    # state, waits for it to be filled and page-locks it: it hides up to the shorter of the two.
    loading = _Loading(cfg, args, rank, world)
    device = _setup(link, args, cfg, marks)
    groups = (dist.new_group(list(range(world))), dist.new_group(list(range(world))))
    marks.done("process_group")
    state = HostState.attach(args.spec.layout)
    marks.done("attach")
    try:
        return _ready(link, args, marks, queue, loading, device, groups, state)
    except BaseException:
        state.unpin()  # whatever it had page-locked
        raise


def _ready(link, args: RankArgs, marks: _Marks, queue, loading: _Loading, device: torch.device, groups: tuple,
           state: HostState) -> _Started:
    """From the attached host state to the first step: staging and state page-locked, model and data loaded,
    the engine and its updater started, the starting model evaluated (when the job evaluates)."""
    from slidedp.step.engine import RankEngine

    rank, world, cfg = link.rank, link.world, args.spec.config
    board = state.board

    def abort() -> None:
        if board.get(Board.STOP_REQUEST) == 2:  # the launcher saw a rank die
            raise RuntimeError("another rank failed")

    # The gradient staging is no part of what the launcher fills: it is page-locked while the fill runs.
    state.pin_staging()
    marks.done("page_lock_staging")
    if args.spec.policy.compiled_layers:  # the layers' compile, while the launcher still fills the host state
        from slidedp.step.compiled import warm

        adapter, _ = loading.result()
        warm(adapter, device, torch.bfloat16 if cfg.precision == "bf16" else torch.float32, cfg.micro_batch_size,
             cfg.seq_len)
        marks.done("compile_layers")
    # Everything above overlaps the launcher's filling of the host state; nothing below may read it before the
    # launcher says it is whole. The state is page-locked only then, and the launcher pages the moments in only once
    # every rank has said it is done (Board.set_pinned): for Qwen3-8B on the GPU machine page-locking took 17-25 s
    # beside the launcher's fill and paging, against about 1.3 s for a filled state alone (docs/benchmarks.md).
    wait_until(lambda: board.get(Board.HOST_READY) == 1, "the launcher to fill the host state",
               timeout_s=math.inf, abort=_launcher_alive(abort))
    marks.done("waiting_for_host_state")
    state.pin()
    board.set_pinned(rank)
    marks.done("page_lock")
    adapter, pipeline = loading.result()
    marks.done("model_and_data")

    engine = RankEngine(cfg, adapter, state, args.spec.policy, rank, world, device, groups, abort=abort,
                        zero_moments=args.zero_moments)
    engine.updater.last_step = args.start_step
    model_cfg = {**adapter.config.to_dict(), "model_type": adapter.config.model_type}
    tr = trace.start(rank)  # SLIDEDP_TRACE: a timeline of the steps (slidedp.step.trace)
    if tr is not None:
        tr.anchor(engine.streams)
        tr.run(bool(args.spec.policy.compiled_layers), engine.activations,
               layer_forward_flops(shape_of(model_cfg), cfg.micro_batch_size, cfg.seq_len))
    engine.updater.start()
    marks.done("engine")
    flops_tok = flops_per_token(model_cfg, cfg.seq_len)
    reporter = _Reporter(cfg, engine, queue, rank, world, flops_tok, _peak_tflops(device), args.spec.predicted)
    reporter.memory_cap = args.memory_cap
    if cfg.eval.enabled:  # the model the run starts from, reported with the run's first step
        reporter.evaluate(pipeline, args.start_step, start=True)
        marks.done("evaluation")
    if rank == 0:
        queue.put(("stage", 0, {"stage": "first_step", "rank_startup_s": marks.seconds}))  # the launcher's stages
    return _Started(link, cfg, state, engine, pipeline, groups, reporter, tr)


def _train(r: _Started, args: RankArgs, queue) -> int:
    """The steps after args.start_step up to the config's last, or to the boundary rank 0 decides to stop at;
    evaluations and checkpoints where they fall. Returns the last step run."""
    cfg, board, engine, reporter, rank = r.cfg, r.state.board, r.engine, r.reporter, r.link.rank
    pending: deque = deque()
    last_done = args.start_step
    latest = None  # the last step run (emitting its record may have taken it out of `pending`)
    checkpoint_steps = args.spec.checkpoint_steps(args.start_step)
    for step in range(args.start_step + 1, cfg.steps + 1):
        if rank == 0 and latest is not None and not _step_finite(latest):
            board.set(Board.STOP_REQUEST, 1)  # diverged: no step after it; the launcher names the reason
        if _decide_stop(board, rank, step):
            break
        t0 = time.perf_counter()
        micro = r.pipeline.next_step()
        data_s = time.perf_counter() - t0
        latest = engine.run_step(step, micro, data_s)
        pending.append(latest)
        last_done = step
        reporter.emit_ready(pending, final=False)
        if cfg.eval.enabled and (step == cfg.steps or (cfg.eval.interval and step % cfg.eval.interval == 0)):
            _wait_step_updated(engine, step)
            reporter.evaluate(r.pipeline, step)
            reporter.emit_ready(pending, final=True)  # the step's time ends with its update, before evaluating
        # A stop-and-save is written by the launcher after every rank has stopped: a save request read here would
        # be seen by some ranks after step t and by others only after t+1, and the ranks would then meet in
        # different barriers.
        if step in checkpoint_steps:
            _wait_step_updated(engine, step)
            if engine.device_update is not None:
                engine.device_update.write_back()
            reporter.emit_ready(pending, final=True)
            _checkpoint_barrier(board, rank, step, queue, r.pipeline.state_dict(), r.groups[1])
    _wait_step_updated(engine, last_done)
    if engine.device_update is not None:  # the host state is whole again for the stop's checkpoint and export
        engine.device_update.write_back()
    reporter.emit_ready(pending, final=True)
    return last_done


def _finish(r: _Started, last_done: int, queue) -> None:
    """The updater stopped, the timeline written, every rank past its last step; "done" with the data position."""
    r.engine.updater.stop()
    r.engine.updater.join(timeout=60)
    if r.tr is not None:
        r.tr.write()
    dist.barrier(group=r.groups[1])
    queue.put(("done", r.link.rank, {"last_step": last_done, "data_state": r.pipeline.state_dict()}))
    r.pipeline.close()
    dist.destroy_process_group()


def _launcher_alive(abort):
    """abort(), and an error once the launcher that started this rank has exited (the rank is re-parented)."""
    parent = os.getppid()

    def check() -> None:
        abort()
        if os.getppid() != parent:
            raise RuntimeError("the launcher exited before the host state was filled")

    return check


def _step_finite(t) -> bool:
    """Whether the step's loss (summed over the ranks) and, where the norm is reduced on the devices (one rank,
    or GPU reduction), its gradient norm are finite; waits for the step's last collective. A diverged step must
    be the last one run (slidedp.health), and its figures are known only once it has been run. (With host
    reduction on several ranks the norm is summed by the updaters after the update: only the loss is read.)"""
    t.events["stats"].synchronize()
    if not math.isfinite(float(t.loss_sum.item())):
        return False
    if t.norm is not None:
        event, sumsq = t.norm
        event.synchronize()
        return math.isfinite(float(sumsq))
    return True


def _decide_stop(board: Board, rank: int, step: int) -> bool:
    if rank == 0:
        if board.get(Board.STOP_REQUEST):
            board.set(STOP_BEFORE, step)
        board.set(Board.BOUNDARY, step)
    else:
        wait_until(lambda: board.get(Board.BOUNDARY) >= step, f"rank 0 to reach step {step}")
    return board.get(STOP_BEFORE) == step


def _wait_step_updated(engine, step: int) -> None:
    def done() -> bool:
        engine.updater.check()
        return engine.updater.last_step >= step

    wait_until(done, f"the host update of step {step}", timeout_s=3600)


def _checkpoint_barrier(board: Board, rank: int, step: int, queue, data_state: dict, group) -> None:
    """Every rank has finished step `step`'s updates; the launcher writes the host state while ranks wait."""
    dist.barrier(group=group)
    if rank == 0:
        queue.put(("checkpoint", rank, {"step": step, "data_state": data_state}))
    wait_until(lambda: board.get(CKPT_DONE) >= step, f"checkpoint of step {step}", timeout_s=24 * 3600)


class _Reporter:
    """Rank 0 turns finished steps into metrics records (a step is reported once its update has finished)."""

    def __init__(self, cfg: JobConfig, engine, queue, rank: int, world: int, flops_tok: float,
                 peak: float | None, predicted: dict):
        self.cfg, self.engine, self.queue, self.rank, self.world = cfg, engine, queue, rank, world
        self.flops_tok, self.peak, self.predicted = flops_tok, peak, predicted
        self.results: dict[int, Any] = {}
        self.evals: dict[int, dict] = {}  # step -> eval_* keys of the evaluation after it
        self.eval_cpu: dict[int, tuple[float, float]] = {}  # step -> CPU seconds (issuing thread, process) it took
        self.start_eval: dict | None = None  # the evaluation before the first step, until the first record
        self.memory_cap: dict | None = None  # the gpu_memory_gib limit set on rank 0, for the first record

    def emit_ready(self, pending: deque, final: bool) -> None:
        upd = self.engine.updater
        upd.check()
        while upd.results:
            r = upd.results.popleft()
            self.results[r.step] = r
        while pending:
            t = pending[0]
            res = self.results.get(t.step)
            if res is None or (len(pending) < 2 and not final):
                return
            pending.popleft()
            end = pending[0].t_start if pending else res.finished_at
            spent = self.eval_cpu.pop(t.step, (0.0, 0.0))  # an evaluation after the step is not the step's
            cpu_end = pending[0].cpu_start if pending else (time.thread_time() - spent[0],
                                                            time.process_time() - spent[1])
            evaluated = self.evals.pop(t.step, {})
            if self.start_eval is not None:
                evaluated.update(eval_loss_start=self.start_eval["eval_loss"],
                                 eval_ppl_start=self.start_eval["eval_ppl"])
                self.start_eval = None
            if self.memory_cap is not None:
                evaluated["gpu_memory_cap"] = {k.replace("_bytes", "_gib"): v / 2**30 for k, v in self.memory_cap.items()}
                self.memory_cap = None
            if self.rank == 0:
                self.queue.put(("record", 0, {**self._record(t, res, end, cpu_end), **evaluated}))
            del self.results[t.step]

    def evaluate(self, pipeline, after_step: int, start: bool = False) -> None:
        """Evaluate the model as step after_step left it (every rank, the same fixed batches; its update must have
        finished). The keys join that step's record; an evaluation before the run's first step joins the first
        record as eval_loss_start and eval_ppl_start (start). Its wall and CPU time are kept out of the step's."""
        t0, cpu0 = time.perf_counter(), (time.thread_time(), time.process_time())
        loss_sum, n = self.engine.eval_loss(after_step, pipeline.eval_batches())
        loss = loss_sum / n if n else None
        keys = {"eval_loss": loss, "eval_ppl": _perplexity(loss), "eval_tokens": n,
                "eval_s": time.perf_counter() - t0}
        if start:
            self.start_eval = keys
            return
        self.evals[after_step] = keys
        self.eval_cpu[after_step] = (time.thread_time() - cpu0[0], time.process_time() - cpu0[1])

    def _record(self, t, res, end: float, cpu_end: tuple[float, float]) -> dict:
        ev = t.events
        ev["stats"].synchronize()
        step_time = max(end - t.t_start, 1e-9)
        n_targets = float(t.target_tokens.item())
        loss = float(t.loss_sum.item()) / max(n_targets, 1.0)
        stats = t.stats.view(self.world, -1).tolist()  # per rank: RankEngine._step_figures
        tokens = t.tokens * self.world
        tflops = self.flops_tok * tokens / step_time / 1e12
        fwd = ev["start"].elapsed_time(ev["forward_end"]) / 1e3
        bwd = ev["forward_end"].elapsed_time(ev["backward_end"]) / 1e3
        return {
            "step": t.step,
            "loss": loss,
            "lr": lr_at(t.step, self.cfg.steps, self.cfg.optimizer, self.cfg.schedule),
            "grad_norm": res.grad_norm,
            "clipped": res.clipped,
            "update_skipped": res.skipped,
            "step_time_s": step_time,
            "tokens_per_s": tokens / step_time,
            "tflops": tflops,
            "mfu": (tflops / (self.peak * self.world)) if self.peak else None,
            "hbm_peak_gib": [row[3] / 2**30 for row in stats] if self.engine.streams.cuda else [],
            # each GPU's memory in use by every process, as the driver counts it (context and NCCL included)
            "hbm_device_used_gib": [row[4] / 2**30 for row in stats] if self.engine.streams.cuda else [],
            "alloc_retries": [row[5] for row in stats] if self.engine.streams.cuda else [],
            "host_rss_gib": None,  # filled by the launcher, which sees every rank process
            "data_time_s": t.data_s,
            "phases": {"data": t.data_s, "forward": fwd, "backward": bwd, "update_tail": t.update_tail_s,
                       "staging_wait": t.staging_wait_s, "update_busy": res.update_busy_s,
                       "update_cast_busy": res.cast_busy_s, "update_offcpu": res.offcpu_s},
            "cpu_s": {"issue": cpu_end[0] - t.cpu_start[0], "rank": cpu_end[1] - t.cpu_start[1]},
            "predicted": self.predicted,
            "bytes": {"h2d": [row[0] for row in stats], "d2h": [row[1] for row in stats],
                      "collective": [row[2] for row in stats]},
            "tokens": tokens,
            "target_tokens": int(n_targets),
        }


def _perplexity(loss: float | None) -> float | None:
    if loss is None:
        return None
    try:
        return math.exp(loss)
    except OverflowError:  # beyond ~709.78 nats
        return math.inf


class _Sender:
    def __init__(self, link):
        self.link = link

    def put(self, message) -> None:
        self.link.conn.send(message)


def run(args: RankArgs, link) -> None:
    """The rank's entry point (started by slidedp.launch through slidedp.ranks.Launch): a failure raises and
    reaches the launcher as an "error" message."""
    rank_main(link, args, _Sender(link))
