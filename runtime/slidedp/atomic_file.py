"""Files that a reader never sees half written: the content goes to a temporary file of a unique name in the same
directory, which then replaces the file (os.replace is atomic on one file system). Two writers at once each
replace the file whole; the later one wins."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any


def write_text(path: str, text: str, *, durable: bool = False) -> None:
    """path <- text, atomically; durable: flushed to the disk before the replace (a crash after the replace
    leaves the new content, not an empty file)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: str, value: Any, *, durable: bool = False) -> None:
    """path <- value as JSON (indent 1), atomically (write_text)."""
    write_text(path, json.dumps(value, indent=1), durable=durable)
