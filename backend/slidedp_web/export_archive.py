"""Stream a directory as a .tar.gz without writing the archive to disk first (a model can be tens of GB)."""

from __future__ import annotations

import gzip
import queue
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

CHUNK = 1 << 20


class _QueueWriter:
    def __init__(self, q: queue.Queue):
        self.q = q
        self.buf = bytearray()

    def write(self, data: bytes) -> int:
        self.buf += data
        if len(self.buf) >= CHUNK:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self.buf:
            self.q.put(bytes(self.buf))
            self.buf.clear()


def stream_tar_gz(directory: Path, arcname: str) -> Iterator[bytes]:
    """Yield the gzip'd tar of `directory` (entries under `arcname/`) chunk by chunk.

    Weights compress poorly, so gzip runs at level 1: the archive is for transport, not for size.
    """
    q: queue.Queue = queue.Queue(maxsize=8)
    done = object()

    def produce() -> None:
        writer = _QueueWriter(q)
        try:
            with gzip.GzipFile(fileobj=writer, mode="wb", compresslevel=1, mtime=0) as gz:
                with tarfile.open(fileobj=gz, mode="w|") as tar:
                    tar.add(str(directory), arcname=arcname)
            writer.flush()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            q.put(exc)
        finally:
            q.put(done)

    threading.Thread(target=produce, name="slidedp-export", daemon=True).start()
    while True:
        item = q.get()
        if item is done:
            return
        if isinstance(item, BaseException):
            raise item
        yield item
