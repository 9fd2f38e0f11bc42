"""The job page's charts and controls in a real browser against the real app (the embedded workbench, a CPU demo
job run by its worker): the grad-norm chart, the loss chart's log axis and smoothing, warm-up autoscale, hover
text for the names, warnings and eval loss when the API carries them, the run's clock, a cancel that asks
once and does not change its mind by itself, and two finished runs compared from the jobs list (their loss curves
overlaid on one step axis, the selection kept in the URL)."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest
from e2e_support import get_json as _get
from e2e_support import screenshot, start_workbench

pytestmark = [pytest.mark.e2e]

STEPS = 12


@pytest.fixture(scope="module")
def workbench(frontend_dist, tmp_path_factory):
    with start_workbench(tmp_path_factory.mktemp("charts")) as url:
        yield url


def _post(url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body or {}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _demo(url: str) -> dict:
    return next(p for p in _get(url + "/api/presets")["items"] if p["id"] == "cpu-demo")["config"]


def _wait_status(url: str, jid: int, statuses: set[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    job = _get(f"{url}/api/jobs/{jid}")
    while job["status"] not in statuses and time.monotonic() < deadline:
        time.sleep(0.5)
        job = _get(f"{url}/api/jobs/{jid}")
    assert job["status"] in statuses, job
    return job


@pytest.fixture(scope="module")
def finished_job(workbench) -> dict:
    """A short demo run with clipping on, finished."""
    demo = _demo(workbench)
    job = _post(
        workbench + "/api/jobs",
        {
            **demo,
            "name": "charts",
            "steps": STEPS,
            "export": False,
            "optimizer": {**demo.get("optimizer", {}), "max_grad_norm": 1.0},
        },
    )
    return _wait_status(workbench, job["id"], {"completed"}, 240)


def _series(page, chart: str) -> list[str]:
    return page.evaluate(f"window.__slidedpCharts[{chart!r}].series.map(s => s.label)")


def _open(page, url: str, jid: int, steps: int) -> None:
    page.goto(f"{url}/jobs/{jid}")
    page.wait_for_function(
        f"() => ['loss', 'grad-norm', 'step-time'].every(id => "
        f"(document.querySelector('#chart-' + id) || {{dataset: {{}}}}).dataset.drawn === '{steps}')",
        timeout=30_000,
    )


@pytest.mark.timeout(300)
def test_finished_job_page_charts_and_clock(page, workbench, finished_job):
    jid = finished_job["id"]
    stored = _get(f"{workbench}/api/jobs/{jid}/metrics?after_step=0&limit=1000")["items"]
    assert [r["step"] for r in stored] == list(range(1, STEPS + 1))
    # The charts' view choices (log axis, smoothing) are kept per browser: start from the defaults.
    page.goto(workbench + "/jobs")
    page.evaluate("localStorage.removeItem('slidedp.chart.loss'); localStorage.removeItem('slidedp.chart.grad-norm')")
    _open(page, workbench, jid, STEPS)

    # The grad-norm chart draws the stored norms, marks the clipped steps and the threshold.
    grad = page.locator("#chart-grad-norm")
    assert grad.is_visible()
    assert _series(page, "grad-norm")[1:] == ["grad norm", "clipped", "max grad norm"]
    drawn = page.evaluate("window.__slidedpCharts['grad-norm'].data[1]")
    assert drawn == pytest.approx([r["grad_norm"] for r in stored])
    marked = page.evaluate("window.__slidedpCharts['grad-norm'].data[2]")
    clipped = [r["step"] for r in stored if r.get("clipped")]
    assert [i + 1 for i, v in enumerate(marked) if v is not None] == clipped
    assert f"Clipped at {len(clipped)} of {STEPS} steps (max grad norm 1)." in grad.inner_text()

    # The log toggle switches the loss axis to log10 and back; the drawn loss stays the stored loss.
    loss = page.locator("#chart-loss")
    log = loss.get_by_label("log scale")
    assert page.evaluate("window.__slidedpCharts.loss.scales.y.distr") == 1
    log.check()
    page.wait_for_function("() => window.__slidedpCharts.loss.scales.y.distr === 3")
    assert loss.get_attribute("data-log") == "true"
    lo, hi = page.evaluate("[window.__slidedpCharts.loss.scales.y.min, window.__slidedpCharts.loss.scales.y.max]")
    losses = [r["loss"] for r in stored]
    assert lo <= min(losses) and hi >= max(losses)
    assert page.evaluate("window.__slidedpCharts.loss.data[1]") == pytest.approx(losses)
    log.uncheck()
    page.wait_for_function("() => window.__slidedpCharts.loss.scales.y.distr === 1")

    # Smoothing adds the moving average over the faint raw loss, which stays the first series.
    loss.get_by_label("smoothing").fill("0.6")
    page.wait_for_function("() => window.__slidedpCharts.loss.series.some(s => s.label === 'loss (smoothed)')")
    smooth = page.evaluate("window.__slidedpCharts.loss.data[2]")
    assert smooth[0] == pytest.approx(losses[0])
    assert smooth[-1] != pytest.approx(losses[-1])
    assert page.evaluate("window.__slidedpCharts.loss.data[1]") == pytest.approx(losses)
    loss.get_by_label("smoothing").fill("0")
    page.wait_for_function("() => !window.__slidedpCharts.loss.series.some(s => s.label === 'loss (smoothed)')")

    # Throughput is tokens/s alone (a CPU run says nothing of TFLOP/s); step time and throughput leave the
    # warm-up step out of their scale, and say so when it is cut off.
    assert _series(page, "throughput")[1:] == ["tokens/s"]
    assert "TFLOP/s" not in page.locator("#chart-throughput").inner_text()
    times = [r["step_time_s"] for r in stored]
    y_max = page.evaluate("window.__slidedpCharts['step-time'].scales.y.max")
    if times[0] > y_max:
        assert "Step 1 (warm-up)" in page.locator("#chart-step-time .chart-info").inner_text()
    # No time, rate or size in a legend is written with an exponent.
    legends = page.locator(
        "#chart-step-time .u-legend .u-value, #chart-throughput .u-legend .u-value, #chart-memory .u-legend .u-value"
    ).all_inner_texts()
    assert legends and not [t for t in legends if re.search(r"\de[-+]\d", t)], legends

    # Every phase in the step-time legend, and the policy's names, have hover text.
    phases = _series(page, "step-time")[1:]
    assert "forward" in phases and "backward" in phases
    rows = page.locator("#chart-step-time .u-legend .u-series")
    titles = [rows.nth(i + 1).get_attribute("title") for i in range(len(phases))]
    assert all(titles), dict(zip(phases, titles, strict=True))
    delivery = page.locator('section.plan[aria-label="Policy"] dt', has_text=re.compile(r"^delivery$")).first
    assert "host memory to the GPUs" in (delivery.get_attribute("title") or "")
    assert page.locator("#glossary summary").inner_text() == "What the names mean"

    # The run's clock: how long it took, from its timestamps.
    clock = page.locator('#job-clock [data-clock="duration"]')
    assert re.fullmatch(r"\d+ s|\d+ min \d\d s", clock.inner_text()), clock.inner_text()
    assert page.locator('#job-clock [data-clock="elapsed"]').count() == 0
    # No warnings reported: no warnings list.
    assert page.locator("section.warnings").is_hidden()
    screenshot(page, "job-charts")
    assert page.console.unexpected() == []


@pytest.mark.timeout(120)
def test_warnings_and_eval_loss_when_the_api_carries_them(page, workbench, finished_job):
    """A job object with `warnings` and records with `eval_loss` (as a server that reports them answers)."""
    jid = finished_job["id"]
    warnings = [{"step": 3, "kind": "loss_spike", "message": "loss jumped to 7e6"}]
    eval_steps = {4: 2.5, 8: 2.25, 12: 2.0}

    def job_route(route):
        body = route.fetch().json()
        route.fulfill(json={**body, "warnings": warnings})

    def metrics_route(route):
        body = route.fetch().json()
        for r in body["items"]:
            if r["step"] in eval_steps:
                r["eval_loss"] = eval_steps[r["step"]]
        route.fulfill(json=body)

    page.route(re.compile(rf".*/api/jobs/{jid}$"), job_route)
    page.route(re.compile(rf".*/api/jobs/{jid}/metrics\?.*"), metrics_route)
    try:
        _open(page, workbench, jid, STEPS)
        page.wait_for_function("() => window.__slidedpCharts.loss.series.some(s => s.label === 'eval loss')")
        section = page.get_by_role("region", name="Warnings")
        section.wait_for()
        assert "step 3 · loss spike: loss jumped to 7e6" in section.inner_text()
        labels = _series(page, "loss")
        evals = page.evaluate(f"window.__slidedpCharts.loss.data[{labels.index('eval loss')}]")
        assert {i + 1: v for i, v in enumerate(evals) if v is not None} == eval_steps
        assert "1 warning marked" in (page.locator("#chart-loss .chart-plot").get_attribute("aria-label") or "")
    finally:
        page.unroute_all()
    assert page.console.unexpected() == []


@pytest.mark.timeout(300)
def test_cancel_asks_once_and_keeps_asking_until_answered(page, workbench):
    demo = _demo(workbench)
    job = _post(workbench + "/api/jobs", {**demo, "name": "to cancel", "steps": 5000, "export": False})
    jid = job["id"]
    page.goto(f"{workbench}/jobs/{jid}")
    page.wait_for_function(
        "() => Number((document.querySelector('#chart-loss') || {dataset: {}}).dataset.points) >= 2",
        timeout=150_000,
    )
    head = page.locator(".page-head")
    # While it runs the page counts the elapsed time.
    elapsed = page.locator('#job-clock [data-clock="elapsed"]')
    first = elapsed.inner_text()
    page.wait_for_function(
        f"() => document.querySelector('#job-clock [data-clock=\"elapsed\"]').textContent !== {first!r}",
        timeout=5_000,
    )

    # The first press asks; the question stays (no timer takes it back) until it is answered.
    head.get_by_role("button", name="Cancel job").click()
    confirm = head.get_by_role("button", name="Confirm cancel")
    keep = head.get_by_role("button", name="Keep running")
    assert confirm.is_visible() and keep.is_visible()
    page.wait_for_timeout(6_500)
    assert confirm.is_visible() and keep.is_visible()
    keep.click()
    head.get_by_role("button", name="Cancel job").wait_for()
    assert confirm.count() == 0
    assert _get(f"{workbench}/api/jobs/{jid}")["status"] == "running"

    # Confirmed: "Cancel requested…" until the job ends, then the final status in its place.
    head.get_by_role("button", name="Cancel job").click()
    confirm.click()
    page.locator('.title-row [data-status="cancelled"]').wait_for(timeout=120_000)
    note = head.locator(".action-note")
    page.wait_for_function("() => document.querySelector('.action-note').dataset.outcome === 'cancelled'")
    assert re.fullmatch(r"Cancelled at step \d+\.", note.inner_text()), note.inner_text()
    assert head.get_by_text("Cancel requested").count() == 0
    assert head.get_by_role("button", name="Cancel job").count() == 0
    page.locator('#job-clock [data-clock="duration"]').wait_for()
    assert page.console.unexpected() == []


def _four_digits(v: float) -> str:
    """A loss as the page writes it (fmt.ts num(v, 4)), for values between 0.001 and 1000."""
    return f"{float(f'{v:.4g}'):g}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_finished_runs_compared_from_the_list_and_kept_in_the_url(page, workbench, finished_job):
    demo = _demo(workbench)
    short = _post(
        workbench + "/api/jobs",
        {
            **demo,
            "name": "evaluated",
            "steps": 4,
            "schedule": {**demo.get("schedule", {}), "warmup_steps": 0},
            "export": False,
            "eval": {"holdout": 0.1, "interval": 2},
            "optimizer": {**demo.get("optimizer", {}), "max_grad_norm": 0.0},  # the other run clips at 1.0
        },
    )
    ia, ib = finished_job["id"], short["id"]
    _wait_status(workbench, ib, {"completed"}, 240)
    recs = {i: _get(f"{workbench}/api/jobs/{i}/metrics")["items"] for i in (ia, ib)}
    evals = [r for r in recs[ib] if r.get("eval_loss") is not None]
    assert [r["step"] for r in evals] == [2, 4]

    # The list says each run's final loss, eval loss, median tokens/s and how long it ran, with units.
    page.goto(workbench + "/jobs")
    row_a, row_b = (page.locator(f'tr[data-job-id="{i}"]') for i in (ia, ib))
    row_b.locator('[data-status="completed"]').wait_for()
    assert row_a.locator('[data-col="final-loss"]').inner_text() == _four_digits(recs[ia][-1]["loss"])
    assert row_b.locator('[data-col="eval-loss"]').inner_text() == _four_digits(evals[-1]["eval_loss"])
    assert row_a.locator('[data-col="eval-loss"]').inner_text() == "–"
    assert re.fullmatch(r"[\d,.]+ tokens/s", row_a.locator('[data-col="tokens-per-s"]').inner_text())
    assert re.fullmatch(r"\d+ s|\d+ min \d\d s", row_a.locator('[data-col="duration"]').inner_text())

    # Tick both (the short one first: the comparison keeps that order) and compare.
    compare = page.get_by_role("button", name="Compare", exact=True)
    assert compare.is_disabled()
    row_b.get_by_label(f"Compare job #{ib}").check()
    row_a.get_by_label(f"Compare job #{ia}").check()
    assert page.locator("#compare-count").inner_text() == "2 selected"
    screenshot(page, "jobs-list-compare")
    compare.click()
    page.wait_for_url(f"**/jobs/compare?ids={ib},{ia}")
    chart = page.locator("#chart-compare")

    def both_drawn() -> None:
        page.wait_for_function("() => document.querySelector('#chart-compare')?.dataset.jobs === '2'")
        plot = "window.__slidedpCharts.compare"
        assert page.evaluate(f"{plot}.series.map(s => s.label)") == [
            "step",
            f"#{ib} evaluated",
            f"#{ib} evaluated eval",
            f"#{ia} charts",
        ]
        data = page.evaluate(f"{plot}.data")
        assert data[0] == list(range(1, STEPS + 1))  # one step axis for both runs
        assert data[1] == pytest.approx([r["loss"] for r in recs[ib]] + [None] * (STEPS - 4))
        assert data[2] == pytest.approx(
            [None, evals[0]["eval_loss"], None, evals[1]["eval_loss"]] + [None] * (STEPS - 4)
        )
        assert data[3] == pytest.approx([r["loss"] for r in recs[ia]])
        # the eval loss is dashed in its run's colour; each run has its own colour
        strokes = page.evaluate(f"{plot}.series.map(s => [s._stroke, s.dash || null])")
        assert strokes[2] == [strokes[1][0], [6, 4]] and strokes[1][0] != strokes[3][0]
        legend = chart.locator(".u-legend").inner_text()
        assert f"#{ia} charts" in legend and f"#{ib} evaluated" in legend

    both_drawn()
    assert page.locator("#compare-runs").get_by_role("link", name=f"#{ia}").is_visible()

    # What differs in their configs: only the differing keys, with the form's labels, a column per job in order.
    diff = page.locator("#compare-config table")
    rows = {r.get_attribute("data-key"): r for r in diff.locator("tbody tr").all()}
    assert {"steps", "eval.holdout", "eval.interval", "optimizer.max_grad_norm"} <= set(rows), list(rows)
    assert "model" not in rows and "seq_len" not in rows and "output_dir" not in rows
    assert rows["steps"].locator("td").all_inner_texts() == ["4", str(STEPS)]
    assert rows["steps"].locator("th").inner_text().startswith("Steps")
    assert rows["eval.holdout"].locator("th").inner_text().startswith("Held-out share of the training data")
    assert [t.strip() for t in diff.locator("thead th").all_inner_texts()[1:]] == [f"#{ib} evaluated", f"#{ia} charts"]
    # gradient norm, step time and tokens/s are charted for both runs too, on the same step axis
    for cid in ("compare-grad-norm", "compare-step-time", "compare-tokens"):
        page.wait_for_function(f"() => document.querySelector('#chart-{cid}')?.dataset.jobs === '2'")
        assert page.evaluate(f"window.__slidedpCharts[{cid!r}].data[0]") == list(range(1, STEPS + 1))
    assert page.evaluate("window.__slidedpCharts['compare-grad-norm'].data[2]") == pytest.approx(
        [r["grad_norm"] for r in recs[ia]]
    )
    screenshot(page, "compare-config")  # the whole page: the differences table above the four charts

    # The log axis is part of the URL too; a reload shows the same comparison.
    chart.get_by_label("log scale").check()
    page.wait_for_function("() => window.__slidedpCharts.compare.scales.y.distr === 3")
    assert page.url.endswith(f"/jobs/compare?ids={ib},{ia}&log=1")
    page.reload()
    both_drawn()
    assert chart.get_by_label("log scale").is_checked()
    assert page.evaluate("window.__slidedpCharts.compare.scales.y.distr") == 3
    screenshot(page, "compare")

    # "Change selection" goes back to the list with both still ticked.
    page.get_by_role("link", name="Change selection").click()
    page.wait_for_url(f"**/jobs?select={ib},{ia}")
    for i in (ia, ib):
        page.locator(f'tr[data-job-id="{i}"]').get_by_label(f"Compare job #{i}").wait_for()
        assert page.get_by_label(f"Compare job #{i}").is_checked()

    # An address naming something that is not a job says so, and the rest is still drawn.
    page.goto(f"{workbench}/jobs/compare?ids={ia},abc,{ib + 1000}")
    problems = page.locator("#compare-problems")
    problems.get_by_text('"abc" is not a job id').wait_for()
    assert f"Job #{ib + 1000} does not exist" in problems.inner_text()
    page.wait_for_function("() => document.querySelector('#chart-compare')?.dataset.jobs === '1'")
    page.goto(f"{workbench}/jobs/compare?ids=x")
    page.get_by_text("No jobs to compare").wait_for()
    assert page.locator("#chart-compare").is_hidden()
    # the browser itself logs the 404 of the job that is not there
    assert page.console.unexpected(allowed=(f"/api/jobs/{ib + 1000}",)) == []
