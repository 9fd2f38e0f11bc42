"""Records of each data format become documents: token ids and labels aligned with them (-100 = no loss).

Labels follow the Hugging Face convention: labels[t] is the target *at* token t and the model shifts, so a
document is trained on every token whose label is not -100. What each format trains on:

    text               every token; the tokenizer's own special tokens (e.g. a BOS) plus EOS at the end
    prompt_completion  the completion and the EOS after it; the prompt is context only
    alpaca             the output and EOS; instruction and input are rendered as the prompt (ALPACA_PROMPT)
    chat               the assistant turns as rendered by the tokenizer's chat template (end-of-turn marker
                       included); system and user turns and the template's role headers are context only

Pre-tokenised rows (format tokens) bypass this module. `generation_prompt` renders a prompt for a trained model
(slidedp.generate) through the same code, so the model reads what training showed it before each answer.
Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slidedp.data.sources import DataError

IGNORE = -100

ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n{input_block}### Response:\n"
ALPACA_INPUT = "### Input:\n{input}\n\n"


@dataclass
class Document:
    ids: list[int]
    labels: list[int]


def documents(records: list[Any], fmt: str, tokenizer: Any, text_field: str = "text") -> list[Document]:
    """Tokenise every record of a supervised or text dataset (file order kept; empty texts skipped)."""
    if tokenizer is None:
        raise DataError(
            f"format {fmt} needs a tokenizer and this model has none; use pre-tokenised data (format tokens) "
            "or a local model directory that includes its tokenizer",
            loc="data.format",
        )
    eos = tokenizer.eos_token_id
    if fmt == "text":
        texts = [r[text_field] for r in records if r[text_field].strip()]
        return [
            Document(ids, list(ids)) for ids in (_with_eos(x, eos) for x in _encode(tokenizer, texts, True))
        ]
    if fmt in ("prompt_completion", "alpaca"):
        prompts = [prompt_text(r, fmt) for r in records]
        answers = [r["output" if fmt == "alpaca" else "completion"] for r in records]
        p_ids = _encode(tokenizer, prompts, True)
        a_ids = _encode(tokenizer, answers, False)
        out = []
        for p, a in zip(p_ids, a_ids):
            a = _with_eos(a, eos)
            out.append(Document(p + a, [IGNORE] * len(p) + a))
        return out
    if fmt == "chat":
        _require_chat_template(tokenizer)
        return [_chat_document(tokenizer, r["messages"]) for r in records]
    raise ValueError(f"format {fmt!r} is not tokenised here")


def prompt_text(record: dict, fmt: str) -> str:
    """The text a supervised example's answer follows: the prompt (prompt_completion), or the instruction and
    input rendered with ALPACA_PROMPT (alpaca)."""
    if fmt == "alpaca":
        return ALPACA_PROMPT.format(
            instruction=record["instruction"],
            input_block=ALPACA_INPUT.format(input=record["input"]) if record.get("input") else "",
        )
    return record["prompt"]


def generation_prompt(tokenizer: Any, fmt: str, prompt: str) -> tuple[str, list[int]]:
    """What a model trained on format `fmt` reads before it answers `prompt`: (text, token ids), rendered and
    tokenised as training rendered and tokenised the context of an example's target, so the model sees the
    shape it learned. prompt_completion: the prompt as given; alpaca: the prompt as the instruction (no input);
    chat: one user turn, rendered by the chat template with its generation prompt (the assistant header);
    text and tokens: the text as given. All but chat with the tokenizer's own special tokens (a BOS), as
    training encoded prompts and documents; chat as the template renders it."""
    if fmt == "chat":
        _require_chat_template(tokenizer)
        text = _render(tokenizer, [{"role": "user", "content": prompt}], generation_prompt=True)
        return text, _encode(tokenizer, [text], False)[0]
    if fmt in ("prompt_completion", "alpaca"):
        text = prompt_text({"instruction": prompt} if fmt == "alpaca" else {"prompt": prompt}, fmt)
    elif fmt in ("text", "tokens"):
        text = prompt
    else:
        raise ValueError(f"unknown data format {fmt!r}; one of tokens, text, prompt_completion, chat, alpaca")
    return text, _encode(tokenizer, [text], True)[0]


def end_markers(tokenizer: Any) -> list[str]:
    """The tokens that end a turn: EOS, and special tokens named like <|im_end|>, <|eot_id|>, <end_of_turn>."""
    markers = [t for t in [tokenizer.eos_token, *getattr(tokenizer, "all_special_tokens", [])] if t]
    return [t for t in markers if t == tokenizer.eos_token or "end" in t.lower() or "eot" in t.lower()]


def _require_chat_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "format chat renders messages with the tokenizer's chat template, and this tokenizer has none; "
            "add a chat_template to tokenizer_config.json or use format prompt_completion",
            loc="data.format",
        )


def _encode(tokenizer: Any, texts: list[str], special: bool) -> list[list[int]]:
    out: list[list[int]] = []
    for i in range(0, len(texts), 1024):  # batched: the fast tokenizer encodes a batch in parallel
        out.extend(tokenizer(texts[i : i + 1024], add_special_tokens=special)["input_ids"])
    return [list(x) for x in out]


def _with_eos(ids: list[int], eos: int | None) -> list[int]:
    if eos is None or (ids and ids[-1] == eos):
        return ids
    return ids + [eos]


def _render(tokenizer: Any, messages: list[dict], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer: Any, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns.

    A turn's span is what rendering it adds after the generation prompt (its content and end-of-turn marker)
    when the template renders each conversation as a prefix of the next (ChatML, Llama 3, ...). Templates that
    render earlier turns differently (e.g. dropping reasoning) fall back to the turn's content found in the
    full rendering, plus an end-of-turn marker that follows at once (EOS, or a special token named like
    <|im_end|>, <|eot_id|>, <end_of_turn>).
    """
    full = _render(tokenizer, messages)
    spans = []
    cursor = 0
    markers = end_markers(tokenizer)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True) if i else ""
        upto = _render(tokenizer, messages[: i + 1])
        if upto.startswith(before) and full.startswith(upto) and len(upto) > len(before) >= cursor:
            spans.append((len(before), len(upto)))
            cursor = len(upto)
            continue
        at = full.find(m["content"], cursor)
        if at < 0:
            continue
        end = at + len(m["content"])
        end += next((len(t) for t in markers if full.startswith(t, end)), 0)
        spans.append((at, end))
        cursor = end
    return full, spans


def _chat_document(tokenizer: Any, messages: list[dict]) -> Document:
    full, spans = assistant_spans(tokenizer, messages)
    if not getattr(tokenizer, "is_fast", False):
        # No character offsets: count the tokens of each span's prefix (exact when encoding is prefix-stable).
        ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        labels = [IGNORE] * len(ids)
        for s_start, s_end in spans:
            a, b = (len(tokenizer(full[:x], add_special_tokens=False)["input_ids"]) for x in (s_start, s_end))
            labels[a:b] = ids[a:b]
        return Document(list(ids), labels)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = [IGNORE] * len(ids)
    for t, (start, end) in enumerate(enc["offset_mapping"]):
        if any(start < s_end and end > s_start for s_start, s_end in spans):
            labels[t] = ids[t]
    return Document(ids, labels)
