"""What the export writes and when it refuses, one rule at a time and without a training run (slidedp.persist.export):
the disk it asks for and the words it says it in, how weights fill shards, what config and generation config
go beside them, the swap that keeps the previous final/ until the new one is complete, and the checkpoint source's
refusals. tests/runtime/test_export.py and test_export_recovery.py check the same export from real runs."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors import safe_open

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from slidedp.config import JobConfig  # noqa: E402
from slidedp.data.tokenizer import TINY_TOKENIZER_DIR  # noqa: E402
from slidedp.persist import checkpoint as ckpt  # noqa: E402
from slidedp.persist import export  # noqa: E402
from slidedp.persist.export import ExportError, export_checkpoint, format_bytes  # noqa: E402
from slidedp.step.model_adapter import ModelAdapter, load_hf_config  # noqa: E402

from tests.runtime.exactness import export_tensors, seeded_host_state  # noqa: E402

MIB = 2**20
# Every test here exports tiny-qwen3. Its adapter is built once, when the module is imported: that also imports
# transformers' model classes (2 s), once for the module, and once for all the workers of a mutation run, which are
# forked from the process that collected the tests (scripts/mutate.py).
ADAPTER = ModelAdapter(load_hf_config("tiny-qwen3"))
TOKENIZER_BYTES = sum(os.path.getsize(os.path.join(TINY_TOKENIZER_DIR, n)) for n in os.listdir(TINY_TOKENIZER_DIR))


@pytest.fixture
def host_state(tmp_path, monkeypatch):
    """tiny-qwen3's adapter and a host state holding its initial weights (seed 3)."""
    monkeypatch.setenv("SLIDEDP_SHM_DIR", str(tmp_path / "shm"))
    adapter = ADAPTER
    with seeded_host_state(adapter, str(tmp_path / "shm"), "slidedp-export-files") as state:
        yield adapter, state


def _cfg(tmp_path, precision: str = "fp32", **over) -> JobConfig:
    return JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "unused.jsonl"}, "precision": precision,
                                "output_dir": str(tmp_path / "run"), **over})


def _params(adapter) -> int:
    return sum(u.numel for u in adapter.units)


def _listing(path: str) -> list[dict]:
    return [{"name": n, "bytes": os.path.getsize(os.path.join(path, n))} for n in sorted(os.listdir(path))]


def _index(path: str) -> dict:
    with open(os.path.join(path, "model.safetensors.index.json"), encoding="utf-8") as fh:
        return json.load(fh)


# ------------------------------------------------------------------------------------------ sizes and words


def test_sizes_are_told_in_mib_below_a_gib_and_in_gib_from_one_gib():
    assert format_bytes(None) == "an unknown amount"
    assert format_bytes(0) == "0.0 MiB"
    assert format_bytes(3 * MIB // 2) == "1.5 MiB"
    assert format_bytes(2**30 - MIB) == "1023.0 MiB"
    assert format_bytes(2**30) == "1.00 GiB"
    assert format_bytes(5 * 2**30 // 2) == "2.50 GiB"


def test_an_export_takes_its_weights_in_the_training_precision_plus_the_tokenizer_and_a_mib():
    assert export.export_bytes(1000, "bf16") == 2000 + MIB
    assert export.export_bytes(1000, "fp32") == 4000 + MIB
    assert export.export_bytes(1000, "fp32", extra=77) == 4077 + MIB
    assert export.SLACK_BYTES == MIB


def test_free_bytes_are_those_of_the_folders_disk(tmp_path):
    free = export._free_bytes(str(tmp_path))
    assert abs(free - shutil.disk_usage(tmp_path).free) < 64 * MIB
    assert free < shutil.disk_usage(tmp_path).total


def test_the_free_space_check_asks_for_exactly_what_the_export_takes(host_state, tmp_path, monkeypatch):
    """Free = needed is enough; a byte less is refused before anything is written, in the folder that holds final/."""
    adapter, state = host_state
    needed = _params(adapter) * 4 + TOKENIZER_BYTES + MIB
    asked: list[str] = []

    def exactly(free):
        def free_bytes(directory):
            asked.append(directory)
            return free
        return free_bytes

    monkeypatch.setattr(export, "_free_bytes", exactly(needed))
    out = export.export_hf(str(tmp_path / "run" / "final"), _cfg(tmp_path), adapter, state)
    assert out["final_dir"] == str(tmp_path / "run" / "final") and asked == [str(tmp_path / "run")]
    monkeypatch.setattr(export, "_free_bytes", exactly(needed - 1))
    with pytest.raises(ExportError) as err:
        export.export_hf(str(tmp_path / "run2" / "final"), _cfg(tmp_path), adapter, state)
    e = err.value
    assert (e.needed_bytes, e.free_bytes, e.directory) == (needed, needed - 1, str(tmp_path / "run2"))
    assert str(e) == (f"the export needs {format_bytes(needed)} in {tmp_path / 'run2'}, only "
                      f"{format_bytes(needed - 1)} is free: free disk there, or export elsewhere")
    assert os.listdir(tmp_path / "run2") == []  # the folder that holds final/ is made; nothing is written in it


def test_a_bf16_export_asks_for_two_bytes_a_parameter(host_state, tmp_path, monkeypatch):
    adapter, state = host_state
    monkeypatch.setattr(export, "_free_bytes", lambda directory: 0)
    with pytest.raises(ExportError) as err:
        export.export_hf(str(tmp_path / "final"), _cfg(tmp_path, "bf16"), adapter, state)
    assert err.value.needed_bytes == _params(adapter) * 2 + TOKENIZER_BYTES + MIB


def test_an_export_error_keeps_its_fields_when_pickled():
    import pickle

    again = pickle.loads(pickle.dumps(ExportError("no room", 10, 3, "/x")))
    assert (str(again), again.needed_bytes, again.free_bytes, again.directory) == ("no room", 10, 3, "/x")
    plain = ExportError("plain")
    assert (plain.needed_bytes, plain.free_bytes, plain.directory) == (None, None, None)


# ---------------------------------------------------------------------------------------------- shards


def _shard_layout(adapter, out: str, element_size: int) -> list[list[tuple[str, int]]]:
    """The exported tensors, file by file in file order, each (name, bytes) in the adapter's order."""
    weight_map = _index(out)["weight_map"]
    files = sorted(set(weight_map.values()))
    return [[(p.hf_name, p.numel * element_size) for spec in adapter.units for p in spec.params
             if weight_map[p.hf_name] == name] for name in files]


@pytest.mark.parametrize("limit", [131072 + 16384, 131072 + 16384 - 1, 16384 + 8192, 40_000, 10**9])
def test_shards_are_filled_in_unit_order_up_to_the_limit_and_no_further(host_state, tmp_path, limit):
    """Each shard holds the next tensors while they fit; a tensor larger than the limit has a shard of its own.
    In fp32, 131072 + 16384 is the embedding and the first q_proj: exactly the first shard's worth; 16384 + 8192
    is that q_proj and its k_proj: exactly the second shard's, after the embedding's own."""
    adapter, state = host_state
    units = (state.master_unit(s.index) for s in adapter.units)
    out = export.write_hf(str(tmp_path / "final"), "tiny-qwen3", "fp32", adapter, units, shard_bytes=limit)["final_dir"]
    shards = _shard_layout(adapter, out, 4)
    assert [name for shard in shards for name, _ in shard] == [p.hf_name for s in adapter.units for p in s.params]
    for shard, following in zip(shards, shards[1:] + [None]):
        size = sum(nbytes for _, nbytes in shard)
        assert shard and (size <= limit or len(shard) == 1), (limit, shard)
        if following:  # the next shard's first tensor did not fit in this one
            assert size + following[0][1] > limit, (limit, shard, following[0])
    if limit == 131072 + 16384:
        assert [n for n, _ in shards[0]] == ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]
    if limit == 16384 + 8192:
        assert [n for n, _ in shards[1]] == ["model.layers.0.self_attn.q_proj.weight",
                                             "model.layers.0.self_attn.k_proj.weight"]
    names = sorted(n for n in os.listdir(out) if n.endswith(".safetensors"))
    if len(shards) == 1:
        assert names == ["model.safetensors"]
    else:
        assert names == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    index = _index(out)
    assert index["metadata"]["total_size"] == _params(adapter) * 4
    for name in names:  # transformers 4.x loads a safetensors file only when its metadata says "pt"
        with safe_open(os.path.join(out, name), framework="pt") as fh:
            assert fh.metadata() == {"format": "pt"}, name
    tensors = export_tensors(out)
    for spec in adapter.units:
        flat = state.master_unit(spec.index)
        for p in spec.params:
            assert torch.equal(tensors[p.hf_name], flat[p.offset: p.offset + p.numel].view(p.shape)), p.hf_name


def test_the_shard_limit_defaults_to_shard_bytes(host_state, tmp_path, monkeypatch):
    adapter, state = host_state
    monkeypatch.setattr(export, "SHARD_BYTES", 200_000)
    out = export.export_hf(str(tmp_path / "final"), _cfg(tmp_path), adapter, state)["final_dir"]
    shards = _shard_layout(adapter, out, 4)
    assert len(shards) > 1 and all(sum(b for _, b in shard) <= 200_000 for shard in shards)


def test_a_source_short_of_a_unit_or_with_a_wrong_sized_one_is_refused_naming_the_unit(host_state, tmp_path):
    adapter, state = host_state
    units = [state.master_unit(s.index) for s in adapter.units]
    with pytest.raises(ExportError) as err:
        export.write_hf(str(tmp_path / "a"), "tiny-qwen3", "fp32", adapter, iter(units[:2]))
    assert "(ValueError: unit 2 of the model has 43168 parameters, the source gave nothing)" in str(err.value)
    with pytest.raises(ExportError) as err:
        export.write_hf(str(tmp_path / "b"), "tiny-qwen3", "fp32", adapter, iter([units[0], units[1][:-1]]))
    assert "(ValueError: unit 1 of the model has 43168 parameters, the source gave 43167 values)" in str(err.value)
    assert sorted(os.listdir(tmp_path)) == ["shm"]


# -------------------------------------------------------------------------------------- config files


def test_the_config_names_the_precision_the_class_and_the_cache_without_changing_the_adapters(host_state, tmp_path):
    adapter, state = host_state
    for precision, name in (("bf16", "bfloat16"), ("fp32", "float32")):
        out = export.export_hf(str(tmp_path / precision), _cfg(tmp_path, precision), adapter, state)["final_dir"]
        with open(os.path.join(out, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
        assert config["dtype"] == name and config["use_cache"] is True
        assert config["architectures"] == ["Qwen3ForCausalLM"]
        with open(os.path.join(out, "generation_config.json"), encoding="utf-8") as fh:
            generation = json.load(fh)
        assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (1, 2, 0)
        assert {t.dtype for t in export_tensors(out).values()} == {torch.bfloat16 if precision == "bf16"
                                                                    else torch.float32}
    assert adapter.config.use_cache is False and getattr(adapter.config, "architectures", None) is None


def test_a_model_directory_gives_its_generation_config_and_tokenizer_files_and_nothing_else(host_state, tmp_path):
    adapter, state = host_state
    model = tmp_path / "model"
    adapter.config.save_pretrained(model)
    generation = {"bos_token_id": 1, "eos_token_id": [2, 5], "max_new_tokens": 7, "temperature": 0.3,
                  "do_sample": True}
    (model / "generation_config.json").write_text(json.dumps(generation))
    for name in os.listdir(TINY_TOKENIZER_DIR):
        shutil.copy(os.path.join(TINY_TOKENIZER_DIR, name), model / name)
    (model / "vocab.txt").write_text("a\nb\n")
    (model / "merges.txt").write_text("#\n")
    (model / "README.md").write_text("not a tokenizer file")
    (model / "tokenizer_extras").mkdir()  # a folder named like one: not copied
    out = export.write_hf(str(tmp_path / "final"), str(model), "fp32", adapter,
                          (state.master_unit(s.index) for s in adapter.units))
    names = [f["name"] for f in out["files"]]
    assert names == sorted(["config.json", "generation_config.json", "merges.txt", "model.safetensors",
                            "model.safetensors.index.json", "special_tokens_map.json", "tokenizer.json",
                            "tokenizer_config.json", "vocab.txt"])
    with open(os.path.join(out["final_dir"], "generation_config.json"), encoding="utf-8") as fh:
        assert json.load(fh) == generation  # copied as it is
    for name in ("tokenizer.json", "vocab.txt"):
        with open(model / name, "rb") as a, open(os.path.join(out["final_dir"], name), "rb") as b:
            assert a.read() == b.read()


def test_the_job_config_goes_beside_the_weights_when_given(host_state, tmp_path):
    adapter, state = host_state
    cfg = _cfg(tmp_path, data={"path": "unused.jsonl", "format": "chat"})
    out = export.export_hf(str(tmp_path / "final"), cfg, adapter, state)
    with open(os.path.join(out["final_dir"], export.JOB_FILE), encoding="utf-8") as fh:
        assert json.load(fh) == cfg.to_dict()
    bare = export.write_hf(str(tmp_path / "bare"), "tiny-qwen3", "fp32", adapter,
                           (state.master_unit(s.index) for s in adapter.units))
    assert export.JOB_FILE not in os.listdir(bare["final_dir"])
    assert out["files"] == _listing(out["final_dir"]) and bare["files"] == _listing(bare["final_dir"])


# ----------------------------------------------------------------------------------------------- swap


def test_a_new_export_replaces_the_previous_one_and_leaves_no_temporaries(host_state, tmp_path, monkeypatch):
    adapter, state = host_state
    monkeypatch.chdir(tmp_path)
    os.makedirs("run/final.old")  # left by an export that died mid-swap
    (tmp_path / "run" / "final.old" / "stale").write_text("x")
    first = export.export_hf("run/final", _cfg(tmp_path, "bf16"), adapter, state)
    assert first["final_dir"] == str(tmp_path / "run" / "final")  # absolute, whatever the working folder
    assert sorted(os.listdir(tmp_path / "run")) == ["final"]
    for stale in ("run/final.old", "run/final.tmp"):  # both left by an export that died, beside a final/
        os.makedirs(stale)
        (tmp_path / stale / "stale").write_text("x")
    second = export.export_hf("run/final", _cfg(tmp_path, "fp32"), adapter, state)
    assert sorted(os.listdir(tmp_path / "run")) == ["final"]
    assert "stale" not in os.listdir(second["final_dir"])
    assert second["files"] == _listing(second["final_dir"])
    assert {t.dtype for t in export_tensors(second["final_dir"]).values()} == {torch.float32}


def test_a_failed_swap_puts_the_previous_export_back(host_state, tmp_path, monkeypatch):
    adapter, state = host_state
    final = str(tmp_path / "run" / "final")
    export.export_hf(final, _cfg(tmp_path, "bf16"), adapter, state)
    before = export_tensors(final)
    replace = os.replace

    def no_swap(src, dst):
        if str(src).endswith("final.tmp"):
            raise OSError(5, "Input/output error")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", no_swap)
    monkeypatch.setattr(export, "_free_bytes", lambda directory: 2**30)
    with pytest.raises(ExportError) as err:
        export.export_hf(final, _cfg(tmp_path, "fp32"), adapter, state)
    needed = _params(adapter) * 4 + TOKENIZER_BYTES + MIB
    assert str(err.value) == (f"the export to {final} failed (OSError: [Errno 5] Input/output error); it needs "
                              f"{format_bytes(needed)} in {tmp_path / 'run'}, 1.00 GiB is free there")
    assert (err.value.needed_bytes, err.value.free_bytes, err.value.directory) == (needed, 2**30, str(tmp_path / "run"))
    assert sorted(os.listdir(tmp_path / "run")) == ["final"]
    after = export_tensors(final)
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)


def test_a_failure_reports_the_free_space_read_before_when_it_cannot_be_read_again(host_state, tmp_path,
                                                                                     monkeypatch):
    adapter, state = host_state
    readings = iter([2**30])

    def once(directory):
        value = next(readings, None)
        if value is None:
            raise OSError(5, "Input/output error")
        return value

    monkeypatch.setattr(export, "_free_bytes", once)
    with pytest.raises(ExportError) as err:
        export.write_hf(str(tmp_path / "final"), "tiny-qwen3", "fp32", adapter, iter([]))
    assert str(err.value).endswith(", 1.00 GiB is free there") and err.value.free_bytes == 2**30


def test_a_failure_before_the_sizes_are_known_says_they_are_unknown(host_state, tmp_path):
    adapter, state = host_state
    (tmp_path / "file").write_text("not a folder")
    parent = str(tmp_path / "file" / "run")
    with pytest.raises(ExportError) as err:
        export.export_hf(os.path.join(parent, "final"), _cfg(tmp_path), adapter, state)
    assert str(err.value).startswith(f"the export to {parent}/final failed (NotADirectoryError: ")
    assert str(err.value).endswith(f"it needs an unknown amount in {parent}, an unknown amount is free there")
    assert (err.value.needed_bytes, err.value.free_bytes, err.value.directory) == (None, None, parent)


def test_an_interrupt_is_not_turned_into_an_export_error_and_leaves_no_temporary(host_state, tmp_path, monkeypatch):
    adapter, state = host_state

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("safetensors.torch.save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export.export_hf(str(tmp_path / "final"), _cfg(tmp_path), adapter, state)
    assert sorted(os.listdir(tmp_path)) == ["shm"]


# ------------------------------------------------------------------------------------ from a checkpoint


@pytest.fixture
def checkpoint(host_state, tmp_path):
    """A checkpoint of tiny-qwen3 (bf16) at step 3 under run/checkpoints/, and the state it holds."""
    adapter, state = host_state
    cfg = _cfg(tmp_path, "bf16")
    path = ckpt.save(str(tmp_path / "run" / "checkpoints"), 3, cfg, state, None, keep=1)
    return path, adapter, state


def _rewrite_meta(path: str, change) -> None:
    meta = ckpt.read_meta(path)
    change(meta)
    with open(os.path.join(path, "meta.json"), "w", encoding="utf-8") as fh:
        json.dump(meta, fh)


def test_a_checkpoint_exports_its_master_in_its_precision_to_its_runs_final(checkpoint, tmp_path):
    path, adapter, state = checkpoint
    out = export_checkpoint(path)
    assert out["final_dir"] == str(tmp_path / "run" / "final")
    tensors = export_tensors(out["final_dir"])
    for spec in adapter.units:
        flat = state.master_unit(spec.index)
        for p in spec.params:
            expected = flat[p.offset: p.offset + p.numel].view(p.shape).to(torch.bfloat16)
            assert torch.equal(tensors[p.hf_name], expected), p.hf_name
    with open(os.path.join(out["final_dir"], export.JOB_FILE), encoding="utf-8") as fh:
        assert json.load(fh) == ckpt.read_meta(path)["config"]
    elsewhere = export_checkpoint(path, str(tmp_path / "copy"))
    assert elsewhere["final_dir"] == str(tmp_path / "copy")


def test_a_checkpoint_without_a_precision_exports_bf16(checkpoint, tmp_path):
    path, adapter, state = checkpoint
    _rewrite_meta(path, lambda meta: meta["config"].update(precision="fp32"))
    assert {t.dtype for t in export_tensors(export_checkpoint(path)["final_dir"]).values()} == {torch.float32}
    _rewrite_meta(path, lambda meta: meta["config"].pop("precision"))
    assert {t.dtype for t in export_tensors(export_checkpoint(path)["final_dir"]).values()} == {torch.bfloat16}


def test_a_checkpoint_that_cannot_be_exported_is_refused_saying_why(checkpoint, tmp_path):
    path, adapter, state = checkpoint
    missing = str(tmp_path / "no-such" / "step-00000001")
    with pytest.raises(ExportError) as err:
        export_checkpoint(missing)
    assert str(err.value) == f"checkpoint directory {missing} does not exist"

    _rewrite_meta(path, lambda meta: meta["config"].update(model=None))
    with pytest.raises(ExportError) as err:
        export_checkpoint(path)
    assert str(err.value) == f"{path}/meta.json names no model or precision to export (None, 'bf16')"
    _rewrite_meta(path, lambda meta: meta["config"].update(model="tiny-qwen3", precision="fp16"))
    with pytest.raises(ExportError) as err:
        export_checkpoint(path)
    assert str(err.value) == f"{path}/meta.json names no model or precision to export ('tiny-qwen3', 'fp16')"
    for model in ("no-such-preset", str(tmp_path / "no-such-model")):
        _rewrite_meta(path, lambda meta, m=model: meta["config"].update(model=m, precision="bf16"))
        with pytest.raises(ExportError) as err:
            export_checkpoint(path)
        assert str(err.value).startswith(f"the checkpoint's model {model!r} cannot be loaded to name its tensors: ")

    def shifted(meta):  # the same parameters, split between units differently: complete, but not this model's
        meta["config"].update(model="tiny-qwen3")
        meta["unit_numels"][0] += 1
        meta["unit_numels"][1] -= 1

    _rewrite_meta(path, shifted)
    total = _params(adapter)
    with pytest.raises(ExportError) as err:
        export_checkpoint(path)
    assert str(err.value) == (f"{path} does not match its model 'tiny-qwen3' ({total} parameters in the checkpoint, "
                              f"{total} in the model)")
    os.unlink(os.path.join(path, "meta.json"))
    with pytest.raises(ExportError, match="is not a complete checkpoint"):
        export_checkpoint(path)
    assert not os.path.exists(tmp_path / "run" / "final")


def test_checkpoint_units_are_read_in_turn_and_a_short_file_says_where(tmp_path):
    path = str(tmp_path / "master.f32")
    values = torch.arange(10, dtype=torch.float32)
    values.numpy().astype("<f4").tofile(path)
    units = list(export._checkpoint_units(path, [3, 7]))
    assert [u.tolist() for u in units] == [values[:3].tolist(), values[3:].tolist()]
    reader = export._checkpoint_units(path, [4, 7])
    assert next(reader).tolist() == values[:4].tolist()
    with pytest.raises(OSError) as err:
        next(reader)
    assert str(err.value) == f"{path}: short read in unit 1 (6 of 7 values)"
