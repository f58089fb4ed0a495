"""``python -m ckpred train``: cross-validate the model against the baselines and write the run.

:func:`train` is the plain task function sweeps and ``ckpred tune`` call: it picks the run
folder and hands the composed config to the engine (:func:`ckpred.cv.driver.cross_validate`).
"""

from __future__ import annotations

from typing import Callable

from ckpred.config import run_dir
from ckpred.cv.driver import cross_validate
from ckpred.schema import TrainConfig


def train(cfg: TrainConfig, on_fold: Callable[[int, float], None] | None = None) -> float:
    """Train, cross-validate and evaluate against the baselines; write the run directory.

    Parameters
    ----------
    cfg : TrainConfig
        A composed ``train`` config (:func:`ckpred.config.compose`).
    on_fold : callable, optional
        Called after each fold as ``on_fold(fold_index, mean)`` with the model's mean per-shape
        efficiency over the shapes tested so far (``ckpred tune`` prunes trials with it).

    Returns
    -------
    float
        The model's mean per-shape efficiency over the test shapes (what sweeps maximise).
    """
    return cross_validate(cfg, run_dir(cfg.out_dir, "train"), on_fold)
