"""One build step beyond pyproject.toml: a wheel carries the built UI.

Building a wheel (`python -m build`, `pip install .`) runs scripts/build_frontend.sh (npm ci from the committed
lockfile, then the Vite build; Node.js >= 20.19 with npm is needed for this, and only for this) and copies
frontend/dist into the package as slidedp_web/ui, which the web app serves. An editable install
(`pip install -e .`, scripts/setup.sh) skips it: there the app serves frontend/dist of the source tree.
"""

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithUI(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        # The script says so when Node.js >= 20.19 with npm is missing, and skips a frontend/dist that is current.
        code = subprocess.run(["bash", str(ROOT / "scripts" / "build_frontend.sh")]).returncode
        if code != 0:
            raise SystemExit(
                f"building the wheel: the UI build (scripts/build_frontend.sh) failed with exit code {code}, "
                "see above; it needs Node.js >= 20.19 with npm (only to build the wheel)"
            )
        target = Path(self.build_lib) / "slidedp_web" / "ui"
        shutil.rmtree(target, ignore_errors=True)  # a build/ left by an earlier build keeps no stale assets
        shutil.copytree(ROOT / "frontend" / "dist", target)


setup(cmdclass={"build_py": BuildPyWithUI})
