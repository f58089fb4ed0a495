"""Shared test helpers.

The small CK tables ship in ``data/``; the larger real tables (MIOpen find-db, Kernel Tuner
caches) are read from ``../shared/data`` beside the checkout and their tests skip when it is
absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
SHARED_DATA = REPO.parent / "shared" / "data"


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
