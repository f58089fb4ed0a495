"""The hardware constants an arch config gives expressions (``hw.<name>``), and the dtype and
layout names of the config dirs in use.

Kept apart from :mod:`ckpred.schema` (which defines :class:`~ckpred.schema.ArchConfig`) so the
checks the schema runs when an op is composed (:mod:`ckpred.kernels.opschema`) can list the
names an expression may read without importing the schema.
"""

from __future__ import annotations

from typing import Any, Mapping

from ckpred import vocab

#: Old (AMD-only) arch key -> its vendor-neutral name. A config written with the old key (or a
#: saved run's config) still composes, the neutral key taking its value, and ``hw.<old>`` stays
#: readable in expressions; giving both with different values is refused.
ARCH_ALIASES: dict[str, str] = {"cus": "compute_units", "xcds": "dies", "shader_engines": "engine_clusters",
                                "simds_per_cu": "simds_per_unit", "wave_size": "warp_size",
                                "max_waves_per_cu": "max_warps_per_unit", "lds_kib": "shared_memory_kib",
                                "l2_mib_per_xcd": "l2_mib_per_die", "gfx": "isa"}

#: Numeric keys of :class:`~ckpred.schema.ArchConfig` that expressions read as ``hw.<key>``;
#: besides them the derived ``hw.shared_memory_bytes``, ``hw.l2_mib`` (the whole chip),
#: ``hw.peak_tflops_<dtype>`` and the old names (see :func:`arch_constants`).
ARCH_NUMBERS: tuple[str, ...] = ("compute_units", "dies", "engine_clusters", "simds_per_unit", "warp_size",
                                 "max_warps_per_unit", "clock_mhz", "shared_memory_kib", "registers_kib", "l1_kib",
                                 "l2_mib_per_die", "llc_mib", "memory_bandwidth_gbs")

def dtype_names() -> tuple[str, ...]:
    """The dtypes of the config dirs in use (``dtype/<name>.yaml``; :func:`ckpred.vocab.current`)."""
    return tuple(sorted(vocab.current().dtypes))


def layout_names() -> tuple[str, ...]:
    """The layouts of the config dirs in use (``layout/<name>.yaml``)."""
    return tuple(sorted(vocab.current().layouts))


def arch_constant_names() -> tuple[str, ...]:
    """Every ``hw.<name>`` an expression may read (the same for every arch config)."""
    old = tuple(k for k in ARCH_ALIASES if ARCH_ALIASES[k] in ARCH_NUMBERS)
    return (ARCH_NUMBERS + ("shared_memory_bytes", "l2_mib") + old + ("lds_bytes",)
            + tuple(f"peak_tflops_{d}" for d in dtype_names()))


def arch_value(arch: object, name: str) -> Any:
    """Key ``name`` of an arch config (:class:`~ckpred.schema.ArchConfig`, read by attribute) or a
    mapping, under its neutral name or, for a mapping
    written with the old names, its old one (:data:`ARCH_ALIASES`)."""
    def get(key: str) -> Any:
        return arch.get(key, None) if isinstance(arch, Mapping) else getattr(arch, key, None)

    value = get(name)
    if value is None:
        old = next((k for k, v in ARCH_ALIASES.items() if v == name), None)
        value = get(old) if old else None
    return value


def arch_constants(arch: object) -> dict[str, float]:
    """The hardware constants of one arch config as ``{name: number}`` (``hw.<name>``).

    ``arch`` is an :class:`~ckpred.schema.ArchConfig` or a mapping (neutral or old key names).
    Every constant is there under its neutral name and, where it had one, its old AMD name
    (``hw.cus`` = ``hw.compute_units``). A constant the config does not publish
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
