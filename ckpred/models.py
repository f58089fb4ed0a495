"""The model: a two-step scikit-learn Pipeline ``features -> LightGBM``, built from config.

``build_pipeline`` is the contract with export (:mod:`ckpred.export`): the Pipeline has
exactly the steps ``("features", FeatureUnion)`` and ``("model", estimator)`` where the
estimator is

* ``TransformedTargetRegressor(LGBMRegressor, <target transformer>, check_inverse=False)`` for
  ``model=lgbm_regressor``. ``target=log1p`` uses :class:`Log1pTarget`, ``raw`` and
  ``relative`` use :class:`IdentityTarget` (the relative target, log(perf / best of the shape),
  needs the shape groups, so :mod:`ckpred.train` computes it with :func:`relative_target`);
* ``LGBMRanker(objective=model.objective)`` (``lambdarank`` or ``rank_xendcg``) for
  ``model=lgbm_ranker``, trained on graded relevance (:func:`relevance_grades`, gains
  ``model.label_gain``), one query per shape.

A pipeline may also carry a learned failure model (:func:`fit_failure_model`): the kernels
the training data saw fail, masked at selection like the op's validity rules; and, for an op
whose table lists only the kernels that apply to each problem (``op.absence=not_applicable``),
a learned applicability model (:func:`fit_applicability_model`): the kernels a problem's row
set would not hold, masked before the failure model.

Higher score = better kernel for every model and target. After :func:`fit_pipeline` the Pipeline
carries ``ckpred_target_`` ("log1p", "raw", "relative" or "rank") for the export manifest.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import lightgbm as lgb
import numpy as np
import numpy.typing as npt
import pandas as pd
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.compose import TransformedTargetRegressor
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from ckpred.features import build_features
from ckpred.kernels.base import OpDefinition
from ckpred.schema import (ApplicabilityConfig, ArchConfig, DtypeConfig, FeaturesConfig, LayoutConfig, ModelConfig,
                           RecipeConfig, TargetConfig, ValidityModelConfig)


class _ElementwiseTarget(TransformerMixin, BaseEstimator):
    """Stateless element-wise target transform on 2-D arrays (what TTR passes)."""

    _parameter_constraints: dict = {}

    def __init__(self) -> None:
        pass

    def fit(self, X: npt.ArrayLike, y: npt.ArrayLike | None = None) -> "_ElementwiseTarget":
        validate_data(self, X, dtype=np.float64)
        return self

    def _forward(self, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _backward(self, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def transform(self, X: npt.ArrayLike) -> np.ndarray:
        check_is_fitted(self)
        return self._forward(validate_data(self, X, dtype=np.float64, reset=False))

    def inverse_transform(self, X: npt.ArrayLike) -> np.ndarray:
        check_is_fitted(self)
        return self._backward(check_array(X, dtype=np.float64, ensure_all_finite=False))

    def get_feature_names_out(self, input_features: Sequence[str] | None = None) -> np.ndarray:
        check_is_fitted(self)
        return np.asarray([f"y{i}" for i in range(self.n_features_in_)], dtype=object)


class Log1pTarget(_ElementwiseTarget):
    """``log1p`` of the target (TFLOPS), ``expm1`` back; negative values are clipped to 0."""

    def _forward(self, X: np.ndarray) -> np.ndarray:
        # Measured perf is >= 0; a negative value can only be a failed row, which scores 0.
        return np.log1p(np.maximum(X, 0.0))

    def _backward(self, X: np.ndarray) -> np.ndarray:
        return np.expm1(X)


class IdentityTarget(_ElementwiseTarget):
    """The target as is (``raw`` TFLOPS, or the already log-relative ``relative`` target)."""

    def _forward(self, X: np.ndarray) -> np.ndarray:
        return X.copy()

    def _backward(self, X: np.ndarray) -> np.ndarray:
        return X.copy()


def relative_target(perf: np.ndarray, shape_codes: np.ndarray, *, floor: float) -> np.ndarray:
    """``log(max(perf / best of the shape, floor))``; 0 for the best kernel, <= 0 elsewhere.

    Parameters
    ----------
    perf : ndarray
        Measured performance, 0 for failed rows.
    shape_codes : ndarray of int
        Shape index of each row; the best is taken over every row given for that shape.
    floor : float
        Lower clip of the ratio (failed kernels get ``log(floor)``).
    """
    perf = np.asarray(perf, dtype=np.float64)
    best = np.zeros(int(shape_codes.max()) + 1 if len(shape_codes) else 0)
    np.maximum.at(best, shape_codes, perf)
    b = best[shape_codes]
    ratio = np.divide(perf, b, out=np.zeros_like(perf), where=b > 0)
    return np.log(np.maximum(ratio, floor))


def relevance_grades(perf: np.ndarray, shape_codes: np.ndarray, *, n_grades: int,
                     exponent: float) -> np.ndarray:
    """Integer relevance 0..n_grades-1 per row: ``round((n_grades-1) * (perf/best)**exponent)``.

    LightGBM's lambdarank needs integer labels below ``len(label_gain)``; 31 grades fit its
    default gains ``2**i - 1``. The exponent spends more grades near the best kernel, where
    selection is decided (with 31 grades and exponent 3, one grade near the top is ~1% of perf).
    """
    rel = np.exp(relative_target(perf, shape_codes, floor=1e-300))
    rel = np.where(perf > 0, rel, 0.0)
    return np.rint((n_grades - 1) * rel ** exponent).astype(np.int32)


def _lgbm_params(model_cfg: ModelConfig, seed: int) -> dict[str, Any]:
    return dict(
        n_estimators=int(model_cfg.n_estimators), learning_rate=float(model_cfg.learning_rate),
        num_leaves=int(model_cfg.num_leaves), max_depth=int(model_cfg.max_depth),
        min_child_samples=int(model_cfg.min_child_samples), subsample=float(model_cfg.subsample),
        subsample_freq=int(model_cfg.subsample_freq), colsample_bytree=float(model_cfg.colsample_bytree),
        reg_alpha=float(model_cfg.reg_alpha), reg_lambda=float(model_cfg.reg_lambda),
        min_split_gain=float(model_cfg.min_split_gain), max_bin=int(model_cfg.max_bin),
        n_jobs=int(model_cfg.n_jobs), random_state=int(seed),
        # Same seed + same threads -> bit-identical models (LightGBM's documented switches;
        # row-wise histograms suit many rows x few features and fix the algorithm choice).
        deterministic=True, force_row_wise=True, verbose=-1,
    )


def build_estimator(model_cfg: ModelConfig, target_cfg: TargetConfig, seed: int = 0) -> BaseEstimator:
    """The unfitted ``model`` step for ``model_cfg`` / ``target_cfg`` (see module docstring)."""
    params = _lgbm_params(model_cfg, seed)
    if model_cfg.name == "lgbm_ranker":
        grades = int(model_cfg.relevance_grades)
        linear = str(model_cfg.label_gain) == "linear"
        gain = [float(i) if linear else float(2 ** i - 1) for i in range(grades)]
        return lgb.LGBMRanker(objective=str(model_cfg.objective), label_gain=gain, **params)
    if model_cfg.name != "lgbm_regressor":
        raise ValueError(f"unknown model.name {model_cfg.name!r}")
    transformer = Log1pTarget() if target_cfg.name == "log1p" else IdentityTarget()
    return TransformedTargetRegressor(regressor=lgb.LGBMRegressor(objective="regression", **params),
                                      transformer=transformer, check_inverse=False)


@dataclass(frozen=True)
class Recipe:
    """What one learned pipeline is made of: a feature set, a model and a target, with the run's
    seed and layout (the config's own model, or a baseline's features, model and target)."""

    features: FeaturesConfig
    model: ModelConfig
    target: TargetConfig
    seed: int = 0
    #: Sets the features' ``layout_code`` (None: rcr's, the layout a catalogue assumes without one).
    layout: LayoutConfig | None = None


def build_pipeline(cfg: Recipe | RecipeConfig, op: OpDefinition, arch_cfg: ArchConfig, dtype_cfg: DtypeConfig) -> Pipeline:
    """The unfitted ``features -> model`` Pipeline of a recipe.

    Parameters
    ----------
    cfg : Recipe or RecipeConfig
        The ``features``, ``model``, ``target``, ``seed`` and ``layout`` (a learned method's
        :class:`Recipe`, or a command's config for its own model).
    op : OpDefinition
        Pipeline input X is ``op.encode_frame(table)`` (columns ``op.input_names``).
    arch_cfg, dtype_cfg : ArchConfig, DtypeConfig
        Hardware profile and dtype for the feature constants.

    Returns
    -------
    sklearn.pipeline.Pipeline
        Steps ``("features", FeatureUnion)`` and ``("model", estimator)``.
    """
    features = build_features(cfg.features, op, arch_cfg, dtype_cfg, cfg.layout)
    seed = int(cfg.seed)
    return Pipeline([("features", features), ("model", build_estimator(cfg.model, cfg.target, seed))])


def target_name(model_cfg: ModelConfig, target_cfg: TargetConfig) -> str:
    """What the scores mean: the target name, or ``rank`` for the ranker."""
    return "rank" if model_cfg.name == "lgbm_ranker" else str(target_cfg.name)


def training_target(perf: np.ndarray, shape_codes: np.ndarray, model_cfg: ModelConfig,
                    target_cfg: TargetConfig) -> np.ndarray:
    """y for :func:`fit_pipeline`: TFLOPS (log1p/raw; TTR transforms it), log-relative, or grades."""
    if model_cfg.name == "lgbm_ranker":
        return relevance_grades(perf, shape_codes, n_grades=int(model_cfg.relevance_grades),
                                exponent=float(model_cfg.relevance_exponent))
    if target_cfg.name == "relative":
        return relative_target(perf, shape_codes, floor=float(target_cfg.floor))
    return np.asarray(perf, dtype=np.float64)


def query_sizes(shape_codes: np.ndarray) -> np.ndarray:
    """LightGBM's ``group`` argument of a ranker: the sizes of consecutive runs of equal codes.

    A ranker's query is one shape's rows, so they must be contiguous; codes that reappear after
    another shape raise ``ValueError`` instead of silently splitting a query in two.
    """
    change = np.flatnonzero(np.diff(shape_codes)) + 1
    bounds = np.concatenate([[0], change, [len(shape_codes)]])
    sizes = np.diff(bounds)
    if len(np.unique(shape_codes)) != len(sizes):
        raise ValueError("ranker training rows must be contiguous per shape (sort them by shape first)")
    return sizes


@dataclass(frozen=True)
class FitRows:
    """Rows a model fits on, or stops early on: the raw input ``X`` (``op.encode_frame``), the
    label ``y`` (:func:`training_target`), each row's shape code (a ranker needs rows contiguous
    per shape) and, when the caller computed them, their features ``Xt``."""

    X: pd.DataFrame
    y: np.ndarray
    codes: np.ndarray
    Xt: np.ndarray | None = None


def fit_pipeline(pipe: Pipeline, rows: FitRows, *, model_cfg: ModelConfig, target: str, val: FitRows | None = None,
                 init_model: lgb.Booster | None = None, features_out: dict[str, Any] | None = None) -> Pipeline:
    """Fit ``pipe`` in place on ``rows``, with early stopping on ``val`` when configured.

    The steps are fitted one after the other (instead of ``Pipeline.fit``) so the validation
    rows pass through the fitted feature step and the target transform before LightGBM sees
    them. The validation rows are whatever the caller carved from the training shapes — never
    the test fold (:mod:`ckpred.train` does the carving).

    Parameters
    ----------
    rows, val : FitRows
        The training and validation rows. Their ``Xt``, when given, are the features the
        caller computed (rows of several GPUs, each with its own arch's constants:
        :func:`ckpred.fitting.fit_method`); the feature step is then fitted on ``rows.X`` (it
        learns where its columns are) without transforming it.
    target : str
        Recorded as ``pipe.ckpred_target_``.
    init_model : lightgbm.Booster, optional
        Warm start (:mod:`ckpred.warm_start`): continue boosting from this booster, adding
        ``model.n_estimators`` trees (LightGBM's ``init_model``; TTR passes it to the regressor).
    features_out : dict, optional
        Receives the transformed training features as ``features_out["Xt"]`` (so a failure
        model can learn on them without computing them again).
    """
    features = pipe.named_steps["features"]
    model = pipe.named_steps["model"]
    if rows.Xt is None:
        Xt = features.fit_transform(rows.X)
    else:
        features.fit(rows.X)
        Xt = rows.Xt
    if features_out is not None:
        features_out["Xt"] = Xt
    fit_params: dict[str, Any] = {}
    is_ranker = isinstance(model, lgb.LGBMRanker)
    if is_ranker:
        fit_params["group"] = query_sizes(rows.codes)
    rounds = int(model_cfg.early_stopping_rounds)
    if rounds > 0:
        fit_params.update(_early_stopping(pipe, val, rounds))
    if init_model is not None:  # warm start
        fit_params["init_model"] = init_model
    model.fit(Xt, rows.y, **fit_params)
    pipe.ckpred_target_ = target
    return pipe


def _early_stopping(pipe: Pipeline, val: FitRows | None, rounds: int) -> dict[str, Any]:
    """The fit parameters of early stopping after ``rounds`` rounds without gain on ``val``
    (through ``pipe``'s fitted feature step and its target transform)."""
    if val is None or len(val.X) == 0:
        raise ValueError("early stopping needs validation rows (model.early_stopping_rounds > 0)")
    model = pipe.named_steps["model"]
    Xv = pipe.named_steps["features"].transform(val.X) if val.Xt is None else val.Xt
    yv = np.asarray(val.y, dtype=np.float64)
    if isinstance(model, TransformedTargetRegressor):
        # TTR transforms y but passes eval_set through untouched: transform it here.
        yv = model.transformer.fit(yv.reshape(-1, 1)).transform(yv.reshape(-1, 1)).ravel()
    params: dict[str, Any] = {}
    if _HAS_EVAL_XY:
        params.update(eval_X=(Xv,), eval_y=(yv,))
    else:  # LightGBM < 4.7
        params["eval_set"] = [(Xv, yv)]
    if isinstance(model, lgb.LGBMRanker):
        params["eval_group"] = [query_sizes(val.codes)]
        params["eval_at"] = [1]
    params["callbacks"] = [lgb.early_stopping(rounds, first_metric_only=True, verbose=False)]
    return params


#: LightGBM 4.7 replaced ``eval_set`` by ``eval_X``/``eval_y``; older releases only know the former.
_HAS_EVAL_XY = "eval_X" in inspect.signature(lgb.LGBMRegressor.fit).parameters


def booster(pipe: Pipeline) -> lgb.Booster:
    """The fitted LightGBM booster inside a pipeline from :func:`build_pipeline`."""
    model = pipe.named_steps["model"]
    inner = model.regressor_ if isinstance(model, TransformedTargetRegressor) else model
    return inner.booster_


# ---------------------------------------------------------------------------------------------
# Learned validity: kernels the training data saw fail
# ---------------------------------------------------------------------------------------------
def fit_failure_model(pipe: Pipeline, X: pd.DataFrame | None, failed: np.ndarray, validity_cfg: ValidityModelConfig,
                      seed: int = 0, Xt: npt.ArrayLike | None = None) -> lgb.LGBMRegressor | None:
    """Learn which rule-valid kernels fail, and attach the model to ``pipe`` (fitted).

    A small LightGBM model on the pipeline's own features estimates the probability that a
    row fails (an L2 fit of the 0/1 label: a leaf's value is the failure share of its training
    rows, and the model exports like any regressor). A row is predicted to fail when the
    estimate exceeds ``validity_cfg.threshold``. The model is kept only when it flags at least
    one training row: failures that are random (no feature separates them) leave nothing to
    learn, and the pipeline then carries no failure model.

    Sets ``pipe.ckpred_failure_model_`` (the regressor or None) and
    ``pipe.ckpred_failure_threshold_``; returns the model.

    Parameters
    ----------
    X : DataFrame or None
        Raw model input of rule-valid training rows (``op.encode_frame``); None with ``Xt``.
    failed : ndarray of bool
        Whether each row failed when measured.
    validity_cfg : ValidityModelConfig
        ``threshold``, ``n_estimators``, ``num_leaves``, ``min_child_samples`` (and ``n_jobs``).
    Xt : array-like, optional
        The rows' features when already computed (the ranking model's training features).
    """
    failed = np.asarray(failed, dtype=bool)
    set_failure_model(pipe, None, float(validity_cfg.threshold))
    if not failed.any() or failed.all():
        return None
    if Xt is None:
        Xt = pipe.named_steps["features"].transform(X)
    model = failure_estimator(validity_cfg, seed)
    model.fit(Xt, failed.astype(np.float64))
    if not np.any(model.predict(Xt) > pipe.ckpred_failure_threshold_):
        return None
    set_failure_model(pipe, model, float(validity_cfg.threshold))
    return model


def set_failure_model(pipe: Pipeline, model: lgb.LGBMRegressor | None, threshold: float) -> None:
    """Attach a fitted failure model (or None: none kept) and its threshold (``validity.threshold``)
    to ``pipe``, where :func:`predicted_ok`, the export and the runtimes read them."""
    pipe.ckpred_failure_threshold_ = float(threshold)
    pipe.ckpred_failure_model_ = model


def failure_estimator(validity_cfg: ValidityModelConfig | ApplicabilityConfig, seed: int = 0) -> lgb.LGBMRegressor:
    """The unfitted failure model of :func:`fit_failure_model` (its parameters are also what a
    partitioned dataset's Dask fit uses, :mod:`ckpred.scale`)."""
    return lgb.LGBMRegressor(objective="regression", n_estimators=int(validity_cfg.n_estimators),
                             learning_rate=0.1, num_leaves=int(validity_cfg.num_leaves),
                             min_child_samples=int(validity_cfg.min_child_samples),
                             n_jobs=int(validity_cfg.n_jobs), random_state=int(seed),
                             deterministic=True, force_row_wise=True, verbose=-1)


def failure_model(pipe: Pipeline) -> lgb.LGBMRegressor | None:
    """The learned failure model of a fitted pipeline (None: none learned, or an older pipeline)."""
    return getattr(pipe, "ckpred_failure_model_", None)


def predicted_ok(pipe: Pipeline, X: pd.DataFrame) -> np.ndarray:
    """bool per row of raw input ``X``: not predicted to fail (all True without a failure model)."""
    model = failure_model(pipe)
    if model is None:
        return np.ones(len(X), dtype=bool)
    Xt = pipe.named_steps["features"].transform(X)
    return np.asarray(model.predict(Xt), dtype=np.float64) <= float(pipe.ckpred_failure_threshold_)


# ---------------------------------------------------------------------------------------------
# Learned applicability: kernels a sparse table does not list for a problem
# ---------------------------------------------------------------------------------------------
def fit_applicability_model(Xt: npt.ArrayLike, absent: np.ndarray, cfg: ApplicabilityConfig, seed: int = 0) -> lgb.LGBMRegressor:
    """Learn which catalogue kernels a problem's rows would not hold (not applicable to it).

    The same small LightGBM model as :func:`fit_failure_model` (an L2 fit of the 0/1 label, so a
    leaf's value is the absent share of its training rows), on the ranking pipeline's features
    of every rule-valid (problem, catalogue kernel) pair of the training problems, measured or
    not (:func:`ckpred.fitting.with_unmeasured`). A pair is predicted not applicable when its
    estimate exceeds a threshold chosen on inner folds (:func:`ckpred.fitting.fit_applicability`).

    Parameters
    ----------
    Xt : array-like
        Features of the training pairs.
    absent : ndarray of bool
        Whether the table holds no row of each pair.
    cfg : ApplicabilityConfig
        ``n_estimators``, ``num_leaves``, ``min_child_samples``, ``n_jobs``.

    Training pairs all measured (or all absent) give a model whose every estimate is 0 (or 1):
    a fold of a table may hold only problems that list every candidate, though the run refuses a
    table that does so throughout (:func:`ckpred.fitting.coverage_note`).
    """
    absent = np.asarray(absent, dtype=bool)
    model = failure_estimator(cfg, seed)
    model.fit(Xt, absent.astype(np.float64))
    return model


def set_applicability_model(pipe: Pipeline, model: lgb.LGBMRegressor | None, threshold: float) -> None:
    """Attach a fitted applicability model (or None) and its threshold to ``pipe``, where
    :func:`predicted_applicable`, the export and the runtimes read them."""
    pipe.ckpred_applicability_threshold_ = float(threshold)
    pipe.ckpred_applicability_model_ = model


def applicability_model(pipe: Pipeline) -> lgb.LGBMRegressor | None:
    """The learned applicability model of a fitted pipeline (None: none learned)."""
    return getattr(pipe, "ckpred_applicability_model_", None)


def absent_estimate(pipe: Pipeline, X: pd.DataFrame, model: lgb.LGBMRegressor | None = None,
                    batch: int = 200_000) -> np.ndarray:
    """The applicability model's estimate that each row of raw input ``X`` is absent (0 without one).

    ``model`` replaces the pipeline's own (inner folds try one before it is attached). Batches
    of ``batch`` rows bound the feature matrix held in memory at once.
    """
    model = applicability_model(pipe) if model is None else model
    if model is None:
        return np.zeros(len(X))
    features = pipe.named_steps["features"]
    return np.concatenate([np.asarray(model.predict(features.transform(X.iloc[i:i + batch])), dtype=np.float64)
                           for i in range(0, len(X), batch)] or [np.zeros(0)])


#: The least predicted throughput and applicability :func:`expected_throughput` multiplies: a
#: prediction at or below 0 (a raw target can give one) or a kernel surely absent still ranks,
#: below every candidate with both positive, instead of turning the product's sign or into 0.
FLOOR = 1e-12


def expected_throughput(predicted: np.ndarray, absent: np.ndarray) -> np.ndarray:
    """The learner's expected throughput of a pick: ``max(predicted, FLOOR) * clip(1 - absent, FLOOR, 1)``.

    Parameters
    ----------
    predicted : ndarray of float
        The learner's predicted throughput (its target's inverse: proportional to throughput
        within a problem for every target ckpred has).
    absent : ndarray of float
        The applicability model's estimate that the kernel is absent for the problem
        (:func:`absent_estimate`; an L2 fit of 0/1, so it may leave [0, 1]).
    """
    return np.maximum(predicted, FLOOR) * np.clip(1.0 - np.asarray(absent, dtype=np.float64), FLOOR, 1.0)


def predicted_applicable(pipe: Pipeline, X: pd.DataFrame) -> np.ndarray:
    """bool per row of raw input ``X``: predicted to apply (all True without an applicability model)."""
    if applicability_model(pipe) is None:
        return np.ones(len(X), dtype=bool)
    return absent_estimate(pipe, X) <= float(pipe.ckpred_applicability_threshold_)
