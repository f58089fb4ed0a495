"""Fitting engine: a canonical table prepared once, training rows, and one recipe fitted on shapes.

Used alike by cross-validation (:mod:`ckpred.cv`) and by export (:func:`fit_final`), so the
pipeline ``export`` fits is the one ``train`` would have saved for the same config.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import lightgbm as lgb
import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold, GroupShuffleSplit
from sklearn.pipeline import Pipeline

from ckpred import evaluate as ev
from ckpred.errors import ConfigValueError
from ckpred.kernels.base import OpDefinition
from ckpred.kernels.lists import validity_on
from ckpred.models import (FitRows, Recipe, absent_estimate, booster, build_pipeline, expected_throughput,
                           fit_applicability_model, fit_failure_model, fit_pipeline, predicted_ok,
                           set_applicability_model, target_name, training_target)
from ckpred.schema import (ApplicabilityConfig, ArchConfig, FeaturesConfig, HardwareView, ModelConfig, RecipeConfig,
                           RowsConfig, TargetConfig, TrainConfig, TransferConfig, ValidityModelConfig, arch_config,
                           arch_constants)

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
    arch: ArchConfig | None = field(default=None, repr=False)
    #: A table of several GPUs: the arch configs of its rows, each row's index into them
    #: (``row_arch``) and each shape's (``shape_arch``); empty for a table of one arch.
    archs: tuple[ArchConfig, ...] = field(default=(), repr=False)
    row_arch: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)
    shape_arch: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)

    @property
    def multi_arch(self) -> bool:
        """Whether the rows are of several GPUs (each featurised with its own arch's constants)."""
        return len(self.archs) > 1

    def arch_groups(self, rows: np.ndarray) -> list[tuple[ArchConfig | None, np.ndarray]]:
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

    @property
    def measured(self) -> np.ndarray:
        """bool per row: False for the candidate rows :func:`with_unmeasured` added (no measurement)."""
        if "measured" in self.table:
            return self.table["measured"].to_numpy(dtype=bool)
        return np.ones(len(self.table), dtype=bool)


def prepare(table: pd.DataFrame, op: OpDefinition, cfg: HardwareView, arch: ArchConfig | None = None,
            own_archs: bool = True) -> Prepared:
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


def row_archs(table: pd.DataFrame, arch: ArchConfig) -> tuple[tuple[ArchConfig, ...], np.ndarray]:
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
    own = str(getattr(arch, "name", arch))
    return tuple(arch if name == own else arch_config(str(name)) for name in names), codes.astype(np.int64)


def rule_mask(table: pd.DataFrame, op: OpDefinition, cfg: HardwareView, arch: ArchConfig) -> np.ndarray:
    """The op's validity rules per row of ``table`` with ``arch``'s constants, narrowed by ``arch``'s
    kernel list (True = may run; :func:`ckpred.kernels.lists.validity_on`)."""
    problems = table[list(op.problem_names)]
    kernels = table[list(op.kernel_names)]
    selectable, _ = validity_on(op, problems, kernels, arch=arch, dtype=cfg.dtype, layout=cfg.layout)
    return np.asarray(selectable, dtype=bool)



#: ``invalid_reason`` of a candidate row :func:`with_unmeasured` adds (the table holds no row of it).
NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Coverage:
    """Which (problem, rule-valid catalogue kernel) pairs a table measures.

    Attributes
    ----------
    problems : int
        Problems (queries) of the table.
    pairs : int
        Rule-valid (problem, catalogue kernel) pairs: the candidates the exported selector ranks.
    unmeasured : int
        Those the table holds no row for.
    one_kernel : int
        Problems with a single row.
    example : str
        The key of one problem with a single row ("" when none).
    """

    problems: int
    pairs: int
    unmeasured: int
    one_kernel: int
    example: str = ""


def with_unmeasured(table: pd.DataFrame, op: OpDefinition, cfg: HardwareView, arch: ArchConfig | None = None,
                    shape_codes: np.ndarray | None = None) -> tuple[pd.DataFrame, Coverage]:
    """``table`` plus a row for every rule-valid catalogue kernel a problem has no row for.

    The exported selector ranks every kernel of the op's catalogue that passes the rules; a
    table that does not measure every one of them on every problem is scored on that same
    candidate set (:mod:`ckpred.evaluate`, "Unmeasured candidates"). An added row copies the
    problem's columns from the problem's first row, the kernel's fields and name from the
    catalogue, and reads ``tflops=0``, ``is_valid=False``, ``invalid_reason=`` :data:`NOT_MEASURED`.

    Parameters
    ----------
    table : DataFrame
        A canonical table (rows grouped by problem).
    op, cfg
        The op (its catalogue, rules and keys) and the config (``dtype``, ``layout``, ``arch``).
    arch : config node, optional
        The table's own arch (its rules' hardware constants); default ``cfg.arch``.
    shape_codes : ndarray of int, optional
        The problem of each row as codes in first-appearance order (a :class:`Prepared`'s
        ``groups.codes``), when already known; the output then has columns ``_shape`` (them, for
        its rows) and ``_row`` (a measured row's index in ``table``, -1 for an added one).

    Returns
    -------
    table : DataFrame
        Every row of ``table`` (``measured=True``) and the added ones (``measured=False``), each
        problem's rows together, problems in their first-appearance order and kernels in
        catalogue-id order inside a problem (the exported selector's tie order; rows of kernels
        outside the catalogue last, in table order). Text columns are pandas categoricals.
    coverage : Coverage
    """
    arch = cfg.arch if arch is None else arch
    table = table.reset_index(drop=True)
    catalogue = op.catalogue(arch, cfg.dtype, cfg.layout)
    if shape_codes is None:
        codes, uniques = pd.factorize(np.asarray(op.shape_keys(table)))
    else:
        codes = np.asarray(shape_codes, dtype=np.int64)
        uniques = np.arange(int(codes.max()) + 1 if len(codes) else 0)
    n_shapes = len(uniques)
    rules = partial(validity_on, op, arch=arch, dtype=cfg.dtype, layout=cfg.layout)
    pairs = _unlisted_pairs(table, catalogue, codes, n_shapes)
    pairs = pairs.only(_rule_valid(pairs, table, catalogue, op, rules))
    n_added = len(pairs.shape_of)
    order = pairs.order()
    columns = _merged_columns(table, catalogue, op, pairs, order)
    if shape_codes is not None:
        columns["_shape"] = np.concatenate([codes, pairs.shape_of])[order]
        columns["_row"] = np.where(order < len(table), order, -1)
    out = pd.DataFrame(columns, copy=False)
    rows_per_shape = np.bincount(codes, minlength=n_shapes)
    one = np.flatnonzero(rows_per_shape == 1)
    measured_valid, _ = rules(table, table)
    coverage = Coverage(problems=n_shapes,
                        pairs=int(np.sum(np.asarray(measured_valid, dtype=bool) & pairs.known)) + n_added,
                        unmeasured=n_added, one_kernel=len(one), example=str(uniques[one[0]]) if len(one) else "")
    return out, coverage


@dataclass(frozen=True)
class _Pairs:
    """The (problem, catalogue kernel) pairs of a table in :func:`with_unmeasured`: its rows' and
    those it adds."""

    #: The problem code of each row, and each problem's first row.
    codes: np.ndarray
    first: np.ndarray
    #: The catalogue id of each row's kernel (NaN outside the catalogue), and whether it has one.
    kid: np.ndarray
    known: np.ndarray
    #: The problem code and catalogue index of each added pair.
    shape_of: np.ndarray
    kernel_of: np.ndarray

    def only(self, keep: np.ndarray) -> _Pairs:
        """These pairs with only the ``keep`` ones of the added."""
        return replace(self, shape_of=self.shape_of[keep], kernel_of=self.kernel_of[keep])

    def order(self) -> np.ndarray:
        """The output order of the rows then the added pairs: problems in first-appearance order,
        kernels in catalogue order inside each (outside the catalogue last, in table order)."""
        shape_rank = np.concatenate([self.codes, self.shape_of])
        kernel_rank = np.concatenate([np.where(self.known, self.kid, np.inf), self.kernel_of.astype(np.float64)])
        return np.lexsort((np.arange(len(shape_rank)), kernel_rank, shape_rank))


def _unlisted_pairs(table: pd.DataFrame, catalogue: pd.DataFrame, codes: np.ndarray, n_shapes: int) -> _Pairs:
    """Every (problem, catalogue kernel) pair ``table`` has no row of, as added pairs."""
    n_kernels = len(catalogue)
    ids = pd.Series(catalogue["kernel_id"].to_numpy(np.int64), index=catalogue["kernel_name"].to_numpy())
    kid = ids.reindex(table["kernel_name"].to_numpy()).to_numpy()
    known = ~np.isnan(kid)
    present = np.zeros(n_shapes * n_kernels, dtype=bool)
    present[codes[known] * n_kernels + kid[known].astype(np.int64)] = True
    missing = np.flatnonzero(~present)
    del present
    first = np.full(n_shapes, len(table), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(table)))
    return _Pairs(codes=codes, first=first, kid=kid, known=known, shape_of=missing // n_kernels,
                  kernel_of=missing % n_kernels)


def _rule_valid(pairs: _Pairs, table: pd.DataFrame, catalogue: pd.DataFrame, op: OpDefinition,
                rules: Callable[..., Any]) -> np.ndarray:
    """bool per added pair: the op's ``rules`` (its validity with the arch, dtype and layout bound)
    let it run; a million pairs at a time (a table of 100k problems misses millions)."""
    valid = np.zeros(len(pairs.shape_of), dtype=bool)
    for start in range(0, len(valid), 1_000_000):
        part = slice(start, start + 1_000_000)
        problems = pd.DataFrame({c: table[c].to_numpy()[pairs.first[pairs.shape_of[part]]] for c in op.problem_names})
        kernels = pd.DataFrame({c: catalogue[c].to_numpy()[pairs.kernel_of[part]] for c in op.kernel_names})
        valid[part] = np.asarray(rules(problems, kernels)[0], dtype=bool)
    return valid


def _merged_columns(table: pd.DataFrame, catalogue: pd.DataFrame, op: OpDefinition, pairs: _Pairs,
                    order: np.ndarray) -> dict[str, Any]:
    """The columns of :func:`with_unmeasured`'s output (and ``measured``): ``table``'s rows and the
    added pairs' (kernel fields from the catalogue, problem fields from the problem's first row,
    the measurement columns filled as not measured), in ``order``."""
    n_added = len(pairs.shape_of)
    kernel_cols = set(op.kernel_names) | {"kernel_name"}
    fill = {"tflops": 0.0, "latency_ms": np.nan, "bandwidth_gbs": np.nan, "is_valid": False,
            "invalid_reason": NOT_MEASURED, "repeats": 0, "spread": np.nan, "source": ""}
    columns: dict[str, Any] = {}
    for c in table.columns:  # a column at a time: a table of millions of added rows stays one copy
        own = table[c].to_numpy()
        if c in kernel_cols:
            extra = catalogue[c].to_numpy()[pairs.kernel_of]
        elif c in fill:
            extra = np.full(n_added, fill[c], dtype=object if isinstance(fill[c], str) else None)
        else:
            extra = own[pairs.first[pairs.shape_of]]
        values = np.concatenate([own, extra.astype(own.dtype, copy=False)])[order]
        # text as categories: a column of millions of repeated strings would be copied string by string
        columns[c] = pd.Categorical(values) if values.dtype == object else values
    columns["measured"] = np.concatenate([np.ones(len(table), dtype=bool), np.zeros(n_added, dtype=bool)])[order]
    return columns


def coverage_note(op: OpDefinition, coverage: Coverage) -> str | None:
    """What a run says about the table's coverage under the op's ``absence``; None when nothing.

    Raises
    ------
    ckpred.errors.ConfigValueError
        ``op.absence=not_applicable`` on a table that measures every rule-valid candidate of
        every problem (nothing is absent: there is no applicability to learn) or whose every
        problem has a single row (a table of winners, say: nothing to rank, and absence would
        teach the mask the winners).
    """
    absence = getattr(op, "absence", "unknown")
    share = coverage.unmeasured / max(coverage.pairs, 1)
    if absence == "not_applicable":
        if coverage.unmeasured == 0:
            raise ConfigValueError("op.absence", absence, f"'unknown' for this table: it measures every rule-valid "
                                   f"catalogue kernel on each of its {coverage.problems} problems, so nothing is "
                                   "absent and there is no applicability to learn")
        if coverage.one_kernel == coverage.problems:
            raise ConfigValueError("op.absence", absence, f"a table with more than one kernel per problem: each of its "
                                   f"{coverage.problems} problems has a single row (a table of winners?), so there "
                                   "is nothing to rank and the applicability mask would learn the winners")
        note = (f"op {op.name}: absence not_applicable: {coverage.unmeasured} of {coverage.pairs} rule-valid "
                f"(problem, kernel) pairs ({share:.1%}) have no row and are taken as not applicable; the selector "
                "learns an applicability mask")
        if coverage.one_kernel:
            note += (f". {coverage.one_kernel} of {coverage.problems} problems have a single row (e.g. "
                     f"{coverage.example}): their one kernel is the only one taken to apply, and they teach the "
                     "ranker nothing")
        return note
    if coverage.unmeasured:
        return (f"op {op.name}: {coverage.unmeasured} of {coverage.pairs} rule-valid (problem, kernel) pairs "
                f"({share:.1%}) have no row; the exported selector ranks them too, and cross-validation counts a pick "
                "among them as an unmeasured pick (efficiency 0). If a missing row means the kernel does not apply "
                "to the problem, declare op.absence: not_applicable")
    return None


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


def training_rows(data: Prepared, shapes: np.ndarray, rows_cfg: RowsConfig, *, max_rows: int,
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
    recipe: Recipe
    rows: RowsConfig
    #: Warm start (:mod:`ckpred.warm_start`): booster every fit of this method continues from.
    init_model: lgb.Booster | None = None
    #: The learned validity mask's config (``validity``); None = no failure model.
    validity: ValidityModelConfig | None = None
    #: The transfer recipe's config (``transfer``): the method is fitted by
    #: :func:`ckpred.transfer.fit_transfer` (its learner blended with the static order).
    transfer: TransferConfig | None = None


def learner_method(method: LearnedMethod) -> LearnedMethod:
    """The learner of a transfer recipe (``method`` without its ``transfer`` config: what
    :func:`ckpred.transfer.fit_transfer` fits); any other method itself."""
    return method if method.transfer is None else LearnedMethod(method.name, method.recipe, method.rows)


def recipe_config(cfg: RecipeConfig, features: FeaturesConfig, model: ModelConfig, target: TargetConfig) -> Recipe:
    """The recipe of one learned method: its features, model and target with the run's seed and layout."""
    return Recipe(features, model, target, int(cfg.seed), cfg.layout)


def model_method(cfg: RecipeConfig) -> LearnedMethod:
    """The config's model recipe as a method (with the learned validity mask when configured)."""
    return LearnedMethod("model", recipe_config(cfg, cfg.features, cfg.model, cfg.target), cfg.rows,
                         validity=cfg.validity)


def plain_method(cfg: TrainConfig) -> LearnedMethod:
    """Plain LightGBM (``baselines.plain``) on the model's features and training rows."""
    plain = cfg.baselines.plain
    return LearnedMethod("plain", recipe_config(cfg, cfg.features, plain.model, plain.target), cfg.rows)


def fit_method(method: LearnedMethod, data: Prepared, shapes: np.ndarray, op: OpDefinition, cfg: RecipeConfig,
               seed: int, build: Callable[..., Pipeline] = build_pipeline) -> tuple[Pipeline, dict[str, Any]]:
    """Fit ``method`` on the training ``shapes`` of ``data``; returns (pipeline, fit info).

    ``build(recipe, op, arch, dtype)`` makes the unfitted pipeline (default
    :func:`ckpred.models.build_pipeline`); a study that compares objectives on one feature set
    passes a builder whose feature step is the identity and ``data.X`` already featurised.
    A method with ``transfer`` set is the transfer recipe, which builds on this function:
    :func:`ckpred.transfer.fit_learned` fits either kind.
    """
    if method.transfer is not None:
        raise ValueError(f"method {method.name!r} is the transfer recipe: fit it with ckpred.transfer.fit_learned")
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
    train = _fit_rows(data, rows, recipe)
    val: FitRows | None = None
    if len(val_shapes):
        vrows = training_rows(data, val_shapes, method.rows, max_rows=max_rows, rng=rng)
        val = _fit_rows(data, vrows, recipe)
    pipe = build(recipe, op, data.arch if data.arch is not None else cfg.arch, cfg.dtype)
    if data.multi_arch:  # each GPU's rows with its own arch's constants
        train = replace(train, Xt=arch_features(data, rows, recipe, op, cfg, build))
        if val is not None:
            val = replace(val, Xt=arch_features(data, vrows, recipe, op, cfg, build))
        info["archs"] = data.arch_names(fit_shapes)
    learn_failures = method.validity is not None and bool(method.validity.learned)
    features_out: dict[str, Any] = {}
    model_cfg = recipe.model
    if int(model_cfg.early_stopping_rounds) > 0 and val is None:
        # no validation group to stop on (validation_split said why): the full tree count
        model_cfg = replace(model_cfg, early_stopping_rounds=0)
    fit_pipeline(pipe, train, model_cfg=model_cfg, target=target_name(recipe.model, recipe.target), val=val,
                 init_model=method.init_model, features_out=features_out if learn_failures else None)
    if learn_failures:
        # the failure model learns on the ranking model's own training rows and features
        failed = data.perf[rows] <= 0
        assert method.validity is not None  # learn_failures says so
        model = fit_failure_model(pipe, None, failed, method.validity, seed, Xt=features_out["Xt"])
        info.update(failure_model=model is not None, failed_rows=int(failed.sum()))
    info.update(_fitted_info(pipe, data, len(rows), fit_shapes, val_shapes))
    return pipe, info


def _fit_rows(data: Prepared, rows: np.ndarray, recipe: Recipe) -> FitRows:
    """``rows`` of ``data`` as a model fits on them: raw input, the recipe's label, shape codes."""
    codes = data.groups.codes[rows]
    return FitRows(X=data.X.iloc[rows], y=training_target(data.perf[rows], codes, recipe.model, recipe.target),
                   codes=codes)


def _fitted_info(pipe: Pipeline, data: Prepared, n_rows: int, fit_shapes: np.ndarray,
                 val_shapes: np.ndarray) -> dict[str, Any]:
    """What a fit used and made: its training rows and shapes, validation shapes, trees (and the
    best iteration, when early stopping chose one)."""
    info: dict[str, Any] = dict(train_rows=int(n_rows), train_shapes=[str(k) for k in data.groups.keys[fit_shapes]],
                                validation_shapes=[str(k) for k in data.groups.keys[val_shapes]],
                                trees=int(booster(pipe).current_iteration()))
    best_iter = getattr(pipe.named_steps["model"], "best_iteration_", None)
    if best_iter is None and hasattr(pipe.named_steps["model"], "regressor_"):
        best_iter = getattr(pipe.named_steps["model"].regressor_, "best_iteration_", None)
    if best_iter:
        info["best_iteration"] = int(best_iter)
    return info


def arch_features(data: Prepared, rows: np.ndarray, recipe: Recipe, op: OpDefinition, cfg: RecipeConfig,
                  build: Callable[..., Pipeline] = build_pipeline) -> np.ndarray:
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


def for_arch(pipe: Pipeline, method: LearnedMethod, op: OpDefinition, cfg: RecipeConfig, arch: ArchConfig | None,
             X: pd.DataFrame) -> Pipeline:
    """``pipe`` scoring a table of another arch: the same fitted model behind features built with
    ``arch``'s hardware constants (feature groups learn no statistics, so refitting them on
    ``X`` only records the input columns; ``arch`` None means ``cfg.arch``)."""
    features = build_pipeline(method.recipe, op, arch if arch is not None else cfg.arch, cfg.dtype).named_steps["features"]
    features.fit(X.head(8))
    out = Pipeline([("features", features), ("model", pipe.named_steps["model"])])
    for attr in ("ckpred_target_", "ckpred_failure_model_", "ckpred_failure_threshold_",
                 "ckpred_applicability_model_", "ckpred_applicability_threshold_"):
        if hasattr(pipe, attr):
            setattr(out, attr, getattr(pipe, attr))
    return out


def same_arch(a: ArchConfig | None, b: ArchConfig | None) -> bool:
    """Whether features built for ``a`` are those built for ``b`` (the same config, or the same
    name and hardware constants)."""
    return a is b or (a is not None and b is not None and getattr(a, "name", a) == getattr(b, "name", b)
                      and _constants(a) == _constants(b))


def _constants(arch: ArchConfig) -> dict[str, float] | None:
    try:
        return arch_constants(arch)
    except Exception:  # not an arch config: compare by name alone
        return None


def arch_scorers(pipe: Pipeline, method: LearnedMethod, op: OpDefinition, cfg: RecipeConfig, X: pd.DataFrame,
                 rows: np.ndarray, groups: Sequence[tuple[ArchConfig | None, np.ndarray]],
                 own: ArchConfig | None) -> Iterator[tuple[Pipeline, np.ndarray, np.ndarray]]:
    """For each ``(arch, sub)`` of ``groups`` (``rows`` split by arch): ``pipe`` scoring that arch's
    rows (itself when ``arch`` is ``own``, the arch its features are built for, else
    :func:`for_arch`), the positions of ``sub`` in ``rows``, and ``sub``."""
    position = pd.Series(np.arange(len(rows)), index=np.asarray(rows))
    for arch, sub in groups:
        scorer = pipe if same_arch(arch, own) else for_arch(pipe, method, op, cfg, arch, X)
        yield scorer, position.loc[sub].to_numpy(), sub


@dataclass
class Applicability:
    """A fitted applicability mask (:func:`fit_applicability`).

    Attributes
    ----------
    model : lightgbm.LGBMRegressor
        Estimates that a (problem, kernel) pair is absent from the table, on the ranking
        pipeline's features.
    threshold : float
        A pair whose estimate exceeds it is masked.
    curve : DataFrame
        The inner folds' strict efficiency per threshold tried (:func:`ckpred.evaluate.threshold_curve`).
    train_pairs : int
        Pairs the model was fitted on.
    inner_scores : str
        What scored the inner folds' selections the threshold was chosen on.
    """

    model: lgb.LGBMRegressor
    threshold: float
    curve: pd.DataFrame
    train_pairs: int
    inner_scores: str = "the model recipe's scores"

    def applicable(self, pipe: Pipeline, X: pd.DataFrame, batch: int = 200_000) -> np.ndarray:
        """bool per row of raw input ``X``: predicted to apply (``pipe`` supplies the features)."""
        return absent_estimate(pipe, X, self.model, batch) <= self.threshold

    def attach(self, pipe: Pipeline) -> Pipeline:
        """Attach the mask to ``pipe`` (:func:`ckpred.models.set_applicability_model`): the
        export compiles it into the selector."""
        set_applicability_model(pipe, self.model, self.threshold)
        return pipe


def _pair_rows(cand: Prepared, shapes: np.ndarray, max_rows: int, seed: int) -> np.ndarray:
    """Rows of ``cand`` (every candidate pair) of ``shapes``; beyond ``max_rows``, those of a seeded
    sample of whole shapes."""
    rows = rows_of(cand.groups, shapes)
    if len(rows) <= max_rows:
        return rows
    per_shape = len(rows) / max(len(shapes), 1)
    keep = np.random.default_rng(seed).choice(shapes, size=max(1, int(max_rows // per_shape)), replace=False)
    log.info("applicability: %d of %d training problems sampled (applicability.max_rows=%d pairs)",
             len(keep), len(shapes), max_rows)
    return rows_of(cand.groups, np.sort(keep))


def _fit_mask_model(cand: Prepared, shapes: np.ndarray, pipe: Pipeline, method: LearnedMethod, op: OpDefinition,
                    cfg: RecipeConfig, seed: int) -> tuple[lgb.LGBMRegressor, int]:
    """The mask model on ``pipe``'s features of the candidate pairs of ``shapes`` (on a table of
    several GPUs, each pair's with its own GPU's constants, as ``method`` builds them)."""
    acfg = cfg.applicability
    rows = _pair_rows(cand, shapes, int(acfg.max_rows), seed)
    Xt = arch_features(cand, rows, method.recipe, op, cfg) if cand.multi_arch else \
        pipe.named_steps["features"].transform(cand.X.iloc[rows])
    return fit_applicability_model(Xt, ~cand.measured[rows], acfg, seed), len(rows)


def _inner_scores(pipe: Pipeline, method: LearnedMethod, model: lgb.LGBMRegressor, cand: Prepared, rows: np.ndarray,
                  op: OpDefinition, cfg: RecipeConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``pipe``'s predictions, the mask ``model``'s absent estimates and the failure mask's verdicts
    of ``rows`` of ``cand``, each row featurised with its own GPU's constants."""
    predicted, absent = np.empty(len(rows)), np.empty(len(rows))
    runs = np.ones(len(rows), dtype=bool)
    for scorer, at, sub in arch_scorers(pipe, method, op, cfg, cand.X, rows, cand.arch_groups(rows), cand.arch):
        X = cand.X.iloc[sub]
        predicted[at], absent[at], runs[at] = predict(scorer, X), absent_estimate(scorer, X, model), \
            predicted_ok(scorer, X)
    return predicted, absent, runs


def fit_applicability(cand: Prepared, shapes: np.ndarray, data: Prepared, op: OpDefinition, cfg: RecipeConfig, seed: int,
                      pipe: Pipeline, method: LearnedMethod | None = None) -> Applicability:
    """Fit the applicability mask on the training ``shapes`` and choose its threshold on inner folds.

    For an op whose table lists only the kernels that apply to each problem
    (``op.absence=not_applicable``). The training problems are split into
    ``applicability.inner_folds`` folds by CV group; for each, the method whose selection the
    mask narrows (its failure mask too) and a mask model are fitted on the other inner folds and
    score every candidate pair of its problems. The threshold (of ``applicability.thresholds``)
    whose selection has the highest strict efficiency over those problems is kept
    (:func:`ckpred.evaluate.best_threshold`): never chosen on the problems it is scored on.
    The mask model returned is then fitted on every training problem.

    Parameters
    ----------
    cand : Prepared
        Every candidate pair of the table (:func:`with_unmeasured`); its shapes are ``data``'s.
    shapes : ndarray of int
        The training shapes.
    data : Prepared
        The measured table the model recipe trains on.
    pipe : Pipeline
        The ranking pipeline fitted on ``shapes``: the mask learns on its features.
    method : LearnedMethod, optional
        The method ``pipe`` was fitted by (default the config's model recipe). For the transfer
        recipe (``method.transfer`` set) the inner folds fit its learner and score a pair by its
        expected throughput (:func:`ckpred.models.expected_throughput`), as the recipe ranks;
        its blend with the static order (one training GPU: none) is not refitted there.
    """
    acfg = cfg.applicability
    method = model_method(cfg) if method is None else method
    expected = method.transfer is not None
    learner = learner_method(method)
    shapes = np.asarray(shapes)
    groups = data.cv_groups[shapes] if len(data.cv_groups) == data.groups.n_shapes else shapes
    n_inner = min(int(acfg.inner_folds), len(np.unique(groups)))
    thresholds = [float(t) for t in acfg.thresholds]
    if n_inner < 2:
        threshold = float(np.median(thresholds))
        log.warning("applicability: the training problems form one CV group, no inner fold to choose the "
                    "threshold on; using %g", threshold)
        curve = pd.DataFrame({"threshold": thresholds})
    else:
        parts = []
        splitter = GroupKFold(n_splits=n_inner, shuffle=True, random_state=int(seed))
        for i, (tr, te) in enumerate(splitter.split(shapes, groups=groups)):
            inner_pipe, _ = fit_method(learner, data, shapes[tr], op, cfg, seed + 1000 + i)
            model, _ = _fit_mask_model(cand, shapes[tr], inner_pipe, learner, op, cfg, seed)
            rows = rows_of(cand.groups, shapes[te])
            predicted, absent, runs = _inner_scores(inner_pipe, learner, model, cand, rows, op, cfg)
            parts.append((rows, expected_throughput(predicted, absent) if expected else predicted, absent, runs))
        rows = np.concatenate([p[0] for p in parts])
        sub = ev.ShapeGroups.from_keys(cand.groups.codes[rows])
        curve = ev.threshold_curve(cand.perf[rows], np.concatenate([p[1] for p in parts]), sub, cand.selectable[rows],
                                   cand.measured[rows], np.concatenate([p[2] for p in parts]), thresholds,
                                   runs=np.concatenate([p[3] for p in parts]))
        threshold = ev.best_threshold(curve)
    model, n_pairs = _fit_mask_model(cand, shapes, pipe, learner, op, cfg, seed)
    return Applicability(model=model, threshold=threshold, curve=curve, train_pairs=n_pairs,
                         inner_scores="the transfer recipe's learner, expected throughput" if expected
                         else "the model recipe's scores")


def rows_of(groups: ev.ShapeGroups, shapes: np.ndarray) -> np.ndarray:
    return np.concatenate([groups.rows(int(s)) for s in shapes]) if len(shapes) else np.zeros(0, dtype=np.int64)


def predict(pipe: Pipeline, X: pd.DataFrame, batch: int = 200_000) -> np.ndarray:
    # Batches bound the feature matrix held in memory at once.
    return np.concatenate([np.asarray(pipe.predict(X.iloc[i:i + batch]), dtype=np.float64)
                           for i in range(0, len(X), batch)])


def fit_final(cfg: RecipeConfig, table: pd.DataFrame, op: OpDefinition) -> Pipeline:
    """Fit the config's model recipe on every shape of ``table``, exactly as ``train`` fits its final
    model (with the applicability mask, :func:`attach_applicability`)."""
    data = prepare(table, op, cfg)
    method = model_method(cfg)
    shapes = np.arange(data.groups.n_shapes)
    pipe, _ = fit_method(method, data, shapes, op, cfg, int(cfg.seed))
    attach_applicability(pipe, data, shapes, op, cfg, int(cfg.seed))
    return pipe


def candidates(data: Prepared, op: OpDefinition, cfg: RecipeConfig) -> tuple[Prepared, Coverage]:
    """The candidate set of ``data``'s problems (:func:`with_unmeasured`), prepared as
    :func:`prepare` would, with ``data``'s shapes (same indices, keys, CV groups); ``data``
    itself when the table measures every candidate. On a table of several GPUs each problem's
    candidates are its GPU's (that arch's catalogue and rules), and each row keeps its arch.
    Raises what :func:`coverage_note` raises."""
    if data.multi_arch:
        table, coverage = _unmeasured_per_arch(data, op, cfg)
    else:
        table, coverage = with_unmeasured(data.table, op, cfg, arch=data.arch, shape_codes=data.groups.codes)
    coverage_note(op, coverage)
    if coverage.unmeasured == 0:
        return data, coverage
    codes = table.pop("_shape").to_numpy(np.int64)  # rows are sorted by shape already
    source = table.pop("_row").to_numpy(np.int64)
    groups = ev.ShapeGroups(codes=codes, keys=data.groups.keys, order=np.arange(len(codes), dtype=np.int64),
                            bounds=np.searchsorted(codes, np.arange(data.groups.n_shapes + 1)).astype(np.int64))
    # an added row passed the rules; a measured row keeps its own verdict
    selectable = np.where(source >= 0, data.selectable[np.maximum(source, 0)], True)
    return Prepared(table=table, X=op.encode_frame(table), perf=ev.measured_perf(table["tflops"].to_numpy(),
                                                                                table["is_valid"].to_numpy()),
                    selectable=selectable, groups=groups, shapes=data.shapes, cv_groups=data.cv_groups,
                    arch=data.arch, archs=data.archs,
                    row_arch=data.shape_arch[codes] if data.multi_arch else np.zeros(0, dtype=np.int64),
                    shape_arch=data.shape_arch), coverage


def _unmeasured_per_arch(data: Prepared, op: OpDefinition, cfg: RecipeConfig) -> tuple[pd.DataFrame, Coverage]:
    """:func:`with_unmeasured` of a table of several GPUs, one GPU's rows at a time with its own
    arch; ``_shape`` and ``_row`` index ``data``'s shapes and rows."""
    parts, counts = [], []
    for i, arch in enumerate(data.archs):
        rows = np.flatnonzero(data.row_arch == i)
        if not len(rows):
            continue
        local, shapes = pd.factorize(data.groups.codes[rows])  # with_unmeasured numbers its problems from 0
        part, coverage = with_unmeasured(data.table.iloc[rows], op, cfg, arch=arch, shape_codes=local)
        part["_shape"] = np.asarray(shapes, dtype=np.int64)[part["_shape"].to_numpy(np.int64)]
        at = part["_row"].to_numpy(np.int64)
        part["_row"] = np.where(at >= 0, rows[np.maximum(at, 0)], -1)
        parts.append(part)
        counts.append(replace(coverage, example=str(shapes[int(coverage.example)]) if coverage.example else ""))
    # one GPU's problems after another's: back in the order of data's shapes
    table = pd.concat(parts, ignore_index=True).sort_values("_shape", kind="stable").reset_index(drop=True)
    for c in table.columns:  # categories of different GPUs merge into object columns: categories again
        if table[c].dtype == object:
            table[c] = pd.Categorical(table[c])
    coverage = Coverage(problems=sum(c.problems for c in counts), pairs=sum(c.pairs for c in counts),
                        unmeasured=sum(c.unmeasured for c in counts),
                        one_kernel=sum(c.one_kernel for c in counts),
                        example=next((c.example for c in counts if c.example), ""))
    return table, coverage


def attach_applicability(pipe: Pipeline, data: Prepared, shapes: np.ndarray, op: OpDefinition, cfg: RecipeConfig, seed: int,
                         cand: Prepared | None = None) -> Applicability | None:
    """For an op whose table lists only the kernels that apply (``op.absence=not_applicable``): fit
    the applicability mask on ``shapes`` (:func:`fit_applicability`) and attach it to ``pipe``.
    None (and ``pipe`` unchanged) for any other op. ``cand`` is :func:`candidates` of ``data``
    when already built."""
    if getattr(op, "absence", "unknown") != "not_applicable":
        return None
    if cand is None:
        cand, _ = candidates(data, op, cfg)
    fitted = fit_applicability(cand, shapes, data, op, cfg, seed, pipe)
    fitted.attach(pipe)
    log.info("applicability mask: %d training pairs, threshold %g; inner folds' strict mean per threshold:\n%s",
             fitted.train_pairs, fitted.threshold, fitted.curve.to_string(index=False))
    return fitted
