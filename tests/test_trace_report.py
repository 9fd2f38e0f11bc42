"""scripts/trace_report.py: where the host updater idled, from a step timeline."""

from __future__ import annotations

import importlib.util
import json
import os

_spec = importlib.util.spec_from_file_location(
    "trace_report", os.path.join(os.path.dirname(__file__), "..", "scripts", "trace_report.py"))
trace_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trace_report)


def test_the_report_splits_the_updaters_idle_time_around_the_next_first_gradient(tmp_path, capsys):
    # step 2's backward ends at 1.0 and step 3's at 2.0; the updater finishes step 2's leftovers (units 1 and 3)
    # by 1.5, the forward of step 3 ends at 1.6 and step 3's first gradient is in hand at 1.7
    rows = [{"kind": "gpu", "step": 2, "start": 0.0, "forward_end": 0.4, "backward_end": 1.0},
            {"kind": "gpu", "step": 3, "start": 1.0, "forward_end": 1.6, "backward_end": 2.0},
            {"kind": "update", "step": 2, "unit": 1, "t0": 1.0, "landed": 1.0, "t1": 1.2},
            {"kind": "update", "step": 2, "unit": 3, "t0": 1.2, "landed": 1.2, "t1": 1.5},
            {"kind": "update", "step": 3, "unit": 4, "t0": 1.65, "landed": 1.7, "t1": 1.9}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    [r] = trace_report.report(trace_report.load(str(path)), first=2)
    assert r["step"] == 3 and r["period_s"] == 1.0 and r["leftover_units"] == 2 and r["last_unit_before"] == 3
    assert abs(r["updater_busy_s"] - 0.7) < 1e-9 and abs(r["idle_s"] - 0.3) < 1e-9
    assert abs(r["idle_before_first_gradient_s"] - 0.2) < 1e-9  # 1.5 -> 1.7
    assert abs(r["forward_end_after_last_update_s"] - 0.1) < 1e-9
    assert trace_report.main([str(path), "--from-step", "2"]) == 0
    assert '"median"' in capsys.readouterr().out
