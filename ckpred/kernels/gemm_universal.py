"""CK Tile ``gemm_universal``'s plug-in: the candidate catalogue, the layout-dependent validity
rules and the parity sweep's name prefix.

The op itself (fields, kernel-id template, FLOPs, families, keys) is ``conf/op/gemm_universal.yaml``;
this module holds what that file cannot say.

Catalogue (the tile engine's rules): 256 threads per block; warps per
block (warp_m x warp_n x warp_k) in {1x4x1, 2x2x1, 4x1x1}; tile_m, tile_n in {64, 128, 192, 256},
tile_k in {64, 128, 256}; the per-arch/dtype warp-tile list; alignment
``tile_d % (warp_d * warp_tile_d) == 0`` for d in m, n, k; LDS estimate
``(tile_m*tile_k + tile_n*tile_k) * bytes`` within half of a 64 KiB block budget (the tile
engine halves it for the double-buffered compv4 and applies one budget to every trait so all
pipelines share a tile list); then 16 trait combinations: ``mem`` x {default, cshuffle} x
{intrawave, interwave} x persistent {F, T} (8) and ``compv3``/``compv4`` x intrawave x
{default, cshuffle} x persistent {F, T} (4 each); pads fixed False. fp8/rcr/gfx950 gives
288 tile configs x 16 = 4,608 kernels.

Validity (``IsSupportedArgument`` of CK Tile's universal GEMM kernel): without padding, the
contiguous dimension of each operand must be a multiple of the block tile along it — for A
row-major K % tile_k, A column-major M % tile_m; for B column-major K % tile_k, B row-major
N % tile_n; for C row-major N % tile_n, C column-major M % tile_m. With split-K (``split_k`` = k_batch > 1) each of the
split_k workgroups along K runs K/split_k of the reduction, so the K rule becomes
K % (tile_k * split_k) (CK Tile checks ``K % (KPerBlock * k_batch)``). Degenerate problems
(M < 1, N <= 1, K <= 1 or split_k < 1) have no kernel at all. Every rule is integer arithmetic
on problem and kernel fields (comparisons and divisibility), so
:func:`ckpred.export.validity.gemm_universal_mask` compiles the same rules into the exported
selector's ONNX mask. Kernels the rules accept may still fail in a real run; measured tables
carry those as invalid rows with the run's reason.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence, cast

import numpy as np
import pandas as pd

from ckpred import dtypes
from ckpred.errors import ConfigValueError
from ckpred.schema import arch_value
from ckpred.kernels.base import ArchSpec, DtypeSpec, LayoutSpec, load_op, packaged_op_config
from ckpred.kernels.declared import DeclaredOp
from ckpred.kernels.definition import spec_name

#: Category values of the op's YAML (their code order is the model input's).
_KERNEL_FIELDS = packaged_op_config("gemm_universal")["kernel_fields"]
PIPELINE_CODES: tuple[str, ...] = tuple(_KERNEL_FIELDS["pipeline"]["values"])
SCHEDULERS: tuple[str, ...] = tuple(_KERNEL_FIELDS["scheduler"]["values"])
EPILOGUES: tuple[str, ...] = tuple(_KERNEL_FIELDS["epilogue"]["values"])

WARP_LAYOUTS: tuple[tuple[int, int, int], ...] = ((1, 4, 1), (2, 2, 1), (4, 1, 1))
TILE_MN: tuple[int, ...] = (64, 128, 192, 256)
TILE_K: tuple[int, ...] = (64, 128, 256)
#: Per-block LDS budget the tile engine plans with (64 KiB, halved for double buffering).
LDS_BUDGET_BYTES = 32 * 1024

#: Warp tiles (m, n, k) allowed per (arch, dtype). fp8 and bf8 share MFMA shapes.
_FP8_950 = ((32, 32, 16), (32, 32, 32), (16, 16, 32), (16, 16, 64), (16, 16, 128), (32, 32, 64))
_FP16 = ((32, 32, 8), (16, 16, 16), (32, 32, 16), (16, 16, 32), (64, 4, 16))
WARP_TILES: dict[tuple[str, str], tuple[tuple[int, int, int], ...]] = {
    ("gfx950", "fp8"): _FP8_950,
    ("gfx950", "bf8"): _FP8_950,
    ("gfx942", "fp8"): _FP8_950[:4],
    ("gfx942", "bf8"): _FP8_950[:4],
    ("gfx950", "fp16"): _FP16,
    ("gfx950", "bf16"): _FP16,
    ("gfx942", "fp16"): _FP16,
    ("gfx942", "bf16"): _FP16,
    ("gfx90a", "fp16"): _FP16,
    ("gfx90a", "bf16"): _FP16,
}

#: (pipeline, epilogue, scheduler, persistent) in catalogue order.
TRAITS: tuple[tuple[str, str, str, bool], ...] = tuple(
    [("compv3", e, "intrawave", p) for e in EPILOGUES for p in (False, True)]
    + [("compv4", e, "intrawave", p) for e in EPILOGUES for p in (False, True)]
    + [("mem", e, s, p) for e in EPILOGUES for s in ("intrawave", "interwave") for p in (False, True)]
)

#: Name prefixes: tile-engine form (the op's kernel-id template) and parity-sweep form.
PREFIXES = {"tile_engine": "gemm_universal_", "parity": "gemm_"}


class GemmUniversal(DeclaredOp):
    """CK Tile universal GEMM, C[M, N] = A[M, K] @ B[K, N].

    Fields, kernel-id template, FLOPs, families and keys are in ``conf/op/gemm_universal.yaml``;
    this plug-in adds what the YAML cannot say: the second (parity-sweep) name prefix, the
    tile-engine catalogue, and the layout-dependent validity rules (the layout is a run-level
    config, not a field an expression reads; their ONNX mask is the builder registered in
    :mod:`ckpred.export.validity`).
    """

    # -- names ---------------------------------------------------------------------------------
    def parse_name(self, name: str) -> dict[str, Any]:
        """Either prefix (``gemm_universal_`` or the parity sweep's ``gemm_``), else the template's error."""
        form = "tile_engine"
        if isinstance(name, str) and name.startswith(PREFIXES["parity"]) \
                and not name.startswith(PREFIXES["tile_engine"]):
            form, name = "parity", PREFIXES["tile_engine"] + name[len(PREFIXES["parity"]):]
        parsed = super().parse_name(name)  # a new dict per name: set in place rather than copied
        parsed["name_form"] = form
        return parsed

    def format_name(self, kernel: Mapping[str, Any], *, dtype: str = "", layout: str = "",
                    form: str = "tile_engine") -> str:
        name = super().format_name(kernel, dtype=dtype, layout=layout)
        return PREFIXES[form] + name[len(PREFIXES["tile_engine"]):]

    # -- candidate space -----------------------------------------------------------------------
    def tile_configs(self, arch: str, dtype: str, bytes_per_element: float) -> list[dict[str, int]]:
        """Tile/warp/warp-tile combinations that pass alignment and the LDS budget."""
        warp_tiles = WARP_TILES.get((arch, dtype))
        if warp_tiles is None:
            here = sorted(d for a, d in WARP_TILES if a == arch)
            if not here:  # an arch config of another name (a copy, a new product): its ISA is named by isa
                raise ConfigValueError("arch.isa", arch, f"one of the ISAs gemm_universal has warp tiles for "
                                       f"{sorted({a for a, _ in WARP_TILES})} (an arch config's isa, else its name; "
                                       "a new product of a known ISA sets isa: <ISA> in its arch config)")
            raise ConfigValueError("dtype", dtype, f"one of {here} for arch={arch} (the dtypes gemm_universal has "
                                                   "warp tiles for)")
        configs = []
        for tm, tn, tk in itertools.product(TILE_MN, TILE_MN, TILE_K):
            if (tm * tk + tn * tk) * bytes_per_element > LDS_BUDGET_BYTES:
                continue
            for (wm, wn, wk), (wtm, wtn, wtk) in itertools.product(WARP_LAYOUTS, warp_tiles):
                if tm % (wm * wtm) or tn % (wn * wtn) or tk % (wk * wtk):
                    continue
                configs.append(dict(tile_m=tm, tile_n=tn, tile_k=tk, warp_m=wm, warp_n=wn, warp_k=wk,
                                    warp_tile_m=wtm, warp_tile_n=wtn, warp_tile_k=wtk))
        return configs

    def catalogue(self, arch: ArchSpec, dtype: DtypeSpec, layout: LayoutSpec) -> pd.DataFrame:
        arch_name = arch if isinstance(arch, str) else (arch_value(arch, "isa") or arch_value(arch, "name"))
        dtype_name, layout_name = spec_name(dtype), spec_name(layout)
        bytes_per_element = dtypes.bytes_per_element(dtype)
        rows = []
        for tile in self.tile_configs(arch_name, dtype_name, bytes_per_element):
            for pipeline, epilogue, scheduler, persistent in TRAITS:
                rows.append({**tile, "pipeline": pipeline, "scheduler": scheduler, "epilogue": epilogue,
                             "pad_m": False, "pad_n": False, "pad_k": False, "persistent": persistent})
        frame = pd.DataFrame(rows, columns=list(self.kernel_names))
        names = [self.format_name(r, dtype=dtype_name, layout=layout_name) for r in frame.to_dict("records")]
        frame.insert(0, "kernel_name", names)
        frame.insert(0, "kernel_id", np.arange(len(frame), dtype=np.int64))
        return frame

    def validity(self, problems: pd.DataFrame, kernels: pd.DataFrame, *, arch: ArchSpec | None = None,
                 dtype: DtypeSpec | None = None, layout: LayoutSpec | None = "rcr") -> tuple[np.ndarray, np.ndarray]:
        layout_name = getattr(layout, "name", layout)
        m, n, k = (problems[c].to_numpy(np.int64) for c in ("m", "n", "k"))
        split = problems["split_k"].to_numpy(np.int64) if "split_k" in problems else np.ones_like(m)
        tm, tn, tk = (kernels[c].to_numpy(np.int64) for c in ("tile_m", "tile_n", "tile_k"))
        pad_m, pad_n, pad_k = (kernels[c].to_numpy(bool) for c in ("pad_m", "pad_n", "pad_k"))
        reason = np.full(len(m), "", dtype=object)

        def mark(bad: np.ndarray, text: str) -> None:
            reason[bad & (reason == "")] = text

        mark((n <= 1) | (k <= 1) | (m < 1) | (split < 1),
             "degenerate problem (M<1, N<=1, K<=1 or split_k<1): no kernel supports it")
        a, b, c = cast("Sequence[str]", layout_name)  # the three majorness letters
        needs_k = (a == "r") or (b == "c")
        needs_m = (a == "c") or (c == "c")
        needs_n = (b == "r") or (c == "r")
        if needs_k:
            mark(~pad_k & (k % (tk * np.maximum(split, 1)) != 0),
                 "K not a multiple of tile_k (times split_k) and pad_k=False")
        if needs_m:
            mark(~pad_m & (m % tm != 0), "M not a multiple of tile_m and pad_m=False")
        if needs_n:
            mark(~pad_n & (n % tn != 0), "N not a multiple of tile_n and pad_n=False")
        return reason == "", reason

    def gemm_view(self, problems: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m, n, k = (problems[c].to_numpy(np.int64) for c in ("m", "n", "k"))
        return m, n, k

OP = load_op("gemm_universal")
