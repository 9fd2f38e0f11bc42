"""The path guards one function at a time, in process and in milliseconds (slidedp_web.guards): how a client's
value is quoted, how roots are read, when a path is inside them, which paths of a config are judged and against
which roots, the text of every refusal, and the host RAM limit. tests/backend/test_path_confinement.py and
test_guards.py check the same refusals through the API; these pin each rule's edges (a name of 255 bytes and one
of 256, the walk's entry limit, the first output root) where a slip would let a path through unnoticed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from slidedp_web import guards
from slidedp_web.guards import (
    config_paths,
    form_error,
    host_ram_error,
    parse_roots,
    path_error,
    root_errors,
    shown,
)

GIB = 2**30


@pytest.fixture
def tree(tmp_path) -> dict[str, Path]:
    """Roots of each kind, a second output root below a folder of its own, the jobs folder of a data folder, and
    a folder outside them all."""
    names = {"models": "models", "datasets": "datasets", "outputs": "outputs", "outputs_b": "b/c",
             "data_dir": "data", "jobs": "data/jobs", "outside": "outside"}
    out = {key: tmp_path / rel for key, rel in names.items()}
    for path in out.values():
        path.mkdir(parents=True, exist_ok=True)
    return out


def refusal(value: str, kind: str, allowed: str, setting: str) -> str:
    return (f"{value!r} is not inside the folders allowed for {kind}s: {allowed} ({setting}); paths are judged after "
            f"'~', '..' and symlinks are resolved. Put the {kind} in one of them, or ask the operator to add its "
            "folder.")


# --------------------------------------------------------------------------------------------- quoting


def test_a_value_is_quoted_whole_up_to_its_limit_and_cut_with_an_ellipsis_beyond():
    assert shown("abc") == "'abc'"
    assert shown(12) == "'12'" and shown(None) == "'None'"  # not a string: its repr, quoted
    assert shown("x" * 80) == repr("x" * 80)
    assert shown("x" * 81) == repr("x" * 80 + "…")
    assert shown("y" * 10, 4) == repr("yyyy…") and shown("y" * 4, 4) == repr("yyyy")


# ----------------------------------------------------------------------------------------------- roots


def test_roots_are_read_from_colons_stripped_expanded_and_resolved(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir()
    real = real.resolve()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse_roots(None) == [] and parse_roots("") == [] and parse_roots(" : :") == []
    assert parse_roots(f" {tmp_path / 'link'} :~/real:{tmp_path}/real/../real") == [real, real, real]


def test_inside_means_the_root_itself_or_below_it_by_path_components_in_any_root(tree):
    roots = [tree["models"], tree["datasets"]]
    assert guards._inside(tree["models"], roots)
    assert guards._inside(tree["datasets"] / "a" / "b", roots)  # in the second root only
    assert not guards._inside(tree["models"].parent / "models2" / "m", roots)
    assert not guards._inside(tree["models"].parent, roots)
    assert not guards._inside(tree["models"], [])


# ------------------------------------------------------------------------------------------ path forms


def test_a_path_that_cannot_name_a_file_says_why():
    assert form_error("/a/b\x00c") == "holds a NUL byte, which no path may hold"
    assert form_error("/a/\ud800") == "holds characters that cannot be written in a file name on this host"
    assert form_error("/tmp/" + "n" * 255) is None
    assert form_error("/tmp/" + "n" * 256 + "/x") == (
        "holds a name of 256 bytes; a file or folder name has at most 255 bytes on this host: shorten it")
    assert form_error("/tmp/" + "é" * 128) == (  # bytes, not characters: 256 bytes in 128 characters
        "holds a name of 256 bytes; a file or folder name has at most 255 bytes on this host: shorten it")


def test_a_whole_path_has_at_most_4095_bytes_counted_after_the_home_folder_is_expanded(monkeypatch):
    many_names = "/".join(["n" * 200] * 30)  # 6029 bytes in names of 200: too long as a whole, each name fine
    assert form_error("/" + many_names) == (
        "is 6030 bytes long; a path has at most 4095 bytes on this host: shorten it")
    longest_allowed = "/" + "/".join(["n" * 200] * 20) + "/" + "m" * 74
    assert len(longest_allowed) == 4095 and form_error(longest_allowed) is None
    assert form_error(longest_allowed + "m") == (
        "is 4096 bytes long; a path has at most 4095 bytes on this host: shorten it")
    monkeypatch.setenv("HOME", "/" + "h" * 100)
    below = "~/" + "/".join(["n" * 200] * 19) + "/" + "m" * 74  # 3895 bytes as sent, 3995 once ~ is expanded
    assert form_error(below) is None
    over = "~/" + "/".join(["n" * 200] * 20) + "/" + "m" * 74  # 4096 bytes as sent, 4196 expanded
    assert form_error(over) == "is 4196 bytes long; a path has at most 4095 bytes on this host: shorten it"


# --------------------------------------------------------------------------------------- escaping links


def test_a_link_below_a_folder_that_leads_outside_the_roots_is_found(tree):
    model = tree["models"] / "m"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "shared.json").symlink_to(tree["models"] / "elsewhere.json")  # inside the roots: allowed
    (model / "weights").symlink_to(tree["datasets"])  # another root: allowed
    roots = [tree["models"], tree["datasets"]]
    assert guards._escaping_link(model, roots) is None
    (model / "sub" / "secret.json").symlink_to(tree["outside"] / "secret.json")
    assert guards._escaping_link(model, roots) == model / "sub" / "secret.json"
    (model / "sub" / "secret.json").unlink()
    (model / "outfolder").symlink_to(tree["outside"], target_is_directory=True)  # a folder link counts too
    assert guards._escaping_link(model, roots) == model / "outfolder"


def test_a_link_to_a_folder_inside_the_roots_is_searched_for_links_out_too(tree):
    """Regression: model/parts -> models/shared (inside the roots) hid models/shared/weights -> outside, which a
    loader opens as model/parts/weights; links to folders were judged but never entered."""
    shared = tree["models"] / "shared"
    shared.mkdir()
    (shared / "weights.safetensors").symlink_to(tree["outside"] / "secret")
    model = tree["models"] / "parts-model"
    model.mkdir()
    (model / "parts").symlink_to(shared, target_is_directory=True)
    assert guards._escaping_link(model, [tree["models"]]) == model / "parts" / "weights.safetensors"
    assert path_error(str(model), [tree["models"]], "model", "SLIDEDP_MODEL_ROOTS").startswith(
        f"{str(model)!r} holds a symlink 'parts/weights.safetensors' that leads outside")
    # a loop of links inside the roots ends the walk (the kernel stops resolving it) without a refusal
    (shared / "weights.safetensors").unlink()
    (shared / "again").symlink_to(model, target_is_directory=True)
    assert guards._escaping_link(model, [tree["models"]]) is None


@pytest.mark.parametrize("top_entries, found", [(2, True), (3, False)])
def test_the_walk_for_escaping_links_stops_after_max_walk_entries(tree, monkeypatch, top_entries, found):
    """With a limit of 3 entries: a link met as the 3rd entry is still judged; after 3 entries the walk stops."""
    monkeypatch.setattr(guards, "MAX_WALK_ENTRIES", 3)
    model = tree["models"] / f"walk{top_entries}"
    (model / "sub").mkdir(parents=True)
    for i in range(top_entries - 1):  # the other top-level entries besides sub/
        (model / f"f{i}").write_text("x")
    (model / "sub" / "secret").symlink_to(tree["outside"] / "secret")
    assert guards._escaping_link(model, [tree["models"]]) == ((model / "sub" / "secret") if found else None)


# ------------------------------------------------------------------------------------------ path_error


def test_a_path_outside_its_roots_is_refused_in_the_same_words_whatever_it_is(tree):
    roots = [tree["datasets"], tree["models"]]
    allowed = f"{tree['datasets']}:{tree['models']}"
    (tree["outside"] / "file.jsonl").write_text("{}")
    for value in (str(tree["outside"] / "file.jsonl"), str(tree["outside"] / "missing.jsonl"), str(tree["outside"]),
                  f"{tree['datasets']}/../outside/file.jsonl", "/a/b\x00c"):
        assert path_error(value, roots, "dataset", "SLIDEDP_DATA_ROOTS") == refusal(
            value, "dataset", allowed, "SLIDEDP_DATA_ROOTS")
    long_value = str(tree["outside"]) + "/" + "q" * 400
    assert path_error(long_value, roots, "dataset", "X") == refusal(long_value[:240] + "…", "dataset", allowed, "X")


def test_a_path_inside_its_roots_is_accepted_be_it_a_file_a_folder_or_missing(tree):
    (tree["datasets"] / "d.jsonl").write_text("{}")
    (tree["datasets"] / "link.jsonl").symlink_to(tree["datasets"] / "d.jsonl")
    roots = [tree["datasets"]]
    for value in ("d.jsonl", "link.jsonl", "missing.jsonl", "."):
        assert path_error(str(tree["datasets"] / value), roots, "dataset", "SLIDEDP_DATA_ROOTS") is None
    # a file that is a link out is refused as outside (its target is judged); only a folder is walked
    (tree["datasets"] / "out.jsonl").symlink_to(tree["outside"] / "x.jsonl")
    assert "is not inside" in path_error(str(tree["datasets"] / "out.jsonl"), roots, "dataset", "S")


def test_a_folder_inside_the_roots_holding_a_link_out_is_refused_naming_the_link_not_its_target(tree):
    model = tree["models"] / "leaky"
    (model / "tok").mkdir(parents=True)
    (model / "tok" / "tokenizer.json").symlink_to(tree["outside"] / "secret.json")
    msg = path_error(str(model), [tree["models"]], "model", "SLIDEDP_MODEL_ROOTS")
    assert msg == (f"{str(model)!r} holds a symlink 'tok/tokenizer.json' that leads outside the folders allowed for "
                   f"models ({tree['models']} (SLIDEDP_MODEL_ROOTS)). Copy the file into the model directory "
                   "instead.")


# ---------------------------------------------------------------------------------------- config_paths


def test_every_path_a_config_names_is_listed_with_its_key_in_order():
    config = {
        "model": "/m/qwen", "data": {"path": "/d/train.jsonl"}, "eval": {"path": "/d/eval.jsonl"},
        "output_dir": "runs/1", "init_from": {"checkpoint": "/o/step-1"},
    }
    assert config_paths(config) == [("model", "/m/qwen"), ("data.path", "/d/train.jsonl"),
                                    ("eval.path", "/d/eval.jsonl"), ("output_dir", "runs/1"),
                                    ("init_from.checkpoint", "/o/step-1")]


def test_names_that_are_no_paths_are_not_listed():
    assert config_paths({"model": "tiny-qwen3", "data": {"path": "demo:demo_sft.jsonl"},
                         "eval": {"path": "demo:x.jsonl"}}) == []
    assert config_paths({"model": "bad\x00name"}) == [("model", "bad\x00name")]  # a preset name holds no NUL
    assert config_paths({"model": "", "data": {"path": ""}, "output_dir": "", "init_from": {"checkpoint": ""}}) == []
    assert config_paths({"model": 3, "data": ["/d"], "eval": {"path": 7}, "output_dir": None}) == []
    assert config_paths({"init_from": {"job": 4, "checkpoint": "step-00000002"}}) == []  # that job's checkpoint
    assert config_paths({"init_from": "/o/step-1"}) == []
    assert config_paths({"init_from": {"job": None, "checkpoint": "/o/c"}}) == [("init_from.checkpoint", "/o/c")]


# ----------------------------------------------------------------------------------------- root_errors


def test_each_key_is_judged_against_its_own_roots_and_named_in_the_refusal(tree):
    outside = tree["outside"]
    config = {"model": str(outside / "m"), "data": {"path": str(outside / "d")}, "eval": {"path": str(outside / "e")},
              "output_dir": str(outside / "o"), "init_from": {"checkpoint": str(outside / "c")}}
    errors = root_errors(str(tree["models"]), str(tree["datasets"]), config, str(tree["outputs"]))
    assert errors == [
        {"loc": "model", "msg": refusal(str(outside / "m"), "model", str(tree["models"]), "SLIDEDP_MODEL_ROOTS")},
        {"loc": "data.path",
         "msg": refusal(str(outside / "d"), "dataset", str(tree["datasets"]), "SLIDEDP_DATA_ROOTS")},
        {"loc": "eval.path",
         "msg": refusal(str(outside / "e"), "dataset", str(tree["datasets"]), "SLIDEDP_DATA_ROOTS")},
        {"loc": "output_dir",
         "msg": refusal(str(outside / "o"), "output folder", str(tree["outputs"]), "SLIDEDP_OUTPUT_ROOTS")},
        {"loc": "init_from.checkpoint",
         "msg": refusal(str(outside / "c"), "checkpoint", str(tree["outputs"]), "SLIDEDP_OUTPUT_ROOTS")},
    ]
    # Each inside its own kind's roots: accepted; a kind's roots do not admit another kind's paths.
    inside = {"model": str(tree["models"] / "m"), "data": {"path": str(tree["datasets"] / "d")},
              "eval": {"path": str(tree["datasets"] / "e")}, "output_dir": str(tree["outputs"] / "o"),
              "init_from": {"checkpoint": str(tree["outputs"] / "c")}}
    assert root_errors(str(tree["models"]), str(tree["datasets"]), inside, str(tree["outputs"])) == []
    crossed = root_errors(str(tree["datasets"]), str(tree["models"]), inside, str(tree["models"]))
    assert [e["loc"] for e in crossed] == ["model", "data.path", "eval.path", "output_dir", "init_from.checkpoint"]


def test_a_kind_without_roots_is_unconfined_while_the_others_are_judged(tree):
    config = {"model": str(tree["outside"] / "m"), "data": {"path": str(tree["outside"] / "d")},
              "output_dir": str(tree["outside"] / "o")}
    assert [e["loc"] for e in root_errors(None, str(tree["datasets"]), config)] == ["data.path"]
    assert [e["loc"] for e in root_errors(str(tree["models"]), None, config)] == ["model"]
    assert [e["loc"] for e in root_errors(None, None, config, str(tree["outputs"]))] == ["output_dir"]
    assert root_errors(None, None, config) == [] and root_errors("", "", config, "") == []
    assert root_errors(str(tree["models"]), str(tree["datasets"]), ["not", "a", "config"]) == []


def test_malformed_paths_are_refused_whether_or_not_roots_are_set(tree):
    long_name = "/tmp/" + "n" * 300
    config = {"model": "/m/a\x00b", "data": {"path": long_name}, "output_dir": "ok"}
    for roots in (None, str(tree["outputs"])):
        errors = root_errors(roots, roots, config, roots)
        assert errors == [
            {"loc": "model", "msg": f"{'/m/a' + chr(0) + 'b'!r} holds a NUL byte, which no path may hold"},
            {"loc": "data.path", "msg": f"{long_name[:240] + '…'!r} holds a name of 300 bytes; a file or folder name "
                                        "has at most 255 bytes on this host: shorten it"},
        ]


def test_a_relative_output_dir_is_taken_under_the_first_output_root(tree):
    roots = f"{tree['outputs']}:{tree['outputs_b']}"
    # ../b/c/x from the first root lands in the second root; from the second it would land outside both
    assert root_errors(None, None, {"output_dir": "../b/c/x"}, roots) == []
    assert root_errors(None, None, {"output_dir": "run/1"}, roots) == []
    [error] = root_errors(None, None, {"output_dir": "../outside/x"}, roots)
    quoted = str(tree["outputs"] / "../outside/x")
    assert error == {"loc": "output_dir", "msg": refusal(quoted, "output folder", roots, "SLIDEDP_OUTPUT_ROOTS")}
    # other keys are never taken relative to a root: a relative dataset is judged where the process runs
    [error] = root_errors(None, str(tree["datasets"]), {"data": {"path": "train.jsonl"}})
    assert error["msg"].startswith("'train.jsonl' is not inside")


def test_a_checkpoint_may_also_lie_in_the_jobs_folder_but_only_under_output_roots(tree):
    in_jobs = {"init_from": {"checkpoint": str(tree["jobs"] / "3" / "checkpoints" / "step-00000001")}}
    elsewhere = {"init_from": {"checkpoint": str(tree["outside"] / "step-00000001")}}
    outputs = str(tree["outputs"])
    assert root_errors(None, None, in_jobs, outputs, tree["data_dir"]) == []
    assert [e["loc"] for e in root_errors(None, None, in_jobs, outputs)] == ["init_from.checkpoint"]
    assert [e["loc"] for e in root_errors(None, None, elsewhere, outputs, tree["data_dir"])] == ["init_from.checkpoint"]
    assert root_errors(None, None, elsewhere, None, tree["data_dir"]) == []  # no output roots: unconfined
    # the jobs folder is for checkpoints only: an output folder there is still judged against the output roots
    out_in_jobs = {"output_dir": str(tree["jobs"] / "3")}
    assert [e["loc"] for e in root_errors(None, None, out_in_jobs, outputs, tree["data_dir"])] == ["output_dir"]


# --------------------------------------------------------------------------------------------- host RAM


def test_host_ram_gib_may_lower_the_hosts_limit_never_raise_it():
    def cfg(gib):
        return SimpleNamespace(host_ram_gib=gib)

    assert host_ram_error(cfg(None), 64 * GIB) is None
    assert host_ram_error(cfg(100), None) is None  # the host's limit unknown: the runtime judges
    assert host_ram_error(cfg(64), 64 * GIB) is None  # exactly the limit
    assert host_ram_error(cfg(0.5), 64 * GIB) is None
    assert host_ram_error(cfg(64.25), 64 * GIB) == {
        "loc": "host_ram_gib",
        "msg": "64.25 GiB is more than this host's limit of 64.0 GiB; host_ram_gib may only lower the limit: leave "
               "it out, or give at most that",
    }
    assert host_ram_error(cfg(1), GIB - 1) is not None


def test_the_home_folder_of_a_path_is_expanded_before_it_is_judged(tree, monkeypatch):
    monkeypatch.setenv("HOME", str(tree["datasets"].parent))
    assert root_errors(None, str(tree["datasets"]), {"data": {"path": "~/datasets/d.jsonl"}}) == []
    [error] = root_errors(None, str(tree["datasets"]), {"data": {"path": "~/outside//d/"}})
    assert error["loc"] == "data.path"
    assert error["msg"].startswith("'~/outside//d/' is not inside")  # quoted as sent, not as it was resolved
    assert root_errors(None, None, {"output_dir": "~/outputs/r"}, str(tree["outputs"])) == []
    [error] = root_errors(None, None, {"output_dir": "~/outputs/../outside"}, str(tree["outputs"]))
    assert error["msg"].startswith(f"{str(tree['outside'].parent / 'outputs/../outside')!r} is not inside")
