"""Roofline position and an analytical time estimate of each kernel on each problem.

The estimate is deliberately simple (no learning): the busiest CU runs ``xcd_waves *
k_iterations`` block steps of ``2*tile_m*tile_n*tile_k`` FLOPs at its share of the peak, while
all blocks together move their A and B panels and the C tile through HBM at the rated
bandwidth; the kernel takes the longer of the two. It ranks kernels the way a CK engineer's
back-of-the-envelope would, and gives the trees a physically scaled axis to split on.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import numpy as np

from ckpred.features.base import FeatureGroup, ceil_div, positive_int, positive_real


class RooflineFeatures(FeatureGroup):
    """Problem roofline and tile-aware analytical time (10 features, 11 with reference tiles).

    Features (in order): ``log2_flops`` (2MNK), ``log2_min_bytes`` ((MK+KN)*b + MN*b_c: every
    operand moved once), ``roofline_position = log2(intensity / ridge)`` (> 0: compute bound;
    ridge = peak FLOP/s / bandwidth), ``log2_ideal_us`` (max of ideal compute and memory time),
    ``log2_compute_us`` (busiest CU: xcd_waves*k_iterations block steps at peak/cus),
    ``log2_memory_us`` (every block loads its (tile_m+tile_n)*tile_k panels per K step, C
    written once), ``log2_est_us = log2(max(compute, memory))``, ``est_efficiency =
    ideal_us / est_us`` (share of the roofline the kernel can reach, in (0, 1]),
    ``log2_est_tflops`` and ``tile_intensity = 2*tile_m*tile_n / ((tile_m+tile_n)*b)`` (FLOP
    per byte loaded by one block). With ``reference_tiles``, also ``est_vs_best``: this
    kernel's ``log2_est_us`` minus the smallest one among the reference tiles on the same
    problem (0 for the analytically best tile). Absolute times shift with the problem size;
    "how far from the best tile for this problem" does not, which helps a model rank kernels of
    shapes it has not seen.

    Parameters
    ----------
    cus : int, default=256
    xcds : int, default=8
    peak_tflops : float, default=5033.0
        Peak dense TFLOPS of the dtype on the arch (gfx950 fp8: 5033).
    memory_bandwidth_gbs : float, default=8000.0
        HBM bandwidth in GB/s.
    bytes_per_element : int, default=1
        Bytes of an A/B element.
    c_bytes_per_element : int, default=2
        Bytes of a C element (fp8 GEMMs write fp16).
    reference_tiles : list of (tile_m, tile_n, tile_k) or None, default=None
        Tiles ``est_vs_best`` compares against; None leaves the feature out. A feature set
        writes ``reference_tiles: catalogue`` and :func:`ckpred.features.build_features` puts
        the distinct tiles of the op's catalogue for the arch and dtype here.
    input_names : sequence of str or None, default=None
        Column names of X when it is a plain array (see :mod:`ckpred.features.base`).
    """

    input_columns: ClassVar[tuple[str, ...]] = ("m", "n", "k", "split_k", "tile_m", "tile_n", "tile_k")
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **FeatureGroup._parameter_constraints,
        "cus": positive_int(),
        "xcds": positive_int(),
        "peak_tflops": positive_real(),
        "memory_bandwidth_gbs": positive_real(),
        "bytes_per_element": positive_int(),
        "c_bytes_per_element": positive_int(),
        "reference_tiles": [None, list, tuple],
    }

    def __init__(self, *, cus: int = 256, xcds: int = 8, peak_tflops: float = 5033.0,
                 memory_bandwidth_gbs: float = 8000.0, bytes_per_element: int = 1,
                 c_bytes_per_element: int = 2, reference_tiles: Sequence[Sequence[int]] | None = None,
                 input_names: Sequence[str] | None = None) -> None:
        self.cus = cus
        self.xcds = xcds
        self.peak_tflops = peak_tflops
        self.memory_bandwidth_gbs = memory_bandwidth_gbs
        self.bytes_per_element = bytes_per_element
        self.c_bytes_per_element = c_bytes_per_element
        self.reference_tiles = reference_tiles
        self.input_names = input_names

    def _feature_names(self) -> list[str]:
        names = ["log2_flops", "log2_min_bytes", "roofline_position", "log2_ideal_us", "log2_compute_us",
                 "log2_memory_us", "log2_est_us", "est_efficiency", "log2_est_tflops", "tile_intensity"]
        return names + (["est_vs_best"] if self.reference_tiles else [])

    def _estimate(self, cols: dict[str, Any], tm: Any, tn: Any, tk: Any, xp: Any) -> tuple[Any, Any]:
        """(compute_us, memory_us) of tile (tm, tn, tk): columns or Python numbers."""
        m, n, k, split_k = cols["m"], cols["n"], cols["k"], cols["split_k"]
        b, bc = float(self.bytes_per_element), float(self.c_bytes_per_element)
        cus, xcds = float(self.cus), float(self.xcds)
        # Same grid and K-loop as the wave group (conf/features/groups/wave.yaml).
        grid = ceil_div(m, tm, xp) * ceil_div(n, tn, xp) * split_k
        xcd_waves = xp.ceil(xp.ceil(grid / xcds) / (cus / xcds))
        k_iterations = xp.ceil(ceil_div(k, tk, xp) / split_k)
        compute_us = xcd_waves * k_iterations * (2.0 * tm * tn * tk) / (float(self.peak_tflops) * 1e6 / cus)
        traffic = grid * k_iterations * (tm + tn) * tk * b + m * n * bc
        return compute_us, traffic / (float(self.memory_bandwidth_gbs) * 1e3)

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        m, n, k = cols["m"], cols["n"], cols["k"]
        tm, tn = cols["tile_m"], cols["tile_n"]
        b, bc = float(self.bytes_per_element), float(self.c_bytes_per_element)
        flop_per_us = float(self.peak_tflops) * 1e6
        bytes_per_us = float(self.memory_bandwidth_gbs) * 1e3
        flops = 2.0 * m * n * k
        min_bytes = (m * k + k * n) * b + m * n * bc
        ideal_us = xp.maximum(flops / flop_per_us, min_bytes / bytes_per_us)
        compute_us, memory_us = self._estimate(cols, tm, tn, cols["tile_k"], xp)
        est_us = xp.maximum(compute_us, memory_us)
        log2_est = xp.log2(est_us)
        ridge = flop_per_us / bytes_per_us
        out = [xp.log2(flops), xp.log2(min_bytes), xp.log2(flops / min_bytes / ridge), xp.log2(ideal_us),
               xp.log2(compute_us), xp.log2(memory_us), log2_est, ideal_us / est_us,
               xp.log2(flops / est_us / 1e6), 2.0 * tm * tn / ((tm + tn) * b)]
        if self.reference_tiles:
            # Every reference tile at once: an [N, R] block (one row of constants per tile
            # field), then the row-wise minimum.
            tiles = np.asarray(self.reference_tiles, dtype=np.float64)
            problem = {name: xp.as_column(cols[name]) for name in ("m", "n", "k", "split_k")}
            ref = xp.log2(xp.maximum(*self._estimate(problem, xp.row(tiles[:, 0]), xp.row(tiles[:, 1]),
                                                     xp.row(tiles[:, 2]), xp)))
            out.append(log2_est - xp.min_across(ref))
        return out
