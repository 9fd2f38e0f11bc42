"""Stream a directory as a .tar.gz without writing the archive to disk first (a model can be tens of GB)."""

from __future__ import annotations

import gzip
import os
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


def stream_tar_gz(files: list[tuple[Path, int]], arcname: str) -> Iterator[bytes]:
    """Yield the gzip'd tar of these files (entries `arcname/<file name>`) chunk by chunk.

    Each file is opened without following links and sent with the size it was listed with: a file that changes
    under the download ends it with an error rather than send something else. Weights compress poorly, so gzip
    runs at level 1: the archive is for transport, not for size.
    """
    q: queue.Queue = queue.Queue(maxsize=8)
    done = object()

    def produce() -> None:
        writer = _QueueWriter(q)
        try:
            with gzip.GzipFile(fileobj=writer, mode="wb", compresslevel=1, mtime=0) as gz:
                with tarfile.open(fileobj=gz, mode="w|") as tar:
                    folder = tarfile.TarInfo(arcname)
                    folder.type, folder.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(folder)
                    for path, size in files:
                        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                        with os.fdopen(fd, "rb") as fh:
                            if os.fstat(fh.fileno()).st_size != size:
                                raise OSError(f"{path} changed while it was being sent")
                            info = tarfile.TarInfo(f"{arcname}/{path.name}")
                            info.size, info.mode = size, 0o644
                            info.mtime = int(os.fstat(fh.fileno()).st_mtime)
                            tar.addfile(info, fh)
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
