"""Occupancy and register-level structure of a kernel: LDS and wave limits, MFMA repeats."""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from ckpred.features.base import FeatureGroup, positive_int
from ckpred.kernels.gemm_universal import PIPELINES

#: Category codes of pipelines that double-buffer A and B in LDS (compv4).
DOUBLE_LDS_CODES: tuple[int, ...] = (PIPELINES.index("compv4"),)


class OccupancyFeatures(FeatureGroup):
    """Blocks resident per CU, warp-level repeats and accumulator pressure (10 features).

    Features (in order): ``lds_buffers`` (2 for double-buffered pipelines, see
    :data:`DOUBLE_LDS_CODES`), ``lds_block_bytes = (tile_m+tile_n)*tile_k*b*lds_buffers``,
    ``blocks_per_cu_lds = floor(lds_bytes / lds_block_bytes)``, ``blocks_per_cu =
    min(blocks_per_cu_lds, floor(max_waves_per_cu / warps))``, ``rep_m = tile_m /
    (warp_m*warp_tile_m)``, ``rep_n``, ``rep_k`` (MFMA tiles per warp along each dimension),
    ``mfma_per_warp = rep_m*rep_n*rep_k`` (MFMA instructions per warp per K step),
    ``accumulators_per_thread = tile_m*tile_n / (warps*wave_size)`` (fp32 accumulator
    registers: high values cap occupancy) and ``warp_tile_intensity =
    warp_tile_m*warp_tile_n / (warp_tile_m+warp_tile_n)`` (register-level operand reuse).

    Parameters
    ----------
    bytes_per_element : int, default=1
    lds_bytes : int, default=163840
        LDS per CU in bytes (gfx950: 160 KiB).
    max_waves_per_cu : int, default=32
    wave_size : int, default=64
    input_names : sequence of str or None, default=None
        Column names of X when it is a plain array (see :mod:`ckpred.features.base`).
    """

    input_columns: ClassVar[tuple[str, ...]] = (
        "tile_m", "tile_n", "tile_k", "warp_m", "warp_n", "warp_k", "warp_tile_m", "warp_tile_n",
        "warp_tile_k", "pipeline")
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **FeatureGroup._parameter_constraints,
        "bytes_per_element": positive_int(),
        "lds_bytes": positive_int(),
        "max_waves_per_cu": positive_int(),
        "wave_size": positive_int(),
    }

    def __init__(self, *, bytes_per_element: int = 1, lds_bytes: int = 163840, max_waves_per_cu: int = 32,
                 wave_size: int = 64, input_names: Sequence[str] | None = None) -> None:
        self.bytes_per_element = bytes_per_element
        self.lds_bytes = lds_bytes
        self.max_waves_per_cu = max_waves_per_cu
        self.wave_size = wave_size
        self.input_names = input_names

    def _feature_names(self) -> list[str]:
        return ["lds_buffers", "lds_block_bytes", "blocks_per_cu_lds", "blocks_per_cu", "rep_m", "rep_n",
                "rep_k", "mfma_per_warp", "accumulators_per_thread", "warp_tile_intensity"]

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        c = cols
        double = c["pipeline"] * 0.0
        for code in DOUBLE_LDS_CODES:
            double = double + xp.indicator(xp.equal(c["pipeline"], float(code)))
        buffers = 1.0 + double
        lds_block = (c["tile_m"] + c["tile_n"]) * c["tile_k"] * float(self.bytes_per_element) * buffers
        by_lds = xp.floor(float(self.lds_bytes) / lds_block)
        warps = c["warp_m"] * c["warp_n"] * c["warp_k"]
        by_waves = xp.floor(float(self.max_waves_per_cu) / warps)
        reps = [c[f"tile_{d}"] / (c[f"warp_{d}"] * c[f"warp_tile_{d}"]) for d in "mnk"]
        wtm, wtn = c["warp_tile_m"], c["warp_tile_n"]
        return [buffers, lds_block, by_lds, xp.minimum(by_lds, by_waves), *reps, reps[0] * reps[1] * reps[2],
                c["tile_m"] * c["tile_n"] / (warps * float(self.wave_size)), wtm * wtn / (wtm + wtn)]
