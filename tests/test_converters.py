"""ONNX converters of the feature transformers: completeness and onnxruntime parity in double."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pandas as pd
import pytest
from skl2onnx import to_onnx
from skl2onnx.common._registration import get_converter, get_shape_calculator
from skl2onnx.common.data_types import Int64TensorType

from ckpred.config import CONF_DIR, compose
from ckpred.export.converters import alias, registered_aliases
from ckpred.config import feature_set
from ckpred.features import FEATURE_GROUPS, build_features, group_class, group_input_columns
from ckpred.features.registry import declared_groups
from ckpred.kernels.base import load_op
from ckpred.plugins import allowed_plugins

FEATURE_SETS = sorted(p.stem for p in (CONF_DIR / "features").glob("*.yaml"))
OPS = {name: load_op(name) for name in ("gemm_universal", "ckpred.kernels.grouped_conv_fwd")}
#: Operator sets of the exported graphs (ckpred.export.onnx.OPSET) and an older one.
OPSETS = ({"": 21, "ai.onnx.ml": 5}, {"": 17, "ai.onnx.ml": 3})
#: Parity bar: |onnx - sklearn| <= RTOL * max(1, |sklearn|).
RTOL = 1e-9


def _op_for(columns: set[str]):
    for op in OPS.values():
        if columns <= set(op.input_names):
            return op
    raise AssertionError(f"no op provides columns {sorted(columns)}: add the op to OPS and rows to _rows")


# -- rows: realistic catalogue kernels on edge and ordinary problems ------------------------------
_GEMM_DIMS = {
    "m": [1, 2, 3, 7, 16, 127, 128, 1000, 4096, 65537, 2**20, 2**25 + 1],
    "n": [2, 13, 1536, 7919, 8192, 2**20 - 3, 2**24 + 1],
    "k": [2, 64, 97, 7168, 65521, 2**20],
    "split_k": [1, 1, 1, 2, 4],
}
_CONV_PROBLEMS = [
    dict(n=1, c=3, k=64, g=1, hi=224, wi=224, y=7, x=7, stride_h=2, stride_w=2, pad_h=3, pad_w=3),
    dict(n=32, c=256, k=256, g=1, hi=14, wi=14, y=3, x=3, stride_h=1, stride_w=1, pad_h=1, pad_w=1),
    dict(n=7, c=1, k=1, g=512, hi=13, wi=17, y=3, x=3, stride_h=1, stride_w=1, pad_h=0, pad_w=0),
    dict(n=128, c=2048, k=512, g=1, hi=7, wi=7, y=1, x=1, stride_h=1, stride_w=1, pad_h=0, pad_w=0),
    dict(n=1, c=4, k=8, g=2, hi=1, wi=1, y=1, x=1, stride_h=1, stride_w=1, pad_h=0, pad_w=0),
]


def _rows(op, n_rows: int = 400, seed: int = 0) -> pd.DataFrame:
    """Raw int64 input of ``op``: random catalogue kernels on random edge/realistic problems."""
    rng = np.random.default_rng(seed)
    if op.name == "gemm_universal":
        cfg = compose("ingest", ["data.path=x", "arch=gfx950", "dtype=fp8", "layout=rcr"])
        kernels = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
        problems = pd.DataFrame({f: rng.choice(v, n_rows) for f, v in _GEMM_DIMS.items()})
    else:
        kernels = op.catalogue(None, "bf16", None)
        problems = pd.DataFrame([_CONV_PROBLEMS[i] for i in rng.integers(0, len(_CONV_PROBLEMS), n_rows)])
        problems["dilation_h"] = problems["dilation_w"] = 1
    picked = kernels.iloc[rng.integers(0, len(kernels), n_rows)].reset_index(drop=True)
    return op.encode_frame(pd.concat([problems, picked], axis=1))


def _run(model, X: pd.DataFrame, opset: dict[str, int]) -> np.ndarray:
    onx = to_onnx(model, initial_types=[("X", Int64TensorType([None, X.shape[1]]))], target_opset=opset)
    sess = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": X.to_numpy(np.int64)})[0]


def _assert_parity(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float64 and got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    err = np.abs(got[finite] - want[finite]) / np.maximum(1.0, np.abs(want[finite]))
    assert err.max(initial=0.0) <= RTOL, f"max relative difference {err.max():.3g}"


def _transformer(kind: str, op):
    """A group of ``kind`` as build_features makes it for ``op`` (gfx950), without input_names."""
    cfg = compose("ingest", ["data.path=x", "arch=gfx950", "dtype=fp8" if op.name == "gemm_universal" else "dtype=bf16"])
    union = build_features({"name": "x", "groups": [{"kind": kind}]}, op, cfg.arch, cfg.dtype, cfg.layout)
    return union.transformer_list[0][1].set_params(input_names=None)


# -- completeness ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FEATURE_SETS)
def test_every_transformer_of_every_feature_set_has_a_converter(name: str) -> None:
    for group in feature_set(name).groups:
        cls = group_class(group.kind)
        assert registered_aliases().get(cls) == alias(cls) == f"Ckpred{cls.__name__}"
        assert get_shape_calculator(alias(cls)) is not None, f"{cls.__name__}: no shape calculator"
        assert get_converter(alias(cls)) is not None, f"{cls.__name__}: no converter"


def test_every_registered_group_has_a_converter() -> None:
    assert set(registered_aliases()) >= {group_class(kind) for kind in FEATURE_GROUPS}


# -- parity ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("opset", OPSETS, ids=lambda o: f"opset{o['']}")
@pytest.mark.parametrize("kind", sorted(FEATURE_GROUPS) + sorted(declared_groups()))
def test_transformer_parity(kind: str, opset: dict[str, int]) -> None:
    op = _op_for(set(group_input_columns(kind)))
    X = _rows(op)
    model = _transformer(kind, op).fit(X)
    _assert_parity(_run(model, X, opset), model.transform(X))


def test_parity_on_a_column_order_other_than_the_op_order() -> None:
    X = _rows(OPS["gemm_universal"], n_rows=50)
    X = X[list(reversed(X.columns))]
    model = _transformer("interaction", OPS["gemm_universal"]).fit(X)
    _assert_parity(_run(model, X, OPSETS[0]), model.transform(X))


@pytest.mark.slow
@pytest.mark.parametrize("name", FEATURE_SETS)
def test_feature_union_parity(name: str) -> None:
    fs = feature_set(name)
    op = _op_for(set().union(*(group_input_columns(g.kind, g.params) for g in fs.groups)))
    cfg = compose("ingest", ["data.path=x", "arch=gfx950", "dtype=fp8" if op.name == "gemm_universal" else "dtype=bf16"])
    X = _rows(op, n_rows=200, seed=1)
    union = build_features(fs, op, cfg.arch, cfg.dtype, cfg.layout).fit(X)
    _assert_parity(_run(union, X, OPSETS[0]), union.transform(X))


def test_wrong_input_width_is_refused() -> None:
    X = _rows(OPS["gemm_universal"], n_rows=5)
    model = _transformer("problem", OPS["gemm_universal"]).fit(X)
    with pytest.raises(RuntimeError, match="fitted on 20 input columns"):
        to_onnx(model, initial_types=[("X", Int64TensorType([None, 4]))], target_opset=OPSETS[0])


# -- expression groups and an op's own Python group ------------------------------------------------
def test_expression_and_module_path_groups_export_bit_for_bit() -> None:
    from ckpred.export.lightgbm import register
    from test_features import INLINE

    op = OPS["gemm_universal"]
    cfg = compose("ingest", ["data.path=x", "arch=gfx950", "dtype=fp8", "layout=rcr"])
    fs = {"name": "x", "groups": [*INLINE["groups"], {"kind": "test_features:TileArea"}, {"kind": "occupancy"}]}
    X = _rows(op, n_rows=300, seed=3)
    with allowed_plugins(["test_features"]):  # a test module: allowed as a user allows theirs
        union = build_features(fs, op, cfg.arch, cfg.dtype, cfg.layout).fit(X)
    register()  # what every export does first: converters for every loaded group class
    got, want = _run(union, X, OPSETS[0]), union.transform(X)
    assert got.shape == want.shape and np.array_equal(got, want, equal_nan=True)


def test_a_group_class_loaded_late_gets_its_converter_at_conversion() -> None:
    from ckpred.export.lightgbm import register
    from ckpred.features.base import FeatureGroup

    class LateGroup(FeatureGroup):
        input_columns = ("m",)

        def __init__(self, *, input_names=None) -> None:
            self.input_names = input_names

        def _feature_names(self):
            return ["m_squared"]

        def _compute(self, cols, xp):
            return [cols["m"] * cols["m"]]

    assert LateGroup not in registered_aliases()  # defined after the converters module loaded
    register()
    assert registered_aliases()[LateGroup] == "CkpredLateGroup"
    X = _rows(OPS["gemm_universal"], n_rows=20)
    model = LateGroup().fit(X)
    assert np.array_equal(_run(model, X, OPSETS[0]), model.transform(X))
