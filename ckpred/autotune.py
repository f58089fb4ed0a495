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
  with one ``write`` call. Neither the store nor its lock is ever opened through a symbolic
  link, and only a regular file is read or written.
* Readers read complete lines only (at most :data:`MAX_LINE_BYTES` each, nested at most
  :data:`MAX_LINE_DEPTH` deep) and skip a line that does not parse or whose fields have the
  wrong types (logged, counted in :attr:`ResultStore.skipped_lines`); :func:`autotune` serves a
  stored kernel only when its id is in the model's catalogue under that name.
* Bounded: when the file holds more than twice ``max_entries`` lines, the writer compacts it
  under the lock (last line per key, the newest ``max_entries`` keys, kept verbatim) into a
  temporary file (``.<store>.tmp-<host>-<pid>-<random>``, created exclusively) that replaces
  the store atomically (``rename``); compaction files of writers that died are removed.

The C++ header ``scripts/cpp/ckpred_autotune.hpp`` reads and writes the same file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import queue
import re
import secrets
import socket
import stat
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ckpred.errors import CkpredError, ConfigValueError, ModelMismatchError

log = logging.getLogger(__name__)

__all__ = ["STORE_FORMAT", "Measurement", "TuneResult", "Budget", "FixedK", "TimeBudget", "Confidence",
           "Calibration", "LogisticCalibration", "calibrate", "calibration_from_oof", "fit_logistic",
           "load_calibration", "ranked_problems", "signal_features", "top_j_efficiency", "ResultStore", "problem_key", "check_entry", "as_budget", "autotune",
           "autotune_ranked"]

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
#: The confidence budget's stated fixed k where its calibration cannot size it (see
#: :func:`size_confidence`): the manifest's ``autotune.fallback_k``, this when it records none.
FALLBACK_K = 5


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
    stored : bool
        The answer is in the store (read from it, or written to it by this call).
    store_error : str
        Why writing it to the store failed ("" otherwise); the measurements are here all the same.
    timed_out : bool
        A benchmark call did not return within ``timeout``; the search stopped there.
    """

    problem: str
    kernel: str | None
    kernel_id: int | None
    seconds: float | None
    measured: tuple[Measurement, ...] = ()
    from_store: bool = False
    policy: str = ""
    stop: str = ""
    stored: bool = False
    store_error: str = ""
    timed_out: bool = False

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


def _count(name: str, value: Any) -> int:
    """``value`` when it is an integer >= 1 (not a bool, a float or text): a count."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise AutotuneError(f"{name}={value!r}; allowed: an integer >= 1")
    return int(value)


def _real(value: Any) -> float | None:
    """``value`` as a float when it is a real number (int or float, not a bool or text), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond float: not finite
        return math.inf


class Budget:
    """How many candidates to benchmark. Subclasses say when the soft budget is spent.

    Parameters
    ----------
    max_benchmarks : int
        Hard cap on benchmark calls per problem, failures included.
    """

    max_benchmarks: int

    def _check(self) -> None:
        self.max_benchmarks = _count(f"{type(self).__name__}.max_benchmarks", self.max_benchmarks)

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
        self.k = _count("FixedK.k", self.k)
        self._check()

    def planned(self, scores: Sequence[float], problem: Mapping[str, float] | None = None) -> int:
        return self.k

    def spent(self, scores: Sequence[float], spent: _Spent) -> bool:
        return spent.successes >= self.k

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
    the times ``benchmark`` returned) or wall time inside ``benchmark`` (``clock="wall"``).

    The wall clock is read when a call returns, so one call that never returns is not stopped
    by it: pass ``timeout`` to :func:`autotune` for that."""

    seconds: float = 1.0
    clock: str = "kernel"
    max_benchmarks: int = MAX_BENCHMARKS

    def __post_init__(self) -> None:
        seconds = _real(self.seconds)
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            raise AutotuneError(f"TimeBudget.seconds={self.seconds!r}; allowed: a finite number > 0")
        self.seconds = seconds
        if self.clock not in ("kernel", "wall"):
            raise AutotuneError(f"TimeBudget.clock={self.clock!r}; allowed: 'kernel', 'wall'")
        self._check()

    def spent(self, scores: Sequence[float], spent: _Spent) -> bool:
        used = spent.kernel_s if self.clock == "kernel" else spent.wall_s
        return used >= self.seconds

    def describe(self) -> str:
        return f"time({self.clock}={self.seconds:g}s)"


def as_budget(budget: Any) -> Budget:
    """The budget :func:`autotune` runs: a :class:`Budget` as given, None as ``FixedK(2)``, and a
    plain int ``k`` as ``FixedK(k)`` (what ``budget=3`` means); anything else is refused by name."""
    if budget is None:
        return FixedK(2)
    if isinstance(budget, Budget):
        return budget
    if isinstance(budget, (int, np.integer)) and not isinstance(budget, (bool, np.bool_)):
        return FixedK(_count("budget", budget))
    raise AutotuneError(f"budget={budget!r}; allowed: FixedK(k), TimeBudget(seconds), Confidence(target, within) "
                        "or an integer k (= FixedK(k))")


def _reals(value: Any, key: str, where: str) -> tuple[float, ...]:
    """A JSON array of numbers (not text, not booleans) as floats; anything else is refused by name.
    The C++ header (``manifest.hpp``: ``check_calibration``) accepts exactly the same."""
    if not isinstance(value, (list, tuple)):
        raise AutotuneError(f"{where}: {key} is {value!r}; allowed: an array of numbers")
    out = []
    for x in value:
        f = _real(x)
        if f is None:
            raise AutotuneError(f"{where}: {key} holds {x!r}; allowed: numbers (not text or booleans)")
        out.append(f)
    return tuple(out)


def _arrays(value: Any, key: str, where: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise AutotuneError(f"{where}: {key} is {value!r}; allowed: an array")
    return list(value)


def _integer(value: Any, key: str, where: str, lo: int) -> int:
    """A JSON integer (not a float, text or boolean) in [lo, 2^63-1]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not lo <= value < 2**63:
        raise AutotuneError(f"{where}: {key} is {value!r}; allowed: an integer in [{lo}, 2^63-1]")
    return int(value)


def _check_within(within: Sequence[float], where: str) -> None:
    """Refuse tolerances that are not distinct fractions in (0, 1), by name."""
    if not all(0 < w < 1 for w in within) or len(set(within)) != len(within):
        raise AutotuneError(f"{where}: within={list(within)}; allowed: distinct fractions in (0, 1)")


def _check_format(d: Any, expected: str, where: str) -> None:
    """Refuse a calibration record of another format (or not a mapping at all), by name."""
    if not isinstance(d, Mapping) or d.get("format") != expected:
        got = d.get("format") if isinstance(d, Mapping) else type(d).__name__
        raise AutotuneError(f"{where}: format {got!r}, expected {expected!r}")


def _policy(d: Mapping[str, Any], within: Sequence[float], where: str) -> dict[str, Any]:
    """The keys every calibration carries besides its model (both runtimes check the same, see
    ``check_calibration`` in ``manifest.hpp``): ``fallback_k`` (an integer >= 1),
    ``uninformative_within`` (tolerances of ``within`` the calibration has nothing to learn at)
    and ``zero_shot`` (a boolean: fitted on out-of-fold scores of GPUs the folds never trained on)."""
    fallback = _integer(d.get("fallback_k", FALLBACK_K), "fallback_k", where, 1)
    uninformative = _reals(d.get("uninformative_within", []), "uninformative_within", where)
    if not set(uninformative) <= set(within):
        raise AutotuneError(f"{where}: uninformative_within={list(uninformative)}; allowed: tolerances of within "
                            f"{list(within)}")
    zero_shot = d.get("zero_shot", False)
    if not isinstance(zero_shot, bool):
        raise AutotuneError(f"{where}: zero_shot is {zero_shot!r}; allowed: true or false")
    return {"fallback_k": fallback, "uninformative": uninformative, "zero_shot": zero_shot}


def _policy_dict(c: Any) -> dict[str, Any]:
    return {"fallback_k": c.fallback_k, "uninformative_within": list(c.uninformative), "zero_shot": c.zero_shot}


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
    uninformative : tuple of float
        Tolerances the calibration has nothing to learn at (:func:`informative_within`): the
        budget spends ``fallback_k`` there.
    fallback_k : int
        The budget's fixed k where the calibration cannot size it.
    zero_shot : bool
        Fitted on scores of GPUs the folds never trained on (a new GPU is what it measured).
    """

    within: tuple[float, ...]
    edges: tuple[float, ...]
    probability: tuple[tuple[tuple[float, ...], ...], ...]
    counts: tuple[int, ...]
    gap_to: int = 2
    uninformative: tuple[float, ...] = ()
    fallback_k: int = FALLBACK_K
    zero_shot: bool = False

    @property
    def max_k(self) -> int:
        return len(self.probability[0][0])

    def to_dict(self) -> dict[str, Any]:
        return {"format": CALIBRATION_FORMAT, "feature": "score_gap", "gap_to": self.gap_to,
                "within": list(self.within),
                "edges": list(self.edges), "counts": list(self.counts),
                "probability": [[list(row) for row in table] for table in self.probability], **_policy_dict(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "calibration") -> "Calibration":
        _check_format(d, CALIBRATION_FORMAT, where)
        missing = [k for k in ("within", "edges", "counts", "probability") if k not in d]
        if missing:
            raise AutotuneError(f"{where}: malformed table (missing {missing}); keys: within, edges, counts, "
                                "probability")
        within = _reals(d["within"], "within", where)
        edges = _reals(d["edges"], "edges", where)
        prob = tuple(tuple(_reals(row, "probability", where) for row in _arrays(table, "probability", where))
                     for table in _arrays(d["probability"], "probability", where))
        counts = tuple(_integer(c, "counts", where, 0) for c in _arrays(d["counts"], "counts", where))
        gap_to = _integer(d.get("gap_to", 2), "gap_to", where, 2)
        bins = len(edges) + 1
        if len(prob) != len(within) or any(len(t) != bins for t in prob) or len(counts) != bins \
                or len({len(r) for t in prob for r in t}) != 1:
            raise AutotuneError(f"{where}: probability must be [{len(within)} within][{bins} bins][max_k], "
                                f"counts [{bins}]")
        _check_within(within, where)
        if not all(math.isfinite(e) for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
            raise AutotuneError(f"{where}: edges={list(edges)}; allowed: finite, strictly increasing")
        if not prob[0][0] or not all(0 <= p <= 1 for t in prob for r in t for p in r):
            raise AutotuneError(f"{where}: probability holds a value outside [0, 1] (or an empty row)")
        return cls(within, edges, prob, counts, gap_to, **_policy(d, within, where))

    def bin_of(self, gap: float) -> int:
        return int(np.searchsorted(np.asarray(self.edges), gap, side="right"))

    def needed(self, scores: Sequence[float], target: float, within: float,
               problem: Mapping[str, float] | None = None) -> int:
        """Smallest j whose probability reaches ``target``; ``max_k`` when none does; ``fallback_k``
        at a tolerance the calibration has nothing to learn at (``problem`` is not used: the
        table reads the scores only)."""
        if within not in self.within:
            raise AutotuneError(f"no calibration for within={within!r}; calibrated: {list(self.within)}")
        if within in self.uninformative:
            return self.fallback_k
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
        target, within = _real(self.target), _real(self.within)
        if target is None or not 0 < target <= 1:
            raise AutotuneError(f"Confidence.target={self.target!r}; allowed: a probability in (0, 1]")
        if within is None or not 0 < within < 1:
            raise AutotuneError(f"Confidence.within={self.within!r}; allowed: a fraction in (0, 1)")
        self.target, self.within = target, within
        if isinstance(self.calibration, Mapping):
            self.calibration = load_calibration(self.calibration)
        if self.calibration is not None and self.within not in self.calibration.within:
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

    def planned(self, scores: Sequence[float], problem: Mapping[str, float] | None = None,
                shifted: bool = False) -> int:
        """Successful measurements wanted (``problem``: field values, for a logistic calibration;
        ``shifted``: the problem is outside what the calibration measured, see :func:`size_confidence`)."""
        if self.calibration is None:
            raise AutotuneError("Confidence budget without a calibration table")
        k = self.calibration.needed(scores, float(self.target), float(self.within), problem=problem)
        return max(k, self.calibration.fallback_k) if shifted else k

    def spent(self, scores: Sequence[float], spent: _Spent) -> bool:
        return spent.successes >= self.planned(scores)

    def describe(self) -> str:
        return f"confidence(target={self.target:g},within={self.within:g})"


def size_confidence(budget: Confidence, scores: Sequence[float], problem: Mapping[str, float] | None = None,
                    shift: str = "") -> "_Sized":
    """A :class:`Confidence` budget sized for one problem; the rule both runtimes follow:

    * in distribution, k is the calibration's: the smallest j whose calibrated probability
      reaches ``target``;
    * where the calibration has nothing to learn (``uninformative_within``: no out-of-fold
      problem's top-1 within that tolerance, or too few problems; written by ``export``), k is
      the stated ``fallback_k`` (policy ``+fallback(k=K)``) instead of the calibration's cap;
    * a ``shift`` -- the problem lies outside the training ranges the manifest records, or the
      selector's arch is not among the GPUs it trained on and the calibration was not measured
      on held-out GPUs (:func:`shift_of`) -- spends at least ``fallback_k`` (policy
      ``+shifted(k>=K)``): the calibration's probabilities were measured in distribution.
    """
    cal = budget.calibration
    if cal is None:
        raise AutotuneError("Confidence budget without a calibration table")
    k = budget.planned(scores, problem, shifted=bool(shift))
    policy = budget.describe()
    if budget.within in cal.uninformative:
        policy += f"+fallback(k={cal.fallback_k})"
    elif shift:
        policy += f"+shifted(k>={cal.fallback_k})"
    return _Sized(k, policy, budget.max_benchmarks)


def shift_of(manifest: Mapping[str, Any], row: Mapping[str, int], calibration: Any) -> str:
    """Why a problem is outside what the confidence calibration measured ("" when it is not): its
    integer fields outside ``training.problem_ranges``, or a selector arch that is not among
    ``training.archs`` (unless the calibration was fitted zero-shot)."""
    training = manifest.get("training") or {}
    ranges = training.get("problem_ranges") or {}
    outside = [name for name, rng in ranges.items() if name in row and not (rng[0] <= row[name] <= rng[1])]
    archs = training.get("archs")
    reasons = []
    if outside:
        reasons.append(f"out of distribution ({', '.join(outside)})")
    if archs and manifest.get("arch") not in archs and not getattr(calibration, "zero_shot", False):
        reasons.append(f"arch {manifest.get('arch')} never trained on ({', '.join(archs)})")
    return "; ".join(reasons)


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
    uninformative, fallback_k, zero_shot
        As :class:`Calibration`'s.
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
    uninformative: tuple[float, ...] = ()
    fallback_k: int = FALLBACK_K
    zero_shot: bool = False

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
                "problems": self.problems, **_policy_dict(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "calibration") -> "LogisticCalibration":
        _check_format(d, LOGISTIC_FORMAT, where)
        keys = ("within", "fields", "fill", "lo", "hi", "mean", "scale", "coef", "intercept")
        missing = [k for k in keys if k not in d]
        if missing:
            raise AutotuneError(f"{where}: malformed logistic calibration (missing {missing}); keys: "
                                f"{', '.join(keys)}")
        within = _reals(d["within"], "within", where)
        fields = tuple(_arrays(d["fields"], "fields", where))
        if not all(isinstance(f, str) and f for f in fields):
            raise AutotuneError(f"{where}: fields={list(fields)}; allowed: problem field names (strings)")
        vec = {k: _reals(d[k], k, where) for k in ("fill", "lo", "hi", "mean", "scale")}
        coef = tuple(tuple(_reals(r, "coef", where) for r in _arrays(t, "coef", where))
                     for t in _arrays(d["coef"], "coef", where))
        intercept = tuple(_reals(r, "intercept", where) for r in _arrays(d["intercept"], "intercept", where))
        problems = _integer(d.get("problems", 0), "problems", where, 0)
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
                   problems, **_policy(d, within, where))

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
        """Smallest j whose probability reaches ``target``; ``max_k`` when none does; ``fallback_k``
        at a tolerance the calibration has nothing to learn at."""
        if within in self.uninformative:
            return self.fallback_k
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
                         problems: Any = None, fallback_k: int = FALLBACK_K, min_problems: int = 10,
                         zero_shot: bool = False, **options: Any) -> dict[str, Any]:
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
    fallback_k, min_problems
        The stated k of the budget where the calibration has nothing to learn
        (:func:`informative_within`), and the fewest problems it learns from.
    zero_shot : bool
        The out-of-fold scores are of GPUs the folds did not train on (recorded: a selector on
        a new GPU is then what the calibration measured).
    **options
        Passed to :func:`calibrate` (``logistic``: ``within`` and ``max_k`` only).

    Returns
    -------
    dict
        The calibration (:meth:`Calibration.to_dict` / :meth:`LogisticCalibration.to_dict`) with
        ``uninformative_within``, ``fallback_k``, ``zero_shot`` and, when some tolerance is
        uninformative, ``note`` saying why.
    """
    ties = None if kernel_ids is None else oof["kernel_name"].map(dict(kernel_ids)).to_numpy()
    args = (oof["shape"].to_numpy(), oof["perf"].to_numpy(), oof["score_model"].to_numpy(), oof["selectable"].to_numpy())
    within = tuple(float(w) for w in options.get("within", (0.01, 0.02, 0.05, 0.1)))
    max_k = int(options.get("max_k", 10))
    rels = [rel for _, _, rel in ranked_problems(*args, tie_order=ties, max_k=max_k)]
    if not rels:
        raise AutotuneError("calibrate: no problem with a valid measured kernel")
    uninformative, note = informative_within(np.vstack(rels), within, min_problems)
    policy = {"uninformative": uninformative, "fallback_k": _count("fallback_k", fallback_k),
              "zero_shot": bool(zero_shot)}
    if kind == "table":
        out = replace(calibrate(*args, tie_order=ties, **options), **policy).to_dict()
    elif kind != "logistic" or problems is None:
        raise AutotuneError(f"calibration kind={kind!r} (problems given: {problems is not None}); allowed: 'table', "
                            "or 'logistic' with the problems' field values")
    else:
        fields = [str(c) for c in problems.columns]
        feats, top = [], []
        for shape, scores, rel in ranked_problems(*args, tie_order=ties, max_k=max_k):
            if shape not in problems.index:
                raise AutotuneError(f"calibration: problem {shape!r} of the out-of-fold rows has no field values")
            feats.append(signal_features(scores, problems.loc[shape].to_numpy(np.float64)))
            top.append(rel)
        out = replace(fit_logistic(np.vstack(feats), np.vstack(top), fields, within=within), **policy).to_dict()
    if note:
        out["note"] = f"{note}: the Confidence budget benchmarks a fixed k = {policy['fallback_k']} there"
    return out


def informative_within(top_rel: np.ndarray, within: Sequence[float], min_problems: int) -> tuple[tuple[float, ...], str]:
    """The tolerances a calibration has nothing to learn at, and why ("" when none).

    ``top_rel[p, j - 1]`` is the efficiency of the best of problem p's top j. A tolerance is
    uninformative when fewer than ``min_problems`` problems were scored (a handful of points
    sizes nothing), or when no problem's top-1 is within it: every label of j = 1 is a miss, so
    the probabilities cannot depend on the scores and the budget would only ever plan its cap.
    """
    n = len(top_rel)
    if n < min_problems:
        return tuple(within), f"{n} out-of-fold problem(s), fewer than the {min_problems} a calibration needs"
    missed = tuple(w for w in within if not np.any(top_rel[:, 0] >= 1.0 - w - 1e-12))
    if not missed:
        return (), ""
    return missed, (f"no out-of-fold problem's top-1 kernel is within {100 * max(missed):g}% of its best "
                    f"({n} problems)")


# ---------------------------------------------------------------------------------------------
# The persistent store
# ---------------------------------------------------------------------------------------------
#: Longest store line read (bytes). A line of 16 measurements is a few kB; a longer one is
#: skipped unparsed, and so is one nested deeper than MAX_LINE_DEPTH (the format nests 3 deep),
#: so a hostile line costs neither memory nor recursion.
MAX_LINE_BYTES = 1 << 20
MAX_LINE_DEPTH = 8
_READ_BLOCK = 1 << 20
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(rb"[\[\]{}]")
#: A compaction file older than this is removed by the next compaction even when its writer's
#: host or pid cannot be checked (a writer on another host of a shared file system).
STALE_TEMP_S = 3600.0


def problem_key(problem: Mapping[str, Any], fields: Sequence[str] | None = None) -> str:
    """``field=value`` pairs joined by commas, in ``fields`` order (default: the mapping's)."""
    names = list(fields) if fields is not None else list(problem)
    return ",".join(f"{name}={int(problem[name])}" for name in names)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _short(value: Any, limit: int = 80) -> str:
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in repr(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link (a store is never used through one)"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _too_deep(raw: bytes) -> bool:
    """True when a line nests arrays/objects deeper than MAX_LINE_DEPTH (strings do not count)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_LINE_DEPTH:
        return False
    depth = 0
    for m in _BRACKET.finditer(_STRING.sub(b'""', raw)):
        depth += 1 if m.group() in (b"[", b"{") else -1
        if depth > MAX_LINE_DEPTH:
            return True
    return False


def check_entry(entry: Any) -> str:
    """What is wrong with one parsed store line ("" when it is a well-formed entry): the format
    tag; model, op, problem and kernel non-empty strings; kernel_id an integer >= 0; seconds a
    finite number > 0. Whether it belongs to a model (its kernel) is checked when it is served."""
    if not isinstance(entry, dict):
        return f"a JSON {type(entry).__name__}, not an object"
    if entry.get("format") != STORE_FORMAT:
        return f"format {_short(entry.get('format'))}, expected {STORE_FORMAT!r}"
    for key in ("model", "op", "problem", "kernel"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            return f"{key} is {_short(entry.get(key, '<missing>'))}; expected a non-empty string"
    kid = entry.get("kernel_id")
    if isinstance(kid, bool) or not isinstance(kid, int) or not 0 <= kid < 2**63:
        return f"kernel_id is {_short(kid)}; expected an integer >= 0"
    seconds = _real(entry.get("seconds"))
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return f"seconds is {_short(entry.get('seconds'))}; expected a finite number > 0"
    return ""


@dataclass
class _Cursor:
    offset: int = 0  # first byte not consumed (lines before it were read)
    long: bool = False  # inside a line longer than MAX_LINE_BYTES: its bytes are dropped


def _complete_lines(fd: int, size: int, cur: _Cursor) -> Iterator[bytes | None]:
    """The complete lines of ``fd`` from ``cur.offset`` to ``size``, read in bounded blocks
    (None for a line longer than MAX_LINE_BYTES, never held whole); ``cur`` advances past them.
    An incomplete last line (a writer mid-line) is read next time."""
    pos, carry = cur.offset, b""
    while pos < size:
        block = os.pread(fd, min(_READ_BLOCK, size - pos), pos)
        if not block:
            return
        pos += len(block)
        if cur.long:
            nl = block.find(b"\n")
            if nl < 0:
                cur.offset += len(block)
                continue
            cur.offset += nl + 1
            cur.long = False
            block = block[nl + 1:]
            yield None
        data = carry + block
        end = data.rfind(b"\n") + 1
        lines = data[:end].split(b"\n")
        lines.pop()
        cur.offset += end
        carry = data[end:]
        yield from lines
        if len(carry) > MAX_LINE_BYTES:
            cur.offset += len(carry)
            carry = b""
            cur.long = True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it runs under another user
        return True
    return True


class ResultStore:
    """The persistent, process-safe, bounded store of measured winners (format in the module doc).

    The store is a regular file, never used through a symbolic link; reading never blocks on a
    FIFO and holds at most :data:`MAX_LINE_BYTES` of one line. Lines that do not parse, nest
    deeper than :data:`MAX_LINE_DEPTH` or fail :func:`check_entry` are skipped with a warning and
    counted in :attr:`skipped_lines`; lines of models nobody asked for are not parsed at all.
    Every I/O failure is an :class:`AutotuneError` naming the path (:meth:`check` finds most of
    them before anything is measured).

    Parameters
    ----------
    path : path
        The JSON-lines file (created on first write, its directory too; ``~`` is expanded).
    max_entries : int, default=10000
        Keys kept by compaction (newest first).
    """

    def __init__(self, path: str | os.PathLike[str], *, max_entries: int = 10000) -> None:
        if not isinstance(path, (str, os.PathLike)) or not str(os.fspath(path)).strip():
            raise AutotuneError(f"ResultStore.path={path!r}; allowed: a file path")
        self.max_entries = _count("ResultStore.max_entries", max_entries)
        self.path = Path(os.path.expanduser(path))  # ~name of no known user stays as written
        #: Lines of the file as last read that were skipped (malformed, too long or too deep).
        self.skipped_lines = 0
        self._models: set[str] | None = set()  # models whose lines are indexed (None: every model)
        self._cleaned = False
        self._reset()

    def _reset(self) -> None:
        self._index: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._lines = 0
        self._cursor = _Cursor()
        self._ino: tuple[int, int] | None = None
        self.skipped_lines = 0

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    # -- opening, never through a link, never blocking ------------------------------------------
    def _refusal(self, path: Path, what: str, doing: str, exc: OSError | None = None) -> AutotuneError:
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            return AutotuneError(f"{what} {path}: {_kind(st.st_mode)}; allowed: a regular file (or a path that does "
                                 "not exist yet)")
        reason = (exc.strerror or str(exc)) if exc is not None else "not a regular file"
        return AutotuneError(f"cannot {doing} {what} {path}: {reason}")

    def _open(self, path: Path, what: str, flags: int, doing: str) -> int | None:
        """``path`` opened with ``flags`` (no symlink followed, no FIFO waited on), checked to be a
        regular file; None when it does not exist (and ``flags`` does not create it)."""
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            if flags & os.O_CREAT:
                raise AutotuneError(f"cannot {doing} {what} {path}: its directory does not exist") from None
            return None
        except OSError as exc:
            raise self._refusal(path, what, doing, exc) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise self._refusal(path, what, doing)
        return fd

    def check(self) -> None:
        """Refuse a store this process cannot append to, before anything is measured: a directory,
        FIFO or device, a symbolic link, a read-only file, a lock path that is not a file, a
        directory that is not writable (or cannot be made). What only a write can tell (a full
        disk) is reported by :meth:`put`.

        Raises
        ------
        AutotuneError
            Naming the path and why.
        """
        for path, what, flags in ((self.path, "store", os.O_WRONLY | os.O_APPEND), (self.lock_path, "store lock",
                                                                                   os.O_RDWR)):
            try:
                os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):  # the directory check below names it
                continue
            except OSError as exc:
                raise self._refusal(path, what, "use", exc) from exc
            fd = self._open(path, what, flags, "append to" if what == "store" else "open")
            if fd is not None:
                os.close(fd)
        ancestor = self.path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise AutotuneError(f"cannot create store {self.path}: {ancestor} is not a directory")
        if not (self.path.exists() and self.lock_path.exists()) and not os.access(ancestor, os.W_OK | os.X_OK):
            raise AutotuneError(f"cannot create store {self.path}: directory {ancestor} is not writable")

    # -- reading ---------------------------------------------------------------------------
    def _skip(self, lineno: int, why: str) -> None:
        self.skipped_lines += 1
        log.warning("%s:%d: skipped a store line (%s)", self.path, lineno, why[:300])

    def _parse(self, raw: bytes, lineno: int) -> dict[str, Any] | None:
        if len(raw) > MAX_LINE_BYTES:
            why = f"longer than {MAX_LINE_BYTES} bytes"
        elif _too_deep(raw):
            why = f"nested deeper than {MAX_LINE_DEPTH}"
        else:
            try:
                entry = json.loads(raw)
                why = check_entry(entry)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                why = f"does not parse: {_short(str(exc), 120)}"
        if why:
            self._skip(lineno, why)
            return None
        return entry

    def _want(self, model: str | None) -> None:
        """Index ``model``'s lines from now on (None: every model's), re-reading when that widens."""
        if self._models is None:
            return
        if model is None:
            self._models = None
        elif model in self._models:
            return
        else:
            self._models.add(model)
        self._reset()

    def refresh(self) -> None:
        """Read what other processes appended since the last read (all of it after a compaction).

        Raises
        ------
        AutotuneError
            The path is a directory, FIFO, device or symbolic link, or cannot be read.
        """
        fd = self._open(self.path, "store", os.O_RDONLY, "read")
        if fd is None:
            self._reset()
            return
        try:
            st = os.fstat(fd)  # identity and size of the file actually opened (a compaction may replace it)
            ino = (st.st_dev, st.st_ino)
            if ino != self._ino or st.st_size < self._cursor.offset:
                self._reset()
                self._ino = ino
            wanted = None if self._models is None else [m.encode() for m in self._models]
            try:
                for raw in _complete_lines(fd, st.st_size, self._cursor):
                    self._lines += 1
                    if raw is None:
                        self._skip(self._lines, f"longer than {MAX_LINE_BYTES} bytes")
                    elif raw.strip() and (wanted is None or any(m in raw for m in wanted)):
                        entry = self._parse(raw, self._lines)
                        if entry is not None:
                            key = self._key(entry)
                            self._index.pop(key, None)  # re-insert: dict order = newest last
                            self._index[key] = entry
            except OSError as exc:
                raise AutotuneError(f"cannot read store {self.path}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)

    @staticmethod
    def _key(entry: Mapping[str, Any]) -> tuple[str, str, str]:
        return (entry["model"], entry["op"], entry["problem"])

    def get(self, model: str, op: str, problem: str) -> dict[str, Any] | None:
        """The newest entry of ``(model, op, problem)``, or None (entries of other models never match)."""
        self._want(model)
        self.refresh()
        return self._index.get((model, op, problem))

    def entries(self, model: str | None = None) -> list[dict[str, Any]]:
        """Current entries (last per key), oldest first; only ``model``'s when given."""
        self._want(model)
        self.refresh()
        return [e for e in self._index.values() if model is None or e["model"] == model]

    # -- writing ---------------------------------------------------------------------------
    def _locked(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AutotuneError(f"cannot create the directory of store {self.path}: {exc.strerror or exc}") from exc
        fd = self._open(self.lock_path, "store lock", os.O_RDWR | os.O_CREAT, "open")
        assert fd is not None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def put(self, entry: Mapping[str, Any]) -> None:
        """Append one entry (adds ``format``, ``created`` and ``writer`` when absent); compacts
        when the file holds more than ``2 * max_entries`` lines.

        Raises
        ------
        AutotuneError
            The entry is not a valid store line, or the store cannot be written (named).
        """
        record = {"format": STORE_FORMAT, **entry}
        record.setdefault("created", _now())
        record.setdefault("writer", "python")
        why = check_entry(record)
        if why:
            raise AutotuneError(f"store entry refused: {why}")
        try:
            line = json.dumps(record, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        except (TypeError, ValueError) as exc:
            raise AutotuneError(f"store entry refused: {exc}") from exc
        if len(line) > MAX_LINE_BYTES:
            raise AutotuneError(f"store entry refused: {len(line)} bytes, longer than {MAX_LINE_BYTES}")
        fd = self._locked()
        try:
            if not self._cleaned:
                self._clean_temps()
            out = self._open(self.path, "store", os.O_RDWR | os.O_APPEND | os.O_CREAT, "append to")
            assert out is not None
            try:
                size = os.fstat(out).st_size
                if size and os.pread(out, 1, size - 1) != b"\n":  # a crashed writer's partial line must not swallow ours
                    line = b"\n" + line
                written = os.write(out, line)
                if written != len(line):
                    raise AutotuneError(f"cannot write store {self.path}: wrote {written} of {len(line)} bytes")
            except OSError as exc:
                raise AutotuneError(f"cannot write store {self.path}: {exc.strerror or exc}") from exc
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

    def _temp_prefix(self) -> str:
        return f".{self.path.name}.tmp-"

    def _clean_temps(self) -> None:
        """Remove compaction files of writers that died (same host, pid gone) or are old; called
        under the lock, so no live writer of this store is compacting."""
        self._cleaned = True
        prefix, host, now = self._temp_prefix(), socket.gethostname(), time.time()
        try:
            found = [e for e in os.scandir(self.path.parent) if e.name.startswith(prefix)]
        except OSError:
            return
        for e in found:
            parts = e.name[len(prefix):].rsplit("-", 2)
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            dead = len(parts) == 3 and parts[0] == host and parts[1].isdigit() and not _alive(int(parts[1]))
            if stat.S_ISREG(st.st_mode) and (dead or now - st.st_mtime > STALE_TEMP_S):
                with contextlib.suppress(OSError):
                    os.unlink(e.path)

    def _compact_locked(self) -> None:
        fd = self._open(self.path, "store", os.O_RDONLY, "read")
        if fd is None:
            return
        keep: dict[tuple[str, str, str], bytes] = {}
        try:
            for lineno, raw in enumerate(_complete_lines(fd, os.fstat(fd).st_size, _Cursor()), 1):
                entry = None if raw is None or not raw.strip() else self._parse(raw, lineno)
                if entry is not None:  # kept verbatim: fields this runtime does not know survive
                    keep.pop(self._key(entry), None)
                    keep[self._key(entry)] = raw
        except OSError as exc:
            raise AutotuneError(f"cannot read store {self.path}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        self._clean_temps()
        tmp = self.path.parent / f"{self._temp_prefix()}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(8)}"
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(out, "wb") as fh:
                fh.write(b"".join(raw + b"\n" for raw in list(keep.values())[-self.max_entries:]))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise AutotuneError(f"cannot compact store {self.path}: {exc.strerror or exc}") from exc
            raise
        self._reset()
        self.refresh()


# ---------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------
class _TimedOut(Exception):
    pass


class _Worker:
    """One daemon thread that runs the caller's benchmark calls, so that the caller can stop
    waiting for one (``timeout``). Python cannot stop a running function: a call that timed out
    is left to finish in this thread, its result is discarded, and the thread then exits. Being
    a daemon, it does not hold up the process's exit."""

    def __init__(self, benchmark: Callable[[Any], Any]) -> None:
        self._benchmark = benchmark
        self._tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="ckpred-autotune-benchmark", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            arg, box, done = task
            try:
                box.append((True, self._benchmark(arg)))
            except BaseException as exc:  # handed to the caller, who re-raises what is not an Exception
                box.append((False, exc))
            done.set()

    def call(self, arg: Any, timeout: float) -> Any:
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        self._tasks.put((arg, box, done))
        if not done.wait(timeout):
            raise _TimedOut
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self._tasks.put(None)  # the thread exits after its current call, if one is still running


def _measure(benchmark: Callable[[Any], Any], arg: Any, kernel_id: int, name: str, worker: _Worker | None,
             timeout: float | None) -> tuple[Measurement, float, bool]:
    """One benchmark call: (measurement, wall seconds, timed out)."""
    t0 = time.perf_counter()
    try:
        value = benchmark(arg) if worker is None else worker.call(arg, timeout)  # type: ignore[arg-type]
    except _TimedOut:
        error = f"TimeoutError: no result after {timeout:g} s (the call was left running)"
        return Measurement(kernel_id, name, None, error), time.perf_counter() - t0, True
    except Exception as exc:  # the caller's kernel failed: record it, try the next one
        return Measurement(kernel_id, name, None, f"{type(exc).__name__}: {exc}"[:500]), time.perf_counter() - t0, False
    wall = time.perf_counter() - t0
    seconds = _real(value)
    if seconds is None:
        raise AutotuneError(f"benchmark({arg!r}) returned {_short(value)} ({type(value).__name__}); allowed: seconds as "
                            "a number (nan, inf or an exception mark a failed kernel)")
    if not math.isfinite(seconds) or seconds <= 0:
        return Measurement(kernel_id, name, None, f"non-finite or non-positive time {value!r}"), wall, False
    return Measurement(kernel_id, name, seconds), wall, False


def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    value = _real(timeout)
    if value is None or not math.isfinite(value) or value <= 0:
        raise AutotuneError(f"timeout={timeout!r}; allowed: None or a finite number of seconds > 0")
    return value


def autotune_ranked(ids: Sequence[int], names: Sequence[str], scores: Sequence[float],
                    benchmark: Callable[[Any], float], budget: Budget, *, pass_id: bool = False,
                    problem: str = "", values: Mapping[str, float] | None = None,
                    timeout: float | None = None, shift: str = "") -> TuneResult:
    """Benchmark ranked candidates (valid ones, best first) until ``budget`` is spent.

    This is the store-free core of :func:`autotune`; the replay and the C++ header follow the
    same rules: count successes against the soft budget, stop at ``budget.max_benchmarks``
    calls, and past the soft budget continue only while nothing has succeeded. ``values`` (the
    problem's field values) feed a :class:`LogisticCalibration`; ``shift`` (why the problem is
    outside what the calibration measured, :func:`shift_of`) sizes a :class:`Confidence`
    budget by :func:`size_confidence`. With ``timeout``, see :func:`autotune`.
    """
    if not isinstance(budget, Budget):
        raise AutotuneError(f"budget={budget!r}; allowed: FixedK, TimeBudget or Confidence")
    timeout = _check_timeout(timeout)
    if isinstance(budget, Confidence):  # sized once, from the scores (and the problem)
        budget = size_confidence(budget, scores, values, shift)
    spent = _Spent()
    measured: list[Measurement] = []
    candidates = list(zip(ids, names))
    stop = "no valid kernel" if not candidates else "candidates exhausted"
    timed_out = False
    worker = _Worker(benchmark) if timeout is not None and candidates else None
    try:
        for kernel_id, name in candidates:
            if spent.successes and budget.spent(scores, spent):
                stop = "budget spent"
                break
            if spent.attempts >= budget.max_benchmarks:
                stop = f"max_benchmarks={budget.max_benchmarks} reached"
                break
            m, wall, timed_out = _measure(benchmark, int(kernel_id) if pass_id else name, int(kernel_id), name, worker,
                                          timeout)
            measured.append(m)
            spent.attempts += 1
            spent.wall_s += wall
            if m.ok:
                spent.successes += 1
                spent.kernel_s += float(m.seconds)  # type: ignore[arg-type]
            if timed_out:  # the device may still run it: start nothing else
                stop = f"benchmark of {name} timed out after {timeout:g} s: search stopped"
                break
        else:
            if spent.successes and budget.spent(scores, spent):
                stop = "budget spent"
            elif spent.attempts >= budget.max_benchmarks:
                stop = f"max_benchmarks={budget.max_benchmarks} reached"
    finally:
        if worker is not None:
            worker.close()
    good = [m for m in measured if m.ok]
    if not good:
        if measured:
            stop = f"{stop}: all {len(measured)} benchmarks failed"
        return TuneResult(problem, None, None, None, tuple(measured), False, budget.describe(), stop,
                          timed_out=timed_out)
    best = min(good, key=lambda m: m.seconds)  # type: ignore[arg-type, return-value]
    return TuneResult(problem, best.kernel, best.kernel_id, best.seconds, tuple(measured), False,
                      budget.describe(), stop, timed_out=timed_out)


def model_hash(manifest: Mapping[str, Any]) -> str:
    """The store's model key: the sha256 of the selector graph recorded in the manifest."""
    selector = manifest["graphs"]["selector"]["file"]
    try:
        return str(manifest["files"][selector]["sha256"])
    except KeyError as exc:
        raise ModelMismatchError(f"manifest has no sha256 for {selector}") from exc


def _not_this_models(hit: Mapping[str, Any], selector: Any) -> str:
    """Why a stored entry (already well-formed) cannot be this model's answer ("" when it can)."""
    name = selector.kernel_name(hit["kernel_id"])
    if name is None:
        return f"kernel_id {hit['kernel_id']} is not in the model's catalogue of {len(selector.catalogue)} kernels"
    if name != hit["kernel"]:
        return f"kernel_id {hit['kernel_id']} is {name!r} in the model's catalogue, the line says {_short(hit['kernel'])}"
    return ""


def autotune(selector: Any, problem: Mapping[str, Any], benchmark: Callable[[Any], float],
             budget: Budget | int | None = None, *, store: ResultStore | str | os.PathLike[str] | None = None,
             pass_id: bool = False, refresh: bool = False, timeout: float | None = None) -> TuneResult:
    """Benchmark the model's best valid kernels for ``problem`` and return the fastest.

    Parameters
    ----------
    selector : KernelSelector
        A loaded selector (ranks the candidates; its manifest gives the model hash and the
        confidence calibration).
    problem : mapping
        Problem fields by name, as in ``select`` (category fields by their value, e.g.
        ``precision="fp32"``; defaults filled in).
    benchmark : callable
        ``benchmark(kernel_name) -> seconds`` (``benchmark(kernel_id)`` with ``pass_id``). An
        exception, nan, inf or a time <= 0 is recorded and the kernel skipped. A result that is
        not a number (text, a bool, None) is refused: :class:`AutotuneError`.
    budget : Budget or int, default=FixedK(2)
        When to stop (:class:`FixedK`, :class:`TimeBudget`, :class:`Confidence`); an int ``k``
        is ``FixedK(k)``.
    store : ResultStore or path, optional
        Checked before anything is measured (:meth:`ResultStore.check`); read first (a stored
        winner of this model, whose kernel is in the model's catalogue under that name, is
        returned without benchmarking) and written after a successful search. A write that
        fails after the search does not lose it: the result comes back with ``stored=False``
        and ``store_error`` saying why (also logged).
    refresh : bool, default=False
        Benchmark even when the store has an answer (and overwrite it).
    timeout : float, optional
        Seconds to wait for one benchmark call. The calls then run in one worker thread
        (created per search, ended after it). A call still running after ``timeout`` is recorded
        as failed (``TimeoutError``), the search stops there (nothing else is launched while
        the device may still run it) and the best kernel measured so far, if any, is returned
        (and stored) with ``timed_out=True``. Python cannot stop the call: it keeps running in
        the worker thread, which discards its result and exits when it returns. A benchmark
        that can hang for good should bound itself (a device-side timeout) or run in a
        subprocess. Without ``timeout`` the calls run in the caller's thread.

    Returns
    -------
    TuneResult

    Raises
    ------
    AutotuneError
        A bad budget, timeout or benchmark result; a store that cannot be used (named).
    ckpred.errors.ConfigValueError
        A problem that is not a mapping or whose values the model refuses (``problem.<field>``).
    """
    budget = as_budget(budget)
    if not isinstance(problem, Mapping):
        raise ConfigValueError("problem", problem, f"a mapping of problem field -> value (fields: "
                                                   f"{selector.problem_fields})")
    if not callable(benchmark):
        raise AutotuneError(f"benchmark={_short(benchmark)}; allowed: a callable kernel -> seconds")
    for flag, value in (("pass_id", pass_id), ("refresh", refresh)):
        if not isinstance(value, bool):
            raise AutotuneError(f"{flag}={value!r}; allowed: True or False")
    timeout = _check_timeout(timeout)
    if isinstance(budget, Confidence):
        cal = getattr(selector, "calibration", None)  # checked by KernelSelector.load
        budget = budget.with_calibration(selector.manifest.get("autotune") if cal is None else cal,
                                         str(selector.model_dir))
    if store is not None and not isinstance(store, ResultStore):
        store = ResultStore(store)
    row = selector.problem_row(dict(problem))
    key = problem_key(row, selector.problem_fields)
    model, op = model_hash(selector.manifest), selector.manifest["op"]
    if store is not None:
        store.check()  # before anything is measured
        hit = None if refresh else store.get(model, op, key)
        if hit is not None:
            why = _not_this_models(hit, selector)
            if not why:
                return TuneResult(key, hit["kernel"], hit["kernel_id"], float(hit["seconds"]), (), True,
                                  str(hit.get("policy", "")), "from store", stored=True)
            log.warning("%s: skipped the stored answer for %s (%s); benchmarking", store.path, key, why)
    # the problem as the caller gave it: select checks it and encodes category values itself
    answer = selector.select(dict(problem), top_k=max(1, min(budget.max_benchmarks, len(selector.catalogue))))
    shift = shift_of(selector.manifest, row, budget.calibration) if isinstance(budget, Confidence) else ""
    result = autotune_ranked(answer.ids, answer.kernels, answer.scores, benchmark, budget, pass_id=pass_id,
                             problem=key, values=row, timeout=timeout, shift=shift)
    if not answer.ok:
        result = TuneResult(key, None, None, None, (), False, budget.describe(), answer.reason)
    if store is not None and result.ok:
        try:
            store.put({"model": model, "op": op, "arch": selector.manifest["arch"],
                       "dtype": selector.manifest["dtype"], "layout": selector.manifest["layout"], "problem": key,
                       "kernel_id": result.kernel_id, "kernel": result.kernel, "seconds": result.seconds,
                       "policy": result.policy, "measured": [m.to_dict() for m in result.measured]})
        except AutotuneError as exc:
            log.warning("%s; the result is returned but not stored", exc)
            return replace(result, store_error=str(exc))
        result = replace(result, stored=True)
    return result
