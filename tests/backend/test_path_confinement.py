"""Every path a job names goes through one check (slidedp_web.guards.root_errors), at the API and again in the job
process (preflight.preflight): model, data.path, eval.path, output_dir and an init_from checkpoint path. Outside the
roots a path is refused before anything reads it, with the same answer whether it exists, is a folder or is
missing; a path that cannot name a file (a name over 255 bytes, a loop of symlinks) is a 422 naming its key, never
a 500; a folder that shares a root's name as a prefix is outside it; relative output folders stay out of the data
folder's own files; and no answer repeats more than a short piece of what was sent."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from backend_support import ApiServer, make_settings, tiny_job, tokens_dataset

ROOTS_MSG = "is not inside the folders allowed"
LONG = "n" * 300  # one name over NAME_MAX (255 bytes)


@pytest.fixture(scope="module")
def roots(module_dir) -> dict[str, Path]:
    """The roots, a sibling of each that shares its name as a prefix (models2 beside models), and a folder
    outside all of them."""
    base = module_dir / "roots"
    out = {n: base / n for n in ("models", "datasets", "outputs", "models2", "datasets2", "outputs2", "outside")}
    for path in out.values():
        path.mkdir(parents=True)
    return out


@pytest.fixture(scope="module")
def settings(module_dir, redis_server, roots):
    return make_settings(
        module_dir / "data",
        redis_server.url,
        model_roots=str(roots["models"]),
        data_roots=str(roots["datasets"]),
        output_roots=str(roots["outputs"]),
    )


@pytest.fixture(scope="module")
def open_settings(module_dir, redis_server):
    """A deployment without roots (a loopback workbench): unconfined, but still judged for well-formed paths."""
    return make_settings(module_dir / "open-data", redis_server.url)


@pytest.fixture(scope="module")
def open_client(open_settings):
    with ApiServer(open_settings) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def model_dir(path: Path) -> Path:
    from slidedp.presets import PRESETS

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(PRESETS["tiny-qwen3"]))
    (path / "model.safetensors").write_bytes(b"")
    return path


def secret(path: Path) -> Path:
    """A file the server can read that holds something a caller must not learn: token ids the model does not
    have (which the dataset validator would quote) and a recognisable word."""
    path.write_text(json.dumps({"input_ids": [31337] * 40, "note": "hunter2"}) + "\n")
    return path


def messages(resp: httpx.Response) -> dict[tuple, str]:
    assert resp.status_code == 422, resp.text
    return {tuple(e["loc"]): e["msg"] for e in resp.json()["detail"]}


def with_eval(dataset: Path, eval_path: str, **overrides) -> dict:
    return tiny_job(dataset, eval={"path": eval_path, "interval": 2}, **overrides)


def test_eval_path_outside_the_data_roots_is_refused_without_being_read(client, roots):
    data = tokens_dataset(roots["datasets"] / "train.jsonl")
    held_out = tokens_dataset(roots["datasets"] / "held.jsonl", seed=1)
    ok = client.post("/api/jobs", json=with_eval(data, str(held_out)))
    assert ok.status_code == 201, ok.text
    assert ok.json()["config"]["eval"]["path"] == str(held_out)

    leaked = secret(roots["outside"] / "secret.jsonl")
    missing = roots["outside"] / "nothing-here.jsonl"
    folder = roots["outside"]
    answers = []
    for path in (leaked, missing, folder):
        for route in ("/api/jobs", "/api/plan"):
            resp = client.post(route, json=with_eval(data, str(path)))
            msg = messages(resp)[("body", "eval", "path")]
            assert ROOTS_MSG in msg and "SLIDEDP_DATA_ROOTS" in msg, msg
            # Nothing of the file, nor whether it is there: the validator never ran on it.
            for word in ("31337", "hunter2", "vocabulary", "line 1", "does not exist", "directory"):
                assert word not in resp.text, (word, resp.text)
            answers.append(msg.replace(str(path), "P"))
    assert len(set(answers)) == 1, answers
    # Through a symlink inside the root, likewise, and where it leads is not told.
    link = roots["datasets"] / "held-link.jsonl"
    link.symlink_to(leaked)
    resp = client.post("/api/jobs", json=with_eval(data, str(link)))
    assert ROOTS_MSG in messages(resp)[("body", "eval", "path")] and str(leaked) not in resp.text
    assert "31337" not in resp.text


@pytest.mark.parametrize("key", ["model", "data.path", "eval.path", "output_dir", "init_from.checkpoint"])
def test_every_path_key_outside_its_roots_is_refused_by_name(client, roots, key):
    data = tokens_dataset(roots["datasets"] / f"k-{key}.jsonl")
    outside = roots["outside"]
    job = {
        "model": tiny_job(data, model=str(model_dir(outside / "m"))),
        "data.path": tiny_job(secret(outside / "d.jsonl")),
        "eval.path": with_eval(data, str(secret(outside / "e.jsonl"))),
        "output_dir": tiny_job(data, output_dir=str(outside / "run")),
        "init_from.checkpoint": tiny_job(data, init_from={"checkpoint": str(outside / "step-00000001")}),
    }[key]
    msg = messages(client.post("/api/jobs", json=job))[("body", *key.split("."))]
    assert ROOTS_MSG in msg, msg


@pytest.mark.parametrize("key", ["model", "data.path", "eval.path", "output_dir"])
def test_a_sibling_folder_sharing_a_roots_prefix_is_outside_it(client, roots, key):
    """/x/models2/m is not in /x/models: roots are compared by path components, not by text."""
    data = tokens_dataset(roots["datasets"] / f"s-{key}.jsonl")
    job = {
        "model": tiny_job(data, model=str(model_dir(roots["models2"] / "m"))),
        "data.path": tiny_job(tokens_dataset(roots["datasets2"] / "d.jsonl")),
        "eval.path": with_eval(data, str(tokens_dataset(roots["datasets2"] / "e.jsonl"))),
        "output_dir": tiny_job(data, output_dir=str(roots["outputs2"] / "run")),
    }[key]
    msg = messages(client.post("/api/jobs", json=job))[("body", *key.split("."))]
    assert ROOTS_MSG in msg, msg
    # The same paths inside the roots themselves are accepted.
    inside = {
        "model": tiny_job(data, model=str(model_dir(roots["models"] / "m"))),
        "data.path": tiny_job(data),
        "eval.path": with_eval(data, str(tokens_dataset(roots["datasets"] / "e.jsonl"))),
        "output_dir": tiny_job(data, output_dir=str(roots["outputs"] / f"run-{key}")),
    }[key]
    resp = client.post("/api/plan", json=inside)
    assert resp.status_code == 200, resp.text


def test_root_errors_compare_roots_by_path_components(roots):
    from slidedp_web.guards import root_errors

    config = {
        "model": str(roots["models2"] / "m"),
        "data": {"path": str(roots["datasets2"] / "d.jsonl")},
        "eval": {"path": str(roots["datasets2"] / "e.jsonl")},
        "output_dir": str(roots["outputs2"] / "r"),
        "init_from": {"checkpoint": str(roots["outputs2"] / "c")},
    }
    errors = root_errors(str(roots["models"]), str(roots["datasets"]), config, str(roots["outputs"]))
    assert [e["loc"] for e in errors] == ["model", "data.path", "eval.path", "output_dir", "init_from.checkpoint"]


@pytest.mark.parametrize("route", ["/api/jobs", "/api/plan"])
@pytest.mark.parametrize("key", ["output_dir", "data.path", "model", "eval.path"])
@pytest.mark.parametrize("confined", [True, False], ids=["roots", "no-roots"])
def test_a_name_over_255_bytes_is_a_422_naming_the_field(client, open_client, roots, route, key, confined):
    data = tokens_dataset(roots["datasets"] / "long.jsonl")
    where = roots["datasets"] if key != "output_dir" else roots["outputs"]
    value = str(where / LONG / "x")
    job = {
        "output_dir": tiny_job(data, output_dir=value),
        "data.path": tiny_job(value),
        "model": tiny_job(data, model=value),
        "eval.path": with_eval(data, value),
    }[key]
    resp = (client if confined else open_client).post(route, json=job)
    msg = messages(resp)[("body", *key.split("."))]
    assert "holds a name of 300 bytes" in msg and "at most 255 bytes" in msg, msg


def test_a_loop_of_symlinks_is_refused_not_a_500(client, roots):
    loop = roots["datasets"] / "loop"
    loop.symlink_to(loop)
    data = tokens_dataset(roots["datasets"] / "l.jsonl")
    for job, key in (
        (tiny_job(str(loop / "x.jsonl")), ("body", "data", "path")),
        (with_eval(data, str(loop)), ("body", "eval", "path")),
        (tiny_job(data, model=str(loop / "m")), ("body", "model")),
    ):
        assert key in messages(client.post("/api/jobs", json=job))


def test_the_job_process_checks_every_path_again(settings, roots):
    """preflight: what the job process runs before it starts, with its own worker's settings."""
    from slidedp_web.preflight import preflight

    data = tokens_dataset(roots["datasets"] / "p.jsonl")
    leaked = secret(roots["outside"] / "pre.jsonl")
    assert preflight(settings, with_eval(data, str(roots["datasets"] / "p.jsonl")), None) == []
    [error] = preflight(settings, with_eval(data, str(leaked)), None)
    assert error["loc"] == "eval.path" and ROOTS_MSG in error["msg"] and "31337" not in error["msg"]
    [error] = preflight(settings, tiny_job(data, output_dir=str(roots["outputs"] / LONG)), None, job_id=3)
    assert error["loc"] == "output_dir" and "at most 255 bytes" in error["msg"]
    [error] = preflight(settings, tiny_job(data, model=str(roots["models2"] / "m")), None)
    assert error["loc"] == "model" and ROOTS_MSG in error["msg"]


def test_relative_output_dirs_without_roots_go_under_the_jobs_folder(open_client, open_settings, roots):
    """`"output_dir": "api-token"` once made a folder where `slidedp serve` writes its token file."""
    data = tokens_dataset(roots["outside"] / "rel.jsonl")  # no roots here: any readable dataset
    named = open_settings.jobs_dir / "named"
    resp = open_client.post("/api/jobs", json=tiny_job(data, output_dir="api-token"))
    assert resp.status_code == 201, resp.text
    assert resp.json()["output_dir"] == str(named / "api-token")
    assert not (open_settings.data_dir / "api-token").exists()
    nested = open_client.post("/api/jobs", json=tiny_job(data, output_dir="team/run-1"))
    assert nested.json()["output_dir"] == str(named / "team" / "run-1")
    # Nothing else of the data folder: neither by an absolute path nor by climbing out of the named folder.
    data_dir = open_settings.data_dir.resolve()
    for value in (
        str(data_dir / "api-token"),
        str(data_dir / "logs"),
        "../../slidedp.db",
        "../../api-token",
        "../7",
        "..",
        str(named),
    ):
        resp = open_client.post("/api/jobs", json=tiny_job(data, output_dir=value))
        assert resp.status_code in (409, 422), (value, resp.text)  # 422: the database file is no folder
        assert resp.json()["detail"][0]["loc"] == ["body", "output_dir"]
    assert sorted(p.name for p in data_dir.iterdir() if p.name == "api-token") == []


def test_errors_quote_at_most_a_short_piece_of_what_was_sent(client, open_client, roots):
    huge = "p" * 100_000
    resp = client.post("/api/plan", json={**tiny_job(roots["datasets"] / "x.jsonl"), "profile": huge})
    detail = messages(resp)[("body", "profile")]
    assert "p" * 80 + "…" in detail and "p" * 81 not in detail, detail[:300]
    assert len(resp.content) < 4000
    from slidedp.planning import profiles

    with pytest.raises(profiles.ProfileError) as raised:
        profiles.load(huge, allow_path=False)
    assert len(str(raised.value)) < 1000
    # A path is quoted further (its folder must stay recognisable), still not without end.
    resp = client.post("/api/jobs", json=tiny_job(str(roots["outside"]) + "/" + "q/" * 1500 + "x.jsonl"))
    assert len(resp.content) < 4000, len(resp.content)
