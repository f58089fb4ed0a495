"""Kernel features: the kernel configuration and what it implies on its own (21 features)."""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from ckpred.features.base import FeatureGroup, positive_int

#: Raw kernel fields of gemm_universal, in ``op.kernel_names`` order.
KERNEL_FIELDS: tuple[str, ...] = (
    "tile_m", "tile_n", "tile_k", "warp_m", "warp_n", "warp_k",
    "warp_tile_m", "warp_tile_n", "warp_tile_k", "pipeline", "scheduler", "epilogue",
    "pad_m", "pad_n", "pad_k", "persistent",
)


class KernelFeatures(FeatureGroup):
    """The 16 raw kernel fields plus warps, tile volume and area, LDS estimate and its ratio.

    Features (in order): the 16 fields of :data:`KERNEL_FIELDS` (pipeline, scheduler and
    epilogue as category codes), ``num_warps = warp_m*warp_n*warp_k``,
    ``tile_volume = tile_m*tile_n*tile_k``, ``tile_mn = tile_m*tile_n``,
    ``lds_bytes_est = (tile_m*tile_k + tile_n*tile_k) * bytes_per_element`` and
    ``lds_ratio = lds_bytes_est / lds_bytes`` (share of the CU's LDS one block's A and B tiles
    need) — the reference system's 21 kernel features.

    Parameters
    ----------
    bytes_per_element : int, default=1
        Bytes of one A/B element.
    lds_bytes : int, default=163840
        LDS capacity per CU in bytes (gfx950: 160 KiB; gfx942: 64 KiB).
    input_names : sequence of str or None, default=None
        Column names of X when it is a plain array (see :mod:`ckpred.features.base`).
    """

    input_columns: ClassVar[tuple[str, ...]] = KERNEL_FIELDS
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **FeatureGroup._parameter_constraints,
        "bytes_per_element": positive_int(),
        "lds_bytes": positive_int(),
    }

    def __init__(self, *, bytes_per_element: int = 1, lds_bytes: int = 163840,
                 input_names: Sequence[str] | None = None) -> None:
        self.bytes_per_element = bytes_per_element
        self.lds_bytes = lds_bytes
        self.input_names = input_names

    def _feature_names(self) -> list[str]:
        return [*KERNEL_FIELDS, "num_warps", "tile_volume", "tile_mn", "lds_bytes_est", "lds_ratio"]

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        tm, tn, tk = cols["tile_m"], cols["tile_n"], cols["tile_k"]
        lds = (tm * tk + tn * tk) * float(self.bytes_per_element)
        return [*(cols[c] for c in KERNEL_FIELDS),
                cols["warp_m"] * cols["warp_n"] * cols["warp_k"],
                tm * tn * tk, tm * tn, lds, lds / float(self.lds_bytes)]
