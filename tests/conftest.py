"""Shared test helpers.

The small CK tables ship in ``data/``; the larger real tables (MIOpen find-db, Kernel Tuner
caches) are read from ``../shared/data`` beside the checkout and their tests skip when it is
absent.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
SHARED_DATA = REPO.parent / "shared" / "data"

# Tests leave nothing in the checkout. Simulated tables are cached under CKPRED_CACHE_DIR (the
# data config's cache_dir; subprocesses inherit it): a temporary directory for the session
# unless the caller set one. Hypothesis keeps no example database.
_OWN_CACHE = "CKPRED_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["CKPRED_CACHE_DIR"] = tempfile.mkdtemp(prefix="ckpred-test-cache-")
# Hypothesis also writes caches of its own (e.g. .hypothesis/constants) under its storage
# directory, read lazily from this variable: point it at a temporary directory too.
_OWN_HYPOTHESIS_DIR = "HYPOTHESIS_STORAGE_DIRECTORY" not in os.environ
if _OWN_HYPOTHESIS_DIR:
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = tempfile.mkdtemp(prefix="ckpred-test-hypothesis-")
# The suite's examples are the same on every run (derandomize), so a red run is reproducible
# and CI does not depend on luck; `HYPOTHESIS_PROFILE=explore pytest ...` draws fresh random
# examples to hunt for new failures (then pin what it finds as a plain regression test).
settings.register_profile("ckpred", database=None, derandomize=True)
settings.register_profile("explore", database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ckpred"))

#: What commands write into the working directory by default; none of it may appear during a test run.
GENERATED = ("runs", "multirun", "outputs", "data/cache", ".hypothesis", "exports")


def _generated() -> set[str]:
    found = {name for name in GENERATED if (REPO / name).exists()}
    if "exports" in found:
        found.discard("exports")
        found |= {f"exports/{p.name}" for p in (REPO / "exports").iterdir() if p.name != "README.md"}
    return found


_BEFORE = _generated()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a test wrote into the checkout (and drop this session's cache)."""
    if _OWN_CACHE:
        shutil.rmtree(os.environ["CKPRED_CACHE_DIR"], ignore_errors=True)
    if _OWN_HYPOTHESIS_DIR:
        shutil.rmtree(os.environ["HYPOTHESIS_STORAGE_DIRECTORY"], ignore_errors=True)
    new = sorted(_generated() - _BEFORE)
    if new:
        session.config.get_terminal_writer().line(
            f"tests wrote into the checkout: {', '.join(new)} (write to tmp_path instead)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def data_file(*parts: str) -> Path:
    """Path of a file shipped under ``data/`` (a missing one is a broken checkout, not a skip)."""
    path = DATA.joinpath(*parts)
    assert path.exists(), f"shipped data file missing: {path}"
    return path


def shared_file(*parts: str) -> Path:
    """Path of a file under ../shared/data, skipping the test cleanly when it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not available: {path}")
    return path


def reading_files(overrides: list[str]) -> list[str]:
    """``overrides`` for a run on a table read from files: without the simulator's shape set
    (``shapes=...``), which such a run does not read (and refuses)."""
    return [o for o in overrides if not o.startswith("shapes")]


# -- the C++ runtimes (scripts/cpp), built once per session into a temporary directory ------------
CPP = REPO / "scripts" / "cpp"


@pytest.fixture(scope="session")
def cpp_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/cpp/build.sh run into a temporary directory (never into the checkout).

    ckpred_select needs an onnxruntime C/C++ package (ONNXRUNTIME_ROOT, or an installed
    onnxruntime CMake package; .ci/run assembles one for CI): without one the tests that run it
    skip, naming what to set (and why CI had none). Any other build failure fails them.
    """
    import subprocess

    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"C++ selector not built: {', '.join(missing)} not installed (apt-get install cmake g++)")
    out = tmp_path_factory.mktemp("cpp_build")
    done = subprocess.run(["bash", str(CPP / "build.sh"), str(out)], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 and "no onnxruntime C/C++ package found" in done.stderr:
        # .ci/run says why it could not assemble one for CI (CKPRED_CI_ONNXRUNTIME)
        ci = os.environ.get("CKPRED_CI_ONNXRUNTIME")
        pytest.skip("C++ selector not built: no onnxruntime C/C++ package; set ONNXRUNTIME_ROOT to the official "
                    "onnxruntime-linux-x64-<version>.tgz unpacked (see scripts/cpp/CMakeLists.txt)"
                    + (f"; CI could not assemble one: {ci}" if ci else ""))
    assert done.returncode == 0, f"scripts/cpp/build.sh failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out


@pytest.fixture(scope="session")
def cpp_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ckpred_autotune_demo compiled with warnings as errors (it needs no onnxruntime)."""
    import subprocess

    if shutil.which("c++") is None:
        pytest.skip("C++ autotune demo not built: no c++ compiler (apt-get install g++)")
    out = tmp_path_factory.mktemp("cpp_demo") / "ckpred_autotune_demo"
    done = subprocess.run(["c++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{CPP}",
                           str(CPP / "ckpred_autotune_demo.cpp"), "-o", str(out), "-pthread"], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out
