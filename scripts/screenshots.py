#!/usr/bin/env python3
"""Screenshots of the job page for the documentation: a healthy run and a run that died.

Starts the embedded workbench (SQLite, a private Redis, one local worker, the API and the UI) on a free
127.0.0.1 port with a temporary data folder, the way the browser tests do (tests/e2e/e2e_support.py), runs two
short jobs of the CPU demo preset on its worker, and photographs each job page in Debian's Chromium (Playwright)
at 1280x900:

- docs/img/job-healthy.png: the CPU demo as the preset has it;
- docs/img/job-dead.png: the same job at a learning rate of 1000 (the preset's 6 warm-up steps kept), whose loss
  spikes inside the warm-up and whose gradient norm is then exactly 0: the run ends failed, "Diverged at step N"
  (the loss chart on its log axis).

    .venv/bin/python scripts/screenshots.py [--out docs/img]

Needs what `make test` needs for the browser tests (/usr/bin/chromium, Node.js to build the UI); a few minutes
on two cores. Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from e2e_support import CHROMIUM, CHROMIUM_ARGS, get_json, start_workbench  # noqa: E402

VIEWPORT = {"width": 1280, "height": 900}
MAX_BYTES = 400 * 1024
HEALTHY_STEPS = 60
DEAD_STEPS = 60


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def wait_done(url: str, job_id: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = get_json(f"{url}/api/jobs/{job_id}")
        if job["status"] in ("completed", "failed", "cancelled", "interrupted"):
            return job
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job_id} did not finish within {timeout:.0f} s (status {job['status']})")
        time.sleep(1)


def jobs(url: str) -> tuple[dict, dict]:
    """Submit both jobs (the worker runs them one after the other) and wait for them."""
    demo = next(p for p in get_json(url + "/api/presets")["items"] if p["id"] == "cpu-demo")["config"]
    healthy = post(url + "/api/jobs", {**demo, "name": "CPU demo", "steps": HEALTHY_STEPS})
    dead = post(
        url + "/api/jobs",
        {**demo, "name": "CPU demo, lr 1000", "steps": DEAD_STEPS, "optimizer": {**demo["optimizer"], "lr": 1000.0}},
    )
    healthy = wait_done(url, healthy["id"], 900)
    dead = wait_done(url, dead["id"], 900)
    if healthy["status"] != "completed" or healthy["warnings"]:
        raise SystemExit(f"the healthy run ended {healthy['status']} with warnings {healthy['warnings']}")
    if dead["status"] != "failed" or not str((dead["error"] or {}).get("message", "")).startswith("diverged:"):
        raise SystemExit(f"the lr-1000 run ended {dead['status']}: {dead['error']}")
    print(f"the lr-1000 run: {dead['error']['message']} (warnings: {[w['message'] for w in dead['warnings']]})")
    return healthy, dead


def shoot(page, url: str, job: dict, path: Path, log_loss: bool) -> int:
    page.goto(f"{url}/jobs/{job['id']}")
    steps = job["step"]
    page.wait_for_function(
        f"() => ['loss', 'grad-norm', 'step-time', 'throughput', 'memory'].every(id => "
        f"(document.querySelector('#chart-' + id) || {{dataset: {{}}}}).dataset.drawn === '{steps}')",
        timeout=60_000,
    )
    page.locator("#startup-summary").wait_for()
    if log_loss:
        page.locator("#chart-loss").get_by_label("log scale").check()
        page.wait_for_function("() => window.__slidedpCharts.loss.scales.y.distr === 3")
    page.mouse.move(2, 2)  # no hover values on the charts
    page.wait_for_timeout(500)
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=False)
    return path.stat().st_size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="folder of the PNGs (docs/img)")
    args = ap.parse_args()
    subprocess.run([str(ROOT / "scripts" / "build_frontend.sh")], check=True, timeout=600)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="slidedp-screenshots-") as tmp, start_workbench(Path(tmp)) as url:
        print(f"workbench at {url}; running the two jobs ...", flush=True)
        healthy, dead = jobs(url)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
                shots = [
                    (healthy, args.out / "job-healthy.png", False),
                    (dead, args.out / "job-dead.png", True),
                ]
                for job, path, log_loss in shots:
                    size = shoot(page, url, job, path, log_loss)
                    print(f"{path}: {size / 1024:.0f} KiB")
                    if size > MAX_BYTES:
                        print(f"  larger than {MAX_BYTES // 1024} KiB", file=sys.stderr)
            finally:
                browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
