"""Model-guided search on a new GPU, re-ranking as measurements come in.

Where no model fits the target well enough to pick one kernel (a tunable kernel on a GPU it was
never measured on), a model trained on other GPUs still orders the search: measure the
configuration it ranks best, then correct the ranking with what the new GPU has shown so far,
and measure the next. :func:`guided_search` does this with

* a LightGBM regressor of the relative log time (log(time / best time of that GPU)) on the
  tunable parameters, trained on the source GPUs' complete measurements;
* after every measurement, a kernel-weighted correction: each configuration's prediction is
  shifted by the Gaussian-weighted mean residual (measured log time minus prediction, centred
  by their median) of the measured configurations near it in standardised parameter space
  (sizes on a log2 scale),
  shrunk towards zero by a unit pseudo-weight, so a region that ran faster than predicted is
  promoted and one that ran slower is demoted; failed configurations push their neighbours
  down the list.

:func:`evaluations_to_reach` reads the number of measurements until the first configuration
within a tolerance of the best, the figure random search is compared on.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pandas as pd

from ckpred.data.readers import kernel_tuner
from ckpred.data.readers.common import ReadContext
from ckpred.errors import InputFileError

if TYPE_CHECKING:
    from lightgbm import LGBMRegressor

__all__ = ["read_cache", "guided_search", "evaluations_to_reach", "random_evaluations"]


def read_cache(path: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """A Kernel Tuner cache (``.json`` or ``.json.gz``) as a frame: the tunable parameters that
    vary, ``time`` in ms (NaN for failed configurations), indexed by the cache key.

    Parsing is :mod:`ckpred.data.readers.kernel_tuner`'s; a rejected entry (damaged file,
    parameters that disagree with their key) raises instead of leaving a hole in the search space.
    """
    path = Path(path)
    # The table reader uses only the label; op, kernel resolver and kinds belong to ingestion.
    ctx = ReadContext(op=None, resolver=None, dtype="", layout="", arch="", label=str(path))  # type: ignore[arg-type]
    raw = kernel_tuner.read(path, ctx)
    if raw.rejects:
        first = raw.rejects[0]
        raise InputFileError(str(path), f"{len(raw.rejects)} cache entries rejected, first at {first.source}: "
                                        f"{first.reason}")
    frame = raw.frame.set_index("config")
    frame["time"] = pd.to_numeric(frame["time"], errors="coerce")  # failed configs: empty time, status set
    text = kernel_tuner._text(path)
    keys = kernel_tuner._header(text, text.find('"cache"'), path)["tune_params_keys"]
    varying = [k for k in keys if frame[k].nunique() > 1]
    return frame[[*varying, "time"]].sort_index(), varying


def _relative_log_time(time: np.ndarray) -> np.ndarray:
    return np.log(time / np.nanmin(time))


def source_model(params: np.ndarray, times: Sequence[np.ndarray], *, seed: int = 0) -> LGBMRegressor:
    """LightGBM regressor of the relative log time on the source GPUs (failed rows dropped)."""
    import lightgbm as lgb  # lazy: lightgbm costs ~2 s to import; reading a cache or searching does not need it

    X = np.vstack([params] * len(times))
    y = np.concatenate([_relative_log_time(t) for t in times])
    ok = np.isfinite(y)
    # Every configuration of the space is in the training data: the model should reproduce the
    # sources closely (deep trees, small leaves), not smooth over the few fast configurations.
    model = lgb.LGBMRegressor(n_estimators=1000, num_leaves=63, learning_rate=0.05, min_child_samples=2,
                              random_state=seed, n_jobs=1, verbose=-1)
    return model.fit(X[ok], y[ok])


def _standardised(params: np.ndarray) -> np.ndarray:
    """Distances for the correction: all-positive parameters (sizes) on a log2 scale, so 1 -> 2
    is as far as 8 -> 16; flags as they are; then every column to unit variance."""
    x = np.asarray(params, dtype=float).copy()
    positive = (x > 0).all(axis=0)
    x[:, positive] = np.log2(x[:, positive])
    std = x.std(0)
    return (x - x.mean(0)) / np.where(std > 0, std, 1.0)


def _pick(score: np.ndarray, left: np.ndarray, z: np.ndarray, measured: list[int], explore_pool: int,
          exploring: bool) -> int:
    """The next configuration: the best-ranked one left, or (``exploring``) the one of the
    ``explore_pool`` best-ranked farthest from everything measured so far."""
    cand = np.flatnonzero(left)
    if exploring:
        pool = cand[np.argsort(score[cand], kind="stable")[:explore_pool]]
        far = ((z[pool][:, None, :] - z[measured][None, :, :]) ** 2).sum(-1).min(1)
        return int(pool[np.argmax(far)])
    return int(cand[np.argmin(score[cand])])


def _corrected(prior: np.ndarray, z: np.ndarray, measured: list[int], times: list[float],
               bandwidth: float) -> np.ndarray:
    """The prior shifted by the kernel-weighted residuals of the measurements so far (failed
    configurations push their neighbours down)."""
    t = np.asarray(times)
    idx = np.asarray(measured)
    ok = np.isfinite(t) & (t > 0)
    score = np.asarray(prior, dtype=float).copy()
    if ok.sum() >= 2:
        res = np.log(t[ok]) - prior[idx[ok]]
        res -= np.median(res)
        w = np.exp(-((z[:, None, :] - z[None, idx[ok], :]) ** 2).sum(-1) / bandwidth ** 2)
        score += (w * res).sum(1) / (w.sum(1) + 1.0)
    if (~ok).any():
        wb = np.exp(-((z[:, None, :] - z[None, idx[~ok], :]) ** 2).sum(-1) / bandwidth ** 2)
        score += wb.sum(1)
    return score


def guided_search(params: np.ndarray, prior: np.ndarray, measure: Callable[[int], float], budget: int, *,
                  bandwidth: float = 2.0, adapt: bool = True, explore_every: int = 0,
                  explore_pool: int = 20) -> list[int]:
    """Measure ``budget`` configurations, best-predicted first, re-ranking after each one.

    Parameters
    ----------
    params : ndarray, shape (n, p)
        Tunable parameters of every configuration.
    prior : ndarray, shape (n,)
        The source model's predicted relative log time (lower is better).
    measure : callable
        ``measure(index) -> time`` (NaN or inf for a failed configuration).
    budget : int
        Measurements to make.
    bandwidth : float
        Kernel width in standardised parameter units (see :func:`_standardised`).
    adapt : bool
        False: measure in the prior's order only (no re-ranking).
    explore_every : int
        0: always measure the best-ranked configuration. n > 0: every n-th measurement is
        instead the one of the ``explore_pool`` best-ranked that lies farthest (standardised
        distance) from everything measured so far, to probe a region the source GPUs never
        favoured.
    explore_pool : int
        Candidates the exploring step chooses among.

    Returns
    -------
    list of int
        Configuration indices in the order measured.
    """
    z = _standardised(params)
    score = np.asarray(prior, dtype=float).copy()
    measured: list[int] = []
    times: list[float] = []
    left = np.ones(len(score), bool)
    for step in range(min(budget, len(score))):
        exploring = explore_every > 0 and bool(measured) and step % explore_every == explore_every - 1
        nxt = _pick(score, left, z, measured, explore_pool, exploring)
        measured.append(nxt)
        left[nxt] = False
        times.append(float(measure(nxt)))
        if adapt:
            score = _corrected(prior, z, measured, times, bandwidth)
    return measured


def evaluations_to_reach(order: Sequence[int], time: np.ndarray, within: float) -> int | None:
    """Measurements until the first configuration with time <= (1 + within) * best (None: never)."""
    t = np.asarray(time, dtype=float)[np.asarray(order, dtype=int)]
    hit = np.flatnonzero(t <= (1 + within) * np.nanmin(time))
    return int(hit[0]) + 1 if len(hit) else None


def random_evaluations(time: np.ndarray, within: float) -> float:
    """Expected draws without replacement until the first within ``within``: (N + 1) / (k + 1)."""
    t = np.asarray(time, dtype=float)
    k = int(np.sum(t <= (1 + within) * np.nanmin(t)))
    return (len(t) + 1) / (k + 1)
