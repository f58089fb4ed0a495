"""Measurement plans for a new GPU: which (problem, kernel) pairs to benchmark first.

A trained run knows other GPUs. On a new one, a few measurements fix most of what the
transferred model gets wrong (docs/results.md, "A new GPU"); :func:`make_plan` chooses them
within a budget and :func:`write_plan` writes them as a CSV a benchmark harness fills in and
``ckpred ingest`` reads back. Plans may be sequential: each round passes the measurements
taken so far (``measured``), which are never planned again and steer the next round.

What is chosen, and why (measured on Kernel Tuner's six GPUs and MIOpen's two find-dbs):

* **Problems** (when the budget cannot measure every one): in round order of a stratified
  sample -- strata are the problem's categorical fields, its family and the set of candidate
  kernels it lists, each stratum measured in proportion to its size, problems in a random
  order within it (seeded) -- so every kind of problem is measured (a problem with a single
  candidate has nothing to choose between and is never planned). When the run's model has
  already been trained on rows of the new GPU (a run retrained on an earlier round), the
  problems within each stratum are taken in order of the model's *uncertainty* instead: the
  smallest gap between its two best-scored candidates first. Choosing by the uncertainty of
  a model that never saw the GPU measures problems unlike the rest; after one stratified
  round it finds the problems the retrained model still gets wrong.
* **Kernels of a problem** (when the budget measures only some): the model's best-scored
  first, each at least ``min_distance`` (standardised kernel-field units: sizes on a log2
  scale, every field to unit variance) from every kernel picked or measured for that problem
  before, so a few measurements cover different regions of the kernel space. When the run's
  table holds several GPUs and the new GPU has measurements, the later rounds rank by the
  *similarity-weighted source order* instead: each source GPU's static order (the mean
  ``perf / best`` of a kernel over its problems), weighted by how well that GPU's order
  agrees with the new GPU's measurements so far (:func:`similarity_weights`).

The plan file (:func:`write_plan`): one row per pair to measure, in the order to measure
them -- the op's problem fields, kernel fields, ``kernel_name``, ``arch`` (the new GPU's arch
config), ``plan_rank`` (1 = first), ``plan_score`` (the score that ranked the kernel) and the
op's metric column (``op.metric.column``, in ``op.metric.unit``), empty for the harness to fill
in, plus the op's validity column (``op.failure.valid_column``) when it has one.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
from sklearn.pipeline import Pipeline

from ckpred import evaluate as ev
from ckpred.data import load_table
from ckpred.data.ingest import read_files
from ckpred.data.mapping import InputMapping
from ckpred.data.readers.common import to_float, to_int, truth
from ckpred.errors import ConfigValueError, InputFileError
from ckpred.fitting import for_arch, model_method, predict
from ckpred.kernels.base import Field, OpDefinition, load_op
from ckpred.kernels.lists import validity_on
from ckpred.runs import load_train_run
from ckpred.schema import PLAN_KERNEL_ORDERS, PLAN_PROBLEM_ORDERS, ArchConfig, BaselinesConfig, RecipeConfig, saved_recipe
from ckpred.schema import PlanBudgetConfig as Budget
from ckpred.transfer import TransferModel
from ckpred.util import OwnFile, atomic_path, resolve_path

__all__ = ["Budget", "Source", "Plan", "PlanOptions", "load_source", "read_problems", "candidates", "read_measured", "model_scores",
           "source_orders", "similarity_weights", "similarity_scores", "make_plan", "write_plan", "best_measured",
           "fill_columns", "PLAN_FILE"]

#: Columns the plan adds to the op's fields (see the module docstring).
PLAN_COLUMNS: tuple[str, ...] = ("kernel_name", "arch", "plan_rank", "plan_score")
#: A source GPU's weight is max(0, rank correlation)^SIMILARITY_POWER: a GPU whose order merely
#: resembles the new one's counts little next to one that agrees.
SIMILARITY_POWER = 2.0
#: Measured pairs needed before the similarity of the source GPUs is trusted; with fewer, every
#: source GPU weighs the same (the plain static order of all of them).
MIN_SIMILARITY_PAIRS = 3


# -- the trained run ----------------------------------------------------------------------------
@dataclass
class Source:
    """A finished train run as a plan reads it: its config, op, fitted pipeline and training table."""

    run_dir: Path
    #: The run's recipe (its record's config; ``baselines`` a plain mapping).
    cfg: RecipeConfig
    op: OpDefinition
    pipeline: Pipeline | TransferModel
    #: The run's training table (canonical), as its config loads it.
    table: pd.DataFrame
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def archs(self) -> list[str]:
        """The arch configs of the training rows (one per GPU of a multi-GPU table)."""
        if "arch" in self.table.columns:
            return [str(a) for a in pd.unique(self.table["arch"])]
        return [str(self.cfg.arch.name)]


def load_source(run_dir: str | Path) -> Source:
    """Load a finished train run (pipeline checked against its record) and its training table.

    The run's model is one fitted pipeline or, for a run trained with the transfer recipe, the
    recipe (:class:`ckpred.transfer.TransferModel`; :func:`model_scores` ranks with it as its
    exported selector does).

    Raises
    ------
    ckpred.errors.MissingFileError, ckpred.errors.InputFileError, ckpred.errors.ModelMismatchError
        As :func:`ckpred.runs.load_train_run` (no such run, not a train run, a replaced pipeline).
    """
    run = load_train_run(run_dir, purpose="plan", require_record=True)
    config = run.record.get("config")
    if not isinstance(config, dict):
        raise InputFileError(str(run.path / "run.json"), "plan: the run record holds no config (written by an older "
                                                          "ckpred); retrain the run")
    cfg = saved_recipe(config)
    op = load_op(cfg.op)
    return Source(run.path, cfg, op, run.pipeline, load_table(cfg), run.record)


# -- candidates ---------------------------------------------------------------------------------
def read_problems(path: str | Path, op: OpDefinition) -> pd.DataFrame:
    """The new GPU's problems: a CSV (or Parquet) with the op's problem fields as columns and,
    optionally, its kernel fields (or ``kernel_name``): one row per candidate (problem, kernel).

    Values are checked per field (an integer field takes integers, a categorical one its
    listed values); a field with a default may be left out.

    Raises
    ------
    ckpred.errors.InputFileError
        Naming ``file:line``, the column and the bad value, or the missing columns.
    """
    file = resolve_path(path)
    raw, lines, where = _read_problem_file(file)
    missing = [f.name for f in op.problem_fields if f.name not in raw.columns and f.default is None]
    if missing:
        raise InputFileError(str(file), f"problems: missing column(s) {missing}; op {op.name!r} needs its problem "
                                        f"fields {list(op.problem_names)} (its kernel fields {list(op.kernel_names)} "
                                        "or kernel_name are optional)")
    has_kernels = all(f.name in raw.columns or f.default is not None for f in op.kernel_fields)
    names = list(op.problem_names) + (list(op.kernel_names) if has_kernels else [])
    out: dict[str, list[object]] = {}
    for name in names:
        f = op.field(name)
        if name not in raw.columns:
            out[name] = [f.default] * len(raw)
            continue
        values = raw[name].tolist()
        parse, allowed = _field_parser(f)
        typed = [parse(v) for v in values]
        bad = next((i for i, v in enumerate(typed) if v is None), None)
        if bad is not None:
            raise InputFileError(f"{file}:{lines[bad]}", f"problems: column {name!r} has {values[bad]!r} ({where} "
                                                         f"{lines[bad]}); allowed: {allowed}")
        out[name] = typed
    frame = pd.DataFrame(out)
    if not has_kernels and "kernel_name" in raw.columns:
        frame["kernel_name"] = raw["kernel_name"].astype(str).str.strip().to_numpy()
    if not len(frame):
        raise InputFileError(str(file), "problems: the file lists no problem")
    return frame


def _read_problem_file(file: Path) -> tuple[pd.DataFrame, np.ndarray, str]:
    """The problem file's cells as text (Parquet: as stored), the file line (or row) of each row,
    and what the numbers count (``line`` or ``row``)."""
    if not file.is_file():
        raise InputFileError(str(file), "problems: no such file (a CSV or Parquet of the new GPU's problems)")
    if file.suffix.lower() in (".parquet", ".pq"):
        raw = pd.read_parquet(file).astype(object)
        lines, where = np.arange(len(raw)) + 1, "row"
    else:
        try:
            raw = pd.read_csv(file, dtype=str, keep_default_na=False, skip_blank_lines=True)
        except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
            raise InputFileError(str(file), f"problems: not a readable CSV ({' '.join(str(exc).split())})") from None
        lines, where = np.arange(len(raw)) + 2, "line"
    raw.columns = [str(c).strip() for c in raw.columns]
    return raw, lines, where


def _field_parser(f: Field) -> tuple[Callable[[object], object], str]:
    """How a cell of field ``f`` is read (None: not allowed) and what it allows, in words."""
    if f.kind == "int":
        return to_int, "an integer"
    if f.kind == "float":
        return to_float, "a number"
    if f.kind == "bool":
        return truth, "true or false"
    cats = set(f.categories)

    def category(v: object) -> str | None:
        text = str(v).strip()
        return text if text and (not cats or text in cats) else None

    return category, (f"one of {list(f.categories)}" if cats else "a non-empty value")


def candidates(source: Source, arch: ArchConfig, problems: pd.DataFrame | None = None) -> pd.DataFrame:
    """The (problem, kernel) pairs a plan chooses from, grouped by problem.

    ``problems`` (:func:`read_problems`): with kernel fields (or ``kernel_name``) the pairs it
    lists; without, each problem paired with every kernel of the run's table. ``None``: the
    run's own (problem, kernel) pairs, for a new GPU that runs the same problems. Pairs the op's
    validity rules reject on ``arch`` are dropped.

    Raises
    ------
    ckpred.errors.InputFileError
        When no pair is left (every kernel name unknown to the op, or every pair rule-invalid).
    """
    op, cfg = source.op, source.cfg
    kernel_cols = ["kernel_name", *op.kernel_names]
    if problems is None:
        pairs = source.table[[*op.problem_names, *kernel_cols]]
    elif all(k in problems.columns for k in op.kernel_names):
        kernels = problems[list(op.kernel_names)].drop_duplicates()
        kernels["kernel_name"] = [op.format_name(dict(zip(op.kernel_names, row)), dtype=str(cfg.dtype.name),
                                                 layout=str(cfg.layout.name))
                                  for row in kernels.itertuples(index=False)]
        pairs = problems.drop(columns="kernel_name", errors="ignore").merge(kernels, on=list(op.kernel_names),
                                                                           how="left", sort=False)
    elif "kernel_name" in problems.columns:
        kernels = _kernels_of(source)
        pairs = problems.merge(kernels, on="kernel_name", how="left", validate="many_to_one")
        unknown = pairs[list(op.kernel_names)].isna().any(axis=1)
        if unknown.any():
            name = pairs.loc[unknown.idxmax(), "kernel_name"]
            raise InputFileError("problems", f"kernel_name {name!r} is not a kernel of the run's table "
                                             f"({int(unknown.sum())} row(s)); give the kernel fields "
                                             f"{list(op.kernel_names)} for kernels the run never measured")
    else:
        kernels = _kernels_of(source)
        pairs = problems[list(op.problem_names)].drop_duplicates().merge(kernels, how="cross")
    pairs = pairs[[*op.problem_names, *kernel_cols]].reset_index(drop=True)
    shape = op.shape_keys(pairs)
    pairs = pairs.loc[~pd.DataFrame({"s": shape, "k": pairs["kernel_name"]}).duplicated()].reset_index(drop=True)
    ok, _ = validity_on(op, pairs[list(op.problem_names)], pairs[list(op.kernel_names)], arch=arch, dtype=cfg.dtype,
                        layout=cfg.layout)
    pairs = pairs.loc[np.asarray(ok, dtype=bool)].reset_index(drop=True)
    if not len(pairs):
        raise InputFileError("problems", f"no candidate (problem, kernel) pair passes op {op.name!r}'s rules on "
                                         f"arch {arch.name} (and its kernel list, where it has one)")
    # grouped by problem, in order of first appearance
    codes = pd.factorize(op.shape_keys(pairs))[0]
    return pairs.iloc[np.argsort(codes, kind="stable")].reset_index(drop=True)


def _kernels_of(source: Source) -> pd.DataFrame:
    """Every distinct kernel of the run's table (name and fields), in table order."""
    cols = ["kernel_name", *source.op.kernel_names]
    return source.table[cols].drop_duplicates("kernel_name").reset_index(drop=True)


# -- measurements taken so far ----------------------------------------------------------------------
def read_measured(paths: Sequence[str | Path], source: Source, arch: ArchConfig) -> pd.DataFrame:
    """The new GPU's measurements so far: canonical tables (``ckpred ingest`` output) or filled
    plan files (read as ingest reads them: the op's columns from a CSV), merged as ingest merges
    repeats, checked as ingest checks them. Rows of another arch than ``arch`` are left out.

    Returns
    -------
    DataFrame
        The canonical rows (empty when ``paths`` is empty).

    Raises
    ------
    ckpred.errors.InputFileError
        A file that cannot be read, or that holds no row of ``arch``.
    """
    if not paths:
        return pd.DataFrame()
    op, cfg = source.op, source.cfg
    mapping = InputMapping.of_op(op)
    mapping = replace(mapping, format="csv") if mapping is not None else None
    result = read_files([str(resolve_path(p)) for p in paths], op, arch=str(arch.name), dtype=str(cfg.dtype.name),
                        layout=str(cfg.layout.name), mapping=mapping, arch_config=arch)
    table = result.table
    if "arch" in table.columns:
        table = table[table["arch"].astype(str) == str(arch.name)]
    if not len(table):
        raise InputFileError(", ".join(map(str, paths)), f"measured: no measurement of arch {arch.name} "
                                                         f"({result.summary.records} record(s) read)")
    return table.reset_index(drop=True)


def _pair_keys(op: OpDefinition, frame: pd.DataFrame) -> pd.Series:
    return op.shape_keys(frame).astype(str) + "|" + frame["kernel_name"].astype(str)


# -- scores -------------------------------------------------------------------------------------------
def model_scores(source: Source, pairs: pd.DataFrame, arch: ArchConfig) -> np.ndarray:
    """The run's model scores of ``pairs`` with ``arch``'s hardware constants in the features.

    A transfer-recipe run (:class:`ckpred.transfer.TransferModel`) scores them as its exported
    selector ranks a problem's candidates: the learner's scores blended with the training GPUs'
    static order over each problem's pairs (the learner's own scores when its weight is 0).
    """
    X = source.op.encode_frame(pairs)
    model = source.pipeline
    if isinstance(model, TransferModel):
        return model.score_candidates(pairs, X, source.op, source.cfg, arch)
    return predict(for_arch(model, model_method(source.cfg), source.op, source.cfg, arch, X), X)


def _static_keys(source: Source, frame: pd.DataFrame) -> np.ndarray:
    saved = source.cfg.baselines or {}
    by = ev.best_static_by(BaselinesConfig(best_static_by=list(saved.get("best_static_by") or ())), source.op)
    return ev.static_keys(frame.reset_index(drop=True), np.arange(len(frame)), by)


def source_orders(source: Source, exclude_arch: str = "") -> dict[str, pd.Series]:
    """Per source GPU (arch of the run's rows), its static order: each kernel's mean ``perf /
    best`` over that GPU's problems (per ``baselines.best_static_by`` stratum)."""
    table = source.table
    perf = ev.measured_perf(table["tflops"].to_numpy(), table["is_valid"].to_numpy())
    keys = _static_keys(source, table)
    arch = table["arch"].astype(str).to_numpy() if "arch" in table.columns else \
        np.full(len(table), str(source.cfg.arch.name))
    out = {}
    for a in pd.unique(arch):
        if a == exclude_arch:
            continue
        rows = np.flatnonzero(arch == a)
        groups = ev.ShapeGroups.from_keys(source.op.shape_keys(table.iloc[rows]).to_numpy())
        sums, n = ev.best_static_sums(keys[rows], perf[rows], groups)
        out[str(a)] = sums / max(n, 1)
    return out


def similarity_weights(orders: dict[str, pd.Series], measured: pd.DataFrame, source: Source) -> dict[str, float]:
    """Weight of each source GPU: max(0, rank correlation)^:data:`SIMILARITY_POWER` between its
    static order and the new GPU's measured ``perf / best measured`` of the same problem, over
    the measured pairs; equal weights with fewer than :data:`MIN_SIMILARITY_PAIRS` pairs or no
    positive correlation."""
    op = source.op
    perf = ev.measured_perf(measured["tflops"].to_numpy(), measured["is_valid"].to_numpy())
    best = pd.Series(perf).groupby(op.shape_keys(measured).to_numpy()).transform("max").to_numpy()
    rel = np.divide(perf, best, out=np.zeros_like(perf), where=best > 0)
    keys = _static_keys(source, measured)
    weights = {}
    for a, order in orders.items():
        theirs = pd.Series(keys).map(order).fillna(0.0).to_numpy()
        rho = pd.Series(rel).corr(pd.Series(theirs), method="spearman") if len(rel) >= MIN_SIMILARITY_PAIRS else 0.0
        weights[a] = max(float(np.nan_to_num(rho)), 0.0) ** SIMILARITY_POWER
    if sum(weights.values()) <= 0:
        weights = dict.fromkeys(orders, 1.0)
    return weights


def similarity_scores(orders: dict[str, pd.Series], weights: dict[str, float], source: Source,
                      pairs: pd.DataFrame) -> np.ndarray:
    """The similarity-weighted source order of ``pairs``: sum of weight x each source GPU's
    static score over the weights (a kernel no source GPU ran scores -inf: ranked last)."""
    keys = pd.Series(_static_keys(source, pairs))
    num = np.zeros(len(pairs))
    den = np.zeros(len(pairs))
    for a, order in orders.items():
        s = keys.map(order).to_numpy(dtype=np.float64)
        known = ~np.isnan(s)
        num[known] += weights[a] * s[known]
        den[known] += weights[a]
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), -np.inf)


# -- choosing ------------------------------------------------------------------------------------------
def kernel_coordinates(op: OpDefinition, kernels: pd.DataFrame) -> np.ndarray:
    """Kernel fields of ``kernels`` (one problem's candidates) as standardised coordinates for
    distances: numeric fields whose values are all positive on a log2 scale (a size 8 -> 16 is
    as far as 1 -> 2), categorical ones one-hot, every column to unit variance over ``kernels``."""
    cols = []
    for f in op.kernel_fields:
        values = kernels[f.name]
        if f.kind == "category":
            text = values.astype(str)
            cols += [(text == c).to_numpy(float) for c in pd.unique(text)]
            continue
        x = values.to_numpy(dtype=np.float64)
        cols.append(np.log2(x) if len(x) and (x > 0).all() else x)
    z = np.column_stack(cols) if cols else np.zeros((len(kernels), 0))
    std = z.std(0)
    return (z - z.mean(0)) / np.where(std > 0, std, 1.0)


def diverse_picks(order: np.ndarray, z: np.ndarray, k: int, min_distance: float,
                  taken: Sequence[int] = ()) -> list[int]:
    """``k`` indices from ``order`` (best first), each at least ``min_distance`` from every pick
    so far and from ``taken`` (rows of ``z``); filled in ``order`` when the distance leaves too few."""
    picks: list[int] = []
    ref = [int(i) for i in taken]
    for i in order:
        if len(picks) == k:
            break
        if not ref or np.sqrt(((z[ref] - z[i]) ** 2).sum(1)).min() >= min_distance:
            picks.append(int(i))
            ref.append(int(i))
    for i in order:
        if len(picks) == k:
            break
        if int(i) not in picks:
            picks.append(int(i))
    return picks


def problem_strata(op: OpDefinition, pairs: pd.DataFrame, groups: ev.ShapeGroups) -> np.ndarray:
    """Per problem (``groups`` order): its stratum -- the categorical problem fields, the op's
    family and the set of candidate kernels it lists."""
    first = pairs.iloc[groups.first_rows()].reset_index(drop=True)
    parts = [first[f.name].astype(str).to_numpy(dtype=object) for f in op.problem_fields if f.kind == "category"]
    parts.append(np.asarray(op.family(first[list(op.problem_names)]), dtype=object).astype(str))
    listed = pd.Series(pairs["kernel_name"].astype(str).to_numpy()).groupby(groups.codes).agg(
        lambda k: "|".join(sorted(k)))
    parts.append(listed.sort_index().to_numpy(dtype=object))
    key = np.asarray(parts[0], dtype=object)
    for part in parts[1:]:
        key = key + "#" + part
    return key


def score_gaps(groups: ev.ShapeGroups, scores: np.ndarray) -> np.ndarray:
    """Per problem (``groups`` order): its best score minus its second best (inf with one candidate)."""
    s = np.where(np.isfinite(scores), scores, -1e300)
    order = np.lexsort((-s, groups.codes))
    codes = groups.codes[order]
    first = np.r_[0, np.flatnonzero(np.diff(codes)) + 1]
    gaps = np.full(groups.n_shapes, np.inf)
    has_second = np.r_[np.diff(first) > 1, len(codes) - first[-1] > 1] if len(first) else np.zeros(0, bool)
    top = s[order[first]]
    second = s[order[np.minimum(first + 1, len(order) - 1)]]
    gaps[codes[first[has_second]]] = (top - second)[has_second]
    return gaps


def stratified_order(strata: np.ndarray, within: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Problem indices in an order whose every prefix samples the strata in proportion.

    Problem i of stratum s (size n_s), at rank r_i within it by ``within`` (ascending; ties in a
    random order), gets the key (r_i + u_s) / n_s with u_s a random offset per stratum: sorted by
    key, the first P problems hold about P x n_s / N of stratum s (a systematic sample of each).
    """
    n = len(strata)
    frame = pd.DataFrame({"s": strata, "w": within, "j": rng.random(n)})
    rank = frame.sort_values(["w", "j"], kind="stable").groupby("s", sort=False).cumcount().sort_index().to_numpy()
    size = frame.groupby("s")["s"].transform("size").to_numpy()
    offset = pd.Series(rng.random(n)).groupby(strata).transform("first").to_numpy()
    return np.argsort((rank + offset) / size, kind="stable")


@dataclass
class Plan:
    """A chosen plan: the pairs to measure (the candidates' columns plus ``arch``, ``plan_rank``
    and ``plan_score``), in order, and how they were chosen."""

    rows: pd.DataFrame
    problem_order: str
    kernel_order: str
    #: Source GPU weights of the similarity order (empty when it was not used).
    weights: dict[str, float] = field(default_factory=dict)
    #: Problems planned, candidate problems, candidate pairs, candidate pairs already measured.
    problems: int = 0
    candidate_problems: int = 0
    candidate_pairs: int = 0
    measured_pairs: int = 0


@dataclass(frozen=True)
class PlanOptions:
    """How a plan orders what it chooses (``ckpred plan``'s options of the same names).

    Attributes
    ----------
    problem_order : str
        ``stratified``, ``uncertainty`` or ``auto`` (uncertainty when the run trained on rows
        of the new GPU, else stratified).
    kernel_order : str
        ``model``, ``similarity`` or ``auto`` (similarity when the run's table holds several
        source GPUs and the new GPU has measurements, else the model).
    min_distance : float
        Kernels planned for one problem are at least this far apart (standardised units).
    seed : int
        Seeds the order of problems within a stratum.
    """

    problem_order: str = "auto"
    kernel_order: str = "auto"
    min_distance: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.problem_order not in PLAN_PROBLEM_ORDERS:
            raise ConfigValueError("problem_order", self.problem_order, f"one of {list(PLAN_PROBLEM_ORDERS)}")
        if self.kernel_order not in PLAN_KERNEL_ORDERS:
            raise ConfigValueError("kernel_order", self.kernel_order, f"one of {list(PLAN_KERNEL_ORDERS)}")


def make_plan(source: Source, pairs: pd.DataFrame, arch: ArchConfig, budget: Budget, *,
              measured: pd.DataFrame | None = None, options: PlanOptions = PlanOptions(),
              scores: np.ndarray | None = None) -> Plan:
    """Choose the (problem, kernel) pairs to measure on ``arch`` (see the module docstring).

    Parameters
    ----------
    pairs
        The candidates (:func:`candidates`).
    measured
        The new GPU's measurements so far (:func:`read_measured`); the run's own rows of
        ``arch`` (a run retrained on them) count as measured too. Measured pairs are not
        planned again and, with several source GPUs, set the similarity weights.
    options
        The problem and kernel orders, the kernels' minimum distance and the seed.
    scores
        The model's scores of ``pairs`` (default :func:`model_scores`).
    """
    own = source.table[source.table["arch"].astype(str) == str(arch.name)] if "arch" in source.table.columns \
        else source.table.iloc[:0]
    known = pd.concat([t for t in (measured, own) if t is not None and len(t)], ignore_index=True) \
        if (measured is not None and len(measured)) or len(own) else pd.DataFrame()
    is_done = _pair_keys(source.op, pairs).isin(set(_pair_keys(source.op, known))).to_numpy() if len(known) \
        else np.zeros(len(pairs), bool)
    scores = np.asarray(model_scores(source, pairs, arch) if scores is None else scores, dtype=np.float64)
    ranking, weights = _kernel_ranking(source, pairs, str(arch.name), known, scores, options.kernel_order)
    groups = ev.ShapeGroups.from_keys(source.op.shape_keys(pairs).to_numpy())
    uncertain = options.problem_order == "uncertainty" or (options.problem_order == "auto" and len(own) > 0)
    order = _problem_sequence(source.op, pairs, groups, is_done, score_gaps(groups, scores) if uncertain
                              else np.zeros(groups.n_shapes), np.random.default_rng(options.seed))
    picked, planned = _pick_kernels(source.op, pairs, groups, order, is_done, ranking, budget, options.min_distance)
    out = pairs.iloc[picked].reset_index(drop=True)
    out["arch"] = str(arch.name)
    out["plan_rank"] = np.arange(1, len(out) + 1)
    out["plan_score"] = ranking[picked]
    return Plan(out, "uncertainty" if uncertain else "stratified", "similarity" if weights else "model",
                weights, planned, groups.n_shapes, len(pairs), int(is_done.sum()))


def _kernel_ranking(source: Source, pairs: pd.DataFrame, arch_name: str, known: pd.DataFrame, scores: np.ndarray,
                    kernel_order: str) -> tuple[np.ndarray, dict[str, float]]:
    """The score that orders each problem's kernels: the model's, or the source GPUs' static
    orders weighted by their agreement with the measurements (then also those weights)."""
    orders = source_orders(source, exclude_arch=arch_name) if len(known) else {}
    if kernel_order == "similarity" and not orders:
        raise ConfigValueError("kernel_order", kernel_order, "model or auto: the similarity order needs measurements "
                                                             "of the new GPU (measured=<files>)")
    use_similarity = bool(orders) and (kernel_order == "similarity" or (kernel_order == "auto" and len(orders) >= 2))
    weights = similarity_weights(orders, known, source) if use_similarity else {}
    ranking = similarity_scores(orders, weights, source, pairs) if use_similarity else scores
    return np.where(np.isfinite(ranking), ranking, -np.inf), weights


def _problem_sequence(op: OpDefinition, pairs: pd.DataFrame, groups: ev.ShapeGroups, is_done: np.ndarray,
                      within: np.ndarray, rng: np.random.Generator) -> list[int]:
    """Problems (``groups`` order) in the order to plan them: stratified, ``within`` ordering each
    stratum; those with no candidate left to measure, or a single candidate, left out."""
    open_left = np.bincount(groups.codes, weights=~is_done, minlength=groups.n_shapes)
    # a problem with one candidate has nothing to choose between: measuring it teaches nothing
    open_left[np.bincount(groups.codes, minlength=groups.n_shapes) < 2] = 0
    return [int(p) for p in stratified_order(problem_strata(op, pairs, groups), within, rng) if open_left[p] > 0]


def _pick_kernels(op: OpDefinition, pairs: pd.DataFrame, groups: ev.ShapeGroups, order: list[int],
                  is_done: np.ndarray, ranking: np.ndarray, budget: Budget,
                  min_distance: float) -> tuple[list[int], int]:
    """Rows of ``pairs`` to measure, problem by problem in ``order`` until the budget is spent:
    each problem's unmeasured kernels best-ranked first, kept ``min_distance`` apart when only
    some fit. Returns (rows, problems planned)."""
    n_problems = budget.problem_count(groups.n_shapes)
    picked: list[int] = []
    planned = 0
    left = budget.total or math.inf
    for p in order:
        if left <= 0 or (n_problems is not None and planned >= n_problems):
            break
        rows = groups.rows(p)
        free = rows[~is_done[rows]]
        by_rank = free[np.lexsort((np.arange(len(free)), -ranking[free]))]
        k = int(min(len(free), budget.per_problem or len(free), left))
        if k < len(free):
            z = kernel_coordinates(op, pairs.iloc[rows])
            pos = pd.Series(np.arange(len(rows)), index=rows)
            chosen = diverse_picks(pos[by_rank].to_numpy(), z, k, min_distance, pos[rows[is_done[rows]]].to_numpy())
            picks = list(rows[chosen])
        else:
            picks = list(by_rank)
        picked += picks
        left -= len(picks)
        planned += 1
    return picked, planned


def best_measured(source: Source, measured: pd.DataFrame) -> pd.DataFrame:
    """Per problem of ``measured``: the fastest kernel measured so far (the pick of a problem the
    plan measured), with its measured value and the number of measurements."""
    op = source.op
    perf = ev.measured_perf(measured["tflops"].to_numpy(), measured["is_valid"].to_numpy())
    frame = measured[list(op.problem_names)].copy()
    frame["kernel_name"] = measured["kernel_name"].to_numpy()
    frame["perf"] = perf
    frame["shape"] = op.shape_keys(measured).to_numpy()
    best = frame.sort_values("perf", ascending=False, kind="stable").groupby("shape", sort=False).head(1)
    best = best.assign(measured=frame.groupby("shape")["perf"].transform("size").loc[best.index])
    return best.drop(columns="shape").reset_index(drop=True)


# -- the plan file ---------------------------------------------------------------------------------------
def _untouched_plan(path: Path) -> bool:
    """A plan file ckpred wrote whose columns to fill are all still empty (replacing it loses nothing)."""
    try:
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            if "plan_score" not in header or header.index("plan_score") == len(header) - 1:
                return False
            fill = range(header.index("plan_score") + 1, len(header))
            return all(not row[i].strip() for row in reader for i in fill if i < len(row))
    except (OSError, UnicodeDecodeError, csv.Error):
        return False


#: What a plan write may replace: nothing, an empty file, or a plan ckpred wrote that holds no measurement.
PLAN_FILE = OwnFile("an unfilled measurement plan", _untouched_plan)


def fill_columns(op: OpDefinition) -> list[str]:
    """The columns a harness fills in: the op's metric column and its validity column (if any)."""
    mapping = InputMapping.of_op(op) or InputMapping()
    return [mapping.metric_column, *([mapping.valid_column] if mapping.valid_column else [])]


def write_plan(plan: Plan, path: str | Path, op: OpDefinition) -> Path:
    """Write ``plan``'s rows as the plan CSV (see the module docstring), atomically; refuses a
    file that is not an untouched plan (:data:`PLAN_FILE`)."""
    out = resolve_path(path)
    frame = plan.rows[[*op.problem_names, *op.kernel_names, *PLAN_COLUMNS]].copy()
    frame["plan_score"] = frame["plan_score"].map(lambda v: f"{v:.6g}")
    for col in fill_columns(op):
        frame[col] = ""
    with atomic_path(out, PLAN_FILE) as tmp:
        frame.to_csv(tmp, index=False)
    return out
