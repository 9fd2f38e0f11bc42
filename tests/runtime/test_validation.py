"""Validation before anything is allocated: each problem gets one error naming the file, line or field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from slidedp.config import ConfigError, JobConfig, load_config_file
from slidedp.data import demo_paths
from slidedp.data.tokenizer import TINY_TOKENIZER_DIR
from slidedp.host_memory import (
    GIB,
    cgroup_memory_limit,
    host_ram_limit,
    host_state_bytes,
)
from slidedp.presets import PRESETS, param_count, unit_param_counts
from slidedp.validation import check_job, validate_job

PLENTY = 1 << 50  # host RAM for the checks that are not about RAM


def cfg_for(model="tiny-qwen3", path="demo:demo_text.jsonl", fmt="text", **kw):
    data = {"path": str(path), "format": fmt}
    data.update(kw.pop("data", {}))
    return JobConfig.from_dict({"model": str(model), "data": data, "seq_len": 16, **kw})


def errors_of(cfg, ram=PLENTY):
    return validate_job(cfg, host_ram_bytes=ram)


def only(errors, loc):
    """The single error at loc (and no error elsewhere)."""
    assert [e["loc"] for e in errors] == [loc], errors
    return errors[0]["msg"]


def model_dir(tmp_path, config=None, weights=True, tokenizer=True, name="model"):
    d = tmp_path / name
    d.mkdir()
    if config is not False:
        (d / "config.json").write_text(json.dumps(config or PRESETS["tiny-qwen3"]))
    if weights:
        import numpy as np
        from safetensors.numpy import save_file

        save_file({"w": np.zeros(2, dtype=np.float32)}, str(d / "model.safetensors"))
    if tokenizer:
        for f in os.listdir(TINY_TOKENIZER_DIR):
            shutil.copy(os.path.join(TINY_TOKENIZER_DIR, f), d / f)
    return d


def test_validation_imports_no_torch():
    code = (
        "import sys, slidedp.validation, slidedp.config, slidedp.data;"
        "from slidedp.config import JobConfig;"
        "cfg = JobConfig.from_dict({'model': 'demo-qwen3', 'data': {'path': 'demo:demo_sft.jsonl',"
        " 'format': 'prompt_completion'}, 'seq_len': 128});"
        "assert slidedp.validation.validate_job(cfg, host_ram_bytes=1 << 40) == [];"
        "bad = [m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules];"
        "assert not bad, bad"
    )
    env = {**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "..", "runtime")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr


def test_the_demo_job_validates():
    path = os.path.join(os.path.dirname(demo_paths()["demo_sft.jsonl"]), "job.yaml")
    cfg = JobConfig.from_dict(load_config_file(path))
    assert errors_of(cfg) == []
    check_job(cfg, host_ram_bytes=PLENTY)


# ---------------------------------------------------------------------------- dataset
def test_missing_dataset_and_directory_and_unknown_extension(tmp_path):
    msg = only(errors_of(cfg_for(path=tmp_path / "nope.jsonl")), "data.path")
    assert f"dataset file {tmp_path / 'nope.jsonl'} does not exist" in msg
    assert "is a directory" in only(errors_of(cfg_for(path=tmp_path)), "data.path")
    (tmp_path / "d.csv").write_text("a,b\n")
    assert "unknown extension '.csv'; use a .jsonl, .json, .parquet or .txt" in only(
        errors_of(cfg_for(path=tmp_path / "d.csv")), "data.path"
    )
    assert "no demo dataset named 'x.jsonl'" in only(errors_of(cfg_for(path="demo:x.jsonl")), "data.path")


def test_empty_dataset(tmp_path):
    for name, body in (("e.jsonl", ""), ("blank.jsonl", "\n  \n"), ("e.json", "[]")):
        (tmp_path / name).write_text(body)
        assert "is empty" in only(errors_of(cfg_for(path=tmp_path / name)), "data.path")


def test_bad_json_names_the_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "ok"}\n\n{"text": "broken"\n{"text": "ok"}\n')
    msg = only(errors_of(cfg_for(path=p)), "data.path")
    assert f"{p} line 3: bad JSON" in msg and "one JSON object" in msg
    j = tmp_path / "d.json"
    j.write_text('{"text": "a dict, not a list"}')
    assert "not a list of records" in only(errors_of(cfg_for(path=j)), "data.path")


def test_missing_field_names_line_and_field_for_the_format(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "c"}\n{"prompt": 3, "completion": "d"}\n')
    errors = errors_of(cfg_for(path=p, fmt="prompt_completion"))
    assert [e["loc"] for e in errors] == ["data.path", "data.path"]
    assert errors[0]["msg"] == f"{p} line 2: has no field 'completion' (format prompt_completion needs it)"
    assert errors[1]["msg"] == f"{p} line 3: field 'prompt' must be a string, got int"
    text_errors = errors_of(cfg_for(path=p, fmt="text"))
    assert len(text_errors) == 3 and text_errors[0]["msg"] == (
        f"{p} line 1: has no field 'text' (format text needs it); set data.text_field to the field holding the text"
    )
    chat = tmp_path / "c.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}\n')
    assert "line 1: messages[1] must be an object with string fields 'role' and 'content'" in only(
        errors_of(cfg_for(path=chat, fmt="chat")), "data.path"
    )
    alp = tmp_path / "a.jsonl"
    alp.write_text('{"instruction": "x"}\n')
    assert "line 1: has no field 'output' (format alpaca needs it)" in only(
        errors_of(cfg_for(path=alp, fmt="alpaca")), "data.path"
    )


def test_record_errors_are_capped_and_found_anywhere_in_the_file(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "ok"}\n' * 1000 + '{"other": 1}\n')  # the whole file is read, its last line too
    assert f"{p} line 1001: has no field 'text'" in only(errors_of(cfg_for(path=p)), "data.path")
    p.write_text('{"other": 1}\n' * 20)
    assert len(errors_of(cfg_for(path=p))) == 3


def test_txt_only_for_the_text_format_and_empty_texts(tmp_path):
    t = tmp_path / "d.txt"
    t.write_text("one document\n\nanother\n")
    assert errors_of(cfg_for(path=t)) == []
    assert "only format text reads" in only(
        errors_of(cfg_for(path=t, fmt="prompt_completion")), "data.format"
    )
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": ""}\n{"text": " "}\n')
    assert "tokenises to nothing" in only(errors_of(cfg_for(path=blank)), "data.path")


def test_tokens_rows_must_have_seq_len_ids_inside_the_vocabulary(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"input_ids": [1] * 16}) + "\n" + json.dumps({"input_ids": [1] * 15}) + "\n")
    msg = only(errors_of(cfg_for(path=p, fmt="tokens")), "data.path")
    assert f"{p} line 2: input_ids has 15 tokens but seq_len is 16" in msg
    p.write_text(json.dumps({"input_ids": [600] * 16}) + "\n")
    assert "token id 600 is outside the model's vocabulary of 512 tokens" in only(
        errors_of(cfg_for(path=p, fmt="tokens")), "data.path"
    )
    p.write_text(json.dumps({"input_ids": [1] * 16, "labels": [1] * 3}) + "\n")
    assert "'labels' has 3 entries but input_ids has 16" in only(
        errors_of(cfg_for(path=p, fmt="tokens")), "data.path"
    )


def test_parquet_columns_and_rows_are_checked(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"body": "hello"}]), str(p))
    msg = only(errors_of(cfg_for(path=p)), "data.path")
    assert "no column 'text' for format text (set data.text_field" in msg and "columns: body" in msg
    assert errors_of(cfg_for(path=p, data={"text_field": "body"})) == []
    pq.write_table(pa.Table.from_pylist([{"input_ids": [1] * 16}, {"input_ids": [1] * 4}]), str(p))
    assert f"{p} row 2: input_ids has 4 tokens" in only(errors_of(cfg_for(path=p, fmt="tokens")), "data.path")


# ---------------------------------------------------------------------------- model
def test_unknown_preset_lists_the_presets_and_a_missing_path_says_so(tmp_path):
    msg = only(errors_of(cfg_for(model="qwen9-1t")), "model")
    assert msg.startswith("unknown preset 'qwen9-1t'; presets: tiny-qwen3, ") and "qwen3-8b" in msg
    msg = only(errors_of(cfg_for(model=tmp_path / "no-such-model")), "model")
    assert f"model directory {tmp_path / 'no-such-model'} does not exist" in msg
    f = tmp_path / "file"
    f.write_text("x")
    assert "is a file" in only(errors_of(cfg_for(model=f)), "model")


def test_model_directory_needs_config_and_weights(tmp_path):
    assert errors_of(cfg_for(model=model_dir(tmp_path, name="good"))) == []
    msg = only(errors_of(cfg_for(model=model_dir(tmp_path, config=False, name="noconf"))), "model")
    assert "has no config.json" in msg
    msg = only(errors_of(cfg_for(model=model_dir(tmp_path, weights=False, name="noweights"))), "model")
    assert "has no weights (*.safetensors or model.safetensors.index.json)" in msg
    broken = model_dir(tmp_path, name="broken")
    (broken / "config.json").write_text("{not json")
    assert "config.json is not valid JSON" in only(errors_of(cfg_for(model=broken)), "model")


def test_unsupported_architecture_and_seq_len_above_the_limit(tmp_path):
    gpt2 = model_dir(tmp_path, config={**PRESETS["tiny-qwen3"], "model_type": "gpt2"}, name="gpt2")
    msg = only(errors_of(cfg_for(model=gpt2)), "model")
    assert "unsupported architecture 'gpt2'" in msg and "qwen3, qwen2, llama, mistral" in msg
    msg = only(errors_of(cfg_for(seq_len=4096)), "seq_len")
    assert (
        msg == "4096 is above the model's limit (max_position_embeddings = 1024); set seq_len to at most 1024"
    )


def test_formats_that_need_a_tokenizer(tmp_path):
    msg = only(errors_of(cfg_for(model="qwen3-0.6b")), "data.format")
    assert "preset qwen3-0.6b has no tokenizer" in msg and "pre-tokenised data (format tokens)" in msg
    bare = model_dir(tmp_path, tokenizer=False)
    assert "has no tokenizer" in only(
        errors_of(cfg_for(model=bare, fmt="prompt_completion", path="demo:demo_sft.jsonl")), "data.format"
    )
    tokens = tmp_path / "t.jsonl"
    tokens.write_text(json.dumps({"input_ids": [5] * 16}) + "\n")
    assert errors_of(cfg_for(model="qwen3-0.6b", path=tokens, fmt="tokens")) == []
    assert errors_of(cfg_for(model=bare, path=tokens, fmt="tokens")) == []


# ---------------------------------------------------------------------------- host RAM
def test_host_ram_too_small_states_needed_and_available_gib(tmp_path):
    tokens = tmp_path / "t.jsonl"
    tokens.write_text(json.dumps({"input_ids": [5] * 16}) + "\n")
    cfg = cfg_for(model="qwen3-8b", path=tokens, fmt="tokens", ranks=2, optimizer={"max_grad_norm": 0.0})
    state, staging = host_state_bytes(cfg, PRESETS["qwen3-8b"])
    assert state == 14 * param_count(PRESETS["qwen3-8b"])
    # the least any policy of this config needs: embedding and head updated on the ranks (no gradient staged),
    # gradients reduce-scattered: 2 ranks x 8 slots x half the largest decoder layer, in fp32
    layer = unit_param_counts(PRESETS["qwen3-8b"])[1]
    assert staging == 2 * 8 * -(-layer // 2) * 4
    msg = only(errors_of(cfg, ram=64 * GIB), "model")
    assert f"needs {(state + staging) / GIB:.1f} GiB" in msg and "but 64.0 GiB is available" in msg
    assert errors_of(cfg, ram=state + staging) == []
    configured = cfg_for(model="qwen3-8b", path=tokens, fmt="tokens", host_ram_gib=32)
    assert "32.0 GiB is available (host_ram_gib)" in only(validate_job(configured), "host_ram_gib")
    with pytest.raises(ConfigError) as err:
        check_job(cfg, host_ram_bytes=GIB)
    assert err.value.errors[0]["loc"] == "model"
    # the master delivered itself (cast on the GPU, or fp32 precision): no bf16 copy, 12 B/param
    for extra in ({"policy": {"delivery_cast": "gpu"}}, {"precision": "fp32"}):
        lean, _ = host_state_bytes(cfg_for(model="qwen3-8b", path=tokens, fmt="tokens", ranks=2, **extra),
                                   PRESETS["qwen3-8b"])
        assert lean == 12 * param_count(PRESETS["qwen3-8b"]), extra


@pytest.mark.slow
def test_a_host_state_too_large_for_shared_memory_is_refused_before_anything_is_created(tmp_path, monkeypatch):
    """The segments are sparse files: a tmpfs too small would show only as a SIGBUS on first touch, mid-start.
    train() compares the layout's bytes with the folder's free space first and names what to change."""
    import slidedp
    from slidedp import host_memory

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv("SLIDEDP_SHM_DIR", str(shm))
    monkeypatch.setattr(host_memory, "free_bytes", lambda directory: 1 << 20)  # a 1 MiB tmpfs
    tokens = tmp_path / "t.jsonl"
    tokens.write_text("".join(json.dumps({"input_ids": list(range(1, 17))}) + "\n" for _ in range(8)))
    job = {"model": "tiny-qwen3", "data": {"path": str(tokens), "format": "tokens"}, "seq_len": 16, "steps": 1,
           "ranks": 1, "output_dir": str(tmp_path / "out")}
    with pytest.raises(ConfigError) as err:
        slidedp.train(job)
    msg = err.value.errors[0]["msg"]
    assert err.value.errors[0]["loc"] == "model"
    assert f"in {shm}" in msg and "only 0.0 GiB is free" in msg and "SLIDEDP_SHM_DIR" in msg
    assert os.listdir(shm) == []  # no segment, no manifest
    monkeypatch.setattr(host_memory, "free_bytes", lambda directory: None)  # unknown: left to the run
    assert slidedp.train(job).status == "completed"


def test_host_ram_limit_prefers_configured_then_cgroup_then_memtotal(tmp_path):
    assert host_ram_limit(12.5) == (int(12.5 * GIB), "host_ram_gib")
    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "memory.max").write_text("max\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    assert cgroup_memory_limit(str(v2), str(proc)) is None  # "max" is no limit
    (v2 / "job" / "memory.max").write_text(f"{64 * GIB}\n")
    assert cgroup_memory_limit(str(v2), str(proc)) == 64 * GIB
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    proc.write_text("4:memory:/other\n0::/\n")
    assert cgroup_memory_limit(str(v1), str(proc)) is None  # v1's "unlimited"
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{200 * GIB}\n")
    assert cgroup_memory_limit(str(v1), str(proc)) == 200 * GIB
    limit, source = host_ram_limit(cgroup_root=str(v1))
    assert (limit, source) == (200 * GIB, "cgroup memory limit")
    empty = tmp_path / "none"
    empty.mkdir()
    limit, source = host_ram_limit(cgroup_root=str(empty))
    with open("/proc/meminfo") as fh:
        memtotal = int(next(line for line in fh if line.startswith("MemTotal:")).split()[1]) * 1024
    assert (limit, source) == (memtotal, "MemTotal")


# ---------------------------------------------------------------------------- every problem at once
def raw_job(path, **kw):
    data = {"path": str(path), "format": "tokens", **kw.pop("data", {})}
    return {"model": "tiny-qwen3", "data": data, "seq_len": 16, **kw}


def tokens_file(tmp_path, rows=4, length=16):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"input_ids": [5] * length}) + "\n" for _ in range(rows)))
    return p


def locs(check):
    return [e["loc"] for e in check.errors]


def test_check_config_reports_the_config_errors_and_the_checks_of_the_keys_that_parsed(tmp_path):
    from slidedp.validation import check_config

    check = check_config(raw_job(tmp_path / "nope.jsonl", steps="abc", optimizer={"lr": -1}), PLENTY)
    assert check.config is None
    assert locs(check) == ["steps", "optimizer.lr", "data.path"]  # config errors first, then the files
    assert "does not exist" in check.errors[2]["msg"]
    check = check_config(raw_job(tokens_file(tmp_path), model="/models/nope", seq_len=0), PLENTY)
    assert locs(check) == ["seq_len", "model"]
    assert "/models/nope does not exist" in check.errors[1]["msg"]
    # A config that parses is validate_job's, exactly.
    good = raw_job(tokens_file(tmp_path))
    check = check_config(good, PLENTY)
    assert check.config == JobConfig.from_dict(good) and check.errors == [] and check.known("model", "seq_len")


def test_check_config_never_judges_a_key_by_a_default_standing_in_for_a_bad_value(tmp_path):
    from slidedp.validation import check_config

    rows_of_16 = tokens_file(tmp_path)
    # seq_len did not parse: the rows are read, but their length is not measured against the default 2048.
    assert locs(check_config(raw_job(rows_of_16, seq_len="x"), PLENTY)) == ["seq_len"]
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"input_ids": [600] * 3}) + "\n")
    check = check_config(raw_job(short, seq_len="x"), PLENTY)
    assert locs(check) == ["seq_len", "data.path"] and "vocabulary of 512" in check.errors[1]["msg"]
    # The format did not parse: the file is not read as format tokens, only found to be missing.
    assert locs(check_config(raw_job(rows_of_16, data={"format": "csv"}), PLENTY)) == ["data.format"]
    assert locs(check_config(raw_job(tmp_path / "gone.jsonl", data={"format": "csv"}), PLENTY)) == [
        "data.format", "data.path"]
    # Host RAM is judged only when everything it depends on parsed.
    big = raw_job(rows_of_16, model="qwen3-8b")
    assert locs(check_config({**big, "steps": 0}, GIB)) == ["steps", "model"]
    assert "host RAM too small" in check_config({**big, "steps": 0}, GIB).errors[1]["msg"]
    assert locs(check_config({**big, "gpus": -1}, GIB)) == ["gpus"]
    assert locs(check_config({**big, "steps": 0}, GIB, host_ram=False)) == ["steps"]
    # Unknown keys, a section that is not a mapping, missing required keys: the rest is still checked.
    check = check_config(raw_job(tmp_path / "gone.jsonl", bogus=1, optimizer="fast"), PLENTY)
    assert locs(check) == ["bogus", "optimizer", "data.path"]
    check = check_config({"data": {"path": str(tmp_path / "gone.jsonl")}}, PLENTY)
    assert locs(check) == ["model", "data.path"] and "does not exist" in check.errors[1]["msg"]
    assert locs(check_config([1, 2], PLENTY)) == ["config"]
    # A key the caller refused is never read, even when the config parses.
    check = check_config(raw_job(rows_of_16, model="/models/nope"), PLENTY, refused=["model"])
    assert check.config is not None and check.errors == [] and not check.known("model") and check.known("data")


def test_parse_job_raises_every_problem_and_returns_the_config_otherwise(tmp_path):
    from slidedp.validation import parse_job

    with pytest.raises(ConfigError) as err:
        parse_job(raw_job(tmp_path / "gone.jsonl", steps="abc"))
    assert [e["loc"] for e in err.value.errors] == ["steps", "data.path"]
    good = raw_job(tokens_file(tmp_path))
    assert parse_job(good) == JobConfig.from_dict(good)


def test_a_dataset_small_for_the_steps_is_a_warning(tmp_path):
    from slidedp.validation import job_warnings

    p = tokens_file(tmp_path, rows=10)
    assert job_warnings(JobConfig.from_dict(raw_job(p, steps=5, micro_batch_size=2))) == []
    (w,) = job_warnings(JobConfig.from_dict(raw_job(p, steps=10, micro_batch_size=2)))
    assert w["loc"] == "data.path" and "holds 10 rows" in w["msg"] and "2.0 times" in w["msg"]
    (w,) = job_warnings(JobConfig.from_dict(raw_job(p, steps=5, micro_batch_size=2, eval={"holdout": 0.2})))
    assert "holds 8 rows (2 held out for evaluation)" in w["msg"]
    # format text splits documents into any number of rows: not counted
    assert job_warnings(cfg_for(steps=10_000)) == []
