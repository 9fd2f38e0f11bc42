"""scripts/bench_report.py: docs/benchmarks.md's current-results table is what the raw results give, and the
figure is made from them.

    .venv/bin/python -m pytest -q tests/test_bench_report.py
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import matplotlib  # noqa: F401  (a dev dependency: the figure needs it)
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_report.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def load_report():
    spec = importlib.util.spec_from_file_location("bench_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_passes_on_the_repository():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "matches the raw results" in done.stdout


def test_every_figure_in_the_table_comes_from_the_rows_named():
    report = load_report()
    scenarios, _ = report.load()
    spec = json.loads(report.SCENARIOS.read_text(encoding="utf-8"))["scenarios"]
    assert len(scenarios) == len(spec)
    for s, declared in zip(scenarios, spec):
        rows = report.read_rows(report.RESULTS, declared["results"])
        by_policy = {r["policy"]: r for r in rows}
        picked = [by_policy[declared["slidedp"]]] + [by_policy[p] for p in declared["peers"]]
        assert [sy["kind"] for sy in s["systems"]] == ["slidedp"] + [r["peer"] for r in picked[1:]]
        for sy, row in zip(s["systems"], picked):
            assert sy["step_s"] == row["step_s"]
            assert sy["hbm_gib"] == row["hbm_peak_gib"]
            assert sy["tokens_per_s"] == pytest.approx(row["gpus"] * row["mbs"] * row["seq"] / row["step_s"])
            assert sy["vs"] == pytest.approx(row["step_s"] / picked[0]["step_s"])
            assert sy["first_step_s"] == row.get("time_to_first_step_s")
        assert s["cap"] == picked[0].get("gpu_memory_gib")


def test_a_capped_run_shows_its_cap_and_its_time_to_first_step():
    report = load_report()
    scenarios, machines = report.load()
    capped = [s for s in scenarios if s["cap"]]
    assert capped, "no scenario under a --gpu-memory-gib cap"
    table = report.markdown(scenarios, machines)
    for s in capped:
        assert f"| {report.model_name(s['model'])} | {s['gpus']} under {s['cap']:g} GiB | {s['mbs']} |" in table
    timed = [sy for s in scenarios for sy in s["systems"] if sy["first_step_s"] is not None]
    assert timed and all(f"| {sy['first_step_s']:.1f} |" in table for sy in timed)


def test_a_command_whose_cap_is_not_its_rows_is_refused(tmp_path):
    report = load_report()
    spec = json.loads(report.SCENARIOS.read_text(encoding="utf-8"))
    spec["scenarios"] = [s for s in spec["scenarios"] if "--gpu-memory-gib 24" in s["command"]][:1]
    assert spec["scenarios"]
    spec["scenarios"][0]["command"] = spec["scenarios"][0]["command"].replace("--gpu-memory-gib 24 ", "")
    bad = tmp_path / "scenarios.json"
    bad.write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(report.ReportError, match="gpu_memory_gib=24"):
        report.load(bad, report.RESULTS)


def test_the_label_says_where_the_embedding_and_head_are_updated():
    """A row with leading layers on the GPU and the embedding and head on the host was labelled as if all of them
    were updated on the GPU."""
    report = load_report()
    row = {"gpus": 1, "policy": "auto", "chosen": {"edge_update": "host", "device_layers": 18}}
    assert report.slidedp_label(row, 36).startswith(
        "**SlideDP** AutoPolicy: 18 layers updated on the GPU, embedding/head on the host")
    row["chosen"]["edge_update"] = "gpu"
    assert "embedding/head + 18 layers updated on the GPU" in report.slidedp_label(row, 36)
    row["chosen"]["device_layers"] = 0
    assert "embedding/head updated on the GPU" in report.slidedp_label(row, 36)
    row["chosen"]["edge_update"] = "host"
    assert "every unit updated on the host" in report.slidedp_label(row, 36)


def test_the_label_names_the_streamed_layers_the_rows_engine_streamed():
    """A row of an engine that streams the layers right after the device layers was labelled with the last ones."""
    report = load_report()
    row = {"gpus": 1, "policy": "auto", "chosen": {"edge_update": "gpu", "device_layers": 1, "streamed_layers": 18}}
    assert "last 18 layers' update after the norm streamed" in report.slidedp_label(row, 36, "s21")
    assert "the update of layers 2-19 after the norm streamed" in report.slidedp_label(row, 36, "s23")
    row["chosen"].update(device_layers=0, streamed_layers=1)
    assert "the update of layer 1 after the norm streamed" in report.slidedp_label(row, 36, "s23")


def test_check_fails_when_the_doc_differs(tmp_path):
    doc = tmp_path / "benchmarks.md"
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    doc.write_text(text.replace("| Qwen3-8B | 2 | 4 |", "| Qwen3-8B | 2 | 5 |", 1), encoding="utf-8")
    report = load_report()
    assert report.main(["--check", "--doc", str(doc)]) == 1


def test_a_command_that_does_not_match_its_rows_is_refused(tmp_path):
    report = load_report()
    spec = json.loads(report.SCENARIOS.read_text(encoding="utf-8"))
    spec["scenarios"] = spec["scenarios"][:1]
    spec["scenarios"][0]["command"] = spec["scenarios"][0]["command"].replace("--threads 16", "--threads 32")
    bad = tmp_path / "scenarios.json"
    bad.write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(report.ReportError, match="--threads"):
        report.load(bad, report.RESULTS)


def test_the_figure_is_a_png_made_from_the_raw_results_and_the_same_each_time(tmp_path):
    first, second = tmp_path / "a" / "benchmarks.png", tmp_path / "b" / "benchmarks.png"
    for out in (first, second):
        done = subprocess.run([sys.executable, str(SCRIPT), "--png", str(out)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    data = first.read_bytes()
    assert len(data) > 1000
    assert data.startswith(PNG_SIGNATURE)
    assert data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 1000 and height >= 500
    assert second.read_bytes() == data
