"""Documents become fixed-length rows; several documents share a row without seeing each other.

Each row of seq_len tokens carries, besides input_ids and labels:
    position_ids  restart at 0 where each document starts (and at the row's first token), so a document
                  packed behind another is positioned exactly as if it were alone;
    segment_ids   the document's index within the row (0, 1, ...); padding is -1;
and the label of every document's first token in the row is -100: the model shifts labels, so that target
would otherwise be predicted from the previous document's last token.
The engine turns segment_ids into a block-diagonal causal mask (``attention_mask_from_segments``), so no
token attends to another document; with that mask and those positions a packed document computes what it
would compute alone.

How rows are formed:
    text                documents (EOS-terminated) are concatenated in file order and cut every seq_len
                        tokens; a document cut at a row's end continues in the next row as its own context.
                        Only the last row is padded.
    supervised formats  each example is whole in one row (examples longer than seq_len keep their first
                        seq_len tokens and are counted as truncated). pack=true: next-fit in file order (an
                        example that does not fit the current row starts the next); pack=false: one example
                        per row. Rows are padded to seq_len; padding has label -100.
    tokens              each line is one row of exactly seq_len tokens, one document.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from slidedp.data.formats import IGNORE, Document

log = logging.getLogger("slidedp.data")


@dataclass
class PackedRows:
    """All rows of a dataset, in file order, kept in host memory (int32; batches are made int64)."""

    input_ids: torch.Tensor  # [N, S]
    labels: torch.Tensor  # [N, S]
    position_ids: torch.Tensor  # [N, S]
    segment_ids: torch.Tensor  # [N, S], -1 on padding
    single: torch.Tensor  # [N] bool: the row is one document with no padding
    stats: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def attention_mask_from_segments(segment_ids: torch.Tensor) -> torch.Tensor:
    """Block-diagonal causal mask [B, 1, S, S] (True = may attend) from segment_ids [B, S].

    Query i may attend key j when j <= i and both are in the same document. A padding token (segment < 0)
    attends only to itself, so no softmax row is empty; padding carries no loss.
    """
    seg = segment_ids
    s = seg.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool, device=seg.device).tril()
    mask = (seg[:, :, None] == seg[:, None, :]) & causal & (seg >= 0)[:, :, None]
    mask |= torch.eye(s, dtype=torch.bool, device=seg.device)
    return mask[:, None]


def pack_text(docs: list[Document], seq_len: int, pad_id: int) -> PackedRows:
    """Concatenate documents and cut the stream into seq_len rows (the last one padded)."""
    ids: list[int] = []
    labels: list[int] = []
    starts: list[bool] = []
    for d in docs:
        ids.extend(d.ids)
        labels.extend(d.labels)
        starts.extend([True] + [False] * (len(d.ids) - 1))
    pad = (-len(ids)) % seq_len
    rows = _rows(
        ids + [pad_id] * pad,
        labels + [IGNORE] * pad,
        starts + [False] * pad,
        [False] * len(ids) + [True] * pad,
        seq_len,
    )
    rows.stats = {"documents": len(docs), "truncated": 0, "dropped": 0}
    return _finish(rows)


def pack_examples(docs: list[Document], seq_len: int, pad_id: int, pack: bool) -> PackedRows:
    """Whole examples per row (truncated to seq_len), several per row when ``pack``, padded to seq_len."""
    truncated = dropped = 0
    kept: list[Document] = []
    for d in docs:
        if len(d.ids) > seq_len:
            truncated += 1
            d = Document(d.ids[:seq_len], d.labels[:seq_len])
        if all(x == IGNORE for x in d.labels[1:]):  # nothing to learn once the first label is masked
            dropped += 1
            continue
        kept.append(d)
    if truncated:
        log.warning(
            "truncated %d of %d examples longer than seq_len=%d tokens (their ends carry no loss)",
            truncated,
            len(docs),
            seq_len,
        )
    if dropped:
        log.warning(
            "dropped %d of %d examples with no target tokens within seq_len=%d", dropped, len(docs), seq_len
        )
    ids: list[int] = []
    labels: list[int] = []
    starts: list[bool] = []
    pads: list[bool] = []
    used = 0  # tokens in the row being filled

    def close_row() -> None:
        nonlocal used
        n = (-used) % seq_len
        ids.extend([pad_id] * n)
        labels.extend([IGNORE] * n)
        starts.extend([False] * n)
        pads.extend([True] * n)
        used = 0

    for d in kept:
        if used and (not pack or used + len(d.ids) > seq_len):
            close_row()
        ids.extend(d.ids)
        labels.extend(d.labels)
        starts.extend([True] + [False] * (len(d.ids) - 1))
        pads.extend([False] * len(d.ids))
        used += len(d.ids)
    if used:
        close_row()
    rows = _rows(ids, labels, starts, pads, seq_len)
    rows.stats = {"documents": len(kept), "truncated": truncated, "dropped": dropped}
    return _finish(rows)


def token_rows(rows: list[tuple[list[int], list[int]]], seq_len: int) -> PackedRows:
    """Pre-tokenised rows (input_ids, labels) of exactly seq_len tokens: one document each."""
    n = len(rows)
    ids = torch.tensor([r[0] for r in rows], dtype=torch.int32).reshape(n, seq_len)
    labels = torch.tensor([r[1] for r in rows], dtype=torch.int32).reshape(n, seq_len)
    out = PackedRows(
        input_ids=ids,
        labels=labels,
        position_ids=torch.arange(seq_len, dtype=torch.int32).expand(n, seq_len).contiguous(),
        segment_ids=torch.zeros(n, seq_len, dtype=torch.int32),
        single=torch.ones(n, dtype=torch.bool),
        stats={"documents": n, "truncated": 0, "dropped": 0},
    )
    return _finish(out)


def _rows(
    ids: list[int], labels: list[int], starts: list[bool], pads: list[bool], seq_len: int
) -> PackedRows:
    """Rows from a flat stream whose length is a multiple of seq_len, with document starts and pad flags."""
    n = len(ids) // seq_len
    t_ids = torch.tensor(ids, dtype=torch.int32).reshape(n, seq_len)
    t_labels = torch.tensor(labels, dtype=torch.int32).reshape(n, seq_len)
    start = torch.tensor(starts, dtype=torch.bool).reshape(n, seq_len)
    pad = torch.tensor(pads, dtype=torch.bool).reshape(n, seq_len)
    start[:, 0] = True  # a document cut at a row boundary starts afresh in the next row
    start &= ~pad
    t_labels[start] = IGNORE
    seg = torch.cumsum(start.to(torch.int32), dim=1) - 1
    col = torch.arange(seq_len, dtype=torch.int32).expand(n, seq_len)
    last_start = torch.cummax(torch.where(start, col, torch.zeros_like(col)), dim=1).values
    pos = col - last_start
    seg = torch.where(pad, torch.full_like(seg, -1), seg).to(torch.int32)
    pos = torch.where(pad, torch.zeros_like(pos), pos).to(torch.int32)
    single = (seg.amax(dim=1) == 0) & ~pad.any(dim=1)
    return PackedRows(t_ids, t_labels, pos, seg, single)


def _finish(rows: PackedRows) -> PackedRows:
    rows.stats.update(
        rows=len(rows),
        tokens=int((rows.segment_ids >= 0).sum()),
        target_tokens=int((rows.labels != IGNORE).sum()),
    )
    return rows
