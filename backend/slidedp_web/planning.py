"""Plan preview in the API: the AutoPolicy dry run for a job on a given host, from that host's report.

No training and no torch: slidedp.planning.autopolicy.plan_job is fed the topology and calibration the
host's worker reported. A job keeps that plan (`summary`); `job_policy` reads a job's stored plan (JobRecord.plan) in
the one shape the API answers (docs/interfaces.md §5 and §6, JobPublic.policy).

The planner runs in a process of its own (`bounded_plan`), never on the API's threads: one that takes longer than
SLIDEDP_PLAN_TIMEOUT_S is killed and the request answered 503, and `stop_planning` (the server's Ctrl-C) kills
those in flight so that no request holds the shutdown.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from slidedp.config import JobConfig, PolicyConfig
from slidedp.planning import profiles
from slidedp.planning.autopolicy import plan_job
from slidedp.planning.forked import side_by_side
from slidedp.planning.shape import SCHEMA_VERSION, shape_differences
from slidedp.policy import ExecutionPolicy
from sqlmodel import Session, func, select

from slidedp_web import hosts
from slidedp_web.core.config import Settings
from slidedp_web.errors import Unavailable, Unprocessable
from slidedp_web.hosts import basic_topology, is_online, local_calibration
from slidedp_web.journal import clean_json
from slidedp_web.models import Host, JobRecord

log = logging.getLogger(__name__)
GIB = 2**30


def find_host(
    session: Session, settings: Settings, requested: Optional[str]
) -> tuple[Optional[Host], Optional[dict[str, str]]]:
    """(the named host, None) or (None, {"loc": "host", "msg"}) when no host has that name; without a name, the online
    host with the fewest queued and running jobs, else (None, None): the job goes to this deployment's default queue
    and waits for its worker."""
    hosts = session.exec(select(Host).order_by(Host.name)).all()
    if requested:
        for host in hosts:
            if host.name == requested:
                return host, None
        known = ", ".join(h.name for h in hosts) or "none has reported yet"
        return None, {"loc": "host", "msg": f"unknown worker host {requested!r}; hosts: {known}"}
    online = [h for h in hosts if is_online(settings, h)]
    if not online:
        return None, None

    def load(host: Host) -> int:
        return session.exec(
            select(func.count())
            .select_from(JobRecord)
            .where(JobRecord.queue == host.queue, JobRecord.status.in_(("queued", "running")))
        ).one()

    return min(online, key=load), None


@dataclass
class DeclaredHost:
    """A host described by a shipped hardware profile (POST /api/plan's `profile`): planned for, never run on. It
    stands where a reported Host would, with the profile's topology and no calibration records of its own."""

    profile: dict[str, Any]
    name: str = ""
    topology: dict[str, Any] = field(default_factory=dict)
    calibration: None = None

    def __post_init__(self) -> None:
        self.name = "declared:" + self.profile["name"]
        self.topology = profiles.declared_topology(self.profile)


def declared_host(body: Any) -> Optional[DeclaredHost]:
    """The shipped profile a plan request names under `profile`, taken out of the body (None without one). Only a
    shipped profile's name is accepted: the API never opens a path a request gives. A name no shipped profile has,
    or a profile next to a `host`, is a 422."""
    if not isinstance(body, dict) or body.get("profile") is None:
        if isinstance(body, dict):
            body.pop("profile", None)
        return None
    name = body.pop("profile")
    names = ", ".join(profiles.shipped())
    from slidedp_web.guards import shown  # quotes at most the first 80 characters of what was sent

    def refuse(msg: str) -> Unprocessable:
        return Unprocessable([{"loc": ["body", "profile"], "type": "value_error", "msg": msg}])

    if not isinstance(name, str):
        raise refuse(f"must be a shipped profile's name (GET /api/profiles), got {shown(name)}; the shipped ones: {names}")
    if body.get("host"):
        raise refuse("plans for a declared host instead of a reported one: give `host` or `profile`, not both")
    try:
        return DeclaredHost(profiles.load(name, allow_path=False))
    except profiles.ProfileError:
        raise refuse(
            f"{shown(name)} is not a shipped profile; the API takes a shipped profile's name, never a file path: "
            f"one of {names} (GET /api/profiles)"
        ) from None


def host_ram_bytes(host: Optional[Host]) -> Optional[int]:
    """The target host's RAM as its worker reported it (None: this machine's own limit applies)."""
    return hosts.host_ram_bytes(host.topology) if host is not None else None


def job_shape(cfg: JobConfig) -> dict[str, Any]:
    """The shape a calibration was measured at (slidedp.planning.calibration's header "shape")."""
    from slidedp.planning.shape import calibration_shape
    from slidedp.presets import model_config_dict

    return calibration_shape(cfg, model_config_dict(cfg.model))


def calibration_entries(report: Optional[dict[str, Any]]) -> list[dict[str, Any]]:
    """A host's calibration records (§5) as the planner reads them: each upgraded where an older runtime wrote its
    shape without fields its model's config gives (`shape_upgraded`), or marked `outdated` with the reason."""
    from slidedp.planning.shape import upgrade_calibration

    if not report:
        return []
    entries = report.get("entries") if "entries" in report else [report]
    return [upgrade_calibration(e) for e in entries or [] if isinstance(e, dict)]


def calibration_choice(
    cfg: JobConfig, report: Optional[dict[str, Any]], topology: Optional[dict[str, Any]] = None
) -> tuple[Optional[dict[str, Any]], dict[str, Any]]:
    """(the calibration the plan uses or None, the plan's `calibration_match`: which record was used, or why each
    of the host's records was not, and the command that measures the job's shape)."""
    try:
        shape = job_shape(cfg)
    except (OSError, KeyError, ValueError):
        return None, {"used": None, "why_not": [], "run": None}
    device = "cuda" if cfg.gpus > 0 else "cpu"
    matches, why_not = [], []
    for e in calibration_entries(report):
        if e.get("outdated"):
            reasons = [e["outdated"]]
        else:
            reasons = shape_differences(shape, e.get("shape") or {})
            if e.get("world") != cfg.world_size:
                reasons.append(f"{e.get('world')} ranks, not {cfg.world_size}")
            if e.get("device") != device:
                reasons.append(f"measured on {e.get('device')}, not {device}")
            if topology is not None and device == "cuda" and "p2p_disabled" in topology:
                if bool(e.get("p2p_disabled")) != bool(topology["p2p_disabled"]):
                    on_off = ("off", "on") if e.get("p2p_disabled") else ("on", "off")
                    reasons.append(f"measured with GPU peer-to-peer {on_off[0]}, this host has it {on_off[1]}")
        if reasons:
            why_not.append({"record": record_header(e), "why": reasons})
        else:
            matches.append(e)
    # `slidedp bench --plan-only` calibrates a bf16 GPU shape; any other job is calibrated by planning its config
    run = (
        f"slidedp bench --model {cfg.model} --gpus {cfg.gpus} --mbs {cfg.micro_batch_size} --seq {cfg.seq_len} "
        "--plan-only"
        if cfg.gpus > 0 and cfg.precision == "bf16"
        else "slidedp plan --config JOB.yaml (this job's config: planning it calibrates the host at its shape)"
    )
    if not matches:
        return None, {"used": None, "why_not": why_not, "run": run}
    chosen = max(matches, key=lambda e: (not e.get("quick"), str(e.get("created_at", ""))))
    return chosen, {"used": record_header(chosen), "why_not": [], "run": None}


def record_header(entry: dict[str, Any]) -> dict[str, Any]:
    """What a person needs to recognise a calibration record: when and by what it was measured, and its shape."""
    keys = ("key", "created_at", "schema", "quick", "world", "device", "interconnect", "shape", "shape_upgraded")
    return {**{k: entry.get(k) for k in keys}, "software": entry.get("software"), "current_schema": SCHEMA_VERSION}


def plan_preview(cfg: JobConfig, host: Optional[Host], settings: Settings) -> dict[str, Any]:
    """The plan JSON (docs/interfaces.md §5) for the job on that host, with the host's name under "host" and which
    calibration priced it (or why none of the host's could) under "calibration_match". On a declared host the
    calibration is the profile's (planning/profiles.py), whatever this deployment's hosts have measured."""
    if isinstance(host, DeclaredHost):
        declared = profiles.declared_calibration(cfg, host.profile) if cfg.gpus > 0 else None
        plan = bounded_plan(cfg, host.topology, declared, settings.plan_timeout_s)
        plan["host"] = host.name
        plan["calibration_match"] = {"used": None, "why_not": [], "run": None,
                                     "declared": profiles.declared_marker(host.profile)}
        return plan
    topology = host.topology if host and host.topology else basic_topology(settings)
    calibration, match = calibration_choice(
        cfg, host.calibration if host else local_calibration(settings), topology
    )
    plan = bounded_plan(cfg, topology, calibration, settings.plan_timeout_s)  # with the card sweep
    plan.setdefault("host", host.name if host else settings.host_name)
    plan["calibration_match"] = clean_json(match)
    return plan


# ------------------------------------------------------------------------------- planning off the API threads
# A forkserver, not fork: the API process has threads (the server's pool, the database's), and a fork of it
# could inherit a lock held by one of them. The forkserver is one clean process that has imported the planner
# once; each plan is a fork of it, a few milliseconds.
_lock = threading.Lock()
_context: Optional[Any] = None
_running: set[Any] = set()  # planning processes in flight
_closed = threading.Event()  # the server is stopping: no new planning
_slots = threading.BoundedSemaphore(max(2, os.cpu_count() or 2))  # planning processes at once


def _planning_context() -> Any:
    global _context
    with _lock:
        if _context is None:
            _context = multiprocessing.get_context("forkserver")
            _context.set_forkserver_preload(["slidedp_web.planning"])
        return _context


def _plan_in_child(conn: Any, cfg: JobConfig, topology: dict[str, Any], calibration: Optional[dict[str, Any]]) -> None:
    try:
        with side_by_side():  # a fork of the forkserver, with no other thread: its searches may fork again
            plan = plan_job(cfg, topology, calibration, sweep=True)
        conn.send(("plan", clean_json(plan)))
    except Exception as exc:  # noqa: BLE001 - the API says what the planner raised
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _stopping() -> Unavailable:
    return Unavailable("the server is stopping; the plan was not made: send the request again once it is up")


def bounded_plan(
    cfg: JobConfig, topology: dict[str, Any], calibration: Optional[dict[str, Any]], timeout_s: float
) -> dict[str, Any]:
    """plan_job(..., sweep=True) in a planning process, within timeout_s (waiting for a free slot included):
    the plan JSON; Unavailable (503) when the deadline passes or the server stops first (the process is
    killed); RuntimeError with the planner's own error when it raised."""
    deadline = time.monotonic() + timeout_s
    if not _slots.acquire(timeout=timeout_s):
        raise _too_long(cfg, timeout_s, busy=True)
    try:
        ctx = _planning_context()
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_plan_in_child, args=(send, cfg, topology, calibration), name="slidedp-plan",
                           daemon=True)
        with _lock:
            if _closed.is_set():
                receive.close()
                send.close()
                raise _stopping()
            proc.start()
            _running.add(proc)
        send.close()
        try:
            # poll also answers at once when the process dies (killed by stop_planning): recv then finds EOF
            if not receive.poll(max(0.0, deadline - time.monotonic())):
                raise _too_long(cfg, timeout_s)
            try:
                kind, value = receive.recv()
            except EOFError:
                if _closed.is_set():
                    raise _stopping() from None
                proc.join(1)
                raise RuntimeError(f"the planning process ended without a plan (exit code {proc.exitcode})") from None
        finally:
            proc.kill()
            proc.join()
            receive.close()
            with _lock:
                _running.discard(proc)
    finally:
        _slots.release()
    if kind == "error":
        raise RuntimeError(value)
    return value


def _too_long(cfg: JobConfig, timeout_s: float, busy: bool = False) -> Unavailable:
    what = "no planning slot came free" if busy else "planning this job did not finish"
    return Unavailable(
        f"{what} within SLIDEDP_PLAN_TIMEOUT_S = {timeout_s:g} s and it was stopped; nothing was created. "
        f"A plan's work grows with the model's layers ({cfg.model}) and the policy keys left on auto: fix some "
        "(policy.activations, policy.window, policy.delivery) or use a smaller model to plan faster, or ask the "
        "operator for a longer SLIDEDP_PLAN_TIMEOUT_S"
        + ("; other plans were being made, try again shortly" if busy else ""),
    )


def stop_planning() -> None:
    """No new planning, and every planning process in flight killed: their requests answer 503 at once, so a
    server that is stopping has no request to wait for."""
    with _lock:
        _closed.set()
        running = list(_running)
    for proc in running:
        proc.kill()


HEADROOM = 0.9  # a plan using more of a memory budget than this leaves little room: a warning


def plan_warnings(plan: dict[str, Any]) -> list[dict[str, str]]:
    """[{"loc", "msg"}] for a feasible plan that fits with little room to spare: its GPU memory peak or its host
    RAM above HEADROOM of what the job may use."""
    if not plan.get("feasible"):
        return []
    pred, job = plan.get("predicted") or {}, plan.get("job") or {}
    out = []
    for used_key, limit_key, loc, what, advice in (
        ("hbm_peak_gib", "hbm_budget_gib", "micro_batch_size", "GPU memory peak",
         "a smaller micro_batch_size or seq_len, or more GPUs, leave more"),
        ("host_ram_gib", "host_limit_gib", "host_ram_gib", "host RAM",
         "other processes on the host may run it out of memory; fewer ranks or a host with more memory leave more"),
    ):
        used, limit = pred.get(used_key), job.get(limit_key)
        if not (isinstance(used, (int, float)) and isinstance(limit, (int, float)) and limit > 0):
            continue
        if used >= HEADROOM * limit:
            out.append(
                {
                    "loc": loc,
                    "msg": f"little headroom: the plan's {what} is {used:.1f} GiB of the {limit:.1f} GiB the job "
                    f"may use ({used / limit:.0%}); {advice}",
                }
            )
    return out


def summary(plan: dict[str, Any]) -> dict[str, Any]:
    """What a job keeps of its plan: the plan itself (it is small) marked as the preview made at creation."""
    return {**plan, "stage": "planned"}


def unplanned(failure: Optional[str]) -> Optional[dict[str, Any]]:
    """What a job keeps when its plan preview failed (None: no preview was asked for): the planner's error, shown
    with the job's policy, and a warning the plan view lists. Its worker plans the job again when it starts."""
    if failure is None:
        return None
    return {
        "stage": "unplanned",
        "plan_error": failure,
        "warnings": [{"loc": "policy", "msg": f"the plan preview failed ({failure}); the job was accepted "
                      "and its worker plans it when it starts, failing the job if the planner fails there too"}],
    }


# ------------------------------------------------------------------------------------------- stored policy
# Rows stored before a run's resolved policy had a shape of its own ("stage": "resolved" with "policy") hold the
# run's policy at the top level of the plan. Their keys are the resolved policy's (ExecutionPolicy's fields), next
# to echoes of the config's policy section (PolicyConfig's knobs, retired ones included) and the runtime's own plan
# under "plan". Both lists come from the runtime, the one definition of a policy.
RESOLVED_POLICY_KEYS = tuple(f.name for f in dataclasses.fields(ExecutionPolicy))
RETIRED_POLICY_KEYS = tuple(PolicyConfig.RETIRED)
LEGACY_RUN_KEYS = frozenset(
    (*RESOLVED_POLICY_KEYS, *(f.name for f in dataclasses.fields(PolicyConfig)), *RETIRED_POLICY_KEYS, "plan")
)
# What a run that predates a knob ran with: the one behaviour there was before the knob existed.
POLICY_BEFORE_KNOB = {"delivery_cast": "host", "edge_update": "host", "device_layers": 0}


def _without_retired(policy: Any) -> Any:
    return (
        {k: v for k, v in policy.items() if k not in RETIRED_POLICY_KEYS}
        if isinstance(policy, dict)
        else policy
    )


def _holds_legacy_run(stored: dict[str, Any]) -> bool:
    """Whether a stored plan carries a legacy run's policy keys at its top level (see job_policy)."""
    return "delivery" in stored or "activations" in stored


def _resolved_today(stored: dict[str, Any]) -> bool:
    """Whether today's finish wrote the row's last run: `"stage": "resolved"` with the ExecutionPolicy under
    "policy". No legacy run wrote that stage (it wrote its policy keys and "plan"; its "stage" and "policy" are the
    submit-time preview's), so a row holding both shapes was resumed since, and this marks the newest run."""
    return stored.get("stage") == "resolved" and isinstance(stored.get("policy"), dict)


def in_todays_shape(stored: Any) -> Any:
    """The stored plan a new run's resolved plan is merged into (outcome.finish): a legacy row read into today's
    shape first, so that the old run's top-level keys do not outlive the run that replaces them; any other row as
    it is."""
    if isinstance(stored, dict) and _holds_legacy_run(stored):
        return job_policy(stored)
    return stored


def job_policy(stored: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """A job's stored plan (JobRecord.plan, the jobs table's `policy` column) as the API answers it (JobPublic.policy): the plan made at submit time
    (`"stage": "planned"`), or after a run that plan with `"stage": "resolved"` and `policy` the ExecutionPolicy
    the engine ran.

    The legacy reader: rows a finished run wrote before the resolved policy had a shape of its own (before
    ExecutionPolicy, 2026-12-02) hold the run's policy keys at the top level of the plan (delivery, activations,
    ..., reduce_dtype, echoes of the config's keep_layers / offload_layers / resident_units, and the runtime's own
    plan under "plan"). No migration rewrote them and docs/interfaces.md §6 promises them in today's shape, so they
    are read into it here, the resolved keys in the order the run wrote them. A run that predates a knob
    (delivery_cast, edge_update, device_layers) ran with the behaviour that was the only one then; one that
    predates staging_slots shows none. `reduce_dtype` is dropped everywhere: fp32 is the only reduction.

    A legacy row resumed by a finish that merged today's resolved plan into it (before outcome.finish read the row
    into today's shape first) holds both shapes: the newest run's resolved policy is answered, and the old run's
    keys at the top level are dropped. Preferring the new shape in the reader, rather than only fixing the writer,
    keeps those rows answering the policy their last run ran with; no migration is needed."""
    if not isinstance(stored, dict):
        return stored
    if _holds_legacy_run(stored) and not _resolved_today(stored):
        plan = {k: v for k, v in stored.items() if k not in LEGACY_RUN_KEYS}
        if not plan and isinstance(stored.get("plan"), dict):
            plan = dict(stored["plan"])  # no plan was kept at submit time: the one the run made
        policy = {k: v for k, v in stored.items() if k in RESOLVED_POLICY_KEYS}  # in the order the run wrote them
        policy.update({k: v for k, v in POLICY_BEFORE_KNOB.items() if k not in stored})
        out = {**plan, "stage": "resolved", "policy": policy}
    else:
        # today's shape; a row holding both shapes loses the old run's keys
        out = {k: v for k, v in stored.items() if k not in LEGACY_RUN_KEYS} if _holds_legacy_run(stored) else dict(stored)
        if "policy" in out:
            out["policy"] = _without_retired(out["policy"])
    if isinstance(out.get("candidates"), list):
        out["candidates"] = [
            {**c, "policy": _without_retired(c.get("policy"))} if isinstance(c, dict) and "policy" in c else c
            for c in out["candidates"]
        ]
    return out
