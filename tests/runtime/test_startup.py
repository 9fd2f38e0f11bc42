"""Start-up stages (slidedp.startup): train() reports each stage as it begins, progress while the host state is
filled, and the durations in the first step's record, the log and the `training` stage."""

from __future__ import annotations

import pytest
from slidedp.launch import train
from slidedp.startup import Startup

from tests.runtime.exactness import make_pattern_data


def test_train_reports_its_start_up_stages_in_order_with_their_durations(tmp_path):
    data = make_pattern_data(str(tmp_path / "data.jsonl"), rows=16, seq_len=32)
    seen: list[dict] = []
    lines: list[str] = []
    result = train({"model": "tiny-qwen3", "data": {"path": data, "format": "tokens"}, "seq_len": 32,
                    "micro_batch_size": 2, "steps": 2, "precision": "fp32", "output_dir": str(tmp_path / "out"),
                    "export": False}, on_stage=seen.append, on_log=lines.append)
    order = [e["stage"] for e in seen if "progress" not in e]
    if "calibrating" in order:  # this host had no calibration of the job's shape yet: measured, then cached
        assert order.index("calibrating") == 1
    assert [s for s in order if s != "calibrating"] == [
        "planning", "building_host_state", "starting_ranks", "first_step", "training"]
    progress = [e for e in seen if "progress" in e]
    assert progress and progress[-1]["stage"] == "building_host_state" and 0 <= progress[-1]["progress"] < 1
    assert all(e["elapsed_s"] >= 0 for e in seen)
    durations = seen[-1]["durations"]
    assert list(durations) == order[:-1] and all(v >= 0 for v in durations.values())
    assert result.metrics[0]["startup_s"] == durations and "startup_s" not in result.metrics[1]
    first = result.metrics[0]["time_to_first_step_s"]
    assert first == seen[-1]["total_s"] >= sum(durations.values()) - 0.01 and "time_to_first_step_s" not in \
        result.metrics[1]
    assert any(line.startswith("start-up took ") for line in lines)


def test_stages_are_named_and_progress_is_rate_limited():
    events: list[dict] = []
    s = Startup(events.append, None)
    with pytest.raises(ValueError, match="unknown start-up stage"):
        s.enter("dreaming")
    s.enter("building_host_state")
    for i in range(1000):
        s.progress(i, 1000)
    assert 1 <= len([e for e in events if "progress" in e]) <= 3  # the first at once, then every 0.5 s
    s.progress(1000, 1000)
    assert events[-1]["progress"] == 1.0
    assert set(s.finish()) == {"building_host_state"} and events[-1]["stage"] == "training"
