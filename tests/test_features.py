"""Feature transformers: hand-computed values, names, column handling, config, sklearn compliance."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from sklearn.utils.estimator_checks import check_estimator, estimator_checks_generator

from ckpred.config import CONF_DIR, compose
from ckpred.errors import ConfigValueError
from ckpred.config import feature_set
from ckpred.features import FEATURE_GROUPS, build_features, constants_from_config, group_class, group_input_columns
from ckpred.features.base import FeatureGroup
from ckpred.schema import arch_constants
from ckpred.features.expression import ExpressionFeatures
from ckpred.kernels.base import load_op
from ckpred.plugins import allowed_plugins

OP = load_op("gemm_universal")
FEATURE_SETS = sorted(p.stem for p in (CONF_DIR / "features").glob("*.yaml"))
#: Feature sets whose groups read gemm_universal's columns (other ops' sets are tested with them).
GEMM_SETS = [name for name in FEATURE_SETS
             if all(set(group_input_columns(g.kind, g.params)) <= set(OP.input_names)
                    for g in feature_set(name).groups)]
CLASSES = [group_class(kind) for kind in FEATURE_GROUPS]
#: Declared expression groups of gemm_universal (conf/features/groups).
DECLARED = ("problem", "kernel", "interaction", "tile_quantization", "wave", "occupancy", "hardware")


@pytest.fixture(scope="module")
def cfg():
    return compose("ingest", ["data.path=x", "arch=gfx950", "dtype=fp8", "layout=rcr"])


def _frame(rows: list[dict]) -> pd.DataFrame:
    """Raw int64 model input for problem/kernel dicts (kernel codes given directly)."""
    base = dict(split_k=1, tile_m=64, tile_n=128, tile_k=64, warp_m=2, warp_n=2, warp_k=1,
                warp_tile_m=32, warp_tile_n=32, warp_tile_k=16, pipeline=1, scheduler=0, epilogue=1,
                pad_m=0, pad_n=0, pad_k=0, persistent=1)
    frame = pd.DataFrame([{**base, **r} for r in rows])
    return frame[list(OP.input_names)].astype("int64")


def _features(cfg, name: str, X: pd.DataFrame) -> dict[str, np.ndarray]:
    union = build_features(feature_set(name), OP, cfg.arch, cfg.dtype, cfg.layout).fit(X)
    out = union.transform(X)
    return dict(zip(union.get_feature_names_out(), out.T))


# -- hand-computed values ----------------------------------------------------------------------
def _rel(name: str, exact: float) -> float:
    """Tolerance: log2 features are rounded to float32 (see NumpyOps.log2), the rest are exact."""
    return 2.0**-24 if ("log2" in name or name.endswith("roofline_position")) else exact


BIG_K = 2**25 + 1  # not representable in float32; exact in float64


def test_anchor55_values_by_hand(cfg) -> None:
    X = _frame([dict(m=1, n=7, k=BIG_K), dict(m=4096, n=1536, k=7168)])
    f = _features(cfg, "anchor55", X)
    # Row 0: M=1, prime N=7, K=2^25+1 with a 64x128x64 tile, fp8 (1 byte), 256 CUs, 160 KiB LDS.
    m, n, k = 1, 7, BIG_K
    expect0 = {
        "problem__m": 1, "problem__n": 7, "problem__k": BIG_K, "problem__split_k": 1,
        "problem__log2_m": 0.0, "problem__log2_n": math.log2(7), "problem__log2_k": math.log2(BIG_K),
        "problem__log2_mnk": math.log2(7 * BIG_K),
        "problem__arithmetic_intensity": 2 * m * n * k / (m * k + k * n + m * n),
        "problem__m_over_n": 1 / 7, "problem__m_over_k": 1 / BIG_K, "problem__n_over_k": 7 / BIG_K,
        "problem__layout_code": 0,
        "kernel__tile_m": 64, "kernel__pipeline": 1, "kernel__epilogue": 1, "kernel__persistent": 1,
        "kernel__num_warps": 4, "kernel__tile_volume": 64 * 128 * 64, "kernel__tile_mn": 64 * 128,
        "kernel__lds_bytes_est": 64 * 64 + 128 * 64, "kernel__lds_ratio": (64 * 64 + 128 * 64) / (160 * 1024),
        "interaction__tiles_m": 1, "interaction__tiles_n": 1, "interaction__tiles_k": 2**19 + 1,
        "interaction__output_tiles": 1, "interaction__fill_m": 1 / 64, "interaction__fill_n": 7 / 128,
        "interaction__fill_k": 1 / 64, "interaction__fill_product": (1 / 64) * (7 / 128) * (1 / 64),
        "interaction__output_tiles_per_cu": 1 / 256,
        "hardware__hw_cus": 256, "hardware__hw_total_simds": 1024, "hardware__hw_lds_kib": 160,
        "hardware__hw_l2_mib": 32.0, "hardware__hw_xcds": 8,
    }
    for name, value in expect0.items():
        assert f[name][0] == pytest.approx(value, rel=_rel(name, 1e-15), abs=0), name
    # The exact integer survives: float32 would round 2^25+1 to 2^25.
    assert f["problem__k"][0] == BIG_K and f["interaction__tiles_k"][0] == 2**19 + 1
    # Row 1: everything divides, so every fill is exactly 1.
    assert f["interaction__tiles_m"][1] == 64 and f["interaction__tiles_n"][1] == 12
    assert f["interaction__output_tiles"][1] == 768 and f["interaction__output_tiles_per_cu"][1] == 3.0
    assert [f[f"interaction__fill_{d}"][1] for d in "mnk"] == [1.0, 1.0, 1.0]


def test_physical_groups_values_by_hand(cfg) -> None:
    """Tile/wave quantisation, roofline and occupancy of M=1, N=7, K=2^25+1 on a 64x128x64
    compv4 tile (2x2x1 warps, 32x32x16 warp tile) on gfx950 fp8: 256 CUs, 8 XCDs, 5033 TFLOPS,
    8000 GB/s, 160 KiB LDS, fp16 C."""
    groups = [{"kind": kind} for kind in ("tile_quantization", "wave", "roofline", "occupancy")]
    X = _frame([dict(m=1, n=7, k=BIG_K)])
    union = build_features({"name": "physical", "groups": groups}, OP, cfg.arch, cfg.dtype, cfg.layout)
    out = union.fit_transform(X)
    f = dict(zip(union.get_feature_names_out(), out[0]))
    k_tiles = 2**19 + 1  # ceil((2^25+1)/64)
    compute_us = 1 * k_tiles * (2 * 64 * 128 * 64) / (5033e6 / 256)
    memory_us = (1 * k_tiles * (64 + 128) * 64 * 1 + 1 * 7 * 2) / 8000e3
    ideal_us = max(2 * 7 * BIG_K / 5033e6, ((BIG_K + 7 * BIG_K) * 1 + 7 * 2) / 8000e3)
    expect = {
        "tile_quantization__m_over_tile_m": 1 / 64, "tile_quantization__k_over_tile_k": BIG_K / 64,
        "tile_quantization__m_lt_tile": 1, "tile_quantization__n_lt_tile": 1, "tile_quantization__k_lt_tile": 0,
        "tile_quantization__need_pad_m": 1, "tile_quantization__need_pad_k": 1,
        "tile_quantization__missing_pad_n": 1, "tile_quantization__util_m": 1 / 64,
        "tile_quantization__util_k": BIG_K / (k_tiles * 64),
        "tile_quantization__util_mnk": (1 / 64) * (7 / 128) * (BIG_K / (k_tiles * 64)),
        "wave__log2_grid": 0.0, "wave__waves": 1, "wave__wave_efficiency": 1 / 256,
        "wave__last_wave_fill": 1 / 256, "wave__cu_occupancy": 1 / 256, "wave__blocks_per_xcd": 1,
        "wave__xcd_waves": 1, "wave__log2_k_iterations": math.log2(k_tiles),
        "wave__log2_critical_path": math.log2(k_tiles),
        "roofline__log2_flops": math.log2(2 * 7 * BIG_K),
        "roofline__log2_min_bytes": math.log2(8 * BIG_K + 14),
        "roofline__roofline_position": math.log2((2 * 7 * BIG_K / (8 * BIG_K + 14)) / (5033e6 / 8000e3)),
        "roofline__log2_compute_us": math.log2(compute_us), "roofline__log2_memory_us": math.log2(memory_us),
        "roofline__log2_est_us": math.log2(max(compute_us, memory_us)),
        "roofline__est_efficiency": ideal_us / max(compute_us, memory_us),
        "roofline__tile_intensity": 2 * 64 * 128 / (192 * 1),
        "occupancy__lds_buffers": 2, "occupancy__lds_block_bytes": 192 * 64 * 2,
        "occupancy__blocks_per_cu_lds": 6, "occupancy__blocks_per_cu": 6, "occupancy__rep_m": 1,
        "occupancy__rep_n": 2, "occupancy__rep_k": 4, "occupancy__mfma_per_warp": 8,
        "occupancy__accumulators_per_thread": 32, "occupancy__warp_tile_intensity": 16,
    }
    for name, value in expect.items():
        assert f[name] == pytest.approx(value, rel=_rel(name, 1e-14), abs=0), name
    # A non-double-buffered pipeline (compv3 = 0) halves the LDS footprint.
    X = _frame([dict(m=1, n=7, k=BIG_K, pipeline=0)])
    out = union.fit_transform(X)
    g = dict(zip(union.get_feature_names_out(), out[0]))
    assert g["occupancy__lds_buffers"] == 1 and g["occupancy__blocks_per_cu_lds"] == 13


def test_wave_quantisation_steps_at_the_cu_count(cfg) -> None:
    # 256 CUs: 16x16 = 256 tiles fill exactly one wave; 16x17 = 272 need a second, mostly idle.
    X = _frame([dict(m=16 * 64, n=16 * 128, k=64), dict(m=16 * 64, n=17 * 128, k=64)])
    f = _features_of(cfg, ["wave"], X)
    assert list(f["wave__waves"]) == [1.0, 2.0]
    assert list(f["wave__wave_efficiency"]) == [1.0, 272 / 512]
    assert list(f["wave__last_wave_fill"]) == [1.0, 16 / 256]
    assert list(f["wave__blocks_per_xcd"]) == [32.0, 34.0] and list(f["wave__xcd_waves"]) == [1.0, 2.0]


def _features_of(cfg, kinds: list[str], X: pd.DataFrame) -> dict[str, np.ndarray]:
    union = build_features({"name": "x", "groups": [{"kind": k} for k in kinds]}, OP, cfg.arch, cfg.dtype)
    out = union.fit_transform(X)
    return dict(zip(union.get_feature_names_out(), out.T))


def test_constants_follow_the_arch_and_dtype_configs() -> None:
    cfg = compose("ingest", ["data.path=x", "arch=gfx942", "dtype=fp16", "layout=crr"])
    X = _frame([dict(m=300, n=256, k=4096)])
    f = _features(cfg, "anchor55", X)
    assert f["hardware__hw_cus"][0] == 304 and f["hardware__hw_lds_kib"][0] == 64
    assert f["problem__layout_code"][0] == 2  # crr in ckpred.schema.LAYOUTS
    assert f["kernel__lds_bytes_est"][0] == (64 * 64 + 128 * 64) * 2  # fp16: 2 bytes
    assert f["kernel__lds_ratio"][0] == (64 * 64 + 128 * 64) * 2 / (64 * 1024)
    assert f["interaction__output_tiles_per_cu"][0] == 5 * 2 / 304
    assert f["problem__arithmetic_intensity"][0] == pytest.approx(
        2 * 300 * 256 * 4096 / ((300 * 4096 + 4096 * 256 + 300 * 256) * 2), rel=1e-15)


# -- feature sets ------------------------------------------------------------------------------
def test_gemm_feature_sets_exist() -> None:
    assert {"anchor55", "full", "minimal"} <= set(GEMM_SETS)


@pytest.mark.parametrize("name", GEMM_SETS)
def test_feature_set_names_are_unique_and_match_output(cfg, name: str) -> None:
    X = _frame([dict(m=16, n=1536, k=7168), dict(m=1, n=2, k=3)])
    union = build_features(feature_set(name), OP, cfg.arch, cfg.dtype, cfg.layout)
    out = union.fit_transform(X)
    names = union.get_feature_names_out()
    assert out.dtype == np.float64 and out.shape == (2, len(names))
    assert len(set(names)) == len(names)
    assert feature_set(name).name == _aliased(name)


def _aliased(name: str) -> str:
    """The set an op-default alias (``features/<op>.yaml``: ``defaults: [<set>]``) selects."""
    import yaml

    defaults = yaml.safe_load((CONF_DIR / "features" / f"{name}.yaml").read_text()).get("defaults", [])
    picked = [d for d in defaults if isinstance(d, str) and d not in ("base_features", "_self_")]
    return picked[0] if picked else name


def test_every_op_has_default_feature_sets() -> None:
    for op in ("gemm_universal", "grouped_conv_fwd"):
        assert _aliased(op) in FEATURE_SETS and _aliased(f"reference_{op}") in FEATURE_SETS
    assert (_aliased("gemm_universal"), _aliased("reference_gemm_universal")) == ("full", "anchor55")


def test_anchor55_has_exactly_the_reference_groups(cfg) -> None:
    union = build_features(feature_set("anchor55"), OP, cfg.arch, cfg.dtype, cfg.layout)
    union.fit(_frame([dict(m=16, n=16, k=16)]))
    names = union.get_feature_names_out()
    assert len(names) == 55
    counts = {kind: sum(n.startswith(f"{kind}__") for n in names) for kind, _ in union.transformer_list}
    assert counts == {"problem": 13, "kernel": 21, "interaction": 9, "hardware": 12}


def test_pandas_output(cfg) -> None:
    X = _frame([dict(m=16, n=1536, k=7168)])
    union = build_features(feature_set("anchor55"), OP, cfg.arch, cfg.dtype, cfg.layout)
    out = union.set_output(transform="pandas").fit_transform(X)
    assert list(out.columns) == list(union.get_feature_names_out())
    assert out["problem__m"].iloc[0] == 16.0


# -- columns by name, arrays by position, bad input ----------------------------------------------
def test_columns_are_selected_by_name(cfg) -> None:
    X = _frame([dict(m=5, n=77, k=1000), dict(m=1024, n=1, k=64)])
    shuffled = X[list(reversed(X.columns))]
    a = build_features(feature_set("anchor55"), OP, cfg.arch, cfg.dtype).fit(X).transform(X)
    b = build_features(feature_set("anchor55"), OP, cfg.arch, cfg.dtype).fit(shuffled).transform(shuffled)
    np.testing.assert_array_equal(a, b)


def test_array_input_uses_input_names_positions(cfg) -> None:
    X = _frame([dict(m=5, n=77, k=1000)])
    union = build_features(feature_set("anchor55"), OP, cfg.arch, cfg.dtype)
    np.testing.assert_array_equal(union.fit(X.to_numpy()).transform(X.to_numpy()),
                                  union.fit(X).transform(X))


def _group(kind: str) -> ExpressionFeatures:
    """A declared group as build_features makes it (gfx950 fp8 rcr), unfitted, without input_names."""
    cfg = compose("ingest", ["data.path=x", "arch=gfx950", "dtype=fp8", "layout=rcr"])
    union = build_features({"name": "x", "groups": [{"kind": kind}]}, OP, cfg.arch, cfg.dtype, cfg.layout)
    return union.transformer_list[0][1].set_params(input_names=None)


def test_missing_column_is_named() -> None:
    X = _frame([dict(m=5, n=77, k=1000)]).drop(columns=["tile_k"])
    with pytest.raises(ValueError, match=r"lacks \['tile_k'\]"):
        _group("interaction").fit(X)


def test_negative_values_are_refused() -> None:
    X = _frame([dict(m=-5, n=77, k=1000)])
    with pytest.raises(ValueError, match=r"Negative values .* 'm' is -5 in row 0"):
        _group("problem").fit(X)
    model = _group("kernel").fit(_frame([dict(m=5, n=77, k=1000)]))
    with pytest.raises(ValueError, match=r"ExpressionFeatures.transform: 'm' is -5 in row 0"):
        model.transform(X)


def test_unknown_parameter_names_key_and_allowed(cfg) -> None:
    bad = {"name": "x", "groups": [{"kind": "roofline", "params": {"reference_tilse": "catalogue"}}]}
    with pytest.raises(ConfigValueError) as err:
        build_features(bad, OP, cfg.arch, cfg.dtype)
    assert err.value.key == "features.groups[0].params.reference_tilse"
    assert "reference_tiles" in err.value.allowed
    bad = {"name": "x", "groups": [{"kind": "problem", "params": {"include_layout": False}}]}
    with pytest.raises(ConfigValueError) as err:
        build_features(bad, OP, cfg.arch, cfg.dtype)
    assert err.value.key == "features.groups[0].params.include_layout" and "exclude" in err.value.allowed


def test_unknown_kind_names_allowed_kinds(cfg) -> None:
    with pytest.raises(ConfigValueError) as err:
        build_features({"name": "x", "groups": [{"kind": "problme"}]}, OP, cfg.arch, cfg.dtype)
    assert err.value.key == "features.groups[0].kind" and "problem" in err.value.allowed


def test_group_needing_columns_the_op_lacks_is_refused(cfg) -> None:
    conv = load_op("ckpred.kernels.grouped_conv_fwd")
    with pytest.raises(ConfigValueError, match="lacks"):
        build_features(feature_set("anchor55"), conv, cfg.arch, cfg.dtype)


# -- scikit-learn compliance ----------------------------------------------------------------------
#: Checks that feed generic arrays with 1-10 columns. A feature group reads its inputs by name
#: (or by position from ``input_names``) and refuses an array narrower than the columns it
#: needs (RooflineFeatures: 7, ConvKernelFeatures: 5, the occupancy declaration: 10), so these checks
#: fail on it by design. Non-strict, because which of them happen to use wide enough data
#: depends on the group's column count. Everything else these checks verify is exercised by
#: ``test_sklearn_compliance_any_width`` below.
NARROW_DATA_CHECKS = (
    "check_dict_unchanged", "check_dont_overwrite_parameters", "check_dtype_object",
    "check_estimators_dtypes", "check_estimators_fit_returns_self", "check_estimators_nan_inf",
    "check_estimators_overwrite_params", "check_estimators_pickle", "check_f_contiguous_array_estimator",
    "check_fit2d_1sample", "check_fit2d_predict1d", "check_fit_check_is_fitted", "check_fit_idempotent",
    "check_fit_score_takes_y", "check_methods_sample_order_invariance", "check_methods_subset_invariance",
    "check_n_features_in", "check_n_features_in_after_fitting", "check_pipeline_consistency",
    "check_readonly_memmap_input", "check_transformer_data_not_an_array", "check_transformer_general",
    "check_transformer_preserve_dtypes",
)


#: Every Python group, and expression groups with terms, a categorical comparison and none of
#: the input columns (the hardware constants).
ESTIMATORS = [cls() for cls in CLASSES] + [_group("occupancy"), _group("hardware")]


def _expected_failures(estimator) -> dict[str, str]:
    if not estimator.input_columns:
        return {}
    reason = (f"generic check data is narrower than the {len(estimator.input_columns)} "
              f"input columns {type(estimator).__name__} reads by name")
    return {name: reason for name in NARROW_DATA_CHECKS}


def _compliance_cases() -> list:
    # parametrize_with_checks over the checks that apply. The known deviations
    # (_expected_failures, with their reason) are left out rather than generated as skips or
    # xfails: building ~230 expected tracebacks cost ~70 s of CPU, and what those checks verify
    # runs for real in test_sklearn_compliance_any_width.
    def name(check) -> str:
        func = getattr(check, "func", check)
        return f"{func.__name__}({', '.join(f'{k}={v}' for k, v in getattr(check, 'keywords', {}).items())})"

    cases = []
    for est in ESTIMATORS:
        deviations = _expected_failures(est)
        cases += [pytest.param(est, check, id=f"{type(est).__name__}-{name(check)}")
                  for _, check in estimator_checks_generator(est)
                  if getattr(check, "func", check).__name__ not in deviations]
    return cases


@pytest.mark.parametrize(("estimator", "check"), _compliance_cases())
def test_sklearn_compliance(estimator, check) -> None:
    check(estimator)


def _any_width(cls: type) -> type:
    """Subclass whose only change: arrays narrower than the needed columns wrap around.

    Lets the generic checks (params, fitted attributes, pickling, idempotence, dtypes, order
    and subset invariance...) run on every group with their own narrow data; column lookup
    itself is tested above with real columns.
    """

    def _locate_columns(self):
        try:
            return cls._locate_columns(self)
        except ValueError:
            return tuple(i % self.n_features_in_ for i in range(len(self.input_columns)))

    name = f"AnyWidth{cls.__name__}"
    sub = type(name, (cls,), {"_locate_columns": _locate_columns, "__module__": __name__})
    globals()[name] = sub  # importable by name, so the pickling checks can round-trip it
    return sub


@pytest.mark.parametrize("estimator", [e for e in ESTIMATORS if e.input_columns], ids=lambda e: type(e).__name__)
def test_sklearn_compliance_any_width(estimator) -> None:
    # One test per class running the whole suite (cheaper than ~45 parametrized tests each).
    results = check_estimator(_any_width(type(estimator))(**estimator.get_params()), on_fail=None)
    failed = {r["check_name"]: str(r["exception"])[:200] for r in results if r["status"] == "failed"}
    assert not failed, failed
    assert sum(r["status"] == "passed" for r in results) >= 40


def test_est_vs_best_is_zero_for_the_analytically_best_catalogue_tile(cfg) -> None:
    kernels = OP.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    for m, n, k in ((1, 7168, 2048), (4096, 4096, 4096), (300, 257, 65521)):
        X = OP.encode_frame(kernels.assign(m=m, n=n, k=k, split_k=1))
        fs = {"name": "x", "groups": [{"kind": "roofline", "params": {"reference_tiles": "catalogue"}}]}
        union = build_features(fs, OP, cfg.arch, cfg.dtype, cfg.layout)
        out = union.fit_transform(X)
        f = dict(zip(union.get_feature_names_out(), out.T))
        rel, est = f["roofline__est_vs_best"], f["roofline__log2_est_us"]
        assert rel.min() == 0.0 and (rel >= 0).all()
        np.testing.assert_allclose(rel, est - est.min(), rtol=0, atol=1e-12)


# -- features as configuration: inline expression groups, the open registry, hardware -----------
#: An inline feature set over gemm_universal's fields: raw, log2, ratio, ceil-div tiles, waves
#: over CUs, roofline terms, a categorical comparison and a one-hot expansion, in two groups.
INLINE = {"name": "inline", "groups": [
    {"kind": "expressions", "name": "custom", "params": {
        "terms": {"flops": "2 * m * n * k",
                  "bytes": "(m * k + k * n + m * n) * dtype_bytes('fp8')"},
        "features": {"raw_m": "m", "log2_n": "log2(n)", "m_over_k": "m / k",
                     "tiles_m": "ceil_div(m, tile_m)",
                     "waves": "ceil(ceil_div(m, tile_m) * ceil_div(n, tile_n) * split_k / hw.cus)",
                     "compute_us": "flops / (hw.peak_tflops * 1e6)",
                     "memory_us": "bytes / (hw.memory_bandwidth_gbs * 1e3)",
                     "compute_bound": "compute_us > memory_us",
                     "is_compv4": "pipeline == 'compv4'"},
        "one_hot": ["epilogue"]}},
    {"kind": "expressions", "name": "more", "params": {"features": {"tile_mn": "tile_m * tile_n"}}},
]}


class TileArea(FeatureGroup):
    """An op's own Python group, loaded by ``test_features:TileArea`` (the extension point)."""

    input_columns = ("tile_m", "tile_n")

    def __init__(self, *, input_names=None) -> None:
        self.input_names = input_names

    def _feature_names(self) -> list[str]:
        return ["tile_area"]

    def _compute(self, cols, xp):
        return [cols["tile_m"] * cols["tile_n"]]


def test_inline_expression_groups_values_by_hand(cfg) -> None:
    X = _frame([dict(m=1000, n=7, k=4096, pipeline=1, epilogue=1), dict(m=4096, n=4096, k=4096, pipeline=0,
                                                                      epilogue=0)])
    union = build_features(INLINE, OP, cfg.arch, cfg.dtype, cfg.layout).fit(X)
    f = dict(zip(union.get_feature_names_out(), union.transform(X).T))
    assert list(f) == ["custom__raw_m", "custom__log2_n", "custom__m_over_k", "custom__tiles_m", "custom__waves",
                       "custom__compute_us", "custom__memory_us", "custom__compute_bound", "custom__is_compv4",
                       "custom__epilogue_default", "custom__epilogue_cshuffle", "more__tile_mn"]
    # Row 0 on gfx950 fp8 (256 CUs, 5033 TFLOPS, 8000 GB/s) with a 64x128 tile, split_k 1.
    assert f["custom__raw_m"][0] == 1000 and f["custom__m_over_k"][0] == 1000 / 4096
    assert f["custom__log2_n"][0] == float(np.float32(math.log(7) / math.log(2)))
    assert f["custom__tiles_m"][0] == 16 and f["custom__waves"][0] == 1  # 16 x 1 blocks on 256 CUs
    assert f["custom__waves"][1] == 8  # 4096/64 x 4096/128 = 2048 blocks over 256 CUs
    assert f["custom__compute_us"][0] == 2 * 1000 * 7 * 4096 / (5033.0 * 1e6)
    assert f["custom__memory_us"][0] == (1000 * 4096 + 4096 * 7 + 1000 * 7) / (8000.0 * 1e3)
    assert list(f["custom__compute_bound"]) == [0.0, 1.0]
    assert list(f["custom__is_compv4"]) == [1.0, 0.0]
    assert list(f["custom__epilogue_default"]) == [0.0, 1.0] and list(f["custom__epilogue_cshuffle"]) == [1.0, 0.0]
    assert list(f["more__tile_mn"]) == [64 * 128] * 2


@pytest.mark.parametrize("group, key, value", [
    ({"kind": "expressions", "params": {"features": {"x": "m * foo"}}}, "features.groups[0].params.features.x", "foo"),
    ({"kind": "expressions", "params": {"features": {"x": "m +"}}}, "features.groups[0].params.features.x", "m +"),
    ({"kind": "expressions", "params": {"features": {"x": ["m"]}}}, "features.groups[0].params.features.x", ["m"]),
    ({"kind": "expressions", "params": {"features": {"log 2": "m"}}}, "features.groups[0].params.features.log 2",
     "log 2"),
    ({"kind": "expressions", "params": {"features": {"x": "m * hw.nope"}}}, "features.groups[0].params.features.x",
     "hw.nope"),
    ({"kind": "expressions", "params": {"features": {"x": "pipeline == 'compv9'"}}},
     "features.groups[0].params.features.x", "compv9"),
    ({"kind": "expressions", "params": {"features": {"a": "b + 1"}, "terms": {"b": "a * 2"}}},
     "features.groups[0].params.terms.b", "b -> a -> b"),
    ({"kind": "expressions", "params": {"features": {"x": "m"}, "one_hot": ["m"]}}, "features.groups[0].params.one_hot",
     "m"),
    ({"kind": "expressions", "params": {"features": {"x": "m"}, "exclude": ["x"]}},
     "features.groups[0].params.exclude", ["x"]),
    ({"kind": "expressions", "params": {}}, "features.groups[0].params.features", None),
    ({"kind": "problem", "params": {"exclude": ["log2_q"]}}, "features.groups[0].params.exclude", "log2_q"),
    ({"kind": "problme"}, "features.groups[0].kind", "problme"),
    ({"kind": "no_such_module_xyz:Group"}, "features.groups[0].kind", "no_such_module_xyz:Group"),
    ({"kind": "collections:OrderedDict"}, "features.groups[0].kind", "collections:OrderedDict"),
    ({"kind": "conv_problem"}, "features.groups[0].kind", "conv_problem"),
])
def test_bad_groups_are_refused_naming_the_key(cfg, group, key, value) -> None:
    with pytest.raises(ConfigValueError) as err:
        build_features({"name": "x", "groups": [group]}, OP, cfg.arch, cfg.dtype, cfg.layout)
    assert (err.value.key, err.value.value) == (key, value)


def test_group_names_are_unique_per_set(cfg) -> None:
    two = {"kind": "expressions", "params": {"features": {"x": "m"}}}
    with pytest.raises(ConfigValueError) as err:
        build_features({"name": "x", "groups": [two, two]}, OP, cfg.arch, cfg.dtype)
    assert err.value.key == "features.groups[1].name" and err.value.value == "expressions"
    union = build_features({"name": "x", "groups": [two, {**two, "name": "again"}]}, OP, cfg.arch, cfg.dtype)
    assert [name for name, _ in union.transformer_list] == ["expressions", "again"]


def test_declared_group_exclude_and_extend(cfg) -> None:
    group = {"kind": "problem", "params": {"exclude": ["layout_code", "log2_mnk"],
                                           "features": {"mnk_bits": "log2_mnk * 2"}}}
    X = _frame([dict(m=16, n=32, k=64)])
    union = build_features({"name": "x", "groups": [group]}, OP, cfg.arch, cfg.dtype, cfg.layout).fit(X)
    f = dict(zip(union.get_feature_names_out(), union.transform(X)[0]))
    assert "problem__layout_code" not in f and "problem__log2_mnk" not in f
    assert f["problem__mnk_bits"] == 30.0 and f["problem__m"] == 16  # an excluded feature stays readable


def test_a_python_group_by_module_path(cfg) -> None:
    X = _frame([dict(m=16, n=32, k=64)])
    fs = {"name": "x", "groups": [{"kind": "test_features:TileArea"}, {"kind": "problem"}]}
    with pytest.raises(ConfigValueError, match="'test_features' is not one, so it was not imported"):
        build_features(fs, OP, cfg.arch, cfg.dtype, cfg.layout)  # a module named by data: allowed first
    with allowed_plugins(["test_features"]):
        union = build_features(fs, OP, cfg.arch, cfg.dtype, cfg.layout).fit(X)
    names = list(union.get_feature_names_out())
    assert names[0] == "TileArea__tile_area" and union.transform(X)[0, 0] == 64 * 128


def test_constants_are_the_hw_namespace(cfg) -> None:
    hw = constants_from_config(cfg.arch, cfg.dtype, cfg.layout)
    assert hw["peak_tflops"] == hw["peak_tflops_fp8"] == 5033.0 and hw["peak_tflops_fp16"] == 2517.0
    assert hw["c_bytes_per_element"] == 2 and hw["lds_bytes"] == 160 * 1024 and hw["l2_mib"] == 32.0
    # A superset of what the op's rules see, with the same values.
    rules_hw = arch_constants(cfg.arch)
    assert all(hw[k] == v or (v != v and hw[k] != hw[k]) for k, v in rules_hw.items())



def test_expression_groups_read_the_ops_flops_expression(cfg) -> None:
    """gemm_universal declares ``flops: 2 * m * n * k``; a group reads it by name (unused: no cost)."""
    X = _frame([dict(m=1000, n=7, k=4096)])
    fs = {"name": "x", "groups": [{"kind": "expressions", "params": {
        "features": {"log2_flops": "log2(flops)", "flops_per_tile": "flops / (tile_m * tile_n)"}}}]}
    union = build_features(fs, OP, cfg.arch, cfg.dtype, cfg.layout).fit(X)
    f = dict(zip(union.get_feature_names_out(), union.transform(X)[0]))
    assert f["expressions__log2_flops"] == float(np.float32(math.log2(2 * 1000 * 7 * 4096)))
    assert f["expressions__flops_per_tile"] == 2 * 1000 * 7 * 4096 / (64 * 128)
    unused = build_features({"name": "x", "groups": [{"kind": "expressions", "params": {"features": {"t": "tile_m"}}}]},
                            OP, cfg.arch, cfg.dtype, cfg.layout)
    assert unused.transformer_list[0][1].input_columns == ("tile_m",)


#: A user's feature set for test_ops' matmul op (fields rows/cols/depth/precision, block_m/...).
USER_FEATURES = """\
defaults:
  - base_features
  - _self_
name: tmm_features
groups:
  - kind: expressions
    name: shape
    params:
      terms:
        grid: ceil_div(rows, block_m) * ceil_div(cols, block_n)
      features:
        log2_rows: log2(rows)
        rows_over_cols: rows / cols
        tiles_m: ceil_div(rows, block_m)
        waves: ceil(grid / hw.cus)
        intensity: flops / bytes
        element_bytes: dtype_bytes(precision)
        fits_lds: (block_m + block_n) * 64 * dtype_bytes(precision) * num_stages <= hw.lds_bytes
      one_hot: [precision]
"""


def test_a_user_feature_set_for_a_declared_op_from_a_config_dir(tmp_path) -> None:
    from test_ops import MATMUL, _user_dir

    root = _user_dir(tmp_path, {"op/tmm.yaml": MATMUL, "features/tmm_features.yaml": USER_FEATURES})
    cfg = compose("train", [f"hydra.searchpath=[file://{root}]", "op=tmm", "features=tmm_features",
                            "features@baselines.reference.features=tmm_features"])
    op = load_op(cfg.op)
    table = pd.DataFrame({"rows": [4096, 100], "cols": [8, 64], "depth": [1024, 32], "precision": ["fp32", "bf16"],
                          "block_m": [128, 64], "block_n": [128, 32], "num_warps": [8, 4], "num_stages": [4, 2]})
    X = op.encode_frame(table)
    union = build_features(cfg.features, op, cfg.arch, cfg.dtype, cfg.layout).fit(X)
    f = dict(zip(union.get_feature_names_out(), union.transform(X).T))
    assert list(f["shape__tiles_m"]) == [32, 2] and list(f["shape__waves"]) == [1, 1]
    assert list(f["shape__element_bytes"]) == [4, 2]
    assert f["shape__intensity"][0] == 2 * 4096 * 8 * 1024 / ((4096 * 1024 + 1024 * 8 + 4096 * 8) * 4)
    assert list(f["shape__fits_lds"]) == [0.0, 1.0]  # 256 KiB of staged fp32 tiles > 160 KiB
    assert [list(f[f"shape__precision_{p}"]) for p in ("fp16", "bf16", "fp32")] == [[0, 0], [0, 1], [1, 0]]
    # The exported graph computes the same, bit for bit (categorical codes, where-chains and all).
    from ckpred.export.lightgbm import register
    from test_converters import OPSETS, _run

    register()
    assert np.array_equal(_run(union, X, OPSETS[0]), union.transform(X))
    # A bad expression in the user's YAML is refused naming its key.
    bad = USER_FEATURES.replace("rows / cols", "rows / colz")
    root = _user_dir(tmp_path / "bad", {"op/tmm.yaml": MATMUL, "features/tmm_features.yaml": bad})
    cfg = compose("train", [f"hydra.searchpath=[file://{root}]", "op=tmm", "features=tmm_features",
                            "features@baselines.reference.features=tmm_features"])
    with pytest.raises(ConfigValueError) as err:
        build_features(cfg.features, op, cfg.arch, cfg.dtype, cfg.layout)
    assert (err.value.key, err.value.value) == ("features.groups[0].params.features.rows_over_cols", "colz")
