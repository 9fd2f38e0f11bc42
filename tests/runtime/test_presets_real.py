"""The real-shape presets of the models people fine-tune (Llama 3.2 1B/3B, Llama 3.1 8B, Mistral 7B v0.3, Qwen2.5
7B): their parameter counts are the published ones, transformers builds them through the runtime's model adapter
(on the meta device, nothing allocated), AutoPolicy plans each on the two-H200 host, `slidedp presets` lists them,
and a shrunken copy of each (same architecture and options: q/k/v biases, tied embeddings, llama3 rope scaling)
computes, unit by unit through the adapter, the logits plain transformers computes."""

from __future__ import annotations

import json
import os

import pytest
import torch
from slidedp import cli
from slidedp.config import JobConfig
from slidedp.data.tokenizer import tokenizer_source
from slidedp.planning import autopolicy as ap
from slidedp.presets import PRESETS, PUBLISHED_PARAMS, param_count, unit_param_counts
from slidedp.step.model_adapter import ModelAdapter, checkpoint_index, load_hf_config

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
REAL = ("llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "mistral-7b-v0.3", "qwen2.5-7b")


@pytest.mark.parametrize("name", REAL)
def test_parameter_count_is_the_published_one(name):
    n = param_count(PRESETS[name])
    assert abs(n / PUBLISHED_PARAMS[name] - 1) < 0.005, (name, n)


@pytest.mark.parametrize("name", REAL)
def test_transformers_builds_the_preset_with_the_units_the_planner_counts(name):
    """The adapter's model lives on the meta device: its units hold the parameters unit_param_counts predicts,
    and the whole model (a tied head counted once) as many as param_count."""
    adapter = ModelAdapter(load_hf_config(name))
    assert [u.numel for u in adapter.units] == unit_param_counts(PRESETS[name])
    assert sum(p.numel() for p in adapter.meta_model.parameters()) == param_count(PRESETS[name])
    assert adapter.tied == PRESETS[name]["tie_word_embeddings"]
    attn = adapter.layer_template.self_attn
    assert (attn.q_proj.bias is not None) == (name == "qwen2.5-7b")
    assert attn.o_proj.bias is None


def test_rope_and_window_options_reach_the_transformers_config():
    assert load_hf_config("llama3.2-1b").rope_parameters["rope_type"] == "llama3"
    assert load_hf_config("llama3.2-3b").rope_parameters["factor"] == 32.0
    llama8 = load_hf_config("llama3.1-8b").rope_parameters
    assert (llama8["rope_type"], llama8["factor"], llama8["rope_theta"]) == ("llama3", 8.0, 500000.0)
    mistral = load_hf_config("mistral-7b-v0.3")
    assert mistral.sliding_window is None and mistral.rope_parameters["rope_theta"] == 1e6
    assert load_hf_config("qwen2.5-7b").rope_parameters["rope_theta"] == 1e6


@pytest.mark.parametrize("name", REAL)
def test_real_shape_presets_have_no_tokenizer_like_the_qwen3_ones(name):
    assert tokenizer_source(name) is None and tokenizer_source("qwen3-8b") is None


@pytest.fixture(scope="module")
def nvlink_pair():
    with open(os.path.join(FIX, "h200x2_topology.json")) as fh:
        return json.load(fh)["nvlink"]


@pytest.mark.parametrize("name", REAL)
def test_autopolicy_plans_each_on_two_h200s(name, nvlink_pair):
    cfg = JobConfig.from_dict({"model": name, "data": {"path": "x.jsonl"}, "gpus": 2, "micro_batch_size": 4,
                               "seq_len": 2048})
    plan = ap.plan_job(cfg, nvlink_pair, None)
    assert plan["feasible"], plan["errors"]
    assert plan["job"]["params"] == param_count(PRESETS[name])
    assert plan["job"]["layers"] == PRESETS[name]["num_hidden_layers"]
    assert 0 < plan["predicted"]["hbm_peak_gib"] <= plan["job"]["hbm_budget_gib"]
    # host state: fp32 master and two moments (12 bytes a parameter) at least
    assert plan["predicted"]["host_ram_gib"] > 12 * param_count(PRESETS[name]) / 2**30


def test_slidedp_presets_lists_them_with_their_size(capsys):
    assert cli.main(["presets"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    for name in REAL:
        _, family, layers, hidden, millions, _ = rows[name]
        cfg = PRESETS[name]
        assert (family, int(layers), int(hidden)) == (cfg["model_type"], cfg["num_hidden_layers"],
                                                       cfg["hidden_size"])
        assert float(millions) == pytest.approx(param_count(cfg) / 1e6, abs=0.05)


def _shrunk(name: str) -> dict:
    """The preset at a few hundred thousand parameters, with every option of the real one kept."""
    cfg = dict(PRESETS[name])
    cfg.update(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=128, bos_token_id=1, eos_token_id=2)
    if "head_dim" in cfg:
        cfg["head_dim"] = 16
    return cfg


@pytest.mark.parametrize("name", REAL)
def test_a_shrunken_copy_through_the_adapter_matches_transformers(name, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    d = _shrunk(name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d),
                                             attn_implementation="sdpa").eval()
    with torch.no_grad():  # random biases and norms too, so that a dropped or misplaced one shows
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(str(tmp_path), safe_serialization=True)

    adapter = ModelAdapter(load_hf_config(str(tmp_path)))
    if name.startswith("llama"):  # the llama3 scaling is applied: its low frequencies are not the plain rope's
        plain = type(adapter.meta_model.model.rotary_emb)(config=AutoConfig.for_model("llama", **{
            **{k: v for k, v in d.items() if k != "rope_scaling"}, "rope_scaling": None}))
        assert not torch.allclose(adapter.rotary(torch.device("cpu")).inv_freq, plain.inv_freq)
    index = checkpoint_index(str(tmp_path))
    flats = []
    for spec in adapter.units:
        flat = torch.empty(spec.numel)
        adapter.load_unit(spec, flat, str(tmp_path), index)
        flats.append(flat)
    ids = torch.randint(3, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(24).expand(2, 24)
    with torch.no_grad():
        h = adapter.embed_forward(flats[0].view(adapter.vocab, adapter.hidden), ids)
        ctx = {"position_ids": pos, "attention_mask": None,
               "position_embeddings": adapter.rotary(torch.device("cpu"))(h, pos)}
        for spec, flat in zip(adapter.units[1:-1], flats[1:-1]):
            h = adapter.layer_forward(adapter.param_views(spec, flat), h, ctx)
        head = adapter.param_views(adapter.units[-1], flats[-1])
        h = adapter.norm_forward(head["norm.weight"], h)
        lm_head = flats[0].view(adapter.vocab, adapter.hidden) if adapter.tied else head["lm_head.weight"]
        logits = h @ lm_head.T
        expected = model(input_ids=ids).logits
    assert logits.shape == expected.shape == (2, 24, 256)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
