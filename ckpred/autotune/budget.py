"""Budgets: how many of the model's candidates :func:`~ckpred.autotune.autotune` benchmarks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ckpred.autotune.calibration import Calibration, LogisticCalibration, load_calibration
from ckpred.autotune.checks import MAX_BENCHMARKS, AutotuneError, _count, _real


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


def as_budget(budget: object) -> Budget:
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
        cal = self.fitted()
        k = cal.needed(scores, float(self.target), float(self.within), problem=problem)
        return max(k, cal.fallback_k) if shifted else k

    def fitted(self) -> Calibration | LogisticCalibration:
        """The calibration (a mapping given was parsed at construction); refused when there is none."""
        if self.calibration is None or isinstance(self.calibration, Mapping):
            raise AutotuneError("Confidence budget without a calibration table")
        return self.calibration

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
    cal = budget.fitted()
    k = budget.planned(scores, problem, shifted=bool(shift))
    policy = budget.describe()
    if budget.within in cal.uninformative:
        policy += f"+fallback(k={cal.fallback_k})"
    elif shift:
        policy += f"+shifted(k>={cal.fallback_k})"
    return _Sized(k, policy, budget.max_benchmarks)


def shift_of(manifest: Mapping[str, Any], row: Mapping[str, int],
             calibration: Calibration | LogisticCalibration | Mapping[str, Any] | None) -> str:
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
