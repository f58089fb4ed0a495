"""grouped_conv_fwd: name grammar, catalogue, validity, FLOPs against AMD's measurements."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ckpred.errors import KernelNameError
from ckpred.kernels.base import load_op
from tests.conftest import shared_file

CONV_DIR = "ck_grouped_conv_fwd_bf16_gfx950"
OP = load_op("grouped_conv_fwd")


def _problem(**kw: int) -> pd.DataFrame:
    base = dict(n=1, c=64, k=128, g=1, hi=56, wi=56, y=3, x=3, stride_h=1, stride_w=1, pad_h=1, pad_w=1,
                dilation_h=1, dilation_w=1)
    base.update(kw)
    return pd.DataFrame([base])


def _read_amd(name: str) -> pd.DataFrame:
    frame = pd.read_csv(shared_file(CONV_DIR, name))
    frame.columns = [c.lower() for c in frame.columns]
    return frame


# -- names ---------------------------------------------------------------------------------------
def test_parse_name_reads_every_field() -> None:
    fields = OP.parse_name("grouped_conv_forward_bf16_2d_128x64x128_compv4")
    assert fields == {"dtype": "bf16", "spatial_dims": 2, "tile_m": 128, "tile_n": 64, "tile_k": 128,
                      "pipeline": "compv4"}


def test_parse_name_3d_kernel() -> None:
    assert OP.parse_name("grouped_conv_forward_fp16_3d_16x64x64_compv5")["spatial_dims"] == 3


@pytest.mark.parametrize(("name", "fragment"), [
    ("grouped_conv_backward_bf16_2d_64x64x64_compv3", "prefix"),
    ("grouped_conv_forward_bf16_4d_64x64x64_compv3", "'4d'"),
    ("grouped_conv_forward_bf16_2d_64x64_compv3", "'64x64'"),
    ("grouped_conv_forward_bf16_2d_64x64x64_compv9", "'compv9'"),
    ("grouped_conv_forward_bf16_2d", "parts"),
])
def test_parse_name_errors_say_which_part(name: str, fragment: str) -> None:
    with pytest.raises(KernelNameError) as err:
        OP.parse_name(name)
    assert name in str(err.value) and fragment in str(err.value)


def test_catalogue_round_trips_through_the_grammar() -> None:
    cat = OP.catalogue("gfx950", "bf16", "rcr")
    for row in cat.to_dict("records"):
        parsed = OP.parse_name(row["kernel_name"])
        assert {k: row[k] for k in OP.kernel_names} == {k: parsed[k] for k in OP.kernel_names}
        assert OP.format_name(parsed, dtype="bf16") == row["kernel_name"]


# -- catalogue -----------------------------------------------------------------------------------
def test_catalogue_is_ten_tiles_times_three_pipelines() -> None:
    cat = OP.catalogue("gfx950", "bf16", "rcr")
    assert len(cat) == 30 and list(cat.kernel_id) == list(range(30))
    assert cat.kernel_name.is_unique
    assert cat.groupby("pipeline").size().to_dict() == {"compv3": 10, "compv4": 10, "compv5": 10}
    assert len(cat[["tile_m", "tile_n", "tile_k"]].drop_duplicates()) == 10
    assert not ((cat.tile_n == 128) & (cat.tile_k == 128)).any()


def test_catalogue_unknown_dtype_names_supported() -> None:
    with pytest.raises(ValueError, match="fp8.*bf16"):
        OP.catalogue("gfx950", "fp8", "rcr")


def test_catalogue_matches_amd_benchmark_kernels() -> None:
    bench = _read_amd("benchmark_forward_300_bf16_gfx950.csv")
    train = _read_amd("training_data_forward_bf16_20.csv")
    names = set(OP.catalogue("gfx950", "bf16", "rcr").kernel_name)
    assert set(bench.kernel) == names
    assert set(train.kernel) < names and not any(n.endswith("compv5") for n in train.kernel)


# -- validity, geometry, flops -------------------------------------------------------------------
def test_output_size_with_padding_stride_dilation() -> None:
    ho, wo = OP.output_hw(_problem(hi=7, wi=8, y=3, x=3, stride_h=2, stride_w=1, pad_h=1, pad_w=0,
                                   dilation_h=1, dilation_w=2))
    # ho = (7 + 2 - 2 - 1)//2 + 1 = 4 ; wo = (8 + 0 - 4 - 1)//1 + 1 = 4
    assert (ho[0], wo[0]) == (4, 4)


def test_validity_rejects_empty_output_and_3d_kernels() -> None:
    problems = pd.concat([_problem(), _problem(hi=2, y=5, pad_h=0), _problem(c=0), _problem()],
                         ignore_index=True)
    kernels = pd.DataFrame({"tile_m": [64] * 4, "tile_n": [64] * 4, "tile_k": [64] * 4,
                            "pipeline": ["compv3"] * 4, "spatial_dims": [2, 2, 2, 3]})
    valid, reason = OP.validity(problems, kernels)
    assert valid.tolist() == [True, False, False, False]
    assert "empty output" in reason[1] and "degenerate" in reason[2] and "2-D" in reason[3]


def test_flops_and_gemm_view_by_hand() -> None:
    p = _problem(n=2, c=8, k=16, g=4, hi=10, wi=12, y=3, x=1, pad_h=0, pad_w=0)
    m, n, k = OP.gemm_view(p)
    assert (m[0], n[0], k[0]) == (2 * 8 * 12, 16, 8 * 3)
    assert OP.flops(p)[0] == 2 * 4 * (2 * 8 * 12) * 16 * (8 * 3)


def test_family_uses_implicit_gemm_m() -> None:
    sizes = [dict(n=1, hi=1, wi=1, y=1, x=1, pad_h=0, pad_w=0), dict(n=2, hi=8, wi=8, y=1, x=1, pad_h=0, pad_w=0),
             dict(n=1, hi=16, wi=16, y=1, x=1, pad_h=0, pad_w=0), dict(n=4, hi=16, wi=16, y=1, x=1, pad_h=0, pad_w=0)]
    problems = pd.concat([_problem(**s) for s in sizes], ignore_index=True)
    assert OP.family(problems).tolist() == ["tiny", "medium", "medium", "large"]


@pytest.mark.parametrize("name", ["benchmark_forward_300_bf16_gfx950.csv", "training_data_forward_bf16_20.csv"])
def test_flops_identity_on_amd_measurements(name: str) -> None:
    table = _read_amd(name)
    measured = table.latency_ms.to_numpy() * table.tflops.to_numpy() * 1e9
    np.testing.assert_allclose(measured, OP.flops(table), rtol=1e-12)
    valid, _ = OP.validity(table, pd.DataFrame([OP.parse_name(k) for k in table.kernel]))
    assert valid.all()


def test_group_key_merges_repeated_problem_ids() -> None:
    bench = _read_amd("benchmark_forward_300_bf16_gfx950.csv")
    bench["dilation_h"] = bench["dilation_w"] = 1
    keys = OP.shape_keys(bench)
    assert bench.problem_idx.nunique() == 231 and keys.nunique() == 230
    assert keys[bench.problem_idx == 143].iloc[0] == keys[bench.problem_idx == 212].iloc[0]
