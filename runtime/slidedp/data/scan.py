"""The whole dataset file checked record by record before a job starts, streamed, and remembered by content.

    found = scan_dataset(path, "tokens", "text", seq_len=2048, vocab=151936)
    found.errors(path)   # [{"loc": "data.path", "msg": "<path> line 3001: ..."}], at most MAX_PROBLEMS
    found.records        # records read (all of them when no problem stopped the scan)

Every record is read (a bad last line of a large file is found before the job is queued, not after), through
the same readers the job's data pipeline uses (sources.iter_records), one record in memory at a time. Messages
name the file and the line, record or row, and say what is wrong; they never quote the file's text.

The findings are kept per process by the file's content: a SHA-256 of its bytes (a pass that reads at disk
speed), looked up before the slower parse, so the same file submitted again, copied or touched, is not parsed
again. Before hashing, (path, size, mtime, ctime, inode) says the file is unchanged since it was last hashed,
so a resubmitted file is not read at all. A file that changes during the parse is not remembered.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from slidedp.data.sources import DataError, check_record, iter_records

MAX_PROBLEMS = 3  # bad records reported per dataset; the scan stops there
CACHE_ENTRIES = 64
HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class Scan:
    """What one pass over a dataset file found."""

    records: int  # records read; all of the file's unless a problem stopped the scan
    # (loc, what follows the file's name in the message): kept without the name, which the same content read
    # under another name must not carry. An unreadable part (bad JSON, not UTF-8) is the last problem.
    problems: tuple[tuple[str, str], ...]
    any_text: bool  # format text: some record holds text that is not blank
    digest: str  # SHA-256 of the file's bytes

    def errors(self, path: str) -> list[dict[str, str]]:
        """The problems as [{"loc", "msg"}], each message naming `path`."""
        return [{"loc": loc, "msg": f"{path}{rest}"} for loc, rest in self.problems]


# Per process: the API checks the same file for POST /api/plan and then POST /api/jobs, and again on a resubmit.
_lock = threading.Lock()
_digests: OrderedDict[tuple, str] = OrderedDict()  # file identity -> digest
_scans: OrderedDict[tuple, Scan] = OrderedDict()  # (digest, what is checked) -> findings
counts = {"hashed": 0, "parsed": 0}  # files read to hash and to parse, for tests and logs


def scan_dataset(
    path: str, fmt: str, text_field: str = "text", seq_len: int | None = None, vocab: int | None = None
) -> Scan:
    """Every record of `path` checked for format `fmt`; for tokens rows also their length (seq_len; None: not
    judged) and ids (below vocab; None: not judged). OSError when the file cannot be read."""
    if fmt != "tokens":
        seq_len = vocab = None  # only tokens rows are judged by them: one entry serves every value
    before = _identity(path)
    with _lock:
        digest = _digests.get(before)
        if digest is not None:
            _digests.move_to_end(before)
    if digest is None:
        digest = _sha256(path)
    key = (digest, fmt, text_field, seq_len, vocab)
    with _lock:
        if _identity(path) == before:
            _remember(_digests, before, digest)
        found = _scans.get(key)
        if found is not None:
            _scans.move_to_end(key)
            return found
    found = _parse(path, fmt, text_field, seq_len, vocab, digest)
    with _lock:
        if _identity(path) == before:  # not changed while parsed: the findings are the digest's
            _remember(_scans, key, found)
    return found


def forget() -> None:
    """Drop every remembered finding (tests)."""
    with _lock:
        _digests.clear()
        _scans.clear()
        counts.update(hashed=0, parsed=0)


def _identity(path: str) -> tuple:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _remember(cache: OrderedDict, key: tuple, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CACHE_ENTRIES:
        cache.popitem(last=False)


def _sha256(path: str) -> str:
    counts["hashed"] += 1
    digest = hashlib.sha256()
    chunk = bytearray(HASH_CHUNK)
    view = memoryview(chunk)
    with open(path, "rb") as fh:
        while n := fh.readinto(chunk):
            digest.update(view[:n])
    return digest.hexdigest()


def _parse(path: str, fmt: str, text_field: str, seq_len: int | None, vocab: int | None, digest: str) -> Scan:
    counts["parsed"] += 1
    problems: list[tuple[str, str]] = []
    records, any_text = 0, False
    try:
        for where, record in iter_records(path, text_field):
            records += 1
            problem = check_record(fmt, record, text_field)
            if problem is None and fmt == "tokens":
                problem = token_row_problem(record, seq_len, vocab)
            if problem is None and fmt == "text":
                any_text = any_text or bool(record[text_field].strip())
            if problem:
                problems.append(("data.path", f" {where}: {problem}"))
                if len(problems) >= MAX_PROBLEMS:
                    break
    except DataError as exc:  # the file cannot be read past here: bad JSON, not UTF-8
        for e in exc.errors:
            msg = str(e["msg"])
            problems.append((e["loc"], msg[len(path):] if msg.startswith(path) else f": {msg}"))
    return Scan(records, tuple(problems), any_text, digest)


def token_row_problem(record: dict, seq_len: int | None, vocab: int | None) -> str | None:
    """Why a tokens row is unusable, or None; seq_len None: its length is not judged (seq_len did not parse)."""
    ids = record["input_ids"]
    if seq_len is not None and len(ids) != seq_len:
        return (
            f"input_ids has {len(ids)} tokens but seq_len is {seq_len}; format tokens needs every row to be "
            "exactly seq_len tokens (re-tokenise the data, or set seq_len)"
        )
    if vocab is not None and max(ids) >= vocab:
        return (
            f"token id {max(ids)} is outside the model's vocabulary of {vocab} tokens; "
            "the data was tokenised for another model"
        )
    return None
