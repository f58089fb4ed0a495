"""CK Tile grouped convolution forward (2-D)'s plug-in: the catalogue and the implicit-GEMM view.

The op itself (fields, kernel-id template, validity rules, FLOPs, families, keys) is
``conf/op/grouped_conv_fwd.yaml``; this module holds what that file cannot say: the tile
engine's hand-picked tile list and the implicit-GEMM sizes the analytical baseline reads.

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

Kernel names: ``grouped_conv_forward_{dtype}_{spatial_dims}d_{tile_m}x{tile_n}x{tile_k}_{pipeline}``
(the YAML's template; a pipeline value may contain ``_``).

Catalogue: the tile engine's grouped-conv forward tile list for bf16/fp16 (10 block tiles,
all with 256 threads) times the compute pipelines compv5, compv4, compv3 (30 kernels, the
kernel set of AMD's 300-problem gfx950 table). Validity (the YAML's rules): every kernel of
the list runs every well-formed problem (the measurements have no failed kernel, including
C = K = 3); a problem with an empty output (ho or wo < 1), a non-positive size or a 3-D kernel
on a 2-D problem has no kernel.

Families: by implicit-GEMM M = n*ho*wo with the GEMM bounds (tiny < 8 <= small < 128 <= medium
< 1024 <= large), so conv and GEMM reports read the same way; M is the dimension whose tile
quantisation dominates kernel choice for convs as it does for GEMMs.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pandas as pd

from ckpred.errors import ConfigValueError
from ckpred.kernels.base import ArchSpec, DtypeSpec, LayoutSpec, load_op, packaged_op_config
from ckpred.kernels.declared import DeclaredOp
from ckpred.kernels.definition import spec_name

#: Pipeline category codes of the op's YAML (append only: codes are model inputs).
PIPELINE_CODES: tuple[str, ...] = tuple(packaged_op_config("grouped_conv_fwd")["kernel_fields"]["pipeline"]["values"])

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



def output_size(size: np.ndarray, kernel: np.ndarray, stride: np.ndarray, pad: np.ndarray,
                dilation: np.ndarray) -> np.ndarray:
    """Output length of one spatial dimension (floor division; < 1 means an empty output)."""
    size, kernel, stride, pad, dilation = (np.asarray(a, dtype=np.int64)
                                           for a in (size, kernel, stride, pad, dilation))
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // np.maximum(stride, 1) + 1


class GroupedConvFwd(DeclaredOp):
    """CK Tile grouped 2-D convolution forward, run as one implicit GEMM per group.

    Fields, kernel-id template, validity rules, FLOPs, families and keys are in
    ``conf/op/grouped_conv_fwd.yaml``; this plug-in adds the tile engine's hand-picked
    catalogue and the implicit-GEMM view the analytical baseline reads.
    """

    # -- candidate space -----------------------------------------------------------------------
    def catalogue(self, arch: ArchSpec, dtype: DtypeSpec, layout: LayoutSpec) -> pd.DataFrame:
        dtype_name = spec_name(dtype)
        tiles = TILES.get(dtype_name)
        if tiles is None:
            raise ConfigValueError("dtype", dtype_name,
                                   f"one of {sorted(TILES)} (the dtypes grouped_conv_fwd has tile lists for)")
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

    def gemm_view(self, problems: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Implicit-GEMM sizes per group: (M = n*ho*wo, N = k, K = c*y*x)."""
        col = _columns(problems)
        ho, wo = self.output_hw(problems)
        return col("n") * ho * wo, col("k"), col("c") * col("y") * col("x")


def _columns(problems: pd.DataFrame) -> Callable[[str], np.ndarray]:
    """Accessor of int64 problem columns; absent dilation columns default to 1."""

    def col(name: str) -> np.ndarray:
        if name in problems:
            return problems[name].to_numpy(np.int64)
        if name in ("dilation_h", "dilation_w"):
            return np.ones(len(problems), dtype=np.int64)
        raise KeyError(f"grouped_conv_fwd problems need column {name!r}; got {list(problems.columns)}")

    return col


OP = load_op("grouped_conv_fwd")
