"""The FSDP2 peer on the CPU: two real gloo rank processes on loopback, tiny-qwen3, seq 32, mbs 2, 4 steps."""

from __future__ import annotations

import math

import pytest
from slidedp.peers import fsdp2
from slidedp.presets import TINY_VOCAB

SHAPE = {"model": "tiny-qwen3", "gpus": 0, "ranks": 2, "mbs": 2, "seq": 32, "steps": 4, "warmup": 1}
LR = 1e-2  # large enough that the later steps' losses depend on the earlier updates


@pytest.fixture(scope="module")
def resident():
    """GPU-resident form (fused AdamW on the compute device), every layer recomputed, clipping on but loose."""
    return fsdp2.run_fsdp2(**SHAPE, offload=False, keep_layers=0, threads=1, lr=LR, max_grad_norm=1e9)


@pytest.fixture(scope="module")
def offload():
    """CPUOffloadPolicy form (fused CPU AdamW), no recompute, on the very rows the resident form draws itself."""
    rows = fsdp2.random_rows(SHAPE["steps"] * SHAPE["ranks"] * SHAPE["mbs"], SHAPE["seq"], TINY_VOCAB).tolist()
    return fsdp2.run_fsdp2(**SHAPE, offload=True, keep_layers=None, threads=1, lr=LR, data_rows=rows)


@pytest.fixture(scope="module")
def compiled():
    """The resident form with every decoder layer's forward through torch.compile (aot_eager on the CPU)."""
    return fsdp2.run_fsdp2(**SHAPE, offload=False, keep_layers=0, threads=1, lr=LR, max_grad_norm=1e9,
                           compiled_layers=True)


def _check_row(row: dict, peer: str) -> None:
    assert "error" not in row, row.get("error")
    assert row["peer"] == peer and row["world"] == 2 and row["threads"] == 1
    assert row["step_s"] > 0 and len(row["times"]) == 4
    assert row["step_s"] == sorted(row["times"][1:])[1]  # median of the steps after warm-up
    assert row["tokens_per_s"] == pytest.approx(2 * 32 * 2 / row["step_s"])
    assert len(row["losses"]) == 4 and all(math.isfinite(x) for x in row["losses"])
    assert row["hbm_peak_gib"] == 0.0 and row["host_rss_gib"] > 0.1
    assert row["params"] == 238_272  # tiny-qwen3: embedding + 4 layers + norm + untied lm_head


def test_resident_form_trains_with_fused_adamw(resident):
    _check_row(resident, "fsdp2")
    assert resident["keep_layers"] == 0
    assert len(resident["grad_norms"]) == 4 and all(0 < g < 1e3 for g in resident["grad_norms"])


def test_offload_form_trains_with_fused_cpu_adamw(offload):
    _check_row(offload, "fsdp2-offload")
    assert "grad_norms" not in offload


def test_first_loss_is_that_of_a_random_model(resident):
    assert resident["losses"][0] == pytest.approx(math.log(TINY_VOCAB), rel=0.1)


def test_offload_and_recompute_leave_the_training_unchanged(resident, offload):
    # Same init, same rows: where AdamW runs and what is recomputed change no number. At lr 1e-2 one update
    # moves the next loss by ~4e-3 relative, so a step that went missing or differed would show.
    assert offload["losses"] == pytest.approx(resident["losses"], rel=1e-5)


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_compiled_layers_train_as_the_eager_ones(resident, compiled):
    # aot_eager runs the captured graphs without generating kernels: the numbers of eager, step after step
    _check_row(compiled, "fsdp2")
    assert compiled["compiled_layers"] is True and resident["compiled_layers"] is False
    assert compiled["compiled_graphs"] == 1 and "compiled_graphs" not in resident  # one graph for every layer
    assert compiled["losses"] == pytest.approx(resident["losses"], rel=1e-6)
    assert compiled["grad_norms"] == pytest.approx(resident["grad_norms"], rel=1e-6)


def test_one_compiled_graph_serves_every_layer_and_its_recompute():
    # 36 distinct layer modules (a qwen3-8b's count), the last 28 checkpointed: every forward and every recompute
    # runs the one graph, none falls back to eager after a recompile limit
    import torch
    from slidedp.step.model_adapter import load_hf_config
    from torch._dynamo.backends.debugging import aot_eager
    from transformers import AutoModelForCausalLM

    graphs, runs = [], [0]

    def counting(gm, inputs):
        graphs.append(gm)
        compiled = aot_eager(gm, inputs)

        def run(*args):
            runs[0] += 1
            return compiled(*args)

        return run

    cfg = load_hf_config("tiny-qwen3")
    cfg.num_hidden_layers, cfg.layer_types = 36, [cfg.layer_types[0]] * 36
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).train()
    torch._dynamo.reset()
    try:
        fsdp2.compile_layers(model.model.layers, counting)
        fsdp2.apply_checkpointing(model.model.layers, keep_layers=8)
        ids = torch.randint(0, TINY_VOCAB, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1 and runs[0] == 36 + 28


def test_rank_failure_is_a_row_with_the_rank_log():
    row = fsdp2.run_fsdp2("no-such-model", 0, 1, 8, 1, 0, offload=False, keep_layers=None, threads=1, ranks=2)
    assert row["peer"] == "fsdp2" and "step_s" not in row
    assert "unknown model preset 'no-such-model'" in row["error"]


def test_each_rank_takes_its_own_rows_per_step():
    assert fsdp2.global_rows(0, 0, 2, 2) == [0, 1]
    assert fsdp2.global_rows(0, 1, 2, 2) == [2, 3]
    assert fsdp2.global_rows(3, 1, 2, 2) == [14, 15]


def test_checkpointing_recomputes_exactly_the_layers_after_the_kept_ones():
    import torch
    from slidedp.step.model_adapter import load_hf_config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(load_hf_config("tiny-qwen3")).train()
    calls = [0] * len(model.model.layers)
    for i, layer in enumerate(model.model.layers):
        def counted(*args, _i=i, _forward=layer.forward, **kwargs):
            calls[_i] += 1
            return _forward(*args, **kwargs)

        layer.forward = counted
    fsdp2.apply_checkpointing(model.model.layers, keep_layers=1)
    ids = torch.randint(0, TINY_VOCAB, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    assert calls == [1, 2, 2, 2]  # layer 0 keeps its activations; the others run again in backward


def test_bad_arguments_are_refused_before_any_process_starts():
    with pytest.raises(ValueError):
        fsdp2.run_fsdp2("tiny-qwen3", 0, 2, 32, 4, 1, offload=False, keep_layers=None, threads=1, ranks=0)
    with pytest.raises(ValueError):
        fsdp2.run_fsdp2("tiny-qwen3", 0, 2, 32, 4, 1, offload=False, keep_layers=None, threads=1, ranks=2,
                        data_rows=[[1, 2, 3]])
