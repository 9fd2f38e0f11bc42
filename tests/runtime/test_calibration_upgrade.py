"""A calibration record written before its shape carried heads, kv_heads and vocab is upgraded from its model's
config and then matches the job's shape; one whose fields cannot be derived is marked outdated, with why."""

from __future__ import annotations

import json
from pathlib import Path

from slidedp.config import JobConfig
from slidedp.planning.shape import calibration_shape, shape_differences, upgrade_calibration
from slidedp.presets import model_config_dict

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "h200x2_calibration.json"


def _job_shape(micro_batch: int) -> dict:
    cfg = JobConfig.from_dict(
        {
            "model": "qwen3-8b",
            "data": {"path": "x.jsonl"},
            "gpus": 2,
            "micro_batch_size": micro_batch,
            "seq_len": 2048,
        }
    )
    return calibration_shape(cfg, model_config_dict(cfg.model))


def test_an_old_record_gains_heads_kv_heads_and_vocab_from_the_model_config_and_then_matches():
    old = json.loads(FIXTURE.read_text())["qwen3-8b_bs8_nvlink"]
    assert {"heads", "kv_heads", "vocab"} - set(old["shape"]) == {"heads", "kv_heads", "vocab"}
    assert old["shape"] != _job_shape(8)

    new = upgrade_calibration(old)
    assert new["shape_upgraded"] == ["heads", "kv_heads", "vocab"]
    assert (new["shape"]["heads"], new["shape"]["kv_heads"], new["shape"]["vocab"]) == (32, 8, 151936)
    assert new["shape"] == _job_shape(8)
    assert "outdated" not in new
    assert old["shape"].get("heads") is None  # the stored record is left as it was
    # the job's micro-batch still decides: the same record says which field differs for another one
    assert shape_differences(_job_shape(4), new["shape"]) == ["micro-batch 8, not 4"]


def test_a_complete_record_is_left_as_it_is():
    record = {"shape": _job_shape(8), "schema": 5}
    assert upgrade_calibration(record) is record


def test_a_record_whose_fields_cannot_be_derived_is_marked_outdated():
    unknown = {"shape": {"model": "no-such-model-anywhere", "micro_batch": 8, "seq": 2048, "hidden": 4096}}
    out = upgrade_calibration(unknown)
    assert out["outdated"].startswith(
        "it lacks attention heads, KV heads, layers and vocabulary and the config of model "
        "'no-such-model-anywhere' is not known here"
    )
    assert "shape_upgraded" not in out

    # its model is known, but its hidden size is not that model's: the record cannot be completed from it
    wrong = {"shape": {"model": "qwen3-8b", "micro_batch": 8, "seq": 2048, "hidden": 2048, "layers": 36}}
    out = upgrade_calibration(wrong)
    assert (
        out["outdated"]
        == "it lacks attention heads, KV heads and vocabulary, and its hidden size 2048 is not the 4096 of "
        "qwen3-8b's config"
    )
    assert out["shape"] == wrong["shape"]
    assert shape_differences(_job_shape(8), out["shape"])[0] == "architecture not recorded, not qwen3"
