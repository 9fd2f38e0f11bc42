"""The repository stands on its own: no tracked text file cites notes kept outside it.

    .venv/bin/python -m pytest -q tests/test_docs_self_contained.py

Code and docs cite docs/architecture.md (and the other files under docs/) for the design and the figures we
measured. What they may not name is a file that only exists beside a checkout: ARCHITECTURE.md, HARDWARE.md or
STYLE.md (matched case-sensitively, so docs/architecture.md is fine), or a path that starts with ../shared or
shared/. A failure names every such line as file:line. This file is the one exception: it spells the names out to
test the pattern.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".py", ".md", ".ts", ".sh", ".toml", ".yml", ".yaml", ".cfg", ".txt", ".html", ".json")
OUTSIDE = re.compile(
    r"\b(?:ARCHITECTURE|HARDWARE|STYLE)\.md\b"  # the notes kept beside the repository
    r"|\.\./shared\b"  # a sibling folder, reached from inside the repository
    r"|(?<![\w.\-/])shared/"  # the same folder named from the checkout's parent
)


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc}): nothing tracked to scan")
    names = [n for n in out.decode("utf-8", "surrogateescape").split("\0") if n.endswith(SUFFIXES)]
    this = Path(__file__).resolve()
    # a file deleted but not yet committed is gone
    return [ROOT / n for n in names if (ROOT / n).is_file() and (ROOT / n).resolve() != this]


def outside_references(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    rel = path.relative_to(ROOT).as_posix()
    return [
        f"{rel}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), start=1)
        if OUTSIDE.search(line)
    ]


def test_pattern_matches_outside_references_only():
    cited = ["see ../shared/notes.txt", "figures from shared/probe/run.json", "as HARDWARE.md says",
             "ARCHITECTURE.md's bound", "(STYLE.md)", "`../shared`"]
    fine = ["docs/architecture.md §4", "docs/hardware.md", "shared memory", "/dev/shm and shared-memory files",
            "runtime/shared/x.py", "https://example.org/shared/x", "unshared/"]
    assert [c for c in cited if not OUTSIDE.search(c)] == []
    assert [f for f in fine if OUTSIDE.search(f)] == []


def test_no_tracked_file_cites_files_outside_the_repository():
    files = tracked_text_files()
    assert files, "git ls-files listed no text file"
    found = [hit for path in files for hit in outside_references(path)]
    assert not found, (
        "these lines cite files outside the repository; cite docs/architecture.md (or state the fact inline):\n"
        + "\n".join(found)
    )
