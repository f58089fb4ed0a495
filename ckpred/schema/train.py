"""Schemas of training: ``model``, ``target``, ``cv``, baselines, validity and transfer, the
recipe every fitting command shares (:class:`RecipeConfig`) and ``train`` itself."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from omegaconf import MISSING, OmegaConf

from ckpred.errors import check
from ckpred.schema.arch import ArchConfig, DtypeConfig, LayoutConfig, check_arch_dtype
from ckpred.schema.base import check_output_path, check_positive, check_seed, check_threads
from ckpred.schema.data import DataConfig, FeaturesConfig, ShapesConfig
from ckpred.schema.op import OpConfig


# -- train: models, targets, cv, baselines ----------------------------------------------------
MODEL_NAMES: tuple[str, ...] = ("lgbm_regressor", "lgbm_ranker")
TARGET_NAMES: tuple[str, ...] = ("log1p", "raw", "relative")
RANK_OBJECTIVES: tuple[str, ...] = ("lambdarank", "rank_xendcg")
LABEL_GAINS: tuple[str, ...] = ("exp2", "linear")
MODEL_BACKENDS: tuple[str, ...] = ("local", "dask")
#: ``model.<key>`` read by ``lgbm_ranker`` only.
RANKER_KEYS: tuple[str, ...] = ("relevance_grades", "relevance_exponent", "max_rows_per_query", "objective",
                                "label_gain")


@dataclass
class DaskConfig:
    """The Dask cluster of ``model.backend=dask`` (see :mod:`ckpred.scale`)."""

    #: Scheduler address of a running cluster (``tcp://host:8786``); null starts a local cluster.
    address: Optional[str] = None
    #: Local cluster: worker processes (one thread each).
    n_workers: int = 2
    #: Local cluster: memory limit of each worker (Dask's pause/spill/kill thresholds apply to it).
    memory_limit: str = "4GiB"
    #: Seconds to reach the scheduler at ``address`` and hear its handshake before the run is
    #: refused (a running scheduler answers within milliseconds).
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        check("model.dask.n_workers", self.n_workers, self.n_workers >= 1, "an integer >= 1")
        check("model.dask.timeout_s", self.timeout_s, 0 < self.timeout_s <= 3600, "seconds in (0, 3600]")
        check("model.dask.address", self.address, self.address is None or "://" in str(self.address),
              "null (start a local cluster) or a scheduler address such as tcp://host:8786")


@dataclass
class ModelConfig:
    """A LightGBM estimator and its hyperparameters (see :func:`ckpred.models.build_pipeline`)."""

    #: ``lgbm_regressor`` (through the target transform) or ``lgbm_ranker`` (lambdarank by shape).
    name: str = MISSING
    n_estimators: int = 500
    learning_rate: float = 0.05
    num_leaves: int = 63
    #: -1 = no depth limit.
    max_depth: int = -1
    min_child_samples: int = 20
    #: Row subsampling (bagging) fraction; takes effect when ``subsample_freq`` > 0.
    subsample: float = 1.0
    subsample_freq: int = 0
    #: Feature subsampling per tree (LightGBM ``feature_fraction``).
    colsample_bytree: float = 0.8
    reg_alpha: float = 0.0
    reg_lambda: float = 0.0
    min_split_gain: float = 0.0
    #: Histogram bins per feature (LightGBM ``max_bin``).
    max_bin: int = 255
    #: LightGBM threads. One by default: more only pay on a machine whose cores are free, and on
    #: a busy one OpenMP's waiting threads take the cores from the working ones (the metrics
    #: are the same; docs/results.md, "Threads").
    n_jobs: int = 1
    #: Stop when the validation score has not improved for this many rounds (0 = off). The
    #: validation set is a fraction of the *training* shapes, never the test fold.
    early_stopping_rounds: int = 0
    #: Fraction of training shapes held out for early stopping.
    validation_fraction: float = 0.15
    #: Ranker: number of relevance grades (LightGBM's default label_gain covers 0..30).
    relevance_grades: int = 31
    #: Ranker: grade = round((grades - 1) * (perf / best) ** relevance_exponent); > 1 spends
    #: more grades near the best kernel.
    relevance_exponent: float = 3.0
    #: Ranker: rows per query (shape) at most; LightGBM's lambdarank refuses > 10000.
    max_rows_per_query: int = 10000
    #: Ranker: LightGBM ranking objective (``lambdarank`` or ``rank_xendcg``).
    objective: str = "lambdarank"
    #: Ranker: gain of relevance grade i, ``exp2`` (2**i - 1, LightGBM's default) or ``linear`` (i).
    label_gain: str = "exp2"
    #: ``local``: fit in this process. ``dask``: fit on a Dask cluster (``model.dask``): a
    #: partitioned Parquet dataset through LightGBM's Dask interface, or the CV folds of an
    #: in-memory table as tasks on the cluster (:mod:`ckpred.scale`).
    backend: str = "local"
    dask: DaskConfig = field(default_factory=DaskConfig)

    def __post_init__(self) -> None:
        check("model.name", self.name, self.name in MODEL_NAMES, f"one of {list(MODEL_NAMES)}")
        check("model.backend", self.backend, self.backend in MODEL_BACKENDS, f"one of {list(MODEL_BACKENDS)}")
        check("model.n_estimators", self.n_estimators, self.n_estimators >= 1, "an integer >= 1")
        check("model.learning_rate", self.learning_rate, 0 < self.learning_rate <= 1, "a number in (0, 1]")
        check("model.num_leaves", self.num_leaves, 2 <= self.num_leaves <= 131072,
              "an integer in [2, 131072]")
        check("model.max_depth", self.max_depth, self.max_depth == -1 or self.max_depth >= 1,
              "-1 (no limit) or an integer >= 1")
        check("model.min_child_samples", self.min_child_samples, self.min_child_samples >= 1,
              "an integer >= 1")
        check("model.subsample", self.subsample, 0 < self.subsample <= 1, "a number in (0, 1]")
        check("model.subsample_freq", self.subsample_freq, self.subsample_freq >= 0, "an integer >= 0")
        check("model.colsample_bytree", self.colsample_bytree, 0 < self.colsample_bytree <= 1,
              "a number in (0, 1]")
        check_positive("model", self, ("reg_alpha", "reg_lambda", "min_split_gain",
                                       "early_stopping_rounds"), allow_zero=True)
        check("model.max_bin", self.max_bin, 2 <= self.max_bin <= 65535, "an integer in [2, 65535]")
        check_threads("model.n_jobs", self.n_jobs)
        check("model.validation_fraction", self.validation_fraction, 0 < self.validation_fraction < 1,
              "a number in (0, 1)")
        check("model.relevance_grades", self.relevance_grades, 2 <= self.relevance_grades <= 31,
              "an integer in [2, 31]")
        check("model.relevance_exponent", self.relevance_exponent, self.relevance_exponent > 0,
              "a number > 0")
        check("model.max_rows_per_query", self.max_rows_per_query, 1 <= self.max_rows_per_query <= 10000,
              "an integer in [1, 10000] (LightGBM lambdarank limit)")
        check("model.objective", self.objective, self.objective in RANK_OBJECTIVES, f"one of {list(RANK_OBJECTIVES)}")
        check("model.label_gain", self.label_gain, self.label_gain in LABEL_GAINS, f"one of {list(LABEL_GAINS)}")

    def unused_keys(self) -> dict[str, str]:
        """Keys this model does not read, each with what would read it (:func:`ckpred.config.unused_keys`)."""
        out: dict[str, str] = {}
        if self.name != "lgbm_ranker":
            out.update(dict.fromkeys(RANKER_KEYS, f"model={self.name} does not read it (a ranker's key: select "
                                                  "model=lgbm_ranker)"))
        if self.backend != "dask":
            out["dask"] = "model.backend=local does not read it (set model.backend=dask)"
        if not self.early_stopping_rounds:
            out["validation_fraction"] = ("model.early_stopping_rounds=0 does not read it (early stopping is off; "
                                          "set model.early_stopping_rounds=<rounds>)")
        return out


@dataclass
class TargetConfig:
    """What a regressor learns: ``log1p`` / ``raw`` TFLOPS or ``relative`` = log(perf / best)."""

    name: str = MISSING
    #: ``relative``: perf / best is clipped to at least this before the log (failed rows).
    floor: float = 1e-3

    def __post_init__(self) -> None:
        check("target.name", self.name, self.name in TARGET_NAMES, f"one of {list(TARGET_NAMES)}")
        check("target.floor", self.floor, 0 < self.floor < 1, "a number in (0, 1)")

    def unused_keys(self) -> dict[str, str]:
        """Keys this target does not read, each with what would read it (:func:`ckpred.config.unused_keys`)."""
        if self.name != "relative":
            return {"floor": f"target={self.name} does not read it (select target=relative)"}
        return {}


@dataclass
class CVConfig:
    """How shapes are split into train and test (folds never split a shape's rows).

    The base of every CV scheme's config: each scheme (:mod:`ckpred.cv.schemes`) subclasses it
    with its own options, and ``conf/cv/<name>.yaml`` starts from that schema (``base_<name>``).
    """

    #: The registered scheme that plans the folds (``group_kfold``, ``holdout``, ...).
    name: str = MISSING


@dataclass
class RowsConfig:
    """Which rows a model trains on (evaluation always uses every row of a test shape)."""

    #: Drop rows the op's validity rules reject: the selector masks them anyway. Rows that
    #: pass the rules but failed when measured stay, with perf 0.
    drop_rule_invalid: bool = True
    #: Rows kept per training shape at most (0 = all): the ``keep_top`` fastest, then a seeded
    #: uniform sample of the rest. The default keeps 512 of the ~3,800 runnable gemm_universal
    #: kernels of a shape, so a fit sees every shape's fast kernels and a spread of slow ones.
    max_per_shape: int = 512
    keep_top: int = 128

    def __post_init__(self) -> None:
        check_positive("rows", self, ("max_per_shape", "keep_top"), allow_zero=True)


@dataclass
class ReferenceBaselineConfig:
    """The reference system's replica, trained on the same folds as the model."""

    enabled: bool = True
    #: None when the op has no ``features/reference_<op>`` set: the run skips the reference.
    features: Optional[FeaturesConfig] = None
    model: ModelConfig = MISSING
    target: TargetConfig = MISSING
    rows: RowsConfig = field(default_factory=RowsConfig)


@dataclass
class PlainBaselineConfig:
    """Plain LightGBM: default parameters on the model's features and training rows, early
    stopping on inner validation shapes; the reference every report shows the margin to."""

    enabled: bool = True
    model: ModelConfig = MISSING
    target: TargetConfig = MISSING


@dataclass
class BaselinesConfig:
    """Baselines computed in the same run on the same folds as the model."""

    random: bool = True
    best_static: bool = True
    #: Problem fields the best-static order is learned per (one order per value combination,
    #: e.g. ``[direction, dtype]``); empty = one order for all problems.
    best_static_by: list[str] = field(default_factory=list)
    analytical: bool = True
    plain: PlainBaselineConfig = field(default_factory=PlainBaselineConfig)
    reference: ReferenceBaselineConfig = field(default_factory=ReferenceBaselineConfig)


@dataclass
class ValidityModelConfig:
    """The learned validity mask: failures seen in the training data (:func:`ckpred.models.fit_failure_model`).

    It learns on the model's own training rows (``rows``: rule-valid rows of the training
    shapes, failed ones included) and features.
    """

    #: Learn a failure model next to the ranking model (kept only when it flags a training row).
    learned: bool = True
    #: A row is predicted to fail when the estimated failure probability exceeds this.
    threshold: float = 0.5
    n_estimators: int = 50
    num_leaves: int = 15
    min_child_samples: int = 20
    n_jobs: int = 1

    def __post_init__(self) -> None:
        check("validity.threshold", self.threshold, 0 < self.threshold < 1, "a number in (0, 1)")
        for key in ("n_estimators", "min_child_samples", "n_jobs"):
            check(f"validity.{key}", getattr(self, key), getattr(self, key) >= 1, "an integer >= 1")
        check("validity.num_leaves", self.num_leaves, self.num_leaves >= 2, "an integer >= 2")


#: ``transfer.mode`` values.
TRANSFER_MODES = ("auto", "on", "off")


@dataclass
class TransferConfig:
    """The transfer recipe (:mod:`ckpred.transfer`): the run's ``model`` when it picks kernels
    for GPUs its training rows do not come from.

    Its learner is ``baselines.plain`` (model and target) on the model's features and rows,
    blended with the static order of the training GPUs by a weight an inner leave-one-GPU-out
    split chooses.
    """

    #: ``auto``: the model of a run in which every fold tests GPUs its training rows do not
    #: have (``cv=leave_one_gpu_out``; ``cv=external`` onto another arch; k-fold over GPUs);
    #: ``on``: always; ``off``: never (the ``model`` recipe).
    mode: str = "auto"
    #: Blend weights of the static order the inner split chooses among (ties: the smaller); a
    #: single weight is used as it is.
    weights: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])

    def __post_init__(self) -> None:
        check("transfer.mode", self.mode, self.mode in TRANSFER_MODES, f"one of {list(TRANSFER_MODES)}")
        check("transfer.weights", self.weights, len(self.weights) > 0 and
              all(isinstance(w, (int, float)) and not isinstance(w, bool) and 0 <= w <= 1 for w in self.weights)
              and len(set(self.weights)) == len(self.weights), "a non-empty list of distinct numbers in [0, 1]")


@dataclass
class ApplicabilityConfig:
    """The learned applicability mask of an op whose table lists only the kernels that apply to
    each problem (``op.absence=not_applicable``; :func:`ckpred.fitting.fit_applicability`).

    It learns, on the model's features of every rule-valid (problem, catalogue kernel) pair of
    the training problems, which pairs the table holds no row for; the selector then ranks only
    the kernels predicted to apply. Unused for ``op.absence=unknown``.
    """

    #: Estimates of "absent" above which a kernel is masked, tried on ``inner_folds`` folds of
    #: the training problems; the one with the highest strict efficiency there is used.
    thresholds: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])
    #: Inner folds (by CV group) the threshold is chosen on: each fits the model and the mask on
    #: the others and scores its own problems.
    inner_folds: int = 3
    #: Larger than the failure model's: on MIOpen's gfx90a find-db (60 solvers, 1-4 listed per
    #: problem) 500 trees of 63 leaves leave 2.7% unmeasured picks where 200 of 31 leave 3.8%
    #: and 50 of 15 more (scripts/research/unmeasured_picks.py); on gfx942 and the sparse
    #: simulated table 200 of 31 and more leave none.
    n_estimators: int = 500
    num_leaves: int = 63
    min_child_samples: int = 5
    #: Training pairs at most (a seeded sample of whole problems beyond it): a table of 100k
    #: problems and 60 kernels has 6M pairs, whose features would not fit in memory.
    max_rows: int = 1_000_000
    n_jobs: int = 1

    def __post_init__(self) -> None:
        check("applicability.thresholds", self.thresholds,
              bool(self.thresholds) and all(0 < float(t) < 1 for t in self.thresholds),
              "a non-empty list of numbers in (0, 1)")
        check("applicability.inner_folds", self.inner_folds, self.inner_folds >= 2, "an integer >= 2")
        for key in ("n_estimators", "min_child_samples", "n_jobs", "max_rows"):
            check(f"applicability.{key}", getattr(self, key), getattr(self, key) >= 1, "an integer >= 1")
        check("applicability.num_leaves", self.num_leaves, self.num_leaves >= 2, "an integer >= 2")


@dataclass
class RecipeConfig:
    """What a model is made of: hardware, op, data, features, model, target, training rows.

    Shared by the commands that fit a model (``train``, ``tune``, ``export``), so an export
    without ``run_dir`` fits exactly the model ``train`` would save.
    """

    arch: ArchConfig = MISSING
    dtype: DtypeConfig = MISSING
    layout: LayoutConfig = MISSING
    op: OpConfig = MISSING
    data: DataConfig = MISSING
    #: Shape set of the simulator (``data.source=simulated``).
    shapes: ShapesConfig = MISSING
    features: FeaturesConfig = MISSING
    model: ModelConfig = MISSING
    target: TargetConfig = MISSING
    rows: RowsConfig = field(default_factory=RowsConfig)
    #: Failures seen in the training data, masked by the selector (see :class:`ValidityModelConfig`).
    validity: ValidityModelConfig = field(default_factory=ValidityModelConfig)
    #: Kernels a sparse table does not list for a problem, masked by the selector (see
    #: :class:`ApplicabilityConfig`; only for ``op.absence=not_applicable``).
    applicability: ApplicabilityConfig = field(default_factory=ApplicabilityConfig)
    #: Seed of fold assignment, validation split, row sampling and LightGBM.
    seed: int = 0
    #: ``train``'s CV scheme and baselines: composed by every command that takes ``experiment=``
    #: (an experiment may set them), read by ``train`` and ``tune`` only.
    cv: Any = None
    baselines: Any = None

    def __post_init__(self) -> None:
        check_arch_dtype(self.arch, self.dtype)
        check_seed("seed", self.seed)
        if "data" not in self.unused_keys():
            self.data.check_path()

    def unused_keys(self) -> dict[str, str]:
        """Nodes this command does not read, each with what would read it (:func:`ckpred.config.unused_keys`)."""
        out = {key: f"{self.command} does not read it (train and tune do; it is composed so that "
                    "experiment=<name> composes here too)" for key in ("cv", "baselines")}
        if isinstance(self.model, ModelConfig) and self.model.name == "lgbm_ranker":
            out["target"] = ("model=lgbm_ranker does not read it (it learns relevance grades of perf / best); "
                             "select model=lgbm_regressor to train on a target")
        if not self.simulates():
            out["shapes"] = ("data.source=path does not read it (the simulator's shape set: select "
                             "data=simulated)")
        return out

    #: The command's name, for messages.
    command = "this command"

    def simulates(self) -> bool:
        """Whether a table of this config comes from the simulator (which reads ``shapes``)."""
        return getattr(self.data, "source", None) == "simulated"


@dataclass
class TrainConfig(RecipeConfig):
    """Primary config of ``ckpred train``."""

    command = "train"

    cv: CVConfig = MISSING
    baselines: BaselinesConfig = field(default_factory=BaselinesConfig)
    #: The model of a run that picks kernels for GPUs it does not train on.
    transfer: TransferConfig = field(default_factory=TransferConfig)
    #: Output folder; empty = Hydra's run dir (``runs/train/<time>``). Under ``-m`` each job
    #: writes to ``<out_dir>/<job number>``.
    out_dir: str = ""
    #: Fit the final pipeline on all data and save it (``pipeline.joblib``).
    save_pipeline: bool = True
    #: Write the PNG plots.
    plots: bool = True
    #: Show progress bars and the summary table on the console.
    progress: bool = True
    #: A finished train run dir whose ``pipeline.joblib`` this run continues boosting from
    #: (``model.n_estimators`` trees are *added*); empty = cold start. See :mod:`ckpred.warm_start`.
    warm_start: str = ""
    #: Several seeds (e.g. ``seeds=[0,1,2]``) run the whole CV once per seed and
    #: report the spread over seeds; empty = ``seed`` alone.
    seeds: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_output_path("out_dir", self.out_dir, kind="dir")

    def unused_keys(self) -> dict[str, str]:
        out = {k: v for k, v in super().unused_keys().items() if k not in ("cv", "baselines")}
        test_data = getattr(self.cv, "data", None)  # cv=external's test table
        if out.get("shapes") and self.cv.name == "external" and getattr(test_data, "source", None) == "simulated":
            del out["shapes"]  # the external test table is simulated
        return out


def saved_recipe(saved: Mapping[str, Any] | Path) -> RecipeConfig:
    """The recipe of a finished run's config (its run record's ``config``, or the file
    ``.hydra/config.yaml``) as a :class:`~ckpred.schema.RecipeConfig`.

    The keys of the run's own command outside the recipe (``out_dir``, ``plots``...) are left out;
    ``cv`` and ``baselines`` stay plain mappings. The values are checked as composing checks them.
    """
    raw = OmegaConf.to_container(OmegaConf.load(saved) if isinstance(saved, Path) else OmegaConf.create(dict(saved)))
    assert isinstance(raw, dict)
    keys = {f.name for f in dataclasses.fields(RecipeConfig)}
    node = OmegaConf.merge(OmegaConf.structured(RecipeConfig), {k: v for k, v in raw.items() if k in keys})
    out: RecipeConfig = OmegaConf.to_object(node)  # type: ignore[assignment]
    return out
