"""Schemas of the hardware groups: ``arch`` (a GPU's public specifications), ``dtype`` and ``layout``.

The option lists are the files of the config dirs (:mod:`ckpred.vocab`); the constants
expressions read as ``hw.<name>`` are listed by :mod:`ckpred.hardware`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol

from omegaconf import II, MISSING, OmegaConf

from ckpred import vocab
from ckpred.errors import check
from ckpred.hardware import ARCH_ALIASES, dtype_names
from ckpred.schema.base import check_positive
from ckpred.schema.convert import from_mapping
from ckpred.yamlfile import check_yaml


#: GPU vendors an arch config may name ("" = not stated: configs written before NVIDIA GPUs).
VENDORS: tuple[str, ...] = ("", "amd", "nvidia")


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
    #: Per op name, a text file of the kernel names this GPU's library build has (one per line,
    #: ``#`` comments; a relative path is from the directory the command runs in). On this arch
    #: only those are candidates (CV, ``plan``, the exported selector); an op not named here
    #: keeps every kernel its rules allow (:mod:`ckpred.kernels.lists`).
    kernel_lists: dict[str, str] = field(default_factory=dict)
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
        for op_name, path in self.kernel_lists.items():
            check(f"arch.kernel_lists.{op_name}", path, isinstance(path, str) and bool(path.strip()),
                  "the path of a text file of kernel names, one per line")

    @property
    def shared_memory_bytes(self) -> int:
        return self.shared_memory_kib * 1024


def arch_config(name: str) -> "ArchConfig":
    """``arch/<name>.yaml`` of the config dirs in use (the package's ``conf/`` and a user's),
    checked (e.g. to find a table's own arch by the name in its ``arch`` column).

    Raises
    ------
    ckpred.errors.ConfigValueError
        When no arch config has that name, listing the ones there are.
    """
    found = vocab.current()
    path = found.find("arch", name)
    check("arch", name, path is not None, f"one of the arch configs {found.options('arch')} (arch/<name>.yaml in "
                                          "the config dirs; or pass the arch config)")
    data = path.read_bytes()
    check_yaml(data, path)
    raw = OmegaConf.to_container(OmegaConf.create(data.decode("utf-8")))
    assert isinstance(raw, dict)
    raw.pop("defaults", None)
    return from_mapping(ArchConfig, {str(k): v for k, v in raw.items()})


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



def check_arch_dtype(arch: ArchConfig, dtype: DtypeConfig) -> None:
    """Refuse a dtype the arch has no peak throughput for (its ``peak_tflops`` lists what it runs).

    An arch config without ``peak_tflops`` (a user's own GPU) is not checked here; the op's
    kernel catalogue still refuses combinations it has no kernels for.
    """
    peaks = dict(getattr(arch, "peak_tflops", None) or {})
    if peaks:
        check("dtype", dtype.name, dtype.name in peaks,
              f"one of {sorted(peaks)} for arch={arch.name} (the dtypes in its peak_tflops)")

class HardwareView(Protocol):
    """What a table's validity rules, kernel catalogue and hardware features read of a config:
    its arch, dtype and layout (a command's config, or a :class:`Hardware` of its own)."""

    @property
    def arch(self) -> ArchConfig: ...

    @property
    def dtype(self) -> DtypeConfig: ...

    @property
    def layout(self) -> LayoutConfig: ...


@dataclass(frozen=True)
class Hardware:
    """An arch, dtype and layout without the rest of a config (a partition's, a second table's)."""

    arch: ArchConfig
    dtype: DtypeConfig
    layout: LayoutConfig
