"""CK Tile grouped convolution forward (2-D): fields, kernel-name grammar, catalogue, validity.

Conventions follow CK's ``ConvParam`` (the tile engine that produced the measurements builds
one from the same columns): ``g`` groups, ``n`` batch, ``k`` output channels **per group**,
``c`` input channels **per group**, input ``hi x wi``, filter ``y x x``, strides, symmetric
pads and dilations (default 1). Output size::

    ho = (hi + 2*pad_h - dilation_h*(y - 1) - 1) // stride_h + 1      (wo likewise)

CK Tile runs the convolution as one implicit GEMM per group: M = n*ho*wo, N = k,
K = c*y*x, so ``flops = 2*g*n*k*c*ho*wo*y*x``. With the NHWGC input, GKYXC weight and NHWGK
output CK Tile uses, that implicit GEMM is A[M, K] row-major, B[K, N] column-major (KYXC: the
reduction dimension is contiguous) and C[M, N] row-major — i.e. layout ``rcr``. That is why
the op needs no new layout option: ``layout=rcr`` is the truthful description of the GEMM
the kernels run (see the op YAML).

Kernel names: ``grouped_conv_forward_{dtype}_{2d|3d}_{tile_m}x{tile_n}x{tile_k}_{pipeline}``;
the pipeline is everything after the tile triple (it may contain ``_`` in newer versions).

Catalogue: the tile engine's grouped-conv forward tile list for bf16/fp16 (10 block tiles,
all with 256 threads) times the compute pipelines compv5, compv4, compv3 (30 kernels, the
kernel set of AMD's 300-problem gfx950 table). Validity: every kernel of the list runs every
well-formed problem (the measurements have no failed kernel, including C = K = 3); a problem
with an empty output (ho or wo < 1), a non-positive size or a 3-D kernel on a 2-D problem has
no kernel.

Families: by implicit-GEMM M = n*ho*wo with the GEMM bounds (tiny < 8 <= small < 128 <= medium
< 1024 <= large), so conv and GEMM reports read the same way; M is the dimension whose tile
quantisation dominates kernel choice for convs as it does for GEMMs.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ckpred.errors import KernelNameError
from ckpred.kernels.base import Field, OpDefinition

#: Pipeline category codes (append only: codes are model inputs).
PIPELINES: tuple[str, ...] = ("compv3", "compv4", "compv5", "mem", "compv6")

#: Static traits of each pipeline from CK Tile's ``BaseGemmPipelineAgBgCrCompV*`` structs:
#: LDS buffers (compv4 ping-pongs two), global prefetch stages. Features describe a pipeline by
#: these numbers, so a pipeline absent from training is placed by what it is, not by its code.
PIPELINE_TRAITS: dict[str, dict[str, int]] = {
    "compv3": {"lds_buffers": 1, "prefetch_stages": 2},
    "compv4": {"lds_buffers": 2, "prefetch_stages": 2},
    "compv5": {"lds_buffers": 1, "prefetch_stages": 1},
    "mem": {"lds_buffers": 1, "prefetch_stages": 1},
    "compv6": {"lds_buffers": 1, "prefetch_stages": 3},
}

#: Block tiles (tile_m, tile_n, tile_k) of the tile engine's grouped-conv forward config for
#: 2-byte types, the list AMD benchmarked on gfx950. It is a hand-picked list, not a product
#: rule: tile_m in {16, 32, 64, 128}, tile_n in {64, 128}, tile_k in {64, 128}, never
#: tile_n = tile_k = 128, and of the remaining 12 the tile engine omits 16x128x64 and 128x64x64.
TILES_2BYTE: tuple[tuple[int, int, int], ...] = (
    (16, 64, 64), (16, 64, 128),
    (32, 64, 64), (32, 64, 128), (32, 128, 64),
    (64, 64, 64), (64, 64, 128), (64, 128, 64),
    (128, 64, 128), (128, 128, 64),
)
#: Pipelines of the catalogue, in catalogue order: newest generation first. Catalogue order is
#: the selector's tie-break (equal scores -> lower kernel id), and exact ties happen when the
#: model cannot tell kernels apart — e.g. a pipeline absent from training, placed by its traits
#: next to its seen twin (compv5 next to compv3). The prior is the library's own: a pipeline
#: generation is added because it does at least as well as its predecessor where it applies.
CATALOGUE_PIPELINES: tuple[str, ...] = ("compv5", "compv4", "compv3")
#: Tile lists per dtype (the tile engine has one list per element width).
TILES: dict[str, tuple[tuple[int, int, int], ...]] = {"bf16": TILES_2BYTE, "fp16": TILES_2BYTE}

PREFIX = "grouped_conv_forward_"
_TILE = re.compile(r"^(\d+)x(\d+)x(\d+)$")
_DIMS = re.compile(r"^([23])d$")


def output_size(size: np.ndarray, kernel: np.ndarray, stride: np.ndarray, pad: np.ndarray,
                dilation: np.ndarray) -> np.ndarray:
    """Output length of one spatial dimension (floor division; < 1 means an empty output)."""
    size, kernel, stride, pad, dilation = (np.asarray(a, dtype=np.int64)
                                           for a in (size, kernel, stride, pad, dilation))
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // np.maximum(stride, 1) + 1


class GroupedConvFwd(OpDefinition):
    """CK Tile grouped 2-D convolution forward, run as one implicit GEMM per group."""

    name = "grouped_conv_fwd"
    problem_fields = (
        Field("n"), Field("c"), Field("k"), Field("g"), Field("hi"), Field("wi"), Field("y"),
        Field("x"), Field("stride_h"), Field("stride_w"), Field("pad_h"), Field("pad_w"),
        Field("dilation_h", default=1), Field("dilation_w", default=1),
    )
    kernel_fields = (
        Field("tile_m"), Field("tile_n"), Field("tile_k"),
        Field("pipeline", "category", PIPELINES),
        Field("spatial_dims", default=2),
    )
    #: Every problem field: two problems are the same convolution only when all agree.
    group_key = ("n", "c", "k", "g", "hi", "wi", "y", "x", "stride_h", "stride_w", "pad_h",
                 "pad_w", "dilation_h", "dilation_w")
    families = ("tiny", "small", "medium", "large")
    #: Family bounds on the implicit-GEMM M = n*ho*wo (same bounds as gemm_universal's M).
    family_bounds = (8, 128, 1024)

    # -- names ---------------------------------------------------------------------------------
    def parse_name(self, name: str) -> dict[str, Any]:
        if not isinstance(name, str):
            raise KernelNameError(str(name), "not a string")
        if not name.startswith(PREFIX):
            raise KernelNameError(name, f"expected prefix {PREFIX!r} (grouped convolution forward)")
        parts = name[len(PREFIX):].split("_")
        # dtype, spatial dims, tile triple, pipeline (>= 1 part)
        if len(parts) < 4:
            raise KernelNameError(name, "expected '<dtype>_<2d|3d>_<tile_m>x<tile_n>x<tile_k>_<pipeline>' "
                                        f"after the prefix, got {len(parts)} '_'-separated parts")
        dims = _DIMS.match(parts[1])
        if not dims:
            raise KernelNameError(name, f"expected spatial dims '2d' or '3d', got {parts[1]!r}")
        tile = _TILE.match(parts[2])
        if not tile:
            raise KernelNameError(name, f"expected tile_m x tile_n x tile_k as '<int>x<int>x<int>', got {parts[2]!r}")
        pipeline = "_".join(parts[3:])
        if pipeline not in PIPELINES:
            raise KernelNameError(name, f"pipeline {pipeline!r} not in {list(PIPELINES)}")
        tm, tn, tk = (int(v) for v in tile.groups())
        return {"dtype": parts[0], "spatial_dims": int(dims.group(1)), "tile_m": tm, "tile_n": tn,
                "tile_k": tk, "pipeline": pipeline}

    def format_name(self, kernel: Mapping[str, Any], *, dtype: str, layout: str = "rcr") -> str:
        dims = int(kernel.get("spatial_dims", 2))
        tile = "x".join(str(int(kernel[f])) for f in ("tile_m", "tile_n", "tile_k"))
        return f"{PREFIX}{dtype}_{dims}d_{tile}_{kernel['pipeline']}"

    # -- candidate space -----------------------------------------------------------------------
    def catalogue(self, arch: Any, dtype: Any, layout: Any) -> pd.DataFrame:
        dtype_name = getattr(dtype, "name", dtype)
        tiles = TILES.get(dtype_name)
        if tiles is None:
            raise ValueError(f"no grouped_conv_fwd tile list for dtype={dtype_name}; "
                             f"supported: {sorted(TILES)}")
        rows = [{"tile_m": tm, "tile_n": tn, "tile_k": tk, "pipeline": p, "spatial_dims": 2}
                for tm, tn, tk in tiles for p in CATALOGUE_PIPELINES]
        frame = pd.DataFrame(rows, columns=list(self.kernel_names))
        names = [self.format_name(r, dtype=dtype_name) for r in frame.to_dict("records")]
        frame.insert(0, "kernel_name", names)
        frame.insert(0, "kernel_id", np.arange(len(frame), dtype=np.int64))
        return frame

    def output_hw(self, problems: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Output height and width of each problem."""
        col = _columns(problems)
        ho = output_size(col("hi"), col("y"), col("stride_h"), col("pad_h"), col("dilation_h"))
        wo = output_size(col("wi"), col("x"), col("stride_w"), col("pad_w"), col("dilation_w"))
        return ho, wo

    def validity(self, problems: pd.DataFrame, kernels: pd.DataFrame, *, arch: Any = None,
                 dtype: Any = None, layout: Any = None) -> tuple[np.ndarray, np.ndarray]:
        col = _columns(problems)
        reason = np.full(len(problems), "", dtype=object)

        def mark(bad: np.ndarray, text: str) -> None:
            reason[bad & (reason == "")] = text

        sizes = ("n", "c", "k", "g", "hi", "wi", "y", "x", "stride_h", "stride_w", "dilation_h", "dilation_w")
        mark(np.any([col(f) < 1 for f in sizes], axis=0), f"degenerate problem: one of {list(sizes)} < 1")
        mark((col("pad_h") < 0) | (col("pad_w") < 0), "negative padding")
        ho, wo = self.output_hw(problems)
        mark((ho < 1) | (wo < 1), "empty output (Ho or Wo < 1): no kernel supports it")
        dims = kernels["spatial_dims"].to_numpy(np.int64) if "spatial_dims" in kernels else np.full(len(problems), 2)
        mark(dims != 2, "kernel is not a 2-D convolution kernel")
        return reason == "", reason

    def validity_onnx(self, g: Any, problem: str, catalogue: pd.DataFrame, *, arch: Any = None,
                      dtype: Any = None, layout: Any = None) -> str:
        """:meth:`validity` as ONNX nodes for the exported selector: a bool [B, C] mask.

        ``ho >= 1`` is tested as ``hi + 2*pad_h - dilation_h*(y - 1) - 1 >= 0`` (the same
        condition without a division: ONNX integer Div truncates where Python floors).
        """
        names = list(self.problem_names)
        col = {f: g.column(problem, names.index(f), f) for f in names}
        one, zero = g.const(1, dtype=np.int64), g.const(0, dtype=np.int64)
        bad = None
        for f in ("n", "c", "k", "g", "hi", "wi", "y", "x", "stride_h", "stride_w", "dilation_h", "dilation_w"):
            term = g.op("Less", col[f], one)
            bad = term if bad is None else g.op("Or", bad, term)
        for f in ("pad_h", "pad_w"):
            bad = g.op("Or", bad, g.op("Less", col[f], zero))
        for size, pad, kern, dil in (("hi", "pad_h", "y", "dilation_h"), ("wi", "pad_w", "x", "dilation_w")):
            span = g.op("Add", g.op("Mul", col[dil], g.op("Sub", col[kern], one)), one)
            room = g.op("Sub", g.op("Add", col[size], g.op("Add", col[pad], col[pad])), span)
            bad = g.op("Or", bad, g.op("Less", room, zero))  # [B, 1]
        dims = catalogue["spatial_dims"].to_numpy(np.int64)[None, :] if "spatial_dims" in catalogue \
            else np.full((1, len(catalogue)), 2, dtype=np.int64)
        kernel_ok = g.const(dims == 2, "kernel_is_2d")  # [1, C]
        return g.op("And", g.op("Not", bad), kernel_ok)

    def gemm_view(self, problems: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Implicit-GEMM sizes per group: (M = n*ho*wo, N = k, K = c*y*x)."""
        col = _columns(problems)
        ho, wo = self.output_hw(problems)
        return col("n") * ho * wo, col("k"), col("c") * col("y") * col("x")

    def flops(self, problems: pd.DataFrame) -> np.ndarray:
        m, n, k = (v.astype(np.float64) for v in self.gemm_view(problems))
        return 2.0 * _columns(problems)("g").astype(np.float64) * m * n * k

    def family(self, problems: pd.DataFrame) -> np.ndarray:
        m = self.gemm_view(problems)[0]
        return np.asarray(self.families, dtype=object)[np.searchsorted(self.family_bounds, m, side="right")]


def _columns(problems: pd.DataFrame):  # noqa: ANN202 - small local accessor
    """Accessor of int64 problem columns; absent dilation columns default to 1."""

    def col(name: str) -> np.ndarray:
        if name in problems:
            return problems[name].to_numpy(np.int64)
        if name in ("dilation_h", "dilation_w"):
            return np.ones(len(problems), dtype=np.int64)
        raise KeyError(f"grouped_conv_fwd problems need column {name!r}; got {list(problems.columns)}")

    return col


OP = GroupedConvFwd()
