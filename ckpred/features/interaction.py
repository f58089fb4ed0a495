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


class TileQuantizationFeatures(FeatureGroup):
    """How well the problem fills the block tile, and which padding it needs (16 features).

    The later version of the reference system adds the first 12 of these.

    Features (in order): ``m_over_tile_m = M/tile_m``, ``n_over_tile_n``, ``k_over_tile_k``;
    ``m_lt_tile`` (1 if M < tile_m, the tile is mostly empty), ``n_lt_tile``, ``k_lt_tile``;
    ``need_pad_m`` (1 if M is not a multiple of tile_m), ``need_pad_n``, ``need_pad_k``;
    ``missing_pad_m = need_pad_m * (1 - pad_m)`` (the kernel cannot run such a problem along a
    contiguous dimension), ``missing_pad_n``, ``missing_pad_k``; ``util_m = M / (tiles_m*tile_m)``
    (useful share of the padded extent), ``util_n``, ``util_k`` and ``util_mnk`` (useful share
    of the MACs the kernel performs).

    Parameters
    ----------
    input_names : sequence of str or None, default=None
        Column names of X when it is a plain array (see :mod:`ckpred.features.base`).
    """

    input_columns: ClassVar[tuple[str, ...]] = ("m", "n", "k", "tile_m", "tile_n", "tile_k",
                                                "pad_m", "pad_n", "pad_k")

    def __init__(self, *, input_names: Sequence[str] | None = None) -> None:
        self.input_names = input_names

    def _feature_names(self) -> list[str]:
        names = []
        for pattern in ("{d}_over_tile_{d}", "{d}_lt_tile", "need_pad_{d}", "missing_pad_{d}", "util_{d}"):
            names += [pattern.format(d=d) for d in "mnk"]
        return [*names, "util_mnk"]

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        dims = [(cols[d], cols[f"tile_{d}"], cols[f"pad_{d}"]) for d in "mnk"]
        ratio = [x / t for x, t, _ in dims]
        smaller = [xp.indicator(xp.less(x, t)) for x, t, _ in dims]
        need = [1.0 - xp.indicator(xp.equal(xp.fmod(x, t), 0.0)) for x, t, _ in dims]
        missing = [nd * (1.0 - p) for nd, (_, _, p) in zip(need, dims)]
        util = [x / (ceil_div(x, t, xp) * t) for x, t, _ in dims]
        return [*ratio, *smaller, *need, *missing, *util, util[0] * util[1] * util[2]]
