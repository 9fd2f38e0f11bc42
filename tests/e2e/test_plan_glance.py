"""The plan preview at a glance in a real browser: the verdict comes first (after anything that blocks the job),
then the alternatives, sorted with the chosen plan at the head of the rows that fit, rows that do not fit greyed
with their reason, variants folded behind an expander, and memory as bars. Once with the embedded workbench's own
answer (the CPU demo preset), once with the answer replaced by the plan AutoPolicy makes for qwen3-8b on the
nvidia-h200-x2 fixture calibration (frontend/src/fixtures/plan-8b-bs8.json), as a GPU host would answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_support import screenshot, start_workbench

pytestmark = [pytest.mark.e2e]

FIXTURE = Path(__file__).resolve().parents[2] / "frontend" / "src" / "fixtures" / "plan-8b-bs8.json"


@pytest.fixture(scope="module")
def workbench(frontend_dist, tmp_path_factory):
    with start_workbench(tmp_path_factory.mktemp("workbench")) as url:
        yield url


def _open_form(page, workbench: str) -> None:
    page.goto(workbench + "/jobs/new")
    page.get_by_label("Preset", exact=True).locator("option", has_text="CPU demo").wait_for(state="attached")


def _headings(plan) -> list[str]:
    return [t.strip() for t in plan.locator(":scope > h3").all_inner_texts()]


@pytest.mark.timeout(120)
def test_the_workbench_answer_opens_with_the_verdict(page, workbench):
    _open_form(page, workbench)
    page.get_by_role("button", name="Plan").click()
    plan = page.locator("#plan-preview section.plan")
    plan.wait_for()
    plan.locator(".plan-verdict").wait_for()
    heads = _headings(plan)
    assert heads[0].startswith("Verdict"), heads
    assert heads.index("Why") > 0 and any(h.startswith("Memory fit") for h in heads)
    first = plan.locator(":scope > *").first
    assert first.evaluate("el => el.tagName") == "H3" or "plan-problems" in (
        first.get_attribute("class") or ""
    )
    assert "delivery" in plan.locator(".verdict-policy").inner_text()
    assert page.console.unexpected() == []


@pytest.mark.timeout(120)
def test_a_gpu_plan_reads_at_a_glance_with_sorted_alternatives(page, workbench):
    answer = json.loads(FIXTURE.read_text())
    answer.update({"problems": [], "warnings": [], "fits": True})
    page.route(
        "**/api/plan",
        lambda route: route.fulfill(status=200, content_type="application/json", body=json.dumps(answer)),
    )
    _open_form(page, workbench)
    page.get_by_role("button", name="Plan").click()
    plan = page.locator("#plan-preview section.plan")
    plan.locator(".plan-verdict").wait_for()

    # The verdict first: the policy in words, the step, memory against its limits, what binds, what to gain.
    assert _headings(plan)[:3] == ["Verdict feasible", "Alternatives", "Memory fit fits"]
    verdict = plan.locator(".plan-verdict").inner_text()
    assert "Replicated delivery, GPU reduction; 23 layers keep activations, the rest recompute" in verdict
    assert "2.83 s per step, 11,579 tokens/s" in verdict
    assert "127.8 of 129.2 GiB per GPU — 1.0% free" in verdict
    assert "125.3 of 256.0 GiB host RAM — 51% free" in verdict
    assert "the CPU update (AdamW on the host)" in verdict
    # 1% free is under the 5% margin: the verdict opens with the warning.
    warn = plan.locator(".plan-verdict > .headroom-warning")
    assert warn.count() == 1 and "only 1.0% free" in warn.inner_text()

    # The alternatives: the chosen row first among fitting rows, the others by predicted time (a row faster within
    # the tie rule says so), the rows that do not fit last, greyed, with their reason in words.
    rows = plan.locator("table.alternatives-table tbody tr.alt-row")
    n = rows.count()
    assert n == 7
    info = rows.evaluate_all(
        """rs => rs.map(r => ({chosen: r.classList.contains('chosen-row'), fits: r.dataset.fits === 'true',
                              t: Number(r.dataset.stepS), text: r.innerText}))"""
    )
    fitting = [r for r in info if r["fits"]]
    assert fitting[0]["chosen"] and sum(r["chosen"] for r in info) == 1
    assert "chosen" in fitting[0]["text"]
    rest = [r for r in fitting[1:] if "defaults kept" not in r["text"]]
    assert [r["t"] for r in rest] == sorted(r["t"] for r in rest)
    assert all("% slower" in r["text"] for r in rest)
    tied = [r for r in fitting[1:] if "defaults kept" in r["text"]]
    assert tied and all("within the 0.1%" in r["text"] for r in tied)
    assert "unless another setting is at least 0.1% faster" in plan.locator(".tie-rule").inner_text()
    rejected = [r for r in info if not r["fits"]]
    assert info[-len(rejected) :] == rejected
    assert "Not taken: it needs 173.3 GiB of HBM per GPU, 44.2 GiB over the budget" in rejected[0]["text"]
    assert plan.locator("tr.rejected-row").count() == len(rejected)

    # Variants folded into the chosen row open on click.
    toggle = rows.first.locator("button.variants-toggle")
    assert toggle.inner_text() == "7 variants"
    variants = plan.locator("#" + toggle.get_attribute("aria-controls"))
    assert variants.is_hidden()
    toggle.click()
    assert variants.is_visible() and variants.locator("li").count() == 7

    # Memory as bars per GPU and for the host, with the limit and why the budget is below the card's size.
    bars = plan.locator(".mem-bar")
    assert bars.count() == 2
    assert "GPU memory, per GPU" in bars.first.inner_text()
    assert "of the card's 140.4 GiB" in bars.first.inner_text()
    assert bars.first.locator(".mem-part").count() == 6

    # One step: the GPU stream's phases in order, the spans, and how long each resource is busy.
    assert _headings(plan)[3] == "One step"
    lanes = plan.locator(".plan-step .step-lane")
    assert lanes.first.get_attribute("data-lane") == "phases"
    assert "forward compute" in lanes.first.inner_text()
    assert plan.locator('.plan-step [data-lane="busy-cpu"]').count() == 1
    # the panel scrolls within the viewport: a tall one shows all of it
    page.set_viewport_size({"width": 1400, "height": 2600})
    screenshot(page, "plan-preview-at-a-glance")
    assert page.console.unexpected() == []
