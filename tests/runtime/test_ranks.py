"""slidedp.ranks: the one launcher of rank processes (training, the peer baselines and calibration start theirs
with it). Real processes on the loopback, a gloo group through the file:// rendezvous."""

from __future__ import annotations

import ast
import contextlib
import os
import queue
import stat
import time
from pathlib import Path

import pytest
from slidedp.ranks import Launch, RankFailed

RUNTIME = Path(__file__).resolve().parents[2] / "runtime" / "slidedp"


def test_three_ranks_join_one_group_and_answer_in_rank_order():
    with Launch("tests.runtime.rank_targets:identity", 3) as ranks:
        assert stat.S_IMODE(os.stat(ranks.dir).st_mode) == 0o700  # the rendezvous and the socket are private
        ranks.start({"offset": 10})
        results = ranks.results(timeout_s=120)
        directory = ranks.dir
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["world"] == 3 and r["sum"] == 33.0 for r in results)  # 10 + 11 + 12 over the group
    assert [r["env"]["RANK"] for r in results] == ["0", "1", "2"]
    assert all(r["env"]["WORLD_SIZE"] == "3" and r["env"]["GLOO_SOCKET_IFNAME"] == "lo" for r in results)
    assert all(r["env"]["NCCL_NVLS_ENABLE"] == "0" for r in results)
    assert not os.path.exists(directory)  # removed when the launch is left


def test_messages_other_than_the_result_reach_the_launcher():
    with Launch("tests.runtime.rank_targets:identity", 2) as ranks:
        ranks.start({"offset": 0})
        seen = []
        while len([m for m in seen if m[0] == "result"]) < 2:
            seen.append(ranks.get(timeout=60))
    notes = sorted((rank, payload) for kind, rank, payload in seen if kind == "note")
    assert notes == [(0, "hello from 0"), (1, "hello from 1")]


def test_an_exception_in_a_rank_arrives_with_its_traceback():
    with Launch("tests.runtime.rank_targets:fails_on_one", 2) as ranks:
        ranks.start({"sleep": 30})
        with pytest.raises(RankFailed) as err:
            ranks.results(timeout_s=120)
        ranks.procs[1].wait(timeout=60)  # its error message arrives just before the process has exited
        assert ranks.failed() == [(1, 1)]
    assert err.value.rank == 1 and not err.value.oom
    assert "ValueError: rank one refuses" in str(err.value)


def test_a_rank_that_dies_without_a_word_is_an_error_not_a_hang():
    with Launch("tests.runtime.rank_targets:exits_silently", 2, log=True) as ranks:
        ranks.start({})
        with pytest.raises(RankFailed, match="exited with code 3 without a result"):
            ranks.results(timeout_s=120, grace_s=0.5)


def test_a_rank_that_returns_nothing_is_an_error_for_results():
    with Launch("tests.runtime.rank_targets:says_nothing", 1) as ranks:
        ranks.start({})
        with pytest.raises(RankFailed, match="exited with code 0 without a result"):
            ranks.results(timeout_s=60, grace_s=0.5)


def test_results_time_out_and_leaving_the_launch_ends_the_ranks():
    with Launch("tests.runtime.rank_targets:sleeps", 1) as ranks:
        ranks.start({"seconds": 600})
        with pytest.raises(RankFailed, match="no result from rank"):
            ranks.results(timeout_s=1)
        procs = list(ranks.procs)
    assert all(p.poll() is not None for p in procs)


def test_the_rank_command_line_names_its_target():
    with Launch("tests.runtime.rank_targets:sleeps", 1) as ranks:
        ranks.start({"seconds": 30})
        argv: list[bytes] = []
        for _ in range(200):  # until the child has exec'd the interpreter
            with open(f"/proc/{ranks.pids[0]}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            if b"slidedp.ranks" in argv:
                break
            time.sleep(0.05)
    assert argv[1:4] == [b"-m", b"slidedp.ranks", b"tests.runtime.rank_targets:sleeps"]


def test_spawned_ranks_wait_for_their_args_and_then_run_as_started_ones():
    with Launch("tests.runtime.rank_targets:identity", 2) as ranks:
        ranks.spawn()
        assert len(ranks.pids) == 2 and not ranks.args_sent
        time.sleep(0.5)  # the ranks are up and waiting: nothing is answered before the args come
        with pytest.raises(queue.Empty):
            ranks.get(timeout=0.5)
        ranks.start({"offset": 1})
        results = ranks.results(timeout_s=120)
        with pytest.raises(RuntimeError, match="have their args already"):
            ranks.start({"offset": 1})
    assert [r["sum"] for r in results] == [3.0, 3.0]  # 1 + 2 over the group


def test_spawned_ranks_end_when_their_launcher_dies_before_sending_args(tmp_path):
    """A launcher killed while it plans (no close, no args) leaves no rank waiting for ever."""
    import subprocess
    import sys

    import psutil

    script = ("import os, sys, time\n"
              "from slidedp.ranks import Launch\n"
              "ranks = Launch('tests.runtime.rank_targets:identity', 2)\n"
              "ranks.spawn()\n"
              "print(' '.join(map(str, ranks.pids)), flush=True)\n"
              "time.sleep(1.0)\n"
              "os._exit(0)\n")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "runtime"), str(root)]))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    ranks = []
    for pid in out.stdout.split():
        with contextlib.suppress(psutil.NoSuchProcess):
            ranks.append(psutil.Process(int(pid)))
    _, alive = psutil.wait_procs(ranks, timeout=60)
    assert alive == []


def test_a_spawned_rank_that_dies_before_its_args_is_an_error_for_start():
    with Launch("tests.runtime.rank_targets:sleeps", 2) as ranks:
        ranks.spawn()
        ranks.procs[1].kill()
        ranks.procs[1].wait()
        with pytest.raises(RankFailed, match="rank 1 exited with code -9 before it was given its work"):
            ranks.start({"seconds": 1}, connect_timeout_s=60)


def test_a_spawned_rank_that_dies_after_connecting_is_an_error_for_start_not_a_broken_pipe():
    with Launch("tests.runtime.rank_targets:sleeps", 2, log=True) as ranks:
        ranks.spawn()
        ranks._connected(timeout_s=60)  # both ranks connected and waiting for their args
        ranks.procs[1].kill()
        ranks.procs[1].wait()
        with pytest.raises(RankFailed, match="rank 1 exited with code -9 before it was given its work"):
            ranks.start({"seconds": 1}, connect_timeout_s=60)


def test_bad_launches_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="module:function"):
        Launch("tests.runtime.rank_targets", 1)
    with pytest.raises(ValueError, match="at least 1"):
        Launch("tests.runtime.rank_targets:sleeps", 0)


def _calls(path: Path) -> set[str]:
    """Dotted names of what a module calls or imports (subprocess.Popen, multiprocessing.get_context, ...)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            out.add(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_only_the_launcher_starts_interpreters_or_spawns_processes():
    """One way to start ranks: nothing else in the runtime uses Popen or multiprocessing (topology's probes run
    a short `python -c` with subprocess.run, which is not a rank)."""
    offenders = []
    for path in sorted(RUNTIME.rglob("*.py")):
        if path.name == "ranks.py" and path.parent == RUNTIME:
            continue
        found = _calls(path) & {"subprocess.Popen", "multiprocessing", "mp.get_context", "multiprocessing.connection"}
        if found:
            offenders.append(f"{path.relative_to(RUNTIME)}: {sorted(found)}")
    assert not offenders, offenders
