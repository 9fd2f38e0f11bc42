"""The job holds no policy choice: the delivery cast (where the bf16 weights are made from the fp32 master) is the
ExecutionPolicy's, so one Job and one Rates price both casts, each as the planner priced it when it sized a job for
that cast alone. On the two-H200 machine's figures (tests/runtime/fixtures/h200x2_*.json) and the one-H200's."""

import dataclasses

import pytest
from slidedp.config import JobConfig, PolicyConfig
from slidedp.planning import cost_model as cm
from slidedp.planning.job import Job
from slidedp.policy import ExecutionPolicy


def _cfg(**raw) -> JobConfig:
    base = {"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 2, "micro_batch_size": 8, "seq_len": 2048}
    base.update(raw)
    return JobConfig.from_dict(base)


# Predicted step (s) of Qwen3-8B at micro-batch 8 on the NVLink pair under each cast's default policy, by
# (max_grad_norm, cast): what the cost model gave a job sized with that cast fixed in its config, before the cast
# left the job (the planner at 3533ce9). Since the replay's shared-bandwidth rounds run until the durations settle
# (2026-12-05; they stopped after three before) the figures are 0.4% (cast on the host) and 2.7-3.3% (on the GPU:
# fp32 deliveries, twice the link's bytes) longer; before: 4.829529888815151, 4.4068490305599965, 5.682185893991554,
# 5.213255622064997. With a layer's backward charged as step timelines measured it inside the step
# (cost_model.IN_STEP_BACKWARD, 2026-12-06; the host binds this pair, so under 0.1% longer): 4.849187421625778,
# 4.550827008149196, 5.704715080322089 and 5.353522922020234 before. With the first unit after the norm charged
# its measured start (cost_model.POST_NORM_START_S, 2026-12-06; the clipped steps 0.05 s longer): 5.706254545820259
# and 5.356741402459492 before. With a copy's link-limited rate shared again in host memory and host memory shared
# by the calibrated weight of the update (planning/pools.py, 2026-12-06): 4.852454113786866, 4.554069570875001,
# 5.756254545820258 and 5.406741402459493 before.
NVLINK_STEP_S = {(0.0, "host"): 4.849278284919742, (0.0, "gpu"): 4.491314446091389,
                 (1.0, "host"): 5.7535119515043105, (1.0, "gpu"): 5.349747259111115}
# The same on the one-H200 machine with 2 device layers, the embedding and head on the GPU, 3 layers streamed and
# 4 kept, 2 offloaded, 10 resident (Qwen3-8B at micro-batch 8). With the cast on the GPU the streamed layers' copies
# in share the host->GPU direction with the fp32 deliveries (each direction a pool of its own since 2026-12-04:
# 2.6304397465515694 and 3.768990015843984 before). Since the streamed layers' updated weights stay on the GPU
# (2026-12-05) their next delivery is a device copy: (0.0, "gpu") 2.6313771709079767 before; the rest unchanged.
# Both priced with the post-norm update in one pass (policy.post_norm_passes 1), as when they were written. With the
# shared-bandwidth rounds run until they settle (2026-12-05) they are 0.2-1.6% longer; before: 2.557782639066721,
# 2.628921480478341, 3.6290833289203617, 3.769477072591862. With each layer's gradient zeroed and widened on the
# compute stream priced (cost_model.Rates.gradient_out_s, the same day): 2.5996878454208128, 2.647349016230958,
# 3.6452239881493913 and 3.777409179377164 before. With the streamed layers right after the device layers (layers
# 3-5 here, not 34-36: slidedp.schedule.streamed_units, the same day): 2.598056522407424, 2.648593817713514,
# 3.662100912238551 and 3.7942861034663236 before. With a layer's backward charged as in the step
# (cost_model.IN_STEP_BACKWARD, 2026-12-06): 2.4299541060444816, 2.480774584735111, 3.62052335901494 and
# 3.7550412840962633 before. With the first unit after the norm charged its measured start
# (cost_model.POST_NORM_START_S, 2026-12-06): 3.705368093435709 and 3.839886018517033 before (the clipped steps
# 0.022 s longer: the streamed layers' updates run beside the start). With a copy's link-limited rate shared again
# in host memory and host memory shared by the calibrated weight of the update (planning/pools.py, 2026-12-06):
# 2.4659376789277205, 2.479486664203538, 3.7276591229096 and 3.8610428709163305 before. With copies beside the host
# update held to the rate calibration measured them at beside it (pools._beside_update, 2026-12-08; the GPU cast's
# fp32 deliveries and the gradients going out exceed it together beside the update): 2.467976040930033,
# 2.468129086883246, 3.7256620076410645 and 3.859406042023038 before.
ONE_GPU_STEP_S = {(0.0, "host"): 2.4698917983491073, (0.0, "gpu"): 2.494700340165692,
                  (1.0, "host"): 3.7260901910026965, (1.0, "gpu"): 3.8656097321804435}


def _head_as_timed(calibration: dict) -> dict:
    """The calibration with its loss head priced as timed: the figures above predate the fp32 accumulation of
    the head's weight gradient that a calibration without `loss_head.accumulates` is charged (2026-12-05,
    test_cost_model's head tests), which moves every step alike and is not what these tests compare."""
    return {**calibration, "loss_head": {**calibration["loss_head"], "accumulates": True}}


def test_the_job_has_no_policy_field():
    policy = {f.name for f in dataclasses.fields(PolicyConfig)}
    assert not policy & {f.name for f in dataclasses.fields(Job)}


@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_one_job_prices_each_cast_by_the_policy(x2, clip):
    topo, cal = x2
    job = Job.from_config(_cfg(optimizer={"max_grad_norm": clip}), topo["nvlink"])  # the cast left to AutoPolicy
    rates = cm.Rates(_head_as_timed(cal["qwen3-8b_bs8_nvlink"]), job)
    cpu = cal["qwen3-8b_bs8_nvlink"]["cpu"]
    by_cast = {}
    for cast in ("host", "gpu"):
        pol = ExecutionPolicy.default(job.layers, delivery_cast=cast, post_norm_passes=1)
        d = cm.durations(job, pol, rates)
        # the bf16 copy crosses PCIe, or the fp32 master cast on the GPUs
        assert d.deliver_bytes[1] == job.padded(1) * (2 if cast == "host" else 4)
        # the host update with the bf16 cast, or AdamW alone
        table = cpu["update_s_per_1e9"] if cast == "host" else cpu["adamw_s_per_1e9"]
        charged = rates.host_update_summary(cast)["cpu_s_per_1e9"]
        assert charged == pytest.approx(cm._interp(cpu["threads"], table, job.cpu_threads), rel=1e-12)
        by_cast[cast] = d
        step = cm.predict(job, pol, rates)["step_time_s"]
        assert step == pytest.approx(NVLINK_STEP_S[(clip, cast)], rel=1e-9)
    # 6 B/param of host DRAM traffic the bf16 copy costs the update (34 against 28)
    diff = by_cast["host"].update_bytes[1] - by_cast["gpu"].update_bytes[1]
    assert diff == pytest.approx(6.0 * job.units[1])


@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_device_and_streamed_layers_are_priced_by_the_policys_cast(one_h200, clip):
    topo, cals = one_h200
    job = Job.from_config(_cfg(gpus=1, optimizer={"max_grad_norm": clip}), topo)
    rates = cm.Rates(_head_as_timed(cals["calibration_qwen3-8b_bs8"]), job)
    for cast in ("host", "gpu"):
        pol = ExecutionPolicy.mix(job.layers, 4, 2, 10, delivery_cast=cast, edge_update="gpu", device_layers=2,
                                  streamed_layers=3, post_norm_passes=1)
        d = cm.durations(job, pol, rates)
        u = max(pol.streamed_units())  # a streamed layer sends its bf16 copy back only where the host keeps one
        assert d.streamed_bytes[u] == pytest.approx(job.units[u] * (26 if cast == "host" else 24))
        step = cm.predict(job, pol, rates)["step_time_s"]
        assert step == pytest.approx(ONE_GPU_STEP_S[(clip, cast)], rel=1e-9)
