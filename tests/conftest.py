"""Shared test helpers. Real CK Tile data is read from ../shared/data when it is present."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def shared_file(*parts: str) -> Path:
    """Path of a file under ../shared/data, skipping the test cleanly when it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not available: {path}")
    return path
