"""The built UI on a plain static server (no API): it must say the API is unreachable, and nothing else may
go wrong in the console."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest
from e2e_support import free_port, screenshot

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture()
def static_server(frontend_dist):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(frontend_dist),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(url + "/", timeout=1).read()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the static server did not start") from None
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_ui_without_api_says_unreachable_and_logs_no_errors(page, static_server):
    page.goto(static_server + "/")
    banner = page.locator("#banner")
    banner.get_by_text("API unreachable").wait_for()
    assert "make run" in banner.inner_text()
    # The router sends / to the jobs list, which waits for the API instead of failing.
    assert page.url.endswith("/jobs")
    page.get_by_text("The jobs appear here once the API answers.").wait_for()
    # Every page copes with the absent API.
    for link, text in (
        ("New job", "appears once the API answers"),
        ("Hosts", "The hosts appear here once the API answers."),
    ):
        page.get_by_role("navigation", name="Main").get_by_role("link", name=link, exact=True).click()
        page.get_by_text(text).wait_for()
    screenshot(page, "ui-without-api")
    # Only the browser's own note of the failed /api/health request may appear; no script error.
    assert page.console.unexpected(allowed=("Failed to load resource",)) == []
    failed = [e for e in page.console.errors if "Failed to load resource" in e]
    assert all("/api/health" in e for e in failed), failed
