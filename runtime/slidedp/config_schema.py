"""The job config's schema as Markdown (docs/interfaces.md §1) and as a JSON Schema, both from schema_doc().

    slidedp config-schema                                    the Markdown table: key, type, default, range, meaning
    slidedp config-schema --format json                      a JSON Schema (draft 2020-12) of a job config
    slidedp config-schema --write-docs docs/interfaces.md    regenerate the table between the markers in §1

The keys, types, defaults, ranges and meanings are the fields of slidedp.config (their ``doc`` and checks); this
module only lays them out, so the table in the docs, this JSON Schema and the web API's OpenAPI schema cannot
disagree. Imports nothing but slidedp.config (no torch), like the config itself.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from slidedp.config import INT64_MAX, INT64_MIN, KeyDoc, schema_doc

DRAFT = "https://json-schema.org/draft/2020-12/schema"
BEGIN = "<!-- config-schema:begin -->"
END = "<!-- config-schema:end -->"
REGENERATE = "slidedp config-schema --write-docs docs/interfaces.md"
HEADER = ("key", "type", "default", "range / choices", "meaning")


# ------------------------------------------------------------------------------------------------ Markdown
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """One table of every key (dotted paths, sections first, then their keys), ending with a newline."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in schema_doc():
        default = row.default if row.default in ("", "required") else f"`{row.default}`"
        cells = (f"`{row.key}`", row.type, default, row.range, row.doc)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def docs_block() -> str:
    """The table as docs/interfaces.md holds it: between the markers, with a note saying where it comes from."""
    note = (
        f"<!-- Generated from the fields of runtime/slidedp/config.py by `{REGENERATE}`; "
        "edit the field docs there, not this table. -->"
    )
    return f"{BEGIN}\n{note}\n\n{markdown()}\n{END}"


def _block_span(text: str, path: str | Path) -> tuple[int, int]:
    """(start, end) of the generated block in a document: from the begin marker to the end of the end marker."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(
            f"{path} must hold one {BEGIN} line followed by one {END} line, around the config table"
        )
    return text.index(BEGIN), text.index(END) + len(END)


def docs_current(path: str | Path) -> str:
    """The generated block the document holds now (markers included)."""
    text = Path(path).read_text(encoding="utf-8")
    start, end = _block_span(text, path)
    return text[start:end]


def write_docs(path: str | Path) -> bool:
    """Replace the block between the markers with the current table; True when the file changed."""
    text = Path(path).read_text(encoding="utf-8")
    start, end = _block_span(text, path)
    new = text[:start] + docs_block() + text[end:]
    if new == text:
        return False
    Path(path).write_text(new, encoding="utf-8")
    return True


# --------------------------------------------------------------------------------------------- JSON Schema
BOUNDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}
SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _bounds(checks: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    return {word: checks[prefix + op] for op, word in BOUNDS.items() if prefix + op in checks}


def _value_schema(tp: Any, checks: dict[str, Any]) -> dict[str, Any]:
    """The schema of one value of type tp (no null)."""
    if get_origin(tp) is Literal:
        choices = list(get_args(tp))
        return {"type": SCALARS[type(choices[0])], "enum": choices}
    if get_origin(tp) is tuple:
        items = [{**_value_schema(a, {}), **_bounds(checks, "item_")} for a in get_args(tp)]
        return {
            "type": "array",
            "prefixItems": items,
            "items": False,
            "minItems": len(items),
            "maxItems": len(items),
        }
    if get_origin(tp) is list:
        return {"type": "array", "items": _value_schema(get_args(tp)[0], {})}
    out: dict[str, Any] = {"type": SCALARS[tp], **_bounds(checks)}
    if tp is int:  # every integer the config accepts fits a signed 64-bit integer
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = INT64_MIN
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = INT64_MAX
    if checks.get("not_blank"):
        out["pattern"] = r"\S"
    return out


def _optional(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(get_args(tp))
    return tp, False


def _property(row: KeyDoc) -> dict[str, Any]:
    if row.retired:  # accepted, with its one old value, and ignored
        return {"const": row.value, "deprecated": True, "description": row.doc}
    tp, nullable = _optional(row.annotation)
    if dataclasses.is_dataclass(tp):
        out: dict[str, Any] = {
            "type": "object",
            "properties": {},
            "required": [],
            "additionalProperties": False,
        }
    else:
        out = _value_schema(tp, row.checks)
    if nullable:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if not row.required:
        out["default"] = row.value
    out["description"] = row.doc
    return out


def json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of a job config: every key with its type, default, choices, bounds and
    meaning; sections are nested objects, and unknown keys are refused as JobConfig.from_dict refuses them."""
    root: dict[str, Any] = {
        "$schema": DRAFT,
        "title": "SlideDP job config",
        "description": (
            "The keys of slidedp.config.JobConfig, as `slidedp train --config`, slidedp.train() and POST /api/jobs "
            "take them. Rules that join several keys (warmup_steps at most steps, ranks with GPUs, init_from "
            "naming a source, strings without NUL characters or lone surrogates) are JobConfig.from_dict's and "
            "are not expressed here."
        ),
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }
    objects = {"": root}
    for row in schema_doc():
        parent, _, name = row.key.rpartition(".")
        prop = _property(row)
        objects[parent]["properties"][name] = prop
        if row.required:
            objects[parent]["required"].append(name)
        if "properties" in prop:
            objects[row.key] = prop
    for node in objects.values():
        if not node["required"]:
            del node["required"]
    return root
