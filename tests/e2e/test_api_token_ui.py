"""A workbench started with SLIDEDP_API_TOKEN: the UI asks for the token once, then every request, the live
event stream and the export link carry it."""

from __future__ import annotations

import json
import urllib.request

import pytest
from e2e_support import get_json, start_workbench

pytestmark = [pytest.mark.e2e]
TOKEN = "e2e-token-7f3a"


@pytest.fixture(scope="module")
def workbench_with_token(frontend_dist, tmp_path_factory):
    with start_workbench(tmp_path_factory.mktemp("workbench-token"), {"SLIDEDP_API_TOKEN": TOKEN}) as url:
        yield url


@pytest.mark.timeout(240)
def test_token_prompt_then_live_job_page_with_the_token(page, workbench_with_token):
    url = workbench_with_token
    demo = next(p for p in get_json(url + "/api/presets", TOKEN)["items"] if p["id"] == "cpu-demo")["config"]
    body = json.dumps({**demo, "steps": 12, "name": "with token"}).encode()
    req = urllib.request.Request(
        url + "/api/jobs",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        jid = json.loads(r.read())["id"]

    page.goto(f"{url}/jobs/{jid}")
    banner = page.locator("#banner")
    banner.get_by_text("needs an API token").wait_for()
    page.get_by_label("API token").fill(TOKEN)
    page.get_by_role("button", name="Use token").click()
    banner.wait_for(state="hidden")
    page.get_by_role("heading", name=f"Job #{jid} · with token").wait_for()
    page.locator('.title-row [data-status="completed"]').wait_for(timeout=200_000)
    page.wait_for_function(
        "() => document.querySelector('#chart-loss').dataset.points === '12'", timeout=20_000
    )
    href = page.get_by_role("link", name="Download export").get_attribute("href")
    assert href == f"/api/jobs/{jid}/export?access_token={TOKEN}"
    # Before the token, the browser noted the refused health check; nothing else went wrong.
    refused = [e for e in page.console.errors if "status of 401" in e]
    assert refused and all("/api/health" in e for e in refused), refused
    assert page.console.unexpected(allowed=("status of 401",)) == []
