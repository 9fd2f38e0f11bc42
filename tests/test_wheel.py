"""The wheel works on its own: `python -m build` makes a wheel that carries the built UI, and `slidedp serve` from
that wheel, installed into a fresh venv, serves the UI and the API.

The fresh venv borrows the dependencies of the environment running this test (a .pth file names its
site-packages), so nothing is downloaded: torch and the web stack are not what is checked here. The wheel itself is
installed with --no-deps and runs from a temporary folder without PYTHONPATH, so the source tree is out of sight;
the test checks that slidedp and slidedp_web are imported from the new venv.

    .venv/bin/python -m pytest -q tests/test_wheel.py
"""

from __future__ import annotations

import os
import re
import signal
import site
import socket
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{tail}"
    return done


def _clean_env() -> dict[str, str]:
    """This environment less what would point the server at the source tree or at another workbench."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "REDIS_URL", "DATABASE_URL")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLIDEDP_")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`python -m build --wheel` in the source tree (no isolation: the build needs only setuptools, which this
    environment has, and frontend/dist, which set-up built, so it downloads nothing)."""
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)], cwd=ROOT)
    (whl,) = out.glob("slidedp-*.whl")
    return whl


def test_the_wheel_carries_the_built_ui(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "slidedp_web/ui/index.html" in names
    assert any(re.fullmatch(r"slidedp_web/ui/assets/index-[\w-]+\.js", n) for n in names), names
    assert "slidedp_web/alembic.ini" in names and "slidedp/cli.py" in names
    assert not any(n.startswith(("frontend/", "tests/", "scripts/")) for n in names)


def test_the_sdist_has_what_builds_the_ui(tmp_path):
    """A wheel built from the sdist (plain `python -m build`) builds the UI too: the frontend's sources,
    lockfile and build script are in it; node_modules and a stale dist are not."""
    _run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path)], cwd=ROOT)
    (sdist,) = tmp_path.glob("slidedp-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in (
        "setup.py",
        "scripts/build_frontend.sh",
        "frontend/package.json",
        "frontend/package-lock.json",
        "frontend/index.html",
        "frontend/src/main.ts",
        "frontend/vite.config.ts",
    ):
        assert needed in names, needed
    assert not any(n.startswith(("frontend/node_modules", "frontend/dist")) for n in names)


def test_slidedp_serve_from_the_installed_wheel_serves_the_ui_and_the_api(wheel, tmp_path):
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    _run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    purelib = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    # The dependencies (torch, fastapi, ...) from this environment; listed after the venv's own site-packages,
    # so the wheel's packages come first. Plain paths: the editable install's finder there is not loaded.
    (purelib / "borrowed_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)])

    env = _clean_env()
    show = "import slidedp, slidedp_web; print(slidedp.__file__); print(slidedp_web.__file__)"
    where = _run([str(python), "-c", show], cwd=work, env=env).stdout.split()
    for module in where:
        assert Path(module).is_relative_to(purelib), where
    packaged_index = (purelib / "slidedp_web" / "ui" / "index.html").read_text()

    port, data = _free_port(), tmp_path / "data"
    env.update(SLIDEDP_DATA_DIR=str(data), HF_HUB_OFFLINE="1")
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [str(venv / "bin" / "slidedp"), "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                health = httpx.get(f"{url}/api/health", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "slidedp serve did not answer within 90 s"
                time.sleep(0.3)
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text

        home = httpx.get(f"{url}/", timeout=10)
        assert home.status_code == 200 and home.headers["content-type"].startswith("text/html")
        assert home.text == packaged_index
        assert '<div id="app">' in home.text
        script = re.search(r'<script type="module" crossorigin src="(/assets/index-[\w-]+\.js)"', home.text)
        assert script, home.text
        asset = httpx.get(url + script.group(1), timeout=10)
        assert asset.status_code == 200 and "javascript" in asset.headers["content-type"]

        assert (data / "slidedp.db").is_file()
        out = (tmp_path / "serve.log").read_text()
        assert f"SlideDP Workbench at http://127.0.0.1:{port}" in out and "SLIDEDP_PORT" in out
    finally:
        # SIGTERM: serve stops its worker and its private Redis (they also die with it if it is killed).
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert not (data / "redis.sock").exists()
