"""What `slidedp train`, `slidedp presets` and `slidedp bench --help` print.

train: a progress bar on a terminal (elapsed, ETA, loss, tokens/s, step time), otherwise one line per step with
elapsed time and ETA appended; a CPU run's step lines carry no TFLOP/s or HBM figures. presets: a table with a
header row. bench: every option says what it does and its default.
"""

from __future__ import annotations

import io
import json
import os
import re

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from slidedp import bench, cli  # noqa: E402
from slidedp.launch import _format_step  # noqa: E402
from slidedp.progress import STEP_LINE, TrainProgress, format_duration  # noqa: E402

from tests.runtime.exactness import make_token_data  # noqa: E402


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _record(step: int, *, gpu: bool = False, loss: float = 5.0) -> dict:
    return {"step": step, "loss": loss, "lr": 1e-3, "grad_norm": 1.5, "clipped": False, "step_time_s": 2.0,
            "tokens_per_s": 12345.6, "tflops": 123.4 if gpu else 0.01,
            "hbm_peak_gib": [40.5, 41.25] if gpu else [], "host_rss_gib": 7.5}


def _run(progress: TrainProgress, clock: FakeClock, steps: int, first: int = 1, every: float = 2.0) -> None:
    """What slidedp.train does with on_log and on_step: a log line, then per step its line and its record."""
    progress.log("host state: 0.2 M params")
    clock.t += 10.0  # set-up
    for step in range(first, steps + 1):
        clock.t += every
        record = _record(step, loss=6.0 - step / 10)
        progress.log(_format_step(record, steps))
        progress.step(record)
    progress.log("exported a Hugging Face model to out/final")
    progress.close()


def test_durations_read_as_clock_times():
    assert [format_duration(s) for s in (0, 7.4, 65, 754, 3723)] == ["0:00", "0:07", "1:05", "12:34", "1:02:03"]


def test_off_a_terminal_each_step_is_one_plain_line_with_elapsed_and_eta():
    out, clock = io.StringIO(), FakeClock()
    progress = TrainProgress(5, stream=out, clock=clock)
    assert progress.use_bar is False  # a StringIO is no terminal
    _run(progress, clock, 5)
    lines = out.getvalue().splitlines()
    assert lines[0] == "host state: 0.2 M params" and lines[-1] == "exported a Hugging Face model to out/final"
    steps = lines[1:-1]
    assert len(steps) == 5 and all(STEP_LINE.match(line) for line in steps)
    # elapsed counts the set-up; the ETA is the first step's own time until a second one is seen, then the
    # wall time per step since the first (2 s here) times the steps left
    assert steps[0].endswith("| rss 7.5 GiB | 0:12 elapsed, ETA 0:08")
    assert steps[1].endswith("| 0:14 elapsed, ETA 0:06")
    assert steps[4].endswith("| 0:20 elapsed, ETA 0:00")
    assert steps[2].startswith(_format_step(_record(3, loss=5.7), 5))  # the launcher's line, unchanged


def test_a_resumed_run_estimates_from_its_own_steps():
    out, clock = io.StringIO(), FakeClock()
    _run(TrainProgress(100, stream=out, clock=clock), clock, 100, first=91, every=3.0)
    steps = [line for line in out.getvalue().splitlines() if line.startswith("step ")]
    assert steps[0].startswith("step    91/100") and steps[0].endswith("0:13 elapsed, ETA 0:18")  # 9 x 2.0 s
    assert steps[1].endswith("0:16 elapsed, ETA 0:24")  # 8 x 3.0 s


def test_lines_logged_between_a_step_line_and_its_record_follow_that_step():
    out, clock = io.StringIO(), FakeClock()
    progress = TrainProgress(3, stream=out, clock=clock)
    progress.log(_format_step(_record(1), 3))
    progress.log("warning: the loss rose")
    progress.step(_record(1))
    progress.close()
    first, second = out.getvalue().splitlines()
    assert first.startswith("step     1/3 |") and "elapsed, ETA" in first and second == "warning: the loss rose"


def test_on_a_terminal_a_bar_shows_progress_times_and_the_step_figures():
    out, clock = FakeTerminal(), FakeClock()
    progress = TrainProgress(4, stream=out, clock=clock)
    assert progress.use_bar is True
    progress.log("host state: 0.2 M params")
    clock.t += 10.0
    for step in (1, 2):
        clock.t += 2.0
        progress.log(_format_step(_record(step), 4))
        progress.step(_record(step, loss=4.25))
    progress.log("checkpoint of step 2 written to out/checkpoints/step-2")
    progress.close()
    text = out.getvalue()
    assert text.startswith("host state: 0.2 M params\n")
    assert "\r" in text  # redrawn in place
    assert re.search(r"train: +50%\|.*\| 2/4 \[00:14 elapsed, ETA 00:04, loss=4\.2500, tok/s=12,346, step=2\.000s\]",
                     text), text
    # above the bar (tqdm clears it, writes the line, draws it again), on a line of its own
    assert re.search(r"\r *\rcheckpoint of step 2 written to out/checkpoints/step-2\n\rtrain: +50%", text), text
    assert not re.search(r"(^|\n)step +\d+/4", text)  # the bar stands for the step lines


def test_the_bar_can_be_asked_for_or_refused_whatever_the_stream():
    assert TrainProgress(3, stream=io.StringIO(), bar=True).use_bar is True
    assert TrainProgress(3, stream=FakeTerminal(), bar=False).use_bar is False


def test_a_cpu_step_line_has_no_gpu_figures_and_a_gpu_one_keeps_them():
    cpu = _format_step(_record(3), 10)
    assert cpu == ("step     3/10 | loss 5.0000 | lr 1.00e-03 | gnorm 1.500 | 2.000 s | 12,346 tok/s | rss 7.5 GiB")
    gpu = _format_step(_record(3, gpu=True), 10)
    assert gpu == ("step     3/10 | loss 5.0000 | lr 1.00e-03 | gnorm 1.500 | 2.000 s | 12,346 tok/s | "
                   "123.4 TFLOP/s | hbm 41.2 GiB | rss 7.5 GiB")
    assert STEP_LINE.match(cpu) and STEP_LINE.match(gpu)


def test_presets_print_a_header_row_above_aligned_columns(capsys):
    from slidedp.presets import PRESETS

    assert cli.main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "family", "layers", "hidden", "params", "(M)", "host", "state", "(GiB)"]
    assert [line.split()[0] for line in lines[1:]] == list(PRESETS)
    assert len({len(line) for line in lines}) == 1  # every row as wide as the header: the columns line up
    row = dict(zip(("name", "family", "layers", "hidden"), lines[1 + list(PRESETS).index("qwen3-8b")].split()))
    assert row == {"name": "qwen3-8b", "family": "qwen3", "layers": "36", "hidden": "4096"}


def test_every_bench_option_says_what_it_does_and_its_default():
    parser = bench.build_parser()
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in options} >= {"model", "gpus", "mbs", "seq", "steps", "warmup", "threads", "policies",
                                         "peers", "data", "lr", "no_plan", "plan_only", "out"}
    for a in options:
        assert a.help and len(a.help) > 20, a.dest
        assert "default" in a.help, a.dest
    text = " ".join(parser.format_help().split())  # argparse wraps lines at the terminal's width
    assert "(default: qwen3-8b)" in text and "(default: sharded:gpu)" in text


@pytest.fixture
def job(tmp_path):
    data = make_token_data(str(tmp_path / "data.jsonl"), rows=4, seq_len=32, seed=2)
    cfg = {"model": "tiny-qwen3", "data": {"path": data, "format": "tokens"}, "seq_len": 32, "micro_batch_size": 2,
           "steps": 2, "ranks": 1, "precision": "fp32", "output_dir": str(tmp_path / "out"), "cpu_threads": 1,
           "export": False, "policy": {"delivery": "replicated", "grad_reduce": "host", "activations": "checkpoint",
                                       "resident_units": 0}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return str(path)


def test_train_off_a_terminal_prints_plain_step_lines_with_times(job, capsys):
    assert cli.main(["train", "--config", job]) == 0
    lines = capsys.readouterr().out.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1/2", "2/2"]
    for line in steps:
        assert re.search(r" tok/s \| rss \d+\.\d GiB \| \d+:\d\d elapsed, ETA \d+:\d\d$", line), line
        assert "TFLOP/s" not in line and "hbm" not in line  # a CPU run
    assert json.loads(lines[-1])["steps_done"] == 2


def test_the_step_line_carries_the_evaluations():
    first = {**_record(1), "eval_loss_start": 6.25, "eval_ppl_start": 518.0}
    assert _format_step(first, 4).endswith("| eval before 6.2500 (ppl 518.0)")
    evald = {**_record(4), "eval_loss": 2.5, "eval_ppl": 12.18}
    assert _format_step(evald, 4).endswith("| eval 2.5000 (ppl 12.2)")
    assert "eval" not in _format_step(_record(2), 4)
