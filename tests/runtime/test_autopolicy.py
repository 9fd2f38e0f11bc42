"""AutoPolicy on the nvidia-h200-x2 machine's figures (tests/runtime/fixtures/h200x2_*.json, from the ceilings in
docs/architecture.md §4) and on what the one-GPU machine measured: routes follow the topology and the bottleneck,
activations follow HBM, the choice is the fastest plan that fits by the stated tie rule, a smaller HBM budget never
buys a faster plan, predicted peak HBM agrees with the peaks real runs reached, infeasible jobs are refused with
the shortfall, and explicit settings win or are refused with what to change."""

import copy
import json
import os
import re

import pytest
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning import cost_model as cm
from slidedp.planning import knobs
from slidedp.policy import ExecutionPolicy

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def _cfg(**raw):
    base = {
        "model": "qwen3-8b",
        "data": {"path": "x.jsonl"},
        "gpus": 2,
        "micro_batch_size": 8,
        "seq_len": 2048,
        "optimizer": {"max_grad_norm": 0.0},  # the fixtures' runs and these figures are without clipping
    }
    base.update(raw)
    return JobConfig.from_dict(base)


@pytest.fixture(scope="module")
def nvlink_bs8(x2):
    """The bf16 copy made on the host, as in the runs the route comparisons below were measured with."""
    topo, cal = x2
    return ap.plan_job(_cfg(policy={"delivery_cast": "host"}), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"])


def test_nvlink_pair_gets_gpu_reduction_and_host_reduction_ranks_last(nvlink_bs8):
    plan = nvlink_bs8
    assert plan["feasible"] and plan["calibration"] == "measured" and plan["errors"] == []
    assert plan["policy"]["grad_reduce"] == "gpu"
    routes = {(c["policy"]["delivery"], c["policy"]["grad_reduce"]) for c in plan["candidates"]}
    assert routes == {("sharded", "gpu"), ("replicated", "gpu"), ("sharded", "host"), ("replicated", "host")}
    best = {}
    for c in plan["candidates"]:
        key = (c["policy"]["delivery"], c["policy"]["grad_reduce"])
        if c["fits"]:
            best[key] = min(best.get(key, float("inf")), c["predicted"]["step_time_s"])
    # measured on the x2 machine (docs/notebook/benchmark-history.md, bs4): the two deliveries with GPU reduction 1.3% apart,
    # host reduction 1.5x slower. The model puts them 5.4% apart on this bs8 calibration (4.9% while the replay's
    # shared-bandwidth rounds stopped before settling): within 6%, the order of the routes' gap to host reduction
    assert abs(best[("sharded", "gpu")] / best[("replicated", "gpu")] - 1) < 0.06
    assert min(best[("sharded", "host")], best[("replicated", "host")]) > 1.3 * max(
        best[("sharded", "gpu")], best[("replicated", "gpu")])
    assert "NVLink" in plan["why"] and "by predicted step time" in plan["why"]


def _assert_fastest_fitting_by_the_tie_rule(plan):
    """The chosen plan fits, is listed among the candidates, and no candidate that fits is faster by the margin
    AutoPolicy states (docs/planning.md, autopolicy.run): routes and activation mixes are compared by predicted
    step time, and a knob (window, transfer chunk, loss chunk) leaves its default only for a plan at least 0.1%
    faster, so a listed candidate may beat the choice by less than 0.1%, never by more; more gradient staging slots
    than the choice's are taken only SLOTS_GAIN faster, so a candidate that differs from it by its slots alone may
    beat it by less than that. A choice whose knobs are not the defaults beat, by that margin, a listed candidate of
    its route with the default knobs — or that candidate does not fit."""
    defaults = _cfg().policy
    chosen, pol = plan["predicted"]["step_time_s"], plan["policy"]
    fitting = [c for c in plan["candidates"] if c["fits"]]
    assert fitting and all(c["why_not"] is None for c in fitting)
    assert all(c["why_not"] for c in plan["candidates"] if not c["fits"])  # every rejection says why
    assert any(c["policy"] == pol and c["predicted"]["step_time_s"] == pytest.approx(chosen) for c in fitting)
    # the headroom rule (docs/planning.md) may take a plan up to max_slower_fraction slower that keeps the margin free
    head, slack = plan.get("headroom") or {}, 0.999
    if head.get("outcome") == "took a plan that keeps the margin":
        assert head["chosen_free_fraction"] >= head["margin_fraction"] > head["fastest_free_fraction"], head
        assert head["slower_by_fraction"] <= head["max_slower_fraction"], head
        slack = 1 / (1 + head["max_slower_fraction"])
    for c in fitting:
        more_slots = {**c["policy"], "staging_slots": pol["staging_slots"]} == pol
        least = slack * (1 - knobs.SLOTS_GAIN) if more_slots else slack
        assert c["predicted"]["step_time_s"] >= least * chosen - 1e-12, (c["policy"], chosen)
    knob_names = ("window", "chunk_mb", "loss_chunk_tokens")
    # the knob rule is the search's; a plan the headroom rule moved layers of is no candidate of it
    if any(pol[k] != getattr(defaults, k) for k in knob_names) and slack == 0.999:
        route = ("delivery", "grad_reduce", "edge_update", "device_layers")
        start = [c for c in plan["candidates"] if all(c["policy"][k] == pol[k] for k in route)
                 and all(c["policy"][k] == getattr(defaults, k) for k in knob_names)]
        beaten = [c["predicted"]["step_time_s"] for c in start if c["fits"]]
        assert beaten or start, (pol, "no candidate of the route with the default knobs")
        if beaten:
            assert max(beaten) * 0.999 >= chosen - 1e-12, (pol, beaten, chosen)


def test_the_chosen_policy_is_the_fastest_fitting_candidate(nvlink_bs8):
    plan = nvlink_bs8
    _assert_fastest_fitting_by_the_tie_rule(plan)
    pred = plan["predicted"]
    assert pred["tokens_per_s"] == pytest.approx(2 * 8 * 2048 / pred["step_time_s"])
    assert sum(pred["phases"].values()) == pytest.approx(pred["step_time_s"])
    assert set(pred["exposed"]) >= {"h2d", "d2h", "collective", "cpu_update", "host_dram"}
    assert json.loads(json.dumps(plan)) == plan
    # every metrics record carries the prediction in both cuts: the model's phases and the engine's spans
    rec = ap.metrics_prediction(plan)
    assert rec["forward_span"] + rec["backward_span"] == pytest.approx(rec["step_time_s"])
    assert rec["forward_span"] == pytest.approx(pred["spans"]["forward"])


def _with_hbm(topology: dict, gib: float) -> dict:
    """The same host with GPUs of `gib` GiB."""
    topo = copy.deepcopy(topology)
    for g in topo["gpus"]:
        g["hbm_bytes"] = int(gib * 2**30)
    return topo


def _hbm_refusal(why_not: str) -> float:
    """The overshoot a candidate's refusal states, in GiB (None when it is refused for something else)."""
    m = re.search(r"needs ([\d.]+) GiB of HBM per GPU, ([\d.]+) GiB over the budget of ([\d.]+) GiB", why_not or "")
    return None if m is None else float(m.group(2))


@pytest.mark.parametrize("gib", [None, 96])
def test_with_too_little_hbm_the_plan_fits_and_keeping_every_layer_is_rejected_with_the_overshoot(nvlink_bs8, x2,
                                                                                                  gib):
    """At micro-batch 8 a Qwen3-8B layer saves 3.55 GB of activations (measured: the calibration's
    saved_keep_bytes), 36 of them 119 GiB: on the 140 GiB H200 keeping them all leaves no room for the rest, on a
    96 GiB GPU they do not even fit alone. The chosen plan stays under the budget, which the plan reports and which
    lies below the GPU's memory; the plan that keeps every layer is listed as rejected, with the overshoot it
    states equal to its predicted peak above that budget; the smaller GPU keeps fewer layers."""
    topo, cal = x2
    full = nvlink_bs8
    plan = full if gib is None else ap.plan_job(_cfg(), _with_hbm(topo["nvlink"], gib), cal["qwen3-8b_bs8_nvlink"])
    physical = gib or topo["nvlink"]["gpus"][0]["hbm_bytes"] / 2**30
    budget = plan["job"]["hbm_budget_gib"]
    assert plan["feasible"] and budget < physical
    assert plan["predicted"]["hbm_peak_gib"] <= budget
    acts = plan["policy"]["activations"]
    assert len(acts) == 36 and acts.count("keep") < 36
    all_keep = [c for c in plan["candidates"] if c["policy"]["activations"].count("keep") == 36]
    assert all_keep and not any(c["fits"] for c in all_keep)
    for c in all_keep:
        over = _hbm_refusal(c["why_not"])
        assert over is not None, c["why_not"]
        assert over == pytest.approx(c["predicted"]["hbm_peak_gib"] - budget, abs=0.06)
    saved = 36 * cal["qwen3-8b_bs8_nvlink"]["unit"]["saved_keep_bytes"] / 2**30
    assert min(c["predicted"]["hbm_peak_gib"] for c in all_keep) > saved
    _assert_fastest_fitting_by_the_tie_rule(plan)
    if gib is not None:
        assert saved > gib and acts.count("keep") < full["policy"]["activations"].count("keep")
    else:
        m = plan["marginal"]
        # With 8 gradient staging slots this step is bound by the host update, so the recompute that keeping
        # would save is hidden: keeping is never dearer, and here no cheaper, than checkpointing.
        assert m["tau_s"]["keep"] <= m["tau_s"]["checkpoint"] + 1e-9
        assert plan["predicted"]["exposed"]["cpu_update"] > plan["predicted"]["exposed"]["recompute"]


def test_without_p2p_the_planner_replicates(x2):
    topo, cal = x2
    plan = ap.plan_job(_cfg(), topo["pcie_host"], cal["qwen3-8b_bs8_pcie_host"])
    assert plan["feasible"] and plan["policy"]["delivery"] == "replicated"
    assert "collectives cross host memory" in plan["why"]


def test_a_14b_job_on_too_little_host_ram_is_refused_with_the_shortfall(x2):
    """Qwen3-14B on two GPUs of a 175 GiB host: refused, naming host_ram_gib, and the shortfall it states is the
    real threshold — with that much more RAM the job is planned (on its leanest route: the bf16 weights made on the
    GPUs and the embedding and head updated there, staging a layer-sized gradient slot instead of a head-sized one,
    and the fewest staging slots: at 180 GiB it fits with 4), with a little less it is still refused."""
    from slidedp.presets import PRESETS, param_count

    topo, _ = x2
    assert 12 * param_count(PRESETS["qwen3-14b"]) / 2**30 > 150  # the fp32 master and moments alone
    plan = ap.plan_job(_cfg(model="qwen3-14b", host_ram_gib=175), topo["nvlink"], None)
    assert not plan["feasible"] and plan["policy"] is None
    err = plan["errors"][0]
    assert err["loc"] == "host_ram_gib"
    short = float(re.search(r"([\d.]+) GiB more than the 175.0 GiB available", err["msg"]).group(1))
    assert short > 0
    enough = ap.plan_job(_cfg(model="qwen3-14b", host_ram_gib=175 + short + 0.05), topo["nvlink"], None)
    assert enough["feasible"] and enough["predicted"]["host_ram_gib"] <= 175 + short + 0.05
    assert not ap.plan_job(_cfg(model="qwen3-14b", host_ram_gib=175 + short - 0.1), topo["nvlink"], None)["feasible"]
    assert ap.plan_job(_cfg(model="qwen3-14b"), topo["nvlink"], None)["feasible"]  # 256 GiB holds it


def test_without_calibration_only_memory_is_checked(x2):
    topo, _ = x2
    plan = ap.plan_job(_cfg(), topo["nvlink"], None)
    assert plan["feasible"] and plan["calibration"] == "missing"
    assert plan["predicted"]["step_time_s"] is None and plan["predicted"]["phases"] == {}
    assert plan["predicted"]["hbm_peak_gib"] > 0 and plan["predicted"]["host_ram_gib"] > 0
    assert set(plan["policy"]["activations"]) == {"checkpoint"}
    assert "memory only" in plan["why"]
    assert ap.metrics_prediction(plan) == {}


def test_routes_the_calibration_cannot_price_are_left_out_and_said(x2):
    topo, cal = x2
    partial = {k: v for k, v in cal["qwen3-8b_bs8_nvlink"].items() if k != "collectives"}
    plan = ap.plan_job(_cfg(), topo["nvlink"], partial)
    assert plan["feasible"] and plan["calibration"] == "measured"
    assert (plan["policy"]["delivery"], plan["policy"]["grad_reduce"]) == ("replicated", "host")
    assert "sharded/gpu not timed" in plan["why"] and "collectives not measured" in plan["why"]


def test_a_calibration_of_another_shape_is_not_used(x2):
    topo, cal = x2
    plan = ap.plan_job(_cfg(micro_batch_size=2), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"])
    assert plan["calibration"] == "missing" and "not this job's shape" in plan["calibration_note"]


def test_keeping_every_layer_is_refused_with_the_largest_count_that_fits(x2):
    topo, cal = x2
    plan = ap.plan_job(_cfg(policy={"activations": "keep"}), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"])
    assert not plan["feasible"]
    err = plan["errors"][0]
    assert err["loc"] == "policy.activations" and "over the budget" in err["msg"]
    n = int(re.search(r"keep_layers at most (\d+)", err["msg"]).group(1))
    fits = ap.plan_job(_cfg(policy={"keep_layers": n}), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"])
    assert fits["feasible"] and fits["policy"]["activations"].count("keep") == n
    too_many = ap.plan_job(_cfg(policy={"keep_layers": n + 1}), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"])
    assert not too_many["feasible"] and too_many["errors"][0]["loc"] == "policy.keep_layers"


def test_explicit_routes_win_over_the_planner(x2):
    topo, cal = x2
    plan = ap.plan_job(
        _cfg(policy={"delivery": "replicated", "keep_layers": 4}), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"]
    )
    assert plan["feasible"] and plan["policy"]["delivery"] == "replicated"
    assert {c["policy"]["delivery"] for c in plan["candidates"]} == {"replicated"}
    assert all(c["policy"]["activations"].count("keep") == 4 for c in plan["candidates"] if c["fits"])


def test_one_rank_has_trivial_routes(x2):
    topo, cal = x2
    plan = ap.plan_job(_cfg(gpus=1), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"])
    assert plan["feasible"]
    assert (plan["policy"]["delivery"], plan["policy"]["grad_reduce"]) == ("replicated", "host")
    assert plan["why"].startswith("1 rank: nothing to share or reduce")


def test_more_gpus_than_the_host_has_is_refused(x2):
    topo, _ = x2
    plan = ap.plan_job(_cfg(gpus=4), topo["nvlink"], None)
    assert not plan["feasible"] and plan["errors"][0]["loc"] == "gpus" and "has 2" in plan["errors"][0]["msg"]


def test_format_plan_and_the_metrics_prediction(nvlink_bs8):
    text = ap.format_plan(nvlink_bs8)
    assert "grad_reduce=gpu" in text and "tokens/s" in text and "why:" in text
    assert len([ln for ln in text.splitlines() if ln.startswith(("sharded", "replicated"))]) == len(
        nvlink_bs8["candidates"]
    )
    pred = ap.metrics_prediction(nvlink_bs8)
    assert set(pred) == {"data", "forward", "backward", "update_tail", "delivery_wait", "forward_span",
                         "backward_span", "step_time_s", "update_busy"}
    assert pred["step_time_s"] == nvlink_bs8["predicted"]["step_time_s"]
    assert pred["update_busy"] == nvlink_bs8["predicted"]["busy"]["cpu"]
    refused = ap.format_plan({"feasible": False, "errors": [{"loc": "gpus", "msg": "too many"}]})
    assert refused.splitlines() == ["NOT FEASIBLE", "  gpus: too many"]


def _with_device_rate(cal: dict) -> dict:
    # a test figure, not a measurement: fused AdamW + bf16 copy at ~30 B/param over ~4 TB/s of HBM
    return {**cal, "device_update": {"params": 1 << 27, "adamw_cast_s_per_1e9": 0.0075}}


@pytest.mark.slow
def test_edge_update_auto_is_not_timed_without_the_device_rate(x2):
    topo, cal = x2
    plan = ap.plan_job(_cfg(), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"])  # the defaults: both auto
    assert plan["feasible"] and plan["policy"]["edge_update"] == "host" and plan["policy"]["device_layers"] == 0
    assert "edge-gpu not timed" in plan["why"] and "device AdamW rate" in plan["why"]


@pytest.mark.slow
def test_edge_update_auto_weighs_the_host_bytes_it_saves_against_hbm(x2):
    topo, cal = x2
    job_cfg = _cfg(policy={"edge_update": "auto", "device_layers": 0})  # the edges alone
    plan = ap.plan_job(job_cfg, topo["nvlink"], _with_device_rate(cal["qwen3-8b_bs8_nvlink"]))
    assert plan["feasible"] and plan["policy"]["edge_update"] == "gpu" and plan["policy"]["grad_reduce"] == "gpu"
    best = {}
    for c in plan["candidates"]:
        if c["fits"]:
            e = c["policy"]["edge_update"]
            best[e] = min(best.get(e, float("inf")), c["predicted"]["step_time_s"])
    # the host update bounds this step; the two units are 15% of its bytes
    assert best["gpu"] < 0.97 * best["host"]
    # the HBM it costs: each of the 2 GPUs holds half of the embedding's and head's fp32 weights, both AdamW
    # moments and the reduced fp32 gradient, 16 B/param / 2 (0.62B + 0.62B params: 9.3 GiB); the plan counts no
    # less, and not the whole units on each GPU (18.5 GiB)
    from slidedp.presets import PRESETS, unit_param_counts

    units = unit_param_counts(PRESETS["qwen3-8b"])
    edge_gib = (units[0] + units[-1]) * 16 / 2 / 2**30
    assert edge_gib <= plan["predicted"]["hbm_parts_gib"]["device_state"] < 1.25 * edge_gib
    assert "Updated on the GPUs: the embedding and head" in plan["why"]
    # with the host route asked for, a device edge update is not a candidate
    host = ap.plan_job(_cfg(policy={"grad_reduce": "host"}), topo["nvlink"],
                       _with_device_rate(cal["qwen3-8b_bs8_nvlink"]))
    assert {c["policy"]["edge_update"] for c in host["candidates"]} == {"host"}


def test_the_cost_model_moves_no_host_bytes_for_device_updated_units(x2):
    topo, cal = x2
    job = cm.Job.from_config(_cfg(), topo["nvlink"])
    rates = cm.Rates(_with_device_rate(cal["qwen3-8b_bs8_nvlink"]), job)
    host = cm.durations(job, ExecutionPolicy.default(job.layers, delivery="sharded", grad_reduce="gpu"), rates)
    dev = cm.durations(job, ExecutionPolicy.default(job.layers, delivery="sharded", grad_reduce="gpu",
                                                    edge_update="gpu"), rates)
    head = job.layers + 1
    for u in (0, head):
        assert (dev.deliver_bytes[u], dev.grad_bytes[u], dev.update[u], dev.update_bytes[u]) == (0, 0, 0, 0)
        assert host.deliver_bytes[u] > 0 and host.update[u] > 0 and dev.device_update[u] > 0
    assert dev.update[1:head] == host.update[1:head]
    saved = (host.update_bytes[0] + host.update_bytes[head]) / sum(host.update_bytes)
    assert 0.14 < saved < 0.16  # embedding + lm_head of Qwen3-8B: 1.24B of 8.19B parameters


@pytest.mark.slow
def test_the_plan_reports_the_physical_bound_under_its_prediction(x2):
    topo, cal = x2
    for raw in ({}, {"optimizer": {"max_grad_norm": 1.0}}, {"micro_batch_size": 4}):
        plan = ap.plan_job(_cfg(**raw), topo["nvlink"], cal["qwen3-8b_bs8_nvlink" if "micro_batch_size" not in raw
                                                            else "qwen3-8b_bs4_nvlink"])
        b, pred = plan["predicted"]["bound"], plan["predicted"]
        assert set(b["terms_s"]) == {"compute", "cpu_update", "h2d", "d2h", "host_dram"}
        assert b["step_time_s"] == pytest.approx(b["terms_s"][b["binding"]] + b["unhidden_s"])
        assert b["step_time_s"] <= pred["step_time_s"] * 1.01
        assert pred["step_time_s"] < 1.5 * b["step_time_s"]  # the pipeline hides most of what is not bound
        if raw.get("optimizer"):  # exact clipping: the update waits for the backward
            assert b["terms_s"]["compute"] > pred["phases"]["backward"]
    assert "bound:" in ap.format_plan(plan)


@pytest.mark.slow
def test_the_planner_spends_spare_hbm_on_layers_updated_on_the_gpus(x2):
    topo, cal = x2
    calib = _with_device_rate(cal["qwen3-8b_bs4_nvlink"])
    plan = ap.plan_job(_cfg(micro_batch_size=4, policy={"edge_update": "auto", "device_layers": None}),
                       topo["nvlink"], calib)
    pol, pred = plan["policy"], plan["predicted"]
    assert plan["feasible"] and pol["device_layers"] > 0 and pol["grad_reduce"] == "gpu"
    assert all(pol["resident"][: pol["device_layers"]])  # device-updated layers keep their weights resident
    assert pred["hbm_peak_gib"] * 2**30 <= cm.Job.from_config(_cfg(micro_batch_size=4), topo["nvlink"]).hbm_budget
    host_only = min(c["predicted"]["step_time_s"] for c in plan["candidates"]
                    if c["fits"] and c["policy"]["device_layers"] == 0 and c["policy"]["edge_update"] == "host")
    assert pred["step_time_s"] < host_only
    assert f"layers 1-{pol['device_layers']}" in plan["why"]
    # every layer's device state next to every layer's activations does not fit: refused with the count that does
    bad = ap.plan_job(_cfg(policy={"device_layers": 36, "activations": "keep", "resident_units": 36}),
                      topo["nvlink"], _with_device_rate(cal["qwen3-8b_bs8_nvlink"]))
    assert not bad["feasible"]
    err = bad["errors"][0]
    assert err["loc"] in ("policy.activations", "policy.device_layers") and "GiB" in err["msg"]
    bad = ap.plan_job(_cfg(policy={"device_layers": 36, "keep_layers": 20, "activations": "auto"}),
                      topo["nvlink"], _with_device_rate(cal["qwen3-8b_bs8_nvlink"]))
    assert not bad["feasible"] and bad["errors"][0]["loc"] in ("policy.keep_layers", "policy.device_layers")


def _scaled_pcie(cal: dict, factor: float) -> dict:
    """The calibration with every host<->GPU bandwidth scaled by `factor` (a slower host link)."""
    cal = copy.deepcopy(cal)
    tr = cal["transfers"]
    for k in ("h2d_GBps", "d2h_GBps", "h2d_all_GBps", "d2h_all_GBps", "bidir_GBps"):
        tr[k] = [v * factor for v in tr[k]] if isinstance(tr[k], list) else tr[k] * factor
    return cal


def _best_per_route(plan: dict) -> dict:
    best = {}
    for c in plan["candidates"]:
        if c["fits"]:
            key = (c["policy"]["delivery"], c["policy"]["grad_reduce"])
            best[key] = min(best.get(key, float("inf")), c["predicted"]["step_time_s"])
    return best


def test_when_the_host_link_binds_the_routes_that_move_fewer_bytes_over_it_win(x2):
    """Over the host link, replicated delivery copies every unit to each of the 2 GPUs (2 x 2 B/param per
    delivery) where sharded copies each half once and all-gathers over NVLink (2 B/param in all); host reduction
    returns every GPU's whole gradient (2 x 4 B/param) where gpu reduction returns each GPU's reduced half
    (4 B/param). With the measured link the two deliveries are 1% apart; as the link slows, the delivery that
    moves half the bytes pulls ahead by more and more, and gpu reduction stays ahead of host reduction. The cast is
    on the host (2 B/param delivered), as in the measured runs."""
    topo, cal = x2
    gaps = []
    for factor in (1.0, 0.25, 0.125):
        plan = ap.plan_job(_cfg(micro_batch_size=4, policy={"delivery_cast": "host"}), topo["nvlink"],
                           _scaled_pcie(cal["qwen3-8b_bs4_nvlink"], factor))
        best = _best_per_route(plan)
        gaps.append(best[("replicated", "gpu")] / best[("sharded", "gpu")])
        assert best[("sharded", "host")] > best[("sharded", "gpu")]
        _assert_fastest_fitting_by_the_tie_rule(plan)
        if factor < 1:
            assert (plan["policy"]["delivery"], plan["policy"]["grad_reduce"]) == ("sharded", "gpu")
    assert abs(gaps[0] - 1) < 0.05 and gaps[0] < gaps[1] < gaps[2] and gaps[2] > 1.2, gaps


HBM_LADDER = (140.4, 100, 64, 44)  # GiB per GPU: the H200's, then smaller GPUs of the same host


@pytest.fixture(scope="module")
def hbm_ladder(x2):
    """Qwen3-8B at micro-batch 8 on the NVLink pair, planned for GPUs of each size with the device AdamW rate
    known, so that the planner can spend HBM on kept activations, residency and device-updated layers."""
    topo, cal = x2
    calib = _with_device_rate(cal["qwen3-8b_bs8_nvlink"])
    return {gib: ap.plan_job(_cfg(), _with_hbm(topo["nvlink"], gib), calib) for gib in HBM_LADDER}


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_a_smaller_hbm_budget_never_yields_a_faster_predicted_plan(hbm_ladder):
    """A smaller GPU can only take away options. Every rung is planned, fits its own budget, and is predicted
    no faster than the rung above it; the smallest is predicted slower than the largest (HBM is worth something
    to this job), and on every smaller rung the budget binds: a faster plan was rejected for HBM there, or the
    rung above chose a faster plan that needs more HBM than this rung's budget."""
    times = []
    for i, gib in enumerate(HBM_LADDER):
        plan = hbm_ladder[gib]
        assert plan["feasible"], (gib, plan["errors"])
        assert plan["predicted"]["hbm_peak_gib"] <= plan["job"]["hbm_budget_gib"] < gib
        # the search's fastest plan: the headroom rule may then trade up to 2% of it for memory kept free
        times.append((plan.get("headroom") or {}).get("fastest_step_time_s", plan["predicted"]["step_time_s"]))
        _assert_fastest_fitting_by_the_tie_rule(plan)
        if i:
            rejected = [c for c in plan["candidates"] if not c["fits"] and _hbm_refusal(c["why_not"])]
            above = hbm_ladder[HBM_LADDER[i - 1]]["predicted"]
            assert any(c["predicted"]["step_time_s"] < times[-1] for c in rejected) or (
                above["step_time_s"] < plan["predicted"]["step_time_s"]
                and above["hbm_peak_gib"] > plan["job"]["hbm_budget_gib"]), gib
    assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:])), times
    assert times[-1] > 1.05 * times[0], times


def test_a_plan_with_the_window_fixed_still_fits_a_small_gpu(x2):
    """44 GiB GPUs with the window fixed at 4: the sharded/gpu route with the embedding and head on the GPUs
    needs a 1024-token loss chunk to fit (the default 4096 puts it 4.4 GiB over); that chunk costs no time on this
    calibration, so it does not beat the over-budget plan by 0.1%. The plan must still fit its budget."""
    topo, cal = x2
    plan = ap.plan_job(_cfg(policy={"window": 4}), _with_hbm(topo["nvlink"], 44),
                       _with_device_rate(cal["qwen3-8b_bs8_nvlink"]))
    assert plan["feasible"]
    assert plan["predicted"]["hbm_peak_gib"] <= plan["job"]["hbm_budget_gib"], plan["policy"]["loss_chunk_tokens"]


@pytest.mark.parametrize("job", [
    pytest.param({"calibration": "qwen3-8b_bs8_pcie_host", "topology": "pcie_host"}, id="no-p2p"),
    pytest.param({"calibration": "qwen3-8b_bs4_nvlink", "raw": {"micro_batch_size": 4, "grad_accum": 2,
                                                                "optimizer": {"max_grad_norm": 1.0}}},
                 id="bs4-accumulation-clipping"),
    pytest.param({"calibration": "qwen3-8b_bs8_nvlink", "raw": {"host_ram_gib": 140}}, id="host-ram-140"),
    pytest.param({"calibration": "qwen3-8b_bs8_nvlink", "raw": {"host_ram_gib": 140}, "hbm_gib": 64},
                 id="host-ram-140-hbm-64"),
])
def test_every_chosen_plan_fits_the_hbm_budget_and_the_host_ram_limit(x2, job):
    """Across jobs and hosts: the chosen plan's predicted peak HBM is within the budget the plan reports (below
    the GPU's memory) and its host RAM within the limit (the configured host_ram_gib, else the host's cgroup
    limit); with 140 GiB of host RAM the host-reduction routes, whose staging holds whole units, are rejected
    for host RAM and the choice is by the tie rule among what remains."""
    topo_all, cal = x2
    topo = topo_all[job.get("topology", "nvlink")]
    if "hbm_gib" in job:
        topo = _with_hbm(topo, job["hbm_gib"])
    raw = job.get("raw", {})
    plan = ap.plan_job(_cfg(**raw), topo, cal[job["calibration"]])
    assert plan["feasible"], plan["errors"]
    limit = raw.get("host_ram_gib") or topo["host_ram"]["limit_bytes"] / 2**30
    pred = plan["predicted"]
    assert pred["hbm_peak_gib"] <= plan["job"]["hbm_budget_gib"] < topo["gpus"][0]["hbm_bytes"] / 2**30
    assert pred["host_ram_gib"] <= limit
    for c in plan["candidates"]:
        if c["fits"]:
            assert c["predicted"]["hbm_peak_gib"] <= plan["job"]["hbm_budget_gib"]
            assert c["predicted"]["host_ram_gib"] <= limit
    _assert_fastest_fitting_by_the_tie_rule(plan)
    if raw.get("host_ram_gib") == 140:
        host_route = [c for c in plan["candidates"] if c["policy"]["grad_reduce"] == "host"]
        assert host_route and all(not c["fits"] and "host RAM" in c["why_not"] for c in host_route)
        assert plan["policy"]["grad_reduce"] == "gpu"


# ---------------------------------------------------------------------------- peak HBM against the GPU's own count
# tests/runtime/fixtures/h200x1_measured_hbm.json: 15 runs on the one-GPU machine (Qwen3-1.7B, 4B and 8B), each with
# the policy it ran, its calibration and the peak the CUDA allocator reserved (torch.cuda.max_memory_reserved).
@pytest.fixture(scope="module")
def measured_hbm():
    with open(os.path.join(FIX, "h200x1_measured_hbm.json")) as fh:
        fix = json.load(fh)
    with open(os.path.join(FIX, "h200x1_qwen3-1.7b.json")) as fh:
        one = json.load(fh)
    cals = {**{k: v for k, v in fix.items() if k.startswith("calibration_")},
            **{k: v for k, v in one.items() if k.startswith("calibration_")}}
    topo = one["topology"]
    out = []
    for run in fix["runs"]:
        cfg = _cfg(model=run["model"], gpus=1, micro_batch_size=run["micro_batch_size"], seq_len=run["seq_len"],
                   cpu_threads=16, policy=run["policy"])
        run = dict(run, measured_hbm_peak_gib=run["measured_hbm_peak_gib"] - _freed_since_measured(cfg, topo),
                   reserved_as_run_gib=run["measured_hbm_peak_gib"])
        # the loss chunk the run used (its recorded 4096 is the knob's default, which leaves it to the planner's
        # sweep): the head's logits scale with it, so the memory is checked at the chunk that was measured
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(knobs, "LOSS_CHUNKS", (run["policy"]["loss_chunk_tokens"],))
            plan = ap.plan_job(cfg, topo, cals[run["calibration"]])
        assert plan["policy"]["loss_chunk_tokens"] == run["policy"]["loss_chunk_tokens"], run["source"]
        out.append((run, plan))
    return topo["gpus"][0]["hbm_bytes"] / 2**30, out


def _freed_since_measured(cfg, topo) -> float:
    """GiB of gradient buffers the engine held when these one-GPU runs were measured and no longer allocates: with
    one rank it kept a reduce-scatter output the size of the largest unit (the embedding), and an fp32 gradient
    copy per parity sized for that unit rather than for a layer. Both were allocated once at start and held, so
    the allocator's peak drops by their bytes: 2 x 4 B x (2 x largest unit - largest layer). And a device-updated
    layer's gradient then waited in fp32; it waits in bf16 now (held_in_bf16): what the memory model's device
    state gives up by that, asked of it with no layer held in bf16 and as it plans today."""
    from unittest import mock

    from slidedp.planning import memory_model
    from slidedp.planning.job import Job
    from slidedp.policy import ExecutionPolicy

    job = Job.from_config(cfg, topo)
    largest_unit = max(job.padded(u) for u in range(len(job.units)))
    largest_layer = max(job.padded(u) for u in range(1, job.layers + 1))
    freed = 2 * 4 * (2 * largest_unit - largest_layer)
    pol = ExecutionPolicy.default(job.layers, device_layers=int(cfg.policy.device_layers or 0))
    acts = memory_model.ActivationSizes.of(job, None)
    now = memory_model.gpu_parts(job, pol, acts).get("device_state", 0.0)
    with mock.patch.object(memory_model, "device_gradients_bf16", lambda job: set()):
        then = memory_model.gpu_parts(job, pol, acts).get("device_state", 0.0)
    return (freed + then - now) / 2**30


def test_every_plan_that_ran_is_planned_not_refused(measured_hbm):
    """Each of these policies trained on the GPU without running out of memory, two of them at 125.5 GiB of the
    140.4: planned with the calibration of their run, none may be refused."""
    _, runs = measured_hbm
    for run, plan in runs:
        assert plan["feasible"], (run["source"], plan["errors"])
        assert plan["calibration"] == "measured", run["source"]


def test_predicted_peak_hbm_is_within_5_percent_of_what_the_gpu_reserved(measured_hbm):
    """docs/notebook/perf-notes.md's target for the memory model: predicted peak HBM within 5% of the measured peak, on
    the runs that hold a large share of the GPU (kept activations, device-updated layers; here 56 GiB and more),
    and never below the measured peak near the top (above three quarters of the budget), where an under-count
    is an out-of-memory error. The small all-checkpointed runs are not held to 5%: they hold ~3 GiB the model
    does not count (docs/notebook/benchmark-history.md), which the next test bounds."""
    hbm, runs = measured_hbm
    large = [(run, plan) for run, plan in runs if run["reserved_as_run_gib"] >= 0.4 * hbm]
    assert len(large) >= 10
    for run, plan in large:
        assert plan["feasible"], run["source"]
        measured, predicted = run["measured_hbm_peak_gib"], plan["predicted"]["hbm_peak_gib"]
        assert abs(predicted / measured - 1) <= 0.05, (run["source"], predicted, measured)
        if measured >= 0.75 * plan["job"]["hbm_budget_gib"]:
            assert predicted >= measured, (run["source"], predicted, measured)


def test_no_run_reserved_more_than_its_prediction_plus_the_headroom_the_budget_leaves(measured_hbm):
    """The budget keeps part of the GPU out of every plan: whatever the model misses must fit in it, or a plan
    predicted right at the budget runs out of memory. Every run, the small ones included, reserved at most its
    predicted peak plus that headroom."""
    hbm, runs = measured_hbm
    for run, plan in runs:
        assert plan["feasible"], run["source"]
        headroom = hbm - plan["job"]["hbm_budget_gib"]
        missed = run["measured_hbm_peak_gib"] - plan["predicted"]["hbm_peak_gib"]
        assert missed <= headroom, (run["source"], missed, headroom)


# ---------------------------------------------------------------------------- one GPU, a measured calibration
# tests/runtime/fixtures/h200x1_qwen3-1.7b.json: two calibrations the 1-GPU machine measured for Qwen3-1.7B at
# micro-batch 8 (schema 4, docs/results/s5/calibration; schema 5, docs/results/s7/ins17-repeat) and that
# machine's shape as a topology.
ONE_GPU_GRID = {  # the declared one-GPU grid of docs/notebook/benchmark-history.md, as job settings
    "host update, all checkpointed and resident": {"activations": "checkpoint", "resident_units": 28,
                                                   "edge_update": "host", "device_layers": 0},
    "host update, first 14 keep": {"activations": "auto", "keep_layers": 14, "offload_layers": 0,
                                   "edge_update": "host", "device_layers": 0},
    "host update, first 14 offloaded": {"activations": "auto", "keep_layers": 0, "offload_layers": 14,
                                        "edge_update": "host", "device_layers": 0},
    "edges on the GPU, all checkpointed": {"activations": "checkpoint", "edge_update": "gpu", "device_layers": 0},
    "edges + 14 layers on the GPU": {"activations": "checkpoint", "edge_update": "gpu", "device_layers": 14},
    "edges + 14 layers on the GPU, first 14 keep": {"activations": "auto", "keep_layers": 14, "offload_layers": 0,
                                                    "edge_update": "gpu", "device_layers": 14},
    "edges + 14 layers on the GPU, first 14 offloaded": {"activations": "auto", "keep_layers": 0,
                                                         "offload_layers": 14, "edge_update": "gpu",
                                                         "device_layers": 14},
    "everything on the GPU, every layer keeps": {"activations": "keep", "edge_update": "gpu", "device_layers": 28},
}


@pytest.fixture(scope="module", params=["calibration_qwen3-1.7b_bs8", "calibration_qwen3-1.7b_bs8_schema5"])
def one_gpu(request):
    """Schema 4 (2026-12-01, second day) and schema 5 (fourth day, docs/results/s7/ins17-repeat: with
    update_in_step, the host update priced 1.13x the `cpu` rate)."""
    with open(os.path.join(FIX, "h200x1_qwen3-1.7b.json")) as fh:
        fix = json.load(fh)
    return fix["topology"], fix[request.param]


def _plan_1gpu(one_gpu, **policy):
    topo, cal = one_gpu
    return ap.plan_job(_cfg(model="qwen3-1.7b", gpus=1, cpu_threads=16, policy=policy), topo, cal)


def test_autopolicy_is_predicted_no_slower_than_any_row_of_the_declared_grid(one_gpu):
    """AutoPolicy searches routes, device-updated layers and the activation mix: under the same calibration its
    choice must be predicted no slower than every hand-written row of the grid. With this calibration the planner
    of the day it was measured chose a policy predicted 6% slower than "edges + 14 layers on the GPU, first 14
    keep" (and measured 19% slower): its mix search started only from every layer checkpointed, where one more
    kept layer looks worthless to a host-bound step, and offload's HBM was under-counted, which steered the
    search's rounds. Both were changed; either kind of regression fails here."""
    auto = _plan_1gpu(one_gpu)
    assert auto["feasible"] and auto["calibration"] == "measured"
    chosen = auto["predicted"]["step_time_s"]
    rows = {name: _plan_1gpu(one_gpu, **pol) for name, pol in ONE_GPU_GRID.items()}
    timed = {name: p["predicted"]["step_time_s"] for name, p in rows.items() if p["feasible"]}
    assert len(timed) >= 7, sorted(timed)
    for name, t in timed.items():
        assert chosen <= t * 1.001, (name, t, chosen, auto["policy"])
    assert chosen < 0.95 * timed["host update, all checkpointed and resident"]


def test_a_host_bound_plan_takes_more_staging_slots_only_where_they_pay_and_host_ram_allows(x2):
    """More gradient staging slots let the backward run ahead and the host update work through the next forward:
    AutoPolicy takes them when the model prices them at least 1% faster, within a quarter of the host RAM the
    rest of the plan leaves free, and never where the job fixes the count. The cast is on the host, whose bf16
    copy the update writes: there the host update binds (cast on the GPU, the compute does)."""
    topo, cal = x2
    rates = cal["qwen3-8b_bs8_nvlink"]
    host = {"delivery_cast": "host"}
    plan = ap.plan_job(_cfg(policy=host), topo["nvlink"], rates)
    assert plan["predicted"]["bound"]["binding"] == "cpu_update" and plan["policy"]["staging_slots"] > 8
    fixed = ap.plan_job(_cfg(policy={**host, "staging_slots": 8}), topo["nvlink"], rates)
    assert fixed["policy"]["staging_slots"] == 8
    assert plan["predicted"]["step_time_s"] < 0.99 * fixed["predicted"]["step_time_s"]
    more = plan["predicted"]["host_ram_gib"] - fixed["predicted"]["host_ram_gib"]
    assert more > 0
    # host RAM that leaves less than four times the extra slots free beside the default: the default stays
    tight = ap.plan_job(_cfg(host_ram_gib=fixed["predicted"]["host_ram_gib"] + 3.9 * more, policy=host),
                        topo["nvlink"], rates)
    assert tight["policy"]["staging_slots"] < plan["policy"]["staging_slots"]


def test_the_bound_charges_the_host_update_the_gap_before_the_next_first_gradient(x2):
    """When the host update binds, the updater must idle from a step's last update until the next step's first
    gradient: the top host unit's delivery, forward, the loss head, its backward and copy out. With the embedding,
    head and leading layers updated on the GPUs the bound once added nothing there (it charged unit 1's update
    and delivery, both zero for a device layer)."""
    from slidedp.planning.bound import bound

    topo, cal = x2
    job = cm.Job.from_config(_cfg(micro_batch_size=4), topo["nvlink"])
    pol = ExecutionPolicy.default(job.layers, delivery="sharded", grad_reduce="gpu", edge_update="gpu",
                                  device_layers=2)
    rates = cm.Rates(_with_device_rate(cal["qwen3-8b_bs4_nvlink"]), job)
    d, b = cm.durations(job, pol, rates), bound(job, pol, rates)
    assert b["binding"] == "cpu_update"
    top = job.layers  # the head is updated on the GPUs: the last layer is the top unit the host updates
    act = d.activations[top - 1]
    gap = d.deliver[top] + d.layer_fwd[act] + d.head + d.layer_bwd[act] + d.grad_d2h[top]
    assert gap > 0 and b["unhidden_s"] == pytest.approx(gap)
    assert b["step_time_s"] == pytest.approx(b["terms_s"]["cpu_update"] + gap)
    assert b["step_time_s"] <= cm.predict(job, pol, rates)["step_time_s"]


@pytest.mark.slow  # five whole Qwen3-8B plans on two GPUs: part of make test
def test_a_staging_slot_count_the_job_fixes_is_the_one_planned_and_priced(x2):
    """The plan's policy and its prediction carry the job's own policy.staging_slots: the mix search rebuilt the
    policy without it, so a job fixing 32 slots was priced (and shown) with the window's default of 8, while the
    run used 32. A count of 4 also holds the window search below it (window + 1 slots at least)."""
    topo, cal = x2
    rates = cal["qwen3-8b_bs8_nvlink"]
    for n in (4, 16, 32):
        plan = ap.plan_job(_cfg(policy={"staging_slots": n}), topo["nvlink"], rates)
        assert plan["policy"]["staging_slots"] == n and plan["policy"]["window"] < n, plan["policy"]
    eight = ap.plan_job(_cfg(policy={"staging_slots": 8}), topo["nvlink"], rates)
    many = ap.plan_job(_cfg(policy={"staging_slots": 32}), topo["nvlink"], rates)
    assert many["predicted"]["host_ram_gib"] > eight["predicted"]["host_ram_gib"]
