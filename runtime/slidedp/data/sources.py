"""Dataset files: where they are, how each file type is read, and what a record of each format must hold.

Imports no torch (the validation module and the web API use it): reading and checking records is plain
Python, with pyarrow imported only when a .parquet file is read.

File types (by extension):
    .jsonl     one JSON object per line (blank lines are skipped); records are named "line N"
    .json      one JSON array of objects; records are named "record N"
    .parquet   a table, one record per row (needs pyarrow); records are named "row N"
    .txt       plain text, format `text` only: one document per block of lines separated by blank lines

A `data.path` of the form ``demo:NAME`` names a dataset shipped with the package (see ``demo_paths()``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from slidedp.config import ConfigError

EXTENSIONS = (".jsonl", ".json", ".parquet", ".txt")
DEMO_PREFIX = "demo:"
DEMO_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "demo")

# The fields each format reads, for messages; the record checks below are the rule.
FORMAT_FIELDS = {
    "tokens": "input_ids (list of token ids) and optionally labels (same length, -100 = ignored)",
    "text": "the text field (data.text_field)",
    "prompt_completion": "prompt and completion (strings)",
    "chat": 'messages (a list of {"role", "content"})',
    "alpaca": "instruction and output (strings), optionally input",
}


class DataError(ConfigError):
    """The dataset cannot be used. ``errors`` lists {"loc": "data.path", "msg": "..."} as ConfigError does."""

    def __init__(self, msg: str, loc: str = "data.path"):
        super().__init__([{"loc": loc, "msg": msg}])


def demo_paths() -> dict[str, str]:
    """The datasets shipped in slidedp/assets/demo: {name: absolute path}; use them as data.path "demo:NAME"."""
    if not os.path.isdir(DEMO_DIR):
        return {}
    return {n: os.path.join(DEMO_DIR, n) for n in sorted(os.listdir(DEMO_DIR)) if n.endswith(EXTENSIONS)}


def resolve_data_path(path: str) -> str:
    """The file a data.path names: ``demo:NAME`` becomes the packaged file; other values are returned as given."""
    if not path.startswith(DEMO_PREFIX):
        return path
    name = path[len(DEMO_PREFIX) :]
    shipped = demo_paths()
    if name not in shipped:
        raise DataError(f"no demo dataset named {name!r}; shipped: {', '.join(shipped) or 'none'}")
    return shipped[name]


def file_kind(path: str) -> str:
    """The extension that selects the reader; a DataError for any other."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in EXTENSIONS:
        raise DataError(
            f"{path}: unknown extension {ext or '(none)'!r}; use a .jsonl, .json, .parquet or .txt file"
        )
    return ext


def import_pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DataError(
            "reading .parquet files needs pyarrow, which is not installed: pip install pyarrow "
            "(or pip install 'slidedp[data]'), or convert the file to .jsonl"
        ) from exc
    return pq


def iter_records(path: str, text_field: str = "text", limit: int | None = None) -> Iterator[tuple[str, Any]]:
    """Yield (where, record) in file order, at most ``limit``; where is "line N", "record N" or "row N".

    Streams every file type: memory holds one record (a .jsonl line, a .json array element, a parquet batch),
    never the whole file. Raises DataError for what makes the file unreadable (bad JSON on a line, a .json
    that is not a list, bytes that are not UTF-8), naming where; messages never quote the file's text.
    Records are returned as parsed; check_record says whether one fits a format.
    """
    kind = file_kind(path)
    if kind == ".parquet":
        pq = import_pyarrow_parquet()
        n = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for record in batch.to_pylist():
                if limit is not None and n >= limit:
                    return
                n += 1
                yield f"row {n}", record
        return
    reader = {".jsonl": _jsonl_records, ".json": _json_array_records, ".txt": _text_blocks}[kind]
    with open(path, encoding="utf-8") as fh:
        try:
            for count, item in enumerate(reader(fh, path, text_field)):
                if limit is not None and count >= limit:
                    return
                yield item
        except UnicodeDecodeError:
            raise DataError(
                f"{path} line {_first_non_utf8_line(path)}: not UTF-8 text; save the file as UTF-8"
            ) from None


def _first_non_utf8_line(path: str) -> int:
    """The first line that does not decode (the text layer says only that a chunk of the file did not)."""
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return n
    return 0


def _jsonl_records(fh: Any, path: str, _field: str) -> Iterator[tuple[str, Any]]:
    for n, line in enumerate(fh, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{path} line {n}: bad JSON ({exc.msg} at column {exc.colno}); "
                "each line of a .jsonl file must be one JSON object"
            ) from None
        yield f"line {n}", record


def _text_blocks(fh: Any, _path: str, text_field: str) -> Iterator[tuple[str, Any]]:
    """.txt: blank-line-separated blocks are documents."""
    block: list[str] = []
    start = 0
    for n, line in enumerate(fh, 1):
        if line.strip():
            if not block:
                start = n
            block.append(line)
            continue
        if block:
            yield f"line {start}", {text_field: "".join(block).strip("\n")}
            block = []
    if block:
        yield f"line {start}", {text_field: "".join(block).strip("\n")}


JSON_CHUNK = 1 << 20  # characters read at a time from a .json file


def _json_array_records(fh: Any, path: str, _field: str) -> Iterator[tuple[str, Any]]:
    """The elements of a .json file's top-level array, decoded one at a time from a window onto the file.

    The window holds the unread rest of the current chunk; an element cut by the window's end is decoded again
    once the window has grown (by at least its own size, so a large element costs linear time)."""
    decoder = json.JSONDecoder()
    buf, pos, eof = "", 0, False
    line_base, col_base = 1, 0  # the line and column (0-based) of buf[0] in the file

    def more(at_least: int = JSON_CHUNK) -> bool:
        nonlocal buf, pos, eof, line_base, col_base
        if eof:
            return False
        if pos:  # drop what was read, keeping track of where the window starts
            gone = buf[:pos]
            newlines = gone.count("\n")
            line_base += newlines
            col_base = len(gone) - gone.rfind("\n") - 1 if newlines else col_base + len(gone)
            buf, pos = buf[pos:], 0
        chunk = fh.read(max(at_least, JSON_CHUNK))
        eof = not chunk
        buf += chunk
        return bool(chunk)

    def bad(at: int, msg: str) -> DataError:
        before = buf[:at]
        newlines = before.count("\n")
        col = len(before) - before.rfind("\n") if newlines else col_base + len(before) + 1
        return DataError(
            f"{path}: bad JSON at line {line_base + newlines} column {col} ({msg}); "
            "a .json dataset must be one JSON array of objects"
        )

    def skip_space() -> str:
        """The next character that is not whitespace ('' at the end of the file), left unread."""
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in " \t\n\r":
                pos += 1
            if pos < len(buf):
                return buf[pos]
            if not more():
                return ""

    first = skip_space()
    if first != "[":
        kinds = {"{": "object", '"': "string", "t": "boolean", "f": "boolean", "n": "null"}
        kind = kinds.get(first, "number" if first and first in "-0123456789" else None)
        if kind is None:
            raise bad(pos, "Expecting value")
        raise DataError(
            f"{path}: holds a JSON {kind}, not a list of records; "
            "write a JSON array of objects (or one object per line in a .jsonl file)"
        )
    pos += 1
    n = 0
    while True:
        ch = skip_space()
        if ch == "]" and n == 0:
            pos += 1
            break
        if ch == "":
            raise bad(pos, "Expecting value")
        while True:
            try:
                record, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                # Cut by the window's end, the element fails within a few characters of it (a literal such as
                # `tru` fails where it starts), or in a string that runs to it; an error earlier is the file's.
                cut = exc.pos >= len(buf) - 8 or exc.msg.startswith("Unterminated string")
                if eof or not cut:
                    raise bad(exc.pos, exc.msg) from None
                more(len(buf))  # decode it again from a wider window
                continue
            if end == len(buf) and not eof:
                more(len(buf))  # a number at the window's end may have more digits
                continue
            break
        pos = end
        n += 1
        yield f"record {n}", record
        ch = skip_space()
        if ch == ",":
            pos += 1
        elif ch == "]":
            pos += 1
            break
        else:
            raise bad(pos, "Expecting ',' delimiter")
    if skip_space():
        raise bad(pos, "Extra data")


def count_records(path: str) -> int:
    """Records in the file, cheaply: non-blank lines (.jsonl), rows (.parquet), list length (.json), blocks (.txt)."""
    kind = file_kind(path)
    if kind == ".jsonl":
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    if kind == ".parquet":
        return import_pyarrow_parquet().ParquetFile(path).metadata.num_rows
    return sum(1 for _ in iter_records(path))


def check_record(fmt: str, record: Any, text_field: str = "text") -> str | None:
    """What is wrong with one record for the format (a phrase naming the field), or None if it fits."""
    if not isinstance(record, dict):
        return f"is a {type(record).__name__}, not an object with {FORMAT_FIELDS[fmt]}"
    if fmt == "tokens":
        ids = record.get("input_ids")
        if ids is None:
            return "has no field 'input_ids' (format tokens needs input_ids, a list of token ids)"
        if not _int_list(ids) or not ids or min(ids) < 0:
            return "field 'input_ids' must be a non-empty list of token ids (integers >= 0)"
        labels = record.get("labels")
        if labels is not None:
            if not _int_list(labels):
                return "field 'labels' must be a list of integers (-100 = ignored)"
            if len(labels) != len(ids):
                return (
                    f"field 'labels' has {len(labels)} entries but input_ids has {len(ids)}; they must align"
                )
        return None
    if fmt == "text":
        problem = _string_field(record, text_field, "format text")
        if problem and problem.startswith("has no field"):
            problem += "; set data.text_field to the field holding the text"
        return problem
    if fmt == "prompt_completion":
        return _string_field(record, "prompt", "format prompt_completion") or _string_field(
            record, "completion", "format prompt_completion"
        )
    if fmt == "alpaca":
        msg = _string_field(record, "instruction", "format alpaca") or _string_field(
            record, "output", "format alpaca"
        )
        if msg is None and record.get("input") is not None and not isinstance(record["input"], str):
            return "field 'input' must be a string when present"
        return msg
    if fmt == "chat":
        messages = record.get("messages")
        if messages is None:
            return 'has no field \'messages\' (format chat needs a list of {"role", "content"})'
        if not isinstance(messages, list) or not messages:
            return 'field \'messages\' must be a non-empty list of {"role", "content"}'
        for i, m in enumerate(messages):
            if (
                not isinstance(m, dict)
                or not isinstance(m.get("role"), str)
                or not isinstance(m.get("content"), str)
            ):
                return f"messages[{i}] must be an object with string fields 'role' and 'content'"
        return None
    raise ValueError(f"unknown data format {fmt!r}")


def read_dataset(path: str, fmt: str, text_field: str = "text") -> list[tuple[str, Any]]:
    """Every (where, record) of a dataset file, checked for the format; DataError naming the first bad one."""
    path = resolve_data_path(path)
    if not os.path.isfile(path):
        raise DataError(
            f"dataset file {path} does not exist" if not os.path.exists(path) else f"{path} is not a file"
        )
    if file_kind(path) == ".txt" and fmt != "text":
        raise DataError(
            f"{path} is plain text, which only format text reads; use format text, or a .jsonl file for {fmt}",
            loc="data.format",
        )
    records = []
    for where, record in iter_records(path, text_field):
        problem = check_record(fmt, record, text_field)
        if problem:
            raise DataError(f"{path} {where}: {problem}")
        records.append((where, record))
    if not records:
        raise DataError(f"dataset file {path} is empty: it holds no records")
    return records


_INT = {int}


def _int_list(value: Any) -> bool:
    # The types as a set are built at C speed: a few-hundred-MB token file has tens of millions of ids. A bool
    # is its own type here, so it is refused.
    return isinstance(value, list) and set(map(type, value)) <= _INT


def _string_field(record: dict, name: str, who: str) -> str | None:
    if name not in record or record[name] is None:
        return f"has no field {name!r} ({who} needs it)"
    if not isinstance(record[name], str):
        return f"field {name!r} must be a string, got {type(record[name]).__name__}"
    return None
