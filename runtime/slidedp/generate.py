"""Try a trained model: load an exported Hugging Face directory and answer prompts with it.

    slidedp generate --model runs/demo/final --prompt "3 + 5 ="            greedy, on the GPU when there is one
    echo "after 41 comes" | slidedp generate --model runs/demo/final        prompts from stdin, one per line

    from slidedp.generate import Generator
    gen = Generator("runs/demo/final")                                      # format from the export's job config
    print(gen("3 + 5 =", max_new_tokens=8).text)

A model fine-tuned on a supervised format answers well only when its prompt looks as training showed it: the
prompt is therefore rendered and tokenised by the data pipeline's own code (slidedp.data.formats
.generation_prompt) in the job's `data.format`, read from the job config the export saved (slidedp_job.json)
unless `fmt` says otherwise; without either it is used as it is (format text). Generation stops at the end
markers training taught: EOS, and for chat the template's end-of-turn token.

Greedy by default (temperature 0), which is what transformers' own `generate(do_sample=False)` computes;
temperature > 0 samples from softmax(logits / temperature) over the whole vocabulary (no top-k or top-p, so the
model's generation_config cannot narrow it behind the caller's back), seeded, so a seed gives the same text again
on the same machine. Loaded with local files only: nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

FORMATS = ("tokens", "text", "prompt_completion", "chat", "alpaca")
MAX_NEW_TOKENS = 4096


class GenerateError(ValueError):
    """The model directory or a setting cannot be used; the message says what to change."""


@dataclass
class Generation:
    prompt: str  # as given
    formatted_prompt: str  # what the model read (the job's format applied)
    text: str  # the answer, special tokens left out
    prompt_tokens: int
    new_tokens: int
    stop: str  # "eos": an end marker was generated; "length": max_new_tokens was reached
    generate_s: float
    token_ids: list[int]  # the answer's token ids, end marker included
    note: str | None = None  # why the answer is empty or cut short, and what to try (explain())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def explain(text: str, stop: str, new_tokens: int, max_new_tokens: int, fmt: str, temperature: float) -> str | None:
    """A sentence on an answer a person would not understand without one: empty, or cut at max_new_tokens. None
    for an answer that ended at an end marker with text in it."""
    if text.strip():
        if stop == "length":
            return (f"The answer was cut at max_new_tokens ({max_new_tokens}) before the model ended it; ask for more "
                    "tokens to see the rest.")
        return None
    shaped = (f" The prompt was rendered in the job's data format ({fmt}), as training showed it; a model that has "
              "not learnt that shape yet often ends at once." if fmt != "text" else "")
    sample = " Sampling (temperature above 0) may find a different first token." if temperature == 0 else ""
    if stop == "eos" and new_tokens <= 1:
        return ("The model's first token was its end marker: it ended the answer at once, so the answer is empty."
                f"{shaped} Try a prompt worded like the training data, a later checkpoint, or more training.{sample}")
    if stop == "eos":
        return (f"The model generated {new_tokens - 1} tokens that are all special tokens or white space, then its "
                f"end marker: nothing printable.{shaped} Try a prompt worded like the training data or more "
                f"training.{sample}")
    return (f"The model generated {new_tokens} tokens, all special tokens or white space, and reached "
            f"max_new_tokens ({max_new_tokens}) without an end marker: nothing printable.{shaped} Try more training "
            "or a later checkpoint.")


def saved_format(model_dir: str) -> str | None:
    """data.format of the job config an export saved with its weights (None: no such file, or no format)."""
    from slidedp.persist.export import JOB_FILE

    try:
        with open(os.path.join(model_dir, JOB_FILE), encoding="utf-8") as fh:
            fmt = (json.load(fh).get("data") or {}).get("format")
    except (OSError, ValueError, AttributeError):
        return None
    return fmt if fmt in FORMATS else None


def check_settings(max_new_tokens: Any, temperature: Any) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not (
        1 <= max_new_tokens <= MAX_NEW_TOKENS
    ):
        raise GenerateError(f"max_new_tokens must be an integer from 1 to {MAX_NEW_TOKENS}, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
        math.isfinite(temperature) and temperature >= 0
    ):
        raise GenerateError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Generator:
    """A model directory loaded once, answering prompt after prompt."""

    def __init__(self, model_dir: str, fmt: str | None = None, device: str | None = None):
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            raise GenerateError(f"{model_dir} is not a model directory (no config.json); give an export folder "
                                "such as output_dir/final (`slidedp export --checkpoint DIR` writes one)")
        if fmt is not None and fmt not in FORMATS:
            raise GenerateError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        self.model_dir = model_dir
        self.format = fmt or saved_format(model_dir) or "text"
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from slidedp.data.formats import end_markers

        started = time.perf_counter()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise GenerateError(f"{model_dir} has no usable tokenizer ({exc}); generation needs the tokenizer "
                                "files next to the weights, as an export of a model with a tokenizer has") from exc
        self.device = device or default_device()
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype="auto")
        self.model.to(self.device).eval()
        self.load_s = time.perf_counter() - started
        tok = self.tokenizer
        # Training appended EOS to every answer; a chat answer ends with the template's end-of-turn marker.
        stops = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        if self.format == "chat":
            stops |= {tok.convert_tokens_to_ids(m) for m in end_markers(tok)}
        self.stop_ids = sorted(i for i in stops if isinstance(i, int) and i >= 0)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else (self.stop_ids or [0])[0]
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self._torch = torch

    def format_prompt(self, prompt: str) -> tuple[str, list[int]]:
        from slidedp.data.formats import generation_prompt
        from slidedp.data.sources import DataError

        try:
            return generation_prompt(self.tokenizer, self.format, prompt)
        except DataError as exc:
            raise GenerateError(str(exc)) from exc

    def __call__(self, prompt: str, max_new_tokens: int = 64, temperature: float = 0.0,
                 seed: int = 0) -> Generation:
        check_settings(max_new_tokens, temperature)
        torch = self._torch
        text, ids = self.format_prompt(prompt)
        if not ids:
            raise GenerateError("the prompt is empty once tokenised; give some text")
        if self.max_positions and len(ids) + max_new_tokens > self.max_positions:
            raise GenerateError(f"the prompt is {len(ids)} tokens and max_new_tokens {max_new_tokens}: more than the "
                                f"{self.max_positions} positions the model takes; shorten the prompt or ask for "
                                "fewer tokens")
        sample = temperature > 0
        settings: dict[str, Any] = {"do_sample": sample, "max_new_tokens": max_new_tokens,
                                    "eos_token_id": self.stop_ids or None, "pad_token_id": self.pad_id}
        if sample:
            settings.update(temperature=float(temperature), top_k=0, top_p=1.0)
            torch.manual_seed(seed)  # seeds the CUDA generators too
        input_ids = torch.tensor([ids], device=self.device)
        started = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **settings)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        new = [int(t) for t in out[0, len(ids):].tolist()]
        stopped = bool(new) and new[-1] in self.stop_ids
        answer = self.tokenizer.decode(new, skip_special_tokens=True)
        stop = "eos" if stopped else "length"
        note = explain(answer, stop, len(new), max_new_tokens, self.format, temperature)
        return Generation(prompt, text, answer, len(ids), len(new), stop, seconds, new, note)


def generate(model_dir: str, prompts: list[str], max_new_tokens: int = 64, temperature: float = 0.0,
             seed: int = 0, fmt: str | None = None, device: str | None = None) -> list[Generation]:
    """Answer each prompt with the model in model_dir (loaded once); see Generator."""
    check_settings(max_new_tokens, temperature)
    gen = Generator(model_dir, fmt, device)
    return [gen(p, max_new_tokens, temperature, seed) for p in prompts]
