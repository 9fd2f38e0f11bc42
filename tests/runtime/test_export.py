"""The Hugging Face export: `output_dir/final/` loads in transformers, holds the trained weights, and generates.

A finished CPU run exports its fp32 master weights; the test rebuilds the model from the run's last checkpoint
(the same host state) and compares logits, then exports that host state again in bf16, in several shards,
and for a tied-embedding model.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import slidedp  # noqa: E402
from safetensors import safe_open  # noqa: E402
from slidedp.config import JobConfig  # noqa: E402
from slidedp.data.tokenizer import TINY_TOKENIZER_DIR  # noqa: E402
from slidedp.persist import checkpoint as ckpt  # noqa: E402
from slidedp.persist import export  # noqa: E402
from slidedp.presets import PRESETS  # noqa: E402

from tests.runtime.exactness import export_tensors, make_token_data, slidedp_tensors  # noqa: E402

STEPS, SEQ = 3, 32


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    data = make_token_data(str(root / "data.jsonl"), rows=12, seq_len=SEQ, seed=5)
    cfg = {
        "model": "tiny-qwen3", "data": {"path": data, "format": "tokens"}, "seq_len": SEQ,
        "micro_batch_size": 2, "steps": STEPS, "ranks": 1, "precision": "fp32", "output_dir": str(root / "run"),
        "optimizer": {"lr": 1e-2}, "checkpoint": {"interval": STEPS, "keep": 1}, "cpu_threads": 1,
        "policy": {"delivery": "replicated", "grad_reduce": "host", "activations": "checkpoint", "resident_units": 0},
    }
    result = slidedp.train(cfg)
    assert result.status == "completed"
    return {"root": root, "cfg": JobConfig.from_dict(cfg), "result": result,
            "checkpoint": os.path.join(result.checkpoint_dir, f"step-{STEPS:08d}")}


def _model_from_master(model: str, master: dict[str, torch.Tensor]):
    from transformers import AutoConfig, AutoModelForCausalLM

    d = dict(PRESETS[model])
    config = AutoConfig.for_model(d.pop("model_type"), **d)
    m = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = m.load_state_dict(master, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return m.eval()


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _index(path: str) -> dict:
    with open(os.path.join(path, "model.safetensors.index.json"), encoding="utf-8") as fh:
        return json.load(fh)


def _check_index(path: str) -> dict:
    """The index names every tensor once, each in the file that holds it, and the total size adds up."""
    index = _index(path)
    held: dict[str, str] = {}
    total = 0
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(path, name), framework="pt") as fh:
                for k in fh.keys():
                    assert k not in held, f"{k} is in two files"
                    held[k] = name
                    t = fh.get_slice(k)
                    total += torch.empty(t.get_shape(), dtype=torch.bfloat16 if t.get_dtype() == "BF16"
                                         else torch.float32).nbytes
    assert index["weight_map"] == held
    assert index["metadata"]["total_size"] == total
    return index


def _host_state(tmp_path, model: str, monkeypatch):
    from slidedp.step.host_state import HostLayout, HostState
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config

    monkeypatch.setenv("SLIDEDP_SHM_DIR", str(tmp_path / "shm"))
    adapter = ModelAdapter(load_hf_config(model))
    layout = HostLayout(run=f"slidedp-export-test-{os.getpid()}", directory=str(tmp_path / "shm"),
                        unit_numels=[u.numel for u in adapter.units], world=1, delivery_dtype="float32",
                        staging_slots=2, hold_gradient=False)
    return adapter, HostState.create(layout)


def test_final_dir_loads_with_the_trained_weights_and_generates(run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = run["result"].final_dir
    assert final == os.path.join(run["cfg"].output_dir, "final")
    model = AutoModelForCausalLM.from_pretrained(final, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(final, local_files_only=True)
    # the files a loader and a server look for
    with open(os.path.join(final, "config.json"), encoding="utf-8") as fh:
        config = json.load(fh)
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert config["dtype"] == "float32" and config["use_cache"] is True and config["vocab_size"] == 512
    with open(os.path.join(final, "generation_config.json"), encoding="utf-8") as fh:
        gen = json.load(fh)
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 0)
    index = _check_index(final)
    assert set(index["weight_map"]) == set(model.state_dict()) and set(index["weight_map"].values()) == {
        "model.safetensors"}
    with open(os.path.join(final, "tokenizer.json"), "rb") as a, \
            open(os.path.join(TINY_TOKENIZER_DIR, "tokenizer.json"), "rb") as b:
        assert a.read() == b.read()
    assert not [n for n in os.listdir(os.path.dirname(final)) if n.startswith("final.")]  # no temporaries left

    # fp32 export = the master weights of the last step, bit for bit; so are the logits
    master = slidedp_tensors(run["checkpoint"], "tiny-qwen3")["master"]
    exported = export_tensors(final)
    assert set(exported) == set(master)
    for name, t in master.items():
        assert exported[name].dtype == torch.float32 and torch.equal(exported[name], t), name
    ids = tok("3 + 5 = 8, reverse: red cat -> cat red", return_tensors="pt")["input_ids"]
    assert ids.shape[1] > 5
    reference = _model_from_master("tiny-qwen3", master)
    assert torch.equal(_logits(model, ids), _logits(reference, ids))
    # training moved the weights: the export is not the preset's initial model
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config

    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    head = adapter.units[-1]
    initial = torch.empty(head.numel)
    adapter.init_unit(head, initial, seed=0)
    lm_head = head.params[1]
    assert not torch.allclose(initial[lm_head.offset :].view(lm_head.shape), exported["lm_head.weight"])

    out = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 6)
    assert torch.equal(out[0, : ids.shape[1]], ids[0])
    assert isinstance(tok.decode(out[0, ids.shape[1]:]), str)


def test_bf16_export_holds_bf16_weights(run, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    cfg = JobConfig.from_dict({**run["cfg"].to_dict(), "precision": "bf16"})
    adapter, state = _host_state(tmp_path, "tiny-qwen3", monkeypatch)
    try:
        ckpt.load(run["checkpoint"], cfg, state)
        out = export.export_hf(str(tmp_path / "final-bf16"), cfg, adapter, state)["final_dir"]
    finally:
        from slidedp.step.host_state import unlink

        unlink(state.layout)
    master = slidedp_tensors(run["checkpoint"], "tiny-qwen3")["master"]
    tensors = export_tensors(out)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    for name, t in master.items():
        assert torch.equal(tensors[name], t.to(torch.bfloat16)), name
    _check_index(out)
    with open(os.path.join(out, "config.json"), encoding="utf-8") as fh:
        assert json.load(fh)["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert next(model.parameters()).dtype == torch.bfloat16
    ids = torch.arange(3, 40).unsqueeze(0)
    fp32 = _logits(_model_from_master("tiny-qwen3", master), ids)
    bf16 = _logits(model, ids)
    # bf16 weights and activations: close to the fp32 model, not equal to it
    assert not torch.equal(bf16, fp32)
    assert float((bf16 - fp32).abs().max()) < 0.05 * float(fp32.abs().max())


def test_weights_above_the_shard_size_go_to_several_files(run, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(export, "SHARD_BYTES", 100_000)  # the embedding alone is 131 kB, a layer 135 kB
    adapter, state = _host_state(tmp_path, "tiny-qwen3", monkeypatch)
    try:
        ckpt.load(run["checkpoint"], run["cfg"], state)
        out = export.export_hf(str(tmp_path / "final-sharded"), run["cfg"], adapter, state)["final_dir"]
    finally:
        from slidedp.step.host_state import unlink

        unlink(state.layout)
    index = _check_index(out)
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 5 and files == [f"model-{i:05d}-of-{len(files):05d}.safetensors"
                                         for i in range(1, len(files) + 1)]
    assert not os.path.exists(os.path.join(out, "model.safetensors"))
    master = slidedp_tensors(run["checkpoint"], "tiny-qwen3")["master"]
    assert set(index["weight_map"]) == set(master)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    ids = torch.arange(3, 40).unsqueeze(0)
    assert torch.equal(_logits(model, ids), _logits(_model_from_master("tiny-qwen3", master), ids))


def test_tied_embeddings_export_without_a_separate_lm_head(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    cfg = JobConfig.from_dict({"model": "tiny-qwen3-tied", "data": {"path": "unused.jsonl"}, "precision": "fp32"})
    adapter, state = _host_state(tmp_path, "tiny-qwen3-tied", monkeypatch)
    try:
        for spec in adapter.units:
            adapter.init_unit(spec, state.master_unit(spec.index), seed=4)
        out = export.export_hf(str(tmp_path / "final-tied"), cfg, adapter, state)["final_dir"]
        embed = state.master_unit(0).view(adapter.vocab, adapter.hidden).clone()
    finally:
        from slidedp.step.host_state import unlink

        unlink(state.layout)
    index = _check_index(out)
    assert "lm_head.weight" not in index["weight_map"]
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert torch.equal(model.get_output_embeddings().weight, embed)
    assert torch.equal(model.get_input_embeddings().weight, embed)
