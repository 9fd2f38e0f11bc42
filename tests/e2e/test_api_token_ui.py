"""A workbench behind an API token: the browser logs in with a login URL (`/#token=...`, as `slidedp serve` prints
for a non-loopback bind), keeps the token and clears it from the address bar; every request carries it as a
bearer header, the live event stream and the export download use one-time tickets, and no URL ever holds the
token."""

from __future__ import annotations

import io
import json
import tarfile
import urllib.request

import pytest
from e2e_support import get_json, start_workbench

pytestmark = [pytest.mark.e2e]
TOKEN = "e2e-token-7f3a"
STEPS = 12


@pytest.fixture(scope="module")
def workbench_with_token(frontend_dist, tmp_path_factory):
    with start_workbench(tmp_path_factory.mktemp("workbench-token"), {"SLIDEDP_API_TOKEN": TOKEN}) as url:
        yield url


@pytest.fixture(scope="module")
def job_id(workbench_with_token) -> int:
    url = workbench_with_token
    demo = next(p for p in get_json(url + "/api/presets", TOKEN)["items"] if p["id"] == "cpu-demo")["config"]
    body = json.dumps({**demo, "steps": STEPS, "name": "with token"}).encode()
    req = urllib.request.Request(
        url + "/api/jobs",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["id"]


@pytest.mark.timeout(300)
def test_login_url_then_live_stream_and_export_with_tickets(page, workbench_with_token, job_id):
    url, jid = workbench_with_token, job_id
    requests: list[tuple[str, str]] = []
    page.on("request", lambda r: requests.append((r.method, r.url)))

    page.goto(f"{url}/#token={TOKEN}")
    page.wait_for_url(f"{url}/jobs")  # the fragment is gone from the address bar (and the history)
    assert page.evaluate("location.hash") == ""
    assert page.evaluate("localStorage.getItem('slidedp.apiToken')") == TOKEN
    assert page.evaluate("history.length") >= 1 and "#token" not in page.evaluate("location.href")
    page.get_by_role("link", name=f"#{jid}", exact=True).wait_for()  # the job list came with the token

    page.goto(f"{url}/jobs/{jid}")
    page.get_by_role("heading", name=f"Job #{jid} · with token").wait_for()
    assert page.locator("#banner").is_hidden()
    # Live: the charts grow while the job runs, over a stream opened with a ticket.
    page.wait_for_function(
        "() => (window.__slidedpCharts || {}).loss && window.__slidedpCharts.loss.data[0].length >= 2",
        timeout=200_000,
    )
    status = page.locator(".title-row [data-status]").get_attribute("data-status")
    if status == "running":
        # Break the stream as a network failure would: its ticket is spent, so it reopens with a new one from
        # the last event it saw.
        # read the last event id and drop in one task, so that no event lands between the two
        seen = page.evaluate("(() => { const s = window.__slidedpStream; const id = s.lastEventId; s.drop(); "
                             "return id; })()")
        page.wait_for_function(
            "() => window.__slidedpStream && window.__slidedpStream.state === 'open'", timeout=30_000
        )
        resumed = [u for m, u in requests if f"/api/jobs/{jid}/events?" in u and "last_event_id=" in u]
        assert any(f"last_event_id={seen}&ticket=" in u for u in resumed), resumed
    page.locator('.title-row [data-status="completed"]').wait_for(timeout=240_000)
    page.wait_for_function(
        f"() => document.querySelector('#chart-loss').dataset.points === '{STEPS}'", timeout=20_000
    )

    streams = [u for m, u in requests if f"/api/jobs/{jid}/events" in u]
    assert streams and all("ticket=" in u for u in streams), streams
    tickets = [u for m, u in requests if m == "POST" and u.endswith("/api/tickets")]
    assert len(tickets) >= len(streams)
    # A ticket is used once: no stream URL repeats.
    assert len(set(streams)) == len(streams), streams

    # The export: the link holds no secret; the click downloads with a fresh ticket.
    link = page.get_by_role("link", name="Download export")
    assert link.get_attribute("href") == f"/api/jobs/{jid}/export"
    with page.expect_download(timeout=60_000) as info:
        link.click()
    download = info.value
    assert download.failure() is None
    assert f"/api/jobs/{jid}/export?ticket=" in download.url
    assert download.suggested_filename == f"slidedp-job-{jid}.tar.gz"
    with open(download.path(), "rb") as fh:
        blob = fh.read()
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        names = tar.getnames()
    assert names and all(n.startswith(f"slidedp-job-{jid}") for n in names), names
    assert any(n.endswith("config.json") for n in names), names

    # The token never travelled in a URL (the login URL's fragment is not sent).
    leaked = [u for _, u in requests if TOKEN in u.split("#")[0] or "access_token" in u]
    assert leaked == [], leaked
    assert page.console.unexpected() == []


@pytest.mark.timeout(120)
def test_without_a_stored_token_the_ui_asks_for_it(page, workbench_with_token, job_id):
    url, jid = workbench_with_token, job_id
    # Forget the token on a page of the same origin that runs no UI code: on a UI page, a poll timed after the
    # removal would be refused and noted before the job page even opened.
    page.goto(f"{url}/openapi.json")
    page.evaluate("localStorage.removeItem('slidedp.apiToken')")
    page.goto(f"{url}/jobs/{jid}")
    banner = page.locator("#banner")
    banner.get_by_text("needs an API token").wait_for()
    page.get_by_label("API token").fill(TOKEN)
    page.get_by_role("button", name="Use token").click()
    banner.wait_for(state="hidden")
    page.get_by_role("heading", name=f"Job #{jid} · with token").wait_for()
    assert page.evaluate("localStorage.getItem('slidedp.apiToken')") == TOKEN
    # Before the token, the browser noted the refused health check; nothing else went wrong.
    refused = [e for e in page.console.errors if "status of 401" in e]
    assert refused and all("/api/health" in e for e in refused), refused
    assert page.console.unexpected(allowed=("status of 401",)) == []
