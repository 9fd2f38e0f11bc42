"""Every problem of a job at once in a real browser: the form marks each bad field together (its message under
it, all of them in the summary at the top), and the plan preview opens with what blocks the job, never calling
it feasible. The embedded workbench started by the test, Debian's Chromium driven by Playwright."""

from __future__ import annotations

import pytest
from e2e_support import get_json, screenshot, start_workbench

pytestmark = [pytest.mark.e2e]

MISSING = "/nonexistent/slidedp-e2e/train.jsonl"


@pytest.fixture(scope="module")
def workbench(frontend_dist, tmp_path_factory):
    with start_workbench(tmp_path_factory.mktemp("workbench")) as url:
        yield url


def field_error(page, path: str):
    return page.locator(f'.field-error[data-field="{path}"]')


@pytest.mark.timeout(120)
def test_two_bad_fields_and_a_missing_dataset_are_marked_at_once(page, workbench):
    page.goto(workbench + "/jobs/new")
    preset = page.get_by_label("Preset", exact=True)
    preset.locator("option", has_text="CPU demo").wait_for(state="attached")
    assert preset.input_value() == "cpu-demo"

    steps = page.get_by_label("Steps", exact=True)
    lr = page.get_by_label("Learning rate", exact=True)
    data_path = page.get_by_label("Dataset path", exact=True)
    steps.fill("abc")
    lr.fill("-1")
    data_path.fill(MISSING)
    page.get_by_role("button", name="Submit job").click()

    # One submit: all three at their fields together, and all three in the summary at the top.
    for path in ("steps", "optimizer.lr", "data.path"):
        field_error(page, path).wait_for(state="visible")
    assert "must be an integer" in field_error(page, "steps").inner_text()
    assert "greater than 0" in field_error(page, "optimizer.lr").inner_text()
    assert f"{MISSING} does not exist" in field_error(page, "data.path").inner_text()
    for control in (steps, lr, data_path):
        assert control.get_attribute("aria-invalid") == "true"
    summary = page.locator(".form-summary")
    assert summary.is_visible()
    items = summary.locator("li").all_inner_texts()
    assert len(items) == 3, items
    assert {i.split(":", 1)[0] for i in items} == {"steps", "optimizer.lr", "data.path"}
    # The first bad field in the form's order has the focus; nothing was submitted.
    assert page.evaluate("document.activeElement && document.activeElement.id") == "f-data-path"
    assert page.url.endswith("/jobs/new"), "an invalid job must not be submitted"
    assert get_json(workbench + "/api/jobs")["total"] == 0
    screenshot(page, "form-every-problem-at-once")

    # The two fields put right, the dataset still missing: the preview opens with it and is not feasible.
    steps.fill("20")
    lr.fill("0.001")
    assert not field_error(page, "steps").is_visible() and not field_error(page, "optimizer.lr").is_visible()
    page.get_by_role("button", name="Plan").click()
    plan = page.locator("#plan-preview section.plan")
    plan.wait_for()
    top = plan.locator(":scope > *").first
    assert "plan-problems" in (top.get_attribute("class") or "")
    assert "This job cannot run as it is" in top.inner_text() and f"{MISSING} does not exist" in top.inner_text()
    # Every verdict comes after it, and none of them is a green "feasible".
    order = page.evaluate(
        """() => { const box = document.querySelector('#plan-preview .plan-problems');
                   const heads = [...document.querySelectorAll('#plan-preview section.plan h3')];
                   return heads.every(h => box.compareDocumentPosition(h) & Node.DOCUMENT_POSITION_FOLLOWING); }"""
    )
    assert order is True
    assert plan.locator(".badge.ok", has_text="feasible").count() == 0
    assert plan.locator(".badge.bad", has_text="not feasible").count() == 1
    # The field is marked too, and the preview keeps the page where it is (no focus jump).
    field_error(page, "data.path").wait_for(state="visible")
    assert field_error(page, "steps").is_hidden()
    screenshot(page, "plan-preview-blocking-problem-first")

    # The one deliberate 422 (the submit's check of a body the form could not read) is the only console entry.
    notes = [e for e in page.console.errors if "Failed to load resource" in e]
    assert len(notes) == 1 and "422" in notes[0] and notes[0].rsplit("/", 1)[-1] == "plan", notes
    assert page.console.unexpected(allowed=("status of 422",)) == []
