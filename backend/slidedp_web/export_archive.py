"""Stream a directory as a .tar.gz without writing the archive to disk first (a model can be tens of GB), and
record what the export wrote so that the download can tell a file replaced since, even one of the same size.
"""

from __future__ import annotations

import gzip
import os
import queue
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

CHUNK = 1 << 20
# What identifies a file as written, besides its size: the inode (a file renamed over it is another one), the
# modification time (rewritten in place) and the change time (which no user can set back, as `touch -d` does the
# modification time). Hashing instead would read tens of GB at every export and every download.
IDENTITY = ("ino", "mtime_ns", "ctime_ns")


def stamped(final: Path, files: list[dict]) -> list[dict]:
    """The export's file list [{"name", "bytes"}] with each file's identity as it is now, just after the export
    wrote it (a file that cannot be read is listed as it was: the download refuses it as missing)."""
    out = []
    for item in files:
        try:
            st = os.lstat(final / str(item.get("name", "")))
        except (OSError, ValueError):
            out.append(dict(item))
            continue
        out.append({**item, **{key: getattr(st, f"st_{key}") for key in IDENTITY}})
    return out


def changed(st: os.stat_result, item: dict) -> bool:
    """Whether a file's stat is not the identity the export recorded (a listing without one: not judged)."""
    return any(item.get(key) is not None and getattr(st, f"st_{key}") != int(item[key]) for key in IDENTITY)


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
