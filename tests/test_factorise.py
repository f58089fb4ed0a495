"""The selector's factorised features (kernel part evaluated at export) equal the pipeline's."""

from __future__ import annotations

import inspect

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import TensorProto, helper
from sklearn.dummy import DummyRegressor
from sklearn.pipeline import FeatureUnion, Pipeline

from ckpred.config import compose
from ckpred.export import onnx as xo
from ckpred.export.factorise import HybridOps, feature_groups, selector_features
from ckpred.features import build_features
from ckpred.config import feature_set
from ckpred.features.base import NumpyOps
from ckpred.features import group_input_columns
from ckpred.features.registry import group_class
from ckpred.kernels.base import load_op
from test_converters import FEATURE_SETS, _op_for, _rows, _transformer


def _features_graph(pipe: Pipeline, op, kernels: np.ndarray) -> onnx.ModelProto:
    g = xo.GraphBuilder()
    x = selector_features(g, pipe, op, kernels, "problem")
    g.op("Identity", x, out="features")
    g.prune(["features"])  # the per-column nodes packed into wide ones (ckpred.export.pack)
    graph = helper.make_graph(g.nodes, "features", [helper.make_tensor_value_info(
        "problem", TensorProto.INT64, ["B", len(op.problem_names)])],
        [helper.make_tensor_value_info("features", TensorProto.DOUBLE, None)], initializer=g.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in xo.OPSET.items()],
                             ir_version=xo.IR_VERSION)


def _fitted(name: str):
    fs = feature_set(name)
    op = _op_for(set().union(*(group_input_columns(g.kind, g.params) for g in fs.groups)))
    cfg = compose("ingest", ["data.path=x", "arch=gfx950", "dtype=fp8" if op.name == "gemm_universal" else "dtype=bf16"])
    X = _rows(op, n_rows=300, seed=2)
    union = build_features(fs, op, cfg.arch, cfg.dtype, cfg.layout).fit(X)
    return op, X, Pipeline([("features", union), ("model", DummyRegressor())])


def _pairs(op, X: pd.DataFrame, n_problems: int, n_kernels: int) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """Distinct problems and kernels of X, and their cross product in selector row order."""
    P, Q = list(op.problem_names), list(op.kernel_names)
    problems = X[P].drop_duplicates().head(n_problems).to_numpy(np.int64)
    kernels = X[Q].drop_duplicates().head(n_kernels).to_numpy(np.int64)
    rows = np.hstack([np.repeat(problems, len(kernels), axis=0), np.tile(kernels, (len(problems), 1))])
    return problems, kernels, pd.DataFrame(rows, columns=P + Q)


@pytest.mark.slow
@pytest.mark.parametrize("name", FEATURE_SETS)
@pytest.mark.parametrize("n_problems,n_kernels", [(4, 23), (1, 1)])
def test_selector_features_equal_the_pipeline_bit_for_bit(name: str, n_problems: int, n_kernels: int) -> None:
    op, X, pipe = _fitted(name)
    problems, kernels, rows = _pairs(op, X, n_problems, n_kernels)
    got = xo.session(_features_graph(pipe, op, kernels)).run(["features"], {"problem": problems})[0]
    want = pipe[:-1].transform(rows)
    assert got.shape == want.shape == (len(problems) * len(kernels), len(pipe[:-1].get_feature_names_out()))
    # Static parts come from the pipeline's own numpy functions, the rest from the same IEEE
    # operations in onnxruntime (log2 rounded to float32 in both): equal, not just close.
    assert np.array_equal(got, want, equal_nan=True)


def test_kernel_only_features_cost_no_node_per_call() -> None:
    op, X, _ = _fitted("full")
    union = FeatureUnion([("kernel", _transformer("kernel", op).set_params(input_names=list(op.input_names)).fit(X))])
    pipe = Pipeline([("features", union), ("model", DummyRegressor())])
    _, kernels, _ = _pairs(op, X, 2, 40)
    model = _features_graph(pipe, op, kernels)
    arithmetic = {n.op_type for n in model.graph.node} - {"Cast", "Unsqueeze", "Gather", "Shape", "Slice", "Concat",
                                                          "Expand", "Reshape", "Identity"}
    assert not arithmetic, f"kernel-only features computed per call: {sorted(arithmetic)}"


def test_hybrid_ops_implements_every_numpy_op() -> None:
    # A new xp function in NumpyOps needs its static/symbolic dispatch here too.
    public = {n for n, _ in inspect.getmembers(NumpyOps, inspect.isfunction) if not n.startswith("_")}
    missing = sorted(n for n in public if "HybridOps" not in getattr(HybridOps, n).__qualname__)
    assert not missing, f"HybridOps does not override {missing}"


def test_selector_refuses_a_pipeline_it_cannot_factorise() -> None:
    with pytest.raises(TypeError, match="FeatureUnion of ckpred feature groups"):
        feature_groups(Pipeline([("model", DummyRegressor())]))
    union = FeatureUnion([("other", DummyRegressor())])
    with pytest.raises(TypeError, match="DummyRegressor"):
        feature_groups(Pipeline([("features", union), ("model", DummyRegressor())]))


def test_shared_sub_expressions_are_emitted_once() -> None:
    op, X, _ = _fitted("full")
    _, kernels, _ = _pairs(op, X, 2, 30)

    def count(n_copies: int) -> int:
        groups = [(f"roofline{i}", group_class("roofline")(input_names=list(op.input_names)).fit(X))
                  for i in range(n_copies)]
        model = _features_graph(Pipeline([("features", FeatureUnion(groups)), ("model", DummyRegressor())]), op,
                                kernels)
        return sum(n.op_type not in {"Concat", "Gather", "Expand"} for n in model.graph.node)

    # the second copy of the group adds no arithmetic: every node is found already emitted
    assert count(2) == count(1) > 10


def test_selector_features_of_inline_expression_groups_bit_for_bit() -> None:
    from test_features import INLINE

    op = load_op("gemm_universal")
    cfg = compose("ingest", ["data.path=x", "arch=gfx950", "dtype=fp8", "layout=rcr"])
    X = _rows(op, n_rows=300, seed=4)
    union = build_features(INLINE, op, cfg.arch, cfg.dtype, cfg.layout).fit(X)
    pipe = Pipeline([("features", union), ("model", DummyRegressor())])
    problems, kernels, rows = _pairs(op, X, 5, 17)
    got = xo.session(_features_graph(pipe, op, kernels)).run(["features"], {"problem": problems})[0]
    assert np.array_equal(got, pipe[:-1].transform(rows), equal_nan=True)
