"""The whole dataset file is checked before a job starts (slidedp.data.scan): streamed one record at a time,
remembered by content so the same file is not parsed twice, with messages that name a line, never its text."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc

import pytest
from slidedp.config import JobConfig
from slidedp.data import scan
from slidedp.data.sources import DataError, iter_records
from slidedp.validation import validate_job

PLENTY = 1 << 50


@pytest.fixture(autouse=True)
def fresh_cache():
    scan.forget()
    yield
    scan.forget()


def job(path, fmt="text", seq_len=16):
    return JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": str(path), "format": fmt}, "seq_len": seq_len})


def test_a_bad_last_line_of_3001_is_found(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"input_ids": [5] * 16}) + "\n" * 1 + (json.dumps({"input_ids": [5] * 16}) + "\n") * 2999
                 + json.dumps({"input_ids": [5] * 15}) + "\n")
    errors = validate_job(job(p, "tokens"), PLENTY)
    assert errors == [{"loc": "data.path", "msg": f"{p} line 3001: input_ids has 15 tokens but seq_len is 16; format "
                       "tokens needs every row to be exactly seq_len tokens (re-tokenise the data, or set seq_len)"}]


def test_findings_are_kept_by_content_and_a_resubmit_reads_nothing(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "ok"}\n' * 50 + '{"txt": "no text field"}\n')
    first = validate_job(job(p), PLENTY)
    assert [e["msg"].split(": ", 1)[0] for e in first] == [f"{p} line 51"]
    assert scan.counts == {"hashed": 1, "parsed": 1}
    assert validate_job(job(p), PLENTY) == first
    assert scan.counts == {"hashed": 1, "parsed": 1}  # unchanged file: neither hashed nor parsed again
    os.utime(p, ns=(1, 1))  # touched: the same bytes, so hashed again but not parsed
    assert validate_job(job(p), PLENTY) == first
    assert scan.counts == {"hashed": 2, "parsed": 1}
    copy = tmp_path / "copy.jsonl"
    shutil.copy(p, copy)
    assert validate_job(job(copy), PLENTY)[0]["msg"].startswith(f"{copy} line 51: ")  # named as submitted
    assert scan.counts == {"hashed": 3, "parsed": 1}
    p.write_text('{"text": "ok"}\n' * 51)  # new content: parsed again, now clean
    assert validate_job(job(p), PLENTY) == []
    assert scan.counts == {"hashed": 4, "parsed": 2}
    # Another format of the same bytes is another question.
    assert validate_job(job(p, "prompt_completion"), PLENTY)[0]["loc"] == "data.path"
    assert scan.counts == {"hashed": 4, "parsed": 3}


def test_messages_name_the_line_not_its_text(tmp_path):
    secret = "hunter2-" + "s" * 40
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "ok"}\n' * 3 + json.dumps({"text": 7, "note": secret}) + "\n"
                 + '{"text": "' + secret + '" oops}\n')
    errors = validate_job(job(p), PLENTY)
    assert [e["msg"] for e in errors] == [
        f"{p} line 4: field 'text' must be a string, got int",
        f"{p} line 5: bad JSON (Expecting ',' delimiter at column 61); each line of a .jsonl file must be one JSON "
        "object",
    ]
    raw = tmp_path / "latin1.jsonl"
    raw.write_bytes(b'{"text": "ok"}\n' * 2 + '{"text": "caf\xe9 secret"}\n'.encode("latin-1"))
    errors = validate_job(job(raw), PLENTY)
    assert errors == [{"loc": "data.path", "msg": f"{raw} line 3: not UTF-8 text; save the file as UTF-8"}]


def test_a_json_array_is_read_one_record_at_a_time(tmp_path, monkeypatch):
    records = [{"text": f"document {i} " + "word " * 200} for i in range(40_000)]
    p = tmp_path / "big.json"
    p.write_text(json.dumps(records, indent=1))
    size = p.stat().st_size
    assert size > 40_000_000
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_records(str(p)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == len(records)
    assert peak < size // 4, f"peak {peak} bytes reading a {size}-byte file"
    # Cut into windows of a few characters, the records and the error positions are json's own.
    monkeypatch.setattr("slidedp.data.sources.JSON_CHUNK", 5)
    small = tmp_path / "small.json"
    small.write_text(json.dumps(records[:30], indent=2))
    assert [r for _, r in iter_records(str(small))] == records[:30]
    small.write_text('[\n  {"text": "a"},\n  {"text": "b" "c"}\n]')
    with pytest.raises(DataError) as caught:
        list(iter_records(str(small)))
    assert caught.value.errors[0]["msg"] == (
        f"{small}: bad JSON at line 3 column 16 (Expecting ',' delimiter); a .json dataset must be one JSON array "
        "of objects"
    )


def test_seq_len_of_one_token_is_refused_at_seq_len(tmp_path):
    p = tmp_path / "one.jsonl"
    p.write_text('{"input_ids": [5]}\n' * 4)
    errors = validate_job(job(p, "tokens", seq_len=1), PLENTY)
    assert [e["loc"] for e in errors] == ["seq_len"]
    assert errors[0]["msg"].startswith("must be at least 2, got 1: ")
    assert [e["loc"] for e in validate_job(job("demo:demo_text.jsonl", seq_len=1), PLENTY)] == ["seq_len"]
    assert validate_job(job("demo:demo_text.jsonl", seq_len=2), PLENTY) == []
