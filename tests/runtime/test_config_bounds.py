"""Every config value is bounded: whatever JobConfig accepts, validation and planning handle without a raw error.

Integers fit a signed 64-bit integer (most keys have a tighter documented `le`), numbers are finite, strings hold
neither a NUL nor a lone UTF-16 surrogate; every refusal is a ConfigError naming the key path, with a message
that itself encodes as UTF-8. The last tests feed the largest accepted value of every numeric key through
JobConfig.from_dict, validate_job and plan_job.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing

import pytest
from slidedp.config import ConfigError, JobConfig
from slidedp.config_parse import INT64_MAX, INT64_MIN
from slidedp.config_schema import schema_doc

BASE = {"model": "tiny-qwen3", "data": {"path": "unused.jsonl"}}


def _with(raw: dict, path: str, value) -> dict:
    out = json.loads(json.dumps(raw))
    node = out
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def _fields(cls=JobConfig, prefix: str = ""):
    """(key path, scalar type, metadata) of every leaf key, optional sections included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp
        if dataclasses.is_dataclass(inner):
            yield from _fields(inner, prefix + f.name + ".")
        else:
            yield prefix + f.name, inner, dict(f.metadata)


def _refused(raw: dict) -> list[dict]:
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(raw)
    text = str(err.value)
    text.encode("utf-8")  # the message is printable and storable whatever the value was
    json.dumps(err.value.errors, ensure_ascii=False).encode("utf-8")
    return err.value.errors


INT_KEYS = [p for p, tp, _ in _fields() if tp is int]
FLOAT_KEYS = [p for p, tp, _ in _fields() if tp is float]
STR_KEYS = [p for p, tp, _ in _fields() if tp is str]


def test_the_schema_walk_finds_the_keys():
    assert {"steps", "seed", "data.seed", "checkpoint.keep", "policy.window", "init_from.job"} <= set(INT_KEYS)
    assert {"model", "data.path", "data.text_field", "output_dir", "init_from.checkpoint"} <= set(STR_KEYS)
    assert {"host_ram_gib", "optimizer.lr"} <= set(FLOAT_KEYS)


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1, 10**5000, 1e300], ids=["2^63", "-2^63-1", "10^5000",
                                                                                       "1e300"])
def test_integers_beyond_int64_are_refused_by_key(key, value):
    raw = _with(BASE, key, value)
    if key.startswith("init_from."):
        raw["init_from"].setdefault("checkpoint", "/elsewhere/step-00000001")
    errors = _refused(raw)
    assert errors == [{"loc": key, "msg": errors[0]["msg"]}]
    assert "signed 64-bit" in errors[0]["msg"]


@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_numbers_beyond_the_largest_float_are_refused_as_not_finite(key):
    errors = _refused(_with(BASE, key, 10**400))
    assert errors[0]["loc"] == key and "finite" in errors[0]["msg"]


@pytest.mark.parametrize("key,limit", [("steps", 10**9), ("seed", INT64_MAX), ("data.seed", INT64_MAX),
                                       ("host_ram_gib", 2**20), ("cpu_threads", 4096), ("ranks", 4096),
                                       ("gpus", 4096), ("schedule.warmup_steps", 10**9)])
def test_documented_upper_bounds(key, limit):
    raw = _with(BASE, key, limit)
    if key == "schedule.warmup_steps":
        raw["steps"] = 10**9
    JobConfig.from_dict(raw)
    over = limit + 1 if isinstance(limit, int) else limit * 2
    if key == "host_ram_gib":
        over = 1.7e299  # int(1.7e299 * 2**30) overflowed in validation before the bound
    errors = _refused(_with(raw, key, over))
    assert errors[0]["loc"] == key and ("at most" in errors[0]["msg"] or "64-bit" in errors[0]["msg"])


def test_seeds_are_non_negative_and_the_schema_says_so():
    for key in ("seed", "data.seed"):
        assert _refused(_with(BASE, key, -1))[0]["loc"] == key
        JobConfig.from_dict(_with(BASE, key, 0))
    meta = {p: m for p, _, m in _fields()}
    assert (meta["seed"]["ge"], meta["seed"]["le"]) == (0, 2**63 - 1)
    assert (meta["data.seed"]["ge"], meta["data.seed"]["le"]) == (0, 2**63 - 1)
    assert meta["steps"]["le"] == 10**9 and meta["host_ram_gib"]["le"] == 2**20


def test_host_ram_gib_at_its_bound_validates_without_overflow():
    from slidedp.host_memory import host_ram_limit

    cfg = JobConfig.from_dict(_with(BASE, "host_ram_gib", 2**20))
    assert host_ram_limit(cfg.host_ram_gib) == (2**50, "host_ram_gib")
    # the value the bound exists for: an OverflowError in validation before, a ConfigError now
    assert _refused(_with(BASE, "host_ram_gib", 1.7e299))[0]["loc"] == "host_ram_gib"


def test_the_python_api_keeps_more_ranks_than_cores():
    cfg = JobConfig.from_dict({**BASE, "ranks": 3, "cpu_threads": 1})
    assert cfg.world_size == 3


@pytest.mark.parametrize("key", STR_KEYS)
@pytest.mark.parametrize("bad,what", [("a\x00b", "NUL"), ("\ud800", "surrogate"), ("x\udfffy", "surrogate")],
                         ids=["nul", "high-surrogate", "low-surrogate"])
def test_strings_refuse_nul_and_lone_surrogates(key, bad, what):
    raw = _with(BASE, key, bad)
    errors = _refused(raw)
    assert [e["loc"] for e in errors] == [key]
    msg = errors[0]["msg"]
    assert what in msg and "position" in msg
    if what == "surrogate":
        assert "UTF-8" in msg and ("U+D800" in msg or "U+DFFF" in msg)


def test_ordinary_unicode_strings_are_kept():
    cfg = JobConfig.from_dict({**BASE, "output_dir": "runs/été-😀", "data": {"path": "données.jsonl"}})
    assert cfg.output_dir == "runs/été-😀"


def test_unknown_keys_and_huge_values_still_make_printable_errors():
    errors = _refused({**BASE, "\ud800key": 1, "precision": 10**5000})
    locs = {e["loc"] for e in errors}
    assert "precision" in locs and len(locs) == 2
    assert any("bits" in e["msg"] for e in errors if e["loc"] == "precision")


def test_a_weight_decay_that_flips_the_weights_is_refused_with_the_bound():
    # lr 1e-4 x weight_decay 7e307: every step would multiply each weight by a huge negative factor, the run
    # diverging at step 2 instead of being refused at submit.
    errors = _refused({**BASE, "optimizer": {"lr": 1e-4, "weight_decay": 7.458054569214979e307}})
    assert [e["loc"] for e in errors] == ["optimizer.weight_decay"]
    assert "below 1/lr" in errors[0]["msg"]
    _refused({**BASE, "optimizer": {"lr": 0.5, "weight_decay": 2.0}})  # exactly 1 zeroes every weight
    JobConfig.from_dict({**BASE, "optimizer": {"lr": 1e-3, "weight_decay": 0.1}})


def test_schema_doc_lists_the_init_from_keys():
    rows = {r[0]: r for r in schema_doc()}
    assert rows["init_from"][1:3] == ("mapping or null", "null")
    assert rows["init_from.job"][1] == "an integer or null"
    assert rows["init_from.checkpoint"][1] == "a string or null"


# ------------------------------------------------------------------------------ the largest accepted values


def _max_value(tp, meta: dict):
    if "le" in meta:
        return meta["le"]
    if "lt" in meta:
        return meta["lt"] - (1 if tp is int else 1e-9)
    return INT64_MAX if tp is int else sys.float_info.max


def _numeric_max_configs(base: dict) -> list[tuple[str, dict]]:
    out = []
    for path, tp, meta in _fields():
        if tp not in (int, float):
            continue
        raw = _with(base, path, _max_value(tp, meta))
        if path == "schedule.warmup_steps":
            raw["steps"] = 10**9  # warmup may not outlast the run
        if path == "schedule.min_lr_ratio":
            raw["schedule"]["decay"] = "cosine"
        if path == "optimizer.weight_decay":
            raw["optimizer"]["lr"] = 0.5 / sys.float_info.max  # lr x weight_decay must stay below 1
        if path == "gpu_memory_gib":
            raw["gpus"] = 1  # a cap of GPU memory: a CPU job refuses it
        if path.startswith("init_from."):
            continue  # a job id is resolved by the web service; not planned
        out.append((path, raw))
    return out


@pytest.fixture(scope="module")
def topo():
    from slidedp.planning import topology

    return topology.detect(None)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bounds") / "data.jsonl"
    path.write_text(json.dumps({"input_ids": list(range(3, 35))}) + "\n", encoding="utf-8")
    return str(path)


def _plan_and_validate(raw: dict, topo) -> None:
    from slidedp.planning.autopolicy import plan_job
    from slidedp.validation import validate_job

    try:
        cfg = JobConfig.from_dict(raw)
        validate_job(cfg)
        plan_job(cfg, topo, None)
    except ConfigError:
        pass


@pytest.mark.parametrize("key", [k for k, _ in _numeric_max_configs(BASE)])
def test_the_largest_accepted_value_of_each_key_plans_and_validates(key, topo, data_file, tmp_path):
    base = {**BASE, "data": {"path": data_file, "format": "tokens"}, "seq_len": 32,
            "output_dir": str(tmp_path / "out")}
    raw = dict(_numeric_max_configs(base))[key]
    JobConfig.from_dict(raw)  # accepted ...
    _plan_and_validate(raw, topo)  # ... and nothing but a ConfigError escapes


def test_every_key_at_its_largest_accepted_value_at_once(topo, data_file, tmp_path):
    raw = {**BASE, "data": {"path": data_file, "format": "tokens", "seed": INT64_MAX},
           "output_dir": str(tmp_path / "out")}
    for path, tp, meta in _fields():
        if tp in (int, float) and not path.startswith(("init_from.", "data.")):
            raw = _with(raw, path, _max_value(tp, meta))
    raw["policy"]["activations"] = "auto"
    raw["schedule"]["decay"] = "linear"
    raw["optimizer"]["weight_decay"] = 0.5 / sys.float_info.max  # lr x weight_decay must stay below 1
    JobConfig.from_dict(raw)
    _plan_and_validate(raw, topo)
    _plan_and_validate({**raw, "gpus": 0, "gpu_memory_gib": None}, topo)  # CPU ranks at their largest
