"""`slidedp config-schema`: the job config's keys as the Markdown table of docs/interfaces.md §1 and as a JSON Schema.

Both come from the config's own fields (slidedp.config_schema.schema_doc), so the table in the docs must be the one the
command prints now, and the JSON Schema must accept and refuse what JobConfig.from_dict accepts and refuses, key by
key (the rules that join several keys are from_dict's alone).

    .venv/bin/python -m pytest -q tests/runtime/test_config_schema.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from slidedp import cli
from slidedp.config import ConfigError, JobConfig
from slidedp.config_schema import (
    BEGIN,
    DRAFT,
    END,
    REGENERATE,
    docs_block,
    docs_current,
    json_schema,
    markdown,
    schema_doc,
    write_docs,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "interfaces.md"
BASE = {"model": "tiny-qwen3", "data": {"path": "unused.jsonl"}}


def _key_paths(cls=JobConfig, prefix: str = "") -> list[str]:
    """Every key of the config, sections and optional sections included, read from the dataclasses."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        out.append(prefix + f.name)
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = args[0] if len(args) == 1 else tp
        if dataclasses.is_dataclass(inner):
            out += _key_paths(inner, prefix + f.name + ".")
    return out


def _schema_at(schema: dict, path: str) -> dict:
    node = schema
    for part in path.split("."):
        node = node["properties"][part]
    return node


def _with(raw: dict, path: str, value) -> dict:
    out = json.loads(json.dumps(raw))
    node = out
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def _accepted(raw: dict) -> bool:
    try:
        JobConfig.from_dict(raw)
    except ConfigError:
        return False
    return True


# ------------------------------------------------------------------------------------------------ the docs
def test_the_docs_table_is_the_one_the_command_prints():
    assert docs_current(DOCS) == docs_block(), (
        f"docs/interfaces.md §1 differs from the job config's fields; regenerate it with `{REGENERATE}` "
        f"(without the package installed: PYTHONPATH=runtime python3 -m slidedp.cli config-schema --write-docs "
        f"docs/interfaces.md)"
    )


def test_the_table_has_a_documented_row_for_every_key():
    rows = {row.key: row for row in schema_doc()}
    keys = _key_paths()
    assert [k for k in rows if not rows[k].retired] == keys
    assert rows["policy.reduce_dtype"].retired
    table = markdown().splitlines()
    assert table[0] == "| key | type | default | range / choices | meaning |"
    assert len(table) == 2 + len(rows)
    for key, line in zip(rows, table[2:]):
        assert line.startswith(f"| `{key}` |") and line.count(" | ") == 4, line
        assert rows[key].doc.strip(), f"{key} has no doc"
    assert rows["seq_len"][1:3] == ("an integer", "2048") and rows["seq_len"].range == "(0, 2^24]"
    assert rows["policy.delivery"].range == "`auto`, `replicated`, `sharded`"
    assert rows["optimizer.betas"].range == "each in [0, 1)"
    assert rows["init_from.job"].range == "[1, 2^63-1]"
    assert rows["data"].default == "required" and rows["optimizer"].default == ""


def test_write_docs_replaces_only_the_block_between_the_markers(tmp_path, capsys):
    doc = tmp_path / "interfaces.md"
    doc.write_text(f"# Title\n\nbefore\n\n{BEGIN}\n| stale |\n{END}\n\nafter\n", encoding="utf-8")
    assert cli.main(["config-schema", "--write-docs", str(doc)]) == 0
    assert capsys.readouterr().out.strip().endswith("updated")
    assert doc.read_text(encoding="utf-8") == f"# Title\n\nbefore\n\n{docs_block()}\n\nafter\n"
    assert write_docs(doc) is False  # already current: the file is left as it is

    doc.write_text("no markers here\n", encoding="utf-8")
    assert cli.main(["config-schema", "--write-docs", str(doc)]) == 2
    assert BEGIN in capsys.readouterr().err
    assert doc.read_text(encoding="utf-8") == "no markers here\n"


# --------------------------------------------------------------------------------------------- JSON Schema
def _check_structure(node: dict, where: str) -> None:
    """What the schema promises, checked by hand: every key typed and described, objects closed."""
    assert isinstance(node.get("description"), str) and node["description"], where
    if "const" in node:  # a retired key
        assert node.get("deprecated") is True, where
        return
    types = node["type"] if isinstance(node["type"], list) else [node["type"]]
    assert set(types) <= {"object", "array", "string", "integer", "number", "boolean", "null"}, where
    for word in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if word in node:
            assert isinstance(node[word], (int, float)) and not isinstance(node[word], bool), where
    if "object" in types:
        assert node["additionalProperties"] is False, where
        assert set(node.get("required", [])) <= set(node["properties"]), where
        for name, child in node["properties"].items():
            _check_structure(child, f"{where}.{name}".lstrip("."))


def test_the_json_schema_is_a_closed_draft_2020_12_object_of_every_key():
    schema = json_schema()
    assert schema["$schema"] == DRAFT and schema["type"] == "object"
    assert schema["required"] == ["model", "data"]
    _check_structure(schema, "")
    for key in _key_paths():
        assert "description" in _schema_at(schema, key), key
    lr = _schema_at(schema, "optimizer.lr")
    assert lr == {
        "type": "number",
        "exclusiveMinimum": 0.0,
        "default": 1e-5,
        "description": lr["description"],
    }
    assert _schema_at(schema, "init_from")["type"] == ["object", "null"]
    assert _schema_at(schema, "policy.keep_layers")["type"] == ["integer", "null"]
    assert _schema_at(schema, "data")["required"] == ["path"]
    betas = _schema_at(schema, "optimizer.betas")
    assert betas["prefixItems"][1] == {"type": "number", "minimum": 0.0, "exclusiveMaximum": 1.0}


def test_the_json_schema_passes_the_draft_2020_12_metaschema():
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    jsonschema_rs.meta.validate(json_schema())


def test_a_default_config_and_every_schema_default_validate():
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    schema = json_schema()
    validator = jsonschema_rs.Draft202012Validator(schema)
    defaults = JobConfig.from_dict(BASE).to_dict()
    assert [e.message for e in validator.iter_errors(defaults)] == []
    assert [e.message for e in validator.iter_errors(BASE)] == []
    for key in _key_paths():
        node = _schema_at(schema, key)
        if "default" in node:
            assert jsonschema_rs.Draft202012Validator(node).is_valid(node["default"]), key


def test_the_schema_defaults_are_the_config_defaults():
    """A config built from nothing but the schema's defaults (and the required keys) is JobConfig's default."""

    def from_defaults(node: dict) -> dict:
        out = {}
        for name, child in node["properties"].items():
            if "const" in child:
                continue
            if "properties" in child and "default" not in child:
                out[name] = from_defaults(child)
            elif "default" in child:
                out[name] = child["default"]
        return out

    built = {**from_defaults(json_schema()), "model": BASE["model"]}
    built["data"]["path"] = BASE["data"]["path"]
    assert built == JobConfig.from_dict(BASE).to_dict()


def _cases() -> list[tuple[str, object, bool]]:
    """(key, value, accepted) at each key's edges, read from the schema; from_dict must agree on each."""
    schema = json_schema()
    out = []
    for key in [row.key for row in schema_doc()]:
        node = _schema_at(schema, key)
        types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
        if "const" in node:
            out += [(key, node["const"], True), (key, "bf16", False)]
        elif "enum" in node:
            out += [(key, v, True) for v in node["enum"]] + [(key, "none-of-these", False)]
        elif "integer" in types or "number" in types:
            step = 1 if "integer" in types else 0.5
            if "minimum" in node:
                out += [(key, node["minimum"], True), (key, node["minimum"] - step, False)]
            if "exclusiveMinimum" in node:
                out += [(key, node["exclusiveMinimum"], False), (key, node["exclusiveMinimum"] + step, True)]
            if "maximum" in node:
                out += [(key, node["maximum"], True), (key, node["maximum"] + step, False)]
            out.append((key, "1", False))
        elif "boolean" in types:
            out += [(key, True, True), (key, False, True), (key, 1, False)]
        elif "string" in types:
            out += [(key, "x", True), (key, 5, False)] + ([(key, " ", False)] if "pattern" in node else [])
        elif "array" in types and isinstance(node.get("items"), dict):  # a list of choices (report_to)
            choices = node["items"]["enum"]
            out += [(key, [], True), (key, choices[:1], True), (key, ["none-of-these"], False),
                    (key, choices[0], False)]
        elif "array" in types:
            out += [(key, [0.0, 0.999], True), (key, [0.9, 1.0], False), (key, [-0.1, 0.9], False)]
        if "object" in types:
            out.append((key + ".no_such_key", 1, False))
    return out + [("no_such_key", 1, False)]


def test_the_json_schema_accepts_and_refuses_what_from_dict_does():
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    validator = jsonschema_rs.Draft202012Validator(json_schema())
    # room for the longest warmup; eval.keep_best needs evaluation with every checkpoint evaluated
    base = {**BASE, "steps": 10**9, "checkpoint": {"interval": 1}, "eval": {"path": "unused-eval.jsonl", "interval": 1}}
    cases = _cases()
    assert len(cases) > 100
    for key, value, accepted in cases:
        # gpu_memory_gib caps GPUs: a CPU job (the base) refuses any value, a cross-check the schema cannot say
        raw = _with({**base, "gpus": 1} if key == "gpu_memory_gib" else base, key, value)
        assert validator.is_valid(raw) is accepted, (key, value)
        assert _accepted(raw) is accepted, (key, value)


# ------------------------------------------------------------------------------------------------ the command
def test_the_command_prints_the_json_schema():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "slidedp.cli", "config-schema", "--format", "json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json_schema()


def test_the_command_prints_the_markdown_table_by_default(capsys):
    assert cli.main(["config-schema"]) == 0
    assert capsys.readouterr().out == markdown()


def test_the_schema_module_imports_no_torch():
    code = "import sys, slidedp.config_schema; assert 'torch' not in sys.modules, 'torch was imported'"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "runtime")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
