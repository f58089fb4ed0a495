"""Grouped-convolution features: the implicit-GEMM view of a conv and how kernels tile it.

CK Tile runs a grouped 2-D convolution forward as one implicit GEMM per group (see
:mod:`ckpred.kernels.grouped_conv_fwd`): ``gemm_m = n*ho*wo``, ``gemm_n = k``,
``gemm_k = c*y*x`` with ``c``/``k`` the channels per group and
``ho = floor((hi + 2*pad_h - dilation_h*(y-1) - 1) / stride_h) + 1`` (``wo`` likewise).

Four groups, each written once against the ``xp`` namespace so the ONNX converter of
:mod:`ckpred.export.converters` evaluates the very same formulas:

- :class:`ConvProblemFeatures` (``conv_problem``): the conv, its implicit GEMM, arithmetic
  intensity, 1x1 / depthwise / grouped / strided flags and the *latency regime*: ideal compute
  and memory times at the arch's peak, whose maximum is the roofline time. Problems whose
  roofline time is far below a kernel launch (~ microseconds) are launch-bound — the 27
  "under 1 TFLOPS" problems of AMD's set — and trees can split on that regime directly.
- :class:`ConvKernelFeatures` (``conv_kernel``): block tile and the pipeline described by its
  static traits (LDS buffers, prefetch stages; :data:`~ckpred.kernels.grouped_conv_fwd.PIPELINE_TRAITS`)
  rather than by its category code, so a pipeline the training data never had (compv5 in
  AMD's training table) is placed by what it is.
- :class:`ConvTileFeatures` (``conv_tile``): tile and wave quantisation over the CUs, K-loop
  length, and a per-kernel analytical time estimate (max of per-CU compute critical path and
  global traffic, plus a per-iteration latency). Each estimate is also given *relative to the
  best reference tile for the same problem* (``*_vs_best``): the difference between a kernel's
  estimate and the best estimate among the catalogue tiles. Absolute sizes shift between data
  sets; "how far is this tile from the analytically best tile for this problem" does not, which
  is what lets a model trained on one problem set rank kernels on another.
- :class:`ConvLatencyFeatures` (``conv_latency``, feature set ``conv_latency`` only): the same
  estimate with a fixed launch cost and the busiest CU's tile loads, relative to the best tile.
  It did not move AMD's figures (docs/results.md), so the default ``conv_full`` leaves it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from typing import Any, ClassVar, Sequence

from sklearn.utils._param_validation import Interval

from ckpred.features.base import FeatureGroup, ceil_div, last_tile_fill, positive_int, positive_real
from ckpred.kernels.grouped_conv_fwd import PIPELINE_TRAITS, PIPELINE_CODES, TILES_2BYTE

#: Raw problem fields of grouped_conv_fwd, in ``op.problem_names`` order.
PROBLEM_FIELDS: tuple[str, ...] = ("n", "c", "k", "g", "hi", "wi", "y", "x", "stride_h", "stride_w",
                                   "pad_h", "pad_w", "dilation_h", "dilation_w")
TILE_FIELDS: tuple[str, ...] = ("tile_m", "tile_n", "tile_k")


def implicit_gemm(cols: dict[str, Any], xp: Any) -> dict[str, Any]:
    """Output size and implicit-GEMM sizes of each conv (per group)."""
    ho = xp.floor((cols["hi"] + 2.0 * cols["pad_h"] - cols["dilation_h"] * (cols["y"] - 1.0) - 1.0)
                  / cols["stride_h"]) + 1.0
    wo = xp.floor((cols["wi"] + 2.0 * cols["pad_w"] - cols["dilation_w"] * (cols["x"] - 1.0) - 1.0)
                  / cols["stride_w"]) + 1.0
    return {"ho": ho, "wo": wo, "m": cols["n"] * ho * wo, "n": cols["k"],
            "k": cols["c"] * cols["y"] * cols["x"], "g": cols["g"]}


@dataclass(frozen=True)
class TileConstants:
    """The hardware and latency constants of :func:`tile_estimates` (see
    :class:`ConvTileFeatures` for each)."""

    cus: int
    peak_tflops: float
    memory_bandwidth_gbs: float
    bytes_per_element: int
    c_bytes_per_element: int
    iteration_latency_us: float
    tile_latency_us: float


def tile_estimates(gemm: dict[str, Any], tile: tuple[Any, Any, Any], xp: Any, consts: TileConstants) -> dict[str, Any]:
    """Tile/wave quantisation and the analytical time (microseconds) of one block tile.

    The ``tile``'s (tile_m, tile_n, tile_k) are columns or Python numbers (reference tiles). The estimate is
    ``max(compute, memory) + waves*tile_latency + iterations*iteration_latency``: compute is the
    busiest CU's padded MAC blocks at its share of peak; memory is the bytes that really move
    (A re-read once per column of tiles, B once per row of tiles, C written once) at full
    bandwidth; the latency terms are what a block costs beyond its throughput (prologue,
    epilogue store, un-hidden load latency) and dominate launch-bound problems.
    """
    m, n, k, g = gemm["m"], gemm["n"], gemm["k"], gemm["g"]
    tm, tn, tk = tile
    cus, peak_tflops, memory_bandwidth_gbs = consts.cus, consts.peak_tflops, consts.memory_bandwidth_gbs
    bytes_per_element, c_bytes_per_element = consts.bytes_per_element, consts.c_bytes_per_element
    iteration_latency_us, tile_latency_us = consts.iteration_latency_us, consts.tile_latency_us
    tiles_m, tiles_n, tiles_k = ceil_div(m, tm, xp), ceil_div(n, tn, xp), ceil_div(k, tk, xp)
    output_tiles = g * tiles_m * tiles_n
    waves = xp.ceil(output_tiles / float(cus))
    iterations = waves * tiles_k  # K-loop iterations on the busiest CU
    # One block per CU at a time: the busiest CU runs `iterations` MAC blocks of tm*tn*tk.
    compute_us = iterations * (tm * tn * tk * 2.0) / (peak_tflops * 1e6 / float(cus))
    traffic = g * (m * k * tiles_n + k * n * tiles_m) * float(bytes_per_element) \
        + g * m * n * float(c_bytes_per_element)
    memory_us = traffic / (memory_bandwidth_gbs * 1e3)
    est_us = xp.maximum(compute_us, memory_us) + waves * float(tile_latency_us) \
        + iterations * float(iteration_latency_us)
    return {"tiles_m": tiles_m, "tiles_n": tiles_n, "tiles_k": tiles_k, "output_tiles": output_tiles,
            "waves": waves, "iterations": iterations, "compute_us": compute_us, "memory_us": memory_us,
            "est_us": est_us}


class _ConvHardware(FeatureGroup):
    """Shared constructor of the groups that need the arch/dtype constants."""

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **FeatureGroup._parameter_constraints,
        "bytes_per_element": positive_int(),
        "c_bytes_per_element": positive_int(),
        "peak_tflops": positive_real(),
        "memory_bandwidth_gbs": positive_real(),
    }


class ConvProblemFeatures(_ConvHardware):
    """The conv, its implicit GEMM, intensity, shape flags and latency regime (31 features).

    Features (in order): the 12 size fields ``n, c, k, g, y, x, stride_h, stride_w, pad_h,
    pad_w, dilation_h, dilation_w``; ``ho, wo``; ``gemm_m, gemm_n, gemm_k`` and their log2;
    ``log2_flops`` (``2*g*gemm_m*gemm_n*gemm_k``); ``arithmetic_intensity`` = FLOPs / bytes of
    input + weights + output (each read or written once); ``gemm_arithmetic_intensity`` = the
    implicit GEMM's ``2MNK / ((MK + KN)*b + MN*b_c)`` (im2col re-reads input pixels
    ``y*x/(stride_h*stride_w)`` times); flags ``is_1x1`` (y = x = 1), ``is_depthwise``
    (c = 1 and g > 1), ``is_grouped`` (g > 1), ``is_strided``; ``log2_compute_us`` and
    ``log2_memory_us`` (ideal times at peak TFLOPS and bandwidth) and ``log2_roofline_us``
    (their maximum): the latency regime.

    Parameters
    ----------
    bytes_per_element : int, default=2
        Bytes of one input/weight element (bf16: 2).
    c_bytes_per_element : int, default=2
        Bytes of one output element.
    peak_tflops : float, default=2517.0
        Peak dense TFLOPS of the dtype on the arch (gfx950 bf16: 2517).
    memory_bandwidth_gbs : float, default=8000.0
        HBM bandwidth in GB/s (gfx950: 8000).
    input_names : sequence of str or None, default=None
        Column names of X when it is a plain array (see :mod:`ckpred.features.base`).
    """

    input_columns: ClassVar[tuple[str, ...]] = PROBLEM_FIELDS

    def __init__(self, *, bytes_per_element: int = 2, c_bytes_per_element: int = 2,
                 peak_tflops: float = 2517.0, memory_bandwidth_gbs: float = 8000.0,
                 input_names: Sequence[str] | None = None) -> None:
        self.bytes_per_element = bytes_per_element
        self.c_bytes_per_element = c_bytes_per_element
        self.peak_tflops = peak_tflops
        self.memory_bandwidth_gbs = memory_bandwidth_gbs
        self.input_names = input_names

    _SIZES: ClassVar[tuple[str, ...]] = ("n", "c", "k", "g", "y", "x", "stride_h", "stride_w", "pad_h",
                                         "pad_w", "dilation_h", "dilation_w")

    def _feature_names(self) -> list[str]:
        return [*self._SIZES, "ho", "wo", "gemm_m", "gemm_n", "gemm_k", "log2_gemm_m", "log2_gemm_n",
                "log2_gemm_k", "log2_flops", "arithmetic_intensity", "gemm_arithmetic_intensity",
                "is_1x1", "is_depthwise", "is_grouped", "is_strided", "log2_compute_us",
                "log2_memory_us", "log2_roofline_us"]

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        gemm = implicit_gemm(cols, xp)
        m, n, k, g = gemm["m"], gemm["n"], gemm["k"], gemm["g"]
        b, bc = float(self.bytes_per_element), float(self.c_bytes_per_element)
        flops = 2.0 * g * m * n * k
        tensor_bytes = (cols["n"] * cols["hi"] * cols["wi"] * cols["c"] * g + g * n * k) * b + g * m * n * bc
        gemm_bytes = g * ((m * k + k * n) * b + m * n * bc)
        compute_us = flops / (float(self.peak_tflops) * 1e6)
        memory_us = tensor_bytes / (float(self.memory_bandwidth_gbs) * 1e3)
        one = xp.full(1.0)
        return [*(cols[s] for s in self._SIZES), gemm["ho"], gemm["wo"], m, n, k,
                xp.log2(m), xp.log2(n), xp.log2(k), xp.log2(flops), flops / tensor_bytes, flops / gemm_bytes,
                xp.indicator(xp.equal(cols["y"] * cols["x"], one)),
                xp.indicator(xp.equal(cols["c"], one)) * xp.indicator(xp.less(one, g)),
                xp.indicator(xp.less(one, g)),
                xp.indicator(xp.less(one, cols["stride_h"] * cols["stride_w"])),
                xp.log2(compute_us), xp.log2(memory_us), xp.log2(xp.maximum(compute_us, memory_us))]


class ConvKernelFeatures(FeatureGroup):
    """Block tile, pipeline traits and LDS footprint of a conv kernel (10 features).

    Features (in order): ``tile_m, tile_n, tile_k, spatial_dims``; ``lds_buffers`` and
    ``prefetch_stages`` of the pipeline (looked up from its code in
    :data:`~ckpred.kernels.grouped_conv_fwd.PIPELINE_TRAITS`); ``tile_volume``, ``tile_mn``;
    ``lds_bytes_est = (tile_m + tile_n)*tile_k*bytes*lds_buffers`` and ``lds_ratio`` (its share
    of the CU's LDS); with ``include_pipeline_code`` also the raw ``pipeline`` code.

    The pipeline code is left out by default: a tree splits a code it saw as 0 and 1 at 0.5, so
    an unseen code 2 (compv5) would be scored as whichever pipeline happens to sit on that side
    of the split. Traits place it by what it is (one LDS buffer, like compv3).

    Parameters
    ----------
    bytes_per_element : int, default=2
        Bytes of one input/weight element.
    lds_bytes : int, default=163840
        LDS capacity per CU in bytes (gfx950: 160 KiB).
    include_pipeline_code : bool, default=False
        Also emit the pipeline's category code.
    input_names : sequence of str or None, default=None
        Column names of X when it is a plain array (see :mod:`ckpred.features.base`).
    """

    input_columns: ClassVar[tuple[str, ...]] = (*TILE_FIELDS, "pipeline", "spatial_dims")
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **FeatureGroup._parameter_constraints,
        "bytes_per_element": positive_int(),
        "lds_bytes": positive_int(),
        "include_pipeline_code": ["boolean"],
    }

    def __init__(self, *, bytes_per_element: int = 2, lds_bytes: int = 163840,
                 include_pipeline_code: bool = False, input_names: Sequence[str] | None = None) -> None:
        self.bytes_per_element = bytes_per_element
        self.lds_bytes = lds_bytes
        self.include_pipeline_code = include_pipeline_code
        self.input_names = input_names

    def _feature_names(self) -> list[str]:
        names = ["tile_m", "tile_n", "tile_k", "spatial_dims", "lds_buffers", "prefetch_stages",
                 "tile_volume", "tile_mn", "lds_bytes_est", "lds_ratio"]
        return names + (["pipeline"] if self.include_pipeline_code else [])

    @staticmethod
    def _trait(code: Any, trait: str, xp: Any) -> Any:
        """Trait of the pipeline with category ``code`` (sum of one-hot x value; 0 if unknown)."""
        out = xp.full(0.0)
        for i, name in enumerate(PIPELINE_CODES):
            out = out + xp.indicator(xp.equal(code, xp.full(float(i)))) * float(PIPELINE_TRAITS[name][trait])
        return out

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        tm, tn, tk = cols["tile_m"], cols["tile_n"], cols["tile_k"]
        buffers = self._trait(cols["pipeline"], "lds_buffers", xp)
        lds = (tm + tn) * tk * float(self.bytes_per_element) * buffers
        out = [tm, tn, tk, cols["spatial_dims"], buffers, self._trait(cols["pipeline"], "prefetch_stages", xp),
               tm * tn * tk, tm * tn, lds, lds / float(self.lds_bytes)]
        return out + ([cols["pipeline"]] if self.include_pipeline_code else [])


class ConvTileFeatures(_ConvHardware):
    """Tile and wave quantisation, K-loop length and analytical time of a kernel on a conv.

    Features (in order): ``tiles_m, tiles_n, tiles_k`` (ceil of the implicit-GEMM sizes over
    the block tile), ``output_tiles = g*tiles_m*tiles_n`` (the grid), ``fill_m, fill_n,
    fill_k`` (share of the last tile holding data), ``mn_efficiency`` (useful / padded output
    elements), ``k_efficiency``, ``waves = ceil(output_tiles/cus)``, ``wave_efficiency =
    output_tiles / (waves*cus)``, ``cu_occupancy = min(output_tiles, cus)/cus``,
    ``log2_iterations`` (K-loop iterations on the busiest CU, waves*tiles_k),
    ``log2_compute_us``, ``log2_memory_us``, ``log2_est_us`` (see :func:`tile_estimates`), and
    the same four log2 quantities minus their minimum over ``reference_tiles`` for the same
    problem: ``iterations_vs_best, compute_vs_best, memory_vs_best, est_vs_best`` (0 for the
    analytically best tile, log2 of the slowdown otherwise).

    Parameters
    ----------
    cus : int, default=256
        Compute units (gfx950: 256).
    bytes_per_element, c_bytes_per_element : int, default=2
        Bytes of an input/weight and an output element.
    peak_tflops : float, default=2517.0
        Peak dense TFLOPS of the dtype.
    memory_bandwidth_gbs : float, default=8000.0
        HBM bandwidth in GB/s.
    iteration_latency_us : float, default=0.05
        Fixed cost of one K-loop iteration (global load latency not hidden by the pipeline);
        dominates the estimate of launch-bound problems.
    tile_latency_us : float, default=0.3
        Fixed cost of one block tile on a CU (prologue, epilogue store): a prior of the order
        of a global-memory round trip, not fitted (its sensitivity: docs/results.md, "Conv
        tile latency prior").
    reference_tiles : sequence of (tile_m, tile_n, tile_k) or None, default=None
        Tiles the ``*_vs_best`` features compare against; None = the op's catalogue tiles
        (:data:`~ckpred.kernels.grouped_conv_fwd.TILES_2BYTE`).
    input_names : sequence of str or None, default=None
        Column names of X when it is a plain array (see :mod:`ckpred.features.base`).
    """

    input_columns: ClassVar[tuple[str, ...]] = (*PROBLEM_FIELDS, *TILE_FIELDS)
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **_ConvHardware._parameter_constraints,
        "cus": positive_int(),
        "iteration_latency_us": [Interval(Real, 0, None, closed="left")],
        "tile_latency_us": [Interval(Real, 0, None, closed="left")],
        "reference_tiles": [None, list, tuple],
    }

    def __init__(self, *, cus: int = 256, bytes_per_element: int = 2, c_bytes_per_element: int = 2,
                 peak_tflops: float = 2517.0, memory_bandwidth_gbs: float = 8000.0,
                 iteration_latency_us: float = 0.05, tile_latency_us: float = 0.3,
                 reference_tiles: Sequence[Sequence[int]] | None = None,
                 input_names: Sequence[str] | None = None) -> None:
        self.cus = cus
        self.bytes_per_element = bytes_per_element
        self.c_bytes_per_element = c_bytes_per_element
        self.peak_tflops = peak_tflops
        self.memory_bandwidth_gbs = memory_bandwidth_gbs
        self.iteration_latency_us = iteration_latency_us
        self.tile_latency_us = tile_latency_us
        self.reference_tiles = reference_tiles
        self.input_names = input_names

    _RELATIVE: ClassVar[tuple[tuple[str, str], ...]] = (
        ("iterations_vs_best", "iterations"), ("compute_vs_best", "compute_us"),
        ("memory_vs_best", "memory_us"), ("est_vs_best", "est_us"))

    def estimate_constants(self) -> TileConstants:
        """The hardware and latency constants of the estimate, for :func:`tile_estimates`."""
        return TileConstants(cus=self.cus, peak_tflops=float(self.peak_tflops),
                    memory_bandwidth_gbs=float(self.memory_bandwidth_gbs),
                    bytes_per_element=self.bytes_per_element, c_bytes_per_element=self.c_bytes_per_element,
                    iteration_latency_us=float(self.iteration_latency_us),
                    tile_latency_us=float(self.tile_latency_us))

    def _feature_names(self) -> list[str]:
        return ["tiles_m", "tiles_n", "tiles_k", "output_tiles", "fill_m", "fill_n", "fill_k",
                "mn_efficiency", "k_efficiency", "waves", "wave_efficiency", "cu_occupancy",
                "log2_iterations", "log2_compute_us", "log2_memory_us", "log2_est_us",
                *(name for name, _ in self._RELATIVE)]

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        gemm = implicit_gemm(cols, xp)
        tm, tn, tk = cols["tile_m"], cols["tile_n"], cols["tile_k"]
        consts = self.estimate_constants()
        est = tile_estimates(gemm, (tm, tn, tk), xp, consts)
        m, n, k = gemm["m"], gemm["n"], gemm["k"]
        out = [est["tiles_m"], est["tiles_n"], est["tiles_k"], est["output_tiles"],
               last_tile_fill(m, tm, xp), last_tile_fill(n, tn, xp), last_tile_fill(k, tk, xp),
               m * n / (est["tiles_m"] * tm * est["tiles_n"] * tn), k / (est["tiles_k"] * tk),
               est["waves"], est["output_tiles"] / (est["waves"] * float(self.cus)),
               xp.minimum(est["output_tiles"], float(self.cus)) / float(self.cus)]
        logs = {key: xp.log2(est[key]) for _, key in self._RELATIVE}
        out += [logs["iterations"], logs["compute_us"], logs["memory_us"], logs["est_us"]]
        tiles = TILES_2BYTE if self.reference_tiles is None else self.reference_tiles
        best: dict[str, Any] = {}
        for rm, rn, rk in tiles:
            ref = tile_estimates(gemm, (float(rm), float(rn), float(rk)), xp, consts)
            for _, key in self._RELATIVE:
                best[key] = ref[key] if key not in best else xp.minimum(best[key], ref[key])
        # log2 of the ratio, not a difference of logs: the best tile's ratio is exactly 1 in both
        # backends (same IEEE operations), so its feature is exactly 0 — LightGBM puts a bin
        # boundary at +-1e-35 around zero, and a 1-ulp difference between numpy's and
        # onnxruntime's Log would send the best tile down another branch.
        out += [xp.log2(est[key] / best[key]) for _, key in self._RELATIVE]
        return out


class ConvLatencyFeatures(ConvTileFeatures):
    """The latency regime of a kernel on a conv: its estimated total time with a fixed launch cost.

    Efficiency is a ratio of *total* kernel times, and every kernel pays a fixed cost (launch,
    prologue, epilogue) that :class:`ConvTileFeatures`' throughput estimate leaves out. On a
    launch-bound problem (a few microseconds of work) that cost dominates and the tiles' times
    differ by tens of percent, not by the factors the throughput estimate predicts. On a grid
    smaller than the chip, the time of a tile is bounded by how fast its own CU can load it,
    which the chip-wide traffic term misses. The estimate here is::

        total_us = launch_us + max(est_us, cu_load_us)
        cu_load_us = iterations * (tile_m + tile_n) * tile_k * bytes / (bandwidth / cus)

    with ``est_us`` and ``iterations`` from :func:`tile_estimates` (the busiest CU's K-loop
    iterations).

    Features (in order): ``log2_total_us``; ``total_vs_best``, log2 of ``total_us`` over the
    smallest ``total_us`` among ``reference_tiles`` for the same problem (the predicted
    efficiency loss once the fixed cost is counted); ``launch_share = launch_us / total_us``
    (near 1: launch-bound); ``tiles_per_cu = g*tiles_m*tiles_n / cus`` (unrounded: below 1 the
    grid leaves CUs idle); ``log2_cu_load_us`` and ``cu_load_vs_best`` (same construction).

    On AMD's gfx950 conv data these features did not move the selection measurably
    (docs/results.md, "Grouped convolution forward": within 0.05 points of ``conv_full`` on the
    training-table CV), so the default conv set leaves them out; ``features=conv_latency``
    adds them.

    Parameters
    ----------
    launch_us : float, default=3.5
        Fixed cost of a kernel launch in microseconds: the floor of the training table's
        measured times (the fastest kernel of AMD's 20-kernel gfx950 table runs in 3.7 us).
    cus, bytes_per_element, c_bytes_per_element, peak_tflops, memory_bandwidth_gbs, \
iteration_latency_us, tile_latency_us, reference_tiles, input_names
        As in :class:`ConvTileFeatures` (``est_us`` is the same estimate).
    """

    input_columns: ClassVar[tuple[str, ...]] = (*PROBLEM_FIELDS, *TILE_FIELDS)
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **ConvTileFeatures._parameter_constraints,
        "launch_us": [Interval(Real, 0, None, closed="left")],
    }

    def __init__(self, *, launch_us: float = 3.5, cus: int = 256, bytes_per_element: int = 2,
                 c_bytes_per_element: int = 2, peak_tflops: float = 2517.0,
                 memory_bandwidth_gbs: float = 8000.0, iteration_latency_us: float = 0.05,
                 tile_latency_us: float = 0.3, reference_tiles: Sequence[Sequence[int]] | None = None,
                 input_names: Sequence[str] | None = None) -> None:
        super().__init__(cus=cus, bytes_per_element=bytes_per_element, c_bytes_per_element=c_bytes_per_element,
                         peak_tflops=peak_tflops, memory_bandwidth_gbs=memory_bandwidth_gbs,
                         iteration_latency_us=iteration_latency_us, tile_latency_us=tile_latency_us,
                         reference_tiles=reference_tiles, input_names=input_names)
        self.launch_us = launch_us

    def _feature_names(self) -> list[str]:
        return ["log2_total_us", "total_vs_best", "launch_share", "tiles_per_cu", "log2_cu_load_us",
                "cu_load_vs_best"]

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        gemm = implicit_gemm(cols, xp)
        consts = self.estimate_constants()
        launch = float(self.launch_us)
        per_cu_bytes_per_us = float(self.memory_bandwidth_gbs) * 1e3 / float(self.cus)

        def times(tm: Any, tn: Any, tk: Any) -> tuple[Any, Any]:
            est = tile_estimates(gemm, (tm, tn, tk), xp, consts)
            # The busiest CU loads its A and B tiles at its share of the bandwidth: on a grid
            # smaller than the chip this, not the chip-wide traffic, bounds the time.
            load = est["iterations"] * (tm + tn) * tk * float(self.bytes_per_element) / per_cu_bytes_per_us
            return launch + xp.maximum(est["est_us"], load), load

        total, load = times(cols["tile_m"], cols["tile_n"], cols["tile_k"])
        best_total = best_load = None
        for rm, rn, rk in (TILES_2BYTE if self.reference_tiles is None else self.reference_tiles):
            t, ld = times(float(rm), float(rn), float(rk))
            best_total = t if best_total is None else xp.minimum(best_total, t)
            best_load = ld if best_load is None else xp.minimum(best_load, ld)
        tiles = ceil_div(gemm["m"], cols["tile_m"], xp) * ceil_div(gemm["n"], cols["tile_n"], xp) * gemm["g"]
        return [xp.log2(total), xp.log2(total / best_total), launch / total, tiles / float(self.cus),
                xp.log2(load), xp.log2(load / best_load)]
