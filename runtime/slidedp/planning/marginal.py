"""The paper's marginal pipeline cost: how many decoder layers keep, offload or recompute their activations, and
how many keep their weights resident, for one route and set of knobs.

tau_j = tau_0 + T_j*k_j - T_0*k_j, in our reading: tau_0 is a layer's marginal step-time cost under the base
policy (checkpoint); k_j is the amount of work policy j moves or recomputes for that layer — its saved-activation
bytes, which checkpoint recomputes and offload sends to the host and back (keep does neither, it pays in HBM);
T_j and T_0 are effective seconds per byte of that work under policy j and under the base *in the running
pipeline*. We take them from the overlap model: switch one layer from checkpoint to j and re-simulate, so
tau_j - tau_0 = (T_j - T_0)*k_j is a step-time change with overlap and contention in it (when the step waits on the
host update, recompute hides in idle compute and T_0 ~ 0). Residency is priced the same way.

Counts n_j (sum n_j = L) then minimise sum n_j*tau_j under the HBM budget and host RAM. Memory is linear in the
counts, so this is a small enumeration; as the figures depend on the operating point they are re-derived at the
chosen mix until it settles (at most three rounds), and the best mix the full model simulated is kept.
Imports no torch.
"""

from __future__ import annotations

from typing import Any

from slidedp.planning.job import Job
from slidedp.planning.memory_model import ActivationSizes
from slidedp.policy import ExecutionPolicy

MIN_GAIN_S = 2e-4  # a switch must save at least this much per layer to be worth its memory


class MixSearch:
    """Mixed into the planner, which provides job, acts, time(pol), fits(pol), mem(pol) and fixed_mix()."""

    job: Job
    acts: ActivationSizes

    def time(self, pol: ExecutionPolicy) -> float:
        raise NotImplementedError

    def fits(self, pol: ExecutionPolicy) -> str | None:
        raise NotImplementedError

    def mem(self, pol: ExecutionPolicy) -> dict[str, Any]:
        raise NotImplementedError

    def fixed_mix(self) -> dict[str, int]:
        raise NotImplementedError

    def refill(self, pol: ExecutionPolicy | None, marginal: dict[str, Any]) -> ExecutionPolicy | None:
        """Spend HBM freed by a knob on what the marginal costs say pays most (more kept or resident layers)."""
        if pol is None or not marginal:
            return pol
        fixed, d, L = self.fixed_mix(), marginal.get("delta_s", {}), self.job.layers
        for f in sorted(
            (f for f in ("keep", "resident") if d.get(f, 0.0) < -MIN_GAIN_S and f not in fixed),
            key=lambda f: d[f],
        ):
            n = self.counts(pol)
            limit = L - n["offload"] if f == "keep" else L
            while n[f] < limit:
                trial = self.with_counts(pol, {**n, f: n[f] + 1})
                if self.fits(trial) is not None:
                    break
                pol, n = trial, self.counts(trial)
        return pol

    def shrink_to_fit(self, pol: ExecutionPolicy) -> ExecutionPolicy | None:
        """The policy, or the nearest one with fewer kept/resident layers that fits; None if none does."""
        fixed = self.fixed_mix()
        n = self.counts(pol)
        while True:
            trial = self.with_counts(pol, n)
            if self.fits(trial) is None:
                return trial
            for f in ("resident", "keep", "offload"):
                if n[f] > 0 and f not in fixed:
                    n[f] -= 1
                    break
            else:
                return None

    # ------------------------------------------------------------------ the marginal-cost solve
    def solve_mix(self, pol: ExecutionPolicy) -> tuple[ExecutionPolicy, dict[str, Any]]:
        """Counts of keep / offload / checkpoint layers and resident layers by the marginal pipeline cost."""
        j, fixed = self.job, self.fixed_mix()
        free = [f for f in ("keep", "offload", "resident") if f not in fixed]
        if not j.on_gpu:
            free = [f for f in free if f != "resident"]  # nothing to keep resident on the CPU
        start = self.shrink_to_fit(pol) or pol
        # Two starting points: every free layer checkpointed and streamed, and every free layer keeping its
        # activations and weights (trimmed to fit). The marginal costs are local: where the step waits on the host,
        # one more kept layer saves nothing at the first point while many together shorten the backward that the
        # host update waits on (Qwen3-1.7B bs8 on one GPU: 0.670 s from the first point alone, 0.604 s with 14
        # kept layers, which the second point finds).
        n = self.counts(start)
        full = {f: (self.job.layers if f in free and f != "offload" else n[f]) for f in n}
        starts = [start] + [p for p in [self.shrink_to_fit(self.with_counts(start, full))] if p and p != start]
        marginal: dict[str, Any] = {}
        visited: list[ExecutionPolicy] = []
        best_marginal: dict[str, Any] = {}
        for pol in starts:
            visited.append(pol)
            for _ in range(3):
                if not free:
                    break
                marginal = self.marginal(pol, free)
                nxt = self.best_counts(pol, marginal, free)
                if nxt is None or nxt == pol or nxt in visited:
                    break
                visited.append(nxt)
                pol = nxt
            if not best_marginal:
                best_marginal = marginal
        fitting = [p for p in visited if self.fits(p) is None]
        best = min(fitting, key=self.time, default=start)
        if best is not starts[0] and free:
            best_marginal = self.marginal(best, free)  # the costs as they stand at the chosen mix
        return best, best_marginal

    def counts(self, pol: ExecutionPolicy) -> dict[str, int]:
        c = pol.counts()
        return {"keep": c["keep"], "offload": c["offload"], "resident": sum(pol.resident)}

    def with_counts(self, pol: ExecutionPolicy, n: dict[str, int]) -> ExecutionPolicy:
        return ExecutionPolicy.mix(
            self.job.layers,
            n["keep"],
            n["offload"],
            n["resident"],
            delivery=pol.delivery,
            grad_reduce=pol.grad_reduce,
            delivery_cast=pol.delivery_cast,
            window=pol.window,
            chunk_mb=pol.chunk_mb,
            loss_chunk_tokens=pol.loss_chunk_tokens,
            edge_update=pol.edge_update,
            device_layers=pol.device_layers,
            staging_slots=pol.staging_slots,
            streamed_layers=pol.streamed_layers,
            compiled_layers=pol.compiled_layers,
            post_norm_passes=pol.post_norm_passes,
            cast_scratch_mb=pol.cast_scratch_mb,
        )

    def marginal(self, pol: ExecutionPolicy, free: list[str]) -> dict[str, Any]:
        """tau_j at this operating point: the step-time change of switching one checkpointed layer to policy j
        (and of making one more layer resident), from the overlap model."""
        j, n = self.job, self.counts(pol)
        t = self.time(pol)
        ckpt = j.layers - n["keep"] - n["offload"]
        delta: dict[str, float] = {}
        for f in ("keep", "offload"):
            if f not in free:
                continue
            if ckpt > 0:
                delta[f] = self.time(self.with_counts(pol, {**n, f: n[f] + 1})) - t
            elif n[f] > 0:
                delta[f] = t - self.time(self.with_counts(pol, {**n, f: n[f] - 1}))
        if "resident" in free:
            if n["resident"] < j.layers:
                delta["resident"] = self.time(self.with_counts(pol, {**n, "resident": n["resident"] + 1})) - t
            else:
                delta["resident"] = t - self.time(self.with_counts(pol, {**n, "resident": n["resident"] - 1}))
        k = self.acts.keep
        tau0 = t / j.layers
        T0 = -delta["keep"] / k if "keep" in delta else None
        out = {
            "k_bytes": k,
            "tau_0_s": tau0,
            "delta_s": delta,
            "tau_s": {"checkpoint": tau0},
            "T_s_per_GB": {"checkpoint": None if T0 is None else T0 * 1e9, "keep": 0.0},
        }
        for f in ("keep", "offload"):
            if f in delta:
                out["tau_s"][f] = tau0 + delta[f]
        if "offload" in delta and T0 is not None:
            out["T_s_per_GB"]["offload"] = (delta["offload"] / k + T0) * 1e9
        return out

    def best_counts(self, pol: ExecutionPolicy, marginal: dict[str, Any], free: list[str]) -> ExecutionPolicy | None:
        """Minimise sum n_j*tau_j under HBM and host RAM (memory is linear in the counts; the pick is then
        checked with the full memory model and trimmed if needed)."""
        j, n0 = self.job, self.counts(pol)
        d = marginal["delta_s"]
        gain = {f: d.get(f, 0.0) for f in ("keep", "offload", "resident")}
        use = {f: f in free and gain[f] < -MIN_GAIN_S for f in gain}
        if not any(use.values()):
            return self.with_counts(pol, {f: (n0[f] if f not in free else 0) for f in n0})
        base = self.with_counts(pol, {f: (n0[f] if f not in free else 0) for f in n0})
        m0 = self.mem(base)
        step = {}
        for f in ("keep", "offload", "resident"):
            one = self.with_counts(base, {**self.counts(base), f: self.counts(base)[f] + 1})
            m1 = self.mem(one)
            step[f] = (m1["hbm_peak_bytes"] - m0["hbm_peak_bytes"], m1["host_bytes"] - m0["host_bytes"])
        hbm_room = (j.hbm_budget - m0["hbm_peak_bytes"]) if j.on_gpu else float("inf")
        host_room = j.host_limit_bytes - m0["host_bytes"]
        fixed = self.fixed_mix()
        best, best_val = None, 0.0
        L = j.layers
        keep_range = range(L + 1) if use["keep"] else [fixed.get("keep", 0)]
        res_range = range(L + 1) if use["resident"] else [fixed.get("resident", 0)]
        for nk in keep_range:
            for nr in res_range:
                hbm = step["keep"][0] * nk + step["resident"][0] * nr
                host = step["keep"][1] * nk + step["resident"][1] * nr
                if hbm > hbm_room or host > host_room:
                    continue
                no = fixed.get("offload", 0)
                if use["offload"]:  # linear objective: as many as memory and layers allow
                    room = L - nk
                    for bound, per in (
                        (hbm_room - hbm, step["offload"][0]),
                        (host_room - host, step["offload"][1]),
                    ):
                        if per > 0:
                            room = min(room, int(bound // per))
                    no = max(0, room)
                if nk + no > L:
                    continue
                val = (
                    gain["keep"] * nk * use["keep"]
                    + gain["offload"] * no * use["offload"]
                    + gain["resident"] * nr * use["resident"]
                )
                if best is None or val < best_val - 1e-12:
                    best, best_val = {"keep": nk, "offload": no, "resident": nr}, val
        if best is None:
            return None
        return self.shrink_to_fit(self.with_counts(pol, best))
