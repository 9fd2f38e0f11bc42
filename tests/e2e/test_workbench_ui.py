"""The workbench in a real browser against the real app: the embedded workbench (SQLite, a private Redis, one
local worker) started by the test, the UI built from frontend/, Debian's Chromium driven by Playwright."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from e2e_support import get_json as _get
from e2e_support import screenshot, start_workbench

pytestmark = [pytest.mark.e2e]

DEMO_STEPS = 40


@pytest.fixture(scope="module")
def workbench(frontend_dist, tmp_path_factory):
    with start_workbench(tmp_path_factory.mktemp("workbench")) as url:
        yield url


def _chart_points(page, chart_id: str) -> int:
    return int(page.get_attribute(f"#chart-{chart_id}", "data-points") or 0)


def _uplot_len(page, chart_id: str) -> int:
    """Points in the drawn uPlot series of a chart (x and every y series have the same length)."""
    return page.evaluate(
        """id => { const u = (window.__slidedpCharts || {})[id];
                   if (!u) return 0;
                   const lens = u.data.map(s => s.length);
                   return lens.every(l => l === lens[0]) ? lens[0] : -1; }""",
        chart_id,
    )


@pytest.mark.timeout(120)
def test_plan_preview_and_field_error_at_the_field(page, workbench):
    page.goto(workbench + "/jobs/new")
    preset = page.get_by_label("Preset", exact=True)
    preset.locator("option", has_text="CPU demo").wait_for(state="attached")
    assert preset.input_value() == "cpu-demo"
    # The preset filled the form; its labels are real labels.
    assert (
        page.get_by_label("Model (preset name or local directory)", exact=True).input_value() == "demo-qwen3"
    )
    assert float(page.get_by_label("Learning rate", exact=True).input_value()) == pytest.approx(3e-3)

    # Every control of the form has a label, and Tab walks the form in reading order.
    unlabelled = page.evaluate(
        """() => [...document.querySelectorAll('form.job-form input, form.job-form select')]
                 .filter(el => !el.labels.length && !el.getAttribute('aria-label')).map(el => el.id || el.name)"""
    )
    assert unlabelled == []
    preset.focus()
    order = []
    for _ in range(5):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.id"))
    assert order == ["f-name", "f-host", "f-model", "f-data-path", "f-data-format"]

    page.get_by_role("button", name="Plan").click()
    plan = page.locator("#plan-preview")
    plan.get_by_role("heading", name="Plan preview").wait_for()
    api_plan = _get_plan(workbench, page)
    # What the API planned is what the panel shows: a sentence per decision on top, and behind the details fold the
    # planner's own notes (its why) and the memory figures.
    assert "Replicated delivery" in plan.inner_text() and api_plan["why"] not in plan.inner_text()
    plan.get_by_text("Details: the planner's notes").click()
    plan.get_by_role("heading", name="Memory fit").first.wait_for()
    assert api_plan["why"] in plan.inner_text()

    # A negative learning rate: the API's 422 names optimizer.lr, and the error sits at that field.
    lr = page.get_by_label("Learning rate", exact=True)
    lr.fill("-1e-4")
    page.get_by_role("button", name="Submit job").click()
    err = page.locator('.field-error[data-field="optimizer.lr"]')
    err.wait_for(state="visible")
    assert "greater than 0" in err.inner_text()
    assert lr.get_attribute("aria-invalid") == "true"
    assert page.evaluate("document.activeElement && document.activeElement.id") == "f-optimizer-lr"
    assert page.url.endswith("/jobs/new"), "an invalid job must not be submitted"
    # Typing again clears the error; the plan button reports the same error for the same field.
    lr.fill("-2")
    assert not err.is_visible()
    page.get_by_role("button", name="Plan").click()
    err.wait_for(state="visible")
    # Chromium notes every 4xx answer in the console; the two deliberate 422s are the only entries allowed.
    notes = [e for e in page.console.errors if "Failed to load resource" in e]
    assert len(notes) == 2 and all("422" in e for e in notes), notes
    assert {e.rsplit("/", 1)[-1] for e in notes} == {"jobs", "plan"}
    assert page.console.unexpected(allowed=("status of 422",)) == []


def _get_plan(url: str, page) -> dict:
    body = page.evaluate("document.querySelector('.body-preview').textContent")
    req = urllib.request.Request(
        url + "/api/plan", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.timeout(300)
def test_demo_job_from_the_form_runs_live_to_completion(page, workbench):
    reopened = []
    page.on("request", lambda r: reopened.append(r.url) if "last_event_id=" in r.url else None)
    page.goto(workbench + "/jobs/new")
    page.get_by_label("Preset", exact=True).locator("option", has_text="CPU demo").wait_for(state="attached")
    page.get_by_label("Job name", exact=True).fill("browser demo")
    page.get_by_label("Steps", exact=True).fill(str(DEMO_STEPS))
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r".*/jobs/\d+$"))
    job_id = int(page.url.rstrip("/").split("/")[-1])
    page.get_by_role("heading", name=f"Job #{job_id} · browser demo").wait_for()

    # The charts grow while the job runs.
    page.wait_for_function(
        "() => (window.__slidedpCharts || {}).loss && window.__slidedpCharts.loss.data[0].length >= 2",
        timeout=150_000,
    )
    first = _uplot_len(page, "loss")
    # Break the live stream mid-run, as a refused reconnect would: it reopens after the last event it saw.
    status = page.locator(".title-row [data-status]").get_attribute("data-status")
    if status == "running":
        page.evaluate("window.__slidedpStream.drop()")
    page.wait_for_function(f"() => window.__slidedpCharts.loss.data[0].length > {first}", timeout=60_000)
    assert _uplot_len(page, "loss") > first >= 2

    page.locator('.title-row [data-status="completed"]').wait_for(timeout=240_000)
    page.wait_for_function(
        f"() => document.querySelector('#chart-loss').dataset.points === '{DEMO_STEPS}'", timeout=20_000
    )
    for chart in ("step-time", "throughput", "memory", "loss"):
        assert _chart_points(page, chart) == DEMO_STEPS
        assert _uplot_len(page, chart) == DEMO_STEPS, chart
    if status == "running":
        assert any(f"/api/jobs/{job_id}/events?last_event_id=" in u for u in reopened), reopened

    # What the charts hold is what the API stored.
    stored = _get(f"{workbench}/api/jobs/{job_id}/metrics?after_step=0&limit=1000")["items"]
    assert [r["step"] for r in stored] == list(range(1, DEMO_STEPS + 1))
    drawn_steps = page.evaluate("window.__slidedpCharts.loss.data[0]")
    assert drawn_steps == list(range(1, DEMO_STEPS + 1))
    drawn_loss = page.evaluate("window.__slidedpCharts.loss.data[1]")
    assert drawn_loss == pytest.approx([r["loss"] for r in stored])
    # The step-time chart stacks the measured phases.
    phases = [s for s in page.evaluate("window.__slidedpCharts['step-time'].series.map(s => s.label)")][1:]
    assert "forward" in phases and "backward" in phases and "step time" in phases

    # The log tail, the policy and the export link are on the page.
    assert page.locator("pre.log").inner_text().strip() != ""
    # Where the default tracker wrote (config report_to): the TensorBoard folder in the job's folder, and the command.
    events = Path(_get(f"{workbench}/api/jobs/{job_id}")["output_dir"], "tensorboard")
    assert page.locator("#job-tensorboard").inner_text() == f"{events}\ntensorboard --logdir {events}"
    assert list(events.glob("events.out.tfevents.*"))
    page.get_by_role("link", name="Download export").wait_for()
    screenshot(page, "job-page")

    # The jobs list shows it complete at its last step.
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Jobs").click()
    row = page.locator(f'tr[data-job-id="{job_id}"]')
    row.locator('[data-status="completed"]').wait_for()
    assert f"{DEMO_STEPS} / {DEMO_STEPS}" in row.inner_text()
    assert page.console.unexpected() == []


@pytest.mark.timeout(240)
def test_diverged_run_fails_with_its_reason_and_non_finite_values_do_not_break_the_page(page, workbench):
    """A learning rate of 1e6 makes the demo model's numbers non-finite within a step or two: the run ends failed,
    the page says where and why at the top, and the charts draw the finite steps around the nulls."""
    steps = 8
    page.goto(workbench + "/jobs/new")
    page.get_by_label("Preset", exact=True).locator("option", has_text="CPU demo").wait_for(state="attached")
    page.get_by_label("Job name", exact=True).fill("diverges")
    page.get_by_label("Steps", exact=True).fill(str(steps))
    page.get_by_label("Warmup steps", exact=True).fill("0")
    page.get_by_label("Learning rate", exact=True).fill("1e6")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r".*/jobs/\d+$"))
    job_id = int(page.url.rstrip("/").split("/")[-1])
    page.locator('.title-row [data-status="failed"]').wait_for(timeout=200_000)

    job = _get(f"{workbench}/api/jobs/{job_id}")
    reason = re.fullmatch(r"diverged: (.+) at step (\d+)", job["error"]["message"])
    assert reason, job["error"]
    bad_step = int(reason.group(2))
    stored = _get(f"{workbench}/api/jobs/{job_id}/metrics?after_step=0&limit=100")["items"]
    assert stored and stored[-1]["step"] < steps, "the run was expected to stop early"
    # Non-finite numbers are stored as null; the diverged step is one of them.
    assert any(r["step"] == bad_step and (r.get("loss") is None or r.get("grad_norm") is None) for r in stored)

    # The reason, in red at the top of the page, above the summary and the charts; no second error box.
    banner = page.locator("#diverged")
    banner.wait_for()
    assert banner.locator(".diverged-title").inner_text() == f"Diverged at step {bad_step}: {reason.group(1)}"
    assert banner.get_attribute("role") == "alert"
    top = banner.bounding_box()["y"]
    assert top < page.locator(".summary").bounding_box()["y"] < page.locator("section.charts").bounding_box()["y"]
    assert banner.evaluate("el => getComputedStyle(el).color") == "rgb(180, 35, 24)"  # --bad
    assert page.get_by_text("Error: diverged").count() == 0

    # Every stored step is on the charts: the finite values drawn as stored, the nulls as gaps.
    page.wait_for_function(
        f"() => document.querySelector('#chart-loss').dataset.drawn === '{len(stored)}'", timeout=20_000
    )
    for chart, key in (("loss", "loss"), ("grad-norm", "grad_norm")):
        assert _uplot_len(page, chart) == len(stored), chart
        drawn = page.evaluate(f"window.__slidedpCharts[{chart!r}].data[1]")
        for rec, value in zip(stored, drawn, strict=True):
            if rec.get(key) is None:
                assert value is None, (chart, rec["step"])
            else:
                assert value == pytest.approx(rec[key]), (chart, rec["step"])
    bad_loss = [r["step"] for r in stored if r.get("loss") is None]
    note = page.locator("#chart-loss .chart-note")
    if bad_loss:
        assert f"Loss is not a finite number at {len(bad_loss)} step" in note.inner_text()
        assert f"first: step {bad_loss[0]}" in note.inner_text()
    if stored[-1].get("loss") is None:
        assert page.locator(".summary").get_by_text("NaN", exact=True).is_visible()
    # The page still works: the log tail and the resume button are there, and nothing threw.
    assert page.locator("pre.log").inner_text().strip() != ""
    assert page.locator(".page-head").get_by_role("button", name="Resume").is_visible()
    assert page.console.unexpected() == []


@pytest.mark.timeout(60)
def test_hosts_page_draws_the_worker_topology(page, workbench):
    hosts = _get(workbench + "/api/hosts")["items"]
    assert hosts, "the embedded worker reports its host"
    topo = hosts[0]["topology"]
    page.goto(workbench + "/hosts")
    card = page.get_by_role("article", name=f"Host {hosts[0]['name']}")
    card.wait_for()
    diagram = card.locator("svg.topology")
    assert diagram.is_visible()
    text = diagram.text_content()
    # The figures drawn are the host's own: its CPU cores and RAM limit, its GPUs (none on a CPU machine).
    assert f"{topo['cpu']['cores']} CPU cores" in text
    shown = re.search(r"([\d,.]+) GiB host RAM", text)
    assert shown, text
    assert float(shown.group(1).replace(",", "")) == pytest.approx(
        topo["host_ram"]["limit_bytes"] / 2**30, rel=0.01
    )
    if not topo["gpus"]:
        assert "No GPU reported" in text
    else:
        assert f"GPU {len(topo['gpus']) - 1}" in text
    assert page.console.unexpected() == []


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.timeout(300)
def test_cancel_with_checkpoint_resume_and_delete_from_the_ui(page, workbench):
    demo = next(p for p in _get(workbench + "/api/presets")["items"] if p["id"] == "cpu-demo")["config"]
    job = _post(workbench + "/api/jobs", {**demo, "steps": 5000, "name": "long run"})
    jid = job["id"]
    page.goto(f"{workbench}/jobs/{jid}")
    page.wait_for_function(
        "() => (window.__slidedpCharts || {}).loss && window.__slidedpCharts.loss.data[0].length >= 3",
        timeout=150_000,
    )

    # Cancel, saving a checkpoint: two presses (no modal dialog), then the job stops at a step boundary.
    page.get_by_label("save a checkpoint").check()
    cancel = page.locator(".title-row").locator("..").get_by_role("button", name="Cancel")
    cancel.click()
    page.get_by_role("button", name="Confirm cancel").click()
    page.locator('.title-row [data-status="cancelled"]').wait_for(timeout=120_000)
    ckpt = page.get_by_role("region", name="Checkpoints and export").locator("tbody tr")
    ckpt.first.wait_for(timeout=20_000)
    saved = _get(f"{workbench}/api/jobs/{jid}/checkpoints")["items"]
    assert saved and saved[0]["name"] in ckpt.first.inner_text()
    stopped_at = _chart_points(page, "loss")

    # Resume continues from the checkpoint: the same page follows the new run live.
    page.get_by_role("button", name="Resume").click()
    page.wait_for_function(
        f"() => Number(document.querySelector('#chart-loss').dataset.points) > {stopped_at + 2}",
        timeout=150_000,
    )
    assert page.locator(".title-row [data-status]").get_attribute("data-status") == "running"
    # A fresh page replays the whole history (the first attempt ended "cancelled") and still follows the run.
    page.reload()
    page.wait_for_function(
        "() => (window.__slidedpCharts || {}).loss && window.__slidedpCharts.loss.data[0].length > 0",
        timeout=30_000,
    )
    reloaded_at = _chart_points(page, "loss")
    page.wait_for_function(
        f"() => Number(document.querySelector('#chart-loss').dataset.points) > {reloaded_at + 2}",
        timeout=60_000,
    )
    assert page.locator(".title-row [data-status]").get_attribute("data-status") == "running"
    assert page.locator("#stream-state").get_attribute("data-state") == "open"

    # From the jobs list: cancel it again, then delete it. The job page left behind reads the job no more (a read
    # it had armed used to outlive it and, landing after the delete, logged a 404).
    job_url = f"{workbench}/api/jobs/{jid}"
    reads_after_leaving: list[str] = []
    page.on("request", lambda r: r.url == job_url and reads_after_leaving.append(r.method))
    left_at = time.monotonic()
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Jobs").click()
    row = page.locator(f'tr[data-job-id="{jid}"]')
    row.get_by_role("button", name="Cancel").click()
    row.get_by_role("button", name="Confirm cancel").click()
    row.locator('[data-status="cancelled"]').wait_for(timeout=120_000)
    # A list read on its way when the delete lands still names the job: held until the delete has answered, it
    # must not bring the row (and its Delete button) back.
    listing = re.compile(r"/api/jobs\?")
    held: list = []  # the list read held, and its answer read before the delete

    def hold_first(route):
        if held:
            route.continue_()
        else:
            held.append((route, route.fetch()))

    page.route(listing, hold_first)
    deadline = time.monotonic() + 10
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert held, "the jobs list polls"
    row.get_by_role("button", name="Delete").click()
    row.get_by_role("button", name="Confirm delete").click()
    row.wait_for(state="detached")
    route, listed = held[0]
    assert jid in [j["id"] for j in listed.json()["items"]]
    route.fulfill(response=listed)
    page.wait_for_timeout(max(500, 1000 * (3.5 - (time.monotonic() - left_at))))  # past a timer the left page armed
    assert page.locator(f'tr[data-job-id="{jid}"]').count() == 0
    page.unroute(listing)
    assert reads_after_leaving == ["DELETE"]
    with pytest.raises(urllib.error.HTTPError) as gone:
        _get(job_url)
    assert gone.value.code == 404
    assert page.console.unexpected() == []


@pytest.mark.timeout(240)
def test_delete_from_the_job_page_sends_one_delete_and_reads_the_job_no_more(page, workbench):
    """Confirm delete on the job page: one DELETE, then the jobs list, and no read of the job after it (a read
    would answer 404 and the browser would log it)."""
    demo = next(p for p in _get(workbench + "/api/presets")["items"] if p["id"] == "cpu-demo")["config"]
    job = _post(workbench + "/api/jobs", {**demo, "steps": 5000, "name": "to delete"})
    jid = job["id"]
    job_url = f"{workbench}/api/jobs/{jid}"
    _post(job_url + "/cancel", {"save": False})
    deadline = time.monotonic() + 120
    while job["status"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.5)
        job = _get(job_url)
    assert job["status"] == "cancelled", job

    sent: list[str] = []
    page.on("request", lambda r: r.url == job_url and sent.append(r.method))
    page.goto(f"{workbench}/jobs/{jid}")
    head = page.locator(".page-head")
    head.get_by_role("button", name="Delete").click()
    head.get_by_role("button", name="Confirm delete").click()
    page.wait_for_url(f"{workbench}/jobs")
    page.get_by_role("heading", name="Jobs").wait_for()
    page.wait_for_timeout(3500)  # past the job page's timed read
    assert sent.count("DELETE") == 1 and sent[-1] == "DELETE", sent
    assert page.locator(f'tr[data-job-id="{jid}"]').count() == 0
    assert page.console.unexpected() == []


def _job_to_try(url: str) -> dict:
    """A completed CPU demo job with an export: the one the form run above left, else a short one made now."""
    for job in _get(url + "/api/jobs?status=completed")["items"]:
        if job["config"].get("export") and job["config"]["data"]["format"] == "prompt_completion":
            return job
    demo = next(p for p in _get(url + "/api/presets")["items"] if p["id"] == "cpu-demo")["config"]
    job = _post(url + "/api/jobs", {**demo, "name": "try me", "steps": 2, "schedule": {"warmup_steps": 0}})
    deadline = time.monotonic() + 180
    while job["status"] not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.5)
        job = _get(f"{url}/api/jobs/{job['id']}")
    assert job["status"] == "completed", job
    return job


@pytest.mark.timeout(300)
def test_the_prompt_box_answers_with_the_jobs_model(page, workbench):
    """The job page's prompt box: what the API refuses is said at the box, and a prompt is answered by the job's
    export on its host (the answer shown is the one the API recorded)."""
    job = _job_to_try(workbench)
    page.goto(f"{workbench}/jobs/{job['id']}")
    box = page.get_by_role("region", name="Try the model")
    box.wait_for()
    assert box.get_by_label("Model").input_value() == ""  # the export first
    # The browser's own checks catch numbers out of range; a blank prompt passes them and the API says why.
    box.get_by_label("Prompt").fill("   ")
    box.get_by_role("button", name="Generate").click()
    box.get_by_role("alert").get_by_text("prompt: is required: the text for the model to answer").wait_for()

    box.get_by_label("Prompt").fill("3 + 5 =")
    box.get_by_label("Max new tokens").fill("6")
    box.get_by_role("button", name="Generate").click()
    status = page.locator("#gen-status")
    page.locator('#gen-status[data-status="done"]').wait_for(timeout=120_000)
    gen = _get(f"{workbench}/api/jobs/{job['id']}/generations/{status.get_attribute('data-generation')}")
    assert gen["status"] == "done" and gen["max_new_tokens"] == 6 and gen["checkpoint"] is None
    assert page.locator("#gen-answer").inner_text() == gen["text"]
    assert status.inner_text().startswith(f"Answered on {gen['host']} ({gen['new_tokens']} tokens")
    assert page.locator("#gen-formatted").text_content() == "3 + 5 ="  # the demo trains prompt_completion
    screenshot(page, "generate-box")
    assert page.console.unexpected(allowed=("status of 422",)) == []  # the blank prompt's answer
