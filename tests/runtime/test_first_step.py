"""scripts/first_step.py's parts on a tiny preset: the Hugging Face directory it writes loads back as the preset's
initial weights and trains, the timing reports the start-up stages and the time to first step, and the fill bound
writes (and removes) exactly the bytes the host state's fill writes."""

from __future__ import annotations

import json
import os

import pytest
import torch
from slidedp.step.model_adapter import ModelAdapter, checkpoint_index, load_hf_config

from scripts import first_step


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hf") / "tiny-qwen3-bf16")
    written = first_step.write_hf_dir(out, "tiny-qwen3", seed=7, shard_bytes=100_000, threads=2)
    return out, written


def test_write_hf_makes_sharded_bf16_safetensors_of_the_preset_initial_weights(hf_dir):
    from safetensors import safe_open

    out, written = hf_dir
    names = {f["name"] for f in written["files"]}
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert {"config.json", "model.safetensors.index.json"} <= names
    with open(os.path.join(out, "config.json"), encoding="utf-8") as fh:
        assert json.load(fh)["architectures"] == ["Qwen3ForCausalLM"]
    adapter = ModelAdapter(load_hf_config(out))
    index = checkpoint_index(out)
    spec = adapter.units[1]  # a decoder layer, drawn with the preset's seed-7 generator
    expected = torch.empty(spec.numel)
    ModelAdapter(load_hf_config("tiny-qwen3")).init_unit(spec, expected, 7)
    for p in spec.params:
        with safe_open(os.path.join(out, index[p.hf_name]), framework="pt") as fh:
            t = fh.get_tensor(p.hf_name)
        assert t.dtype == torch.bfloat16
        assert torch.equal(t, expected[p.offset : p.offset + p.numel].view(p.shape).to(torch.bfloat16))


def test_write_hf_refuses_a_directory_as_the_model(tmp_path, hf_dir):
    with pytest.raises(SystemExit, match="takes a preset"):
        first_step.write_hf_dir(str(tmp_path / "x"), hf_dir[0])


@pytest.mark.slow  # trains a step from a written directory
def test_first_step_from_a_written_directory_reports_its_stages_and_time(tmp_path, hf_dir):
    data = first_step.write_tokens(str(tmp_path / "tokens.jsonl"), rows=4, seq=32, vocab=256)
    cfg = first_step.job_config(hf_dir[0], data, str(tmp_path / "out"), gpus=0, seq=32, steps=1)
    row = first_step.time_first_step(cfg)
    assert row["status"] == "completed" and row["steps"] == 1
    stages = row["startup_s"]
    assert "loading_weights" in stages and "building_host_state" not in stages and "first_step" in stages
    # the runtime counts from inside train(), this script from just before calling it
    assert 0 < row["runtime_time_to_first_step_s"] <= row["time_to_first_step_s"] + 0.01
    assert row["runtime_time_to_first_step_s"] >= sum(stages.values()) - 0.01
    assert row["time_to_first_step_s"] <= row["train_wall_s"]


def test_fill_bound_writes_the_fill_bytes_in_the_shared_memory_folder_and_removes_them(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    monkeypatch.setenv("SLIDEDP_SHM_DIR", str(shm))
    row = first_step.fill_bound("tiny-qwen3", threads=2)
    params = sum(u.numel for u in ModelAdapter(load_hf_config("tiny-qwen3")).units)
    assert row["params"] == params and row["bytes_written"] == 6 * params and row["state_bytes"] == 14 * params
    assert row["directory"] == str(shm) and row["fill_bound_s"] > 0 and os.listdir(shm) == []


def test_main_prints_a_json_line_for_the_fill_bound(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLIDEDP_SHM_DIR", str(tmp_path))
    assert first_step.main(["--fill-bound", "--model", "tiny-qwen3", "--threads", "1"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["model"] == "tiny-qwen3" and row["threads"] == 1
