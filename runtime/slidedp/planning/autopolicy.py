"""AutoPolicy: choose the execution policy of a job — routes, window, transfer chunk, loss chunk, per-layer
activation placement and weight residency — from the cost model, and say why.

Imports no torch (the web API previews plans). `slidedp plan --config job.yaml` prints format_plan(plan_job(...)).

    plan = plan_job(cfg, topology, calibration)      # calibration None -> memory fit only, no times
    print(format_plan(plan))

The activation mix and residency follow the paper's marginal pipeline cost (planning/marginal.py, with our
reading of it); routes and knobs are compared by the overlap model's predicted step time; a job that cannot fit
is refused as planning/refusals.py words it. docs/planning.md has the details.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from slidedp.config import PolicyConfig
from slidedp.planning.bound import bound
from slidedp.planning.cost_model import (
    GIB,
    PHASES,
    Job,
    Rates,
    Uncalibrated,
    offload_backlog,
    predict,
)
from slidedp.planning.marginal import MixSearch
from slidedp.planning.memory_model import ALLOCATOR_SLACK, ActivationSizes, memory
from slidedp.planning.refusals import Infeasible, Refusals
from slidedp.planning.report import format_plan, shortlist
from slidedp.policy import ExecutionPolicy

WINDOWS = (2, 3, 4, 6)
CHUNKS_MB = (16, 64, 256)
LOSS_CHUNKS = (1024, 2048, 4096, 8192)
__all__ = ["basis_change", "format_plan", "metrics_prediction", "plan_basis", "plan_job"]
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PolicyConfig)}


def plan_job(cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None) -> dict[str, Any]:
    """The plan for a job on a host (docs/interfaces.md §5): chosen policy, prediction, candidates, why, and the
    basis it was made on (plan_basis), so that a later run can tell whether it still holds."""
    plan = _plan(cfg, topology, calibration)
    plan["basis"] = plan_basis(cfg, topology, calibration)
    return plan


def _plan(cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None) -> dict[str, Any]:
    try:
        job = Job.from_config(cfg, topology)
    except (KeyError, OSError, ValueError, TypeError) as exc:
        return _refusal([{"loc": "model", "msg": f"cannot size the model: {exc}"}], "missing")
    if cfg.gpus > len(topology.get("gpus", [])):
        n = len(topology.get("gpus", []))
        return _refusal(
            [
                {
                    "loc": "gpus",
                    "msg": f"asks for {cfg.gpus} GPUs but this host has {n}; "
                    f"set gpus to at most {n} (0 trains on the CPU)",
                }
            ],
            "missing",
        )
    rates, note = None, "no calibration given: memory fit only, no step times"
    if calibration:
        try:
            if (calibration.get("device") == "cuda") != job.on_gpu:
                raise Uncalibrated(
                    f"measured on {calibration.get('device')}, the job runs on {'cuda' if job.on_gpu else 'cpu'}"
                )
            rates, note = Rates(calibration, job), "measured on this host"
        except (Uncalibrated, KeyError, TypeError) as exc:
            note = f"calibration unusable ({exc}): memory fit only, no step times"
    planner = _Planner(cfg, job, rates, ActivationSizes.of(job, calibration))
    try:
        plan = planner.run()
    except Infeasible as exc:
        out = _refusal(exc.errors, "measured" if rates else "missing")
        out["calibration_note"] = note
        out["job"] = planner.job_summary()
        return out
    if rates and not planner.rates:
        note = "the calibration lacks figures every route needs: memory fit only, no step times"
    if planner.rates:
        plan["host_update"] = planner.rates.host_update_summary()
    plan["calibration"] = "measured" if planner.rates else "missing"
    plan["calibration_note"] = note
    return plan


# ------------------------------------------------------------------------------------------------ basis
# The part of a topology each digest in basis["topology_parts"] covers, as a re-plan names it.
TOPOLOGY_PARTS = {"gpus": "GPUs", "links": "GPU links", "cpu_cores": "CPU cores", "host_ram_limit_bytes": "RAM limit"}


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def topology_facts(cfg: Any, topology: dict[str, Any] | None) -> dict[str, Any]:
    """What a plan takes from a host's topology (docs/interfaces.md §4), and nothing that changes between two
    reports of one unchanged host: each GPU's name and memory, the links between GPUs (kind, P2P), the usable CPU
    cores, and the host RAM limit the job plans against (its own host_ram_gib where it sets one, as the planner
    takes it). Left out: hostname, timestamps, free shared memory, PCIe link speeds (a GPU lowers them when idle),
    software versions, NUMA placement and the limit's source."""
    topology = topology or {}
    gpus = [
        {"name": g.get("name"), "hbm_bytes": g.get("hbm_bytes")}
        for g in topology.get("gpus") or []
        if isinstance(g, dict)
    ]
    links = sorted(
        (
            {"a": lk.get("a"), "b": lk.get("b"), "kind": lk.get("kind"), "p2p": bool(lk.get("p2p"))}
            for lk in topology.get("links") or []
            if isinstance(lk, dict)
        ),
        key=lambda lk: (str(lk["a"]), str(lk["b"])),
    )
    cpu = topology.get("cpu") if isinstance(topology.get("cpu"), dict) else {}
    if getattr(cfg, "host_ram_gib", None) is not None:
        ram = int(cfg.host_ram_gib * GIB)  # as Job.from_config takes it: the host's own figure does not count
    else:
        host_ram = topology.get("host_ram") if isinstance(topology.get("host_ram"), dict) else {}
        ram = int(host_ram.get("limit_bytes") or 0)
    return {"gpus": gpus, "links": links, "cpu_cores": cpu.get("cores"), "host_ram_limit_bytes": ram}


def calibration_identity(calibration: dict[str, Any] | None) -> Any:
    """Which calibration a plan was priced with: its header (when it was measured, for which shape, world and
    device, under which cache key), or its whole content when it has no header; None without one."""
    if not calibration:
        return None
    if calibration.get("created_at"):
        return {k: calibration.get(k) for k in ("key", "created_at", "shape", "world", "device", "quick")}
    return calibration


def plan_basis(cfg: Any, topology: dict[str, Any] | None, calibration: dict[str, Any] | None) -> dict[str, Any]:
    """{"topology": digest, "calibration": digest or None, "topology_parts": {part: digest}}: sha256 (first 16 hex
    digits) of the canonical JSON of topology_facts and calibration_identity. Two reports of one unchanged host
    give the same basis; a plan whose basis equals the one a run computes is the plan that run would make."""
    facts = topology_facts(cfg, topology)
    ident = calibration_identity(calibration)
    return {
        "topology": _digest(facts),
        "calibration": None if ident is None else _digest(ident),
        "topology_parts": {k: _digest(facts[k]) for k in TOPOLOGY_PARTS},
    }


def basis_change(stored: Any, current: dict[str, Any]) -> str | None:
    """Why a plan made on basis `stored` does not hold on basis `current` (both plan_basis's), None when it does."""
    if not isinstance(stored, dict) or "topology" not in stored or "calibration" not in stored:
        return "the stored plan has no basis"
    why = []
    if stored["topology"] != current["topology"]:
        before, now = stored.get("topology_parts") or {}, current.get("topology_parts") or {}
        changed = [name for key, name in TOPOLOGY_PARTS.items() if key in before and before[key] != now.get(key)]
        what = f"the host's {_and(changed)}" if changed else "the host"
        why.append(f"{what} changed since the job was planned")
    if stored["calibration"] != current["calibration"]:
        if stored["calibration"] is None:
            why.append("a calibration for this shape exists now")
        elif current["calibration"] is None:
            why.append("the job was planned with a calibration this run does not use")
        else:
            why.append("the calibration for this shape changed since the job was planned")
    return "; ".join(why) or None


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def metrics_prediction(plan: dict[str, Any]) -> dict[str, float]:
    """The `predicted` entry of every metrics record: {phase: s, "forward_span": s, "backward_span": s,
    "step_time_s": s}, {} without times."""
    pred = (plan or {}).get("predicted") or {}
    if pred.get("step_time_s") is None:
        return {}
    spans = pred.get("spans") or {}
    return {
        **{p: float(pred["phases"].get(p, 0.0)) for p in PHASES},
        **{f"{k}_span": float(v) for k, v in spans.items()},
        "step_time_s": float(pred["step_time_s"]),
    }


def _refusal(errors: list[dict[str, str]], calibration: str) -> dict[str, Any]:
    return {
        "feasible": False,
        "policy": None,
        "predicted": None,
        "candidates": [],
        "marginal": None,
        "why": "not feasible: " + "; ".join(f"{e['loc']}: {e['msg']}" for e in errors),
        "errors": errors,
        "calibration": calibration,
    }


class _Planner(MixSearch, Refusals):
    def __init__(self, cfg: Any, job: Job, rates: Rates | None, acts: ActivationSizes):
        self.cfg, self.job, self.rates, self.acts = cfg, job, rates, acts
        p = cfg.policy
        self.user = {
            k: getattr(p, k)
            for k in _DEFAULTS
            if getattr(p, k) not in ("auto", None)
            and (
                k
                in (
                    "delivery",
                    "grad_reduce",
                    "activations",
                    "keep_layers",
                    "offload_layers",
                    "resident_units",
                )
                or getattr(p, k) != _DEFAULTS[k]
            )
        }
        self.sims: dict[ExecutionPolicy, dict[str, Any]] = {}

    # ------------------------------------------------------------------ summaries
    def job_summary(self) -> dict[str, Any]:
        j = self.job
        return {
            "world": j.world,
            "params": j.params,
            "layers": j.layers,
            "tokens_per_step": j.tokens_per_step,
            "interconnect": j.interconnect,
            "on_gpu": j.on_gpu,
            "cpu_threads_per_rank": j.cpu_threads,
            "hbm_budget_gib": j.hbm_budget / GIB if j.hbm_budget else None,
            "host_limit_gib": j.host_limit_bytes / GIB,
            "host_limit_source": j.host_limit_source,
            "activation_sizes": "measured" if self.acts.measured else "estimated (no calibration)",
        }

    # ------------------------------------------------------------------ memory
    def mem(self, pol: ExecutionPolicy) -> dict[str, Any]:
        return memory(self.job, pol, self.acts, offload_backlog(self.job, pol, self.rates))

    def fits(self, pol: ExecutionPolicy) -> str | None:
        """None when the policy fits; else what does not, by how much."""
        m, j = self.mem(pol), self.job
        if j.on_gpu and m["hbm_peak_bytes"] > j.hbm_budget:
            return (
                f"needs {m['hbm_peak_bytes'] / GIB:.1f} GiB of HBM per GPU, "
                f"{(m['hbm_peak_bytes'] - j.hbm_budget) / GIB:.1f} GiB over the budget of {j.hbm_budget / GIB:.1f} GiB"
            )
        if m["host_bytes"] > j.host_limit_bytes:
            return (
                f"needs {m['host_bytes'] / GIB:.1f} GiB of host RAM, "
                f"{(m['host_bytes'] - j.host_limit_bytes) / GIB:.1f} GiB more than the {j.host_limit_bytes / GIB:.1f} GiB available"
            )
        return None

    # ------------------------------------------------------------------ time
    def time(self, pol: ExecutionPolicy) -> float:
        if pol not in self.sims:
            self.sims[pol] = predict(self.job, pol, self.rates)
        return self.sims[pol]["step_time_s"]

    # ------------------------------------------------------------------ choices
    def edges(self) -> list[str]:
        """Where the embedding and head may be updated: as configured, or both places under `auto`."""
        choice = self.cfg.policy.edge_update
        return ["host", "gpu"] if choice == "auto" else [choice]

    def device_counts(self, grad: str) -> list[int]:
        """How many leading layers to try updating on the GPUs: as configured, or (None: the planner's) a few
        counts up to every layer when gradients are reduced on the GPUs and there are times to compare."""
        n = self.cfg.policy.device_layers
        L = self.job.layers
        if n is not None:
            return [min(n, L)]
        if not self.rates or (self.job.world > 1 and grad != "gpu"):
            return [0]
        return sorted({0, L // 4, L // 2, (3 * L) // 4, L})

    def routes(self) -> list[tuple[str, str, str]]:
        """(delivery, gradient route, edge update) triples to compare; a device edge update needs gpu reduction."""
        if self.job.world == 1:
            return [("replicated", "host", e) for e in self.edges()]
        dl = [self.user["delivery"]] if "delivery" in self.user else ["sharded", "replicated"]
        gr = [self.user["grad_reduce"]] if "grad_reduce" in self.user else ["gpu", "host"]
        if self.cfg.policy.edge_update == "gpu" or self.cfg.policy.device_layers:
            gr = ["gpu"]
        return [(a, b, e) for a in dl for b in gr for e in self.edges() if e == "host" or b == "gpu"]

    def knob(self, name: str, options: tuple[int, ...]) -> list[int]:
        if name in self.user:
            return [self.user[name]]
        return list(options) if self.rates else [_DEFAULTS[name]]

    def fixed_mix(self) -> dict[str, int]:
        """Counts the user fixed: activations for every layer, keep/offload layer counts, resident layers."""
        L, u, out = self.job.layers, self.user, {}
        if "activations" in u:
            out.update(
                keep=L if u["activations"] == "keep" else 0, offload=L if u["activations"] == "offload" else 0
            )
        else:
            if "keep_layers" in u:
                out["keep"] = min(u["keep_layers"], L)
            if "offload_layers" in u:
                out["offload"] = min(u["offload_layers"], L - out.get("keep", 0))
        if "resident_units" in u:
            out["resident"] = min(u["resident_units"], L)
        return out

    def base(
        self,
        delivery: str,
        grad: str,
        window: int,
        chunk: int,
        loss_chunk: int,
        mix: dict[str, int],
        edge: str = "host",
        device_layers: int = 0,
    ) -> ExecutionPolicy:
        fixed = self.fixed_mix()
        n = {k: fixed.get(k, mix.get(k, 0)) for k in ("keep", "offload", "resident")}
        return ExecutionPolicy.mix(
            self.job.layers,
            n["keep"],
            n["offload"],
            n["resident"],
            delivery=delivery,
            grad_reduce=grad,
            delivery_cast=self.cfg.policy.delivery_cast,
            window=window,
            chunk_mb=chunk,
            loss_chunk_tokens=loss_chunk,
            edge_update=edge,
            device_layers=min(device_layers, self.job.layers),  # the config may ask for more than the model has
        )

    # ------------------------------------------------------------------ the search
    def run(self) -> dict[str, Any]:
        j = self.job
        loss_chunks = [
            c for c in self.knob("loss_chunk_tokens", LOSS_CHUNKS) if c <= max(j.tokens_per_micro_batch, 1)
        ]
        loss_chunks = loss_chunks or [min(LOSS_CHUNKS)]
        default_loss = min(loss_chunks, key=lambda c: abs(c - _DEFAULTS["loss_chunk_tokens"]))
        default_window = self.user.get("window", _DEFAULTS["window"])
        default_chunk = self.user.get("chunk_mb", _DEFAULTS["chunk_mb"])
        self.check_minimum(default_window, default_chunk, loss_chunks)
        if not self.rates:
            return self.memory_only(default_window, default_chunk, default_loss)
        candidates: list[dict[str, Any]] = []
        best: tuple[float, ExecutionPolicy, dict] | None = None
        untimed = []
        for delivery, grad, edge in self.routes():
            for n_dev in self.device_counts(grad):
                start = self.base(delivery, grad, default_window, default_chunk, default_loss, {}, edge, n_dev)
                if self.fits(start) is not None and n_dev:
                    continue  # the layers' device state alone does not fit: fewer layers were tried
                try:
                    pol, marginal = self.solve_mix(start)
                except Uncalibrated as exc:  # e.g. collectives not measured: this route cannot be priced
                    label = f"{delivery}/{grad}{'/edge-gpu' if edge == 'gpu' else ''}"
                    label += f"/{n_dev} device layers" if n_dev else ""
                    untimed.append(f"{label} not timed ({exc})")
                    continue
                candidates.append(self.candidate(pol))
                rank = (self.fits(pol) is not None, self.time(pol))  # a plan that fits beats one that does not
                if best is None or rank < best[0]:
                    best = (rank, pol, marginal)
        if best is None:
            self.rates = None
            plan = self.memory_only(default_window, default_chunk, default_loss)
            plan["why"] += " " + "; ".join(untimed) + "."
            return plan
        _, pol, marginal = best
        # knobs around the best route and mix, defaults first (a change must beat them by 0.1%): window depth,
        # transfer chunk, and the loss chunk (a smaller one frees HBM that kept activations can use)
        for w in self._defaults_first("window", self.knob("window", WINDOWS)):
            for c in self._defaults_first("chunk_mb", self.knob("chunk_mb", CHUNKS_MB)):
                for lc in self._defaults_first("loss_chunk_tokens", loss_chunks):
                    alt = dataclasses.replace(pol, window=w, chunk_mb=c, loss_chunk_tokens=lc)
                    alt = self.refill(self.shrink_to_fit(alt), marginal)
                    if alt is None or alt == pol:
                        continue
                    candidates.append(self.candidate(alt))
                    # a change must be 0.1% faster, or make a plan that does not fit fit
                    if self.time(alt) < self.time(pol) * 0.999 or (self.fits(pol) is not None
                                                                   and self.fits(alt) is None):
                        pol = alt
        short = self.fits(pol)
        if short is not None:  # no route, mix or knob fits: never hand out an over-budget plan as feasible
            raise Infeasible([self.hbm_error(pol, self.mem(pol)) if "HBM" in short else {"loc": "model", "msg": short}])
        if "activations" not in self.user and "keep_layers" not in self.user:
            every = dataclasses.replace(pol, activations=("keep",) * j.layers)
            if self.fits(every) is not None:
                candidates.append(self.candidate(every))  # shows why not every layer keeps its activations
        plan = self.result(pol, candidates, marginal)
        if untimed:
            plan["why"] += " Routes left out: " + "; ".join(untimed) + "."
        return plan

    def _defaults_first(self, name: str, options: list[int]) -> list[int]:
        d = _DEFAULTS[name]
        return sorted(options, key=lambda v: (v != d, v))

    # ------------------------------------------------------------------ output
    def predicted(self, pol: ExecutionPolicy, exposure: bool = False) -> dict[str, Any]:
        m, j = self.mem(pol), self.job
        out: dict[str, Any] = {
            "step_time_s": None,
            "phases": {},
            "exposed": {},
            "tokens_per_s": None,
            "hbm_peak_gib": m["hbm_peak_bytes"] / GIB if j.on_gpu else None,
            "host_ram_gib": m["host_bytes"] / GIB,
            "hbm_parts_gib": {k: v * (1 + ALLOCATOR_SLACK) / GIB for k, v in m["hbm_parts"].items()}
            if j.on_gpu
            else {},
            "host_parts_gib": {k: v / GIB for k, v in m["host_parts"].items()},
        }
        if self.rates:
            p = predict(j, pol, self.rates, exposure=exposure)
            out.update(
                step_time_s=p["step_time_s"],
                phases=p["phases"],
                spans=p["spans"],
                tokens_per_s=p["tokens_per_s"],
                exposed=p.get("exposed", {}),
                busy=p["busy"],
            )
            if exposure:  # the chosen policy's physical bound from the same ceilings (docs/architecture.md §4)
                out["bound"] = bound(j, pol, self.rates)
        return out

    def candidate(self, pol: ExecutionPolicy) -> dict[str, Any]:
        why_not = self.fits(pol)
        return {
            "policy": _policy_out(pol),
            "predicted": self.predicted(pol),
            "fits": why_not is None,
            "why_not": why_not,
        }

    def memory_only(self, window: int, chunk: int, loss_chunk: int) -> dict[str, Any]:
        j = self.job
        grad = (
            "host"
            if j.world == 1
            else self.user.get("grad_reduce", "gpu" if j.interconnect in ("nvlink", "pcie-p2p") else "host")
        )
        delivery = (
            "replicated"
            if j.world == 1
            else self.user.get(
                "delivery", "sharded" if j.interconnect in ("nvlink", "pcie-p2p") else "replicated"
            )
        )
        edge = "gpu" if self.cfg.policy.edge_update == "gpu" else "host"
        n_dev = self.cfg.policy.device_layers or 0
        if (edge == "gpu" or n_dev) and j.world > 1:
            grad = "gpu"
        pol = self.base(delivery, grad, window, chunk, loss_chunk, {}, edge, n_dev)
        why_not = self.fits(pol)
        if why_not is not None:
            raise Infeasible([self.hbm_error(pol, self.mem(pol))])
        why = [
            "No calibration: this plan checks memory only and predicts no times (run `slidedp bench` or a job "
            "on the host to calibrate)."
        ]
        why.append(self.route_why(pol, None))
        why.append(
            "Activations: "
            + (
                "as configured."
                if self.fixed_mix()
                else "every layer checkpointed (without times the planner does not trade HBM for speed)."
            )
        )
        return self.result(pol, [self.candidate(pol)], None, why=why)

    def route_why(self, pol: ExecutionPolicy, table: dict | None) -> str:
        j = self.job
        if not j.on_gpu:
            return (
                f"CPU training with {j.world} rank(s) over gloo: {pol.delivery} delivery, {pol.grad_reduce} "
                "gradient reduction; no copy streams, so copies and collectives run in each rank's thread."
            )
        if j.world == 1:
            return (
                "1 rank: nothing to share or reduce — each unit goes to the GPU whole and its gradient comes "
                "back whole (routes are trivially replicated / host)."
            )
        src = (
            "as configured"
            if ("delivery" in self.user and "grad_reduce" in self.user)
            else ("by predicted step time" if table else f"by topology rule ({j.interconnect} between GPUs)")
        )
        link = {
            "nvlink": "NVLink with P2P",
            "pcie-p2p": "PCIe P2P",
            "pcie-host": "no P2P: collectives cross host memory",
        }.get(j.interconnect, j.interconnect)
        on_gpu = (["the embedding and head"] if pol.edge_units_on_gpu else []) + (
            [f"layers 1-{pol.device_layers}"] if pol.device_layers else []
        )
        edge = f" Updated on the GPUs: {' and '.join(on_gpu)}." if on_gpu else ""
        return f"Routes ({link}): {pol.delivery} delivery, {pol.grad_reduce} gradient reduction, {src}.{edge}"

    def result(
        self, pol: ExecutionPolicy, candidates: list[dict], marginal: dict | None, why: list[str] | None = None
    ) -> dict:
        pred = self.predicted(pol, exposure=bool(self.rates))
        seen, unique = set(), []
        for c in sorted(candidates, key=lambda c: (not c["fits"], c["predicted"]["step_time_s"] or 0.0)):
            p, t = c["policy"], c["predicted"]["step_time_s"]
            # candidates the model cannot tell apart (e.g. transfer chunks on a link without chunk overhead)
            key = (
                p["delivery"],
                p["grad_reduce"],
                p["edge_update"],
                p["device_layers"],
                p["window"],
                p["loss_chunk_tokens"],
                tuple(p["activations"]),
                tuple(p["resident"]),
                None if t is None else round(t, 4),
            )
            if key not in seen:
                seen.add(key)
                unique.append(c)
        if why is None:
            why = self.explain(pol, pred, unique, marginal)
        return {
            "feasible": True,
            "policy": _policy_out(pol),
            "predicted": pred,
            "candidates": shortlist(unique, 24),
            "why": " ".join(why),
            "errors": [],
            "marginal": marginal,
            "job": self.job_summary(),
        }

    def explain(self, pol: ExecutionPolicy, pred: dict, cands: list[dict], marginal: dict | None) -> list[str]:
        j, why = self.job, []
        routes = {}
        for c in cands:
            p = c["policy"]
            key = (p["delivery"], p["grad_reduce"] + ("/edge-gpu" if p["edge_update"] == "gpu" else ""))
            if c["fits"] and (key not in routes or c["predicted"]["step_time_s"] < routes[key]):
                routes[key] = c["predicted"]["step_time_s"]
        why.append(self.route_why(pol, routes))
        if len(routes) > 1:
            why.append(
                "Best step time per route: "
                + ", ".join(
                    f"{d}/{g} {t:.3f} s" for (d, g), t in sorted(routes.items(), key=lambda kv: kv[1])
                )
                + "."
            )
        c = pol.counts()
        mix = f"{c['keep']} keep, {c['offload']} offload, {c['checkpoint']} checkpoint; {sum(pol.resident)} resident"
        if marginal and marginal.get("delta_s"):
            d = marginal["delta_s"]
            terms = ", ".join(f"{k} {v * 1e3:+.1f} ms" for k, v in d.items())
            why.append(
                f"Activations: {mix} (per layer, switching from checkpoint changes the step by {terms}; "
                f"a layer saves {marginal['k_bytes'] / GIB:.2f} GiB of activations)."
            )
        else:
            why.append(f"Activations: {mix}" + (" (as configured)." if self.fixed_mix() else "."))
        exp = pred.get("exposed") or {}
        if exp:
            top = max(exp.items(), key=lambda kv: kv[1])
            if top[1] > 0.01 * pred["step_time_s"]:
                why.append(
                    f"Most exposed: {top[0]} ({top[1]:.3f} s of the {pred['step_time_s']:.3f} s step)."
                )
        if j.clip:
            why.append(
                "Exact clipping: updates wait for the global norm (step ~ backward + max(forward, update))."
            )
        knobs = [k for k in ("window", "chunk_mb", "loss_chunk_tokens") if k not in self.user]
        if knobs:
            why.append("Planner-chosen " + ", ".join(f"{k}={getattr(pol, k)}" for k in knobs) + ".")
        return why


def _policy_out(pol: ExecutionPolicy) -> dict[str, Any]:
    return pol.to_dict()
