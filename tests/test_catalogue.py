"""Kernel catalogue counts, name grammar round trips and validity rules of gemm_universal."""

from __future__ import annotations

import pandas as pd
import pytest

from ckpred.errors import KernelNameError
from ckpred.kernels.base import load_op
from ckpred.kernels.gemm_universal import OP


def test_fp8_rcr_gfx950_has_4608_kernels() -> None:
    cat = OP.catalogue("gfx950", "fp8", "rcr")
    assert len(cat) == 4608
    assert len(OP.tile_configs("gfx950", "fp8", 1)) == 288
    assert cat.kernel_id.tolist() == list(range(4608))
    assert cat.kernel_name.is_unique
    assert set(cat.pipeline) == {"compv3", "compv4", "mem"}
    assert (cat.pipeline == "mem").sum() == 288 * 8


def test_other_catalogues_follow_the_same_rules() -> None:
    gfx942 = OP.catalogue("gfx942", "fp8", "rcr")
    assert set(zip(gfx942.warp_tile_m, gfx942.warp_tile_n, gfx942.warp_tile_k)) <= {
        (32, 32, 16), (32, 32, 32), (16, 16, 32), (16, 16, 64)}
    fp16 = OP.catalogue("gfx950", "fp16", "rcr")
    assert ((fp16.tile_m * fp16.tile_k + fp16.tile_n * fp16.tile_k) * 2 <= 32 * 1024).all()
    assert len(fp16) % 16 == 0 and 0 < len(fp16) < 4608
    with pytest.raises(ValueError, match="gfx1151"):
        OP.catalogue("gfx1151", "fp8", "rcr")


@pytest.mark.parametrize("layout", ["rcr", "rrr"])
def test_name_round_trip_both_forms(layout: str) -> None:
    cat = OP.catalogue("gfx950", "fp8", layout)
    for form in ("tile_engine", "parity"):
        for record in cat.to_dict("records"):
            name = OP.format_name(record, dtype="fp8", layout=layout, form=form)
            parsed = OP.parse_name(name)
            assert {k: parsed[k] for k in OP.kernel_names} == {k: record[k] for k in OP.kernel_names}
            assert OP.format_name(parsed, dtype="fp8", layout=layout, form=form) == name


def test_pipeline_with_underscore_parses() -> None:
    name = "gemm_universal_fp8_rcr_comp_tdm_v2_cshuffle_intrawave_False_False_True_False_128x128x64_2x2x1_32x32x16"
    parsed = OP.parse_name(name)
    assert parsed["pipeline"] == "comp_tdm_v2" and parsed["pad_k"] is True and parsed["tile_k"] == 64
    assert OP.format_name(parsed, dtype="fp8", layout="rcr") == name


def test_real_parity_names_parse() -> None:
    name = "gemm_fp16_rcr_compv3_cshuffle_intrawave_False_False_False_False_64x64x64_4x1x1_16x16x16"
    parsed = OP.parse_name(name)
    assert (parsed["dtype"], parsed["name_form"], parsed["warp_m"]) == ("fp16", "parity", 4)


@pytest.mark.parametrize("bad", ["", "conv_fp8", "gemm_universal_fp8_rcr_compv3_default_intrawave_False_False_False_False_64x64x64_1x4x1",
                                 "gemm_universal_fp8_rcr_compv3_default_intrawave_Maybe_False_False_False_64x64x64_1x4x1_16x16x32",
                                 "gemm_universal_fp8_rcr_compv3_default_intrawave_False_False_False_False_64x64_1x4x1_16x16x32_1x1x1",
                                 "gemm_universal_fp8_rcr_warp9_default_intrawave_False_False_False_False_64x64x64_1x4x1_16x16x32"])
def test_bad_names_raise_kernel_name_error(bad: str) -> None:
    with pytest.raises(KernelNameError):
        OP.parse_name(bad)


def test_validity_rules() -> None:
    cat = OP.catalogue("gfx950", "fp8", "rcr")
    one = cat[(cat.tile_n == 192) & (cat.tile_k == 64)].head(1)
    problems = pd.DataFrame({"m": [1, 128, 128, 128, 128], "n": [4096, 1536, 1, 1536, 1536],
                             "k": [2048, 7168, 7168, 1, 100]})
    kernels = pd.concat([one] * len(problems), ignore_index=True)
    valid, reason = OP.validity(problems, kernels, layout="rcr")
    assert valid.tolist() == [False, True, False, False, False]
    assert "N not a multiple of tile_n" in reason[0]
    assert "degenerate" in reason[2] and "degenerate" in reason[3]
    assert "K not a multiple of tile_k" in reason[4]
    # M=1 with rcr needs no M alignment: 3,744 of 4,608 kernels run (real gfx950 runs agree).
    p = pd.DataFrame({"m": [1] * len(cat), "n": [4096] * len(cat), "k": [2048] * len(cat)})
    assert OP.validity(p, cat, layout="rcr")[0].sum() == 3744


def test_load_op_from_config_name() -> None:
    assert load_op("gemm_universal") is OP
    assert OP.family(pd.DataFrame({"m": [1, 7, 8, 127, 128, 1023, 1024]})).tolist() == [
        "tiny", "tiny", "small", "small", "medium", "medium", "large"]


def test_split_k_needs_whole_tiles_per_slice() -> None:
    cat = OP.catalogue("gfx950", "fp8", "rcr")
    one = cat[(cat.tile_n == 64) & (cat.tile_k == 128)].head(1)
    problems = pd.DataFrame({"m": [128] * 4, "n": [4096] * 4, "k": [1024, 1024, 768, 1024],
                             "split_k": [1, 4, 2, 0]})
    kernels = pd.concat([one] * len(problems), ignore_index=True)
    valid, reason = OP.validity(problems, kernels, layout="rcr")
    # 1024 = 8 tiles of 128 -> 4 slices of 2 tiles; 768 = 6 tiles -> 2 slices of 3; split_k=0 is degenerate
    assert valid.tolist() == [True, True, True, False] and "split_k<1" in reason[3]
    problems.loc[1, "split_k"] = 16  # 16 slices of 64 < tile_k
    valid, reason = OP.validity(problems, kernels, layout="rcr")
    assert not valid[1] and "times split_k" in reason[1]


@pytest.mark.parametrize("layout", ["rcr", "ccr"])
def test_onnx_mask_equals_rules_with_split_k(layout: str) -> None:
    """The exported selector's mask (ckpred.export.validity) follows these rules exactly."""
    import numpy as np

    from ckpred.export.onnx import build_mask_model, session
    from ckpred.export.validity import mask_builder_for

    cat = OP.catalogue("gfx950", "fp8", layout)
    shapes = [(1, 4096, 2048, 1), (64, 4608, 7168, 4), (128, 576, 768, 2), (96, 192, 1024, 8),
              (1, 4096, 2048, 0), (16, 1, 512, 1), (256, 4096, 1, 1), (192, 1536, 7168, 7)]
    model = build_mask_model(OP, cat, arch="gfx950", dtype="fp8", layout=layout, mask_builder=mask_builder_for(OP))
    got = session(model).run(None, {"problem": np.array(shapes, dtype=np.int64)})[0]
    for j, shape in enumerate(shapes):
        problem = pd.DataFrame([shape] * len(cat), columns=["m", "n", "k", "split_k"])
        want, _ = OP.validity(problem, cat, layout=layout)
        assert got[j].tolist() == want.tolist(), shape
