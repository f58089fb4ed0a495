"""The selector computes only the features its trees split on: same scores as every feature."""

from __future__ import annotations

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import TensorProto, helper

from ckpred.export import onnx as xo
from ckpred.export.factorise import selector_features
from export_helpers import EDGE_SHAPES, TRAIN_SHAPES, few_tree_regressor


@pytest.fixture(scope="module")
def fitted():
    return few_tree_regressor()


def _scores_graph(op, pipe, catalogue, *, prune: bool) -> onnx.ModelProto:
    kernels = op.encode(catalogue, op.kernel_names)
    g = xo.GraphBuilder()
    step = xo.convert_model_step(pipe)
    width = step.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    used = xo.used_features(step, width) if prune else None
    x = selector_features(g, pipe, op, kernels, "problem", used)
    xo._add_pipeline(g, xo.keep_features(step, used) if prune else step, x, "score")
    g.prune(["score"])
    graph = helper.make_graph(g.nodes, "scores", [helper.make_tensor_value_info(
        "problem", TensorProto.INT64, ["B", len(op.problem_names)])],
        [helper.make_tensor_value_info("score", TensorProto.DOUBLE, ["N", 1])], initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in xo.OPSET.items()],
                              ir_version=xo.IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_pruned_feature_graph_scores_equal_the_full_one(fitted) -> None:
    op, pipe, catalogue = fitted
    full, pruned = _scores_graph(op, pipe, catalogue, prune=False), _scores_graph(op, pipe, catalogue, prune=True)
    step = xo.convert_model_step(pipe)
    width = step.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    used = xo.used_features(step, width)
    assert 0 < len(used) < width  # the trees read a subset: there is something to prune
    assert len(pruned.graph.node) < len(full.graph.node)
    problems = np.array([[m, n, k, 1] for m, n, k in EDGE_SHAPES + TRAIN_SHAPES], dtype=np.int64)
    a = xo.session(full).run(["score"], {"problem": problems})[0]
    b = xo.session(pruned).run(["score"], {"problem": problems})[0]
    assert a.shape == b.shape == (len(problems) * len(catalogue), 1)
    np.testing.assert_array_equal(a, b)
    # and both are the pipeline's own scores (row b*K + j = problem b, kernel j)
    probs = pd.DataFrame(problems, columns=list(op.problem_names))
    rows = probs.loc[probs.index.repeat(len(catalogue))].reset_index(drop=True)
    kern = catalogue.iloc[np.tile(np.arange(len(catalogue)), len(probs))].reset_index(drop=True)
    X = op.encode_frame(pd.concat([rows, kern.drop(columns=["kernel_id", "kernel_name"])], axis=1))
    np.testing.assert_allclose(b.ravel(), pipe.predict(X), rtol=0, atol=1e-9)


def test_keep_features_renumbers_and_refuses_a_missing_column(fitted) -> None:
    _, pipe, _ = fitted
    step = xo.convert_model_step(pipe)
    width = step.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    used = xo.used_features(step, width)
    kept = xo.keep_features(step, used[::-1])  # any order: ids follow the given one
    assert xo.used_features(kept, len(used)) == list(range(len(used)))
    assert kept.graph.input[0].type.tensor_type.shape.dim[1].dim_value == len(used)
    with pytest.raises(ValueError, match="not in the kept columns"):
        xo.keep_features(step, used[1:])


def test_prune_drops_only_dead_nodes() -> None:
    g = xo.GraphBuilder()
    live = g.op("Neg", "x")
    g.op("Abs", live)  # dead: nothing reads it
    g.op("Identity", live, out="y")
    dead_const = g.const([1.0], "unused")
    g.prune(["y"])
    assert [n.op_type for n in g.nodes] == ["Neg", "Identity"]
    assert dead_const not in {t.name for t in g.initializers}
