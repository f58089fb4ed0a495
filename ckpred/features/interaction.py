"""Problem x kernel interactions: how the problem tiles over the kernel's block tile."""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from ckpred.features.base import FeatureGroup, ceil_div, last_tile_fill, positive_int


class TileInteractionFeatures(FeatureGroup):
    """Tile counts, last-tile fill and output tiles per CU (the reference's 9 interactions).

    Features (in order): ``tiles_m = ceil(M/tile_m)``, ``tiles_n``, ``tiles_k``,
    ``output_tiles = tiles_m*tiles_n``, ``fill_m = (M mod tile_m)/tile_m`` (1 when divisible),
    ``fill_n``, ``fill_k``, ``fill_product = fill_m*fill_n*fill_k``,
    ``output_tiles_per_cu = output_tiles / cus``.

    Parameters
    ----------
    cus : int, default=256
        Compute units of the GPU (gfx950: 256).
    input_names : sequence of str or None, default=None
        Column names of X when it is a plain array (see :mod:`ckpred.features.base`).
    """

    input_columns: ClassVar[tuple[str, ...]] = ("m", "n", "k", "tile_m", "tile_n", "tile_k")
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **FeatureGroup._parameter_constraints,
        "cus": positive_int(),
    }

    def __init__(self, *, cus: int = 256, input_names: Sequence[str] | None = None) -> None:
        self.cus = cus
        self.input_names = input_names

    def _feature_names(self) -> list[str]:
        return ["tiles_m", "tiles_n", "tiles_k", "output_tiles", "fill_m", "fill_n", "fill_k",
                "fill_product", "output_tiles_per_cu"]

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        m, n, k = cols["m"], cols["n"], cols["k"]
        tm, tn, tk = cols["tile_m"], cols["tile_n"], cols["tile_k"]
        tiles_m, tiles_n, tiles_k = ceil_div(m, tm, xp), ceil_div(n, tn, xp), ceil_div(k, tk, xp)
        output_tiles = tiles_m * tiles_n
        fill_m, fill_n, fill_k = last_tile_fill(m, tm, xp), last_tile_fill(n, tn, xp), last_tile_fill(k, tk, xp)
        return [tiles_m, tiles_n, tiles_k, output_tiles, fill_m, fill_n, fill_k,
                fill_m * fill_n * fill_k, output_tiles / float(self.cus)]
