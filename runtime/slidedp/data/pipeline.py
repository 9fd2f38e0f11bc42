"""The data pipeline of one rank: every optimizer step, this rank's micro-batches, ready before they are asked for.

    tokenizer = load_tokenizer(cfg)
    data = DataPipeline(cfg, tokenizer, rank, world)      # reads, tokenises and packs once, up front
    for step in range(cfg.steps):
        micro_batches = data.next_step()                  # cfg.grad_accum MicroBatch objects
        metrics["data_time_s"] = data.wait_time_s
    checkpoint["data"] = data.state_dict()                # {"epoch", "position", "num_rows"}

Batch order (docs/interfaces.md §1 and §7): the rows form a stream, epoch after epoch; each epoch is the file
order (data.shuffle off) or a permutation drawn from (data.seed, epoch). Global batch k is the next
micro_batch_size × world × grad_accum rows of the stream, and rank r's micro-batch m takes rows
[(m·world + r)·mbs, … + mbs) of it. An epoch that ends inside a batch continues into the next epoch, so every
step is full. Every rank tokenises the whole file and computes the same stream: no communication is needed.

A background thread assembles the next steps' micro-batches while the current one trains; ``wait_time_s`` is
how long the last ``next_step`` blocked (0 when the thread kept ahead).

Held-out evaluation (config `eval`): with `eval.holdout` the built rows are split once, before any training
order is drawn, by a permutation fixed by data.seed (``holdout_split``): the held-out rows are never in the
stream, and the stream (its state_dict included) is that of the remaining rows. With `eval.path` the evaluation
rows are built from that file the same way. ``eval_batches()`` is this rank's fixed evaluation micro-batches:
evaluation batch g holds rows [g·world·mbs, (g+1)·world·mbs) of the evaluation set in order, rank r taking
[g·world·mbs + r·mbs, … + mbs); every rank gets the same number of them (at most eval.max_batches), the rows
past the set's end being padding without targets.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from slidedp.config import JobConfig
from slidedp.data.formats import IGNORE, documents
from slidedp.data.packing import (
    PackedRows,
    attention_mask_from_segments,
    pack_examples,
    pack_text,
    token_rows,
)
from slidedp.data.sources import DataError, read_dataset, resolve_data_path
from slidedp.presets import model_config_dict


@dataclass
class MicroBatch:
    """One rank's micro-batch: int64 tensors [micro_batch_size, seq_len]; labels aligned (-100 = no loss)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: Optional[torch.Tensor]  # None when every row is one document without padding

    def attention_mask(self) -> Optional[torch.Tensor]:
        """The block-diagonal causal mask [B, 1, S, S] (True = may attend), or None for plain causal."""
        return None if self.segment_ids is None else attention_mask_from_segments(self.segment_ids)

    def to(self, device: Any, non_blocking: bool = False) -> MicroBatch:
        def move(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return MicroBatch(
            move(self.input_ids), move(self.labels), move(self.position_ids), move(self.segment_ids)
        )


def build_rows(cfg: JobConfig, tokenizer: Any, path: Optional[str] = None) -> PackedRows:
    """Read, check, tokenise and pack the job's dataset (or another file in its format: `path`); DataError for
    anything that leaves nothing to train."""
    fmt, seq_len = cfg.data.format, cfg.seq_len
    path = resolve_data_path(cfg.data.path if path is None else path)
    records = read_dataset(path, fmt, cfg.data.text_field)
    if fmt == "tokens":
        rows = []
        for where, r in records:
            if len(r["input_ids"]) != seq_len:
                raise DataError(
                    f"{path} {where}: input_ids has {len(r['input_ids'])} tokens but seq_len is {seq_len}; "
                    "format tokens needs every line to be exactly seq_len tokens (re-tokenise, or set seq_len)"
                )
            rows.append((r["input_ids"], r["labels"] if r.get("labels") is not None else r["input_ids"]))
        packed = token_rows(rows, seq_len)
    else:
        docs = [d for d in documents([r for _, r in records], fmt, tokenizer, cfg.data.text_field) if d.ids]
        if not docs:
            raise DataError(f"{path} tokenises to nothing: every {cfg.data.text_field!r} text is empty")
        pad_id = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
        if fmt == "text":
            packed = pack_text(docs, seq_len, pad_id)
        else:
            packed = pack_examples(docs, seq_len, pad_id, cfg.data.pack)
    if len(packed) == 0 or packed.stats["target_tokens"] == 0:
        raise DataError(
            f"{path} has no usable rows: no example keeps a target token within seq_len={seq_len} "
            f"({packed.stats.get('dropped', 0)} examples dropped); check the answer fields or raise seq_len"
        )
    vocab = _vocab_size(cfg.model)
    top = int(packed.input_ids.max())
    if vocab is not None and top >= vocab:
        raise DataError(
            f"{path} holds token id {top}, outside the model's vocabulary of {vocab} tokens; "
            "the data was tokenised for another model"
        )
    return packed


def build_eval_rows(cfg: JobConfig, tokenizer: Any) -> PackedRows:
    """The rows of eval.path, built as the training rows are; its errors name eval.path."""
    try:
        return build_rows(cfg, tokenizer, cfg.eval.path)
    except DataError as exc:
        first = exc.errors[0]
        raise DataError(first["msg"], "eval.path" if first["loc"] == "data.path" else first["loc"]) from exc


def holdout_split(num_rows: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(training rows, held-out rows), each in file order: round(num_rows × fraction) rows, at least one, chosen by a
    permutation fixed by the data seed. DataError when no training row would be left."""
    held = max(1, round(num_rows * fraction))
    if held >= num_rows:
        raise DataError(
            f"eval.holdout {fraction:g} of {num_rows} row(s) leaves no row to train on; use a larger dataset, or an "
            "evaluation file of its own (eval.path)",
            loc="eval.holdout",
        )
    digest = hashlib.sha256(f"slidedp-holdout:{seed}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    perm = torch.randperm(num_rows, generator=gen)
    return perm[held:].sort().values, perm[:held].sort().values


def select_rows(rows: PackedRows, idx: torch.Tensor) -> PackedRows:
    """The rows `idx` of a PackedRows (stats copied)."""
    return PackedRows(rows.input_ids.index_select(0, idx), rows.labels.index_select(0, idx),
                      rows.position_ids.index_select(0, idx), rows.segment_ids.index_select(0, idx),
                      rows.single.index_select(0, idx), dict(rows.stats))


def epoch_order(num_rows: int, shuffle: bool, seed: int, epoch: int) -> torch.Tensor:
    """The order of rows in an epoch: file order, or a permutation fixed by (seed, epoch) on every host."""
    if not shuffle:
        return torch.arange(num_rows)
    digest = hashlib.sha256(f"slidedp-data:{seed}:{epoch}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return torch.randperm(num_rows, generator=gen)


class DataPipeline:
    def __init__(
        self,
        cfg: JobConfig,
        tokenizer: Any,
        rank: int,
        world: int,
        *,
        pin_memory: bool = False,
        prefetch: int = 2,
    ):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside a world of {world}")
        self.cfg, self.rank, self.world = cfg, rank, world
        self.mbs, self.grad_accum = cfg.micro_batch_size, cfg.grad_accum
        self.pin_memory, self.prefetch = pin_memory, max(1, prefetch)
        rows = build_rows(cfg, tokenizer)
        self.eval_rows: Optional[PackedRows] = None
        if cfg.eval.path is not None:
            self.eval_rows = build_eval_rows(cfg, tokenizer)
        elif cfg.eval.holdout > 0:
            train_idx, held_idx = holdout_split(len(rows), cfg.eval.holdout, cfg.data.seed)
            rows, self.eval_rows = select_rows(rows, train_idx), select_rows(rows, held_idx)
        self.rows = rows
        self._eval_batches: Optional[list[MicroBatch]] = None
        self._state = {"epoch": 0, "position": 0}
        self._orders: dict[int, torch.Tensor] = {}
        self._wait = 0.0
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue()

    # ------------------------------------------------------------------ public
    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def stats(self) -> dict[str, int]:
        """documents, rows, tokens (non-padding), target_tokens, truncated and dropped examples of the dataset
        file; with evaluation also train_rows (rows in the training stream) and eval_rows (evaluation rows, held
        out of the file or read from eval.path)."""
        out = dict(self.rows.stats)
        if self.eval_rows is not None:
            out.update(train_rows=len(self.rows), eval_rows=len(self.eval_rows))
        return out

    def eval_batches(self) -> list[MicroBatch]:
        """This rank's evaluation micro-batches, the same at every evaluation ([] without evaluation)."""
        if self.eval_rows is None:
            return []
        if self._eval_batches is None:
            n, per = len(self.eval_rows), self.mbs * self.world
            count = min(self.cfg.eval.max_batches, -(-n // per))
            batches = []
            for g in range(count):
                first = g * per + self.rank * self.mbs
                batches.append(_padded_micro(self.eval_rows, list(range(first, first + self.mbs))))
            self._eval_batches = batches
        return self._eval_batches

    @property
    def wait_time_s(self) -> float:
        return self._wait

    def next_step(self) -> list[MicroBatch]:
        """This rank's grad_accum micro-batches of the next optimizer step."""
        if self._thread is None:
            self._start()
        t0 = time.perf_counter()
        item = self._queue.get()
        self._wait = time.perf_counter() - t0
        if isinstance(item, BaseException):
            self._thread = None
            raise item
        batches, self._state = item
        return batches

    def state_dict(self) -> dict[str, int]:
        """Where the stream stands after the last step handed out (JSON-serialisable)."""
        return {**self._state, "num_rows": self.num_rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the stream from a state_dict(); the next step is the one that followed it."""
        epoch, position = state.get("epoch"), state.get("position")
        if not (isinstance(epoch, int) and isinstance(position, int) and epoch >= 0 and position >= 0):
            raise ValueError(f"data state must hold non-negative integers epoch and position, got {state!r}")
        rows = state.get("num_rows", self.num_rows)
        if rows != self.num_rows or position >= self.num_rows:
            raise DataError(
                f"the checkpoint's data position ({position} of {rows} rows) does not fit this dataset "
                f"({self.num_rows} rows): the data, seq_len or format changed since the checkpoint; resume "
                "needs the same dataset and settings"
            )
        self.close()
        self._state = {"epoch": epoch, "position": position}

    def close(self) -> None:
        """Stop the background thread (the pipeline restarts it on the next next_step)."""
        if self._thread is None:
            return
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> DataPipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ the producer
    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._thread = threading.Thread(
            target=self._produce,
            args=(self._state["epoch"], self._state["position"], self._stop, self._queue),
            name=f"slidedp-data-rank{self.rank}",
            daemon=True,
        )
        self._thread.start()

    def _produce(self, epoch: int, position: int, stop: threading.Event, out: queue.Queue) -> None:
        per_step = self.mbs * self.world * self.grad_accum
        try:
            while not stop.is_set():
                idx, epoch, position = self._take(epoch, position, per_step)
                batches = []
                for m in range(self.grad_accum):
                    first = (m * self.world + self.rank) * self.mbs
                    batches.append(self._micro(idx[first : first + self.mbs]))
                item: Any = (batches, {"epoch": epoch, "position": position})
                self._put(item, stop, out)
        except BaseException as exc:  # handed to the training loop, which raises it
            self._put(exc, stop, out)

    @staticmethod
    def _put(item: Any, stop: threading.Event, out: queue.Queue) -> None:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _take(self, epoch: int, position: int, count: int) -> tuple[torch.Tensor, int, int]:
        parts = []
        n = self.num_rows
        while count:
            order = self._order(epoch)
            k = min(count, n - position)
            parts.append(order[position : position + k])
            position += k
            count -= k
            if position == n:
                epoch, position = epoch + 1, 0
        return torch.cat(parts), epoch, position

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            if len(self._orders) > 2:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = epoch_order(self.num_rows, self.cfg.data.shuffle, self.cfg.data.seed, epoch)
        return self._orders[epoch]

    def _micro(self, idx: torch.Tensor) -> MicroBatch:
        r = self.rows

        def pick(t: torch.Tensor) -> torch.Tensor:
            out = t.index_select(0, idx).long()
            return out.pin_memory() if self.pin_memory else out

        segments = None if bool(r.single.index_select(0, idx).all()) else pick(r.segment_ids)
        return MicroBatch(pick(r.input_ids), pick(r.labels), pick(r.position_ids), segments)


def _padded_micro(rows: PackedRows, idx: list[int]) -> MicroBatch:
    """A micro-batch of rows `idx`; an index past the end is padding: the first row's tokens with no target."""
    n = len(rows)
    take = torch.tensor([i if i < n else 0 for i in idx])
    pad = torch.tensor([i >= n for i in idx])
    labels = rows.labels.index_select(0, take).long()
    labels[pad] = IGNORE
    single = bool(rows.single.index_select(0, take).all())
    return MicroBatch(rows.input_ids.index_select(0, take).long(), labels,
                      rows.position_ids.index_select(0, take).long(),
                      None if single else rows.segment_ids.index_select(0, take).long())


def _vocab_size(model: str) -> Optional[int]:
    try:
        return int(model_config_dict(model)["vocab_size"])
    except (OSError, KeyError, ValueError, TypeError):
        return None


__all__ = ["DataPipeline", "MicroBatch", "build_rows", "build_eval_rows", "epoch_order", "holdout_split", "IGNORE"]
