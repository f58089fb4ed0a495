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

The parts, in the order they build on each other: :mod:`~ckpred.autotune.checks` (the error and
the value checks), :mod:`~ckpred.autotune.calibration` (the calibrations and their records),
:mod:`~ckpred.autotune.fit` (fitting them), :mod:`~ckpred.autotune.budget` (the budgets),
:mod:`~ckpred.autotune.store` (the persistent store and its format, ``ckpred.autotune/1``) and
:mod:`~ckpred.autotune.search` (the search itself). Everything public is importable from
``ckpred.autotune``.
"""

from __future__ import annotations

from ckpred.autotune.budget import Budget, Confidence, FixedK, TimeBudget, as_budget, shift_of, size_confidence
from ckpred.autotune.calibration import (CALIBRATION_FORMAT, LOGISTIC_FORMAT, SCORE_FEATURES, Calibration,
                                         LogisticCalibration, load_calibration, score_gap, signal_features)
from ckpred.autotune.checks import FALLBACK_K, MAX_BENCHMARKS, AutotuneError
from ckpred.autotune.fit import (OofRows, TableOptions, calibrate, calibration_from_oof, fit_logistic,
                                 informative_within, ranked_problems, top_j_efficiency)
from ckpred.autotune.search import Measurement, ProblemContext, TuneResult, autotune, autotune_ranked, model_hash
from ckpred.autotune.store import (MAX_LINE_BYTES, MAX_LINE_DEPTH, STALE_TEMP_S, STORE_FORMAT, ResultStore,
                                   check_entry, problem_key)

__all__ = ["STORE_FORMAT", "Measurement", "TuneResult", "Budget", "FixedK", "TimeBudget", "Confidence",
           "Calibration", "LogisticCalibration", "calibrate", "calibration_from_oof", "fit_logistic",
           "load_calibration", "ranked_problems", "signal_features", "top_j_efficiency", "ResultStore", "problem_key",
           "check_entry", "as_budget", "autotune", "autotune_ranked", "AutotuneError", "CALIBRATION_FORMAT",
           "LOGISTIC_FORMAT", "SCORE_FEATURES", "FALLBACK_K", "MAX_BENCHMARKS", "MAX_LINE_BYTES", "MAX_LINE_DEPTH",
           "STALE_TEMP_S", "score_gap", "shift_of", "size_confidence", "informative_within", "model_hash",
           "ProblemContext", "OofRows", "TableOptions"]
