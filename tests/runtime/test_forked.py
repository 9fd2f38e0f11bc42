"""A plan's independent searches side by side in forked copies (slidedp/planning/forked.py): the answers are the
map's, in order; a copy is made only inside side_by_side() and where no other thread runs; an exception is raised
as the map would raise it; a copy that dies has its item computed here; copies die with their parent. (A plan
made side by side against the one-process plan: tests/runtime/test_card_sweep.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from slidedp.planning.forked import can_fork, fork_map, side_by_side

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
RUNTIME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def idle_host(monkeypatch):
    """The host's load read as idle (the test machine is busy with the suite), unless a test says otherwise."""
    from slidedp.planning import forked

    monkeypatch.setattr(forked, "_load", lambda: 0.0)


def _square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _clean(body: str) -> object:
    """What `body` prints as JSON, run in a fresh interpreter: a test process may hold threads earlier tests left,
    where fork_map rightly does not fork. The host's load is read as idle there (the suite keeps it busy)."""
    script = (f"import json, os, sys\nsys.path.insert(0, {RUNTIME + '/runtime'!r})\n"
              "from slidedp.planning import forked\nfrom slidedp.planning.forked import can_fork, fork_map, "
              "side_by_side\nforked._load = lambda: 0.0\n" + body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_answers_are_the_maps_and_each_item_but_the_first_ran_in_a_copy():
    out = _clean("""
def fn(x):
    return x * x, os.getpid()
with side_by_side():
    assert can_fork()
    print(json.dumps({"me": os.getpid(), "out": fork_map(fn, [1, 2, 3, 4])}))
""")
    me, answers = out["me"], out["out"]
    assert [v for v, _ in answers] == [1, 4, 9, 16]
    pids = [p for _, p in answers]
    assert pids[0] == me and me not in pids[1:] and len(set(pids[1:])) == 3


def test_no_copy_on_a_busy_host(monkeypatch):
    from slidedp.planning import forked

    monkeypatch.setattr(forked, "_load", lambda: float(os.cpu_count() or 1))
    with side_by_side():
        assert not can_fork()
        assert {p for _, p in fork_map(_square_and_pid, [1, 2, 3])} == {os.getpid()}


def test_no_copy_outside_side_by_side_or_beside_another_thread():
    me = os.getpid()
    assert not can_fork()
    assert {p for _, p in fork_map(_square_and_pid, [1, 2, 3])} == {me}
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        with side_by_side():
            assert not can_fork()
            assert {p for _, p in fork_map(_square_and_pid, [1, 2, 3])} == {me}
    finally:
        stop.set()
        other.join()


def test_an_exception_in_a_copy_is_raised_here_as_the_map_would_raise_it():
    out = _clean("""
from slidedp.planning.refusals import Infeasible
me = os.getpid()
def fn(x):
    if x == 2:
        raise Infeasible([{"loc": "model", "msg": f"{x} does not fit in {'a copy' if os.getpid() != me else 'here'}"}])
    return x
with side_by_side():
    try:
        fork_map(fn, [1, 2, 3])
    except Infeasible as exc:
        print(json.dumps(exc.errors))
""")
    assert out == [{"loc": "model", "msg": "2 does not fit in a copy"}]


def test_a_copy_that_dies_without_an_answer_has_its_item_computed_here():
    out = _clean("""
me = os.getpid()
def fn(x):
    if os.getpid() != me:
        os._exit(3)  # the copy dies
    return x * 10, os.getpid()
with side_by_side():
    assert can_fork()
    print(json.dumps({"me": me, "out": fork_map(fn, [1, 2, 3])}))
""")
    me = out["me"]
    assert out["out"] == [[10, me], [20, me], [30, me]]


def test_the_copies_die_with_the_process_that_forked_them(tmp_path):
    """A planning process killed mid-search (the web service's deadline) leaves no copy running."""
    pid_file = tmp_path / "copy.pid"
    script = f"""
import os, sys, time
sys.path.insert(0, {RUNTIME + '/runtime'!r})
from slidedp.planning import forked
from slidedp.planning.forked import fork_map, side_by_side
forked._load = lambda: 0.0  # the test machine is busy with the suite
def fn(x):
    if x:
        with open({str(pid_file)!r} + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.rename({str(pid_file)!r} + ".tmp", {str(pid_file)!r})
    time.sleep(120)
with side_by_side():
    fork_map(fn, [0, 1])
"""
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists():
            assert time.monotonic() < deadline and parent.poll() is None, "the copy did not start"
            time.sleep(0.05)
        copy = int(pid_file.read_text())
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(copy):
            assert time.monotonic() < deadline, "the copy outlived its parent"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            state = next(line for line in fh if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return False
    return "Z" not in state.split()[1]  # a zombie has ended
