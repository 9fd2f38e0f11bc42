"""Independent searches of one plan run side by side in forked copies of the planning process.

The card sweep (planning/card_sweep.py) and the two delivery casts of `slidedp plan` and the web preview are
searches that share nothing but what was computed before them: a fork of the process that made those predictions
starts each with them, runs the same code on the same inputs, and sends its answer back pickled (floats exactly),
so the plan is the one the searches give one after the other.

Forking is safe only in a process with no other thread (a lock another thread holds at the fork stays held in the
copy): `fork_map` forks inside `side_by_side()` (which `slidedp plan` and the web service's planning process enter:
each is a process that plans and nothing else), on Linux, in a process whose only Python thread is the caller's,
and otherwise maps in the process. A forked copy dies with its parent (PR_SET_PDEATHSIG), so a planning process
that is killed (the web service's deadline) leaves none running. A copy that dies without an answer has its item computed in the process; an
exception it raised is raised here, as the same call in the process would have raised it.

A run (`slidedp train`) does not fork: its launcher has threads; it plans the host cast in a process of its own
(planning/cast_process.py). Imports no torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
_PR_SET_PDEATHSIG = 1
_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("slidedp_plan_side_by_side", default=False)


@contextlib.contextmanager
def side_by_side() -> Iterator[None]:
    """Within it, fork_map may fork (where can_fork says so)."""
    token = _ALLOWED.set(True)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def can_fork() -> bool:
    """Whether fork_map forks here: inside side_by_side(), on Linux, more than one core, no thread but the
    caller's, and a host not busy already (its load over the last minute under its cores: where every core is
    taken, copies only compete, and many plan previews at once do not multiply the processes they run)."""
    cores = os.cpu_count() or 1
    return (_ALLOWED.get() and sys.platform == "linux" and cores > 1 and _load() < cores
            and threading.active_count() == 1 and threading.current_thread() is threading.main_thread())


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def fork_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """[fn(x) for x in items], the first in this process and each other in a forked copy where can_fork()."""
    if len(items) < 2 or not can_fork():
        return [fn(x) for x in items]
    children: list[tuple[int, int] | None] = []
    for item in items[1:]:
        children.append(_fork(fn, item))
    out: list[R] = [fn(items[0])]
    for item, child in zip(items[1:], children):
        answer = _collect(child) if child is not None else None
        if answer is None:  # no copy, or it died without an answer: computed here
            out.append(fn(item))
        elif answer[0] == "raised":
            raise answer[1]
        else:
            out.append(answer[1])
    return out


def _fork(fn: Callable[[T], R], item: T) -> tuple[int, int] | None:
    """(pid, read end) of a copy computing fn(item), or None where no copy could be made."""
    parent = os.getpid()
    try:
        read, write = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return None
    if pid:
        os.close(write)
        return pid, read
    # the copy: never returns into the caller's code
    code = 1
    try:
        os.close(read)
        _die_with(parent)
        try:
            answer: tuple[str, Any] = ("value", fn(item))
        except Exception as exc:  # noqa: BLE001 - raised again by the parent
            answer = ("raised", exc)
        try:
            data = pickle.dumps(answer)
        except Exception:  # noqa: BLE001 - an answer that does not pickle: the parent computes the item itself
            data = b""
        with os.fdopen(write, "wb") as fh:
            fh.write(data)
        code = 0
    finally:
        os._exit(code)


def _die_with(parent: int) -> None:
    """This copy is killed when the process that forked it ends (Linux's parent-death signal)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent ended before the signal was asked for
        os._exit(1)


def _collect(child: tuple[int, int]) -> tuple[str, Any] | None:
    """The copy's answer, once it has ended; None where it gave none."""
    pid, read = child
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    if not data:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # noqa: BLE001 - a truncated answer (the copy was killed while writing)
        return None
