"""`slidedp bench` on the CPU: every policy of one command trains on one host state, removed at the end."""

import json
import os

import pytest
from slidedp import bench
from slidedp.policy import parse_shorthand


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_bench_reuses_one_host_state_and_removes_it(tmp_path, monkeypatch, capsys):
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv("SLIDEDP_SHM_DIR", str(shm))
    out = tmp_path / "bench.jsonl"
    rc = bench.main(["--model", "tiny-qwen3", "--gpus", "0", "--mbs", "2", "--seq", "32", "--steps", "3",
                     "--warmup", "1", "--policies", "sharded:gpu,replicated:host:checkpoint:0.5",
                     "--peers", "fsdp2-offload:0", "--data", "pattern", "--lr", "1e-3", "--out", str(out)])
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["policy"] for r in rows] == ["sharded:gpu", "replicated:host:checkpoint:0.5", "fsdp2-offload:0"]
    assert rows[2]["peer"] == "fsdp2-offload" and rows[2]["step_s"] > 0 and "error" not in rows[2]
    for r in rows[:2]:
        assert "error" not in r, r
        assert r["step_s"] > 0 and len(r["losses"]) == 3
    assert rows[0]["chosen"]["delivery"] == "sharded" and rows[1]["chosen"]["grad_reduce"] == "host"
    # the second policy trained on the weights the first one left: its first loss continues the fall
    assert rows[1]["losses"][0] < rows[0]["losses"][0]
    assert "host state kept from the previous run" in capsys.readouterr().out
    assert os.listdir(shm) == []


def test_bench_rejects_a_malformed_policy_before_training(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="delivery:grad_reduce"):
        bench.main(["--model", "tiny-qwen3", "--gpus", "0", "--policies", "sharded", "--out",
                    str(tmp_path / "x.jsonl")])


def test_policy_strings_name_activation_mixes_and_the_cast():
    p, clip = parse_shorthand("sharded:gpu:keep27:0:auto")
    assert (p.activations, p.keep_layers, p.offload_layers, p.resident_units, clip) == (
        "auto", 27, 0, None, 0.0)
    p, clip = parse_shorthand("replicated:host:off18:1.0:0:gpu")
    assert (p.offload_layers, p.keep_layers, clip, p.resident_units, p.delivery_cast) == (
        18, 0, 1.0, 0, "gpu")
    assert parse_shorthand("sharded:gpu")[0].activations == "checkpoint"
    assert parse_shorthand("sharded:gpu")[0].edge_update == "host"
    assert parse_shorthand("sharded:gpu:checkpoint:0:36:gpu:gpu")[0].edge_update == "gpu"
    assert parse_shorthand("sharded:gpu:checkpoint:0:36:gpu:gpu")[0].device_layers == 0
    assert parse_shorthand("auto:auto:auto:0:auto:host:auto:auto")[0].device_layers is None
    assert parse_shorthand("sharded:gpu:keep18:0:auto:host:gpu:9")[0].device_layers == 9


def test_peer_specs_take_eager_or_compiled_layers():
    assert bench.parse_peer("fsdp2:0:1.0:compiled") == {"name": "fsdp2", "keep": 0, "clip": 1.0,
                                                         "compiled_layers": True}
    assert bench.parse_peer("fsdp2-offload:none:0:eager")["compiled_layers"] is False
    assert bench.parse_peer("fsdp2:8")["compiled_layers"] is False  # omitted: eager
    with pytest.raises(ValueError, match=r"peer 'fsdp2:0:1.0:fast': layers must be one of eager, compiled"):
        bench.parse_peer("fsdp2:0:1.0:fast")
    with pytest.raises(ValueError, match=r"fsdp2\[:keep\[:clip\[:layers\]\]\]"):
        bench.parse_peer("fsdp2:0:1.0:compiled:extra")


def test_bench_rejects_a_bad_peer_layers_field_before_training(tmp_path):
    with pytest.raises(ValueError, match="eager, compiled"):
        bench.main(["--model", "tiny-qwen3", "--gpus", "0", "--policies", "", "--peers", "fsdp2:0:1.0:fast",
                    "--out", str(tmp_path / "x.jsonl")])
    assert not (tmp_path / "x.jsonl").exists()
