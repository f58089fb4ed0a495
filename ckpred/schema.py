"""Structured-config schemas for every config group, registered in Hydra's ConfigStore.

Every YAML option of a group starts with ``defaults: [base_<group>, _self_]`` so Hydra checks
its keys and types against the dataclass below when the config is composed. Value rules that a
type cannot express (ranges, allowed names) live in ``__post_init__`` and run when
:func:`ckpred.config.to_object` turns the composed config into these dataclasses; their errors
name the key, the bad value and what is allowed.

Adding a config group means adding its dataclass here and registering it in :func:`register`;
adding an *option* to a group is only a YAML file: the dtypes, layouts and arch configs a check
accepts are the files of the config dirs (:mod:`ckpred.vocab`), not lists in this module.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import II, MISSING

from ckpred import vocab
from ckpred.errors import ConfigValueError
from ckpred.util import file_kind, resolve_path

DATA_SOURCES: tuple[str, ...] = ("simulated", "path")
DATA_FORMATS: tuple[str, ...] = ("auto", "json", "log", "csv", "parquet")


def dtype_names() -> tuple[str, ...]:
    """The dtypes of the config dirs in use (``dtype/<name>.yaml``; :func:`ckpred.vocab.current`)."""
    return tuple(sorted(vocab.current().dtypes))


def layout_names() -> tuple[str, ...]:
    """The layouts of the config dirs in use (``layout/<name>.yaml``)."""
    return tuple(sorted(vocab.current().layouts))


def check(key: str, value: Any, ok: bool, allowed: str) -> None:
    """Raise :class:`ConfigValueError` naming ``key``, ``value`` and ``allowed`` unless ``ok``."""
    if not ok:
        raise ConfigValueError(key, value, allowed)


#: Seeds reach numpy's ``RandomState``, scikit-learn and LightGBM, which take 0 .. 2**32 - 1.
SEED_MAX = 2**32 - 1


def max_threads() -> int:
    """Upper bound of every thread-count key (``model.n_jobs``, ``threads``): this machine's CPUs.

    More threads than CPUs only spin; 0 and -1 (LightGBM's and OpenMP's "all cores") are refused
    too, because the thread count changes LightGBM's result bit-wise and a run must say it.
    """
    return os.cpu_count() or 1


def check_threads(key: str, value: int) -> None:
    """Check a thread count: an integer in [1, :func:`max_threads`]."""
    top = max_threads()
    check(key, value, 1 <= value <= top,
          f"an integer in [1, {top}] (this machine's CPUs; 0 / -1 for 'all cores' are not accepted: "
          f"give the count)")


def check_seed(key: str, value: int) -> None:
    """Check a seed: an integer in [0, 2**32 - 1] (what numpy, scikit-learn and LightGBM take)."""
    check(key, value, 0 <= value <= SEED_MAX, f"an integer in [0, {SEED_MAX}]")


def check_arch_dtype(arch: Any, dtype: Any) -> None:
    """Refuse a dtype the arch has no peak throughput for (its ``peak_tflops`` lists what it runs).

    An arch config without ``peak_tflops`` (a user's own GPU) is not checked here; the op's
    kernel catalogue still refuses combinations it has no kernels for.
    """
    peaks = dict(getattr(arch, "peak_tflops", None) or {})
    if peaks:
        check("dtype", dtype.name, dtype.name in peaks,
              f"one of {sorted(peaks)} for arch={arch.name} (the dtypes in its peak_tflops)")


def _first_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def check_output_path(key: str, value: str, *, kind: str, required: bool = False) -> None:
    """Refuse an output path that cannot be written before any work starts.

    ``kind`` is ``file`` or ``dir``. Refused: a directory given for a file (or a file for a
    directory), a device, FIFO or socket, a path below an existing file, and a nearest
    existing directory without write permission. An empty value is the command's default
    place (not checked), unless ``required``: then it is refused (an empty path would
    name the working directory). Whether an existing output may be replaced (only what
    ckpred wrote may) is checked by the command before it starts (:func:`ckpred.util.check_replaceable`);
    what only the write itself can tell (a full or read-only filesystem) is refused there, by
    :func:`ckpred.util.atomic_path`.
    """
    if not str(value).strip():
        check(key, value, not required, "a path (an empty one would name the working directory)")
        return
    path = resolve_path(str(value))
    if path.exists():  # (through a symlink: the command refuses a symlink where it replaces the output)
        mode = path.stat().st_mode
        if kind == "file":
            check(key, value, not stat.S_ISDIR(mode), "a file path (this is an existing directory)")
            check(key, value, stat.S_ISREG(mode), f"a regular file path ({path} is {file_kind(mode)})")
        else:
            check(key, value, not stat.S_ISREG(mode), "a directory path (this is an existing file)")
            check(key, value, stat.S_ISDIR(mode), f"a directory path ({path} is {file_kind(mode)})")
            check(key, value, os.access(path, os.W_OK | os.X_OK), f"a writable location ({path} is not writable)")
    parent = _first_existing(path.parent)
    check(key, value, parent.is_dir(), f"a path below a directory ({parent} is {_kind_of(parent)})")
    check(key, value, os.access(parent, os.W_OK | os.X_OK), f"a writable location ({parent} is not writable)")


def _kind_of(path: Path) -> str:
    try:
        return file_kind(path.stat().st_mode)
    except OSError:
        return "not a directory"


def check_positive(prefix: str, obj: Any, names: tuple[str, ...], *, allow_zero: bool = False) -> None:
    """Check that each attribute in ``names`` of ``obj`` is > 0 (or >= 0)."""
    for name in names:
        value = getattr(obj, name)
        if allow_zero:
            check(f"{prefix}.{name}", value, value >= 0, "a number >= 0")
        else:
            check(f"{prefix}.{name}", value, value > 0, "a number > 0")


#: GPU vendors an arch config may name ("" = not stated: configs written before NVIDIA GPUs).
VENDORS: tuple[str, ...] = ("", "amd", "nvidia")

#: Old (AMD-only) arch key -> its vendor-neutral name. A config written with the old key (or a
#: saved run's config) still composes, the neutral key taking its value, and ``hw.<old>`` stays
#: readable in expressions; giving both with different values is refused.
ARCH_ALIASES: dict[str, str] = {"cus": "compute_units", "xcds": "dies", "shader_engines": "engine_clusters",
                                "simds_per_cu": "simds_per_unit", "wave_size": "warp_size",
                                "max_waves_per_cu": "max_warps_per_unit", "lds_kib": "shared_memory_kib",
                                "l2_mib_per_xcd": "l2_mib_per_die", "gfx": "isa"}


@dataclass
class ArchConfig:
    """Hardware profile of one GPU (vendor public specifications), in vendor-neutral terms.

    A "unit" is the block a thread block runs on: an AMD compute unit (CU) or an NVIDIA
    streaming multiprocessor (SM). The old AMD names of the keys (``cus``, ``lds_kib``,
    ``wave_size``...; :data:`ARCH_ALIASES`) are accepted in place of the neutral ones.
    """

    name: str = MISSING
    product: str = MISSING
    #: ``amd`` | ``nvidia`` ("" = not stated).
    vendor: str = ""
    #: ISA target (``gfx90a``, ``sm_80``); empty = ``name``. Two products of one ISA (MI250X and
    #: MI210 are both gfx90a) are two arch configs with different names and the same ``isa``.
    isa: Optional[str] = II(".gfx")
    #: Compute units: AMD CUs, NVIDIA SMs.
    compute_units: int = II(".cus")
    #: Dies sharing the work, each with its own L2: AMD XCDs; 1 for a monolithic GPU.
    dies: int = II(".xcds")
    #: Clusters of units with their own front end: AMD shader engines, NVIDIA GPCs.
    engine_clusters: int = II(".shader_engines")
    #: Schedulers per unit, each issuing one warp per cycle: AMD SIMDs, NVIDIA SM sub-partitions.
    simds_per_unit: int = II(".simds_per_cu")
    #: Threads that execute in lockstep: AMD wavefront, NVIDIA warp (HIP and CUDA ``warpSize``).
    warp_size: int = II(".wave_size")
    #: Warps (wavefronts) resident per unit at most.
    max_warps_per_unit: int = II(".max_waves_per_cu")
    #: Boost (peak engine) clock.
    clock_mhz: int = MISSING
    #: Shared memory one unit's blocks can use: AMD LDS, NVIDIA shared memory (the largest carve-out).
    shared_memory_kib: int = II(".lds_kib")
    #: Vector register file per unit (None = not published).
    registers_kib: Optional[float] = None
    #: L1 data cache per unit (NVIDIA: the combined L1 / shared memory array).
    l1_kib: int = MISSING
    #: L2 per die (the whole chip's L2 is ``l2_mib_per_die * dies``).
    l2_mib_per_die: float = II(".l2_mib_per_xcd")
    #: Last-level cache behind the L2 (AMD Infinity Cache); 0 = none.
    llc_mib: float = MISSING
    memory_bandwidth_gbs: float = MISSING
    #: Dense peak per dtype name (matrix units where the GPU has them).
    peak_tflops: dict[str, float] = MISSING
    # Old names (ARCH_ALIASES): None unless a config gives them.
    gfx: Optional[str] = None
    cus: Optional[int] = None
    xcds: Optional[int] = None
    shader_engines: Optional[int] = None
    simds_per_cu: Optional[int] = None
    wave_size: Optional[int] = None
    max_waves_per_cu: Optional[int] = None
    lds_kib: Optional[int] = None
    l2_mib_per_xcd: Optional[float] = None

    def __post_init__(self) -> None:
        for old, new in ARCH_ALIASES.items():
            given = getattr(self, old)
            check(f"arch.{old}", given, given is None or given == getattr(self, new),
                  f"the value of arch.{new} ({getattr(self, new)!r}): {old} is the old name of {new}, give one")
        check("arch.vendor", self.vendor, self.vendor in VENDORS, f"one of {list(VENDORS)}")
        check_positive(
            "arch",
            self,
            ("compute_units", "dies", "engine_clusters", "simds_per_unit", "max_warps_per_unit", "clock_mhz",
             "shared_memory_kib", "l1_kib", "memory_bandwidth_gbs"),
        )
        check_positive("arch", self, ("l2_mib_per_die", "llc_mib"), allow_zero=True)
        if self.registers_kib is not None:
            check_positive("arch", self, ("registers_kib",))
        check("arch.warp_size", self.warp_size, self.warp_size in (32, 64), "32 or 64")
        for dtype, peak in self.peak_tflops.items():
            check(f"arch.peak_tflops.{dtype}", dtype, dtype in dtype_names(),
                  f"a dtype of {vocab.current().describe('dtype')}")
            check(f"arch.peak_tflops.{dtype}", peak, peak > 0, "a number > 0")

    @property
    def shared_memory_bytes(self) -> int:
        return self.shared_memory_kib * 1024


#: Numeric keys of :class:`ArchConfig` that expressions read as ``hw.<key>``; besides them the
#: derived ``hw.shared_memory_bytes``, ``hw.l2_mib`` (the whole chip), ``hw.peak_tflops_<dtype>``
#: and the old names (see :func:`arch_constants`).
ARCH_NUMBERS: tuple[str, ...] = ("compute_units", "dies", "engine_clusters", "simds_per_unit", "warp_size",
                                 "max_warps_per_unit", "clock_mhz", "shared_memory_kib", "registers_kib", "l1_kib",
                                 "l2_mib_per_die", "llc_mib", "memory_bandwidth_gbs")


def arch_constant_names() -> tuple[str, ...]:
    """Every ``hw.<name>`` an expression may read (the same for every arch config)."""
    old = tuple(k for k in ARCH_ALIASES if ARCH_ALIASES[k] in ARCH_NUMBERS)
    return (ARCH_NUMBERS + ("shared_memory_bytes", "l2_mib") + old + ("lds_bytes",)
            + tuple(f"peak_tflops_{d}" for d in dtype_names()))


def arch_value(arch: Any, name: str) -> Any:
    """Key ``name`` of an arch config, a composed ``arch`` node or a mapping, under its neutral
    name or, for a mapping written with the old names, its old one (:data:`ARCH_ALIASES`)."""
    get = arch.get if hasattr(arch, "get") else (lambda k, d=None: getattr(arch, k, d))
    value = get(name, None)
    if value is None:
        old = next((k for k, v in ARCH_ALIASES.items() if v == name), None)
        value = get(old, None) if old else None
    return value


def arch_config(name: str) -> "ArchConfig":
    """``arch/<name>.yaml`` of the config dirs in use (the package's ``conf/`` and a user's),
    checked (e.g. to find a table's own arch by the name in its ``arch`` column).

    Raises
    ------
    ckpred.errors.ConfigValueError
        When no arch config has that name, listing the ones there are.
    """
    from omegaconf import OmegaConf

    from ckpred.yamlfile import check_yaml

    found = vocab.current()
    path = found.find("arch", name)
    check("arch", name, path is not None, f"one of the arch configs {found.options('arch')} (arch/<name>.yaml in "
                                          "the config dirs; or pass the arch config)")
    data = path.read_bytes()
    check_yaml(data, path)
    raw = OmegaConf.to_container(OmegaConf.create(data.decode("utf-8")))
    raw.pop("defaults", None)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ArchConfig), raw))


def arch_constants(arch: Any) -> dict[str, float]:
    """The hardware constants of one arch config as ``{name: number}`` (``hw.<name>``).

    ``arch`` is an :class:`ArchConfig`, a composed ``arch`` node or a mapping (neutral or old
    key names). Every constant is there under its neutral name and, where it had one, its old
    AMD name (``hw.cus`` = ``hw.compute_units``). A constant the config does not publish
    (``registers_kib: null``) and a dtype the arch has no peak for (``peak_tflops_<dtype>``) are
    ``nan``: an expression using it yields NaN rather than a number from another arch.
    """
    def number(name: str) -> float:
        value = arch_value(arch, name)
        return float("nan") if value is None else float(value)

    out = {k: number(k) for k in ARCH_NUMBERS}
    out["shared_memory_bytes"] = out["shared_memory_kib"] * 1024.0
    out["l2_mib"] = out["l2_mib_per_die"] * out["dies"]
    for old, new in ARCH_ALIASES.items():
        if new in out:
            out[old] = out[new]
    out["lds_bytes"] = out["shared_memory_bytes"]
    peaks = arch_value(arch, "peak_tflops") or {}
    for d in dtype_names():
        out[f"peak_tflops_{d}"] = float(peaks[d]) if d in peaks else float("nan")
    return out


@dataclass
class DtypeConfig:
    """Element type of A and B, with the accumulator and C types CK Tile uses for it.

    A new dtype is a file ``dtype/<name>.yaml`` in a config dir (see :mod:`ckpred.vocab`).
    """

    name: str = MISSING
    #: Bytes of one element: 1, 2, 4, or a fraction for a packed type (0.5 for a 4-bit one).
    bytes_per_element: float = MISSING
    accumulator: str = "fp32"
    c_dtype: str = MISSING
    #: Other spellings of the name in tables (``float16`` for fp16): a categorical field holding
    #: them, and ``dtype_bytes(x)``, read them as this dtype.
    aliases: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        known = vocab.current()
        check("dtype.name", self.name, self.name in known.dtypes, f"a dtype of {known.describe('dtype')}")
        check("dtype.bytes_per_element", self.bytes_per_element, self.bytes_per_element > 0,
              "a number > 0 (1, 2, 4, or 0.5 for a packed 4-bit type)")
        for key in ("c_dtype", "accumulator"):
            check(f"dtype.{key}", getattr(self, key), known.dtype_name(getattr(self, key)) is not None,
                  f"a dtype of {known.describe('dtype')}")


@dataclass
class LayoutConfig:
    """Majorness of A, B and C (r = row-major, c = column-major).

    A new layout is a file ``layout/<name>.yaml`` in a config dir (see :mod:`ckpred.vocab`).
    """

    name: str = MISSING
    a: str = MISSING
    b: str = MISSING
    c: str = MISSING
    #: The layout's model-input code (the features' ``layout_code``): unique per layout.
    code: int = MISSING

    def __post_init__(self) -> None:
        known = vocab.current()
        check("layout.name", self.name, self.name in known.layouts, f"a layout of {known.describe('layout')}")
        check("layout.code", self.code, self.code == known.layouts[self.name].code,
              f"{known.layouts[self.name].code} (the code of layout {self.name} in {known.layouts[self.name].source})")
        for key in ("a", "b", "c"):
            value = getattr(self, key)
            check(f"layout.{key}", value, value in ("r", "c"), "'r' or 'c'")
        check("layout.name", self.name, self.name == self.a + self.b + self.c,
              f"'{self.a}{self.b}{self.c}' (the a, b, c fields spelled together)")


# -- the op as data (ckpred.kernels.declared) -------------------------------------------------------
#: Kinds of an op field. ``categorical`` fields hold one of ``values`` (encoded as its index).
FIELD_KINDS: tuple[str, ...] = ("int", "float", "categorical", "bool")
#: Metric units, as the factor to the canonical unit: times to milliseconds, throughputs to TFLOPS.
TIME_UNITS: dict[str, float] = {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}
THROUGHPUT_UNITS: dict[str, float] = {"tflops": 1.0, "gflops": 1e-3, "mflops": 1e-6, "flops": 1e-12}
#: How a failed measurement may be written in the metric column.
FAILURE_VALUES: tuple[str, ...] = ("inf", "nan", "missing", "zero", "negative")
#: What a (problem, kernel) pair the table holds no row for means (``op.absence``): ``unknown``
#: (a full sweep: every rule-valid catalogue kernel is a candidate, and a pick without a row is
#: an unmeasured pick) or ``not_applicable`` (a find-db, a pruned sweep: the kernels a problem
#: has no row for do not apply to it; the selector learns an applicability mask).
ABSENCE: tuple[str, ...] = ("unknown", "not_applicable")
#: Names a kernel-id template may use besides the op's fields (the run's dtype and layout).
TEMPLATE_CONTEXT: tuple[str, ...] = ("dtype", "layout")


@dataclass
class FieldSpec:
    """One problem or kernel field of a declared op."""

    #: ``int`` | ``float`` | ``categorical`` | ``bool``.
    kind: str = "int"
    #: ``categorical``: the allowed values in code order (append only: codes are model inputs).
    values: list[Any] = field(default_factory=list)
    #: Value when a source does not carry the field (null = the field is required).
    default: Any = None


@dataclass
class KernelIdConfig:
    """How a kernel configuration is named: a template, or a tuple of fields."""

    #: ``bm{block_m}_w{num_warps}``: formats a name and parses it back (checked at compose).
    template: str = ""
    #: A tuple id: the name is ``(v1,v2,...)`` of these kernel fields.
    fields: list[str] = field(default_factory=list)


@dataclass
class MetricConfig:
    """The measurement: which column, which direction is better, its unit."""

    #: Column (after the input mapping) holding the measurement.
    column: str = "tflops"
    #: ``lower`` (a time) or ``higher`` (a throughput).
    better: str = "higher"
    #: A time unit (:data:`TIME_UNITS`) for ``lower``, a throughput unit for ``higher``.
    unit: str = "tflops"


@dataclass
class FailureConfig:
    """How a failed kernel run is encoded in the table."""

    #: Metric values that mean "failed" (:data:`FAILURE_VALUES`).
    metric_values: list[str] = field(default_factory=lambda: ["inf", "nan", "missing"])
    #: A column saying whether the run was valid (null = none).
    valid_column: Optional[str] = None
    true_values: list[str] = field(default_factory=lambda: ["true", "1", "yes"])
    false_values: list[str] = field(default_factory=lambda: ["false", "0", "no"])


@dataclass
class RuleConfig:
    """A validity rule: a kernel can run a problem only where ``expr`` holds."""

    #: Condition over kernel, problem and ``hw.<constant>`` fields (see :mod:`ckpred.expressions`).
    expr: str = MISSING
    #: Why a kernel is invalid where the rule fails (the table's ``invalid_reason``).
    message: str = MISSING


@dataclass
class FamilyConfig:
    """Problem families by bins of an expression (e.g. CK's tiny/small/medium/large by M)."""

    #: Expression over problem fields whose value is binned.
    expr: str = ""
    #: Ascending bin edges: label i holds values in [bounds[i-1], bounds[i]).
    bounds: list[float] = field(default_factory=list)
    #: ``len(bounds) + 1`` labels.
    labels: list[str] = field(default_factory=list)


@dataclass
class OpKeysConfig:
    """The three keys: what a selection is for, what a fold holds out, what a report splits by."""

    #: Problem fields of one query (the ranking group and unit of efficiency); empty = all.
    query: list[str] = field(default_factory=list)
    #: Problem fields a CV fold holds out together (a subset of ``query``); empty = ``query``.
    cv_group: list[str] = field(default_factory=list)
    #: Report breakdowns: categorical/bool problem fields, or ``family`` when the op declares one.
    breakdowns: list[str] = field(default_factory=list)


@dataclass
class OpInputConfig:
    """How a raw table becomes canonical rows (read by :mod:`ckpred.data`).

    ``columns`` maps a canonical field to its source: a string (a source column to rename),
    ``{value: <constant>}`` or ``{expr: "<expression over source columns>"}``.
    """

    #: ``auto`` (by extension/content) or a registered reader's name.
    format: str = "auto"
    columns: dict[str, Any] = field(default_factory=dict)


@dataclass
class OpConfig:
    """An op as data: fields, kernel id, metric, failure encoding, expressions, rules, keys.

    Built into an :class:`ckpred.kernels.declared.DeclaredOp`; ``plugin`` names an optional
    ``package.module:OBJECT`` for what data cannot say (see :mod:`ckpred.kernels`). Every
    check runs when the config is composed, naming the key, the bad value and what is allowed.
    """

    name: str = MISSING
    #: ``package.module:OBJECT``: hooks for catalogue, name grammar, validity... (null = none).
    plugin: Optional[str] = None
    problem_fields: dict[str, FieldSpec] = field(default_factory=dict)
    kernel_fields: dict[str, FieldSpec] = field(default_factory=dict)
    kernel_id: KernelIdConfig = field(default_factory=KernelIdConfig)
    metric: MetricConfig = field(default_factory=MetricConfig)
    failure: FailureConfig = field(default_factory=FailureConfig)
    #: What a (problem, kernel) pair without a row means (:data:`ABSENCE`): ``unknown`` for a
    #: full sweep, ``not_applicable`` when the table lists only the kernels that apply.
    absence: str = "unknown"
    #: Floating-point operations of a problem (expression over problem fields); null = none.
    flops: Optional[str] = None
    #: Bytes moved by a problem (expression over problem fields); null = none.
    bytes: Optional[str] = None
    rules: list[RuleConfig] = field(default_factory=list)
    family: FamilyConfig = field(default_factory=FamilyConfig)
    keys: OpKeysConfig = field(default_factory=OpKeysConfig)
    input: OpInputConfig = field(default_factory=OpInputConfig)

    def __post_init__(self) -> None:
        from ckpred.kernels.opschema import validate_op_config

        validate_op_config(self)


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
        if out.get("shapes") and self.cv.name == "external" and getattr(self.cv.data, "source", None) == "simulated":
            del out["shapes"]  # the external test table is simulated
        return out


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
    from dataclasses import asdict, fields, is_dataclass

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
