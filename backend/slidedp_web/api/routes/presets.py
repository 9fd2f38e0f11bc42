from __future__ import annotations

from fastapi import APIRouter

from slidedp_web.models import PresetList
from slidedp_web.presets import form_presets

router = APIRouter(prefix="/presets", tags=["presets"])


@router.get("", response_model=PresetList)
def list_presets() -> PresetList:
    """Complete job configs the job form starts from."""
    return PresetList(items=form_presets())
