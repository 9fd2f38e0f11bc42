"""Fault injection for the processes a test starts with this folder on PYTHONPATH (Python imports it at start).

SLIDEDP_TEST_EXPORT_ENOSPC=FILE: while FILE exists, writing a safetensors file fails with ENOSPC ("No space left on
device"), as an export onto a full disk does. safetensors.torch is wrapped when something first imports it, so
processes that never export (the worker, the API) do not import torch for this.
"""

from __future__ import annotations

import errno
import importlib.abc
import importlib.util
import os
import sys

FLAG = os.environ.get("SLIDEDP_TEST_EXPORT_ENOSPC")


class _WrapSaveFile(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "safetensors.torch":
            return None
        sys.meta_path.remove(self)  # find the real module the normal way
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            real = module.save_file

            def save_file(*args, **kwargs):
                if os.path.exists(FLAG):
                    raise OSError(errno.ENOSPC, "No space left on device (injected)")
                return real(*args, **kwargs)

            module.save_file = save_file

        spec.loader.exec_module = exec_module
        return spec


if FLAG:
    sys.meta_path.insert(0, _WrapSaveFile())
