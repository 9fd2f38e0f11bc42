"""The exactly clipped step's terms, as the engine runs it (slidedp.step.optimizer): while gradients land the host
copies each into the held gradient (and on the host route sums the ranks' copies and reads the sum for the norm);
the update of every unit runs after the norm is known, in forward order; the bound of such a step is below the
step the overlap model predicts for it."""

import pytest
from slidedp.config import JobConfig
from slidedp.planning import cost_model as cm
from slidedp.planning.bound import bound
from slidedp.policy import ExecutionPolicy


def _job(topo, **raw):
    base = {"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 2, "micro_batch_size": 8, "seq_len": 2048,
            "optimizer": {"max_grad_norm": 1.0}}
    base.update(raw)
    return cm.Job.from_config(JobConfig.from_dict(base), topo)


def test_a_held_gradient_costs_its_copy_when_the_norm_is_reduced_on_the_gpus(x2):
    """gpu route (and one rank): the norm comes from the GPUs, so holding a gradient is one fp32 copy out of its
    staging slot, 8 B per parameter of host DRAM, not a norm read on top of it."""
    topo, cal = x2
    job = _job(topo["nvlink"])
    pol = ExecutionPolicy.default(job.layers, delivery="sharded", grad_reduce="gpu")
    d = cm.durations(job, pol, cm.Rates(cal["qwen3-8b_bs8_nvlink"], job))
    assert d.hold_bytes == [8.0 * n for n in job.units]


def test_the_host_route_sums_gradients_as_they_land_not_after_the_norm(x2):
    """host route over two ranks with clipping: the ranks' copies are summed (and the sum read for the norm) when
    each gradient lands, before it is held; what runs after the norm is the scaled update alone, the same work
    as the gpu route's."""
    topo, cal = x2
    job = _job(topo["pcie_host"])
    rates = cm.Rates(cal["qwen3-8b_bs8_pcie_host"], job)
    host = cm.durations(job, ExecutionPolicy.default(job.layers, grad_reduce="host"), rates)
    gpu = cm.durations(job, ExecutionPolicy.default(job.layers, grad_reduce="gpu"), rates)
    N = job.world
    assert host.hold_bytes == [n * (8.0 + 4.0 * 3 * N) for n in job.units]
    assert host.update_bytes == gpu.update_bytes
    assert host.update == pytest.approx(gpu.update)


@pytest.mark.parametrize("device_layers", [9, 18, 27])
def test_the_clipped_bound_lets_the_forward_below_the_first_host_unit_run_under_its_update(one_h200, device_layers):
    """Leading layers updated on the GPU need no host update, so after the norm their forward runs while the host
    updates the first host-updated layer: the bound may charge only the forward from that layer on after its
    update and delivery. Charging the whole forward put the bound above the overlap model's own step."""
    topo, cals = one_h200
    cal = cals["calibration_qwen3-4b_bs8"]
    job = cm.Job.from_config(JobConfig.from_dict({
        "model": "qwen3-4b", "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": 8, "seq_len": 2048,
        "cpu_threads": 16, "optimizer": {"max_grad_norm": 1.0}}), topo)
    pol = ExecutionPolicy.mix(job.layers, job.layers, 0, device_layers, grad_reduce="host", edge_update="gpu",
                              device_layers=device_layers)
    rates = cm.Rates(cal, job)
    predicted = cm.predict(job, pol, rates)["step_time_s"]
    assert bound(job, pol, rates)["step_time_s"] <= predicted * 1.001


def test_no_post_norm_update_starts_before_the_backward_of_the_device_updated_layers_ends(one_h200):
    """The norm includes the gradients of the layers updated on the GPU, whose backward comes last: every held
    gradient may be in before it ends, yet no host update may start. So the next forward (the step's start to the
    end of its first micro-batch's forward) lasts at least the whole post-norm update."""
    topo, cals = one_h200
    job = cm.Job.from_config(JobConfig.from_dict({
        "model": "qwen3-4b", "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": 8, "seq_len": 2048,
        "cpu_threads": 16, "optimizer": {"max_grad_norm": 1.0}}), topo)
    pol = ExecutionPolicy.mix(job.layers, job.layers, 0, 9, grad_reduce="host", edge_update="gpu", device_layers=9)
    rates = cm.Rates(cals["calibration_qwen3-4b_bs8"], job)
    post_norm = sum(cm.durations(job, pol, rates).update)
    assert cm.predict(job, pol, rates)["spans"]["forward"] >= post_norm
