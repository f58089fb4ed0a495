"""The error every part of autotune raises and the checks of plain values they share."""

from __future__ import annotations

import math

import numpy as np

from ckpred.errors import CkpredError

#: Default cap on benchmark calls per problem, failures included.
MAX_BENCHMARKS = 16
#: The confidence budget's stated fixed k where its calibration cannot size it (see
#: :func:`~ckpred.autotune.size_confidence`): the manifest's ``autotune.fallback_k``, this when it
#: records none.
FALLBACK_K = 5


class AutotuneError(CkpredError, ValueError):
    """Bad autotune input: a budget, a calibration table or a store line."""



def _count(name: str, value: object) -> int:
    """``value`` when it is an integer >= 1 (not a bool, a float or text): a count."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise AutotuneError(f"{name}={value!r}; allowed: an integer >= 1")
    return int(value)


def _real(value: object) -> float | None:
    """``value`` as a float when it is a real number (int or float, not a bool or text), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond float: not finite
        return math.inf


def _short(value: object, limit: int = 80) -> str:
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in repr(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."
