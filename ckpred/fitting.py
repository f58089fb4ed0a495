"""Fitting engine: a canonical table prepared once, training rows, and one recipe fitted on shapes.

Used alike by cross-validation (:mod:`ckpred.cv`) and by export (:func:`fit_final`), so the
pipeline ``export`` fits is the one ``train`` would have saved for the same config.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from sklearn.model_selection import GroupShuffleSplit

from ckpred import evaluate as ev
from ckpred.kernels.base import OpDefinition
from ckpred.models import (booster, build_pipeline, fit_failure_model, fit_pipeline, target_name,
                           training_target)

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """A canonical table with everything training and evaluation need, row-aligned."""

    table: pd.DataFrame
    X: pd.DataFrame
    perf: np.ndarray
    selectable: np.ndarray
    groups: ev.ShapeGroups
    #: Per shape (index = shape index): problem fields, family, best pipeline.
    shapes: pd.DataFrame = field(repr=False)
    #: Per shape: code of its CV group (the op's ``cv_group`` key; shapes of one group share a fold).
    cv_groups: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)
    #: The arch config of the table (its validity rules' and features' hardware constants); on
    #: a table of several GPUs, the run's arch (the one its fitted pipelines' features are built for).
    arch: Any = field(default=None, repr=False)
    #: A table of several GPUs: the arch configs of its rows, each row's index into them
    #: (``row_arch``) and each shape's (``shape_arch``); empty for a table of one arch.
    archs: tuple[Any, ...] = field(default=(), repr=False)
    row_arch: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)
    shape_arch: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)

    @property
    def multi_arch(self) -> bool:
        """Whether the rows are of several GPUs (each featurised with its own arch's constants)."""
        return len(self.archs) > 1

    def arch_groups(self, rows: np.ndarray) -> list[tuple[Any, np.ndarray]]:
        """``(arch config, rows of that arch)`` covering ``rows``, in order of the archs."""
        rows = np.asarray(rows, dtype=np.int64)
        if not self.multi_arch:
            return [(self.arch, rows)]
        codes = self.row_arch[rows]
        return [(arch, rows[codes == i]) for i, arch in enumerate(self.archs) if np.any(codes == i)]

    def arch_names(self, shapes: np.ndarray | None = None) -> list[str]:
        """Names of the archs of ``shapes`` (default every shape), in order of the archs."""
        if not self.multi_arch:
            return [str(self.arch.name)] if self.arch is not None else []
        codes = self.shape_arch if shapes is None else self.shape_arch[np.asarray(shapes, dtype=np.int64)]
        return [str(a.name) for i, a in enumerate(self.archs) if np.any(codes == i)]


def prepare(table: pd.DataFrame, op: OpDefinition, cfg: Any, arch: Any = None, own_archs: bool = True) -> Prepared:
    """Encode the model input, measured perf, validity mask and shape groups of ``table``.

    Shapes are the op's queries (``shape_keys``: the ranking group and unit of efficiency);
    ``cv_groups`` codes each shape's CV group. ``arch`` is the table's own arch config
    (default ``cfg.arch``).

    A table whose ``arch`` column names several GPUs (a reader that gives each row its GPU's
    arch, e.g. Kernel Tuner caches of several GPUs) keeps each row's own: a row of ``arch``'s
    name uses ``arch``, another the arch config of its name (:func:`ckpred.schema.arch_config`),
    for its validity rules here and its hardware features wherever it is featurised; a shape
    key then also names the arch when the op's query key does not tell the GPUs apart. With
    ``own_archs=False`` every row uses ``arch``.
    """
    arch = cfg.arch if arch is None else arch
    if len(table) == 0:
        raise ValueError("the training table is empty: no rows for this op/arch/dtype/layout")
    table = table.reset_index(drop=True)
    X = op.encode_frame(table)
    perf = ev.measured_perf(table["tflops"].to_numpy(), table["is_valid"].to_numpy())
    archs, row_arch = row_archs(table, arch) if own_archs else ((), np.zeros(0, dtype=np.int64))
    if len(archs) > 1:
        selectable = np.zeros(len(table), dtype=bool)
        for i, one in enumerate(archs):
            rows = np.flatnonzero(row_arch == i)
            selectable[rows] = rule_mask(table.iloc[rows], op, cfg, one)
    else:
        archs, row_arch = (), np.zeros(0, dtype=np.int64)
        selectable = rule_mask(table, op, cfg, arch)
    keys = op.shape_keys(table)
    if len(archs) > 1 and pd.Series(row_arch).groupby(np.asarray(keys)).nunique().max() > 1:
        # one problem measured on several GPUs is one selection per GPU
        keys = pd.Series(np.asarray(keys, dtype=object) + "@" + table["arch"].astype(str).to_numpy(dtype=object))
    groups = ev.ShapeGroups.from_keys(keys)
    first = groups.first_rows()
    shapes = table.loc[first, list(op.problem_names)].reset_index(drop=True)
    shapes.insert(0, "shape", groups.keys)
    if len(archs) > 1:
        shapes["arch"] = table["arch"].astype(str).to_numpy()[first]
    shapes["family"] = op.family(shapes)
    best_row = np.full(groups.n_shapes, -1)
    for s in range(groups.n_shapes):
        rows = groups.rows(s)
        if perf[rows].max() > 0:
            best_row[s] = rows[int(np.argmax(perf[rows]))]
    ok = best_row >= 0
    shapes["best_tflops"] = np.where(ok, perf[np.maximum(best_row, 0)], 0.0)
    shapes["best_kernel"] = np.where(ok, table["kernel_name"].to_numpy()[np.maximum(best_row, 0)], "")
    if "pipeline" in table.columns:
        shapes["best_pipeline"] = np.where(ok, table["pipeline"].to_numpy()[np.maximum(best_row, 0)], "")
    cv_groups = pd.factorize(np.asarray(op.cv_group_keys(shapes)))[0].astype(np.int64)
    return Prepared(table=table, X=X, perf=perf, selectable=selectable,
                    groups=groups, shapes=shapes, cv_groups=cv_groups, arch=arch, archs=archs, row_arch=row_arch,
                    shape_arch=row_arch[first] if len(archs) > 1 else np.zeros(0, dtype=np.int64))


def row_archs(table: pd.DataFrame, arch: Any) -> tuple[tuple[Any, ...], np.ndarray]:
    """The arch configs named by ``table``'s ``arch`` column and each row's index into them:
    ``arch`` itself for rows of its name, else the arch config of the row's name. A table
    without the column, or of one arch name, is ``arch``'s alone.

    Raises
    ------
    ckpred.errors.ConfigValueError
        When a row names an arch no config dir has (key ``arch``, the name and the configs there are).
    """
    if "arch" not in table.columns:
        return (arch,), np.zeros(len(table), dtype=np.int64)
    codes, names = pd.factorize(table["arch"].astype(str), sort=False)
    if len(names) == 1:
        return (arch,), np.zeros(len(table), dtype=np.int64)
    from ckpred.schema import arch_config

    own = str(getattr(arch, "name", arch))
    return tuple(arch if name == own else arch_config(str(name)) for name in names), codes.astype(np.int64)


def rule_mask(table: pd.DataFrame, op: OpDefinition, cfg: Any, arch: Any) -> np.ndarray:
    """The op's validity rules per row of ``table`` with ``arch``'s constants (True = may run)."""
    problems = table[list(op.problem_names)]
    kernels = table[list(op.kernel_names)]
    selectable, _ = op.validity(problems, kernels, arch=arch, dtype=cfg.dtype, layout=cfg.layout)
    return np.asarray(selectable, dtype=bool)



def cv_group_names(op: OpDefinition) -> tuple[str, ...]:
    """The problem fields a CV fold holds out together (the op's CV group, else its group key)."""
    return tuple(getattr(op, "cv_group_key", None) or op.group_key)

def validation_split(shapes: np.ndarray, fraction: float, seed: int,
                     groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Split training shape indices into (fit, validation) for early stopping; ``groups`` (the
    CV group of each of ``shapes``, default the shapes themselves) are kept on one side.

    With fewer than two groups there is nothing to hold out: every shape is fitted, the
    validation set is empty and the fit runs its full tree count (logged).
    """
    if len(np.unique(shapes if groups is None else groups)) < 2:
        # one training shape is one CV group too (a 2-fold CV over two groups)
        log.warning("early stopping skipped: the %d training shape(s) form one CV group", len(shapes))
        return np.sort(shapes), np.zeros(0, dtype=np.asarray(shapes).dtype)
    splitter = GroupShuffleSplit(n_splits=1, test_size=fraction, random_state=seed)
    fit_pos, val_pos = next(splitter.split(shapes, groups=shapes if groups is None else groups))
    return np.sort(shapes[fit_pos]), np.sort(shapes[val_pos])


def training_rows(data: Prepared, shapes: np.ndarray, rows_cfg: Any, *, max_rows: int,
                  rng: np.random.Generator) -> np.ndarray:
    """Row indices a model trains on, contiguous per shape (in ``shapes`` order).

    Shapes without any valid kernel carry no ranking signal and are skipped. With
    ``rows.drop_rule_invalid`` rows the validity rules reject are dropped (the selector masks
    them). With a row cap, the ``keep_top`` fastest rows of a shape are kept and the rest is a
    seeded uniform sample; evaluation never sees this subsampling.
    """
    cap = int(rows_cfg.max_per_shape) or max_rows
    cap = min(cap, max_rows)
    out = []
    for s in shapes:
        rows = data.groups.rows(int(s))
        if data.perf[rows].max() <= 0:
            continue
        if rows_cfg.drop_rule_invalid:
            rows = rows[data.selectable[rows]]
        if len(rows) > cap:
            top = min(int(rows_cfg.keep_top), cap)
            by_perf = np.argsort(-data.perf[rows], kind="stable")
            keep = by_perf[:top]
            rest = by_perf[top:]
            keep = np.concatenate([keep, rng.choice(rest, size=cap - top, replace=False)])
            rows = rows[np.sort(keep)]
        out.append(rows)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


@dataclass
class LearnedMethod:
    """A pipeline recipe: what ``model``, ``plain`` and ``reference`` share."""

    name: str
    recipe: DictConfig  # features, model, target, seed, layout
    rows: Any
    #: Warm start (:mod:`ckpred.warm_start`): booster every fit of this method continues from.
    init_model: Any = None
    #: The learned validity mask's config (``validity``); None = no failure model.
    validity: Any = None
    #: The transfer recipe's config (``transfer``): the method is fitted by
    #: :func:`ckpred.transfer.fit_transfer` (its learner blended with the static order).
    transfer: Any = None


def recipe_config(cfg: Any, features: Any, model: Any, target: Any) -> DictConfig:
    """The recipe of one learned method: its features, model and target with the run's seed and layout."""
    return OmegaConf.create({"features": OmegaConf.to_container(features, resolve=True),
                             "model": OmegaConf.to_container(model, resolve=True),
                             "target": OmegaConf.to_container(target, resolve=True),
                             "seed": int(cfg.seed), "layout": OmegaConf.to_container(cfg.layout, resolve=True)})


def model_method(cfg: Any) -> LearnedMethod:
    """The config's model recipe as a method (with the learned validity mask when configured)."""
    return LearnedMethod("model", recipe_config(cfg, cfg.features, cfg.model, cfg.target), cfg.rows,
                         validity=cfg.get("validity"))


def plain_method(cfg: Any) -> LearnedMethod:
    """Plain LightGBM (``baselines.plain``) on the model's features and training rows."""
    plain = cfg.baselines.plain
    return LearnedMethod("plain", recipe_config(cfg, cfg.features, plain.model, plain.target), cfg.rows)


def fit_method(method: LearnedMethod, data: Prepared, shapes: np.ndarray, op: OpDefinition, cfg: Any,
               seed: int, build: Callable[..., Any] = build_pipeline) -> tuple[Any, dict[str, Any]]:
    """Fit ``method`` on the training ``shapes`` of ``data``; returns (pipeline, fit info).

    ``build(recipe, op, arch, dtype)`` makes the unfitted pipeline (default
    :func:`ckpred.models.build_pipeline`); a study that compares objectives on one feature set
    passes a builder whose feature step is the identity and ``data.X`` already featurised.
    A method with ``transfer`` set is the transfer recipe: the fitted model is a
    :class:`ckpred.transfer.TransferModel`.
    """
    if method.transfer is not None:
        from ckpred.transfer import fit_transfer  # same stage; it builds on this function

        return fit_transfer(method, data, shapes, op, cfg, seed)
    recipe = method.recipe
    rng = np.random.default_rng(seed)
    max_rows = int(recipe.model.max_rows_per_query) if recipe.model.name == "lgbm_ranker" else 2 ** 62
    info: dict[str, Any] = {}
    val_shapes = np.zeros(0, dtype=np.int64)
    fit_shapes = np.asarray(shapes)
    if int(recipe.model.early_stopping_rounds) > 0:
        fit_shapes, val_shapes = validation_split(fit_shapes, float(recipe.model.validation_fraction), seed,
                                                  groups=data.cv_groups[fit_shapes]
                                                  if len(data.cv_groups) == data.groups.n_shapes else None)
    rows = training_rows(data, fit_shapes, method.rows, max_rows=max_rows, rng=rng)
    codes = data.groups.codes[rows]
    y = training_target(data.perf[rows], codes, recipe.model, recipe.target)
    val_kwargs: dict[str, Any] = {}
    if len(val_shapes):
        vrows = training_rows(data, val_shapes, method.rows, max_rows=max_rows, rng=rng)
        vcodes = data.groups.codes[vrows]
        val_kwargs = dict(X_val=data.X.iloc[vrows], val_codes=vcodes,
                          y_val=training_target(data.perf[vrows], vcodes, recipe.model, recipe.target))
    pipe = build(recipe, op, data.arch if data.arch is not None else cfg.arch, cfg.dtype)
    if data.multi_arch:  # each GPU's rows with its own arch's constants
        val_kwargs["Xt"] = arch_features(data, rows, recipe, op, cfg, build)
        if len(val_shapes):
            val_kwargs["Xt_val"] = arch_features(data, vrows, recipe, op, cfg, build)
        info["archs"] = data.arch_names(fit_shapes)
    learn_failures = method.validity is not None and bool(method.validity.learned)
    features_out: dict[str, Any] = {}
    model_cfg = recipe.model
    if int(model_cfg.early_stopping_rounds) > 0 and "X_val" not in val_kwargs:
        # no validation group to stop on (validation_split said why): the full tree count
        model_cfg = OmegaConf.merge(model_cfg, {"early_stopping_rounds": 0})
    fit_pipeline(pipe, data.X.iloc[rows], y, codes, model_cfg=model_cfg,
                 target=target_name(recipe.model, recipe.target), **val_kwargs, init_model=method.init_model,
                 features_out=features_out if learn_failures else None)
    if learn_failures:
        # the failure model learns on the ranking model's own training rows and features
        failed = data.perf[rows] <= 0
        model = fit_failure_model(pipe, None, failed, method.validity, seed, Xt=features_out["Xt"])
        info.update(failure_model=model is not None, failed_rows=int(failed.sum()))
    info.update(train_rows=int(len(rows)), train_shapes=[str(k) for k in data.groups.keys[fit_shapes]],
                validation_shapes=[str(k) for k in data.groups.keys[val_shapes]],
                trees=int(booster(pipe).current_iteration()))
    best_iter = getattr(pipe.named_steps["model"], "best_iteration_", None)
    if best_iter is None and hasattr(pipe.named_steps["model"], "regressor_"):
        best_iter = getattr(pipe.named_steps["model"].regressor_, "best_iteration_", None)
    if best_iter:
        info["best_iteration"] = int(best_iter)
    return pipe, info


def arch_features(data: Prepared, rows: np.ndarray, recipe: Any, op: OpDefinition, cfg: Any,
                  build: Callable[..., Any] = build_pipeline) -> np.ndarray:
    """The features of ``rows`` of a table of several GPUs, each row's with its own arch's
    constants (one feature step per arch, built as ``build`` builds the pipeline's), in ``rows`` order."""
    rows = np.asarray(rows, dtype=np.int64)
    out: np.ndarray | None = None
    for arch, sub in data.arch_groups(rows):
        features = build(recipe, op, arch, cfg.dtype).named_steps["features"]
        part = np.asarray(features.fit(data.X.head(8)).transform(data.X.iloc[sub]), dtype=np.float64)
        if out is None:
            out = np.empty((len(rows), part.shape[1]), dtype=np.float64)
        out[np.isin(rows, sub)] = part
    return out if out is not None else np.zeros((0, 0))


def for_arch(pipe: Any, method: LearnedMethod, op: OpDefinition, cfg: Any, arch: Any, X: pd.DataFrame) -> Any:
    """``pipe`` scoring a table of another arch: the same fitted model behind features built with
    ``arch``'s hardware constants (feature groups learn no statistics, so refitting them on
    ``X`` only records the input columns)."""
    from sklearn.pipeline import Pipeline

    features = build_pipeline(method.recipe, op, arch, cfg.dtype).named_steps["features"]
    features.fit(X.head(8))
    out = Pipeline([("features", features), ("model", pipe.named_steps["model"])])
    for attr in ("ckpred_target_", "ckpred_failure_model_", "ckpred_failure_threshold_"):
        if hasattr(pipe, attr):
            setattr(out, attr, getattr(pipe, attr))
    return out


def rows_of(groups: ev.ShapeGroups, shapes: np.ndarray) -> np.ndarray:
    return np.concatenate([groups.rows(int(s)) for s in shapes]) if len(shapes) else np.zeros(0, dtype=np.int64)


def predict(pipe: Any, X: pd.DataFrame, batch: int = 200_000) -> np.ndarray:
    # Batches bound the feature matrix held in memory at once.
    return np.concatenate([np.asarray(pipe.predict(X.iloc[i:i + batch]), dtype=np.float64)
                           for i in range(0, len(X), batch)])


def fit_final(cfg: Any, table: pd.DataFrame, op: OpDefinition) -> Any:
    """Fit the config's model recipe on every shape of ``table``, exactly as ``train`` fits its final model."""
    data = prepare(table, op, cfg)
    method = model_method(cfg)
    pipe, _ = fit_method(method, data, np.arange(data.groups.n_shapes), op, cfg, int(cfg.seed))
    return pipe
