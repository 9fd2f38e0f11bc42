"""SlideDP: full-parameter fine-tuning from one authoritative host state, streamed through a GPU window.

    import slidedp
    result = slidedp.train({"model": "demo-qwen3", "data": {"path": "demo.jsonl", "format": "text"}, ...})

Importing the package imports no torch: config, presets, validation and the planner are torch-free so
the web API can use them; ``train`` loads the engine on first use.
"""

from slidedp.config import ConfigError, JobConfig
from slidedp.version import __version__

__all__ = ["ConfigError", "JobConfig", "train", "TrainResult", "__version__"]


def __getattr__(name: str):
    if name in ("train", "TrainResult"):
        from slidedp import launch

        return getattr(launch, name)
    raise AttributeError(f"module 'slidedp' has no attribute {name!r}")
