"""The cost model: memory parts as the engine allocates them, and the overlap model's step time.

Times use the calibration fixture of the nvidia-h200-x2 machine (tests/runtime/fixtures/h200x2_*.json, built from
the ceilings measured there on 2026-11-29, docs/architecture.md §4; the figures it had to derive are labelled in
its "notes")."""

import copy
import dataclasses
import os
import subprocess
import sys

import pytest
from slidedp import policy as execution
from slidedp import schedule
from slidedp.config import JobConfig
from slidedp.planning import cost_model as cm
from slidedp.planning import memory_model as mm
from slidedp.planning import overlap
from slidedp.policy import ExecutionPolicy
from slidedp.presets import PRESETS, unit_param_counts

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def _job(topo, **raw):
    base = {
        "model": "qwen3-8b",
        "data": {"path": "x.jsonl"},
        "gpus": 2,
        "micro_batch_size": 8,
        "seq_len": 2048,
        "optimizer": {"max_grad_norm": 0.0},  # the figures below are of unclipped jobs unless a test clips
    }
    base.update(raw)
    return cm.Job.from_config(JobConfig.from_dict(base), topo)


def test_host_memory_is_the_state_once_plus_per_rank_staging(x2):
    topo, cal = x2
    units = unit_param_counts(PRESETS["qwen3-8b"])
    P, max_unit = sum(units), max(units)
    job = _job(topo["nvlink"], optimizer={"max_grad_norm": 1.0})
    acts = mm.ActivationSizes.of(job, cal["qwen3-8b_bs8_nvlink"])
    pol = ExecutionPolicy.mix(job.layers, 0, 3, 0, grad_reduce="host", window=5)
    h = mm.host_parts(job, pol, acts)
    assert h["master_and_moments"] == 12 * P and h["delivery_copy"] == 2 * P
    assert h["gradient_staging"] == 2 * execution.staging_slots(5) * max_unit * 4  # host route: whole units per slot
    assert h["held_gradient"] == 4 * P  # exact clipping holds the whole reduced gradient
    assert h["host_reduce_scratch"] == 2 * (max_unit // 2) * 4
    assert h["offloaded_activations"] == 2 * 3 * acts.keep
    fp32 = mm.host_parts(_job(topo["nvlink"], precision="fp32"), ExecutionPolicy.default(job.layers), acts)
    assert fp32["delivery_copy"] == 0  # the fp32 master is delivered directly


def test_each_kept_layer_costs_its_measured_activations_in_hbm(x2):
    topo, cal = x2
    job = _job(topo["nvlink"])
    acts = mm.ActivationSizes.of(job, cal["qwen3-8b_bs8_nvlink"])
    assert acts.measured and acts.keep == cal["qwen3-8b_bs8_nvlink"]["unit"]["saved_keep_bytes"]
    m = [mm.memory(job, ExecutionPolicy.mix(job.layers, k, 0, 0), acts)["hbm_peak_bytes"] for k in (5, 6)]
    assert m[1] - m[0] == pytest.approx((acts.keep - acts.checkpoint) * (1 + mm.ALLOCATOR_SLACK))
    r = [mm.memory(job, ExecutionPolicy.mix(job.layers, 0, 0, n), acts)["hbm_peak_bytes"] for n in (0, 1)]
    assert r[1] - r[0] == pytest.approx(job.padded(1) * 2 * (1 + mm.ALLOCATOR_SLACK))


def test_saved_activation_estimate_matches_the_measured_qwen3_8b_layer(x2):
    topo, cal = x2
    for bs in (4, 8):
        job = _job(topo["nvlink"], micro_batch_size=bs)
        measured = cal[f"qwen3-8b_bs{bs}_nvlink"]["unit"]["saved_keep_bytes"]
        assert mm.estimate_saved_bytes(job) == pytest.approx(measured, rel=0.02)
    assert not mm.ActivationSizes.of(job, None).measured


def test_phases_partition_the_predicted_step(x2):
    topo, cal = x2
    job = _job(topo["nvlink"])
    rates = cm.Rates(cal["qwen3-8b_bs8_nvlink"], job)
    for pol in (ExecutionPolicy.default(job.layers), ExecutionPolicy.mix(job.layers, 10, 2, 36, delivery="sharded", grad_reduce="gpu")):
        p = cm.predict(job, pol, rates)
        assert set(p["phases"]) == set(cm.PHASES)
        assert sum(p["phases"].values()) == pytest.approx(p["step_time_s"], rel=1e-9)
        # forward and backward are busy compute: each layer's calibrated work, once per step
        u = cal["qwen3-8b_bs8_nvlink"]["unit"]
        fwd = sum(u["fwd_keep_s"] if a != "checkpoint" else u["fwd_checkpoint_s"] for a in pol.activations)
        assert p["phases"]["forward"] == pytest.approx(fwd + cal["qwen3-8b_bs8_nvlink"]["embedding"]["fwd_s"])
        # the engine's cut of the same step (one micro-batch): each span holds its busy work and the waits in it
        assert sum(p["spans"].values()) == pytest.approx(p["step_time_s"], rel=1e-9)
        assert p["spans"]["forward"] >= p["phases"]["forward"] and p["spans"]["backward"] >= p["phases"]["backward"]


def test_sharded_delivery_takes_one_nth_from_the_host(x2):
    topo, cal = x2
    job = _job(topo["nvlink"])
    rates = cm.Rates(cal["qwen3-8b_bs8_nvlink"], job)
    rep = cm.durations(job, ExecutionPolicy.default(job.layers, delivery="replicated"), rates)
    sh = cm.durations(job, ExecutionPolicy.default(job.layers, delivery="sharded", grad_reduce="gpu"), rates)
    assert sum(sh.deliver_bytes) == pytest.approx(sum(rep.deliver_bytes) / 2)
    assert sum(sh.grad_bytes) == pytest.approx(sum(rep.grad_bytes) / 2)
    assert all(t > 0 for t in sh.all_gather) and not any(rep.all_gather)


def test_recompute_is_free_when_the_host_update_binds_and_exposed_when_compute_binds(x2):
    topo, cal = x2
    job = _job(topo["nvlink"])
    pol = ExecutionPolicy.default(job.layers, delivery="sharded", grad_reduce="gpu")
    measured = cm.predict(job, pol, cm.Rates(cal["qwen3-8b_bs8_nvlink"], job), exposure=True)
    assert max(measured["exposed"], key=measured["exposed"].get) == "cpu_update"
    assert measured["exposed"]["recompute"] < 0.01 * measured["step_time_s"]
    # A hypothetical host ten times faster (update and memory alike): now the GPU binds.
    fast = copy.deepcopy(cal["qwen3-8b_bs8_nvlink"])
    fast["cpu"]["update_s_per_1e9"] = [v / 10 for v in fast["cpu"]["update_s_per_1e9"]]
    fast["host_dram"]["capacity_GBps"] *= 10
    p = cm.predict(job, pol, cm.Rates(fast, job), exposure=True)
    u = fast["unit"]
    assert p["exposed"]["recompute"] == pytest.approx(
        job.layers * (u["bwd_checkpoint_s"] - u["bwd_keep_s"]) * cm.IN_STEP_BACKWARD, rel=0.05
    )
    assert p["step_time_s"] < measured["step_time_s"]


def test_the_host_update_is_priced_at_its_rate_beside_the_issuing_thread(x2):
    """calibration.update_in_step scales every thread count's host update rate by what the update measured beside
    a thread issuing a layer's forward and backward, against `cpu` at the same thread count; without it (schema
    4 and older, CPU calibrations) the rates stand."""
    topo, cal = x2
    job = _job(topo["nvlink"])
    base = cal["qwen3-8b_bs8_nvlink"]
    slow = copy.deepcopy(base)
    cpu = slow["cpu"]
    at = cpu["threads"][-1]
    slow["update_in_step"] = {"threads": at, "cast": True, "alone_s_per_1e9": cpu["update_s_per_1e9"][-1],
                              "beside_load_s_per_1e9": 1.5 * cpu["update_s_per_1e9"][-1]}
    one, scaled = cm.Rates(base, job), cm.Rates(slow, job)
    assert scaled.update_s(10**8, "host") == pytest.approx(1.5 * one.update_s(10**8, "host"))
    told = scaled.host_update_summary("host")  # what the plan shows its reader
    assert told["in_step_factor"] == pytest.approx(1.5) and one.host_update_summary("host")["in_step_factor"] == 1.0
    assert told["s_per_1e9"] == pytest.approx(1.5 * told["cpu_s_per_1e9"])
    pol = ExecutionPolicy.default(job.layers, delivery="sharded", grad_reduce="gpu")
    before = cm.predict(job, pol, one, exposure=True)
    after = cm.predict(job, pol, scaled, exposure=True)
    assert after["busy"]["cpu"] == pytest.approx(1.5 * before["busy"]["cpu"], rel=0.02)
    assert after["step_time_s"] > before["step_time_s"]


def test_exact_clipping_defers_the_updates_behind_the_whole_backward(x2):
    topo, cal = x2
    off, on = _job(topo["nvlink"]), _job(topo["nvlink"], optimizer={"max_grad_norm": 1.0})
    pol = ExecutionPolicy.default(off.layers, delivery="sharded", grad_reduce="gpu")
    p_off = cm.predict(off, pol, cm.Rates(cal["qwen3-8b_bs8_nvlink"], off))
    p_on = cm.predict(on, pol, cm.Rates(cal["qwen3-8b_bs8_nvlink"], on))
    assert p_on["step_time_s"] > p_off["step_time_s"] + 0.5
    # every update waits for the norm, so the host works on them after the backward: the step is at least
    # the backward plus the updates of the units the next forward needs before it can run far
    assert p_on["phases"]["update_tail"] > p_off["phases"]["update_tail"]
    # ...and the engine would see it in the next step's forward, which waits for those updates
    assert p_on["spans"]["forward"] > p_off["spans"]["forward"] + 0.5


def test_window_plan_reuses_the_last_layers_at_the_turn():
    L, slots = 6, 3
    sched = schedule.step_schedule(L, 1)
    plan, issued = schedule.window_plan(sched, {0, L + 1}, slots)
    backward = [k for k in range(len(sched)) if k > sched.index(L + 1)]
    delivered = [sched[k] for k in backward if plan[k][2]]
    assert delivered == [3, 2, 1]  # layers 6, 5, 4 are still in the window when backward starts
    assert all(issued[k] <= k for k in range(len(sched)))


def test_missing_collectives_are_reported_not_invented(x2):
    topo, cal = x2
    job = _job(topo["nvlink"])
    partial = {k: v for k, v in cal["qwen3-8b_bs8_nvlink"].items() if k != "collectives"}
    rates = cm.Rates(partial, job)
    cm.predict(job, ExecutionPolicy.default(job.layers), rates)  # replicated + host needs no collective
    with pytest.raises(cm.Uncalibrated, match="collectives not measured"):
        cm.predict(job, ExecutionPolicy.default(job.layers, delivery="sharded"), rates)
    with pytest.raises(cm.Uncalibrated, match="not this job's shape"):
        cm.Rates(cal["qwen3-8b_bs8_nvlink"], _job(topo["nvlink"], micro_batch_size=4))


def test_planning_modules_import_no_torch():
    code = (
        "import sys; import slidedp.planning.autopolicy, slidedp.planning.cost_model, "
        "slidedp.planning.overlap, slidedp.planning.long_step, slidedp.planning.topology, slidedp.planning.marginal, "
        "slidedp.planning.report; print('torch' in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH="runtime")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("gpus,route,edge,layers", [(1, "host", "gpu", 0), (1, "host", "gpu", 36),
                                                     (2, "gpu", "gpu", 9), (2, "gpu", "host", 9), (2, "host", "host", 0)])
def test_staging_holds_only_the_gradients_the_host_updates(x2, gpus, route, edge, layers):
    """A unit updated on the GPUs never stages its gradient on the host: with the embedding and head there a slot
    is sized by the largest decoder layer, not by the 0.62B-param head. The memory model's staging figure is the
    layout's, byte for byte (slidedp.step.layout.plan_layout)."""
    from slidedp.launch import host_layout

    topo, cal = x2
    numels = unit_param_counts(PRESETS["qwen3-8b"])
    job = _job(topo["nvlink"], gpus=gpus)
    pol = ExecutionPolicy.mix(job.layers, 0, 0, 0, grad_reduce=route, edge_update=edge, device_layers=layers)
    modelled = mm.host_parts(job, pol, mm.ActivationSizes.of(job, cal["qwen3-8b_bs8_nvlink"]))["gradient_staging"]
    cfg = JobConfig.from_dict({"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": gpus})
    layout = host_layout(cfg, numels, pol.for_world(gpus))
    assert modelled == layout.world * layout.staging_slots * layout.slot_numel * 4  # fp32 slots
    edges = (0, len(numels) - 1) if edge == "gpu" else ()
    sent = max((n for u, n in enumerate(numels) if u not in edges and not 1 <= u <= layers), default=1)
    per_slot = sent if route == "host" or gpus == 1 else -(-sent // gpus)
    assert layout.slot_numel == per_slot
    if edge == "gpu":
        assert layout.slot_numel <= numels[1]  # a decoder layer, whatever the head's size


def test_the_engine_cut_counts_the_device_update_as_backward(x2):
    """The engine records backward_end again after the device update (step.engine._end_backward), so its backward
    holds that update and its forward starts after it; the spans must cut the step the same way. Cut at the
    embedding's backward instead, the device update (Qwen3-8B bs8 on one H200, s19: 26-45 ms) was in the forward
    span and the backward span was shorter than the busy backward it holds."""
    topo, cal = x2
    job = _job(topo["nvlink"])
    rates = cm.Rates({**cal["qwen3-8b_bs8_nvlink"], "device_update": {"adamw_cast_s_per_1e9": 0.0095}}, job)
    for device_layers in (8, 36):
        pol = ExecutionPolicy.mix(job.layers, 14, 0, 9, edge_update="gpu", device_layers=device_layers,
                                  delivery="sharded", grad_reduce="gpu")
        update = sum(cm.durations(job, pol, rates).device_update)
        p = cm.predict(job, pol, rates)
        assert update > 0.02
        assert sum(p["spans"].values()) == pytest.approx(p["step_time_s"], rel=1e-9)
        # each span holds its own busy work (the device update is the backward's) and no more than its waits
        assert p["spans"]["backward"] >= p["phases"]["backward"] - 1e-9
        assert p["spans"]["forward"] >= p["phases"]["forward"] - 1e-9
        assert p["spans"]["forward"] < p["phases"]["forward"] + update


def test_the_loss_head_is_charged_its_fp32_gradient_sum_per_chunk_where_calibration_did_not_time_it(one_h200):
    """The engine adds each loss chunk's lm_head weight gradient (vocab x hidden, bf16) into the step's fp32 sum
    (slidedp.step.engine `_head`): 10 B/param of device memory work per chunk, 6.2 GB for Qwen3-8B. A calibration
    that timed the head without it (no `loss_head.accumulates`) is charged it at the memory rate of the device's
    calibrated AdamW (30 B/param); one whose microbenchmark does it is not charged twice."""
    topo, cals = one_h200
    cal = cals["calibration_qwen3-8b_bs8"]
    assert not cal["loss_head"].get("accumulates")
    job = _job(topo, gpus=1)
    rates = cm.Rates(cal, job)
    per_param_s = cal["device_update"]["adamw_cast_s_per_1e9"] / 1e9 / 30  # per byte
    per_chunk = job.vocab * job.hidden * 10 * per_param_s
    assert rates.head_accumulate_s() == pytest.approx(per_chunk, rel=1e-12)
    assert 1.5e-3 < per_chunk < 3e-3  # 6.2 GB at ~3 TB/s
    h = cal["loss_head"]
    tokens = job.tokens_per_micro_batch  # 16384: 16 chunks of 1024, 4 of 4096
    for chunk, n in ((1024, 16), (4096, 4)):
        timed = tokens * h["s_per_token"] + n * h["s_per_chunk"]
        assert rates.head_s(chunk) == pytest.approx(timed + n * per_chunk, rel=1e-12)
    timed_with_it = cm.Rates({**cal, "loss_head": {**h, "accumulates": True}}, job)
    assert timed_with_it.head_s(1024) == pytest.approx(tokens * h["s_per_token"] + 16 * h["s_per_chunk"], rel=1e-12)
    # the step pays it where the head runs: fewer, larger chunks pay it fewer times
    pol = ExecutionPolicy.default(job.layers)
    small, large = (cm.predict(job, dataclasses.replace(pol, loss_chunk_tokens=c), rates)["step_time_s"]
                    - cm.predict(job, dataclasses.replace(pol, loss_chunk_tokens=c), timed_with_it)["step_time_s"]
                    for c in (1024, 4096))
    assert small > large > 0


@pytest.mark.parametrize("accum,per_param", [(1, 8.0), (2, 12.0)])
def test_each_layers_gradient_costs_the_compute_stream_its_zeroing_and_its_trip_cast(one_h200, accum, per_param):
    """After each decoder layer's backward the engine's compute stream has done more than calibration times of the
    layer (slidedp.step.engine `_layer_backward`, `_layer_gradient_out`): the bf16 gradient buffer zeroed before it
    (2 B/param), then in bf16 without accumulation the gradient widened to fp32 for its trip (2 read, 4 written),
    or with accumulation added into the layer's fp32 sum (2 read, 8 read and written), in every micro-batch; at the
    memory rate of the device's calibrated AdamW (30 B/param). The s21 timelines show it as the 0.30 ms (Qwen3-4B)
    and 0.61 ms (Qwen3-8B) between one layer's backward and the next, against 0.26 and 0.50 ms charged."""
    topo, cals = one_h200
    cal = cals["calibration_qwen3-8b_bs8"]
    job = _job(topo, gpus=1, grad_accum=accum)
    rates = cm.Rates(cal, job)
    per_byte_s = cal["device_update"]["adamw_cast_s_per_1e9"] / 1e9 / 30
    d = cm.durations(job, ExecutionPolicy.default(job.layers), rates)
    assert d.gradient_out[0] == d.gradient_out[-1] == 0.0  # the embedding and head sum in fp32 where they run
    for u in range(1, job.layers + 1):
        assert d.gradient_out[u] == pytest.approx(job.padded(u) * per_param * per_byte_s, rel=1e-12)
    # the replay runs it on the compute stream after each layer's backward, every micro-batch
    without = dataclasses.replace(d, gradient_out=[])
    busy = [overlap.replay(x).busy["compute"] for x in (d, without)]
    assert busy[0] - busy[1] == pytest.approx(accum * sum(d.gradient_out), rel=1e-6)
    # an fp32 job zeroes its buffer alone (4 B/param) and sends it as it is
    if accum == 1:
        rates.job = dataclasses.replace(job, precision="fp32")
        assert rates.job.pbytes == 4 and rates.gradient_out_s(1000) == pytest.approx(1000 * 4 * per_byte_s, rel=1e-12)


def test_a_cpu_calibration_times_the_loss_head_with_its_gradient_sum():
    """The loss head's microbenchmark does what the step does after each chunk (the fp32 sum), and says so."""
    import torch
    from slidedp.planning.model_bench import ModelParts
    from slidedp.presets import model_config_dict

    parts = ModelParts(model_config_dict("tiny-qwen3"), torch.device("cpu"), torch.float32)
    head = parts.loss_head(64, 128, reps=2)
    assert head["accumulates"] is True and head["chunk_tokens"] == [32, 64]
