"""Browser tests: Playwright driving Debian's Chromium (never a downloaded browser) against the real UI.

The browser is /usr/bin/chromium (scripts/setup.sh installs it with SETUP_BROWSER=1), headless, with a fresh
profile, talking only to 127.0.0.1. Every page records its console errors and uncaught exceptions; tests
assert there are none. Screenshots go to test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2e_support import CHROMIUM, CHROMIUM_ARGS, DIST, ROOT


@pytest.fixture(scope="session")
def frontend_dist() -> Path:
    """frontend/dist, built from the committed lockfile when it is missing or older than the sources."""
    if shutil.which("npm") is None and not (DIST / "index.html").exists():
        pytest.fail(
            "frontend/dist is missing and npm is not installed: install Node.js 20+ and run make test"
        )
    subprocess.run([str(ROOT / "scripts" / "build_frontend.sh")], check=True, timeout=300)
    assert (DIST / "index.html").exists()
    return DIST


@pytest.fixture(scope="session")
def browser_context(tmp_path_factory):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"no Chromium at {CHROMIUM}: run `SETUP_BROWSER=1 scripts/setup.sh` (apt-get install chromium)"
        )
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
        )
        ctx.set_default_timeout(15_000)
        try:
            yield ctx
        finally:
            ctx.close()


@dataclass
class Console:
    """Console errors and uncaught exceptions of one page."""

    errors: list[str] = field(default_factory=list)

    def unexpected(self, allowed: tuple[str, ...] = ()) -> list[str]:
        return [e for e in self.errors if not any(a in e for a in allowed)]


@pytest.fixture()
def page(browser_context):
    pg = browser_context.new_page()
    console = Console()

    def on_console(msg):
        if msg.type == "error":
            loc = msg.location or {}
            console.errors.append(f"console: {msg.text} @ {loc.get('url', '')}")

    pg.on("console", on_console)
    pg.on("pageerror", lambda exc: console.errors.append(f"pageerror: {exc}"))
    pg.console = console  # type: ignore[attr-defined]
    try:
        yield pg
    finally:
        pg.close()
