"""The job page before the first step and after the last, in a real browser against the real app (the embedded
workbench, CPU demo jobs run by its worker): where the start-up is, in words, until the first step, then how long
it took; a job that completed with health warnings is said so, in the list and on its page; a cancel asked for is
still said after a reload."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal

import pytest
from e2e_support import get_json as _get
from e2e_support import screenshot, start_workbench

pytestmark = [pytest.mark.e2e]

HEADLINES = {
    "queued": "Queued — waiting for the worker",
    "launching": "Starting the job's process",
    "preparing": "Preparing (loading the runtime)",
    "planning": "Planning the execution policy",
    "calibrating": "Calibrating this host (cached for the next runs)",
    "building_host_state": "Building the host state",
    "starting_ranks": "Starting the rank processes",
    "first_step": "Running the first step",
}
ORDER = list(HEADLINES)


def _tenths(sec: float) -> str:
    """A number of seconds to one decimal as the page writes it (JavaScript's toFixed: the float's exact value,
    a tie going up), not as Python's format does (a tie going to even: 15.25 is "15.2" there, "15.3" on the page)."""
    return str(Decimal(sec).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


@pytest.fixture(scope="module")
def workbench(frontend_dist, tmp_path_factory):
    with start_workbench(tmp_path_factory.mktemp("stage")) as url:
        yield url


def _post(url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body or {}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _demo(url: str, *, lr: float | None = None, warmup: int | None = None, **changes) -> dict:
    """The CPU demo preset with `changes`; no export."""
    demo = next(p for p in _get(url + "/api/presets")["items"] if p["id"] == "cpu-demo")["config"]
    job = {**demo, "export": False, **changes}
    if lr is not None:
        job["optimizer"] = {**demo["optimizer"], "lr": lr}
    if warmup is not None:
        job["schedule"] = {**demo["schedule"], "warmup_steps": warmup}
    return job


def _wait_status(url: str, jid: int, statuses: set[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    job = _get(f"{url}/api/jobs/{jid}")
    while job["status"] not in statuses and time.monotonic() < deadline:
        time.sleep(0.5)
        job = _get(f"{url}/api/jobs/{jid}")
    assert job["status"] in statuses, job
    return job


# Every change of the start-up line, as the page showed it: "<data-stage>|<words>|<clock labels>".
WATCH_STAGE = """() => {
  window.__stagesSeen = [];
  const note = () => {
    const el = document.querySelector('#job-stage');
    if (!el || el.hidden) return;
    const name = (el.querySelector('.stage-name') || {}).textContent || '';
    const clocks = [...el.querySelectorAll('[data-clock]')].map(d => d.dataset.clock).join(',');
    const s = `${el.dataset.stage}|${name}|${clocks}`;
    const seen = window.__stagesSeen;
    if (seen[seen.length - 1] !== s) seen.push(s);
  };
  note();
  new MutationObserver(note).observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
}"""


@pytest.mark.timeout(400)
def test_the_start_is_said_in_words_until_the_first_step_then_summed_up(page, workbench):
    # A job ahead of it keeps the worker busy (one job at a time): the job waits in the queue first.
    blocker = _post(workbench + "/api/jobs", _demo(workbench, steps=5000, name="ahead"))
    job = _post(workbench + "/api/jobs", _demo(workbench, steps=3, warmup=0, name="starts"))
    jid = job["id"]
    page.goto(f"{workbench}/jobs/{jid}")
    line = page.locator("#job-stage")
    line.locator(".stage-name", has_text="Queued — waiting for the worker").wait_for()
    assert line.get_attribute("data-stage") == "queued"
    assert line.locator('[data-clock="queued"]').is_visible()
    assert "No step yet." in page.locator("#chart-loss").inner_text()
    assert page.locator("#startup-summary").count() == 0
    page.evaluate(WATCH_STAGE)

    _wait_status(workbench, blocker["id"], {"running"}, 120)
    _post(f"{workbench}/api/jobs/{blocker['id']}/cancel")
    # Preparing alone (loading the runtime) takes seconds: the line is seen in a stage of the start.
    page.locator("#job-stage:not([data-stage='queued'])").wait_for(timeout=120_000)
    summary = page.locator("#startup-summary")
    summary.wait_for(timeout=240_000)
    line.wait_for(state="hidden")

    seen = [s.split("|") for s in page.evaluate("window.__stagesSeen")]
    stages = [s[0] for s in seen]
    started = [s for s in seen if s[0] != "queued"]
    assert started, seen
    for stage, words, clocks in seen:
        assert words.startswith(HEADLINES.get(stage, "?")), (stage, words)
        # the queue's wait, or the time in this stage and since the start
        assert clocks == ("queued" if stage == "queued" else "stage,startup"), (stage, clocks)
    known = [ORDER.index(s) for s in stages if s in ORDER]
    assert known == sorted(known), stages

    # Once it trains: the start-up's figures, as the API has them, with each stage's hover text.
    done = _wait_status(workbench, jid, {"completed"}, 240)
    st = done["stage"]
    assert st["stage"] == "training"
    text = summary.inner_text()
    assert text.startswith(f"Start-up: {_tenths(st['total_s'])} s ("), text
    labels = {
        "planning": "planning",
        "calibrating": "calibrating",
        "building_host_state": "host state",
        "starting_ranks": "ranks",
        "first_step": "first step",
    }
    for stage, sec in st["durations"].items():
        part = summary.locator(f'[data-stage="{stage}"]')
        assert part.inner_text() == f"{labels.get(stage, stage)} {_tenths(sec)} s"
        assert part.get_attribute("title")
    assert page.locator("#glossary").get_by_text("Stages of the start").count() == 1
    assert page.console.unexpected() == []


@pytest.mark.timeout(300)  # the job may wait up to 240 s to complete on a loaded machine
def test_the_host_state_stage_shows_its_units_and_the_summary_follows(page, workbench):
    """The stage as a server reports it while the host state fills (too quick on the demo model to watch)."""
    job = _post(workbench + "/api/jobs", _demo(workbench, steps=2, warmup=0, name="stage words"))
    jid = job["id"]
    _wait_status(workbench, jid, {"completed"}, 240)
    now = datetime.now(timezone.utc)
    iso = lambda t: t.isoformat().replace("+00:00", "Z")  # noqa: E731
    filling = {"stage": "building_host_state", "elapsed_s": 2.0, "done": 12, "total": 38, "progress": 12 / 38}
    trained = {
        "stage": "training",
        "durations": {
            "planning": 0.412,
            "building_host_state": 3.08,
            "starting_ranks": 5.0,
            "first_step": 3.79,
        },
        "total_s": 12.31,
        "elapsed_s": 12.31,
    }
    state = {"stage": filling}

    def job_route(route):
        body = route.fetch().json()
        body.update(
            status="running",
            step=0,
            last_metrics=None,
            tokens_per_s=None,
            finished_at=None,
            error=None,
            started_at=iso(now - timedelta(seconds=20)),
            stage=state["stage"],
        )
        route.fulfill(json=body)

    log = {
        "seq": 1,
        "ts": iso(now - timedelta(seconds=5)),
        "line": "start-up: building the host state (random initial weights)",
    }
    page.route(re.compile(rf".*/api/jobs/{jid}$"), job_route)
    page.route(re.compile(rf".*/api/jobs/{jid}/metrics\?.*"), lambda r: r.fulfill(json={"items": []}))
    page.route(
        re.compile(rf".*/api/jobs/{jid}/logs\?after_seq=0.*"), lambda r: r.fulfill(json={"items": [log]})
    )
    page.route(
        re.compile(rf".*/api/jobs/{jid}/logs\?after_seq=[1-9].*"), lambda r: r.fulfill(json={"items": []})
    )
    page.route(
        re.compile(rf".*/api/jobs/{jid}/events.*"),
        lambda r: r.fulfill(
            status=200, headers={"Content-Type": "text/event-stream"}, body="retry: 600000\n\n"
        ),
    )
    try:
        page.goto(f"{workbench}/jobs/{jid}")
        line = page.locator("#job-stage")
        line.locator(".stage-name", has_text="Building the host state — 12 of 38 units").wait_for()
        assert line.locator(".stage-name").get_attribute("title").startswith("The host state")
        bar = line.locator("progress")
        assert bar.get_attribute("value") == str(round(12 / 38 * 1000))
        # In this stage since its start-up log line (once the log tail has arrived: the job's own answer may
        # come first, and until then the stage is timed from when the page saw it); the start since the attempt
        # began.
        page.wait_for_function(
            "() => parseInt(document.querySelector('#job-stage [data-clock=\"stage\"]').textContent) >= 4",
            timeout=10_000,
        )
        in_stage = int(line.locator('[data-clock="stage"]').inner_text().split()[0])
        so_far = int(line.locator('[data-clock="startup"]').inner_text().split()[0])
        assert 4 <= in_stage <= 12 and 19 <= so_far <= 27, (in_stage, so_far)
        assert page.locator("#startup-summary").count() == 0
        screenshot(page, "job-stage")

        # The next refresh finds it training: the line gives way to the summary.
        state["stage"] = trained
        summary = page.locator("#startup-summary")
        summary.wait_for(timeout=10_000)
        assert (
            summary.inner_text()
            == "Start-up: 12.3 s (planning 0.4 s, host state 3.1 s, ranks 5.0 s, first step 3.8 s)"
        )
        assert line.is_hidden()
    finally:
        page.unroute_all()
    assert page.console.unexpected() == []


@pytest.mark.timeout(300)
def test_a_job_with_health_warnings_is_not_a_plain_completed(page, workbench):
    # The demo at lr 1000 dies (its loss spikes, then the gradient norm is exactly 0); with health.on_dead: warn
    # that is only said, as warnings, and the run completes.
    job = _post(
        workbench + "/api/jobs",
        _demo(workbench, steps=12, name="warned", lr=1000.0, health={"on_dead": "warn"}),
    )
    jid = job["id"]
    done = _wait_status(workbench, jid, {"completed", "failed"}, 240)
    assert done["status"] == "completed", done
    warnings = done["warnings"]
    assert {w["kind"] for w in warnings} == {"loss_spike", "zero_grad"}, warnings

    page.goto(workbench + "/jobs")
    row = page.locator(f'tr[data-job-id="{jid}"]')
    status = row.locator('[data-status="completed"]')
    status.wait_for()
    assert status.inner_text() == "completed with warnings"
    assert status.get_attribute("data-warned") == "true"
    count = row.locator(".warn-count")
    assert count.get_attribute("data-warnings") == str(len(warnings))
    assert re.fullmatch(rf"⚠ {len(warnings)}\s*warnings?", count.inner_text().strip()), count.inner_text()
    hover = count.get_attribute("title")
    for w in warnings:
        assert w["message"] in hover
    amber = status.evaluate("el => getComputedStyle(el).backgroundColor")
    plain = page.evaluate(
        """() => { const s = document.createElement('span'); s.className = 'badge status-completed';
                   document.body.append(s); const c = getComputedStyle(s).backgroundColor; s.remove(); return c; }"""
    )
    assert amber != plain

    row.get_by_role("link", name=f"#{jid}").click()
    badge = page.locator(".title-row [data-status]")
    badge.wait_for()
    assert badge.inner_text() == "completed with warnings"
    section = page.get_by_role("region", name="Warnings")
    section.wait_for()
    assert f"Warnings ({len(warnings)})" in section.inner_text()
    assert page.console.unexpected() == []


@pytest.mark.timeout(300)
def test_a_dead_run_ends_failed_with_the_step_it_died_and_no_export(page, workbench):
    # The CPU demo at lr 1000 with its own warm-up: the loss spikes inside the warm-up, then the gradient norm is
    # exactly 0. The run ends failed, saying where it died, and offers no export as its result.
    job = _post(workbench + "/api/jobs", _demo(workbench, steps=30, name="dead", lr=1000.0, export=True))
    jid = job["id"]
    done = _wait_status(workbench, jid, {"completed", "failed"}, 240)
    assert done["status"] == "failed", done
    message = done["error"]["message"]
    assert re.fullmatch(r"diverged: .+ at step \d+", message), message
    assert done["error"]["reason"] == "diverged" and done["error"]["step"] >= 1, done["error"]
    assert done["step"] < 30

    page.goto(f"{workbench}/jobs/{jid}")
    badge = page.locator('.title-row [data-status="failed"]')
    badge.wait_for()
    head = page.locator(".page-head")
    page.get_by_text(re.compile(rf"Diverged at step {done['error']['step']}: ")).first.wait_for()
    assert head.get_by_role("button", name="Download export").count() == 0
    assert head.get_by_role("link", name="Download export").count() == 0
    screenshot(page, "job-dead-run")
    assert page.console.unexpected() == []


@pytest.mark.timeout(400)
def test_a_requested_cancel_is_still_said_after_a_reload(page, workbench):
    # Steps of a few seconds, so that the cancel is still pending while the page reloads.
    job = _post(
        workbench + "/api/jobs",
        _demo(workbench, steps=500, name="slow steps", micro_batch_size=128, seq_len=256, warmup=0),
    )
    jid = job["id"]
    page.goto(f"{workbench}/jobs/{jid}")
    points = "Number((document.querySelector('#chart-loss') || {dataset: {}}).dataset.points)"
    page.wait_for_function(f"() => {points} >= 1", timeout=240_000)
    n = page.evaluate(f"() => {points}")
    # Right after a step ends, so the cancel waits for the whole next step.
    page.wait_for_function(f"() => {points} > {n}", timeout=120_000)
    asked = _post(f"{workbench}/api/jobs/{jid}/cancel", {"save": True})
    assert asked["status"] == "running" and asked["cancel_request"] == "save", asked
    page.reload()
    head = page.locator(".page-head")
    pending = head.get_by_role("button", name="Cancel requested…")
    pending.wait_for(timeout=10_000)
    assert pending.is_disabled()
    note = head.locator(".action-note")
    assert re.match(
        r"Cancel requested at .+: the job stops at the next step boundary after writing a checkpoint\.",
        note.inner_text(),
    ), note.inner_text()
    assert head.get_by_role("button", name="Cancel job").count() == 0

    # When it stops, the final status takes the note's place.
    page.locator('.title-row [data-status="cancelled"]').wait_for(timeout=120_000)
    page.wait_for_function("() => document.querySelector('.action-note').dataset.outcome === 'cancelled'")
    assert note.inner_text().startswith("Cancelled at step ")
    assert _get(f"{workbench}/api/jobs/{jid}")["cancel_request"] is None
    assert page.console.unexpected() == []
