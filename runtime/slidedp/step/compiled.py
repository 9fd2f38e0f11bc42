"""Regional compilation of the decoder layer (policy.compiled_layers).

The engine runs every decoder layer through one template module called with parameters that are views of a
window buffer (ModelAdapter.layer_forward). `CompiledLayer` wraps that call in `torch.compile` with the parameters
as inputs of the compiled function, so one graph per input shape and grad mode serves every layer and every window
slot: a second layer, with other parameter tensors of the same shapes, hits the same cache entry instead of
recompiling. Autograd runs through the compiled graph's own backward, so the engine's three paths stay as they
are: a checkpointed layer's forward without a graph (the inference graph), its recompute with leaves and an
explicit backward, and kept or offloaded layers whose saved tensors pass through the saved-tensor hooks of
slidedp.step.activations (the hooks see the compiled graph's saved tensors: weights by reference, activations
copied out and back).

Backend: inductor on CUDA. On the CPU, CPU_BACKEND: "aot_eager", which captures the same graphs (dynamo, then
AOTAutograd's forward and backward) and runs them without generating kernels: the same numbers as eager and no
speed-up, so that CPU ranks (and the CPU tests) run the capture the GPUs compile.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from slidedp.cache_paths import compiled_dir

CUDA_BACKEND = "inductor"
CPU_BACKEND = "aot_eager"
# Graphs one compiled layer may hold: grad and no-grad (checkpointed forward, evaluation) times the micro-batch
# shapes of a job (a last ragged batch, evaluation, a packed batch's mask): a handful. Past it dynamo would fall
# back to eager for good, silently slower, so the limit is well above what a job needs.
RECOMPILE_LIMIT = 32


def compile_backend(device: torch.device) -> str:
    """The torch.compile backend of the layers of a rank on `device`."""
    return CUDA_BACKEND if torch.device(device).type == "cuda" else CPU_BACKEND


def raise_limits() -> None:
    """dynamo's recompile limits raised to RECOMPILE_LIMIT where lower (for SlideDP's and the FSDP2 peer's layers)."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the newer name and the older one
        if hasattr(cfg, name) and getattr(cfg, name) < RECOMPILE_LIMIT:
            setattr(cfg, name, RECOMPILE_LIMIT)
    if hasattr(cfg, "accumulated_recompile_limit") and cfg.accumulated_recompile_limit < 4 * RECOMPILE_LIMIT:
        cfg.accumulated_recompile_limit = 4 * RECOMPILE_LIMIT


class CompiledLayer:
    """adapter.layer_forward through torch.compile: call it as layer_forward(params, h, ctx)."""

    def __init__(self, adapter: Any, backend: str):
        raise_limits()
        self.adapter, self.backend = adapter, backend
        self._fn = torch.compile(self._eager, backend=backend, dynamic=False)

    def _eager(self, params: dict[str, torch.Tensor], h: torch.Tensor, attention_mask: Any,
               position_embeddings: tuple, position_ids: torch.Tensor) -> torch.Tensor:
        return self.adapter.layer_forward(params, h, {"attention_mask": attention_mask,
                                                      "position_embeddings": position_embeddings,
                                                      "position_ids": position_ids})

    def __call__(self, params: dict[str, torch.Tensor], h: torch.Tensor, ctx: dict[str, Any]) -> torch.Tensor:
        return self._fn(params, h, ctx.get("attention_mask"), ctx["position_embeddings"], ctx["position_ids"])


def layer_function(adapter: Any, compiled: bool, device: torch.device):
    """What the engine calls for a decoder layer: with `compiled`, the adapter's compiled layer for the device's
    backend (one per adapter, made on first use), else its eager layer_forward. The compiler's cache goes to
    slidedp.cache_paths.compiled_dir() unless TORCHINDUCTOR_CACHE_DIR names one."""
    if not compiled:
        return adapter.layer_forward
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", compiled_dir())
    backend = compile_backend(device)
    cached = getattr(adapter, "_compiled_layer", None)
    if cached is None or cached.backend != backend:
        cached = CompiledLayer(adapter, backend)
        adapter._compiled_layer = cached
    return cached


def warm(adapter: Any, device: torch.device, dtype: torch.dtype, micro_batch: int, seq: int) -> None:
    """Compile the adapter's layer for the job's micro-batch shape before the first step needs it: the graph that
    records autograd (with its backward, run once) and the no-grad one of a checkpointed layer, on inputs made as
    the engine makes them (parameters as views of one flat buffer in the compute dtype, the hidden states, int64
    position ids and the rotary embedding of them, no attention mask), so the step's calls find them compiled.
    The kept layer's forward runs under saved-tensor hooks in the engine (slidedp.step.activations) and the
    recompute's without: both are warmed. A rank calls it while the launcher still fills the host state, which
    hides the compile behind that fill. Where the job's data brings an attention mask (packed documents), the
    first step compiles that graph itself."""
    fn = layer_function(adapter, True, device)
    spec = adapter.units[1]
    buf = torch.zeros(spec.numel, device=device, dtype=dtype)
    gflat = torch.zeros_like(buf)
    h = torch.zeros(micro_batch, seq, adapter.hidden, device=device, dtype=dtype)
    pos = torch.arange(seq, device=device).expand(micro_batch, seq).contiguous()
    ctx = {"position_ids": pos, "attention_mask": None, "position_embeddings": adapter.rotary(device)(h, pos)}

    for hooked in (True, False):
        with torch.enable_grad(), (torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t) if hooked
                                   else contextlib.nullcontext()):
            out = fn(adapter.param_leaves(spec, buf, gflat), h.detach().requires_grad_(True), ctx)
        torch.autograd.backward(out, torch.zeros_like(out))
    with torch.no_grad():
        fn(adapter.param_views(spec, buf), h, ctx)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        del buf, gflat, h, out
        torch.cuda.empty_cache()  # the engine allocates its window next: nothing of this stays cached
