"""Tune on first call: benchmark a few of the model's top kernels, keep the fastest, remember it.

A model ranks the kernels of a problem it has never seen; it cannot see timing noise or which
of several near-equal kernels a given GPU runs fastest. Measuring the model's first few
candidates fixes most of what the ranking misses, and a persistent :class:`ResultStore` makes
that cost a one-off per (model, op, problem): the next call, process or run reads the measured
winner back instead of benchmarking again.

:func:`autotune` walks the valid kernels in model order and calls the caller's ``benchmark``
on each until its :class:`Budget` says stop. A benchmark that raises or returns a non-finite or
non-positive time is recorded as a failure and skipped. The budgets:

* :class:`FixedK` -- the first ``k`` successful measurements;
* :class:`TimeBudget` -- until the measured kernel seconds (or wall seconds spent inside
  ``benchmark``) reach a limit;
* :class:`Confidence` -- per problem, as many candidates as needed for the probability that
  the best of them is within ``within`` of the best kernel to reach ``target``. That
  probability comes from a calibration fitted on out-of-fold predictions: a
  :class:`LogisticCalibration` (:func:`fit_logistic`: score gaps and the problem's size) or a
  score-gap :class:`Calibration` table (:func:`calibrate`). Problems the calibration finds sure
  cost one benchmark, unsure ones more. ``export`` writes it into the model's manifest (key
  ``autotune``).

Every budget stops at ``max_benchmarks`` calls; when the soft budget is spent but every call so
far failed, :func:`autotune` keeps going (within ``max_benchmarks``) until one succeeds.

Store format (``ckpred.autotune/1``)
-------------------------------------
A UTF-8 text file of JSON objects, one per line (JSON lines), append-only. Each line::

    {"format": "ckpred.autotune/1", "model": "<sha256 of the selector graph>",
     "op": "grouped_conv_fwd", "problem": "n=1,c=256,...", "kernel_id": 3,
     "kernel": "<name>", "seconds": 1.2e-05, "policy": "fixed(k=2)",
     "measured": [{"kernel_id": 3, "kernel": "<name>", "seconds": 1.2e-05},
                  {"kernel_id": 7, "kernel": "<name>", "error": "RuntimeError: ..."}],
     "created": "2026-11-25T08:40:00Z", "writer": "python"}

* The key is ``(model, op, problem)``; ``problem`` is ``field=value`` pairs joined by commas in
  the manifest's problem-field order (defaults filled in). The last line of a key wins.
* ``model`` is the sha256 of the selector graph recorded in the manifest; entries of any other
  model (a re-trained or re-exported one) are ignored on lookup, so a stale model's winners are
  never served.
* Writers hold an exclusive ``flock`` on ``<store>.lock`` while appending; a line is written
  with one ``write`` call. Readers read complete lines only and skip a line that does not parse
  (logged, counted in :attr:`ResultStore.skipped_lines`).
* Bounded: when the file holds more than twice ``max_entries`` lines, the writer compacts it
  under the lock (last line per key, the newest ``max_entries`` keys) into a temporary file
  that replaces the store atomically (``rename``).

The C++ header ``scripts/cpp/ckpred_autotune.hpp`` reads and writes the same file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ckpred.errors import CkpredError, ModelMismatchError

log = logging.getLogger(__name__)

__all__ = ["STORE_FORMAT", "Measurement", "TuneResult", "Budget", "FixedK", "TimeBudget", "Confidence",
           "Calibration", "LogisticCalibration", "calibrate", "calibration_from_oof", "fit_logistic",
           "load_calibration", "ranked_problems", "signal_features", "top_j_efficiency", "ResultStore", "problem_key", "autotune", "autotune_ranked"]

#: Format tag of every store line.
STORE_FORMAT = "ckpred.autotune/1"
#: Format tag of a calibration table.
CALIBRATION_FORMAT = "ckpred.autotune.calibration/1"
#: Format tag of a logistic calibration (:class:`LogisticCalibration`).
LOGISTIC_FORMAT = "ckpred.autotune.logistic/1"
#: Features of the logistic calibration computed from the ranked scores (then one log2 per
#: problem field it uses, then ``log2_size``); see :func:`signal_features`.
SCORE_FEATURES = ("gap2", "gap3", "gap4", "gap5", "top", "spread5", "valid")
#: Default cap on benchmark calls per problem, failures included.
MAX_BENCHMARKS = 16


class AutotuneError(CkpredError, ValueError):
    """Bad autotune input: a budget, a calibration table or a store line."""


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    """One benchmark call: the kernel, its time in seconds, or why it failed."""

    kernel_id: int
    kernel: str
    seconds: float | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.seconds is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kernel_id": self.kernel_id, "kernel": self.kernel}
        if self.ok:
            out["seconds"] = self.seconds
        else:
            out["error"] = self.error
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Measurement":
        seconds = d.get("seconds")
        return cls(int(d["kernel_id"]), str(d["kernel"]), None if seconds is None else float(seconds),
                   str(d.get("error", "")))


@dataclass(frozen=True)
class TuneResult:
    """What :func:`autotune` found for one problem.

    Attributes
    ----------
    problem : str
        The problem key (see :func:`problem_key`).
    kernel, kernel_id, seconds
        The measured best (``None`` when nothing was measured successfully).
    measured : tuple of Measurement
        Every benchmark call in order (empty when the answer came from the store).
    from_store : bool
        The answer was read from the store; nothing was benchmarked.
    policy : str
        The budget that was spent.
    stop : str
        Why the search stopped.
    """

    problem: str
    kernel: str | None
    kernel_id: int | None
    seconds: float | None
    measured: tuple[Measurement, ...] = ()
    from_store: bool = False
    policy: str = ""
    stop: str = ""

    @property
    def ok(self) -> bool:
        return self.kernel is not None

    @property
    def benchmarks(self) -> int:
        return len(self.measured)


# ---------------------------------------------------------------------------------------------
# Budgets
# ---------------------------------------------------------------------------------------------
@dataclass
class _Spent:
    attempts: int = 0
    successes: int = 0
    kernel_s: float = 0.0
    wall_s: float = 0.0


class Budget:
    """How many candidates to benchmark. Subclasses say when the soft budget is spent.

    Parameters
    ----------
    max_benchmarks : int
        Hard cap on benchmark calls per problem, failures included.
    """

    max_benchmarks: int

    def _check(self) -> None:
        if int(self.max_benchmarks) < 1:
            raise AutotuneError(f"{type(self).__name__}.max_benchmarks={self.max_benchmarks!r}; allowed: an integer >= 1")

    def planned(self, scores: Sequence[float], problem: Mapping[str, float] | None = None) -> int | None:
        """Successful measurements wanted for a problem with these ranked scores (None: no count)."""
        return None

    def spent(self, scores: Sequence[float], spent: _Spent) -> bool:
        """True when the soft budget is used up."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass
class FixedK(Budget):
    """Benchmark the model's first ``k`` candidates (``k`` successful measurements)."""

    k: int = 2
    max_benchmarks: int = MAX_BENCHMARKS

    def __post_init__(self) -> None:
        if int(self.k) < 1:
            raise AutotuneError(f"FixedK.k={self.k!r}; allowed: an integer >= 1")
        self._check()

    def planned(self, scores: Sequence[float], problem: Mapping[str, float] | None = None) -> int:
        return int(self.k)

    def spent(self, scores: Sequence[float], spent: _Spent) -> bool:
        return spent.successes >= int(self.k)

    def describe(self) -> str:
        return f"fixed(k={self.k})"


@dataclass
class _Sized(Budget):
    """A :class:`Confidence` budget once sized for one problem: ``k`` successes, its own name."""

    k: int
    policy: str
    max_benchmarks: int = MAX_BENCHMARKS

    def spent(self, scores: Sequence[float], spent: _Spent) -> bool:
        return spent.successes >= self.k

    def describe(self) -> str:
        return self.policy


@dataclass
class TimeBudget(Budget):
    """Benchmark until ``seconds`` are spent: measured kernel time (``clock="kernel"``, the sum of
    the times ``benchmark`` returned) or wall time inside ``benchmark`` (``clock="wall"``)."""

    seconds: float = 1.0
    clock: str = "kernel"
    max_benchmarks: int = MAX_BENCHMARKS

    def __post_init__(self) -> None:
        if not (math.isfinite(float(self.seconds)) and float(self.seconds) > 0):
            raise AutotuneError(f"TimeBudget.seconds={self.seconds!r}; allowed: a finite number > 0")
        if self.clock not in ("kernel", "wall"):
            raise AutotuneError(f"TimeBudget.clock={self.clock!r}; allowed: 'kernel', 'wall'")
        self._check()

    def spent(self, scores: Sequence[float], spent: _Spent) -> bool:
        used = spent.kernel_s if self.clock == "kernel" else spent.wall_s
        return used >= float(self.seconds)

    def describe(self) -> str:
        return f"time({self.clock}={self.seconds:g}s)"


def _check_within(within: Sequence[float], where: str) -> None:
    """Refuse tolerances that are not distinct fractions in (0, 1), by name."""
    if not all(0 < w < 1 for w in within) or len(set(within)) != len(within):
        raise AutotuneError(f"{where}: within={list(within)}; allowed: distinct fractions in (0, 1)")


def _check_format(d: Any, expected: str, where: str) -> None:
    """Refuse a calibration record of another format (or not a mapping at all), by name."""
    if not isinstance(d, Mapping) or d.get("format") != expected:
        got = d.get("format") if isinstance(d, Mapping) else type(d).__name__
        raise AutotuneError(f"{where}: format {got!r}, expected {expected!r}")


@dataclass(frozen=True)
class Calibration:
    """P(best of the model's top j is within ``within`` of the best kernel), by score-gap bin.

    The *score gap* of a problem is the model's top score minus its ``gap_to``-th score (the
    model output's own units; infinite when fewer kernels are valid). ``gap_to=2`` is the margin
    of the top candidate over the next; a larger ``gap_to`` looks past near-duplicate kernels
    (two pipelines of one tile) that a model scores alike. Problems are binned by it
    (``edges``: the inner bin edges, increasing), and ``probability[w][b][j - 1]`` is the
    probability for ``within[w]``, bin ``b`` and the top ``j`` candidates, non-decreasing in
    ``j`` and in the gap.

    Attributes
    ----------
    within : tuple of float
        Tolerances (0.02 = within 2% of the best).
    edges : tuple of float
        Inner edges of the score-gap bins (len = bins - 1).
    probability : tuple
        ``[len(within)][bins][max_k]`` probabilities.
    counts : tuple of int
        Problems per bin in the fit.
    """

    within: tuple[float, ...]
    edges: tuple[float, ...]
    probability: tuple[tuple[tuple[float, ...], ...], ...]
    counts: tuple[int, ...]
    gap_to: int = 2

    @property
    def max_k(self) -> int:
        return len(self.probability[0][0])

    def to_dict(self) -> dict[str, Any]:
        return {"format": CALIBRATION_FORMAT, "feature": "score_gap", "gap_to": self.gap_to,
                "within": list(self.within),
                "edges": list(self.edges), "counts": list(self.counts),
                "probability": [[list(row) for row in table] for table in self.probability]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "calibration") -> "Calibration":
        _check_format(d, CALIBRATION_FORMAT, where)
        try:
            within = tuple(float(x) for x in d["within"])
            edges = tuple(float(x) for x in d["edges"])
            prob = tuple(tuple(tuple(float(p) for p in row) for row in table) for table in d["probability"])
            counts = tuple(int(c) for c in d["counts"])
            gap_to = int(d.get("gap_to", 2))
        except (KeyError, TypeError, ValueError) as exc:
            raise AutotuneError(f"{where}: malformed table ({exc!r}); keys: within, edges, counts, probability") from exc
        bins = len(edges) + 1
        if len(prob) != len(within) or any(len(t) != bins for t in prob) or len(counts) != bins \
                or len({len(r) for t in prob for r in t}) != 1:
            raise AutotuneError(f"{where}: probability must be [{len(within)} within][{bins} bins][max_k], "
                                f"counts [{bins}]")
        if gap_to < 2:
            raise AutotuneError(f"{where}: gap_to={gap_to}; allowed: an integer >= 2")
        _check_within(within, where)
        if not all(math.isfinite(e) for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
            raise AutotuneError(f"{where}: edges={list(edges)}; allowed: finite, strictly increasing")
        if not prob[0][0] or not all(0 <= p <= 1 for t in prob for r in t for p in r):
            raise AutotuneError(f"{where}: probability holds a value outside [0, 1] (or an empty row)")
        if any(c < 0 for c in counts):
            raise AutotuneError(f"{where}: counts={list(counts)}; allowed: integers >= 0")
        return cls(within, edges, prob, counts, gap_to)

    def bin_of(self, gap: float) -> int:
        return int(np.searchsorted(np.asarray(self.edges), gap, side="right"))

    def needed(self, scores: Sequence[float], target: float, within: float,
               problem: Mapping[str, float] | None = None) -> int:
        """Smallest j whose probability reaches ``target``; ``max_k`` when none does (``problem``
        is not used: the table reads the scores only)."""
        if within not in self.within:
            raise AutotuneError(f"no calibration for within={within!r}; calibrated: {list(self.within)}")
        table = self.probability[self.within.index(within)]
        if len(scores) < 2:
            return 1
        row = table[self.bin_of(score_gap(scores, self.gap_to))]
        for j, p in enumerate(row, 1):
            if p >= target:
                return j
        return self.max_k


@dataclass
class Confidence(Budget):
    """As many candidates as the calibration says are needed for
    P(best measured within ``within`` of the best) >= ``target``.

    ``calibration`` is a :class:`Calibration` (or its dict); :meth:`KernelSelector.autotune
    <ckpred.runtime.KernelSelector.autotune>` fills it from the model's manifest when omitted.
    """

    target: float = 0.95
    within: float = 0.05
    calibration: "Calibration | LogisticCalibration | Mapping[str, Any] | None" = None
    max_benchmarks: int = MAX_BENCHMARKS

    def __post_init__(self) -> None:
        if not 0 < float(self.target) <= 1:
            raise AutotuneError(f"Confidence.target={self.target!r}; allowed: a probability in (0, 1]")
        if isinstance(self.calibration, Mapping):
            self.calibration = load_calibration(self.calibration)
        if self.calibration is not None and float(self.within) not in self.calibration.within:
            raise AutotuneError(f"Confidence.within={self.within!r}; calibrated: {list(self.calibration.within)}")
        self._check()

    def with_calibration(self, calibration: "Calibration | LogisticCalibration | Mapping[str, Any] | None",
                         where: str) -> "Confidence":
        if self.calibration is not None:
            return self
        if calibration is None:
            raise AutotuneError(f"{where}: no autotune calibration in the manifest (it is fitted on a train "
                                "run's out-of-fold scores: `export run_dir=<run>` of a k-fold CV run), and "
                                "Confidence(calibration=...) not given")
        return Confidence(self.target, self.within, calibration, self.max_benchmarks)

    def planned(self, scores: Sequence[float], problem: Mapping[str, float] | None = None) -> int:
        """Successful measurements wanted (``problem``: field values, for a logistic calibration)."""
        if self.calibration is None:
            raise AutotuneError("Confidence budget without a calibration table")
        return self.calibration.needed(scores, float(self.target), float(self.within), problem=problem)

    def spent(self, scores: Sequence[float], spent: _Spent) -> bool:
        return spent.successes >= self.planned(scores)

    def describe(self) -> str:
        return f"confidence(target={self.target:g},within={self.within:g})"


def score_gap(scores: Sequence[float], gap_to: int = 2) -> float:
    """Top score minus the ``gap_to``-th highest (inf with fewer finite scores)."""
    s = np.asarray(scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    if len(s) < gap_to:
        return math.inf
    top = np.sort(s)[::-1]
    return float(top[0] - top[gap_to - 1])


def signal_features(scores: Sequence[float], values: Sequence[float]) -> np.ndarray:
    """The logistic calibration's features of one problem, in a fixed order.

    :data:`SCORE_FEATURES` from the ranked scores of the valid candidates (best first): the top
    score minus the 2nd..5th (NaN with fewer candidates), the top score, the standard deviation
    of the top five and the number of valid candidates; then ``log2(1 + |v|)`` of each problem
    value, then their sum (``log2_size``, a size proxy that grows with the work of the problem).
    """
    s = np.asarray(scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    gaps = [float(s[0] - s[g - 1]) if len(s) >= g else math.nan for g in (2, 3, 4, 5)]
    head = [float(s[0]) if len(s) else math.nan, float(np.std(s[:5])) if len(s) else math.nan, float(len(s))]
    logs = np.log2(1.0 + np.abs(np.asarray(values, dtype=np.float64)))
    return np.asarray([*gaps, *head, *logs, float(logs.sum())], dtype=np.float64)


@dataclass(frozen=True)
class LogisticCalibration:
    """P(best of the model's top j is within ``within`` of the best kernel), one logistic model per
    (within, j) on :func:`signal_features` -- the score gaps and the problem's size.

    A feature is filled with ``fill`` when missing (a gap past the last candidate), clipped to
    the training range ``[lo, hi]`` and standardised by ``mean``/``scale``; then ``P_j =
    1 / (1 + exp(-(intercept[w][j] + coef[w][j] . x)))``, made non-decreasing in j.

    Attributes
    ----------
    within : tuple of float
        Tolerances.
    fields : tuple of str
        The problem fields whose values are features (in this order).
    fill, lo, hi, mean, scale : tuple of float
        Per feature (:data:`SCORE_FEATURES`, one ``log2_<field>`` per field, ``log2_size``).
    coef : tuple
        ``[len(within)][max_k][features]``.
    intercept : tuple
        ``[len(within)][max_k]``.
    problems : int
        Problems in the fit.
    """

    within: tuple[float, ...]
    fields: tuple[str, ...]
    fill: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[tuple[tuple[float, ...], ...], ...]
    intercept: tuple[tuple[float, ...], ...]
    problems: int = 0

    @property
    def max_k(self) -> int:
        return len(self.intercept[0])

    @property
    def feature_names(self) -> tuple[str, ...]:
        return (*SCORE_FEATURES, *(f"log2_{f}" for f in self.fields), "log2_size")

    def to_dict(self) -> dict[str, Any]:
        return {"format": LOGISTIC_FORMAT, "within": list(self.within), "fields": list(self.fields),
                "features": list(self.feature_names), "fill": list(self.fill), "lo": list(self.lo),
                "hi": list(self.hi), "mean": list(self.mean), "scale": list(self.scale),
                "coef": [[list(r) for r in t] for t in self.coef], "intercept": [list(r) for r in self.intercept],
                "problems": self.problems}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "calibration") -> "LogisticCalibration":
        _check_format(d, LOGISTIC_FORMAT, where)
        try:
            within = tuple(float(x) for x in d["within"])
            fields = tuple(str(x) for x in d["fields"])
            vec = {k: tuple(float(x) for x in d[k]) for k in ("fill", "lo", "hi", "mean", "scale")}
            coef = tuple(tuple(tuple(float(c) for c in r) for r in t) for t in d["coef"])
            intercept = tuple(tuple(float(c) for c in r) for r in d["intercept"])
            problems = int(d.get("problems", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise AutotuneError(f"{where}: malformed logistic calibration ({exc!r}); keys: within, fields, fill, "
                                "lo, hi, mean, scale, coef, intercept") from exc
        n = len(SCORE_FEATURES) + len(fields) + 1
        _check_within(within, where)
        if any(len(v) != n for v in vec.values()) or len(coef) != len(within) or len(intercept) != len(within) \
                or not intercept or not intercept[0] or any(len(r) != len(intercept[0]) for r in intercept) \
                or any(len(t) != len(intercept[0]) or any(len(r) != n for r in t) for t in coef):
            raise AutotuneError(f"{where}: fill/lo/hi/mean/scale must hold {n} features, coef "
                                f"[{len(within)} within][max_k][{n}], intercept [{len(within)} within][max_k]")
        flat = [x for v in vec.values() for x in v] + [c for t in coef for r in t for c in r] + \
            [c for r in intercept for c in r]
        if not all(math.isfinite(x) for x in flat) or not all(x > 0 for x in vec["scale"]):
            raise AutotuneError(f"{where}: non-finite numbers, or a scale <= 0")
        return cls(within, fields, vec["fill"], vec["lo"], vec["hi"], vec["mean"], vec["scale"], coef, intercept,
                   problems)

    def standardised(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features, dtype=np.float64)
        x = np.where(np.isnan(x), np.asarray(self.fill), x)
        x = np.clip(x, np.asarray(self.lo), np.asarray(self.hi))
        return (x - np.asarray(self.mean)) / np.asarray(self.scale)

    def probabilities(self, scores: Sequence[float], problem: Mapping[str, float], within: float) -> np.ndarray:
        """P_j for j = 1..max_k (non-decreasing)."""
        if within not in self.within:
            raise AutotuneError(f"no calibration for within={within!r}; calibrated: {list(self.within)}")
        missing = [f for f in self.fields if f not in problem]
        if missing:
            raise AutotuneError(f"logistic calibration needs problem fields {missing}")
        return self.predict(signal_features(scores, [float(problem[f]) for f in self.fields]), within)

    def predict(self, features: np.ndarray, within: float) -> np.ndarray:
        """P_j for j = 1..max_k (non-decreasing) of :func:`signal_features` rows (one or many)."""
        w = self.within.index(within)
        z = np.asarray(self.intercept[w]) + self.standardised(features) @ np.asarray(self.coef[w]).T
        return np.maximum.accumulate(1.0 / (1.0 + np.exp(-z)), axis=-1)

    def needed(self, scores: Sequence[float], target: float, within: float,
               problem: Mapping[str, float] | None = None) -> int:
        """Smallest j whose probability reaches ``target``; ``max_k`` when none does."""
        if problem is None:
            raise AutotuneError("a logistic calibration sizes the budget from the problem's fields: pass problem")
        if len(scores) < 2:
            return 1
        p = self.probabilities(scores, problem, within)
        hit = np.flatnonzero(p >= target)
        return int(hit[0]) + 1 if len(hit) else self.max_k


def load_calibration(d: Mapping[str, Any], where: str = "calibration") -> "Calibration | LogisticCalibration":
    """A calibration of either kind from its dict (by its ``format``)."""
    if isinstance(d, Mapping) and d.get("format") == LOGISTIC_FORMAT:
        return LogisticCalibration.from_dict(d, where)
    return Calibration.from_dict(d, where)


def fit_logistic(features: np.ndarray, top_rel: np.ndarray, fields: Sequence[str], *,
                 within: Iterable[float] = (0.01, 0.02, 0.05, 0.1), c: float = 1.0) -> LogisticCalibration:
    """Fit a :class:`LogisticCalibration` (L2-regularised, ``C=c``) on calibration problems.

    Parameters
    ----------
    features : ndarray, shape (problems, features)
        :func:`signal_features` of each problem.
    top_rel : ndarray, shape (problems, max_k)
        Efficiency of the best of the model's top j, j = 1..max_k.
    fields : sequence of str
        The problem fields of ``features`` (in order).
    """
    from sklearn.linear_model import LogisticRegression

    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(SCORE_FEATURES) + len(fields) + 1 or len(x) != len(top_rel) or not len(x):
        raise AutotuneError(f"fit_logistic: features {x.shape}, top_rel {np.shape(top_rel)}, {len(fields)} fields")
    observed = np.where(np.isnan(x), -np.inf, x).max(axis=0)
    fill = np.where(np.isfinite(observed), observed, 0.0)  # a missing gap: as large as the largest seen
    x = np.where(np.isnan(x), fill, x)
    lo, hi = x.min(axis=0), x.max(axis=0)
    mean, std = x.mean(axis=0), x.std(axis=0)
    scale = np.where(std > 0, std, 1.0)
    z = (x - mean) / scale
    within = tuple(float(w) for w in within)
    coef, intercept = [], []
    for w in within:
        rows, icpt = [], []
        for j in range(top_rel.shape[1]):
            hit = top_rel[:, j] >= 1.0 - w - 1e-12
            if hit.all() or not hit.any():  # one class: a constant, with one pseudo-count of the other
                rate = (hit.sum() + (0.0 if hit.all() else 1.0)) / (len(hit) + 1.0)
                rows.append(tuple(0.0 for _ in range(z.shape[1])))
                icpt.append(float(np.log(rate / (1.0 - rate))))
                continue
            m = LogisticRegression(C=c, max_iter=2000).fit(z, hit)
            rows.append(tuple(float(v) for v in m.coef_[0]))
            icpt.append(float(m.intercept_[0]))
        coef.append(tuple(rows))
        intercept.append(tuple(icpt))
    return LogisticCalibration(within, tuple(fields), tuple(map(float, fill)), tuple(map(float, lo)),
                               tuple(map(float, hi)), tuple(map(float, mean)), tuple(map(float, scale)),
                               tuple(coef), tuple(intercept), int(len(x)))


def _pav(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted isotonic (non-decreasing) regression by pool-adjacent-violators."""
    blocks: list[list[float]] = []  # [value, weight, length]
    for v, w in zip(values, weights):
        blocks.append([float(v), float(max(w, 1e-12)), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([[v] * n for v, _, n in blocks])


def ranked_problems(shapes: Sequence[Any], perf: Sequence[float], scores: Sequence[float],
                    selectable: Sequence[bool] | None = None, *, tie_order: Sequence[Any] | None = None,
                    max_k: int = 10) -> Iterable[tuple[Any, np.ndarray, np.ndarray]]:
    """Per problem with a valid measured kernel: its key, the scores of its selectable kernels in
    model order (ties by ``tie_order``, default row order) and the efficiency of the best of the
    top j, j = 1..max_k (the measured best over every row of the problem is 100%)."""
    import pandas as pd

    frame = pd.DataFrame({"shape": np.asarray(shapes, dtype=object), "perf": np.asarray(perf, dtype=np.float64),
                          "score": np.asarray(scores, dtype=np.float64),
                          "sel": np.ones(len(perf), bool) if selectable is None else np.asarray(selectable, bool),
                          "tie": np.arange(len(perf)) if tie_order is None else np.asarray(tie_order)})
    for shape, one in frame.groupby("shape", sort=False):
        best = one["perf"].max()
        cand = one[one["sel"]]
        if best <= 0 or cand.empty:
            continue
        cand = cand.sort_values(["score", "tie"], ascending=[False, True], kind="stable")
        yield shape, cand["score"].to_numpy(), top_j_efficiency(cand["perf"].to_numpy(), best, max_k)


def top_j_efficiency(perf: np.ndarray, best: float, max_k: int) -> np.ndarray:
    """Efficiency of the best of the first j of ``perf`` (model order), j = 1..max_k; past the
    last candidate it stays at the last value (0 when there is none)."""
    rel = np.maximum.accumulate(np.asarray(perf, dtype=np.float64)[:max_k] / best) if len(perf) else np.zeros(1)
    return np.concatenate([rel, np.full(max_k - len(rel), rel[-1])])


def calibrate(shapes: Sequence[Any], perf: Sequence[float], scores: Sequence[float],
              selectable: Sequence[bool] | None = None, *, within: Iterable[float] = (0.01, 0.02, 0.05, 0.1),
              bins: int = 6, max_k: int = 10, prior_failures: float = 1.0,
              tie_order: Sequence[Any] | None = None, gap_to: int = 2) -> Calibration:
    """Fit the :class:`Calibration` table from out-of-fold predictions.

    Parameters
    ----------
    shapes : array-like
        Problem key of each row (rows of a problem need not be contiguous).
    perf : array-like of float
        Measured performance, higher is better, 0 for failed rows (as in ``train``'s
        ``oof_predictions.parquet`` column ``perf``).
    scores : array-like of float
        Out-of-fold model scores (``score_model``), higher is better.
    selectable : array-like of bool, optional
        Rows the selector may pick (the validity mask); default all.
    within : iterable of float
        Tolerances to calibrate.
    bins : int
        Score-gap bins (quantiles of the gap over problems).
    max_k : int
        Largest top-j tabulated.
    prior_failures : float
        Pseudo-count of misses added to every bin (``hits / (n + prior_failures)``), so a
        small bin that never missed still does not claim certainty.
    tie_order : array-like, optional
        Secondary sort key for equal scores (the exported selector's kernel id); default row order.
    gap_to : int
        The score gap is the top score minus the ``gap_to``-th (see :class:`Calibration`).

    Returns
    -------
    Calibration
    """
    within = tuple(float(w) for w in within)
    if bins < 1 or max_k < 1 or gap_to < 2:
        raise AutotuneError(f"calibrate: bins={bins!r}, max_k={max_k!r}, gap_to={gap_to!r}; allowed: integers "
                            ">= 1 (gap_to >= 2)")
    gaps, rel_top = [], []
    for _, cand_scores, rel in ranked_problems(shapes, perf, scores, selectable, tie_order=tie_order, max_k=max_k):
        gaps.append(score_gap(cand_scores, gap_to))
        rel_top.append(rel)
    if not gaps:
        raise AutotuneError("calibrate: no problem with a valid measured kernel")
    gaps_a, rel_a = np.asarray(gaps), np.vstack(rel_top)
    finite = gaps_a[np.isfinite(gaps_a)]
    qs = np.quantile(finite, np.linspace(0, 1, bins + 1)[1:-1]) if len(finite) else np.array([])
    edges = np.unique(qs)
    if len(finite):
        edges = edges[edges > finite.min()]  # an edge at the smallest gap would leave its left bin empty
    which = np.searchsorted(edges, gaps_a, side="right")
    n_bins = len(edges) + 1
    counts = np.bincount(which, minlength=n_bins)
    tables = []
    for w in within:
        hit = rel_a >= 1.0 - w - 1e-12
        prob = np.zeros((n_bins, max_k))
        for b in range(n_bins):
            if counts[b]:
                prob[b] = hit[which == b].sum(axis=0) / (counts[b] + prior_failures)
        for j in range(max_k):  # non-decreasing in the gap
            filled = counts > 0
            if filled.any():
                prob[filled, j] = _pav(prob[filled, j], counts[filled])
                # an empty bin takes the nearest filled bin below it (or above, at the bottom)
                for b in np.flatnonzero(~filled):
                    below = np.flatnonzero(filled[:b])
                    prob[b, j] = prob[below[-1], j] if len(below) else prob[np.flatnonzero(filled)[0], j]
        prob = np.maximum.accumulate(prob, axis=1)
        tables.append(tuple(tuple(round(float(p), 6) for p in row) for row in prob))
    return Calibration(within, tuple(float(e) for e in edges), tuple(tables), tuple(int(c) for c in counts), gap_to)


def calibration_from_oof(oof: Any, kernel_ids: Mapping[str, int] | None = None, *, kind: str = "table",
                         problems: Any = None, **options: Any) -> dict[str, Any]:
    """The manifest's ``autotune`` section from a train run's ``oof_predictions.parquet`` frame.

    Parameters
    ----------
    oof : DataFrame
        Columns ``shape``, ``kernel_name``, ``perf``, ``selectable``, ``score_model``.
    kernel_ids : mapping, optional
        Kernel name -> catalogue id, so equal scores rank as the exported selector ranks them.
    kind : {"table", "logistic"}
        :func:`calibrate` (score-gap bins) or :func:`fit_logistic` (score gaps and problem size).
    problems : DataFrame, optional
        ``logistic``: indexed by the ``shape`` keys, one column per problem field it uses.
    **options
        Passed to :func:`calibrate` (``logistic``: ``within`` and ``max_k`` only).
    """
    ties = None if kernel_ids is None else oof["kernel_name"].map(dict(kernel_ids)).to_numpy()
    args = (oof["shape"].to_numpy(), oof["perf"].to_numpy(), oof["score_model"].to_numpy(), oof["selectable"].to_numpy())
    if kind == "table":
        return calibrate(*args, tie_order=ties, **options).to_dict()
    if kind != "logistic" or problems is None:
        raise AutotuneError(f"calibration kind={kind!r} (problems given: {problems is not None}); allowed: 'table', "
                            "or 'logistic' with the problems' field values")
    max_k = int(options.get("max_k", 10))
    fields = [str(c) for c in problems.columns]
    feats, rels = [], []
    for shape, scores, rel in ranked_problems(*args, tie_order=ties, max_k=max_k):
        if shape not in problems.index:
            raise AutotuneError(f"calibration: problem {shape!r} of the out-of-fold rows has no field values")
        feats.append(signal_features(scores, problems.loc[shape].to_numpy(np.float64)))
        rels.append(rel)
    if not feats:
        raise AutotuneError("calibrate: no problem with a valid measured kernel")
    return fit_logistic(np.vstack(feats), np.vstack(rels), fields,
                        within=options.get("within", (0.01, 0.02, 0.05, 0.1))).to_dict()


# ---------------------------------------------------------------------------------------------
# The persistent store
# ---------------------------------------------------------------------------------------------
def problem_key(problem: Mapping[str, Any], fields: Sequence[str] | None = None) -> str:
    """``field=value`` pairs joined by commas, in ``fields`` order (default: the mapping's)."""
    names = list(fields) if fields is not None else list(problem)
    return ",".join(f"{name}={int(problem[name])}" for name in names)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ResultStore:
    """The persistent, process-safe, bounded store of measured winners (format in the module doc).

    Parameters
    ----------
    path : path
        The JSON-lines file (created on first write, its directory too; ``~`` is expanded).
    max_entries : int, default=10000
        Keys kept by compaction (newest first).
    """

    def __init__(self, path: str | Path, *, max_entries: int = 10000) -> None:
        if int(max_entries) < 1:
            raise AutotuneError(f"ResultStore.max_entries={max_entries!r}; allowed: an integer >= 1")
        self.path = Path(path).expanduser()
        self.max_entries = int(max_entries)
        self.skipped_lines = 0
        self._index: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._lines = 0
        self._offset = 0
        self._ino: tuple[int, int] | None = None

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    # -- reading ---------------------------------------------------------------------------
    def _parse(self, line: bytes, lineno: int) -> dict[str, Any] | None:
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or entry.get("format") != STORE_FORMAT:
                raise ValueError(f"format {entry.get('format') if isinstance(entry, dict) else None!r}, "
                                 f"expected {STORE_FORMAT!r}")
            for key in ("model", "op", "problem", "kernel", "kernel_id", "seconds"):
                if key not in entry:
                    raise ValueError(f"missing key {key!r}")
            return entry
        except ValueError as exc:
            self.skipped_lines += 1
            log.warning("%s:%d: skipped a store line that does not parse (%s)", self.path, lineno, exc)
            return None

    def refresh(self) -> None:
        """Read what other processes appended since the last read (all of it after a compaction)."""
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            self._index, self._lines, self._offset, self._ino = {}, 0, 0, None
            return
        with fh:  # identity and size of the file actually opened (a compaction may replace it)
            st = os.fstat(fh.fileno())
            ino = (st.st_dev, st.st_ino)
            if ino != self._ino or st.st_size < self._offset:
                self._index, self._lines, self._offset, self._ino = {}, 0, 0, ino
            if st.st_size == self._offset:
                return
            fh.seek(self._offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # complete lines only; a line being written is read next time
        for raw in data[:end].splitlines():
            self._lines += 1
            if not raw.strip():
                continue
            entry = self._parse(raw, self._lines)
            if entry is not None:
                self._index.pop(self._key(entry), None)  # re-insert: dict order = newest last
                self._index[self._key(entry)] = entry
        self._offset += end

    @staticmethod
    def _key(entry: Mapping[str, Any]) -> tuple[str, str, str]:
        return (str(entry["model"]), str(entry["op"]), str(entry["problem"]))

    def get(self, model: str, op: str, problem: str) -> dict[str, Any] | None:
        """The newest entry of ``(model, op, problem)``, or None (entries of other models never match)."""
        self.refresh()
        return self._index.get((model, op, problem))

    def entries(self, model: str | None = None) -> list[dict[str, Any]]:
        """Current entries (last per key), oldest first; only ``model``'s when given."""
        self.refresh()
        return [e for e in self._index.values() if model is None or e["model"] == model]

    # -- writing ---------------------------------------------------------------------------
    def _locked(self) -> Any:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def put(self, entry: Mapping[str, Any]) -> None:
        """Append one entry (adds ``format``, ``created`` and ``writer`` when absent); compacts
        when the file holds more than ``2 * max_entries`` lines."""
        record = {"format": STORE_FORMAT, **entry}
        record.setdefault("created", _now())
        record.setdefault("writer", "python")
        for key in ("model", "op", "problem", "kernel", "kernel_id", "seconds"):
            if key not in record:
                raise AutotuneError(f"store entry lacks {key!r}; required: model, op, problem, kernel, kernel_id, seconds")
        line = json.dumps(record, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        fd = self._locked()
        try:
            out = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(out).st_size
                if size:  # a crashed writer's partial line must not swallow ours
                    with open(self.path, "rb") as fh:
                        fh.seek(size - 1)
                        if fh.read(1) != b"\n":
                            line = b"\n" + line
                os.write(out, line)
            finally:
                os.close(out)
            self.refresh()
            if self._lines > 2 * self.max_entries:
                self._compact_locked()
        finally:
            os.close(fd)

    def compact(self) -> None:
        """Rewrite the file with the last line of each key, newest ``max_entries`` keys."""
        fd = self._locked()
        try:
            self._compact_locked()
        finally:
            os.close(fd)

    def _compact_locked(self) -> None:
        self.refresh()
        keep = list(self._index.values())[-self.max_entries:]
        tmp = tempfile.NamedTemporaryFile("wb", dir=self.path.parent, prefix=f".{self.path.name}.", delete=False)
        try:
            with tmp:
                for e in keep:
                    tmp.write(json.dumps(e, separators=(",", ":"), allow_nan=False).encode() + b"\n")
                tmp.flush()
                os.fsync(tmp.fileno())
            os.chmod(tmp.name, 0o644)
            os.replace(tmp.name, self.path)
        except BaseException:
            try:
                os.unlink(tmp.name)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
            raise
        self._ino = None
        self.refresh()


# ---------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------
def _call(benchmark: Callable[[Any], float], arg: Any, kernel_id: int, name: str) -> tuple[Measurement, float]:
    t0 = time.perf_counter()
    try:
        value = benchmark(arg)
        seconds = float(value)
        if not math.isfinite(seconds) or seconds <= 0:
            m = Measurement(kernel_id, name, None, f"non-finite or non-positive time {value!r}")
        else:
            m = Measurement(kernel_id, name, seconds)
    except Exception as exc:  # the caller's kernel failed: record it, try the next one
        m = Measurement(kernel_id, name, None, f"{type(exc).__name__}: {exc}"[:500])
    return m, time.perf_counter() - t0


def autotune_ranked(ids: Sequence[int], names: Sequence[str], scores: Sequence[float],
                    benchmark: Callable[[Any], float], budget: Budget, *, pass_id: bool = False,
                    problem: str = "", values: Mapping[str, float] | None = None) -> TuneResult:
    """Benchmark ranked candidates (valid ones, best first) until ``budget`` is spent.

    This is the store-free core of :func:`autotune`; the replay and the C++ header follow the
    same rules: count successes against the soft budget, stop at ``budget.max_benchmarks``
    calls, and past the soft budget continue only while nothing has succeeded. ``values`` (the
    problem's field values) feed a :class:`LogisticCalibration`.
    """
    if not isinstance(budget, Budget):
        raise AutotuneError(f"budget={budget!r}; allowed: FixedK, TimeBudget or Confidence")
    if isinstance(budget, Confidence):  # sized once, from the scores (and the problem)
        budget = _Sized(budget.planned(scores, values), budget.describe(), budget.max_benchmarks)
    spent = _Spent()
    measured: list[Measurement] = []
    candidates = list(zip(ids, names))
    stop = "no valid kernel" if not candidates else "candidates exhausted"
    for kernel_id, name in candidates:
        if spent.successes and budget.spent(scores, spent):
            stop = "budget spent"
            break
        if spent.attempts >= int(budget.max_benchmarks):
            stop = f"max_benchmarks={budget.max_benchmarks} reached"
            break
        m, wall = _call(benchmark, int(kernel_id) if pass_id else name, int(kernel_id), name)
        measured.append(m)
        spent.attempts += 1
        spent.wall_s += wall
        if m.ok:
            spent.successes += 1
            spent.kernel_s += float(m.seconds)  # type: ignore[arg-type]
    else:
        if spent.successes and budget.spent(scores, spent):
            stop = "budget spent"
        elif spent.attempts >= int(budget.max_benchmarks):
            stop = f"max_benchmarks={budget.max_benchmarks} reached"
    good = [m for m in measured if m.ok]
    if not good:
        if measured:
            stop = f"{stop}: all {len(measured)} benchmarks failed"
        return TuneResult(problem, None, None, None, tuple(measured), False, budget.describe(), stop)
    best = min(good, key=lambda m: m.seconds)  # type: ignore[arg-type, return-value]
    return TuneResult(problem, best.kernel, best.kernel_id, best.seconds, tuple(measured), False,
                      budget.describe(), stop)


def model_hash(manifest: Mapping[str, Any]) -> str:
    """The store's model key: the sha256 of the selector graph recorded in the manifest."""
    selector = manifest["graphs"]["selector"]["file"]
    try:
        return str(manifest["files"][selector]["sha256"])
    except KeyError as exc:
        raise ModelMismatchError(f"manifest has no sha256 for {selector}") from exc


def autotune(selector: Any, problem: Mapping[str, Any], benchmark: Callable[[Any], float],
             budget: Budget | None = None, *, store: ResultStore | str | Path | None = None,
             pass_id: bool = False, refresh: bool = False) -> TuneResult:
    """Benchmark the model's best valid kernels for ``problem`` and return the fastest.

    Parameters
    ----------
    selector : KernelSelector
        A loaded selector (ranks the candidates; its manifest gives the model hash and the
        confidence calibration).
    problem : mapping
        Problem fields (defaults filled in as in ``select``).
    benchmark : callable
        ``benchmark(kernel_name) -> seconds`` (``benchmark(kernel_id)`` with ``pass_id``). An
        exception or a non-finite/non-positive result is recorded and the kernel skipped.
    budget : Budget, default=FixedK(2)
        When to stop (:class:`FixedK`, :class:`TimeBudget`, :class:`Confidence`).
    store : ResultStore or path, optional
        Read first (a stored winner of this model is returned without benchmarking) and
        written after a successful search.
    refresh : bool, default=False
        Benchmark even when the store has an answer (and overwrite it).

    Returns
    -------
    TuneResult
    """
    budget = FixedK(2) if budget is None else budget
    if isinstance(budget, Confidence):
        cal = getattr(selector, "calibration", None)  # checked by KernelSelector.load
        budget = budget.with_calibration(selector.manifest.get("autotune") if cal is None else cal,
                                         str(selector.model_dir))
    if store is not None and not isinstance(store, ResultStore):
        store = ResultStore(store)
    row = selector.problem_row(dict(problem))
    key = problem_key(row, selector.problem_fields)
    model, op = model_hash(selector.manifest), selector.manifest["op"]
    if store is not None and not refresh:
        hit = store.get(model, op, key)
        if hit is not None:
            return TuneResult(key, str(hit["kernel"]), int(hit["kernel_id"]), float(hit["seconds"]), (), True,
                              str(hit.get("policy", "")), "from store")
    answer = selector.select(row, top_k=max(1, min(int(budget.max_benchmarks), len(selector.catalogue))))
    result = autotune_ranked(answer.ids, answer.kernels, answer.scores, benchmark, budget, pass_id=pass_id,
                             problem=key, values=row)
    if not answer.ok:
        result = TuneResult(key, None, None, None, (), False, budget.describe(), answer.reason)
    if store is not None and result.ok:
        store.put({"model": model, "op": op, "arch": selector.manifest["arch"], "dtype": selector.manifest["dtype"],
                   "layout": selector.manifest["layout"], "problem": key, "kernel_id": result.kernel_id,
                   "kernel": result.kernel, "seconds": result.seconds, "policy": result.policy,
                   "measured": [m.to_dict() for m in result.measured]})
    return result
