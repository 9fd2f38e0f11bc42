"""Where this host's measurements and compiled kernels are kept between runs: SLIDEDP_CACHE_DIR (a workbench sets
its own, under its data folder), else the user's cache. Imports no torch."""

from __future__ import annotations

import os


def calibration_dir() -> str:
    """The calibration cache (slidedp.planning.calibration: one record per host and job shape)."""
    return os.environ.get("SLIDEDP_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "slidedp", "calibration"
    )


def compiled_dir() -> str:
    """The compiled layers' kernels (slidedp.step.compiled): beside the calibrations, so calibration's compile
    warms the job's, and a reboot (the compiler's default is a folder under /tmp) does not lose them."""
    return os.path.join(calibration_dir(), "compiled")
