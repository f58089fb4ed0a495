"""CV schemes: registered objects that split a prepared table's shapes into folds.

A scheme is a :class:`CVScheme` subclass with a ``name`` (the ``cv.name`` of its config) and a
structured-config dataclass (a :class:`ckpred.schema.CVConfig` subclass) for its options,
registered with :func:`register_scheme`; its config file ``conf/cv/<name>.yaml`` starts from
the stored schema ``base_<name>`` (:func:`ckpred.config.register_schemas` stores one for every
registered scheme). Adding a scheme is that class and that file.

A scheme answers three questions for the driver (:mod:`ckpred.cv.driver`):

* which table the folds test (:meth:`CVScheme.test_data`: the training table itself, or a
  second table as ``external`` loads);
* the folds (:meth:`CVScheme.plan`): training shapes of the training table, test shapes of the
  test table, and optionally the arch whose constants the fold's test rows use
  (:attr:`Fold.test_arch`, for a scheme that holds out hardware);
* on a partitioned dataset, the ranges of a stable hash of the query key each fold holds out
  (:meth:`CVScheme.hash_ranges`; None when the scheme cannot run there).

This module is imported when the configs are registered, so it keeps to numpy and the schema;
what a plan needs beyond them is imported where it is used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Optional, Sequence, TypeVar

import numpy as np

from ckpred.errors import ConfigValueError
from ckpred.schema import ArchConfig, CVConfig, DataConfig, TrainConfig, arch_config, check

if TYPE_CHECKING:  # the fitting stage imports LightGBM; a plan only reads the prepared table
    import pandas as pd

    from ckpred.fitting import Prepared
    from ckpred.kernels.base import OpDefinition

log = logging.getLogger(__name__)

__all__ = ["CVScheme", "Fold", "register_scheme", "registered_schemes", "scheme_for", "make_folds",
           "GroupKFold", "Holdout", "External", "LeaveFamilyOut", "LeaveOneGpuOut"]


@dataclass
class Fold:
    """One split: shape indices of the training table and of the test table.

    ``test_arch`` is the arch config whose constants the test rows' validity rules and hardware
    features use; None = the test table's own (:attr:`ckpred.fitting.Prepared.arch`).
    """

    name: str
    train_shapes: np.ndarray
    test_shapes: np.ndarray
    test_arch: Optional[ArchConfig] = None


#: The config class of a scheme (``CVScheme[GroupKFoldConfig]`` reads ``self.cv.n_splits``).
C = TypeVar("C", bound=CVConfig)


class CVScheme(Generic[C]):
    """Base of every CV scheme; a subclass sets :attr:`name`, :attr:`config` and :meth:`plan`."""

    #: The ``cv.name`` this scheme answers to (the key of the registry).
    name: ClassVar[str] = ""
    #: The scheme's structured config (a :class:`ckpred.schema.CVConfig` subclass).
    config: ClassVar[type[CVConfig]] = CVConfig

    def __init__(self, cv: C) -> None:
        self.cv = cv

    def test_data(self, cfg: TrainConfig, op: OpDefinition, data: "Prepared") -> "Prepared":
        """The prepared table the folds test: the training table itself by default."""
        return data

    def plan(self, data: "Prepared", test: "Prepared", seed: int) -> list[Fold]:
        """Folds of shape indices (training shapes of ``data``, test shapes of ``test``)."""
        raise NotImplementedError(f"cv scheme {self.name!r} has no plan")

    def hash_ranges(self) -> list[tuple[float, float]] | None:
        """On a partitioned dataset: per fold the range of a stable hash in [0, 1) of the query
        key that the fold holds out; None = the scheme needs the table in one process."""
        return None

    def heading(self, group_key: Sequence[str], n_folds: int) -> str:
        """What the evaluation holds out, for every report: the grouping key and the folds."""
        return f"unseen ({', '.join(group_key)}) shapes, {n_folds} folds"


_SCHEMES: dict[str, type[CVScheme[Any]]] = {}

S = TypeVar("S", bound="type[CVScheme[Any]]")


def register_scheme(cls: S) -> S:
    """Register ``cls`` under ``cls.name`` (a class decorator); a name registered twice is refused."""
    if not cls.name or not issubclass(cls.config, CVConfig):
        raise TypeError(f"{cls.__name__}: a CV scheme needs a name and a CVConfig subclass as config")
    if _SCHEMES.get(cls.name, cls) is not cls:
        raise ValueError(f"cv scheme {cls.name!r} is registered already ({_SCHEMES[cls.name].__name__})")
    _SCHEMES[cls.name] = cls
    return cls


def registered_schemes() -> dict[str, type[CVScheme[Any]]]:
    """Every registered scheme by name, in registration order."""
    return dict(_SCHEMES)


def scheme_for(cv: CVConfig) -> CVScheme[Any]:
    """The scheme object of a ``cv`` config node.

    Raises
    ------
    ckpred.errors.ConfigValueError
        When no scheme of that name is registered.
    """
    name = str(cv.name)
    if name not in _SCHEMES:
        raise ConfigValueError("cv.name", name, f"one of the registered CV schemes {list(_SCHEMES)}")
    return _SCHEMES[name](cv)


def make_folds(cv: CVConfig, data: "Prepared", seed: int, test: "Prepared | None" = None) -> list[Fold]:
    """The folds of ``cv`` on ``data`` (and ``test``, for a scheme with its own test table)."""
    return scheme_for(cv).plan(data, data if test is None else test, seed)


def _cv_groups(data: "Prepared") -> tuple[np.ndarray, int, str]:
    """Each shape's CV group (shapes of one group always share a fold), the number of groups,
    and what they are called in a message."""
    n = data.groups.n_shapes
    groups = data.cv_groups if len(data.cv_groups) == n else np.arange(n)
    n_groups = len(np.unique(groups))
    unit = "shapes" if n_groups == n else f"CV groups (its {n} shapes grouped by the op's cv key)"
    return groups, n_groups, unit


# -- group k-fold ---------------------------------------------------------------------------------
@dataclass
class GroupKFoldConfig(CVConfig):
    """``cv=group_kfold``: K folds of CV groups; every shape is tested exactly once."""

    #: Number of folds.
    n_splits: int = 5
    #: Shuffle the groups (with ``seed``) before assigning folds.
    shuffle: bool = True

    def __post_init__(self) -> None:
        check("cv.n_splits", self.n_splits, self.n_splits >= 2, "an integer >= 2")


@register_scheme
class GroupKFold(CVScheme[GroupKFoldConfig]):
    """K folds of CV groups (scikit-learn's ``GroupKFold``)."""

    name = "group_kfold"
    config = GroupKFoldConfig

    def plan(self, data: "Prepared", test: "Prepared", seed: int) -> list[Fold]:
        # lazy: sklearn.model_selection costs ~1-3 s; the config registry imports this module
        from sklearn.model_selection import GroupKFold as Splitter

        groups, n_groups, unit = _cv_groups(data)
        k = int(self.cv.n_splits)
        if n_groups < k:
            raise ConfigValueError("cv.n_splits", k,
                                   f"an integer in [2, {n_groups}]: each fold tests one CV group at least, so n_splits "
                                   f"needs at least that many CV groups and the data has {n_groups} {unit}" if n_groups >= 2 else
                                   f"none: the data has {n_groups} {unit}, cross-validation needs at least 2")
        shuffle = bool(self.cv.shuffle)
        splitter = Splitter(n_splits=k, shuffle=shuffle, random_state=int(seed) if shuffle else None)
        idx = np.arange(data.groups.n_shapes)
        return [Fold(f"fold{i}", tr, te) for i, (tr, te) in enumerate(splitter.split(idx, groups=groups))]

    def hash_ranges(self) -> list[tuple[float, float]]:
        k = int(self.cv.n_splits)
        return [(i / k, (i + 1) / k) for i in range(k)]


# -- leave one family out -------------------------------------------------------------------------
@dataclass
class LeaveFamilyOutConfig(CVConfig):
    """``cv=leave_family_out``: one fold per family of the op (``op.family``)."""


@register_scheme
class LeaveFamilyOut(CVScheme[LeaveFamilyOutConfig]):
    """One fold per family: train without the family, test on it."""

    name = "leave_family_out"
    config = LeaveFamilyOutConfig

    def plan(self, data: "Prepared", test: "Prepared", seed: int) -> list[Fold]:
        family = data.shapes["family"].to_numpy()
        idx = np.arange(data.groups.n_shapes)
        names = list(dict.fromkeys(family))  # in order of first appearance
        folds = [Fold(f"without_{f}", idx[family != f], idx[family == f]) for f in names]
        folds = [f for f in folds if len(f.train_shapes) and len(f.test_shapes)]
        if not folds:
            others = ", ".join(n for n in _SCHEMES if n != self.name)
            raise ConfigValueError("cv", self.name, f"a cv that splits shapes ({others}): leave_family_out needs "
                                   f"shapes of at least two families and the data has only {names}")
        return folds

    def heading(self, group_key: Sequence[str], n_folds: int) -> str:
        return f"unseen ({', '.join(group_key)}) shapes, one fold per held-out family ({n_folds} folds)"


# -- leave one GPU out -----------------------------------------------------------------------------
@dataclass
class LeaveOneGpuOutConfig(CVConfig):
    """``cv=leave_one_gpu_out``: one fold per GPU of the table (its ``arch`` column)."""


@register_scheme
class LeaveOneGpuOut(CVScheme[LeaveOneGpuOutConfig]):
    """One fold per GPU: train on every row of the other GPUs, test on every row of this one,
    featurised and checked with its own arch config (:attr:`Fold.test_arch`).

    The GPUs are the arch names of the table's ``arch`` column (a reader that gives each row its
    GPU's arch: Kernel Tuner caches of several GPUs, or files ingested with different archs).
    """

    name = "leave_one_gpu_out"
    config = LeaveOneGpuOutConfig

    def plan(self, data: "Prepared", test: "Prepared", seed: int) -> list[Fold]:
        if not data.multi_arch:
            names = data.arch_names()
            raise ConfigValueError("cv", self.name,
                                   f"a table of at least two GPUs: leave_one_gpu_out holds one GPU out per fold, and "
                                   f"the rows' arch column names only {names} (a reader that records each row's "
                                   "GPU, e.g. Kernel Tuner caches of several GPUs; or another cv)")
        idx = np.arange(data.groups.n_shapes)
        folds = []
        for i, arch in enumerate(data.archs):
            held = data.shape_arch == i
            if held.any() and (~held).any():
                folds.append(Fold(f"without_{arch.name}", idx[~held], idx[held], test_arch=arch))
        return folds

    def heading(self, group_key: Sequence[str], n_folds: int) -> str:
        return f"unseen GPUs (each GPU's ({', '.join(group_key)}) shapes), one fold per held-out GPU ({n_folds} folds)"


# -- hold-out -------------------------------------------------------------------------------------
@dataclass
class HoldoutConfig(CVConfig):
    """``cv=holdout``: one split, a seeded fraction of the CV groups is the test set."""

    #: Fraction of the CV groups in the test set.
    test_fraction: float = 0.2

    def __post_init__(self) -> None:
        check("cv.test_fraction", self.test_fraction, 0 < self.test_fraction < 1, "a number in (0, 1)")


@register_scheme
class Holdout(CVScheme[HoldoutConfig]):
    """One split of CV groups (scikit-learn's ``GroupShuffleSplit``)."""

    name = "holdout"
    config = HoldoutConfig

    def plan(self, data: "Prepared", test: "Prepared", seed: int) -> list[Fold]:
        # lazy: sklearn.model_selection costs ~1-3 s; the config registry imports this module
        from sklearn.model_selection import GroupShuffleSplit

        groups, n_groups, unit = _cv_groups(data)
        fraction = float(self.cv.test_fraction)
        # GroupShuffleSplit's sizes: ceil(fraction * groups) test groups, the rest train.
        n_test = int(np.ceil(fraction * n_groups))
        if n_groups < 2 or n_test >= n_groups:
            top = (n_groups - 1) / n_groups if n_groups >= 2 else 0.0
            raise ConfigValueError("cv.test_fraction", fraction,
                                   f"a number in (0, {top:.4g}]: the data has {n_groups} {unit} and the fraction "
                                   "must leave at least one to train on" if n_groups >= 2 else
                                   f"none: the data has {n_groups} {unit}, a hold-out split needs at least 2")
        splitter = GroupShuffleSplit(n_splits=1, test_size=fraction, random_state=int(seed))
        tr, te = next(splitter.split(np.arange(data.groups.n_shapes), groups=groups))
        return [Fold("holdout", tr, te)]

    def hash_ranges(self) -> list[tuple[float, float]]:
        return [(0.0, float(self.cv.test_fraction))]

    def heading(self, group_key: Sequence[str], n_folds: int) -> str:
        return f"unseen ({', '.join(group_key)}) shapes, 1 holdout split ({float(self.cv.test_fraction):.0%} of them)"


# -- external -------------------------------------------------------------------------------------
@dataclass
class ExternalConfig(CVConfig):
    """``cv=external``: train on the config's ``data``, test on a second table."""

    #: The test table (merged over ``data``: only what differs needs to be given).
    data: Optional[DataConfig] = None
    #: The test table's arch (``+arch@cv.arch=<name>``); null = the packaged arch named by the
    #: table's ``arch`` column, else the training arch. Its constants drive the test table's
    #: validity rules and hardware features.
    arch: Optional[ArchConfig] = None

    def __post_init__(self) -> None:
        check("cv.data", self.data, self.data is not None,
              "a data source to test on (cv.data.source=path cv.data.path=<files>)")


@register_scheme
class External(CVScheme[ExternalConfig]):
    """One fold: every shape of the training table against every shape of a second table."""

    name = "external"
    config = ExternalConfig

    def data_config(self, cfg: TrainConfig) -> TrainConfig:
        """The train config with ``cv.data`` in place of ``data``: what the test table loads
        (``cv.data`` holds every key of a data config, its schema's default where not given, so
        merging it over ``data`` amounted to the same)."""
        assert self.cv.data is not None  # ExternalConfig refuses a scheme without it
        return replace(cfg, data=self.cv.data)

    def test_arch(self, train_arch: ArchConfig, table: pd.DataFrame) -> ArchConfig:
        """``cv.arch`` when given, else the packaged arch config named by the table's ``arch``
        column when it holds one name other than the training arch's, else the training arch
        (a table of several GPUs then keeps each row's own)."""
        if self.cv.arch is not None:
            return self.cv.arch
        names = table["arch"].astype(str).unique() if "arch" in table else []
        if len(names) == 1 and names[0] != train_arch.name:
            log.info("cv=external: the test table's arch is %s (its own hardware constants)", names[0])
            return arch_config(str(names[0]))
        return train_arch

    def test_data(self, cfg: TrainConfig, op: OpDefinition, data: "Prepared") -> "Prepared":
        # lazy: the readers (~0.7 s) and the fitting stage (LightGBM, ~2 s) are not for the config registry
        from ckpred.data import load_table
        from ckpred.fitting import prepare  # lazy: as above

        table = load_table(self.data_config(cfg))
        # cv.arch names the arch of every test row; without it each row keeps its own
        return prepare(table, op, cfg, arch=self.test_arch(cfg.arch, table),
                       own_archs=getattr(self.cv, "arch", None) is None)

    def plan(self, data: "Prepared", test: "Prepared", seed: int) -> list[Fold]:
        return [Fold("external", np.arange(data.groups.n_shapes), np.arange(test.groups.n_shapes))]

    def heading(self, group_key: Sequence[str], n_folds: int) -> str:
        return f"a second table's ({', '.join(group_key)}) shapes, model trained on the first"
