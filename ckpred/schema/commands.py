"""Schemas of the commands past ``train``: export, select, ingest, tune, sweep-report, replay, plan."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Optional

from omegaconf import MISSING

from ckpred.errors import check
from ckpred.schema.arch import ArchConfig
from ckpred.schema.base import check_output_path, check_seed, check_threads
from ckpred.schema.train import RecipeConfig, TrainConfig


# -- export and select ------------------------------------------------------------------------
#: ``full``: every catalogue kernel scored by the full model; ``pruned``: only the candidates
#: learned from the training data; ``reranked``: those candidates scored by a small model fitted
#: on their rows only (:mod:`ckpred.export.strategies`).
EXPORT_SELECT: tuple[str, ...] = ("full", "pruned", "reranked")


@dataclass
class ExportRerankerConfig:
    """Size of the ``select=reranked`` model (the rest of the model config is the recipe's)."""

    #: Trees; ``None`` scales them with the recipe's learning rate
    #: (:func:`ckpred.export.strategies.reranker_size`: 70 at 0.1, 140 at 0.05), since a smaller
    #: rate needs proportionally more trees to fit as far.
    n_estimators: Optional[int] = None
    num_leaves: int = 31

    def __post_init__(self) -> None:
        check("reranker.n_estimators", self.n_estimators, self.n_estimators is None or self.n_estimators >= 1,
              "an integer >= 1, or null (trees scaled with the recipe's learning rate)")
        check("reranker.num_leaves", self.num_leaves, self.num_leaves >= 2, "an integer >= 2")


@dataclass
class ExportParityConfig:
    """The parity check run before an export is written (sklearn vs ONNX scorer vs selector)."""

    check: bool = True
    #: Training shapes to check (0 = all of them).
    shapes: int = 0
    #: Largest |sklearn - ONNX| score difference allowed, in the model's output space.
    max_abs_diff: float = 1e-6

    def __post_init__(self) -> None:
        check("parity.shapes", self.shapes, self.shapes >= 0, "an integer >= 0 (0 = every training shape)")
        check("parity.max_abs_diff", self.max_abs_diff, self.max_abs_diff >= 0, "a number >= 0")


@dataclass
class ExportAutotuneConfig:
    """The confidence budget's calibration written into the manifest (``autotune``).

    Fitted on the out-of-fold scores of the exported strategy (``run_dir`` exports only); see
    :func:`ckpred.autotune.calibrate` for the meaning of each setting.
    """

    #: Fit and export the calibration (false: the manifest's ``autotune`` is null).
    enabled: bool = True
    #: ``logistic``: P(best of the top j within x) from the score gaps and the problem's integer
    #: fields (:func:`ckpred.autotune.fit_logistic`); ``table``: score-gap bins only
    #: (:func:`ckpred.autotune.calibrate`; ``bins``, ``gap_to`` and ``prior_failures`` apply to it).
    kind: str = "logistic"
    #: Tolerances calibrated (fractions of the best kernel's performance).
    within: list[float] = field(default_factory=lambda: [0.01, 0.02, 0.05, 0.1])
    #: Score-gap bins (quantiles over the calibration problems).
    bins: int = 6
    #: Largest top-j tabulated (the budget never plans more).
    max_k: int = 10
    #: The score gap: top score minus the ``gap_to``-th.
    gap_to: int = 3
    #: Pseudo-misses added to every bin.
    prior_failures: float = 1.0
    #: The budget's stated fixed k where the calibration has nothing to learn (fewer than
    #: ``min_problems`` out-of-fold problems, or none whose top-1 is within a tolerance), and the
    #: least it spends on a problem outside the training ranges or on an arch never trained on.
    fallback_k: int = 5
    #: Fewest out-of-fold problems a calibration learns from.
    min_problems: int = 10

    def __post_init__(self) -> None:
        check("autotune.fallback_k", self.fallback_k, self.fallback_k >= 1, "an integer >= 1")
        check("autotune.min_problems", self.min_problems, self.min_problems >= 1, "an integer >= 1")
        check("autotune.within", self.within, len(self.within) > 0 and all(0 < float(w) < 1 for w in self.within),
              "a non-empty list of fractions in (0, 1)")
        check("autotune.kind", self.kind, self.kind in ("logistic", "table"), "one of ['logistic', 'table']")
        check("autotune.bins", self.bins, self.bins >= 1, "an integer >= 1")
        check("autotune.max_k", self.max_k, self.max_k >= 1, "an integer >= 1")
        check("autotune.gap_to", self.gap_to, self.gap_to >= 2, "an integer >= 2")
        check("autotune.prior_failures", self.prior_failures, self.prior_failures >= 0, "a number >= 0")


@dataclass
class ExportConfig(RecipeConfig):
    """Primary config of ``ckpred export``: the train recipe plus where the model comes from."""

    #: A finished ``train`` run dir to compile (its ``pipeline.joblib``); empty = fit here on all data.
    run_dir: str = ""
    #: Root of the exports; the model goes to ``<out_dir>/<op>_<arch>_<dtype>_<layout>/``.
    out_dir: str = "exports"
    #: Selection strategy compiled into the selector graph.
    select: str = "reranked"
    #: ``select=pruned|reranked``: kernels kept per training shape (its ``prune_top_n`` fastest valid ones).
    prune_top_n: int = 1
    #: ``select=reranked``: the candidates' model size.
    reranker: ExportRerankerConfig = field(default_factory=ExportRerankerConfig)
    parity: ExportParityConfig = field(default_factory=ExportParityConfig)
    #: The confidence budget's calibration (``run_dir`` exports).
    autotune: ExportAutotuneConfig = field(default_factory=ExportAutotuneConfig)

    command = "export"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_output_path("out_dir", self.out_dir, kind="dir")
        check("select", self.select, self.select in EXPORT_SELECT, f"one of {list(EXPORT_SELECT)}")
        check("prune_top_n", self.prune_top_n, self.prune_top_n >= 1, "an integer >= 1")

    def unused_keys(self) -> dict[str, str]:
        out = super().unused_keys()
        if self.select != "reranked":
            out["reranker"] = f"select={self.select} does not read it (select=reranked does)"
        if self.select == "full":
            out["prune_top_n"] = "select=full does not read it (select=pruned and reranked do)"
        if not self.run_dir:
            out["autotune"] = ("an export without run_dir has no out-of-fold scores to calibrate on "
                               "(export run_dir=<train run>)")
        return out


@dataclass
class SelectConfig(RecipeConfig):
    """Primary config of ``ckpred select``: one problem, answered by an exported model.

    Only ``arch``, ``dtype``, ``layout`` and ``op`` of the recipe are used (they name the
    export); the rest is composed so that ``experiment=<name>``, which sets a whole recipe,
    picks the same export for ``select`` as for ``train`` and ``export``.
    """

    #: Problem fields of the op, e.g. ``problem.m=128 problem.n=1536 problem.k=7168``. An op
    #: with a ``conf/problem/<op>.yaml`` declares its keys there (required ones are ``???``);
    #: for any other op the keys are the op's problem fields, checked against it.
    problem: dict[str, Any] = field(default_factory=dict)
    #: Unused by ``select``; composed from ``features/<op>.yaml`` when the op has one, so that
    #: an op written in YAML alone needs no feature set to be answered.
    features: Any = None
    top_k: int = 5
    #: Export directory; empty = ``<exports_dir>/<op>_<arch>_<dtype>_<layout>``.
    model_dir: str = ""
    exports_dir: str = "exports"
    #: Print the answer as one JSON object instead of a table.
    json: bool = False
    threads: int = 1

    command = "select"

    def __post_init__(self) -> None:
        super().__post_init__()
        check("top_k", self.top_k, self.top_k >= 1, "an integer >= 1")
        check_threads("threads", self.threads)
        check("problem", dict(self.problem), bool(self.problem),
              "the problem fields, e.g. problem.m=128 problem.n=1536 problem.k=7168")

    def unused_keys(self) -> dict[str, str]:
        why = ("select answers from an exported model and reads only arch, dtype, layout and op of the recipe "
               "(the rest is composed so that experiment=<name> names the same export)")
        out = dict.fromkeys(("data", "shapes", "features", "model", "target", "rows", "validity", "seed", "cv",
                             "baselines"), why)
        if self.model_dir:
            out["exports_dir"] = "model_dir names the export itself"
        return out


@dataclass
class IngestConfig(RecipeConfig):
    """Primary config of ``ckpred ingest``: reads ``arch``, ``dtype``, ``layout``, ``op`` and
    ``data`` of the recipe (the rest is composed so that ``experiment=<name>`` composes here too)."""

    #: Unused by ``ingest``; composed from ``features/<op>.yaml`` when the op has one.
    features: Any = None
    #: Output of the canonical table: a ``.parquet`` file, or else a directory of
    #: ``part-NNNNN.parquet`` files (a partitioned dataset, each part holding whole problems).
    out: str = "ingested.parquet"
    #: Where rows that could not be kept go (CSV with file:line and reason); empty = next to out.
    rejects: str = ""
    run_id: str = ""

    command = "ingest"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_output_path("out", self.out, kind="file" if str(self.out).endswith(".parquet") else "dir",
                          required=True)
        check_output_path("rejects", self.rejects, kind="file")

    def unused_keys(self) -> dict[str, str]:
        why = ("ingest reads only arch, dtype, layout, op and data of the recipe (the rest is composed so that "
               "experiment=<name> composes here too)")
        return dict.fromkeys(("shapes", "features", "model", "target", "rows", "validity", "seed", "cv",
                              "baselines"), why)


# -- sweeps, tune, warm start -----------------------------------------------------------------
TUNE_KINDS: tuple[str, ...] = ("int", "float", "categorical")
#: ``model.<name>`` keys the ``tune`` search space may set (LightGBM hyperparameters).
TUNABLE: tuple[str, ...] = ("n_estimators", "learning_rate", "num_leaves", "max_depth", "min_child_samples",
                            "subsample", "subsample_freq", "colsample_bytree", "reg_alpha", "reg_lambda",
                            "min_split_gain", "max_bin", "relevance_exponent")
SWEEP_SORT: tuple[str, ...] = ("mean", "p10")


@dataclass
class TuneParamConfig:
    """Range of one ``model.<name>`` hyperparameter in the ``tune`` search space."""

    #: ``int`` / ``float``: a value in [low, high]; ``categorical``: one of ``choices``.
    kind: str = "float"
    low: float = 0.0
    high: float = 0.0
    #: Sample on a log scale (low must be > 0).
    log: bool = False
    #: Grid step inside [low, high] (0 = continuous floats / every integer).
    step: float = 0.0
    choices: list[Any] = field(default_factory=list)
    #: false = keep the config's value (drop the parameter from the search).
    enabled: bool = True


@dataclass
class TuneSettings:
    """Budget, sampler and search space of ``ckpred tune`` (see :mod:`ckpred.tune`)."""

    #: Trial budget.
    n_trials: int = 20
    #: Stop starting new trials after this many seconds (0 = no limit). A time budget makes the
    #: number of trials, hence the result, depend on machine speed; ``n_trials`` alone does not.
    timeout_s: float = 0.0
    #: Seed of optuna's TPESampler (the trials are deterministic for a given seed).
    sampler_seed: int = 0
    #: Random trials before TPE starts modelling.
    n_startup_trials: int = 8
    #: Keep each trial's plots and final fitted pipeline (one extra fit per trial).
    trial_outputs: bool = False
    #: ``median``: stop a trial after a fold when its running CV mean is below the median of
    #: the earlier trials at that fold (optuna MedianPruner); ``none``: run every fold.
    pruner: str = "median"
    #: Complete trials before any is pruned.
    pruner_startup_trials: int = 5
    #: Folds every trial runs before it may be pruned.
    pruner_warmup_folds: int = 1
    #: ``model.<name>`` -> range. ``conf/tune.yaml`` declares every tunable parameter (most with
    #: ``enabled: false``), so any of them is switched on and resized with plain overrides.
    space: dict[str, TuneParamConfig] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check("tune.n_trials", self.n_trials, self.n_trials >= 1, "an integer >= 1")
        check("tune.timeout_s", self.timeout_s, self.timeout_s >= 0, "a number of seconds >= 0 (0 = no limit)")
        check_seed("tune.sampler_seed", self.sampler_seed)
        check("tune.n_startup_trials", self.n_startup_trials, self.n_startup_trials >= 0, "an integer >= 0")
        check("tune.pruner", self.pruner, self.pruner in ("median", "none"), "one of ['median', 'none']")
        check("tune.pruner_startup_trials", self.pruner_startup_trials, self.pruner_startup_trials >= 0,
              "an integer >= 0")
        check("tune.pruner_warmup_folds", self.pruner_warmup_folds, self.pruner_warmup_folds >= 0, "an integer >= 0")
        # An empty space is refused by ``ckpred.tune`` when it runs: the schema default must compose.
        for name, entry in self.space.items():
            tune_param(name, entry)


def tune_param(name: str, raw: Any) -> TuneParamConfig:
    """Check one ``tune.space.<name>`` entry (a mapping or a :class:`TuneParamConfig`)."""
    if is_dataclass(raw):
        raw = asdict(raw)  # type: ignore[arg-type]
    key = f"tune.space.{name}"
    allowed = [f.name for f in fields(TuneParamConfig)]
    check(key, raw, isinstance(raw, dict), f"a mapping with keys from {allowed}")
    for k in raw:
        check(f"{key}.{k}", raw[k], k in allowed, f"a key of a search-space entry: {allowed}")
    p = TuneParamConfig(**raw)
    check(f"{key}.enabled", p.enabled, isinstance(p.enabled, bool), "true or false")
    if not p.enabled:
        return p
    check(key, name, name in TUNABLE, f"one of {list(TUNABLE)} (model.<name> keys)")
    check(f"{key}.kind", p.kind, p.kind in TUNE_KINDS, f"one of {list(TUNE_KINDS)}")
    if p.kind == "categorical":
        check(f"{key}.choices", p.choices, isinstance(p.choices, list) and len(p.choices) > 0, "a non-empty list")
        return p
    for bound in ("low", "high", "step"):
        value = getattr(p, bound)
        check(f"{key}.{bound}", value, isinstance(value, (int, float)) and not isinstance(value, bool), "a number")
    check(f"{key}.high", p.high, p.high > p.low, f"a number > low ({p.low})")
    check(f"{key}.log", p.log, isinstance(p.log, bool), "true or false")
    check(f"{key}.low", p.low, p.low > 0 or not p.log, "a number > 0 when log=true")
    check(f"{key}.step", p.step, p.step >= 0 and not (p.step and p.log),
          "a number >= 0, and 0 when log=true (optuna cannot combine them)")
    if p.kind == "int":
        for bound in ("low", "high", "step"):
            value = getattr(p, bound)
            check(f"{key}.{bound}", value, float(value).is_integer(), "an integer for kind=int")
    return p


@dataclass
class TuneConfig(TrainConfig):
    """Primary config of ``ckpred tune``: a train config plus the search (``tune``)."""

    #: The train config's ``cv``, a scheme's own config (a :class:`CVConfig` subclass). Declared
    #: untyped here because ``tune.yaml`` merges this schema over the composed train config,
    #: and a typed field would turn the scheme's node back into the bare base class.
    cv: Any = MISSING
    tune: TuneSettings = field(default_factory=TuneSettings)


@dataclass
class SweepReportConfig:
    """Primary config of ``ckpred sweep-report``."""

    #: A multirun dir (``multirun/train/<time>``) or a tune run dir; searched recursively for jobs.
    dir: str = MISSING
    #: Sort key of the table (descending): ``mean`` or ``p10`` model efficiency.
    sort_by: str = "mean"
    #: Also write the table to ``<dir>/sweep_report.csv``.
    csv: bool = True

    def __post_init__(self) -> None:
        check("sort_by", self.sort_by, self.sort_by in SWEEP_SORT, f"one of {list(SWEEP_SORT)}")


@dataclass
class ReplayConfig:
    """Primary config of ``ckpred replay``."""

    #: A train run dir (its ``oof_predictions.parquet`` is replayed).
    run_dir: str = MISSING
    #: A train run whose out-of-fold predictions calibrate the confidence budget (e.g. CV on the
    #: training table of an external-test run); empty: cross-fitted over ``run_dir``'s own folds.
    calibration_run_dir: str = ""
    #: Fixed budgets (benchmarks per problem).
    ks: list[int] = field(default_factory=lambda: [1, 2, 3, 5])
    #: Confidence targets: P(measured best within ``within`` of the best).
    targets: list[float] = field(default_factory=lambda: [0.7, 0.8, 0.9, 0.95])
    #: Tolerance of the confidence budget (fraction of the best).
    within: float = 0.02
    #: The calibration's score gap: top score minus the ``gap_to``-th (as ``export``'s ``autotune.gap_to``).
    gap_to: int = 3
    #: Also replay the learned signal's budgets (:class:`ckpred.replay.Learned`, at ``targets``)
    #: and report each signal's ROC AUC.
    learned: bool = True
    #: Random candidate orders averaged for the random-order rows (0: none).
    seeds: int = 20
    #: Output folder (replay.md, replay.csv, replay.png); empty: ``<run_dir>/replay``.
    out: str = ""

    def __post_init__(self) -> None:
        check("ks", self.ks, len(self.ks) > 0 and all(int(k) >= 1 for k in self.ks), "a list of integers >= 1")
        check("targets", self.targets, all(0 < float(t) <= 1 for t in self.targets), "probabilities in (0, 1]")
        check("within", self.within, 0 < self.within < 1, "a fraction in (0, 1)")
        check("gap_to", self.gap_to, self.gap_to >= 2, "an integer >= 2")
        check("seeds", self.seeds, self.seeds >= 0, "an integer >= 0")


@dataclass
class PlanBudgetConfig:
    """How many measurements a plan asks for (``ckpred plan``'s ``budget``); a plan needs at least one
    of the three (:meth:`check_given`)."""

    #: Measurements in all (0 = no cap).
    total: int = 0
    #: Kernels measured per problem at most (0 = every candidate of a planned problem).
    per_problem: int = 0
    #: Problems this plan measures: a fraction of the candidate problems (< 1) or a count (>= 1);
    #: 0 = as many as ``total`` allows (every problem when only ``per_problem`` is given).
    problems: float = 0.0

    def __post_init__(self) -> None:
        for key in ("total", "per_problem"):
            value = getattr(self, key)
            check(f"budget.{key}", value, not isinstance(value, bool) and isinstance(value, int) and value >= 0,
                  "an integer >= 0 (0 = no limit)")
        p = self.problems
        check("budget.problems", p, not isinstance(p, bool) and isinstance(p, (int, float)) and math.isfinite(p)
              and p >= 0 and (p < 1 or float(p).is_integer()),
              "a fraction of the problems in (0, 1), a count >= 1, or 0 (as many as budget.total allows)")

    def check_given(self) -> None:
        """Refuse a budget of nothing (every key 0)."""
        check("budget", "total=0 per_problem=0 problems=0", bool(self.total or self.per_problem or self.problems),
              "at least one of budget.total (measurements in all), budget.per_problem (kernels per problem) or "
              "budget.problems (problems to measure)")

    def problem_count(self, n_problems: int) -> int | None:
        """Problems to plan out of ``n_problems`` candidate problems (None = limited by ``total`` only)."""
        if not self.problems:
            return None if self.total else n_problems
        if self.problems < 1:
            return max(1, int(round(self.problems * n_problems)))
        return int(self.problems)


#: ``auto``: uncertainty when the run was trained on rows of the new GPU, else stratified.
PLAN_PROBLEM_ORDERS: tuple[str, ...] = ("auto", "stratified", "uncertainty")
#: ``auto``: similarity when the run's table holds several GPUs and the new one has measurements.
PLAN_KERNEL_ORDERS: tuple[str, ...] = ("auto", "model", "similarity")


@dataclass
class PlanConfig:
    """Primary config of ``ckpred plan``: what to measure first on a new GPU (:mod:`ckpred.plan`)."""

    #: A finished train run dir (its pipeline, run record and training table).
    run_dir: str = MISSING
    #: The new GPU's arch config (``arch=<name>``).
    arch: ArchConfig = MISSING
    #: The new GPU's problems: a CSV or Parquet with the op's problem fields and, optionally, its
    #: kernel fields or ``kernel_name`` (one row per candidate pair); without kernel columns each
    #: problem is paired with every kernel of the run's table. Empty: the run's own problems.
    problems: str = ""
    #: Measurements already taken on the new GPU: filled plan files or ``ckpred ingest`` tables
    #: (a comma-separated string or a list); never planned again, and they steer the next round.
    measured: Any = field(default_factory=list)
    budget: PlanBudgetConfig = field(default_factory=PlanBudgetConfig)
    #: Order of the problems: ``stratified``, ``uncertainty`` (smallest score gap first) or ``auto``.
    problem_order: str = "auto"
    #: Order of a problem's kernels: ``model``, ``similarity`` (the source GPUs' orders weighted by
    #: their agreement with the new GPU's measurements) or ``auto``.
    kernel_order: str = "auto"
    #: Kernels planned for one problem are at least this far apart (standardised kernel-field units).
    min_distance: float = 1.0
    #: Seeds the order of problems within a stratum.
    seed: int = 0
    #: The plan CSV; an existing file is replaced only if it is a plan with nothing filled in.
    out: str = "plan.csv"

    def __post_init__(self) -> None:
        self.budget.check_given()
        check("problem_order", self.problem_order, self.problem_order in PLAN_PROBLEM_ORDERS,
              f"one of {list(PLAN_PROBLEM_ORDERS)}")
        check("kernel_order", self.kernel_order, self.kernel_order in PLAN_KERNEL_ORDERS,
              f"one of {list(PLAN_KERNEL_ORDERS)}")
        check("min_distance", self.min_distance, self.min_distance >= 0, "a number >= 0")
        check_seed("seed", self.seed)
        check_output_path("out", self.out, kind="file", required=True)
        items = self.measured if isinstance(self.measured, list) else [self.measured]
        check("measured", self.measured, all(isinstance(p, str) for p in items),
              "a file, a comma-separated list of files or a list of files")

    def measured_paths(self) -> list[str]:
        """``measured`` as a list of paths."""
        items = self.measured.split(",") if isinstance(self.measured, str) else list(self.measured)
        return [str(p).strip() for p in items if str(p).strip()]
