"""The feature sets that carry a model to a GPU it was never trained on (tests/ops/features/*_transfer)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ckpred.config import compose
from ckpred.features import build_features
from ckpred.kernels.base import load_op
from ckpred.schema import arch_config
from tests.conftest import REPO

OPS_DIR = REPO / "tests" / "ops"


def _features(experiment: str, features: str, frame: pd.DataFrame, arch: str) -> pd.DataFrame:
    cfg = compose("train", [f"hydra.searchpath=[file://{OPS_DIR}]", f"experiment={experiment}",
                            f"features={features}", "data.path=x"])
    op = load_op(cfg.op)
    X = op.encode_frame(frame)
    union = build_features(cfg.features, op, arch_config(arch), cfg.dtype).fit(X)
    names = [n.split("__", 1)[1] for n in union.get_feature_names_out()]
    return pd.DataFrame(union.transform(X), columns=names)


def _conv_rows(solvers: list[str]) -> pd.DataFrame:
    geometry = dict(n=16, c=512, hi=28, wi=28, k=1024, ho=14, wo=14, y=1, x=1, pad_h=0, pad_w=0, stride_h=2,
                    stride_w=2, dilation_h=1, dilation_w=1, groups=1, bias=0, layout="NCHW", dtype="FP32",
                    direction="F")
    return pd.DataFrame([{**geometry, "solver": s} for s in solvers])


def test_solver_tags_are_parsed_from_every_solver_name() -> None:
    """Each solver of the op has exactly one family; a solver gfx942 never ran (rocMLIR's
    implicit GEMM) gets the tags of its name, so it is not a row of zeros to the model."""
    cfg = compose("train", [f"hydra.searchpath=[file://{OPS_DIR}]", "experiment=miopen_gfx942", "data.path=x"])
    solvers = list(cfg.op.kernel_fields["solver"].values)
    f = _features("miopen_gfx942", "miopen_conv_transfer", _conv_rows(solvers), "gfx942").set_index(
        pd.Index(solvers))
    families = f.filter(like="family_")
    assert (families.sum(axis=1) == 1).all(), families[families.sum(axis=1) != 1]
    tags = lambda s: set(f.columns[f.loc[s] == 1]) - {c for c in f.columns if not c.startswith(  # noqa: E731
        ("family_", "backend_", "xdlops", "solver_"))} - {f"solver_{s}"}
    assert tags("ConvMlirIgemmBwdXdlops") == {"family_implicit_gemm", "backend_mlir", "xdlops", "solver_bwd"}
    assert tags("GemmFwd1x1_0_1") == {"family_gemm", "backend_blas", "solver_fwd", "solver_1x1"}
    assert tags("ConvOclDirectFwd11x11") == {"family_direct", "backend_ocl", "solver_fwd"}  # 11x11 is not 1x1
    assert tags("ConvAsmBwdWrW1x1") == {"family_direct", "backend_asm", "solver_wrw", "solver_1x1"}
    assert tags("ConvWinograd3x3MultipassWrW<3-2>") == {"family_winograd", "solver_wrw", "solver_multipass"}


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "warps", "lane_fill", "occupancy"), [
    # 48 x 2 = 96 threads: two 64-wide wavefronts on the MI250X, three 32-wide warps on the A100;
    # the 9,856-byte tile lets 6 blocks share 64 KiB (12 of 32 wavefronts) and 17 blocks share
    # 164 KiB (51 of 64 warps)
    ("gfx90a", 2, 0.75, 12 / 32), ("sm80_a100", 3, 1.0, 51 / 64)])
def test_kernel_tuner_transfer_features_use_each_gpus_own_units(arch: str, warps: int, lane_fill: float,
                                                                occupancy: float) -> None:
    row = pd.DataFrame([dict(gpu="MI250X", block_size_x=48, block_size_y=2, tile_size_x=2, tile_size_y=4,
                             read_only=1, use_padding=1, use_shmem=1, use_cmem=1, filter_height=15,
                             filter_width=15)])
    f = _features("kernel_tuner_amd", "kernel_tuner_conv_transfer", row, arch).iloc[0]
    # the staged tile: (2*4 + 14) rows x (48*2 + 14 + padding) floats, padding = (32 - (14 + 96 - 48)) & 31
    smem = 4 * (2 * 4 + 14) * (48 * 2 + 14 + ((32 - (14 + 96 - 48)) % 32))
    assert smem == 9856 and f["smem_kib"] == pytest.approx(smem / 1024)
    assert f["smem_fraction"] == pytest.approx(smem / (arch_config(arch).shared_memory_kib * 1024))
    assert (f["warps_per_block"], f["lane_fill"]) == (warps, pytest.approx(lane_fill))
    assert f["occupancy"] == pytest.approx(occupancy)
    assert np.isfinite(f.to_numpy()).all()
