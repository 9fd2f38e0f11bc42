"""slidedp.bytecode: ranks get a bytecode cache of their own where the installed packages have none, so a rank's
imports do not compile them from source at every job's start."""

from __future__ import annotations

import os
import py_compile
import sys

import pytest
from slidedp import bytecode
from slidedp.ranks import Launch, rank_env


def _package(root, name: str, modules: int = 4) -> str:
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text("VALUE = 1\n")
    for i in range(modules):
        (folder / f"part{i}.py").write_text(f"X = {i}\n")
    return str(folder)


@pytest.fixture
def fresh():
    """missing() unmemoised for the test, and again after it (a test may have patched it over meanwhile)."""
    real = bytecode.missing
    real.cache_clear()
    yield
    real.cache_clear()


def test_a_package_without_bytecode_is_missing_and_one_compiled_is_not(tmp_path, monkeypatch, fresh):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    plain = _package(tmp_path, "sdp_plain_pkg")
    built = _package(tmp_path, "sdp_built_pkg")
    for name in os.listdir(built):
        py_compile.compile(os.path.join(built, name), doraise=True)
    assert os.path.isdir(os.path.join(built, "__pycache__")) and not os.path.exists(os.path.join(plain, "__pycache__"))
    assert bytecode.missing(("sdp_plain_pkg", "sdp_built_pkg", "sdp_not_installed")) == ("sdp_plain_pkg",)


def test_ranks_get_their_own_cache_only_where_bytecode_is_missing(monkeypatch, fresh, tmp_path):
    monkeypatch.setenv("SLIDEDP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setattr(bytecode, "missing", lambda: ("transformers",))
    env = rank_env(0, 1)
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "cache" / "bytecode")
    assert "PYTHONDONTWRITEBYTECODE" not in env  # the cache is written, in that folder only
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "/somewhere/chosen")
    assert rank_env(0, 1)["PYTHONPYCACHEPREFIX"] == "/somewhere/chosen"  # a prefix set already is kept
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    monkeypatch.setattr(bytecode, "missing", lambda: ())
    env = rank_env(0, 1)
    assert "PYTHONPYCACHEPREFIX" not in env and env["PYTHONDONTWRITEBYTECODE"] == "1"  # nothing to cache


def test_a_rank_writes_the_bytecode_of_what_it_imports_into_the_cache_and_the_next_reads_it(tmp_path, monkeypatch,
                                                                                              fresh):
    """The end to end path: a rank started by Launch where a package has no bytecode (and the launcher's
    environment says not to write any) compiles it once into the ranks' cache; the package tree stays clean."""
    monkeypatch.setenv("SLIDEDP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    pkg = _package(tmp_path, "sdp_rank_pkg")
    monkeypatch.setattr(bytecode, "missing", lambda: ("sdp_rank_pkg",))
    cache = tmp_path / "cache" / "bytecode"
    with Launch("tests.runtime.rank_targets:imports", 1) as ranks:
        ranks.start({"path": str(tmp_path), "module": "sdp_rank_pkg.part1"})
        [seen] = ranks.results(timeout_s=120)
    assert seen == {"prefix": str(cache), "dont_write": False}
    written = sorted(f for d, _, fs in os.walk(cache) for f in fs if d.endswith("sdp_rank_pkg"))
    assert [f.split(".")[0] for f in written] == ["__init__", "part1"] and all(f.endswith(".pyc") for f in written)
    assert not os.path.exists(os.path.join(pkg, "__pycache__"))
    made = {f: os.stat(os.path.join(d, f)).st_mtime_ns for d, _, fs in os.walk(cache) for f in fs
            if d.endswith("sdp_rank_pkg")}
    with Launch("tests.runtime.rank_targets:imports", 1) as ranks:  # the next job's rank reads them
        ranks.start({"path": str(tmp_path), "module": "sdp_rank_pkg.part1"})
        ranks.results(timeout_s=120)
    assert {f: os.stat(os.path.join(d, f)).st_mtime_ns for d, _, fs in os.walk(cache) for f in fs
            if d.endswith("sdp_rank_pkg")} == made
