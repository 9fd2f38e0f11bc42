"""The job config's schema as Markdown (docs/interfaces.md §1) and as a JSON Schema, both from schema_doc().

    slidedp config-schema                                    the Markdown table: key, type, default, range, meaning
    slidedp config-schema --format json                      a JSON Schema (draft 2020-12) of a job config
    slidedp config-schema --write-docs docs/interfaces.md    regenerate the table between the markers in §1

The keys, types, defaults, ranges and meanings are the fields of slidedp.config (their ``doc`` and checks);
schema_doc() reads them into rows and this module lays the rows out, so the table in the docs, this JSON Schema and
the web API's OpenAPI schema cannot disagree. Imports nothing but slidedp.config (no torch), like the config itself.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args, get_origin

from slidedp.config import JobConfig
from slidedp.config_parse import INT64_MAX, INT64_MIN, optional_section, type_name

DRAFT = "https://json-schema.org/draft/2020-12/schema"
BEGIN = "<!-- config-schema:begin -->"
END = "<!-- config-schema:end -->"
REGENERATE = "slidedp config-schema --write-docs docs/interfaces.md"
HEADER = ("key", "type", "default", "range / choices", "meaning")


# ------------------------------------------------------------------------------------------------ the rows
class KeyDoc(NamedTuple):
    """One key of the job config as the documentation shows it; the first four fields are (key, type, default, doc).

    slidedp.config_schema renders these rows as the Markdown table of docs/interfaces.md §1 and as a JSON Schema.
    """

    key: str  # dotted path: "optimizer.lr"
    type: str  # "an integer", "a string or null"; a section: "mapping" or "mapping or null"; a retired key: "removed"
    default: str  # as JSON ("2048", '"auto"', "null"), "required", or "" for a section whose keys hold the defaults
    doc: str
    range: str  # the values of the type it accepts: "(0, 2^24]", "`auto`, `gpu`, `host`", "not blank"; "" for all
    annotation: Any  # the type hint (a section's dataclass, possibly Optional)
    checks: dict[str, Any]  # the metadata less doc: gt/ge/lt/le, item_ge/item_lt, not_blank
    value: Any  # the default as plain data (a section's: its keys' defaults); MISSING when required
    retired: bool = False  # a removed key: its one old value (`value`) still loads, as a no-op

    @property
    def required(self) -> bool:
        return self.value is dataclasses.MISSING


def schema_doc(cls: Any = JobConfig, prefix: str = "") -> list[KeyDoc]:
    """Every key in declaration order, a section's keys after it, then the section's retired keys (RETIRED)."""
    rows: list[KeyDoc] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key, doc = hints[f.name], prefix + f.name, f.metadata.get("doc", "")
        checks = {k: v for k, v in f.metadata.items() if k != "doc"}
        value = _default_value(f)
        shown = "required" if value is dataclasses.MISSING else json.dumps(value)
        section = tp if dataclasses.is_dataclass(tp) else optional_section(tp)
        if section is not None:  # a mapping of its own keys (an optional one may be null)
            kind = "mapping" if section is tp else "mapping or null"
            rows.append(KeyDoc(key, kind, "" if isinstance(value, dict) else shown, doc, "", tp, checks, value))
            rows.extend(schema_doc(section, key + "."))
            continue
        rows.append(KeyDoc(key, _doc_type(tp), shown, doc, _range(tp, checks), tp, checks, value))
    for name, (value, why) in getattr(cls, "RETIRED", {}).items():
        old = json.dumps(value)
        doc = (f"Removed: {why}. A stored config or checkpoint meta.json holding `{old}` still loads (the key is "
               "dropped); any other value is an error saying it was removed.")
        rows.append(KeyDoc(prefix + name, "removed", "", doc, f"only `{value}`", Literal[value], {}, value, True))
    return rows


def _default_value(f: dataclasses.Field) -> Any:
    """A field's default as plain JSON data (tuples as lists, a section as a dict); MISSING when it has none."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        value = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    else:
        return dataclasses.MISSING
    return json.loads(json.dumps(value))


def _doc_type(tp: Any) -> str:
    """The documented type: a choice of strings is "a string" (the choices are its range)."""
    origin = get_origin(tp)
    if origin is Literal:
        return type_name(type(get_args(tp)[0]))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_doc_type(a) for a in get_args(tp) if a is not type(None)) + " or null"
    return type_name(tp)


def _range(tp: Any, checks: dict[str, Any]) -> str:
    if get_origin(tp) in (typing.Union, types.UnionType):
        tp = [a for a in get_args(tp) if a is not type(None)][0]
    if get_origin(tp) is Literal:
        return ", ".join(f"`{a}`" for a in get_args(tp))
    if get_origin(tp) is tuple:
        items = {k[len("item_"):]: v for k, v in checks.items() if k.startswith("item_")}
        return "each in " + _interval(items) if items else ""
    if get_origin(tp) is list:
        item = get_args(tp)[0]
        return "each one of " + _range(item, {}) if get_origin(item) is Literal else ""
    if checks.get("not_blank"):
        return "not blank"
    if tp is int:  # every integer fits a signed 64-bit integer (slidedp.config_parse)
        checks = {"ge": INT64_MIN, "le": INT64_MAX, **checks}
        if "gt" in checks:
            checks.pop("ge")
        if "lt" in checks:
            checks.pop("le")
    return _interval(checks) if tp in (int, float) else ""


def _interval(checks: dict[str, Any]) -> str:
    """gt/ge/lt/le as "[0, 1)", "> 0" or "<= 10"."""
    lo = next(((op, checks[op]) for op in ("gt", "ge") if op in checks), None)
    hi = next(((op, checks[op]) for op in ("lt", "le") if op in checks), None)
    if lo and hi:
        return f"{'(' if lo[0] == 'gt' else '['}{_number(lo[1])}, {_number(hi[1])}{')' if hi[0] == 'lt' else ']'}"
    if lo:
        return f"{'>' if lo[0] == 'gt' else '>='} {_number(lo[1])}"
    if hi:
        return f"{'<' if hi[0] == 'lt' else '<='} {_number(hi[1])}"
    return ""


def _number(v: float) -> str:
    """A bound as the docs write it: 2^24 and 10^9 rather than their digits."""
    if isinstance(v, float):
        return f"{v:g}"
    if v == INT64_MAX:
        return "2^63-1"
    if v == INT64_MIN:
        return "-2^63"
    if v > 65536 and v & (v - 1) == 0:
        return f"2^{v.bit_length() - 1}"
    if v >= 10**6 and str(v).rstrip("0") == "1":
        return f"10^{len(str(v)) - 1}"
    return str(v)


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
