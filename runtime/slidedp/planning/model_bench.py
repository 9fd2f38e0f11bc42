"""The model's parts for calibration: one decoder layer, the embedding and the chunked loss head of the job's
architecture, built with transformers' own classes from the HF config (random weights; nothing is downloaded),
timed at the job's (micro-batch, seq) shape. On CUDA each figure is the median of `reps` timings; on the CPU
`reps` is the most a figure gets: it stops once its median settles (microbench.settled_median)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from slidedp.planning.microbench import median_time, settled, settled_median

# Seconds a layer runs under load before calibration times it on a GPU (ModelParts._sustain)
SUSTAIN_S = 2.0


@dataclass
class LayerCalls:
    """One decoder layer's calls as calibration times them: a kept layer's forward and its backward (in pairs), a
    checkpointed layer's forward without a graph and its recompute + backward; a forward with a graph (for the
    saved bytes); the layer's parameter count, the storages its parameters live in, its input's bytes."""

    keep_fwd: Callable[[], None]
    keep_bwd: Callable[[], None]
    ckpt_fwd: Callable[[], None]
    ckpt_bwd: Callable[[], None]
    fwd_graph: Callable[[], torch.Tensor]
    params: int
    param_ptrs: list[int]
    input_bytes: int


class ModelParts:
    """One decoder layer, the rotary embedding, the embedding and the loss head of the job's architecture,
    built with transformers' own classes from the HF config (random weights; nothing is downloaded)."""

    def __init__(self, mc: dict[str, Any], device: torch.device, dtype: torch.dtype):
        import transformers

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        kw = {
            k: v
            for k, v in mc.items()
            if k
            not in ("model_type", "architectures", "transformers_version", "torch_dtype", "dtype", "auto_map")
        }
        kw["num_hidden_layers"] = 1
        if isinstance(kw.get("layer_types"), list):  # saved per layer by transformers 5: one layer keeps the first
            kw["layer_types"] = kw["layer_types"][:1]
        config = transformers.AutoConfig.for_model(mc["model_type"], **kw)
        config._attn_implementation = "sdpa"
        self.config, self.device, self.dtype = config, device, dtype
        with torch.device("meta"):  # only to learn the architecture's classes
            skeleton = transformers.AutoModelForCausalLM.from_config(config)
        self.layer_cls = type(skeleton.model.layers[0])
        self.rotary_cls = type(skeleton.model.rotary_emb)
        self.norm_cls = type(skeleton.model.norm)
        self.cuda = device.type == "cuda"
        del skeleton

    def _median(self, fn: Callable[[], Any], reps: int, warmup: int = 1) -> float:
        return median_time(fn, reps, True, warmup) if self.cuda else settled_median(fn, reps, warmup)

    def _inputs(self, mb: int, seq: int) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        x = torch.randn(mb, seq, self.config.hidden_size, device=self.device, dtype=self.dtype) * 0.02
        pos = torch.arange(seq, device=self.device)[None].expand(mb, -1)
        rotary = self.rotary_cls(self.config).to(self.device)
        return x, pos, rotary(x, pos)

    def layer_calls(self, mb: int, seq: int, compiled: bool = False) -> LayerCalls:
        """One decoder layer's four calls at (mb, seq): eager, transformers' layer module as it is; `compiled`,
        the layer as the engine runs it under policy.compiled_layers (slidedp.step.compiled: the adapter's layer
        through its compiled function, parameters as views of one flat buffer with their gradients accumulated
        into a flat gradient buffer; the engine's graph, so the compile cache a first call fills is the job's)."""
        x, pos, pe = self._inputs(mb, seq)
        grad = torch.randn_like(x) * 1e-3
        if compiled:
            from slidedp.step.compiled import layer_function
            from slidedp.step.model_adapter import ModelAdapter

            self.config.use_cache = False  # as the engine's config (load_hf_config): no KV cache in the graph
            adapter = ModelAdapter(self.config)
            spec = adapter.units[1]
            host = torch.empty(spec.numel, dtype=torch.float32)
            adapter.init_unit(spec, host, seed=0)
            buf = host.to(device=self.device, dtype=self.dtype)
            gflat = torch.zeros(spec.numel, device=self.device, dtype=self.dtype)
            layer_fn = layer_function(adapter, True, self.device)
            ctx = {"position_ids": pos, "attention_mask": None, "position_embeddings": pe}

            def fwd_graph() -> torch.Tensor:  # the engine's leaves: views of buf, gradients into gflat
                return layer_fn(adapter.param_leaves(spec, buf, gflat), x.detach().requires_grad_(True), ctx)

            def no_graph() -> None:
                layer_fn(adapter.param_views(spec, buf), x, ctx)

            params, ptrs = spec.numel, [buf.untyped_storage().data_ptr(), gflat.untyped_storage().data_ptr()]
        else:
            layer = self.layer_cls(self.config, layer_idx=0).to(device=self.device, dtype=self.dtype)

            def fwd_graph() -> torch.Tensor:
                out = layer(x.detach().requires_grad_(True), position_ids=pos, position_embeddings=pe)
                return out[0] if isinstance(out, tuple) else out

            def no_graph() -> None:
                fwd_graph()

            params = sum(p.numel() for p in layer.parameters())
            ptrs = [p.untyped_storage().data_ptr() for p in layer.parameters()]
        state: dict[str, Any] = {}

        def keep_fwd() -> None:
            state["out"] = fwd_graph()

        def keep_bwd() -> None:
            torch.autograd.backward(state.pop("out"), grad)

        def ckpt_fwd() -> None:
            with torch.no_grad():
                no_graph()

        def ckpt_bwd() -> None:  # recompute with a graph, then backward (slidedp.step.engine)
            torch.autograd.backward(fwd_graph(), grad)

        return LayerCalls(keep_fwd, keep_bwd, ckpt_fwd, ckpt_bwd, fwd_graph, params, ptrs,
                          x.numel() * x.element_size())

    def _figures(self, calls: LayerCalls, mb: int, seq: int, reps: int) -> dict[str, Any]:
        sustained = self._sustain(calls) if self.cuda else None
        fwd_keep = self._alternating(calls.keep_fwd, calls.keep_bwd, reps)
        fwd_ckpt = self._median(calls.ckpt_fwd, reps)
        bwd_ckpt = self._median(calls.ckpt_bwd, reps)
        return {
            "params": calls.params,
            "micro_batch": mb,
            "seq": seq,
            "tokens": mb * seq,
            "fwd_keep_s": fwd_keep[0],
            "bwd_keep_s": fwd_keep[1],
            "fwd_checkpoint_s": fwd_ckpt,
            "bwd_checkpoint_s": bwd_ckpt,
            "recompute_s": max(0.0, bwd_ckpt - fwd_keep[1]),  # what checkpointing adds to a layer's backward
            "saved_keep_bytes": self._saved_bytes(calls.fwd_graph, calls.param_ptrs),
            "saved_checkpoint_bytes": calls.input_bytes,  # the layer's input, recomputed from
            "saved_source": "saved-tensor hooks (parameters excluded)",
            **({"sustained_s": sustained} if sustained is not None else {}),
        }

    def _sustain(self, calls: LayerCalls) -> float:
        """Run the kept layer's forward and backward back to back for SUSTAIN_S before timing it, so the figures
        are taken at the clock a step's layers run at: a GPU at its power cap settles a few hundred MHz below its
        idle boost within a second or two (one H200 at 700 W: a Qwen3-8B layer 2.7% slower after 15 s than in a
        burst, scripts/probe_layer_sustained.py). Returns the seconds it ran."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < SUSTAIN_S:
            calls.keep_fwd()
            calls.keep_bwd()
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def decoder_layer(self, mb: int, seq: int, reps: int) -> dict[str, Any]:
        """The eager layer's figures (calibration's `unit`)."""
        return self._figures(self.layer_calls(mb, seq), mb, seq, reps)

    def compiled_layer(self, mb: int, seq: int, reps: int) -> dict[str, Any]:
        """The compiled layer's figures (calibration's `unit_compiled`): decoder_layer's, plus what the first call
        of each graph took (`compile_s`: the compile, paid once by the job's first step; the compile cache on this
        host makes a later job's cheaper) and dynamo's graph and graph-break counts."""
        from slidedp.step.compiled import compile_backend

        calls = self.layer_calls(mb, seq, compiled=True)
        graphs, breaks = _dynamo_counts()
        t0 = time.perf_counter()
        calls.keep_fwd()
        calls.keep_bwd()
        calls.ckpt_fwd()
        if self.cuda:
            torch.cuda.synchronize(self.device)
        compile_s = time.perf_counter() - t0
        graphs, breaks = (after - before for after, before in zip(_dynamo_counts(), (graphs, breaks)))
        return {**self._figures(calls, mb, seq, reps), "backend": compile_backend(self.device),
                "compile_s": compile_s, "graphs": graphs, "graph_breaks": breaks}

    def issue_loop(self, mb: int, seq: int) -> Callable[[Any], None]:
        """A load for timing the host update inside a step: run(stop) issues one decoder layer's forward and
        backward from the calling thread, over and over until stop is set, waiting for the GPU on a blocking
        event after each pair — the issuing thread's pattern in the engine (Python launching kernels, the GIL
        held between launches, then a wait that spins no core)."""
        layer = self.layer_cls(self.config, layer_idx=0).to(device=self.device, dtype=self.dtype)
        x, pos, pe = self._inputs(mb, seq)
        grad = torch.randn_like(x) * 1e-3

        def run(stop: Any) -> None:
            while not stop.is_set():
                h = x.detach().requires_grad_(True)
                out = layer(h, position_ids=pos, position_embeddings=pe)
                (out[0] if isinstance(out, tuple) else out).backward(grad)
                if self.cuda:
                    done = torch.cuda.Event(blocking=True)
                    done.record()
                    done.synchronize()
            layer.zero_grad(set_to_none=True)

        return run

    def _alternating(
        self, first: Callable[[], None], second: Callable[[], None], reps: int
    ) -> tuple[float, float]:
        """Median times of first() and second(), run as pairs (the backward needs its forward); on the CPU the
        pairs stop once both medians have settled (microbench.settled)."""
        first()
        second()
        a_times: list[float] = []
        b_times: list[float] = []
        for _ in range(reps):
            for fn, times in ((first, a_times), (second, b_times)):
                times.append(median_time(fn, 1, self.cuda, warmup=0))
            if not self.cuda and settled(a_times) and settled(b_times):
                break
        return statistics.median(a_times), statistics.median(b_times)

    def _saved_bytes(self, fwd: Callable[[], torch.Tensor], param_ptrs: list[int]) -> int:
        """Bytes autograd keeps for backward (each storage once), parameters excluded: the window holds those."""
        seen: dict[int, int] = {}
        params = set(param_ptrs)

        def pack(t: torch.Tensor) -> torch.Tensor:
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                seen[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fwd()
        del out
        return int(sum(seen.values()))

    def embedding(self, mb: int, seq: int, reps: int) -> dict[str, float]:
        V, H = self.config.vocab_size, self.config.hidden_size
        w = torch.randn(V, H, device=self.device, dtype=self.dtype) * 0.02
        ids = torch.randint(0, V, (mb * seq,), device=self.device)
        g = torch.randn(mb * seq, H, device=self.device, dtype=self.dtype)
        acc = torch.zeros(V, H, device=self.device, dtype=torch.float32)
        fwd = self._median(lambda: torch.nn.functional.embedding(ids, w), reps)
        bwd = self._median(lambda: acc.index_add_(0, ids, g.float()), reps)
        return {"fwd_s": fwd, "bwd_s": bwd}

    def loss_head(self, chunk: int, tokens: int, reps: int) -> dict[str, Any]:
        """Final norm + lm_head + fp32 cross-entropy, forward and backward, on one chunk at two chunk sizes,
        each chunk's weight gradient then added into an fp32 sum as the engine's step does (slidedp.step.engine
        `_head`; `accumulates` says the figures hold it): time = tokens * s_per_token + chunks * s_per_chunk;
        peak = fixed + tokens_in_chunk * per_token."""
        import torch.nn.functional as F

        V, H = self.config.vocab_size, self.config.hidden_size
        norm = self.norm_cls(H, eps=getattr(self.config, "rms_norm_eps", 1e-6)).to(self.device, self.dtype)
        w = (torch.randn(V, H, device=self.device, dtype=self.dtype) * 0.02).requires_grad_(True)
        acc = torch.zeros(V, H, device=self.device, dtype=torch.float32)
        sizes = sorted({max(1, min(chunk, tokens) // 2), max(1, min(chunk, tokens))})
        times, peaks = [], []
        for c in sizes:
            x = torch.randn(c, H, device=self.device, dtype=self.dtype).requires_grad_(True)
            tgt = torch.randint(0, V, (c,), device=self.device)

            def step(x: torch.Tensor = x, tgt: torch.Tensor = tgt) -> None:
                logits = F.linear(norm(x), w).float()
                F.cross_entropy(logits, tgt, reduction="sum").backward()
                acc.add_(w.grad)
                w.grad = None
                x.grad = None

            times.append(self._median(step, reps))
            if self.cuda:
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
                step()
                torch.cuda.synchronize()
                peaks.append(torch.cuda.max_memory_allocated(self.device) - base)
        if len(sizes) == 2:
            per_tok = max(0.0, (times[1] - times[0]) / (sizes[1] - sizes[0]))
            per_chunk = max(0.0, times[1] - per_tok * sizes[1])
        else:
            per_tok, per_chunk = times[0] / sizes[0], 0.0
        out: dict[str, Any] = {
            "chunk_tokens": sizes,
            "s": times,
            "s_per_token": per_tok,
            "s_per_chunk": per_chunk,
            "accumulates": True,
        }
        if len(peaks) == 2:
            per_tok_b = max(0.0, (peaks[1] - peaks[0]) / (sizes[1] - sizes[0]))
            out.update(
                peak_bytes=peaks,
                peak_bytes_per_token=per_tok_b,
                peak_fixed_bytes=max(0.0, peaks[1] - per_tok_b * sizes[1]),
            )
        return out



def _dynamo_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) that dynamo has counted in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))
