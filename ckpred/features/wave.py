"""Wave quantisation: how the kernel's grid of blocks spreads over CUs and XCDs.

A GEMM launches ``tiles_m * tiles_n * split_k`` blocks. The GPU runs them in *waves* of one
block per CU (per resident slot); the last wave is often partly empty, and on multi-die parts
(MI300X/MI355X: 8 XCDs) blocks are dealt round-robin to the XCDs, so the busiest XCD sets the
time. Those step functions are what makes neighbouring tile sizes differ by 2x in speed.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from ckpred.features.base import FeatureGroup, ceil_div, positive_int


class WaveQuantizationFeatures(FeatureGroup):
    """Grid size, waves over CUs, per-XCD distribution and K-loop length (10 features).

    Features (in order): ``log2_grid`` (blocks = tiles_m*tiles_n*split_k), ``waves =
    ceil(grid/cus)``, ``wave_efficiency = grid/(waves*cus)``, ``last_wave_fill`` (share of CUs
    busy in the last wave), ``cu_occupancy = min(grid, cus)/cus``, ``blocks_per_xcd =
    ceil(grid/xcds)`` (busiest XCD under round-robin dealing), ``xcd_waves =
    ceil(blocks_per_xcd/(cus/xcds))``, ``xcd_wave_efficiency = grid/(xcd_waves*cus)``,
    ``log2_k_iterations`` (K-loop trips of one block, ceil(tiles_k/split_k)) and
    ``log2_critical_path = log2(xcd_waves*k_iterations)`` (tile steps on the busiest CU).

    Parameters
    ----------
    cus : int, default=256
        Compute units (gfx950: 256).
    xcds : int, default=8
        Accelerator dies the CUs are split over (gfx950: 8); 1 for single-die GPUs.
    input_names : sequence of str or None, default=None
        Column names of X when it is a plain array (see :mod:`ckpred.features.base`).
    """

    input_columns: ClassVar[tuple[str, ...]] = ("m", "n", "k", "split_k", "tile_m", "tile_n", "tile_k")
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **FeatureGroup._parameter_constraints,
        "cus": positive_int(),
        "xcds": positive_int(),
    }

    def __init__(self, *, cus: int = 256, xcds: int = 8, input_names: Sequence[str] | None = None) -> None:
        self.cus = cus
        self.xcds = xcds
        self.input_names = input_names

    def _feature_names(self) -> list[str]:
        return ["log2_grid", "waves", "wave_efficiency", "last_wave_fill", "cu_occupancy",
                "blocks_per_xcd", "xcd_waves", "xcd_wave_efficiency", "log2_k_iterations",
                "log2_critical_path"]

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        cus, xcds = float(self.cus), float(self.xcds)
        split_k = cols["split_k"]
        grid = ceil_div(cols["m"], cols["tile_m"], xp) * ceil_div(cols["n"], cols["tile_n"], xp) * split_k
        waves = xp.ceil(grid / cus)
        per_xcd = xp.ceil(grid / xcds)
        xcd_waves = xp.ceil(per_xcd / (cus / xcds))
        k_iterations = xp.ceil(ceil_div(cols["k"], cols["tile_k"], xp) / split_k)
        return [xp.log2(grid), waves, grid / (waves * cus), (grid - (waves - 1.0) * cus) / cus,
                xp.minimum(grid, cus) / cus, per_xcd, xcd_waves, grid / (xcd_waves * cus),
                xp.log2(k_iterations), xp.log2(xcd_waves * k_iterations)]
