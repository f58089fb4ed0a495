"""The confidence budget's calibrations: what they hold, how they are read back and checked.

A :class:`Calibration` (score-gap bins) or a :class:`LogisticCalibration` (score gaps and the
problem's size) gives P(best of the model's top j is within a tolerance of the best kernel);
:mod:`ckpred.autotune.fit` fits them. Both runtimes accept exactly the same records (the C++
``manifest.hpp``: ``check_calibration``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ckpred.autotune.checks import FALLBACK_K, AutotuneError, _real

#: Format tag of a calibration table.
CALIBRATION_FORMAT = "ckpred.autotune.calibration/1"
#: Format tag of a logistic calibration (:class:`LogisticCalibration`).
LOGISTIC_FORMAT = "ckpred.autotune.logistic/1"
#: Features of the logistic calibration computed from the ranked scores (then one log2 per
#: problem field it uses, then ``log2_size``); see :func:`signal_features`.
SCORE_FEATURES = ("gap2", "gap3", "gap4", "gap5", "top", "spread5", "valid")


def _reals(value: object, key: str, where: str) -> tuple[float, ...]:
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


def _arrays(value: object, key: str, where: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise AutotuneError(f"{where}: {key} is {value!r}; allowed: an array")
    return list(value)


def _integer(value: object, key: str, where: str, lo: int) -> int:
    """A JSON integer (not a float, text or boolean) in [lo, 2^63-1]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not lo <= value < 2**63:
        raise AutotuneError(f"{where}: {key} is {value!r}; allowed: an integer in [{lo}, 2^63-1]")
    return int(value)


def _check_within(within: Sequence[float], where: str) -> None:
    """Refuse tolerances that are not distinct fractions in (0, 1), by name."""
    if not all(0 < w < 1 for w in within) or len(set(within)) != len(within):
        raise AutotuneError(f"{where}: within={list(within)}; allowed: distinct fractions in (0, 1)")


def _check_format(d: object, expected: str, where: str) -> None:
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


def _policy_dict(c: Calibration | LogisticCalibration) -> dict[str, Any]:
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


def score_gap(scores: Sequence[float] | np.ndarray, gap_to: int = 2) -> float:
    """Top score minus the ``gap_to``-th highest (inf with fewer finite scores)."""
    s = np.asarray(scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    if len(s) < gap_to:
        return math.inf
    top = np.sort(s)[::-1]
    return float(top[0] - top[gap_to - 1])


def signal_features(scores: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray) -> np.ndarray:
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
