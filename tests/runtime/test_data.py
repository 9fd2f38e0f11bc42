"""The data side: tokenizer, readers, formats, packing masks, batch order, shuffling and resume."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from slidedp.config import JobConfig, load_config_file  # noqa: E402
from slidedp.data import DataError, DataPipeline, demo_paths, load_tokenizer, resolve_data_path  # noqa: E402
from slidedp.data.packing import attention_mask_from_segments  # noqa: E402
from slidedp.data.pipeline import build_rows, epoch_order  # noqa: E402
from slidedp.data.tokenizer import TINY_TOKENIZER_DIR  # noqa: E402
from slidedp.presets import PRESETS, TINY_VOCAB  # noqa: E402

DEMO_JOB = os.path.join(os.path.dirname(demo_paths()["demo_sft.jsonl"]), "job.yaml")

RECORDS = {
    "text": [{"text": "7 + 2 = 9"}, {"text": "after 41 comes 42"}, {"text": "reverse: red cat -> cat red"}],
    "prompt_completion": [
        {"prompt": "3 + 5 =", "completion": " 8"},
        {"prompt": "reverse: sun moon ->", "completion": " moon sun"},
    ],
    "alpaca": [
        {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
        {"instruction": "Say hello.", "output": "Hello, world!"},
    ],
    "chat": [
        {
            "messages": [
                {"role": "system", "content": "You add numbers."},
                {"role": "user", "content": "1 + 1 ="},
                {"role": "assistant", "content": "2"},
                {"role": "user", "content": "after 4 comes"},
                {"role": "assistant", "content": "5"},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "reverse: a b ->"},
                {"role": "assistant", "content": "b a"},
            ]
        },
    ],
}
# What each record trains on (decoded target tokens of each document), for the tiny tokenizer.
EXPECTED_TARGETS = {
    "prompt_completion": [" 8</s>", " moon sun</s>"],
    "alpaca": ["5</s>", "Hello, world!</s>"],
    "chat": ["2<|im_end|>\n5<|im_end|>\n", "b a<|im_end|>\n"],
}


@pytest.fixture(scope="module")
def tok():
    cfg = JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}})
    return load_tokenizer(cfg)


def job(path, fmt="text", **kw):
    data = {"path": str(path), "format": fmt, "shuffle": False}
    data.update(kw.pop("data", {}))
    return JobConfig.from_dict({"model": "tiny-qwen3", "data": data, "seq_len": 64, **kw})


def write(path, records):
    ext = os.path.splitext(str(path))[1]
    if ext == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif ext == ".json":
        path.write_text(json.dumps(records))
    elif ext == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), str(path))
    else:
        path.write_text("\n\n".join(r["text"] for r in records) + "\n")
    return path


def documents_of(rows, tok):
    """[(decoded input of the document, decoded targets)] for each document of every row."""
    out = []
    for r in range(len(rows)):
        seg = rows.segment_ids[r]
        for s in range(int(seg.max()) + 1):
            at = seg == s
            ids, labels = rows.input_ids[r][at], rows.labels[r][at]
            out.append((tok.decode(ids), tok.decode(labels[labels != -100])))
    return out


# ---------------------------------------------------------------------------- tokenizer
def test_tiny_tokenizer_has_exactly_the_preset_vocabulary_and_special_ids(tok):
    assert len(tok) == TINY_VOCAB == PRESETS["tiny-qwen3"]["vocab_size"]
    p = PRESETS["demo-qwen3"]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (
        p["pad_token_id"],
        p["bos_token_id"],
        p["eos_token_id"],
    )
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [3, 4]
    text = "reverse: héllo wörld ✓ -> 12 + 30 = 42\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert max(ids) < TINY_VOCAB and tok.decode(ids) == text  # byte-level: any text round-trips
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_load_tokenizer_uses_the_model_directory_or_none_for_real_shape_presets(tmp_path, tok):
    model_dir = tmp_path / "model"
    shutil.copytree(TINY_TOKENIZER_DIR, model_dir)
    (model_dir / "config.json").write_text(json.dumps(PRESETS["tiny-qwen3"]))
    from_dir = load_tokenizer(JobConfig.from_dict({"model": str(model_dir), "data": {"path": "x.jsonl"}}))
    assert from_dir("after 9 comes 10")["input_ids"] == tok("after 9 comes 10")["input_ids"]
    assert load_tokenizer(JobConfig.from_dict({"model": "qwen3-8b", "data": {"path": "x.jsonl"}})) is None
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps(PRESETS["tiny-qwen3"]))
    assert load_tokenizer(JobConfig.from_dict({"model": str(bare), "data": {"path": "x.jsonl"}})) is None


# ---------------------------------------------------------------------------- formats x file types
@pytest.mark.parametrize("ext", [".jsonl", ".json", ".parquet"])
@pytest.mark.parametrize("fmt", ["text", "prompt_completion", "alpaca", "chat"])
def test_each_format_reads_the_same_from_each_file_type(tmp_path, tok, fmt, ext):
    reference = build_rows(job(write(tmp_path / "ref.jsonl", RECORDS[fmt]), fmt), tok)
    rows = build_rows(job(write(tmp_path / f"data{ext}", RECORDS[fmt]), fmt), tok)
    assert torch.equal(rows.input_ids, reference.input_ids) and torch.equal(rows.labels, reference.labels)
    docs = documents_of(rows, tok)
    assert len(docs) == len(RECORDS[fmt])
    if fmt == "text":
        for (inputs, targets), rec in zip(docs, RECORDS[fmt]):
            assert inputs == rec["text"] + "</s>"
            first = tok.decode(tok(rec["text"])["input_ids"][:1])
            assert targets == rec["text"][len(first) :] + "</s>"  # all but the document's first token
    else:
        assert [t for _, t in docs] == EXPECTED_TARGETS[fmt]


def test_alpaca_renders_instruction_and_input_as_the_prompt(tmp_path, tok):
    rows = build_rows(job(write(tmp_path / "a.jsonl", RECORDS["alpaca"]), "alpaca"), tok)
    inputs = [i for i, _ in documents_of(rows, tok)]
    assert inputs[0] == "### Instruction:\nAdd the numbers.\n\n### Input:\n2 and 3\n\n### Response:\n5</s>"
    assert inputs[1] == "### Instruction:\nSay hello.\n\n### Response:\nHello, world!</s>"


def test_chat_trains_assistant_turns_when_the_template_renders_history_differently(tmp_path, tok):
    # A template that marks only the final turn: earlier renderings are not prefixes of the full one.
    odd = load_tokenizer(job(tmp_path / "x.jsonl"))
    odd.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
        "{% if loop.last %}{{ ' [end]' }}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    rows = build_rows(job(write(tmp_path / "c.jsonl", RECORDS["chat"][:1]), "chat"), odd)
    ((_, targets),) = documents_of(rows, odd)
    assert targets == "2<|im_end|>5"


def test_tokens_rows_keep_their_labels_and_need_no_segments(tmp_path, tok):
    recs = [
        {"input_ids": list(range(5, 69)), "labels": [-100] * 32 + list(range(37, 69))},
        {"input_ids": [9] * 64},
    ]
    for ext in (".jsonl", ".json", ".parquet"):
        cfg = job(write(tmp_path / f"t{ext}", recs), "tokens", data={"pack": False})
        rows = build_rows(cfg, None)
        assert rows.labels[0].tolist() == recs[0]["labels"] and rows.labels[1].tolist() == [9] * 64
        assert rows.position_ids[1].tolist() == list(range(64))
        (mb,) = DataPipeline(cfg, None, 0, 1).next_step()
        assert mb.segment_ids is None and mb.attention_mask() is None and mb.input_ids.dtype == torch.int64


def test_txt_documents_are_blank_line_separated_blocks(tmp_path, tok):
    path = tmp_path / "notes.txt"
    path.write_text("first line\nsame document\n\n\nsecond document\n\nthird\n")
    docs = documents_of(build_rows(job(path, "text"), tok), tok)
    assert [d for d, _ in docs] == ["first line\nsame document</s>", "second document</s>", "third</s>"]
    with pytest.raises(DataError) as err:
        build_rows(job(path, "prompt_completion"), tok)
    assert err.value.errors[0]["loc"] == "data.format" and "only format text" in err.value.errors[0]["msg"]


# ---------------------------------------------------------------------------- packing
def _packed(tmp_path, tok, pack=True, n=40):
    recs = [{"prompt": f"after {i} comes", "completion": f" {i + 1}"} for i in range(n)]
    return build_rows(job(write(tmp_path / "pc.jsonl", recs), "prompt_completion", data={"pack": pack}), tok)


def test_packed_rows_never_attend_across_documents(tmp_path, tok):
    rows = _packed(tmp_path, tok)
    seg = rows.segment_ids.long()
    assert int(seg.max()) >= 3  # several documents share a row
    mask = attention_mask_from_segments(seg)
    assert mask.shape == (len(rows), 1, 64, 64) and mask.dtype == torch.bool
    b, _, i, j = torch.nonzero(mask, as_tuple=True)
    same = seg[b, i] == seg[b, j]
    pad_self = (seg[b, i] < 0) & (i == j)
    assert bool(((same & (j <= i) & (seg[b, i] >= 0)) | pad_self).all())
    # and every allowed pair is there: a token sees all earlier tokens of its document
    expected = sum(
        int(((seg[r] == s).sum() * ((seg[r] == s).sum() + 1)) // 2)
        for r in range(len(rows))
        for s in range(int(seg[r].max()) + 1)
    ) + int((seg < 0).sum())
    assert len(b) == expected


def test_each_document_starts_at_position_zero_with_an_ignored_label(tmp_path, tok):
    rows = _packed(tmp_path, tok)
    starts = (rows.segment_ids >= 0) & torch.cat(
        [torch.ones(len(rows), 1, dtype=torch.bool), rows.segment_ids[:, 1:] != rows.segment_ids[:, :-1]], 1
    )
    assert torch.equal(starts, (rows.position_ids == 0) & (rows.segment_ids >= 0))
    assert bool((rows.labels[starts] == -100).all())
    assert int(starts.sum()) == rows.stats["documents"] == 40


def test_packed_documents_compute_what_they_compute_alone(tmp_path, tok):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(
        Qwen3Config(**{k: v for k, v in PRESETS["tiny-qwen3"].items() if k != "model_type"})
    )
    model.eval()
    rows = _packed(tmp_path, tok, n=12)
    with torch.no_grad():
        packed = model(
            input_ids=rows.input_ids[:1].long(),
            position_ids=rows.position_ids[:1].long(),
            attention_mask=attention_mask_from_segments(rows.segment_ids[:1].long()),
        ).logits[0]
        seg = rows.segment_ids[0]
        for s in range(int(seg.max()) + 1):
            alone = model(input_ids=rows.input_ids[0][seg == s][None].long()).logits[0]
            assert torch.allclose(packed[seg == s], alone, atol=1e-5)


def test_unpacked_examples_get_one_row_each_with_ignored_padding(tmp_path, tok):
    rows = _packed(tmp_path, tok, pack=False, n=5)
    assert len(rows) == 5 and int(rows.segment_ids.max()) == 0
    pad = rows.segment_ids == -1
    assert (
        bool(pad.any()) and bool((rows.labels[pad] == -100).all()) and bool((rows.input_ids[pad] == 0).all())
    )


def test_over_long_examples_are_truncated_with_a_counted_warning(tmp_path, tok, caplog):
    recs = [
        {"prompt": "reverse: " + "red " * 10 + "->", "completion": " cat" * 80},
        {"prompt": "1 + 1 =", "completion": " 2"},
    ]
    with caplog.at_level(logging.WARNING, logger="slidedp.data"):
        rows = build_rows(job(write(tmp_path / "long.jsonl", recs), "prompt_completion"), tok)
    assert rows.stats["truncated"] == 1 and "truncated 1 of 2 examples" in caplog.text
    assert len(rows) == 2 and bool((rows.segment_ids[0] == 0).all())  # the long one fills its row


def test_text_documents_continue_across_rows(tmp_path, tok):
    long_text = " ".join(f"after {i} comes {i + 1}." for i in range(30))
    rows = build_rows(job(write(tmp_path / "t.jsonl", [{"text": long_text}]), "text"), tok)
    assert len(rows) > 1 and rows.stats["documents"] == 1
    assert rows.position_ids[1, 0] == 0 and bool((rows.segment_ids[0] == 0).all())
    ids = torch.cat([rows.input_ids[r][rows.segment_ids[r] >= 0] for r in range(len(rows))])
    assert tok.decode(ids) == long_text + "</s>"


# ---------------------------------------------------------------------------- batch order
def _numbered(tmp_path, n, **kw):
    """Tokens rows whose ids all equal the row number + 5, so a batch shows which rows it holds."""
    recs = [{"input_ids": [i + 5] * 8} for i in range(n)]
    data = {"path": str(write(tmp_path / "rows.jsonl", recs)), "format": "tokens", "shuffle": False}
    data.update(kw.pop("data", {}))
    return JobConfig.from_dict({"model": "tiny-qwen3", "data": data, "seq_len": 8, **kw})


def _rows_of(mb):
    return [int(x) - 5 for x in mb.input_ids[:, 0]]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_rank_micro_batches_follow_the_documented_file_order(tmp_path, world, grad_accum):
    n, mbs, steps = 10, 2, 4  # 10 rows: batches wrap into the next epoch
    cfg = _numbered(tmp_path, n, micro_batch_size=mbs, grad_accum=grad_accum)
    pipes = [DataPipeline(cfg, None, r, world) for r in range(world)]
    per_step = mbs * world * grad_accum
    for k in range(steps):
        base = k * per_step
        for r, pipe in enumerate(pipes):
            micro = pipe.next_step()
            assert len(micro) == grad_accum
            for m, mb in enumerate(micro):
                first = base + (m * world + r) * mbs
                assert _rows_of(mb) == [(first + j) % n for j in range(mbs)]
    for pipe in pipes:
        pipe.close()


def test_shuffle_is_a_permutation_fixed_by_seed_and_epoch():
    a, b = epoch_order(50, True, 7, 0), epoch_order(50, True, 7, 0)
    assert torch.equal(a, b) and sorted(a.tolist()) == list(range(50))
    assert not torch.equal(a, epoch_order(50, True, 8, 0))
    assert not torch.equal(a, epoch_order(50, True, 7, 1))
    assert torch.equal(epoch_order(50, False, 7, 3), torch.arange(50))


def test_shuffled_pipeline_order_repeats_with_the_seed(tmp_path):
    def order(seed):
        with DataPipeline(
            _numbered(tmp_path, 12, micro_batch_size=3, data={"shuffle": True, "seed": seed}), None, 0, 1
        ) as p:
            return [r for _ in range(8) for r in _rows_of(p.next_step()[0])]

    first = order(1)
    assert first == order(1) and first != order(2)
    assert sorted(first[:12]) == list(range(12)) and sorted(first[12:24]) == list(range(12))  # whole epochs
    assert first[:12] != first[12:24]


def test_resume_from_state_dict_continues_the_same_stream(tmp_path):
    cfg = _numbered(tmp_path, 7, micro_batch_size=2, grad_accum=2, data={"shuffle": True, "seed": 3})
    with DataPipeline(cfg, None, 1, 2) as full:
        reference = [[_rows_of(mb) for mb in full.next_step()] for _ in range(6)]
    with DataPipeline(cfg, None, 1, 2) as first:
        for _ in range(3):
            first.next_step()
        state = json.loads(json.dumps(first.state_dict()))
    # 3 steps x (2 rows x 2 ranks x 2 micro-batches) = 24 rows of the stream = 3 epochs of 7 + 3
    assert state == {"epoch": 3, "position": 3, "num_rows": 7}
    with DataPipeline(cfg, None, 1, 2) as resumed:
        resumed.load_state_dict(state)
        assert [[_rows_of(mb) for mb in resumed.next_step()] for _ in range(3)] == reference[3:]
        with pytest.raises(DataError, match="does not fit this dataset"):
            resumed.load_state_dict({"epoch": 0, "position": 2, "num_rows": 8})


def test_batches_are_ready_before_they_are_asked_for(tmp_path):
    with DataPipeline(_numbered(tmp_path, 40, micro_batch_size=4), None, 0, 1) as pipe:
        pipe.next_step()
        time.sleep(0.3)  # the background thread prepares the next steps meanwhile
        pipe.next_step()
        assert pipe.wait_time_s < 0.05


# ---------------------------------------------------------------------------- errors at job start
def test_job_start_errors_name_the_file_line_or_field(tmp_path, tok):
    empty_texts = write(tmp_path / "blank.jsonl", [{"text": ""}, {"text": "  "}])
    with pytest.raises(DataError, match="tokenises to nothing"):
        build_rows(job(empty_texts, "text"), tok)
    long_prompts = write(tmp_path / "long.jsonl", [{"prompt": "red " * 100, "completion": " x"}])
    with pytest.raises(DataError, match="no usable rows"):
        build_rows(job(long_prompts, "prompt_completion"), tok)
    missing = write(tmp_path / "missing.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "c"}])
    with pytest.raises(DataError) as err:
        build_rows(job(missing, "prompt_completion"), tok)
    assert err.value.errors == [
        {
            "loc": "data.path",
            "msg": f"{missing} line 2: has no field 'completion' (format prompt_completion needs it)",
        }
    ]
    wrong_len = write(tmp_path / "short.jsonl", [{"input_ids": [1, 2, 3]}])
    with pytest.raises(DataError, match="line 1: input_ids has 3 tokens but seq_len is 64"):
        build_rows(job(wrong_len, "tokens"), None)
    outside = write(tmp_path / "big.jsonl", [{"input_ids": [TINY_VOCAB] * 64}])
    with pytest.raises(DataError, match="outside the model's vocabulary of 512"):
        build_rows(job(outside, "tokens"), None)
    with pytest.raises(DataError) as err:
        build_rows(job(empty_texts, "text"), None)
    assert err.value.errors[0]["loc"] == "data.format" and "needs a tokenizer" in err.value.errors[0]["msg"]


# ---------------------------------------------------------------------------- the demo
def test_demo_paths_resolve_to_the_packaged_files():
    assert set(demo_paths()) == {"demo_text.jsonl", "demo_sft.jsonl", "demo_heldout.jsonl"}
    assert resolve_data_path("demo:demo_sft.jsonl") == demo_paths()["demo_sft.jsonl"]
    with pytest.raises(
        DataError,
        match="no demo dataset named 'nope.jsonl'; shipped: demo_heldout.jsonl, demo_sft.jsonl, demo_text.jsonl",
    ):
        resolve_data_path("demo:nope.jsonl")
    assert sum(os.path.getsize(p) for p in demo_paths().values()) < 400_000


def test_demo_job_loss_falls_within_a_few_steps():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = JobConfig.from_dict(load_config_file(DEMO_JOB))
    assert cfg.model == "demo-qwen3" and cfg.seq_len == 128 and cfg.gpus == 0
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(
        Qwen3Config(**{k: v for k, v in PRESETS[cfg.model].items() if k != "model_type"})
    )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr, betas=cfg.optimizer.betas)
    losses = []
    with DataPipeline(cfg, load_tokenizer(cfg), 0, 1) as data:
        for _ in range(25):
            (mb,) = data.next_step()
            loss = model(
                input_ids=mb.input_ids,
                position_ids=mb.position_ids,
                attention_mask=mb.attention_mask(),
                labels=mb.labels,
            ).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    assert losses[0] > 5.5  # ~ln 512 at random init
    assert sum(losses[-5:]) / 5 < losses[0] - 2.5
