"""The `slidedp` command.

    slidedp train --config job.yaml [--set steps=20 ...]   train: a progress bar on a terminal, else one log line
                                                           per step with elapsed time and ETA (an output_dir that
                                                           is not empty needs resume: true or --overwrite)
    slidedp export --checkpoint DIR [--out DIR]            a checkpoint's weights as a Hugging Face directory
    slidedp generate --model DIR [--prompt TEXT ...]       answer prompts with an exported model (stdin: one
                                                           prompt a line), formatted as the job's data.format
    slidedp plan --config job.yaml                         AutoPolicy's plan for this host, without training
    slidedp plan --model M --seq N --mbs N --gpus N        the same for a job given by bench's flags (with
                                                           --profile, --no-calibration, --gpu-memory-gib G)
    slidedp plan --config job.yaml --profile NAME|FILE     the plan for a declared host (a hardware profile), its
                                                           times predicted from the profile's figures
    slidedp profiles                                       the shipped hardware profiles (also plan --profiles)
    slidedp topology                                       this host's GPUs, links, CPU and RAM as JSON
    slidedp topology --save FILE                           the same with the host's calibrations, to plan for it
    slidedp plan --config job.yaml --host FILE             the plan for a saved host, from its own calibrations
    slidedp presets                                        model presets (random init) and their sizes
    slidedp validate --config job.yaml                     the checks a job passes before anything is allocated
    slidedp config-schema [--format markdown|json]         the job config's keys, types, defaults, ranges and
                                                           meanings: a Markdown table or a JSON Schema
    slidedp config-schema --write-docs docs/interfaces.md  regenerate the table in docs/interfaces.md §1
    slidedp bench ...                                      benchmarks (see docs/benchmarks.md)
    slidedp serve [--host H] [--port P]                    the workbench on embedded defaults     (web extra)
    slidedp worker                                         a workbench worker for this GPU host   (web extra)

`serve` and `worker` belong to the web package (slidedp_web), which the runtime never imports: it registers them
in the ``slidedp.commands`` entry-point group (pyproject.toml), and this CLI runs any command registered there
(NAME = "module:function", the function called with the command's remaining arguments). Without the web
package (the GPU machine runs ``PYTHONPATH=runtime python3 -m slidedp.cli``) they say which extra to install.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import metadata

from slidedp.config import ConfigError, JobConfig, load_config_file, override_value
from slidedp.generate import FORMATS as GENERATE_FORMATS  # no torch: imported when it runs


def _load(args, raw: dict | None = None) -> JobConfig:
    raw = load_config_file(args.config) if raw is None else raw
    for item in args.set or []:
        key, _, value = item.partition("=")
        node = raw
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = override_value(value)
    from slidedp.validation import parse_job

    return parse_job(raw)  # every problem of a config that does not parse, the files' included


def _print_errors(exc: ConfigError) -> int:
    print("the job config has problems:", file=sys.stderr)
    for e in exc.errors:
        print(f"  {e['loc']}: {e['msg']}", file=sys.stderr)
    return 2


def _occupied_output_dir(output_dir: str) -> str | None:
    """Why a fresh run must not start in output_dir (it holds something), or None when it may."""
    if not os.path.lexists(output_dir):
        return None
    if not os.path.isdir(output_dir):
        return f"output_dir {output_dir} exists and is not a directory; give the job another output_dir"
    names = sorted(os.listdir(output_dir))
    if not names:
        return None
    shown = ", ".join(n + ("/" if os.path.isdir(os.path.join(output_dir, n)) else "") for n in names[:8])
    more = f" and {len(names) - 8} more" if len(names) > 8 else ""
    return (f"output_dir {output_dir} is not empty (it holds {shown}{more}); a fresh run would remove its "
            "checkpoints and metrics and replace final/. Set resume: true (--set resume=true) to continue the run "
            "it holds, or pass --overwrite to start over in it")


def cmd_train(args) -> int:
    from slidedp.launch import ExportFailed, train

    cfg = _load(args)
    if not cfg.resume and not args.overwrite:
        occupied = _occupied_output_dir(cfg.output_dir)
        if occupied:
            return _print_errors(ConfigError([{"loc": "output_dir", "msg": occupied}]))
    from slidedp.progress import TrainProgress

    bar = {"auto": None, "bar": True, "lines": False}[args.progress]
    try:
        with TrainProgress(cfg.steps, bar=bar) as progress:
            result = train(cfg, on_step=progress.step, on_log=progress.log)
    except ExportFailed as exc:
        print(str(exc), file=sys.stderr)
        return 1
    check = result.prediction_check or {}
    print(json.dumps({"status": result.status, "steps_done": result.steps_done, "output_dir": result.output_dir,
                      "final_dir": result.final_dir,
                      "prediction_error": check.get("prediction_error")}))
    return 0


def cmd_export(args) -> int:
    from slidedp.persist.export import ExportError, export_checkpoint

    try:
        exported = export_checkpoint(args.checkpoint, args.out)
    except ExportError as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(exported, indent=2))
    return 0


def cmd_generate(args) -> int:
    from slidedp.generate import GenerateError, Generator, check_settings

    prompts = list(args.prompt or [])
    if not prompts:  # one prompt a line; blank lines are not prompts
        prompts = [line.rstrip("\r\n") for line in sys.stdin if line.strip()]
    if not prompts:
        print("generate: no prompt: give --prompt TEXT or prompts on stdin, one a line", file=sys.stderr)
        return 2
    try:
        check_settings(args.max_new_tokens, args.temperature)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # stderr stays for what went wrong
        gen = Generator(args.model, args.format, args.device)
        for prompt in prompts:
            out = gen(prompt, args.max_new_tokens, args.temperature, args.seed)
            if args.json:
                record = {k: v for k, v in out.to_dict().items() if k != "token_ids"}
                print(json.dumps({**record, "format": gen.format, "load_s": round(gen.load_s, 3)}), flush=True)
            else:
                print(out.text, flush=True)
                if out.note and not out.text.strip():  # an empty line alone would say nothing
                    print(f"generate: {out.note}", file=sys.stderr, flush=True)
    except GenerateError as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return 2
    return 0


# `slidedp plan`'s job flags, as `slidedp bench` names them, and the job config key each one sets
PLAN_FLAGS = {"model": "model", "seq": "seq_len", "mbs": "micro_batch_size", "gpus": "gpus",
              "gpu_memory_gib": "gpu_memory_gib"}
# planning reads no dataset: a job given by flags names this one (the config requires a path)
FLAG_JOB_DATA = {"path": "(no dataset: a job given by plan's flags)", "format": "tokens"}


def _flag_job(args) -> tuple[dict | None, str | None]:
    """(the job config that plan's flags describe, None) or (None, what is wrong with them); every other key
    at its default, as in a job file with only these keys and `data`."""
    given = {flag: getattr(args, flag) for flag in PLAN_FLAGS if getattr(args, flag) is not None}
    if args.config:
        if given:
            shown = ", ".join("--" + f.replace("_", "-") for f in given)
            return None, f"give --config JOB.yaml or the job's flags ({shown}), not both"
        return None, None
    missing = [f"--{f}" for f in ("model", "seq", "mbs", "gpus") if f not in given]
    if missing:
        return None, ("give the job to plan: --config JOB.yaml, or --model PRESET_OR_DIR --seq N --mbs N --gpus N "
                      f"(missing {' '.join(missing)}); --profiles lists the shipped profiles")
    return {"data": dict(FLAG_JOB_DATA), **{PLAN_FLAGS[f]: v for f, v in given.items()}}, None


def _no_gpus_here(cfg: JobConfig, topo: dict) -> str | None:
    """Why this host cannot measure the job (it asks for more GPUs than are here), None when it can."""
    found = len(topo.get("gpus") or [])
    if cfg.gpus <= found:
        return None
    have = "no GPU (CUDA is not available here)" if not found else f"only {found} GPU(s)"
    return f"the job asks for {cfg.gpus} GPU(s) but this host has {have}, so it cannot be calibrated here"


def _plan_ways_out(why: str) -> str:
    return (f"slidedp plan: {why}. Plan it without measuring (--no-calibration: the memory fit, no times), or "
            "for a declared card with --profile NAME (slidedp profiles lists them).")


def cmd_plan(args) -> int:
    from slidedp.planning import profiles, topology

    if args.profiles:
        print(profiles.format_list())
        return 0
    raw, wrong = _flag_job(args)
    if wrong:
        print(f"slidedp plan: {wrong}", file=sys.stderr)
        return 2
    cfg = _load(args, raw)
    saved = None
    if args.host and args.profile:
        print("slidedp plan: give --host FILE or --profile, not both", file=sys.stderr)
        return 2
    if args.host:  # a saved host (`slidedp topology --save`): its topology and its own measured calibrations
        from slidedp.planning import host_file

        try:
            saved = host_file.load(args.host)
        except host_file.HostFileError as exc:
            print(f"--host: {exc}", file=sys.stderr)
            return 2
        topo = saved.topology
        calibration = None if args.no_calibration else host_file.pick_calibration(cfg, saved)
    elif args.profile:  # a declared host: its topology and figures from the profile, nothing measured here
        try:
            profile = profiles.load(args.profile)
        except profiles.ProfileError as exc:
            print(f"--profile: {exc}", file=sys.stderr)
            return 2
        errors = profiles.job_errors(cfg, profile)
        if errors:
            return _print_errors(ConfigError(errors))
        topo = profiles.declared_topology(profile)
        calibration = None if args.no_calibration else profiles.declared_calibration(cfg, profile)
    else:
        topo = topology.detect(cfg.host_ram_gib)
        calibration = None
        if not args.no_calibration:  # GPU and CPU jobs alike: cached per host and shape
            # said before any process is started for it: a GPU job on a host without its GPUs cannot be measured
            missing = _no_gpus_here(cfg, topo)
            if missing:
                print(_plan_ways_out(missing), file=sys.stderr)
                return 2
            from slidedp.planning import calibration as calib

            try:
                calibration = calib.load_or_calibrate(cfg, topo,
                                                      on_log=lambda line: print(line, file=sys.stderr))
            except RuntimeError as exc:  # the measuring process failed (out of memory, a driver error)
                print(_plan_ways_out(f"calibrating this host failed: {exc}"), file=sys.stderr)
                return 2
    from slidedp.planning import autopolicy
    from slidedp.planning.forked import side_by_side

    with side_by_side():  # this process only plans: its searches may run in forked copies (planning/forked.py)
        plan = autopolicy.plan_job(cfg, topo, calibration, sweep=True)  # with what another card would buy
    if saved is not None:
        plan["imported_host"] = {"name": saved.name, "file": args.host, "saved_at": saved.saved_at,
                                 "summary": host_file.describe(saved, args.host)}
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        if saved is not None:
            print(host_file.describe(saved, args.host))
        print(autopolicy.format_plan(plan))
    return 0 if plan.get("feasible", True) else 3


def cmd_profiles(args) -> int:
    from slidedp.planning import profiles

    print(profiles.format_list())
    return 0


def cmd_topology(args) -> int:
    from slidedp.planning import topology

    topo = topology.detect(args.host_ram_gib)
    if not args.save:
        print(json.dumps(topo, indent=2))
        return 0
    from slidedp.planning import host_file
    from slidedp.planning.calibration import cached_calibrations

    saved = host_file.build(topo, cached_calibrations(topo.get("hostname")))
    try:
        host_file.save(args.save, saved)
    except OSError as exc:
        print(f"topology --save: cannot write {args.save}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"saved host {saved.name} ({len(topo['gpus'])} GPU(s), {len(saved.calibrations)} calibration(s)) to "
          f"{args.save}; plan for it elsewhere with slidedp plan --config JOB.yaml --host {args.save}")
    return 0


def cmd_presets(args) -> int:
    from slidedp.policy import ExecutionPolicy
    from slidedp.presets import PRESETS, param_count, unit_param_counts
    from slidedp.step.layout import plan_layout

    header = ("name", "family", "layers", "hidden", "params (M)", "host state (GiB)")
    rows = []
    for name, cfg in PRESETS.items():
        n, units = param_count(cfg), unit_param_counts(cfg)
        # the state in bf16 training (master, moments, bf16 copy), before any rank's staging
        parts = plan_layout(units, 1, ExecutionPolicy.default(len(units) - 2), "bf16", False, directory="").parts()
        state = parts["master_and_moments"] + parts["delivery_copy"]
        rows.append((name, cfg["model_type"], str(cfg["num_hidden_layers"]), str(cfg["hidden_size"]),
                     f"{n / 1e6:.1f}", f"{state / 2**30:.2f}"))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for r in (header, *rows):  # names and families left, figures right
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    return 0


def cmd_validate(args) -> int:
    from slidedp.validation import validate_job

    errors = validate_job(_load(args))
    if errors:
        return _print_errors(ConfigError(errors))
    print("ok")
    return 0


def cmd_config_schema(args) -> int:
    from slidedp import config_schema

    if args.write_docs:
        try:
            changed = config_schema.write_docs(args.write_docs)
        except (OSError, ValueError) as exc:
            print(f"config-schema: {exc}", file=sys.stderr)
            return 2
        print(f"{args.write_docs}: {'updated' if changed else 'already up to date'}")
        return 0
    if args.format == "json":
        print(json.dumps(config_schema.json_schema(), indent=2))
    else:
        print(config_schema.markdown(), end="")
    return 0


def cmd_bench(args) -> int:
    from slidedp import bench

    return bench.main(args.rest)


# ---- commands other packages provide (the web package's serve and worker)
COMMANDS_GROUP = "slidedp.commands"
# the runtime's own commands, which the group cannot replace
_BUILTIN = {"train", "plan", "profiles", "validate", "export", "generate", "topology", "presets", "config-schema", "bench"}
# Commands an optional extra of this project registers: named here only to say what to install when it is absent.
EXTRA_COMMANDS = {"serve": ("web", "run the workbench"), "worker": ("web", "run a workbench worker")}


def registered_commands() -> dict[str, metadata.EntryPoint]:
    """The entry points of the slidedp.commands group, by command name; nothing is imported to list them."""
    return {ep.name: ep for ep in metadata.entry_points(group=COMMANDS_GROUP)}


def _missing(name: str, detail: str) -> int:
    if name in EXTRA_COMMANDS:
        extra = EXTRA_COMMANDS[name][0]
        print(
            f"slidedp {name} needs the {extra} extra, which is not installed here ({detail}); install it with "
            f"pip install 'slidedp[{extra}]' (in a checkout: pip install -e '.[{extra}]')",
            file=sys.stderr,
        )
    else:
        print(f"slidedp {name} cannot run here: {detail}", file=sys.stderr)
    return 2


def run_registered(name: str, rest: list[str]) -> int:
    """Run a command of the slidedp.commands group: load its function now, call it with the remaining arguments."""
    ep = registered_commands().get(name)
    if ep is None:
        return _missing(name, f"no installed package registers `slidedp {name}`")
    try:
        fn = ep.load()
        return fn(rest) or 0
    except ModuleNotFoundError as exc:  # the command's package or a dependency of its extra is not installed
        if (exc.name or "").partition(".")[0] == "slidedp":
            raise  # a module of the runtime itself: a bug to see, not an extra to install
        return _missing(name, f"no module named {exc.name!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slidedp", description="SlideDP: fine-tune LLMs larger than GPU memory.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn, helptext in (("train", cmd_train, "train a job"), ("plan", cmd_plan, "plan a job without training"),
                               ("validate", cmd_validate, "validate a job config and its inputs")):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("--config", required=name != "plan", help="job config, YAML or JSON")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key, e.g. steps=20")
        if name == "plan":
            sp.add_argument("--json", action="store_true", help="print the plan as JSON")
            sp.add_argument("--no-calibration", action="store_true", help="memory fit only, no microbenchmarks")
            sp.add_argument("--profile", metavar="NAME_OR_FILE", default=None,
                            help="plan for a declared host instead of this one: a shipped profile's name (see "
                            "--profiles) or a profile JSON file; every time is predicted from its figures")
            sp.add_argument("--profiles", action="store_true", help="list the shipped hardware profiles and exit")
            sp.add_argument("--model", default=None, metavar="PRESET_OR_DIR",
                            help="instead of --config: plan this model (a preset or a Hugging Face directory) "
                            "with --seq, --mbs and --gpus, every other key at its default")
            sp.add_argument("--seq", type=int, default=None, metavar="N", help="with --model: seq_len")
            sp.add_argument("--mbs", type=int, default=None, metavar="N", help="with --model: micro_batch_size")
            sp.add_argument("--gpus", type=int, default=None, metavar="N", help="with --model: gpus (0: the CPU)")
            sp.add_argument("--gpu-memory-gib", type=float, default=None, metavar="G",
                            help="with --model: gpu_memory_gib, the GPU memory each rank may use")
            sp.add_argument("--host", metavar="FILE", default=None,
                            help="plan for a saved host instead of this one: the file `slidedp topology --save` "
                            "wrote on it (its topology and calibrations)")
        if name == "train":
            sp.add_argument("--overwrite", action="store_true",
                            help="start a fresh run even when output_dir holds an earlier run's files")
            sp.add_argument("--progress", choices=("auto", "bar", "lines"), default="auto",
                            help="bar: a progress bar with elapsed time, ETA, loss, tokens/s and step time (the "
                            "full per-step records are in output_dir/metrics.jsonl); lines: one line per step with "
                            "elapsed time and ETA; auto (default): the bar when stdout is a terminal, else lines")
        sp.set_defaults(fn=fn)
    sp = sub.add_parser("export", help="export a checkpoint's weights as a Hugging Face directory")
    sp.add_argument("--checkpoint", required=True, help="a complete checkpoint directory (checkpoints/step-N)")
    sp.add_argument("--out", default=None, help="output folder (default: the run's output_dir/final)")
    sp.set_defaults(fn=cmd_export)
    sp = sub.add_parser(
        "generate", help="answer prompts with an exported model",
        description="Load a Hugging Face model directory (an export: output_dir/final, or `slidedp export "
        "--checkpoint DIR`'s) and answer each prompt, formatted as the job's data.format formatted its training "
        "examples. Greedy unless --temperature > 0; on the GPU when there is one.",
    )
    sp.add_argument("--model", required=True, help="the model directory (config.json, weights, tokenizer)")
    sp.add_argument("--prompt", action="append", metavar="TEXT",
                    help="a prompt (repeat for several); without any, prompts are read from stdin, one a line")
    sp.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    sp.add_argument("--temperature", type=float, default=0.0,
                    help="0 (default): greedy; > 0: sample from softmax(logits / T), seeded by --seed")
    sp.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    sp.add_argument("--format", default=None, choices=GENERATE_FORMATS,
                    help="how to format prompts (default: data.format of the job config saved with the export, "
                    "slidedp_job.json; else text, the prompt as it is)")
    sp.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda when available)")
    sp.add_argument("--json", action="store_true",
                    help="one JSON object a prompt: prompt, formatted_prompt, text, token counts, stop, timings")
    sp.set_defaults(fn=cmd_generate)
    sp = sub.add_parser("topology", help="print this host's topology as JSON")
    sp.add_argument("--host-ram-gib", type=float, default=None)
    sp.add_argument("--save", metavar="FILE", default=None,
                    help="write this host's topology and its cached calibrations to FILE (a saved host, for "
                    "`slidedp plan --host FILE` elsewhere or the workbench's Hosts page) instead of printing")
    sp.set_defaults(fn=cmd_topology)
    sub.add_parser("presets", help="list model presets").set_defaults(fn=cmd_presets)
    sub.add_parser("profiles", help="list the shipped hardware profiles (slidedp plan --profile NAME)").set_defaults(
        fn=cmd_profiles)
    sp = sub.add_parser(
        "config-schema", help="print the job config's schema (keys, types, defaults, ranges, meanings)",
        description="Print every job config key with its type, default, accepted range or choices and meaning, "
        "from the config's own field definitions: as the Markdown table of docs/interfaces.md §1 or as a JSON "
        "Schema (draft 2020-12) that a job file can be checked against.",
    )
    sp.add_argument("--format", choices=("markdown", "json"), default="markdown",
                    help="markdown: one table, a row per key (default); json: a JSON Schema")
    sp.add_argument("--write-docs", metavar="FILE", default=None,
                    help="instead of printing, replace the table between the config-schema markers in FILE "
                    "(docs/interfaces.md)")
    sp.set_defaults(fn=cmd_config_schema)
    sp = sub.add_parser("bench", help="run benchmarks", add_help=False)
    sp.add_argument("rest", nargs=argparse.REMAINDER)
    sp.set_defaults(fn=cmd_bench)
    registered = registered_commands()
    for name in sorted(set(registered) | set(EXTRA_COMMANDS)):
        if name in _BUILTIN:
            continue
        if name in EXTRA_COMMANDS:
            extra, helptext = EXTRA_COMMANDS[name]
            if name not in registered:
                helptext += f" (needs the {extra} extra: pip install 'slidedp[{extra}]')"
        else:
            helptext = f"provided by {registered[name].module}"
        sp = sub.add_parser(name, help=helptext, add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
        sp.set_defaults(fn=lambda args, name=name: run_registered(name, args.rest))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "bench":  # parses its own options, as the registered commands do
        return cmd_bench(argparse.Namespace(rest=argv[1:]))
    if argv and argv[0] not in _BUILTIN and (argv[0] in EXTRA_COMMANDS or argv[0] in registered_commands()):
        return run_registered(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as exc:
        return _print_errors(exc)


if __name__ == "__main__":
    sys.exit(main())
