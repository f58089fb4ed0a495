"""Schemas of the data groups: ``data`` (where a table comes from), ``features``, ``shapes`` and
the ``simulate`` command."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from ckpred.errors import check
from ckpred.schema.arch import ArchConfig, DtypeConfig, LayoutConfig, check_arch_dtype
from ckpred.schema.base import DATA_FORMATS, DATA_SOURCES, check_output_path, check_seed
from ckpred.schema.op import OpConfig


@dataclass
class DataConfig:
    """Where the benchmark table comes from."""

    #: ``simulated`` (the embedded default) or ``path`` (measurement files).
    source: str = "simulated"
    #: Files or globs for ``source=path``; a comma-separated string or a list.
    path: Any = None
    #: Reader to use; ``auto`` detects it from the file's content.
    format: str = "auto"
    #: Where generated or ingested tables are cached, relative to the original working dir;
    #: the environment variable CKPRED_CACHE_DIR, when set, replaces the default.
    cache_dir: str = "${oc.env:CKPRED_CACHE_DIR,data/cache}"
    #: Seed of the simulator's noise and kernel idiosyncrasies.
    seed: int = 0
    #: MiB of a measurement file read, checked and (for ``ckpred ingest``) written per chunk;
    #: ingestion's memory follows it, not the size of the files.
    chunk_mb: int = 64

    def __post_init__(self) -> None:
        check("data.source", self.source, self.source in DATA_SOURCES, f"one of {list(DATA_SOURCES)}")
        check("data.chunk_mb", self.chunk_mb, isinstance(self.chunk_mb, int) and not isinstance(self.chunk_mb, bool)
              and self.chunk_mb >= 1, "an integer >= 1 (MiB per chunk)")
        check("data.format", self.format, self.format in DATA_FORMATS, f"one of {list(DATA_FORMATS)}")
        check_seed("data.seed", self.seed)

    def check_path(self, key: str = "data") -> None:
        """Refuse ``source=path`` without files (checked by the commands that read the data:
        ``select`` composes a recipe's data without reading it)."""
        if self.source == "path":
            check(f"{key}.path", self.path, bool(self.path), f"one or more files or globs ({key}.path=<file or glob>)")

    def unused_keys(self) -> dict[str, str]:
        """Keys this source does not read, each with what would read it (:func:`ckpred.config.unused_keys`)."""
        if self.source == "simulated":
            why = "data.source=simulated does not read it (select data=path to read measurement files)"
            return {"path": why, "format": why, "chunk_mb": why}
        return {"seed": "it seeds the simulator, and data.source=path does not simulate (select data=simulated)"}


# -- features (ckpred.features) -------------------------------------------------------------------
@dataclass
class FeatureGroupConfig:
    """One feature group of a feature set: which transformer, its name and its options."""

    #: ``expressions``, a declared or built-in group (``ckpred.features.registry``) or
    #: ``package.module:Class`` of a FeatureGroup.
    kind: str = MISSING
    #: Name in the FeatureUnion, the prefix of its output names (default: the kind, or the
    #: class name of a ``module:Class`` kind).
    name: Optional[str] = None
    #: Constructor parameters set by YAML (hardware/dtype constants come from arch/dtype); an
    #: expression group takes ``features``, ``terms``, ``one_hot`` (and ``exclude`` when declared).
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class FeaturesConfig:
    """A named feature set: the groups of the model's FeatureUnion, in output order."""

    name: str = MISSING
    groups: list[FeatureGroupConfig] = field(default_factory=list)

    def __post_init__(self) -> None:
        # lazy: ckpred.features (the package of the registry) imports scikit-learn
        from ckpred.features.registry import check_kind, default_name

        check("features.groups", self.groups, len(self.groups) > 0, "a non-empty list of groups")
        seen: set[str] = set()
        for i, group in enumerate(self.groups):
            check_kind(f"features.groups[{i}].kind", group.kind)
            name = group.name or default_name(group.kind)
            check(f"features.groups[{i}].name", name, name.isidentifier(),
                  "a name of letters, digits and _ (the prefix of the group's feature names)")
            check(f"features.groups[{i}].name", name, name not in seen,
                  "each group name at most once per feature set (set name: to tell two apart)")
            seen.add(name)


# -- shapes and simulate ----------------------------------------------------------------------
@dataclass
class ShapeFamilyConfig:
    """One rule of a shape set (see :mod:`ckpred.data.shapes`)."""

    m: list[int] = field(default_factory=list)
    n: list[int] = field(default_factory=list)
    k: list[int] = field(default_factory=list)
    #: Explicit (N, K) pairs; used instead of ``n`` x ``k`` when given.
    nk: list[list[int]] = field(default_factory=list)
    #: Zip ``m``, ``n``, ``k`` element-wise instead of taking their product.
    zip: bool = False
    #: Keep this many evenly spaced shapes of the family (0 = all).
    count: int = 0


@dataclass
class ShapesConfig:
    """A named set of problem shapes for the simulator: rule families or a CSV file."""

    name: str = MISSING
    families: dict[str, ShapeFamilyConfig] = field(default_factory=dict)
    #: CSV with M, N, K columns (``shapes=file shapes.path=<csv>``); wins over ``families``.
    path: str = ""
    #: Cap on the number of shapes (evenly spaced subset; 0 = no cap).
    max_shapes: int = 0

    def __post_init__(self) -> None:
        check("shapes.max_shapes", self.max_shapes, self.max_shapes >= 0, "an integer >= 0 (0 = no cap)")
        check("shapes.path", self.path, bool(self.path) or bool(self.families),
              "a CSV with M,N,K columns (shapes.path=<csv>) when the set has no families")
        for fname, fam in self.families.items():
            key = f"shapes.families.{fname}"
            check(f"{key}.m", fam.m, len(fam.m) > 0, "a non-empty list of positive integers")
            for dim in ("m", "n", "k"):
                values = getattr(fam, dim)
                check(f"{key}.{dim}", values, all(v >= 1 for v in values), "positive integers")
            for i, pair in enumerate(fam.nk):
                check(f"{key}.nk[{i}]", pair, len(pair) == 2 and all(v >= 1 for v in pair),
                      "an [N, K] pair of positive integers")
            if fam.zip:
                for dim in ("n", "k"):
                    values = getattr(fam, dim)
                    check(f"{key}.{dim}", values, len(values) in (0, len(fam.m)),
                          f"empty (same as m) or {len(fam.m)} values like m when zip=true")
            else:
                check(f"{key}.nk", fam.nk, bool(fam.nk) or (bool(fam.n) and bool(fam.k)),
                      "[N, K] pairs, or non-empty n and k lists")
            check(f"{key}.count", fam.count, fam.count >= 0, "an integer >= 0 (0 = all)")


@dataclass
class SimulateConfig:
    """Primary config of ``ckpred simulate``."""

    arch: ArchConfig = MISSING
    dtype: DtypeConfig = MISSING
    layout: LayoutConfig = MISSING
    op: OpConfig = MISSING
    data: DataConfig = MISSING
    shapes: ShapesConfig = MISSING
    #: Output parquet file of the canonical table.
    out: str = "simulated.parquet"
    #: Also write the streaming-log benchmark format here (empty = no log).
    log: str = ""
    #: Print the calibration report against real measurements instead of only simulating.
    calibrate: bool = False
    #: Real oracle-best table (m, n, k, oracle_best_tflops, oracle_best_kernel) to calibrate on.
    calibration_file: str = "data/ck_gemm_gfx950_results/p1_oracle_best_results.csv"

    def __post_init__(self) -> None:
        check_arch_dtype(self.arch, self.dtype)
        check_output_path("out", self.out, kind="file", required=True)
        check_output_path("log", self.log, kind="file")
