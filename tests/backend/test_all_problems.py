"""Every problem of a job request in one answer: the config keys, the model and dataset of the keys that did
parse, the host's limits and GPUs; and the plan preview opening with what blocks the job and what to watch, never
calling a job it would refuse feasible. Against the real API with a real Redis (no worker: nothing is run)."""

from __future__ import annotations

import httpx
import pytest
from backend_support import tiny_job

pytestmark = pytest.mark.timeout(120)


def problems(resp: httpx.Response) -> dict[str, str]:
    """{"optimizer.lr": msg, ...} of a 422."""
    assert resp.status_code == 422, resp.text
    out = {}
    for e in resp.json()["detail"]:
        assert e["loc"][0] == "body", e
        key = ".".join(str(p) for p in e["loc"][1:])
        assert key not in out, f"{key} answered twice: {resp.text}"
        out[key] = e["msg"]
    return out


def nothing_created(client: httpx.Client) -> None:
    assert client.get("/api/jobs").json()["total"] == 0


@pytest.mark.parametrize("path", ["/api/jobs", "/api/plan"])
def test_a_missing_model_is_reported_with_a_bad_seq_len(client, dataset, path):
    found = problems(client.post(path, json=tiny_job(dataset, model="/models/nope", seq_len=0)))
    assert set(found) == {"seq_len", "model"}
    assert "greater than 0" in found["seq_len"]
    assert "/models/nope does not exist" in found["model"]
    nothing_created(client)


@pytest.mark.parametrize("path", ["/api/jobs", "/api/plan"])
def test_bad_steps_a_negative_lr_and_a_missing_dataset_come_in_one_answer(client, dataset, tmp_path, path):
    missing = tmp_path / "no-such.jsonl"
    body = tiny_job(dataset, steps="abc", optimizer={"lr": -1}, data={"path": str(missing), "format": "tokens"})
    found = problems(client.post(path, json=body))
    assert set(found) == {"steps", "optimizer.lr", "data.path"}
    assert "must be an integer, got 'abc'" in found["steps"]
    assert "greater than 0" in found["optimizer.lr"]
    assert f"{missing} does not exist" in found["data.path"]
    nothing_created(client)


def test_a_dataset_that_parsed_is_read_whatever_else_is_wrong(client, dataset, tmp_path):
    # seq_len did not parse: the rows are still read (not measured against a default length).
    bad_rows = tmp_path / "bad.jsonl"
    bad_rows.write_text('{"input_ids": [1, 2]}\n{"no_ids": 1}\n')
    found = problems(
        client.post("/api/jobs", json=tiny_job(dataset, seq_len="long", data={"path": str(bad_rows)}))
    )
    assert set(found) == {"seq_len", "data.path"}
    assert "line 2" in found["data.path"] and "input_ids" in found["data.path"]
    # The good dataset with seq_len bad: only seq_len (its 32-token rows are not judged against a default).
    assert set(problems(client.post("/api/jobs", json=tiny_job(dataset, seq_len=0)))) == {"seq_len"}
    # A format that did not parse: the file is not read as some other format, but a missing one is said.
    body = tiny_job(dataset, data={"path": str(tmp_path / "gone.jsonl"), "format": "csv"})
    assert set(problems(client.post("/api/jobs", json=body))) == {"data.format", "data.path"}
    nothing_created(client)


def test_host_limits_come_with_the_config_errors(client, dataset):
    import os

    cores = os.cpu_count() or 1
    body = tiny_job(dataset, optimizer={"lr": "fast"}, cpu_threads=cores + 1, host_ram_gib=2**19)
    found = problems(client.post("/api/jobs", json=body))
    assert set(found) == {"optimizer.lr", "cpu_threads", "host_ram_gib"}
    assert f"at most {cores}" in found["cpu_threads"] and "may only lower" in found["host_ram_gib"]
    # A key that did not parse is not judged against the host: ranks is only limited when gpus is known.
    found = problems(client.post("/api/jobs", json=tiny_job(dataset, gpus="two", ranks=4 * cores + 1)))
    assert set(found) == {"gpus"}
    nothing_created(client)


def test_the_preview_of_a_job_with_a_missing_dataset_opens_with_it_and_is_not_feasible(client, dataset, tmp_path):
    missing = tmp_path / "gone.jsonl"
    resp = client.post("/api/plan", json=tiny_job(dataset, data={"path": str(missing), "format": "tokens"}))
    assert resp.status_code == 200, resp.text
    plan = resp.json()
    assert list(plan)[:4] == ["problems", "warnings", "feasible", "fits"]
    assert plan["problems"][0]["loc"] == "data.path" and "does not exist" in plan["problems"][0]["msg"]
    assert plan["feasible"] is False
    assert plan["fits"] is True and plan["policy"] is not None  # the plan itself is still shown, below
    # The same job with its dataset: nothing blocks it, and it is feasible.
    plan = client.post("/api/plan", json=tiny_job(dataset)).json()
    assert plan["problems"] == [] and plan["warnings"] == [] and plan["feasible"] is True and plan["fits"] is True


def test_the_preview_warns_of_a_dataset_small_for_the_steps(client, dataset):
    plan = client.post("/api/plan", json=tiny_job(dataset, steps=100, micro_batch_size=2)).json()
    assert plan["problems"] == [] and plan["feasible"] is True
    (warning,) = plan["warnings"]
    assert warning["loc"] == "data.path"
    assert "64 rows" in warning["msg"] and "200" in warning["msg"] and "3.1 times" in warning["msg"]


def test_gpus_above_the_reported_host_come_with_the_dataset_and_config_errors(client, dataset, settings, tmp_path):
    """Last in this module: from here on the API has a reported host with 2 GPUs."""
    from slidedp_web import hosts

    topology = {
        **hosts.basic_topology(settings),
        "source": "slidedp.planning.topology",
        "gpus": [{"index": i, "name": "test GPU", "hbm_bytes": 80 * 2**30} for i in range(2)],
    }
    hosts.report(settings, topology=topology, started=True)
    missing = tmp_path / "gone.jsonl"
    data = {"path": str(missing), "format": "tokens"}
    # The config parsed: the planner refuses the GPUs, next to the dataset.
    found = problems(client.post("/api/jobs", json=tiny_job(dataset, gpus=8, data=data)))
    assert set(found) == {"gpus", "data.path"}
    assert "asks for 8 GPUs but this host has 2" in found["gpus"]
    # It did not parse (steps): the GPUs are still counted.
    found = problems(client.post("/api/jobs", json=tiny_job(dataset, gpus=8, steps=-1, data=data)))
    assert set(found) == {"gpus", "steps", "data.path"}
    assert "asks for 8 GPUs but this host has 2" in found["gpus"]
    # The preview lists both at its top, and the job is not feasible.
    plan = client.post("/api/plan", json=tiny_job(dataset, gpus=8, data=data)).json()
    assert [p["loc"] for p in plan["problems"]] == ["data.path", "gpus"]
    assert plan["feasible"] is False and plan["fits"] is False
    nothing_created(client)


def test_little_headroom_in_a_feasible_plan_is_a_warning():
    from slidedp_web.planning import plan_warnings

    def plan(hbm, host, feasible=True):
        return {"feasible": feasible, "predicted": {"hbm_peak_gib": hbm, "host_ram_gib": host},
                "job": {"hbm_budget_gib": 100.0, "host_limit_gib": 200.0}}

    assert plan_warnings(plan(80.0, 150.0)) == []
    (gpu, ram) = plan_warnings(plan(95.0, 190.0))
    assert gpu["loc"] == "micro_batch_size" and "95.0 GiB of the 100.0 GiB" in gpu["msg"] and "95%" in gpu["msg"]
    assert ram["loc"] == "host_ram_gib" and "190.0 GiB of the 200.0 GiB" in ram["msg"]
    assert plan_warnings(plan(None, 190.0))[0]["loc"] == "host_ram_gib"  # a CPU job has no GPU peak
    assert plan_warnings(plan(95.0, 190.0, feasible=False)) == []  # a refusal says so itself
