"""The route search: which ways a job's bytes may take — delivery (replicated or sharded), gradient route (reduced
on the GPUs or summed on the host), where the embedding and head are updated, and how many leading layers are
updated on the GPUs — and which of them to run.

With times, every route starts from the default knobs, its activation mix is solved by the marginal pipeline cost
(planning/marginal.py) and the mix is priced by the overlap model; a route that fits beats one that does not, then
the faster wins. A route the calibration cannot price is left out and said so. Without times the route follows the
topology (GPU reduction and sharded delivery over NVLink or PCIe P2P) and only memory is checked. route_why says,
in the plan's words, which route was taken and on what grounds. Imports no torch.
"""

from __future__ import annotations

from typing import Any

from slidedp.planning.cost_model import Rates, Uncalibrated
from slidedp.planning.job import Job
from slidedp.planning.plan import Candidate, Plan
from slidedp.planning.refusals import Infeasible
from slidedp.policy import ExecutionPolicy

# (policy, its activation mix's marginal costs): the best route the search found
Best = tuple[ExecutionPolicy, dict[str, Any]]


class RouteSearch:
    """Mixed into the planner, which provides job, cfg, fixed (the settings the user fixed: PolicyConfig.fixed(),
    the one answer to "did the user fix this knob"), rates, base(), fits(), time(), fixed_mix(), mem(),
    candidate(), result(), solve_mix() and hbm_error()."""

    job: Job
    cfg: Any
    fixed: dict[str, Any]
    rates: Rates | None

    # ------------------------------------------------------------------ the candidates
    def edges(self) -> list[str]:
        """Where the embedding and head may be updated: as configured, or both places where the user left it."""
        return [self.fixed["edge_update"]] if "edge_update" in self.fixed else ["host", "gpu"]

    def device_counts(self, grad: str) -> list[int]:
        """How many leading layers to try updating on the GPUs: as configured, or (None: the planner's) a few
        counts up to every layer when gradients are reduced on the GPUs and there are times to compare."""
        L = self.job.layers
        if "device_layers" in self.fixed:
            return [min(self.fixed["device_layers"], L)]
        if not self.rates or (self.job.world > 1 and grad != "gpu"):
            return [0]
        return sorted({0, L // 4, L // 2, (3 * L) // 4, L})

    def routes(self) -> list[tuple[str, str, str]]:
        """(delivery, gradient route, edge update) triples to compare; a device edge update needs gpu reduction."""
        if self.job.world == 1:
            return [("replicated", "host", e) for e in self.edges()]
        dl = [self.fixed["delivery"]] if "delivery" in self.fixed else ["sharded", "replicated"]
        gr = [self.fixed["grad_reduce"]] if "grad_reduce" in self.fixed else ["gpu", "host"]
        if self.fixed.get("edge_update") == "gpu" or self.fixed.get("device_layers"):
            gr = ["gpu"]
        return [(a, b, e) for a in dl for b in gr for e in self.edges() if e == "host" or b == "gpu"]

    # ------------------------------------------------------------------ the search, with times
    def search_routes(
        self, window: int, chunk: int, loss_chunk: int, loss_chunks: list[int] | tuple[int, ...] = ()
    ) -> tuple[list[Candidate], Best | None, list[str]]:
        """Every route and count of device layers at these knobs, each with its activation mix solved: the
        candidates weighed, the best (None when no route could be priced) and the routes left out, why.

        A route whose leanest form does not fit at `loss_chunk` is tried at the smaller of `loss_chunks` before it
        is given up: the loss head's transient scales with its chunk, and under a memory cap that is what decides
        whether the embedding and head (or leading layers) fit beside the window for their update on the GPU."""
        candidates: list[Candidate] = []
        best: tuple[tuple[bool, float], ExecutionPolicy, dict] | None = None
        untimed = []
        tries = [loss_chunk, *sorted((c for c in loss_chunks if c < loss_chunk), reverse=True)]
        for delivery, grad, edge in self.routes():
            counts = self.device_counts(grad)
            if len(counts) > 1:  # the planner's choice: also the most leading layers that fit below its ladder
                counts = sorted({*counts, self._most_device_layers(delivery, grad, window, chunk, tries[-1], edge,
                                                                    counts[1])})
            for n_dev in counts:
                for lc in tries:
                    start = self.base(delivery, grad, window, chunk, lc, {}, edge, n_dev)
                    if self.fits(start) is None:
                        break
                if self.fits(start) is not None and n_dev:
                    continue  # the layers' device state alone does not fit: fewer layers were tried
                if self.fits(start) is not None:
                    start = self.base(delivery, grad, window, chunk, loss_chunk, {}, edge, n_dev)
                try:
                    pol, marginal = self.solve_mix(start)
                except Uncalibrated as exc:  # e.g. collectives not measured: this route cannot be priced
                    label = f"{delivery}/{grad}{'/edge-gpu' if edge == 'gpu' else ''}"
                    label += f"/{n_dev} device layers" if n_dev else ""
                    untimed.append(f"{label} not timed ({exc})")
                    continue
                if start.loss_chunk_tokens != loss_chunk:
                    # listed beside it: the route at the default loss chunk, and why it does not fit there
                    candidates.append(self.candidate(self.base(delivery, grad, window, chunk, loss_chunk, {}, edge,
                                                               n_dev)))
                candidates.append(self.candidate(pol))
                rank = (self.fits(pol) is not None, self.time(pol))  # a plan that fits beats one that does not
                if best is None or rank < best[0]:
                    best = (rank, pol, marginal)
        return candidates, None if best is None else (best[1], best[2]), untimed

    def _most_device_layers(self, delivery: str, grad: str, window: int, chunk: int, loss_chunk: int, edge: str,
                            below: int) -> int:
        """The most leading layers, fewer than `below`, whose update on the GPUs fits at its leanest (every layer
        checkpointed); 0 when none does. Under a memory cap the ladder's first rung (a quarter of the layers) is
        often out of reach while a few layers fit, and each one takes its share of the host update off the CPU."""
        lo, hi = 0, max(0, below - 1)
        while lo < hi:  # the device state grows with the count: the largest count that fits, by bisection
            mid = (lo + hi + 1) // 2
            if self.fits(self.base(delivery, grad, window, chunk, loss_chunk, {}, edge, mid)) is None:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # ------------------------------------------------------------------ without times
    def memory_only(self, window: int, chunk: int, loss_chunk: int) -> Plan:
        """The plan without times: the route by the topology rule (or as configured), every layer checkpointed
        unless configured otherwise; refused when even that does not fit."""
        j = self.job
        grad = (
            "host"
            if j.world == 1
            else self.fixed.get("grad_reduce", "gpu" if j.interconnect in ("nvlink", "pcie-p2p") else "host")
        )
        delivery = (
            "replicated"
            if j.world == 1
            else self.fixed.get(
                "delivery", "sharded" if j.interconnect in ("nvlink", "pcie-p2p") else "replicated"
            )
        )
        n_dev = self.fixed.get("device_layers", 0)
        # the embedding and head on the host unless configured otherwise; left to the planner, on the GPUs where
        # only that fits (their update there holds no gradient and stages no head-sized slot in host memory)
        edges = [self.fixed.get("edge_update", "host")]
        if "edge_update" not in self.fixed and j.on_gpu:
            edges.append("gpu")
        for edge in edges:
            route = "gpu" if (edge == "gpu" or n_dev) and j.world > 1 else grad
            pol = self.base(delivery, route, window, chunk, loss_chunk, {}, edge, n_dev)
            if self.fits(pol) is None:
                break
        else:
            pol = self.base(delivery, "gpu" if (edges[0] == "gpu" or n_dev) and j.world > 1 else grad, window,
                            chunk, loss_chunk, {}, edges[0], n_dev)
            m = self.mem(pol)
            if m["host_bytes"] > j.host_limit_bytes:
                raise Infeasible([{"loc": "model", "msg": f"host RAM too small: {self.fits(pol)}; use a smaller "
                                   "model, fewer ranks, or a host with more RAM"}])
            raise Infeasible([self.hbm_error(pol, m)])
        why = [
            "No calibration: this plan checks memory only and predicts no times (a job's first run on the host "
            "calibrates it at the job's shape, as `slidedp plan` does without --no-calibration; cached for the "
            "next runs)."
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

    # ------------------------------------------------------------------ why
    def route_why(self, pol: ExecutionPolicy, table: dict | None) -> str:
        """The plan's sentence on its route: which one, over which link, chosen how (`table`: the best step time
        per route when routes were compared by time, None without times)."""
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
            if ("delivery" in self.fixed and "grad_reduce" in self.fixed)
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
