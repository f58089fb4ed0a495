"""Packed feature columns (ckpred.export.pack): the same values as one node chain per column,
bit for bit, from fewer nodes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ckpred.export import onnx as xo
from ckpred.export.factorise import selector_features
from ckpred.export.pack import pack_columns
from export_helpers import EDGE_SHAPES, TRAIN_SHAPES, few_tree_regressor

PROBLEM = helper.make_tensor_value_info("problem", TensorProto.INT64, ["B", 3])


def _run(g: xo.GraphBuilder, out: str, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, int]:
    g.op("Identity", out, out="y")
    g.prune(["y"])
    out_info = helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["B", "K", "F"])
    graph = helper.make_graph(g.nodes, "t", [PROBLEM], [out_info], initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in xo.OPSET.items()],
                              ir_version=xo.IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return xo.session(model).run(["y"], inputs)[0], len(g.nodes)


def _columns(g: xo.GraphBuilder) -> list[str]:
    """Columns of shapes [B, 1, 1] and [B, K, 1] built the way the feature converters build them:
    parallel chains, swapped operands, constants, a repeated column, casts from bool and float."""
    x = g.op("Unsqueeze", g.op("Cast", "problem", to=TensorProto.DOUBLE), g.const([1], dtype=np.int64))
    m, n, k = (g.op("Gather", x, g.const([j], dtype=np.int64), axis=2) for j in range(3))
    tiles = {name: g.const(np.array([16.0, 32.0, 64.0, 256.0]).reshape(1, 4, 1) * s, name)
             for name, s in (("tm", 1), ("tn", 2), ("tk", 0.5))}
    two = g.const([2.0], "two")
    cols = []
    for dim, tile in ((m, "tm"), (n, "tn"), (k, "tk")):
        cols.append(g.op("Ceil", g.op("Div", dim, tiles[tile])))  # per candidate
        log2 = g.op("Div", g.op("Log", dim), g.const([np.log(2.0)]))  # log2 rounded to float32, as the features do
        cols.append(g.op("Cast", g.op("Cast", log2, to=TensorProto.FLOAT), to=TensorProto.DOUBLE))
    cols.append(g.op("Mul", two, m))  # constant first
    cols.append(g.op("Mul", n, two))  # constant second
    cols.append(g.op("Cast", g.op("Less", m, tiles["tm"]), to=TensorProto.DOUBLE))  # from bool
    cols.append(g.op("Cast", g.op("Cast", g.op("Div", m, n), to=TensorProto.FLOAT), to=TensorProto.DOUBLE))
    cols.append(cols[0])  # a repeated column
    cols.append(g.op("Where", g.op("Equal", g.op("Mod", m, tiles["tm"], fmod=1), g.const([0.0])), two,
                     g.op("Div", k, m)))
    cols.append(m)
    cols.append(g.op("Max", k, g.const(np.full((1, 4, 1), 100.0))))
    return cols


def test_pack_columns_equals_concat_bit_for_bit_with_fewer_nodes() -> None:
    problems = np.array([[1, 1, 1], [7, 4096, 1 << 20], [13, 17, 19], [0, 5, 3], [65537, 3, 1 << 40]], dtype=np.int64)
    outs = {}
    for packed in (False, True):
        g = xo.GraphBuilder()
        cols = _columns(g)
        # every column as [B, K, 1] (Concat needs one extent), the way the selector expands them
        cols = [g.op("Expand", c, g.const([1, 4, 1], dtype=np.int64)) if i % 2 else c for i, c in enumerate(cols)]
        cols = [g.op("Mul", c, g.const(np.ones((1, 4, 1)))) for c in cols]
        out, order = pack_columns(g, cols, [PROBLEM]) if packed else (g.op("Concat", *cols, axis=2), None)
        outs[packed] = (*_run(g, out, {"problem": problems}), order)
    (plain, n_plain, _), (packed, n_packed, order) = outs[False], outs[True]
    assert sorted(order) == list(range(14))
    assert packed.shape == plain.shape == (len(problems), 4, 14)
    np.testing.assert_array_equal(packed, plain[..., order])  # NaN and inf lanes included (0 / 0, log 0)
    assert n_packed < n_plain


def test_pack_columns_of_per_problem_columns_keeps_their_shape() -> None:
    g = xo.GraphBuilder()
    x = g.op("Unsqueeze", g.op("Cast", "problem", to=TensorProto.DOUBLE), g.const([1], dtype=np.int64))
    cols = [g.op("Sqrt", g.op("Gather", x, g.const([j], dtype=np.int64), axis=2)) for j in (2, 0, 1, 0)]
    out, order = pack_columns(g, cols, [PROBLEM])
    got, nodes = _run(g, out, {"problem": np.array([[2, 4, 8], [1, 3, 9]], dtype=np.int64)})
    want = np.sqrt(np.array([[[8, 2, 4, 2]], [[9, 1, 3, 1]]], dtype=np.float64))
    np.testing.assert_array_equal(got, want[..., order])
    assert [n.op_type for n in g.nodes] == ["Cast", "Unsqueeze", "Gather", "Sqrt", "Identity"]  # one of each


@pytest.fixture(scope="module")
def fitted():
    return few_tree_regressor()


def test_packed_selector_features_equal_the_per_column_graph(fitted) -> None:
    """Every feature of the default feature set (none pruned): the same matrix (columns put in
    order) from fewer nodes."""
    op, pipe, catalogue = fitted
    kernels = op.encode(catalogue, op.kernel_names)
    problems = np.array([[m, n, k, 1] for m, n, k in EDGE_SHAPES + TRAIN_SHAPES], dtype=np.int64)
    outs = {}
    for packed in (False, True):
        g = xo.GraphBuilder()
        x = selector_features(g, pipe, op, kernels, "problem", pack=packed)
        g.op("Identity", x, out="features")
        g.prune(["features"])
        width = len(pipe[:-1].get_feature_names_out())
        graph = helper.make_graph(g.nodes, "f", [helper.make_tensor_value_info("problem", TensorProto.INT64, ["B", 4])],
                                  [helper.make_tensor_value_info("features", TensorProto.DOUBLE, ["N", width])],
                                  initializer=g.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in xo.OPSET.items()],
                                  ir_version=xo.IR_VERSION)
        outs[packed] = (xo.session(model).run(["features"], {"problem": problems})[0], len(g.nodes))
    (plain, n_plain), (packed, n_packed) = outs[False], outs[True]
    assert packed.shape == plain.shape == (len(problems) * len(catalogue), len(pipe[:-1].get_feature_names_out()))
    np.testing.assert_array_equal(packed, plain)
    assert n_packed < 0.85 * n_plain
