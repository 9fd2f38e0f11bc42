"""What planning needs of a model, read without torch or transformers: its architecture, depth, widths and the
parameters of each unit the engine streams (embedding, each decoder layer, final norm + lm_head).

A preset gives its own figures; a local Hugging Face directory its config.json. A key the file leaves out takes
the default of transformers' config class for that architecture (SHAPE_DEFAULTS), and each unit is counted as
transformers' decoder builds it (slidedp.step.model_adapter: Qwen3, Qwen2/2.5, Llama, Mistral), so the figures are
the ones the model built on the meta device gives (tests/runtime/test_model_shape.py compares them for every preset
and for written directories). The launcher plans and lays out the host state from them; the meta model itself is
built later, beside the ranks' start, for filling the host state, and checked against them there.
"""

from __future__ import annotations

import json
import os

from slidedp.config import is_model_path
from slidedp.model_sizing import SHAPE_DEFAULTS, ModelShape, shape_of, sizing_config
from slidedp.presets import PRESETS, SUPPORTED_ARCHITECTURES

__all__ = ["SHAPE_DEFAULTS", "ModelShape", "ModelOnDemand", "read_shape", "shape_of", "sizing_config"]

assert set(SHAPE_DEFAULTS) == set(SUPPORTED_ARCHITECTURES)


def read_shape(model: str) -> ModelShape:
    """The shape of a preset or a local model directory (never a download), with the errors
    model_adapter.load_hf_config gives for the same inputs: an unknown preset (KeyError), a missing directory or
    config.json (FileNotFoundError), an unsupported architecture or a key that does not size a model
    (ValueError)."""
    if is_model_path(model):
        if not os.path.isdir(model):
            raise FileNotFoundError(f"model directory {model!r} does not exist")
        path = os.path.join(model, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model directory {model!r} has no config.json")
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
        if not isinstance(config, dict):
            raise ValueError(f"{path} must hold a JSON object")
        return shape_of(config, where=path)
    if model not in PRESETS:
        raise KeyError(f"unknown model preset {model!r}; presets: {', '.join(PRESETS)}")
    return shape_of(PRESETS[model], where=f"preset {model}")


class ModelOnDemand:
    """The launcher's ModelAdapter (slidedp.launch) (transformers' model on the meta device: unit layout, parameter names, initial
    weights), built the first time the host state is filled or exported from it, which for a run from step 0 is
    once its ranks are spawned, so that importing transformers here overlaps their start instead of delaying the
    plan. Its units must hold the parameters the plan and the host layout were made for (slidedp.model_shape);
    a model that differs is refused before any weight is written."""

    def __init__(self, model: str, unit_numels: list[int]):
        self.model, self.unit_numels = model, list(unit_numels)
        self._adapter = None

    def get(self):
        if self._adapter is None:
            from slidedp.step.model_adapter import ModelAdapter, load_hf_config

            adapter = ModelAdapter(load_hf_config(self.model))
            built = [u.numel for u in adapter.units]
            if built != self.unit_numels:
                raise RuntimeError(f"model {self.model!r}: transformers builds {len(built)} units of "
                                   f"{sum(built):,} parameters ({built[:3]}...), its config was read as "
                                   f"{len(self.unit_numels)} units of {sum(self.unit_numels):,} "
                                   f"({self.unit_numels[:3]}...): slidedp.model_shape does not read this config "
                                   "as transformers does")
            self._adapter = adapter
        return self._adapter
