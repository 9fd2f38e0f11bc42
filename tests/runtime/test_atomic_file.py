"""slidedp.atomic_file: a reader sees the old file or the new one, never a part, and a failed write leaves nothing."""

from __future__ import annotations

import json
import os

import pytest
from slidedp import atomic_file


def test_write_json_replaces_the_file_whole(tmp_path):
    path = str(tmp_path / "sub" / "state.json")
    atomic_file.write_json(path, {"a": 1})
    atomic_file.write_json(path, {"b": [1, 2]}, durable=True)
    assert json.loads(open(path, encoding="utf-8").read()) == {"b": [1, 2]}
    assert os.listdir(tmp_path / "sub") == ["state.json"]


def test_a_failed_replace_keeps_the_old_content_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    path = str(tmp_path / "state.json")
    atomic_file.write_json(path, {"kept": True})

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic_file.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        atomic_file.write_text(path, "{half")
    assert json.loads(open(path, encoding="utf-8").read()) == {"kept": True}
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_value_json_cannot_write_touches_nothing(tmp_path):
    path = str(tmp_path / "state.json")
    atomic_file.write_json(path, {"kept": True})
    with pytest.raises(TypeError):
        atomic_file.write_json(path, {"bad": object()})
    assert json.loads(open(path, encoding="utf-8").read()) == {"kept": True}
    assert os.listdir(tmp_path) == ["state.json"]
