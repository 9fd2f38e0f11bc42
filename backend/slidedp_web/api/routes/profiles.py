from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from slidedp.planning import profiles

router = APIRouter(prefix="/profiles", tags=["plan"])


@router.get("")
def list_profiles() -> dict[str, Any]:
    """The shipped hardware profiles POST /api/plan's `profile` plans for: each one's name, description and
    headline figures (GPUs, GPU memory, dense BF16 TFLOPS, PCIe link, peer-to-peer, host RAM, CPUs, DRAM GB/s)."""
    return {"items": [profiles.summary(profiles.load(name)) for name in profiles.shipped()]}
