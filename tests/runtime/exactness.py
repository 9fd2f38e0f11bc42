"""Shared pieces of the exactness tests: a tiny model directory, data with ragged ignored labels, the reference.

The reference is what SlideDP must equal: one process, the whole model, torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_, over the same global batches, with the loss averaged over all non-ignored target
tokens of the global batch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random

import torch
from slidedp.presets import PRESETS


def make_model_dir(path: str, preset: str = "tiny-qwen3", seed: int = 0) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    d = dict(PRESETS[preset])
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path, safe_serialization=True)
    return path


def make_token_data(path: str, rows: int, seq_len: int, seed: int = 0, vocab: int = 512) -> str:
    """Sequences whose labels ignore a different number of positions each (prompt-like prefixes, gaps)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(rows):
            ids = [rng.randrange(3, vocab) for _ in range(seq_len)]
            labels = list(ids)
            for i in range(rng.randrange(0, seq_len // 2)):  # ignored prefix of varying length
                labels[i] = -100
            for _ in range(rng.randrange(0, 4)):  # and a few scattered ignored positions
                labels[rng.randrange(seq_len)] = -100
            fh.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
    return path


def make_pattern_data(path: str, rows: int, seq_len: int, seed: int = 0, alphabet: int = 32) -> str:
    """Each row repeats a short random motif over a small alphabet: a random-init model's loss falls fast (first
    towards the alphabet's frequencies, then by copying)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(rows):
            motif = [rng.randrange(3, 3 + alphabet) for _ in range(rng.randrange(4, 13))]
            fh.write(json.dumps({"input_ids": (motif * (seq_len // len(motif) + 1))[:seq_len]}) + "\n")
    return path


def tiny_job(data: str, output_dir: str, **over) -> dict:
    """A tiny-qwen3 job on `data` (token rows of 32): fp32, micro-batch 2, no export; `over` adds or replaces keys."""
    return {"model": "tiny-qwen3", "data": {"path": data, "format": "tokens"}, "seq_len": 32, "micro_batch_size": 2,
            "precision": "fp32", "output_dir": output_dir, "export": False, **over}


# the host route with the fewest staging slots the window allows: the updater's order matters most there
HOST_ROUTE_FEW_SLOTS = {"delivery": "replicated", "grad_reduce": "host", "activations": "checkpoint",
                        "edge_update": "host", "device_layers": 0, "staging_slots": 4, "window": 2}


def read_rows(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids, labels = [], []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            ids.append(rec["input_ids"])
            labels.append(rec.get("labels", rec["input_ids"]))
    return torch.tensor(ids), torch.tensor(labels)


def reference_run(model_dir: str, data_path: str, steps: int, global_batch: int, lr: float, betas, eps: float,
                  weight_decay: float, max_grad_norm: float, device: str = "cpu", autocast: bool = False,
                  micro_batches: int = 1, lr_lambda=None) -> dict:
    """Single-process AdamW (+ exact clipping) over file-order global batches; fp32 throughout, or with
    `autocast` the forward under bf16 autocast (fp32 master weights, fp32 loss): the reference for bf16 runs.
    `lr_lambda`: the learning rate follows torch.optim.lr_scheduler.LambdaLR(lr_lambda), stepped after every
    optimizer step (the i-th optimizer step, 0-based, trains at lr × lr_lambda(i)); None: lr throughout."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.to(device).train()
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                            foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda) if lr_lambda is not None else None
    ids, labels = read_rows(data_path)
    losses, norms, clipped, lrs = [], [], [], []
    for step in range(steps):
        sl = slice(step * global_batch, (step + 1) * global_batch)
        x, y = ids[sl].to(device), labels[sl].to(device)
        count = (y[:, 1:] != -100).sum()
        opt.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=device)
        for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=xs).logits
            logits = logits.float()
            targets = ys[:, 1:].reshape(-1)
            part = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets,
                                                     ignore_index=-100, reduction="sum") / count
            part.backward()
            loss += part.detach()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm if max_grad_norm > 0 else math.inf)
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(float(loss.detach()))
        norms.append(float(norm))
        clipped.append(bool(max_grad_norm > 0 and float(norm) > max_grad_norm))
    names = dict(model.named_parameters())
    return {
        "losses": losses,
        "norms": norms,
        "clipped": clipped,
        "lrs": lrs,
        "delta": {n: (p.detach() - w0[n]).cpu() for n, p in names.items()},
        "exp_avg": {n: opt.state[p]["exp_avg"].cpu() for n, p in names.items()},
        "exp_avg_sq": {n: opt.state[p]["exp_avg_sq"].cpu() for n, p in names.items()},
    }


def slidedp_tensors(checkpoint_dir: str, model_dir: str) -> dict[str, dict[str, torch.Tensor]]:
    """master / exp_avg / exp_avg_sq per HF tensor name, read from a SlideDP checkpoint."""
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config

    adapter = ModelAdapter(load_hf_config(model_dir))
    out: dict[str, dict[str, torch.Tensor]] = {}
    for kind in ("master", "exp_avg", "exp_avg_sq"):
        flat = torch.from_file(os.path.join(checkpoint_dir, f"{kind}.f32"), shared=False,
                               size=sum(u.numel for u in adapter.units), dtype=torch.float32)
        base = 0
        tensors = {}
        for unit in adapter.units:
            for p in unit.params:
                tensors[p.hf_name] = flat[base + p.offset : base + p.offset + p.numel].view(p.shape).clone()
            base += unit.numel
        out[kind] = tensors
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    den = float(torch.linalg.vector_norm(b.double()))
    num = float(torch.linalg.vector_norm(a.double() - b.double()))
    return num / den if den > 0 else num


def read_metrics(out: str) -> list[dict]:
    """The metrics records a run wrote in its output folder, in order."""
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def export_tensors(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files in an exported folder, by name."""
    from safetensors import safe_open

    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(path, name), framework="pt") as fh:
                out.update({k: fh.get_tensor(k) for k in fh.keys()})
    return out


@contextlib.contextmanager
def seeded_host_state(adapter, directory: str, run: str):
    """A one-rank fp32 host state in `directory` holding the adapter's initial weights (seed 3), removed after:
    what export tests write out without a training run."""
    from slidedp.step.host_state import HostLayout, HostState, unlink

    layout = HostLayout(run=f"{run}-{os.getpid()}", directory=directory, unit_numels=[u.numel for u in adapter.units],
                        world=1, delivery_dtype="float32", staging_slots=2, hold_gradient=False)
    state = HostState.create(layout)
    try:
        for spec in adapter.units:
            adapter.init_unit(spec, state.master_unit(spec.index), seed=3)
        yield state
    finally:
        unlink(layout)
