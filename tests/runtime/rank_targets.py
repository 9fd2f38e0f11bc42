"""Rank functions for tests/runtime/test_ranks.py, started by slidedp.ranks.Launch in fresh interpreters."""

from __future__ import annotations

import os
import time


def identity(args: dict, link) -> dict:
    """What the rank sees of itself: its link, its environment, and a sum over the group's ranks."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="file://" + link.init_file, rank=link.rank, world_size=link.world)
    t = torch.tensor([float(link.rank + args["offset"])])
    dist.all_reduce(t)
    link.send("note", f"hello from {link.rank}")
    return {"rank": link.rank, "world": link.world, "sum": float(t.item()), "dir": link.dir,
            "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "GLOO_SOCKET_IFNAME", "NCCL_NVLS_ENABLE")}}


def fails_on_one(args: dict, link):
    if link.rank == 1:
        raise ValueError("rank one refuses")
    time.sleep(args.get("sleep", 0))
    return {"rank": link.rank}


def exits_silently(args: dict, link):
    os._exit(3)


def says_nothing(args: dict, link):
    return None


def sleeps(args: dict, link):
    time.sleep(args["seconds"])
    return {"rank": link.rank}


def imports(args: dict, link) -> dict:
    """Imports args["module"] (from args["path"]) and says where this interpreter keeps bytecode."""
    import importlib
    import sys

    sys.path.insert(0, args["path"])
    importlib.import_module(args["module"])
    return {"prefix": sys.pycache_prefix, "dont_write": sys.dont_write_bytecode}
