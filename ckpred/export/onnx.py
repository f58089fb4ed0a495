"""Compile a fitted ckpred pipeline into the two ONNX graphs a dispatcher loads.

Graphs and their stable input/output names
------------------------------------------
**scorer** (``scorer.onnx``) — scores arbitrary (problem, kernel) rows:

* input ``problem``: int64 ``[N, P]``, the op's problem fields in ``op.problem_names`` order
  (gemm_universal: ``m, n, k, split_k``);
* input ``kernel``: int64 ``[N, Q]``, the op's kernel fields in ``op.kernel_names`` order, category
  fields as their code (index in ``Field.categories``), bools as 0/1;
* output ``score``: double ``[N]``, exactly what ``pipeline.predict`` returns (target inverse
  applied: TFLOPS for ``log1p``/``raw`` targets, a relative or ranking score otherwise).
  Higher is better.

**selector** (``model.onnx``) — picks kernels for problems with the catalogue baked in:

* input ``problem``: int64 ``[B, P]`` (one row per problem; B may be 1);
* input ``top_k``: int64 ``[1]``, how many kernels to return (clamped to the catalogue size);
* output ``kernel_ids``: int64 ``[B, min(top_k, C)]``, catalogue ids (``kernel_id`` of the
  manifest's catalogue), best first, ties broken by the lower id;
* output ``scores``: double ``[B, min(top_k, C)]``, their scores; ``-inf`` for invalid kernels;
* output ``num_valid``: int64 ``[B]``, how many catalogue kernels can run the problem. Only the
  first ``min(top_k, num_valid)`` entries are real choices; ``num_valid == 0`` means "no kernel"
  (e.g. the degenerate N=1 or K=1 GEMMs).
* output ``applicability_fallback``: bool ``[B]``, only in a selector with an applicability mask
  (an op whose table lists only the kernels that apply): true when no kernel is predicted to
  apply to the problem and the answer ranks the rule-valid kernels instead.

Inside the selector the features of every (problem, catalogue kernel) pair are computed with
the catalogue as a constant: whatever depends on kernel fields only is evaluated at export,
what depends on the problem only once per problem (:mod:`ckpred.export.factorise`), columns
computed side by side by a few wide ops (:mod:`ckpred.export.pack`). Only the features the trees
split on are computed, in the order the feature graph makes them (the trees' feature ids are
renumbered to it). The rows of the ``[B*C, F]`` features that the op's validity rules allow
(compiled to ONNX arithmetic, see :mod:`ckpred.export.validity`) go through the same trees as
the scorer's; their scores are scattered into ``[B, C]`` (``-inf`` for the invalid kernels) and
ranked by ``TopK``.

Precision: every input is int64, feature converters compute in double, and the trees are the
double-precision ``ai.onnx.ml`` opset 5 ``TreeEnsemble`` (see :mod:`ckpred.export.lightgbm`), so
the graphs branch and sum like LightGBM.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
from onnx import TensorProto, helper
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import DataType, DoubleTensorType, Int64TensorType
from sklearn.base import BaseEstimator
from sklearn.pipeline import Pipeline

from ckpred.export import lightgbm as lgbm_conv
from ckpred.export.blend import blended, expected, static_matrix, static_scores
from ckpred.export.factorise import selector_feature_columns
from ckpred.export.graph import GraphBuilder
from ckpred.export.manifest import SELECTOR_FLAGS
from ckpred.export.opset import IR_VERSION, OPSET
from ckpred.kernels.base import OpDefinition
from ckpred.models import applicability_model
from ckpred.transfer import TransferModel

SCORER_INPUTS = ("problem", "kernel")
SCORER_OUTPUTS = ("score",)
SELECTOR_INPUTS = ("problem", "top_k")
SELECTOR_OUTPUTS = ("kernel_ids", "scores", "num_valid")

#: Name of the raw input X inside the converted pipeline (columns ``op.input_names``).
PIPELINE_INPUT = "X"
PIPELINE_OUTPUT = "pipeline_score"
#: The selector's ``[B, K]`` estimates that each scored kernel is absent for the problem, as the
#: applicability mask names them (:func:`ckpred.export.validity.with_applicability`; after the
#: graph builder's prefix): the transfer recipe weighs its learner's scores with them.
APPLICABILITY_ESTIMATE = "applicability_estimate"


#: Builds the validity mask: ``(g, problem, catalogue, op=, arch=, dtype=, layout=) -> name`` of a
#: bool ``[B, C]`` tensor, ``problem`` being the int64 ``[B, P]`` input.
MaskBuilder = Callable[..., str]
#: A :data:`MaskBuilder` with ``op``, ``arch``, ``dtype`` and ``layout`` bound:
#: ``(g, problem, catalogue) -> name``.
BoundMask = Callable[[GraphBuilder, str, pd.DataFrame], str]


def _convert(model: BaseEstimator, initial_types: list[tuple[str, DataType]]) -> onnx.ModelProto:
    """skl2onnx conversion to :data:`OPSET` with output ``pipeline_score`` double ``[N, 1]``."""
    lgbm_conv.register()
    onx = convert_sklearn(
        model,
        initial_types=initial_types,
        final_types=[(PIPELINE_OUTPUT, DoubleTensorType([None, 1]))],
        # skl2onnx 1.20 knows ai.onnx.ml up to 3; the TreeEnsemble node needs 5 (set below).
        target_opset={**OPSET, "ai.onnx.ml": 3},
    )
    for entry in onx.opset_import:
        if entry.domain == "ai.onnx.ml":
            entry.version = OPSET["ai.onnx.ml"]
    onx.ir_version = IR_VERSION
    return onx


def convert_pipeline(pipeline: Pipeline, op: OpDefinition) -> onnx.ModelProto:
    """Convert a fitted pipeline (raw int64 X -> score) with skl2onnx.

    The result has input ``X`` int64 ``[N, len(op.input_names)]`` and output
    ``pipeline_score`` double ``[N, 1]``.

    Raises
    ------
    RuntimeError, TypeError
        From skl2onnx when a step has no converter (the message names the step's class), or
        from the LightGBM shape calculator when features reach the trees as float32.
    """
    return _convert(pipeline, [(PIPELINE_INPUT, Int64TensorType([None, len(op.input_names)]))])


def convert_model_step(pipeline: Pipeline) -> onnx.ModelProto:
    """Convert the pipeline's last step alone (double features ``X [N, F]`` -> ``pipeline_score``).

    The selector computes the features itself (:mod:`ckpred.export.factorise`) and feeds them
    to this graph: the trees and the target's inverse, exactly as in :func:`convert_pipeline`.
    """
    n_features = len(pipeline[:-1].get_feature_names_out())
    return _convert(pipeline.steps[-1][1], [(PIPELINE_INPUT, DoubleTensorType([None, n_features]))])


#: Tree ensembles of ``ai.onnx.ml`` whose ``nodes_featureids`` index the input's columns.
_TREE_OPS = ("TreeEnsemble", "TreeEnsembleRegressor", "TreeEnsembleClassifier")


def _tree_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto] | None:
    """The tree nodes reading the model's input directly, or None when another node reads it too
    (then its columns cannot be renumbered)."""
    x = model.graph.input[0].name
    readers = [n for n in model.graph.node if x in n.input]
    if not readers or any(n.domain != "ai.onnx.ml" or n.op_type not in _TREE_OPS for n in readers):
        return None
    return readers


def _split_features(node: onnx.NodeProto) -> np.ndarray:
    """Feature ids of the node's splits (``TreeEnsembleRegressor`` lists leaves too: left out)."""
    attrs = {a.name: a for a in node.attribute}
    ids = np.asarray(attrs["nodes_featureids"].ints, dtype=np.int64)
    if node.op_type != "TreeEnsemble":
        ids = ids[np.asarray([m != b"LEAF" for m in attrs["nodes_modes"].strings], dtype=bool)]
    return ids


def used_features(model: onnx.ModelProto, n_features: int) -> list[int]:
    """Sorted input columns the converted model step's trees split on (all when not only trees
    read the input; at least one column, so that a constant model still has an input)."""
    trees = _tree_nodes(model)
    if trees is None:
        return list(range(n_features))
    used = sorted({int(i) for node in trees for i in _split_features(node)})
    return used or [0]


def keep_features(model: onnx.ModelProto, columns: list[int]) -> onnx.ModelProto:
    """A copy of the converted model step whose input holds only ``columns`` (in that order):
    the trees' feature ids renumbered, the input's width ``len(columns)``.

    Raises
    ------
    ValueError
        When a node other than a tree reads the input, or a split uses a column not in ``columns``.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    trees = _tree_nodes(out)
    if trees is None:
        raise ValueError("the model step's input is read by nodes other than trees: its columns cannot be dropped")
    rank = {int(c): i for i, c in enumerate(columns)}
    for node in trees:
        attr = next(a for a in node.attribute if a.name == "nodes_featureids")
        split = set(_split_features(node).tolist())
        if not split <= set(rank):
            raise ValueError(f"the trees split on features {sorted(split - set(rank))} not in the kept columns")
        attr.ints[:] = [rank.get(int(i), 0) for i in attr.ints]  # leaves (old ops) point at column 0
    out.graph.input[0].type.tensor_type.shape.dim[1].dim_value = len(columns)
    return out


def _add_pipeline(g: GraphBuilder, pipe: onnx.ModelProto, x: str, out: str, prefix: str = "pipe/") -> None:
    """Inline the converted pipeline's nodes into ``g``: ``x`` -> ``out`` (``[N, 1]``).

    ``prefix`` keeps the names of two inlined models apart (the learned validity mask inlines a
    second one).
    """
    prefixed = onnx.compose.add_prefix(pipe, prefix)
    graph = prefixed.graph
    g.op("Identity", x, out=prefix + PIPELINE_INPUT)
    g.nodes.extend(graph.node)
    g.initializers.extend(graph.initializer)
    g.op("Identity", prefix + PIPELINE_OUTPUT, out=out)


def _model(g: GraphBuilder, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           doc: str) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, inputs, outputs, initializer=g.initializers, doc_string=doc)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSET.items()],
                              ir_version=IR_VERSION, producer_name="ckpred")
    onnx.checker.check_model(model, full_check=True)
    return model


def build_scorer(pipe: onnx.ModelProto, op: OpDefinition) -> onnx.ModelProto:
    """The scorer graph (see the module docstring) around a converted pipeline."""
    g = GraphBuilder()
    x = g.op("Concat", "problem", "kernel", axis=1)
    raw = g.name("score2d")
    _add_pipeline(g, pipe, x, raw)
    g.op("Reshape", raw, g.const([-1], dtype=np.int64), out="score")
    inputs = [helper.make_tensor_value_info("problem", TensorProto.INT64, ["N", len(op.problem_names)]),
              helper.make_tensor_value_info("kernel", TensorProto.INT64, ["N", len(op.kernel_names)])]
    outputs = [helper.make_tensor_value_info("score", TensorProto.DOUBLE, ["N"])]
    return _model(g, "ckpred_scorer", inputs, outputs,
                  f"ckpred scorer for op {op.name}: problem {list(op.problem_names)}, "
                  f"kernel {list(op.kernel_names)} -> score (higher is better)")


def build_selector(pipeline: Pipeline, op: OpDefinition, catalogue: pd.DataFrame, *, mask: BoundMask,
                   keep: np.ndarray | None = None, transfer: TransferModel | None = None) -> onnx.ModelProto:
    """The selector graph (see the module docstring): catalogue constant, validity mask, TopK.

    ``pipeline`` is the fitted sklearn pipeline: its features are compiled with the candidate
    kernels as constants (:func:`ckpred.export.factorise.selector_features`, kernel-only parts
    evaluated at export), its model step by skl2onnx (:func:`convert_model_step`).

    ``mask`` emits the validity mask of the scored kernels: a :data:`MaskBuilder` with the op,
    arch, dtype and layout bound (:func:`ckpred.export.validity.bound_mask`).

    With ``keep`` (distinct catalogue ids, :mod:`ckpred.export.strategies`), only those rows are
    scored and masked and a final ``Gather`` maps TopK's positions back to catalogue ids; the
    inputs and outputs are the same, and ``num_valid`` counts the valid *candidates*, so
    ``min(top_k, num_valid)`` is still the number of real choices.

    With ``transfer`` (a :class:`ckpred.transfer.TransferModel` whose learner is ``pipeline``),
    the trees' scores are blended with the recipe's static order inside the graph
    (:mod:`ckpred.export.blend`) before ``TopK``; with an applicability model on ``pipeline`` too,
    the trees' scores are first their expected throughput (:func:`ckpred.models.expected_throughput`,
    on the mask's estimate :data:`APPLICABILITY_ESTIMATE`).

    Raises
    ------
    ValueError
        On an empty catalogue, ``kernel_id`` not ``0..C-1`` in row order, or ``keep`` not
        distinct catalogue ids.
    """
    C = len(catalogue)
    keep = _checked_keep(op, catalogue, keep)
    scored = catalogue if keep is None else catalogue.iloc[keep].reset_index(drop=True)
    K = len(scored)
    g = GraphBuilder()
    c = g.const([K], dtype=np.int64)
    masked, valid = _masked_scores(g, pipeline, op, scored, mask)
    if transfer is not None and applicability_model(pipeline) is not None:
        masked = expected(g, masked, g.prefix + APPLICABILITY_ESTIMATE, valid)
    if transfer is not None and transfer.weight > 0.0:
        matrix, by, sizes = static_matrix(transfer, op, scored)
        static = static_scores(g, "problem", matrix, by, sizes, op)
        masked = blended(g, masked, static, valid, K, float(transfer.weight))
    return _ranked(g, op, masked, valid, c, keep, C)


def _checked_keep(op: OpDefinition, catalogue: pd.DataFrame, keep: np.ndarray | None) -> np.ndarray | None:
    """``keep`` as int64 ids after :func:`build_selector`'s checks of the catalogue and of ``keep``."""
    C = len(catalogue)
    if C == 0:
        raise ValueError(f"empty catalogue for op {op.name}: nothing to select from")
    if not np.array_equal(catalogue["kernel_id"].to_numpy(), np.arange(C)):
        raise ValueError("catalogue kernel_id must be 0..n-1 in row order (the selector returns row indices)")
    if keep is not None:
        keep = np.asarray(keep, dtype=np.int64)
        if not len(keep) or keep.min() < 0 or keep.max() >= C or len(np.unique(keep)) != len(keep):
            raise ValueError(f"keep must be distinct catalogue ids in [0, {C}), got {len(keep)} ids")
    return keep


def _masked_scores(g: GraphBuilder, pipeline: Pipeline, op: OpDefinition, scored: pd.DataFrame,
                   mask: BoundMask) -> tuple[str, str]:
    """Emit the scores ``[B, K]`` of the ``scored`` kernels (``-inf`` where the mask is false);
    returns their name and the mask's."""
    K = len(scored)
    step = convert_model_step(pipeline)
    # only the features the trees split on (the others' nodes are pruned below)
    columns = used_features(step, step.graph.input[0].type.tensor_type.shape.dim[1].dim_value)
    # [B*K, F'], columns in the order the packed feature graph makes them: the trees read them so
    x, order = selector_feature_columns(g, pipeline, op, op.encode(scored, op.kernel_names), "problem", columns)
    valid = mask(g, "problem", scored)
    # Only the valid pairs go through the trees (usually a fraction of them: the trees cost per
    # row); their scores are scattered into a [B*K] vector of -inf, the score of an invalid kernel.
    flat = g.op("Reshape", valid, g.const([-1], dtype=np.int64))  # [B*K]
    raw = g.name("score2d")
    _add_pipeline(g, keep_features(step, [columns[i] for i in order]), g.op("Compress", x, flat, axis=0), raw)
    rows = g.op("Reshape", g.op("NonZero", flat), g.const([-1], dtype=np.int64))  # [n valid]
    base = g.op("Where", flat, g.const(0.0, dtype=np.float64), g.const(-np.inf, dtype=np.float64))
    scattered = g.op("ScatterElements", base, rows, g.op("Reshape", raw, g.const([-1], dtype=np.int64)), axis=0)
    return g.op("Reshape", scattered, g.const([-1, K], dtype=np.int64)), valid  # [B, K]


def _ranked(g: GraphBuilder, op: OpDefinition, masked: str, valid: str, c: str, keep: np.ndarray | None,
            C: int) -> onnx.ModelProto:
    """The selector model: ``TopK`` of the ``masked`` scores (``c``: the number scored, ``K``),
    kernel ids (mapped back to catalogue ids with ``keep``), ``num_valid`` and the mask's flags."""
    k = g.op("Min", "top_k", c)
    if keep is None:
        g.op("TopK", masked, k, axis=1, largest=1, sorted=1, out=["scores", "kernel_ids"])
    else:
        local = g.name("local_ids")
        g.op("TopK", masked, k, axis=1, largest=1, sorted=1, out=["scores", local])
        g.op("Gather", g.const(keep, "candidate_ids", dtype=np.int64), local,
             axis=0, out="kernel_ids")
    g.op("ReduceSum", g.op("Cast", valid, to=TensorProto.INT64), g.const([1], dtype=np.int64), keepdims=0,
         out="num_valid")
    # a mask builder that falls back per problem may name that as an output (the applicability mask)
    extra = [name for name in SELECTOR_FLAGS if any(name in node.output for node in g.nodes)]
    g.prune([*SELECTOR_OUTPUTS, *extra])
    inputs = [helper.make_tensor_value_info("problem", TensorProto.INT64, ["B", len(op.problem_names)]),
              helper.make_tensor_value_info("top_k", TensorProto.INT64, [1])]
    outputs = [helper.make_tensor_value_info("kernel_ids", TensorProto.INT64, ["B", "K"]),
               helper.make_tensor_value_info("scores", TensorProto.DOUBLE, ["B", "K"]),
               helper.make_tensor_value_info("num_valid", TensorProto.INT64, ["B"])]
    outputs += [helper.make_tensor_value_info(name, TensorProto.BOOL, ["B"]) for name in extra]
    K = C if keep is None else len(keep)
    scope = f"{C} catalogue kernels" if keep is None else f"{K} of {C} catalogue kernels (pruned)"
    return _model(g, "ckpred_selector", inputs, outputs,
                  f"ckpred selector for op {op.name}: problem {list(op.problem_names)} + top_k -> "
                  f"kernel_ids, scores, num_valid over {scope}")


def build_mask_model(op: OpDefinition, catalogue: pd.DataFrame, *, arch: Any, dtype: Any, layout: Any,
                     mask_builder: MaskBuilder) -> onnx.ModelProto:
    """A graph of the validity mask alone (``problem`` -> ``valid`` bool [B, C]), for tests."""
    g = GraphBuilder()
    mask = mask_builder(g, "problem", catalogue, op=op, arch=arch, dtype=dtype, layout=layout)
    g.op("Identity", mask, out="valid")
    inputs = [helper.make_tensor_value_info("problem", TensorProto.INT64, ["B", len(op.problem_names)])]
    outputs = [helper.make_tensor_value_info("valid", TensorProto.BOOL, ["B", len(catalogue)])]
    return _model(g, "ckpred_validity", inputs, outputs, f"validity mask of op {op.name}")


def set_metadata(model: onnx.ModelProto, props: dict[str, str]) -> None:
    """Replace the model's metadata_props with ``props`` (string values)."""
    del model.metadata_props[:]
    for key, value in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value


def session(model: onnx.ModelProto | bytes | str, threads: int = 1) -> Any:
    """An onnxruntime CPU session with ``threads`` intra-op threads (1 = deterministic order)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    payload = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(payload, options, providers=["CPUExecutionProvider"])
