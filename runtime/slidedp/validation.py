"""Input validation before anything is allocated: the model, the dataset, and whether host RAM holds the state.

Imports no torch and no transformers (the web API validates jobs with it, in a process without either);
pyarrow is imported only to look into a .parquet dataset. Checks that need the tokenizer (a dataset that
tokenises to nothing, examples with no answer within seq_len) run first thing in the job and fail it with
the same structured error (slidedp.data.DataError, a ConfigError).

    errors = validate_job(cfg)        # [{"loc": "data.path", "msg": "..."}], [] when the job can start
    check_job(cfg)                    # raises slidedp.ConfigError with those errors
    check_config(raw).errors          # every problem of a raw config: its key errors, and the model and dataset
                                      # checks of the keys that did parse (one answer, not one stage at a time)
    parse_job(raw)                    # JobConfig.from_dict, whose ConfigError carries those problems too

Host RAM (slidedp.host_memory): the host state is sized by slidedp.step.layout (fp32 master weights and AdamW
moments, 12 B/param, plus the bf16 copy delivered to the GPUs, 2 B/param, unless the master itself is delivered:
fp32 precision or policy.delivery_cast gpu; gradient staging slots per rank; the held gradient of exact clipping)
against ``cfg.host_ram_gib`` when set, else the cgroup memory limit, else MemTotal.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import typing
from typing import Any

from slidedp.config import ConfigError, JobConfig, is_model_path
from slidedp.data.scan import scan_dataset
from slidedp.data.sources import (
    FORMAT_FIELDS,
    DataError,
    count_records,
    file_kind,
    import_pyarrow_parquet,
    resolve_data_path,
)
from slidedp.data.tokenizer import TOKENIZER_FILES, tokenizer_source
from slidedp.host_memory import check_host_ram
from slidedp.model_sizing import sizing_config
from slidedp.presets import PRESETS, SUPPORTED_ARCHITECTURES, unit_param_counts
from slidedp.trackers import EXTRA, missing_packages, requested, wandb_login_missing

MIN_SEQ_LEN = 2  # a row's tokens are trained as predictions of the next: one token predicts nothing


def validate_job(cfg: JobConfig, host_ram_bytes: int | None = None) -> list[dict[str, str]]:
    """Every problem found with the job's model, dataset and host RAM, as [{"loc", "msg"}]."""
    errors: list[dict[str, str]] = []
    model_cfg = _check_model(cfg, errors)
    if _check_seq_len(cfg, errors):
        cfg = dataclasses.replace(cfg, seq_len=None)  # the rows' length is not judged against an unusable one
    _check_tokenizer(cfg, errors)
    vocab = model_cfg.get("vocab_size") if model_cfg else None
    _check_dataset(cfg, vocab, errors)
    _check_eval(cfg, vocab, errors)
    if model_cfg is not None:
        check_host_ram(cfg, model_cfg, host_ram_bytes, errors)
    _check_init_from(cfg, model_cfg, errors)
    _check_trackers(cfg, errors)
    return errors


def check_job(cfg: JobConfig, host_ram_bytes: int | None = None) -> None:
    """Raise ConfigError listing every problem validate_job finds."""
    errors = validate_job(cfg, host_ram_bytes)
    if errors:
        raise ConfigError(errors)


# ---------------------------------------------------------------------------- every problem at once
PLACEHOLDER = "?not-parsed"  # stands in for a required path that did not parse: neither a preset nor a path
_NO_RAM_LIMIT = 1 << 62  # host RAM that judges nothing
# Keys the host RAM a job needs depends on: with one of them unparsed, the need is not known.
HOST_RAM_KEYS = ("model", "gpus", "ranks", "precision", "policy", "optimizer.max_grad_norm", "host_ram_gib")
# Keys the records of the dataset are read by: with one of them unparsed only the file's existence is checked.
DATA_READ_KEYS = ("data.format", "data.text_field")


@dataclasses.dataclass(frozen=True)
class JobCheck:
    """What check_config found.

    config: the whole config when it parsed, else None. errors: every problem, [{"loc", "msg"}], config errors
    first. parsed: the keys that did parse, every other key at its default (a required model or data.path as
    PLACEHOLDER); None when the config is not a mapping. unparsed: the key paths whose value in `parsed` is not
    the request's (named by an error, or refused by the caller)."""

    config: JobConfig | None
    errors: list[dict[str, str]]
    parsed: JobConfig | None = None
    unparsed: frozenset[str] = frozenset()

    def known(self, *keys: str) -> bool:
        """Whether `parsed` holds the request's own value of every key (and of everything under it)."""
        return self.parsed is not None and not any(_related(u, k) for u in self.unparsed for k in keys)


def check_config(
    raw: Any, host_ram_bytes: int | None = None, *, refused: tuple[str, ...] | list[str] = (), host_ram: bool = True
) -> JobCheck:
    """Every problem with a raw job config in one answer: JobConfig.from_dict's errors (every bad key), plus
    validate_job's checks (model, tokenizer, dataset, host RAM, init_from) of the keys that did parse. A dataset
    path that parsed is read even when seq_len is bad (its rows' length is then not judged), a model path that
    parsed is read even when steps is bad; a check whose inputs did not all parse is left out rather than run on
    a default (host RAM with `gpus` unparsed, say). A finding about a key that is itself in error is left to that
    error.

    refused: key paths the caller refused already (a path outside the allowed folders): never read here, and not
    reported again. host_ram=False leaves host RAM unjudged (the host is not known)."""
    try:
        cfg: JobConfig | None = JobConfig.from_dict(raw)
        errors: list[dict[str, str]] = []
    except ConfigError as exc:
        cfg, errors = None, list(exc.errors)
    ram = host_ram_bytes if host_ram else _NO_RAM_LIMIT
    skip = frozenset(_key_path(loc) for loc in refused)
    if cfg is not None and not skip:
        return JobCheck(cfg, validate_job(cfg, ram), cfg)
    parsed, unparsed = _parsed_part(raw, errors, skip)
    if parsed is None:
        return JobCheck(cfg, errors)
    check = JobCheck(cfg, errors, parsed, unparsed)
    return dataclasses.replace(check, errors=errors + _check_parsed(check, ram))


def parse_job(raw: Any) -> JobConfig:
    """JobConfig.from_dict(raw), whose ConfigError also carries the model and dataset problems of the keys that
    did parse (check_config): the command line's one answer, as the web API's."""
    try:
        return JobConfig.from_dict(raw)
    except ConfigError:
        raise ConfigError(check_config(raw).errors) from None


def job_warnings(cfg: JobConfig) -> list[dict[str, str]]:
    """What does not stop a job but may not be what was meant, as [{"loc", "msg"}]: a dataset the run goes over
    more than once. Counted for format tokens (a record is a row) and the supervised formats (whose rows, packed
    or not, are at most their records); documents of format text split into any number of rows, so are not."""
    if cfg.data.format == "text":
        return []
    try:
        records = count_records(resolve_data_path(cfg.data.path))
    except (DataError, OSError, UnicodeDecodeError, ValueError):
        return []  # an unreadable dataset is validate_job's to report
    rows = records
    if cfg.eval.path is None and cfg.eval.holdout > 0:
        rows -= max(1, round(records * cfg.eval.holdout))
    need = cfg.steps * cfg.global_batch_sequences
    if rows <= 0 or need <= rows:
        return []
    exact = "" if cfg.data.format == "tokens" else "at most "
    held = f" ({records - rows} held out for evaluation)" if rows != records else ""
    return [{"loc": "data.path", "msg": f"the dataset is small for the steps: it holds {exact}{rows} rows{held} and "
             f"{cfg.steps} steps of {cfg.global_batch_sequences} sequences read {need}, so the run goes over it "
             f"{'at least ' if exact else ''}{need / rows:.1f} times; more data or fewer steps train less on repeats"}]


def _key_path(loc: str) -> str:
    """'optimizer.betas[1]' -> 'optimizer.betas': the key a loc names."""
    return re.sub(r"\[\d+\]", "", str(loc))


def _related(a: str, b: str) -> bool:
    """One key path is the other, or lies under it."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _known_keys(cls: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """raw without the keys `cls` does not have (unknown and retired keys), sections likewise."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        value, tp = raw[f.name], hints[f.name]
        section = tp if dataclasses.is_dataclass(tp) else _section_of(tp)
        out[f.name] = _known_keys(section, value) if section is not None and isinstance(value, dict) else value
    return out


def _section_of(tp: Any) -> Any:
    """The dataclass of an Optional[Section] type, else None."""
    inner = [a for a in typing.get_args(tp) if a is not type(None)]
    return inner[0] if len(inner) == 1 and dataclasses.is_dataclass(inner[0]) else None


def _without(raw: dict[str, Any], path: str) -> None:
    """Remove the key at a dotted path, in place (the sections on the way are copies)."""
    head, _, rest = path.partition(".")
    if head not in raw:
        return
    if not rest:
        del raw[head]
    elif isinstance(raw[head], dict):
        raw[head] = dict(raw[head])
        _without(raw[head], rest)


def _parsed_part(
    raw: Any, errors: list[dict[str, str]], skip: frozenset[str]
) -> tuple[JobConfig | None, frozenset[str]]:
    """(the config of the keys that parse, the key paths that did not), by leaving out every key an error names
    and parsing again until it parses; (None, ...) when the config is not a mapping."""
    if not isinstance(raw, dict):
        return None, frozenset()
    unparsed = set(skip) | {_key_path(e["loc"]) for e in errors}
    if unparsed & {"", "config"}:
        return None, frozenset()
    for _ in range(8):  # each round leaves out at least one more key; cross-key checks add a few at most
        trial = _known_keys(JobConfig, raw)
        for path in unparsed:
            _without(trial, path)
        if not isinstance(trial.get("model"), str):
            trial["model"] = PLACEHOLDER
            unparsed.add("model")
        data = trial.get("data")
        data = dict(data) if isinstance(data, dict) else {}
        if not isinstance(data.get("path"), str):
            data["path"] = PLACEHOLDER
            unparsed.add("data.path")
        trial["data"] = data
        try:
            return JobConfig.from_dict(trial), frozenset(unparsed)
        except ConfigError as exc:
            more = {_key_path(e["loc"]) for e in exc.errors} - unparsed
            if not more or more & {"", "config"}:
                return None, frozenset()
            unparsed |= more
    return None, frozenset()


def _check_parsed(check: JobCheck, host_ram_bytes: int | None) -> list[dict[str, str]]:
    """validate_job's findings for the keys of check.parsed that parsed; none about a key that did not."""
    cfg, known = check.parsed, check.known
    assert cfg is not None
    found: list[dict[str, str]] = []
    hidden: set[str] = set()  # findings there are about a stand-in value
    if not known("seq_len"):
        cfg = dataclasses.replace(cfg, seq_len=None)  # rows of format tokens are not measured against a default
    if known("data.path") and not known(*DATA_READ_KEYS):
        _check_dataset_exists(cfg.data.path, found)  # how to read its records is not known: only that it is there
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=PLACEHOLDER))
        hidden.add("data.path")
    if cfg.init_from is not None and not known("init_from", "output_dir", "resume", "model"):
        cfg = dataclasses.replace(cfg, init_from=None)
    ram = host_ram_bytes if known(*HOST_RAM_KEYS) else _NO_RAM_LIMIT
    later = validate_job(cfg, ram)
    return found + [e for e in later if known(e["loc"]) and e["loc"] not in hidden]


def _check_trackers(cfg: JobConfig, errors: list[dict[str, str]]) -> None:
    """Each tracker report_to names must be installed here, and W&B online must find an API key: both would only
    fail once the job runs. The default (null) asks for none: without TensorBoard the job says so in its log."""
    for tracker in requested(cfg.report_to) if cfg.report_to is not None else []:
        missing = missing_packages(tracker)
        if missing:
            errors.append({"loc": "report_to", "msg": f"names {tracker}, which needs {' and '.join(missing)}, not "
                           f"installed on this host: pip install '{EXTRA}' (or pip install {' '.join(missing)}), "
                           f"or leave {tracker} out"})
        elif tracker == "wandb" and (why := wandb_login_missing()):
            errors.append({"loc": "report_to", "msg": why})


def _check_dataset_exists(value: str, errors: list[dict[str, str]]) -> None:
    try:
        path = resolve_data_path(value)
    except DataError as exc:
        errors.extend(exc.errors)
        return
    if not os.path.exists(path):
        errors.append({"loc": "data.path", "msg": f"dataset file {path} does not exist; give the path of a .jsonl, "
                       ".json, .parquet or .txt file on the host that runs the job"})


def _check_seq_len(cfg: JobConfig, errors: list[dict[str, str]]) -> bool:
    """seq_len leaves a row something to train on; True after recording why it does not."""
    if not isinstance(cfg.seq_len, int) or cfg.seq_len >= MIN_SEQ_LEN:
        return False
    errors.append({"loc": "seq_len", "msg": f"must be at least {MIN_SEQ_LEN}, got {cfg.seq_len}: each token of a "
                   "row is trained to predict the next one, so a row of one token has no target and the dataset "
                   "gives no usable rows; set seq_len to the tokens per training sequence (512 to 4096 is usual)"})
    return True


# ---------------------------------------------------------------------------- init_from
def checkpoint_model_problem(path: str, cfg: JobConfig) -> str | None:
    """Why the checkpoint directory `path` cannot start cfg's model, as the run's own init_from check would find
    it: incomplete, or written for another model shape (its units' parameter counts differ). None when it can,
    or when cfg's model is unusable (reported as such by validate_job)."""
    from slidedp.persist import checkpoint as ckpt  # imports no torch

    model_cfg = _check_model(cfg, [])
    try:
        units = unit_param_counts(model_cfg) if model_cfg is not None else None
    except (KeyError, TypeError):
        units = None
    if units is None:
        return None
    if not ckpt.is_complete(path):
        return "is not complete (its meta.json is unreadable or an array is shorter than it says: a write cut short)"
    meta = ckpt.read_meta(path)
    theirs = [int(n) for n in meta["unit_numels"]]
    if theirs == [int(n) for n in units]:
        return None
    old = (meta.get("config") or {}).get("model", "another model")
    return (f"was written for another model shape ({old!r}: {sum(theirs):,} parameters in {len(theirs)} units; "
            f"this job's model {cfg.model!r} has {sum(units):,} in {len(units)}): init_from needs a checkpoint of "
            f"the same model; set model to {old!r}, or start from a job of model {cfg.model!r}")


def _check_init_from(cfg: JobConfig, model_cfg: dict[str, Any] | None, errors: list[dict[str, str]]) -> None:
    """The init_from checkpoint exists, is complete, fits the model and lies outside output_dir.

    A source named by a job id is not checked here: the web service resolves it (and `checkpoint`, then the name
    of one of that job's checkpoints) into a path before the job runs. Nor is a source that will not be used:
    with resume true and a checkpoint of the job's own, the run resumes that."""
    init = cfg.init_from
    if init is None or init.checkpoint is None or init.job is not None:
        return
    from slidedp.persist import checkpoint as ckpt  # imports no torch

    if cfg.resume and ckpt.latest(os.path.join(cfg.output_dir, "checkpoints")) is not None:
        return
    units = None
    if model_cfg is not None:
        try:
            units = unit_param_counts(model_cfg)
        except (KeyError, TypeError):
            units = None  # reported with the host RAM check
    problem = ckpt.init_from_problem(init.checkpoint, cfg.output_dir, units)
    if problem:
        errors.append({"loc": "init_from.checkpoint", "msg": problem})


# ---------------------------------------------------------------------------- model
def _check_model(cfg: JobConfig, errors: list[dict[str, str]]) -> dict[str, Any] | None:
    """The model's HF config as a dict, or None after recording why it cannot be used."""
    model = cfg.model
    if not is_model_path(model):
        if model not in PRESETS:
            errors.append(
                {
                    "loc": "model",
                    "msg": f"unknown preset {model!r}; presets: {', '.join(PRESETS)}. A local model directory "
                    f"must be given as a path (e.g. ./{model})",
                }
            )
            return None
        model_cfg = dict(PRESETS[model])
    else:
        model_cfg = _read_model_dir(model, errors)
        if model_cfg is None:
            return None
    model_type = model_cfg.get("model_type")
    if model_type not in SUPPORTED_ARCHITECTURES:
        errors.append(
            {
                "loc": "model",
                "msg": f"unsupported architecture {model_type!r} in {model}; supported model_type values: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}",
            }
        )
        return None
    limit = model_cfg.get("max_position_embeddings")
    if isinstance(limit, int) and isinstance(cfg.seq_len, int) and cfg.seq_len > limit:
        errors.append(
            {
                "loc": "seq_len",
                "msg": f"{cfg.seq_len} is above the model's limit (max_position_embeddings = {limit}); "
                f"set seq_len to at most {limit}",
            }
        )
    try:  # the keys that size a unit, as transformers reads them (defaults for those left out)
        return sizing_config(model_cfg, where=os.path.join(model, "config.json") if is_model_path(model) else model)
    except ValueError as exc:
        errors.append({"loc": "model", "msg": f"{exc}; correct the model's config.json"})
        return None


def _read_model_dir(model: str, errors: list[dict[str, str]]) -> dict[str, Any] | None:
    def fail(msg: str) -> None:
        errors.append({"loc": "model", "msg": msg})

    if not os.path.exists(model):
        fail(
            f"model directory {model} does not exist; give the path of a local Hugging Face model directory "
            "(config.json and *.safetensors) or a preset name"
        )
        return None
    if not os.path.isdir(model):
        fail(f"{model} is a file; give the Hugging Face model directory that holds it")
        return None
    config_path = os.path.join(model, "config.json")
    if not os.path.isfile(config_path):
        fail(f"model directory {model} has no config.json; point model at a Hugging Face model directory")
        return None
    try:
        with open(config_path, encoding="utf-8") as fh:
            model_cfg = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        fail(f"{config_path} is not valid JSON ({exc}); restore the model's config.json")
        return None
    if not isinstance(model_cfg, dict):
        fail(f"{config_path} must hold a JSON object")
        return None
    names = os.listdir(model)
    if not any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names):
        fail(
            f"model directory {model} has no weights (*.safetensors or model.safetensors.index.json); "
            "save the model with safetensors (save_pretrained does by default)"
        )
    return model_cfg


def _check_tokenizer(cfg: JobConfig, errors: list[dict[str, str]]) -> None:
    if cfg.data.format == "tokens" or tokenizer_source(cfg.model) is not None:
        return
    if not is_model_path(cfg.model):
        if cfg.model not in PRESETS:
            return  # reported as an unknown preset
        msg = (
            f"preset {cfg.model} has no tokenizer (a random-init shape), so format {cfg.data.format} cannot be "
            "tokenised; use a local model directory with a tokenizer, or pre-tokenised data (format tokens)"
        )
    elif not os.path.isdir(cfg.model):
        return  # reported as a missing directory
    else:
        msg = (
            f"model directory {cfg.model} has no tokenizer ({', '.join(TOKENIZER_FILES)}), so format "
            f"{cfg.data.format} cannot be tokenised; add the tokenizer files or use pre-tokenised data "
            "(format tokens)"
        )
    errors.append({"loc": "data.format", "msg": msg})


# ---------------------------------------------------------------------------- dataset
def _check_eval(cfg: JobConfig, vocab: int | None, errors: list[dict[str, str]]) -> None:
    """eval.path is checked as data.path is (its errors name eval.path); eval.holdout must leave a row to train on
    (counted here for format tokens, where a record is a row; other formats are counted once tokenised)."""
    ev = cfg.eval
    if ev.path is not None:
        found: list[dict[str, str]] = []
        _check_dataset(cfg, vocab, found, "eval.path")
        errors.extend({**e, "loc": "eval.path" if e["loc"] == "data.path" else e["loc"]} for e in found)
    elif ev.holdout > 0 and cfg.data.format == "tokens" and not any(e["loc"] == "data.path" for e in errors):
        try:
            rows = count_records(resolve_data_path(cfg.data.path))
        except (DataError, OSError, UnicodeDecodeError):
            return
        if rows - max(1, round(rows * ev.holdout)) < 1:
            errors.append({"loc": "eval.holdout", "msg": f"{ev.holdout:g} of the dataset's {rows} row(s) leaves no "
                           "row to train on; use a larger dataset, or an evaluation file of its own (eval.path)"})


def _check_dataset(cfg: JobConfig, vocab: int | None, errors: list[dict[str, str]], key: str = "data.path") -> None:
    """The dataset file of `key` (data.path, or eval.path read in the same format) exists and parses; errors name
    data.path (the caller renames them for eval.path)."""
    fmt = cfg.data.format
    value = cfg.eval.path if key == "eval.path" else cfg.data.path
    try:
        path = resolve_data_path(value)
        if not os.path.exists(path):
            raise DataError(
                f"dataset file {path} does not exist; give the path of a .jsonl, .json, .parquet or "
                ".txt file on the host that runs the job"
            )
        if not os.path.isfile(path):
            raise DataError(f"{path} is a directory; {key} must name one dataset file")
        kind = file_kind(path)
        if kind == ".txt" and fmt != "text":
            raise DataError(
                f"{path} is plain text, which only format text reads; use format text, or a .jsonl file "
                f"with {FORMAT_FIELDS[fmt]} for format {fmt}",
                loc="data.format",
            )
        if os.path.getsize(path) == 0:
            raise DataError(f"dataset file {path} is empty: it holds no records")
        if kind == ".parquet":
            _check_parquet_columns(path, cfg)
        _check_records(path, cfg, vocab, errors)
    except DataError as exc:
        errors.extend(exc.errors)
    except OSError as exc:
        errors.append({"loc": "data.path", "msg": f"cannot read {value}: {exc.strerror or exc}"})


def _check_parquet_columns(path: str, cfg: JobConfig) -> None:
    needed = {
        "tokens": ["input_ids"],
        "text": [cfg.data.text_field],
        "prompt_completion": ["prompt", "completion"],
        "chat": ["messages"],
        "alpaca": ["instruction", "output"],
    }[cfg.data.format]
    columns = import_pyarrow_parquet().ParquetFile(path).schema_arrow.names
    missing = [c for c in needed if c not in columns]
    if missing:
        hint = " (set data.text_field to the column holding the text)" if cfg.data.format == "text" else ""
        raise DataError(
            f"{path} has no column {missing[0]!r} for format {cfg.data.format}{hint}; columns: {', '.join(columns)}"
        )


def _check_records(path: str, cfg: JobConfig, vocab: int | None, errors: list[dict[str, str]]) -> None:
    """Every record of the file checked for the format (slidedp.data.scan: streamed, remembered by content); an
    unreadable part (bad JSON, not UTF-8) ends the scan."""
    fmt = cfg.data.format
    found = scan_dataset(path, fmt, cfg.data.text_field, cfg.seq_len, vocab)
    errors.extend(found.errors(path))
    if found.problems:
        return
    if found.records == 0:
        errors.append({"loc": "data.path", "msg": f"dataset file {path} is empty: it holds no records"})
    elif fmt == "text" and not found.any_text:
        errors.append({"loc": "data.path", "msg": f"{path} tokenises to nothing: every text is empty"})
