"""Structured-config schemas for every config group, registered in Hydra's ConfigStore.

Every YAML option of a group starts with ``defaults: [base_<group>, _self_]`` so Hydra checks
its keys and types against the dataclass below when the config is composed. Value rules that a
type cannot express (ranges, allowed names) live in ``__post_init__`` and run when
:func:`ckpred.config.to_object` turns the composed config into these dataclasses; their errors
name the key, the bad value and what is allowed.

Adding a config group means adding its dataclass here and registering it in :func:`register`;
adding an *option* to a group is only a YAML file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from ckpred.errors import ConfigValueError

#: Names the CK Tile kernel space and the simulator understand.
DTYPES: tuple[str, ...] = ("fp8", "bf8", "fp16", "bf16", "fp32")
LAYOUTS: tuple[str, ...] = ("rcr", "rrr", "crr", "ccr")
DATA_SOURCES: tuple[str, ...] = ("simulated", "path")
DATA_FORMATS: tuple[str, ...] = ("auto", "json", "log", "csv", "parquet")


def check(key: str, value: Any, ok: bool, allowed: str) -> None:
    """Raise :class:`ConfigValueError` naming ``key``, ``value`` and ``allowed`` unless ``ok``."""
    if not ok:
        raise ConfigValueError(key, value, allowed)


def check_positive(prefix: str, obj: Any, names: tuple[str, ...], *, allow_zero: bool = False) -> None:
    """Check that each attribute in ``names`` of ``obj`` is > 0 (or >= 0)."""
    for name in names:
        value = getattr(obj, name)
        if allow_zero:
            check(f"{prefix}.{name}", value, value >= 0, "a number >= 0")
        else:
            check(f"{prefix}.{name}", value, value > 0, "a number > 0")


@dataclass
class ArchConfig:
    """Hardware profile of one GPU architecture (vendor public specifications)."""

    name: str = MISSING
    product: str = MISSING
    cus: int = MISSING
    xcds: int = 1
    shader_engines: int = 1
    simds_per_cu: int = 4
    wave_size: int = 64
    max_waves_per_cu: int = 32
    clock_mhz: int = MISSING
    lds_kib: int = 64
    l1_kib: int = 32
    l2_mib_per_xcd: float = 4.0
    llc_mib: float = 0.0
    memory_bandwidth_gbs: float = MISSING
    peak_tflops: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_positive(
            "arch",
            self,
            ("cus", "xcds", "shader_engines", "simds_per_cu", "max_waves_per_cu", "clock_mhz",
             "lds_kib", "l1_kib", "memory_bandwidth_gbs"),
        )
        check_positive("arch", self, ("l2_mib_per_xcd", "llc_mib"), allow_zero=True)
        check("arch.wave_size", self.wave_size, self.wave_size in (32, 64), "32 or 64")
        for dtype, peak in self.peak_tflops.items():
            check(f"arch.peak_tflops.{dtype}", dtype, dtype in DTYPES, f"one of {list(DTYPES)}")
            check(f"arch.peak_tflops.{dtype}", peak, peak > 0, "a number > 0")

    @property
    def lds_bytes(self) -> int:
        return self.lds_kib * 1024


@dataclass
class DtypeConfig:
    """Element type of A and B, with the accumulator and C types CK Tile uses for it."""

    name: str = MISSING
    bytes_per_element: int = MISSING
    accumulator: str = "fp32"
    c_dtype: str = MISSING

    def __post_init__(self) -> None:
        check("dtype.name", self.name, self.name in DTYPES, f"one of {list(DTYPES)}")
        check("dtype.bytes_per_element", self.bytes_per_element,
              self.bytes_per_element in (1, 2, 4), "1, 2 or 4")
        check("dtype.c_dtype", self.c_dtype, self.c_dtype in DTYPES, f"one of {list(DTYPES)}")


@dataclass
class LayoutConfig:
    """Majorness of A, B and C (r = row-major, c = column-major)."""

    name: str = MISSING
    a: str = MISSING
    b: str = MISSING
    c: str = MISSING

    def __post_init__(self) -> None:
        check("layout.name", self.name, self.name in LAYOUTS, f"one of {list(LAYOUTS)}")
        for key in ("a", "b", "c"):
            value = getattr(self, key)
            check(f"layout.{key}", value, value in ("r", "c"), "'r' or 'c'")
        check("layout.name", self.name, self.name == self.a + self.b + self.c,
              f"'{self.a}{self.b}{self.c}' (the a, b, c fields spelled together)")


@dataclass
class OpConfig:
    """Which op definition module to load (see :mod:`ckpred.kernels`)."""

    name: str = MISSING
    #: Importable module exposing ``OP`` (an :class:`ckpred.kernels.base.OpDefinition`).
    module: str = MISSING

    def __post_init__(self) -> None:
        check("op.module", self.module, bool(self.module), "an importable module name")


@dataclass
class DataConfig:
    """Where the benchmark table comes from."""

    #: ``simulated`` (the embedded default) or ``path`` (measurement files).
    source: str = "simulated"
    #: Files or globs for ``source=path``; a comma-separated string or a list.
    path: Any = None
    #: Reader to use; ``auto`` detects it from the file's content.
    format: str = "auto"
    #: Where generated or ingested tables are cached, relative to the original working dir.
    cache_dir: str = "data/cache"
    #: Seed of the simulator's noise and kernel idiosyncrasies.
    seed: int = 0

    def __post_init__(self) -> None:
        check("data.source", self.source, self.source in DATA_SOURCES, f"one of {list(DATA_SOURCES)}")
        check("data.format", self.format, self.format in DATA_FORMATS, f"one of {list(DATA_FORMATS)}")
        if self.source == "path":
            check("data.path", self.path, bool(self.path),
                  "one or more files or globs (data.path=<file or glob>)")


@dataclass
class IngestConfig:
    """Primary config of ``ckpred ingest``."""

    arch: ArchConfig = MISSING
    dtype: DtypeConfig = MISSING
    layout: LayoutConfig = MISSING
    op: OpConfig = MISSING
    data: DataConfig = MISSING
    #: Output parquet file of the canonical table.
    out: str = "ingested.parquet"
    #: Where rows that could not be kept go (CSV with file:line and reason); empty = next to out.
    rejects: str = ""
    run_id: str = ""


# -- features (ckpred.features) -------------------------------------------------------------------
@dataclass
class FeatureGroupConfig:
    """One feature group of a feature set: which transformer, and its scalar options."""

    #: Key of ``ckpred.features.registry.FEATURE_GROUPS`` (e.g. ``problem``, ``kernel``).
    kind: str = MISSING
    #: Constructor parameters set by YAML (hardware/dtype constants come from arch/dtype).
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class FeaturesConfig:
    """A named feature set: the groups of the model's FeatureUnion, in output order."""

    name: str = MISSING
    groups: list[FeatureGroupConfig] = field(default_factory=list)

    def __post_init__(self) -> None:
        from ckpred.features.registry import FEATURE_GROUPS

        check("features.groups", self.groups, len(self.groups) > 0, "a non-empty list of groups")
        seen: set[str] = set()
        for i, group in enumerate(self.groups):
            check(f"features.groups[{i}].kind", group.kind, group.kind in FEATURE_GROUPS,
                  f"one of {sorted(FEATURE_GROUPS)}")
            check(f"features.groups[{i}].kind", group.kind, group.kind not in seen,
                  "each kind at most once per feature set")
            seen.add(group.kind)


# -- shapes and simulate (simulator owner) -------------------------------------------------------
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
    calibration_file: str = "../shared/data/ck_gemm_gfx950_results/p1_oracle_best_results.csv"


def register() -> None:
    """Register every schema under ``base_<group>`` (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(group="arch", name="base_arch", node=ArchConfig)
    cs.store(group="dtype", name="base_dtype", node=DtypeConfig)
    cs.store(group="layout", name="base_layout", node=LayoutConfig)
    cs.store(group="op", name="base_op", node=OpConfig)
    cs.store(group="data", name="base_data", node=DataConfig)
    cs.store(name="base_ingest", node=IngestConfig)
    cs.store(group="shapes", name="base_shapes", node=ShapesConfig)
    cs.store(name="base_simulate", node=SimulateConfig)
    cs.store(group="features", name="base_features", node=FeaturesConfig)
