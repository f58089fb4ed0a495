"""Validity rules as ONNX arithmetic: the selector's mask of kernels that can run a problem.

An op provides its mask builder in one of three ways:

* it overrides :meth:`ckpred.kernels.base.OpDefinition.validity_onnx` (the hook new ops use:
  the ONNX rules live next to the Python rules of :meth:`~ckpred.kernels.base.OpDefinition.validity`);
* or a builder is registered here in :data:`MASK_BUILDERS` under the op's name (gemm_universal's
  is below, so the op module stays free of ONNX code);
* or, for a declared op (:class:`ckpred.kernels.declared.DeclaredOp`) whose validity is its
  YAML rules, :func:`rules_mask` compiles the same expressions.

A builder is ``builder(g, problem, catalogue, *, op, arch, dtype, layout) -> name`` where ``g``
is a :class:`ckpred.export.graph.GraphBuilder`, ``problem`` names the int64 ``[B, P]`` input
(columns ``op.problem_names``) and ``catalogue`` is the op's catalogue frame; it returns the
name of a bool ``[B, C]`` tensor that must equal ``op.validity`` for every (problem, kernel) —
a test checks that on edge shapes for every registered op.

A pipeline of an op whose table lists only the kernels that apply to each problem carries a
learned applicability model (:func:`ckpred.models.fit_applicability_model`), and a pipeline
that learned which kernels fail a failure model (:func:`ckpred.models.fit_failure_model`). Each
adds a mask on top of the rules, in that order (:func:`with_applicability`,
:func:`with_learned_failures`): the model runs on the same features inside the selector graph,
and a problem for which it leaves no kernel keeps the mask it had before (the selector then
returns the highest-ranked kernels that mask allows, as :func:`ckpred.evaluate.narrowed_mask`
does in Python). The applicability mask also writes :data:`APPLICABILITY_FALLBACK`, a bool
``[B]`` tensor the selector outputs: true where it left no kernel and the answer falls back to
the rules.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import numpy as np
import pandas as pd
from onnx import TensorProto
from sklearn.base import BaseEstimator
from sklearn.pipeline import Pipeline

from ckpred.export import onnx as xo
from ckpred.export.factorise import HybridOps, _static, selector_feature_columns
from ckpred.export.manifest import APPLICABILITY_FALLBACK
from ckpred.export.onnx import BoundMask, GraphBuilder, MaskBuilder
from ckpred.kernels.base import OpDefinition
from ckpred.kernels.declared import DeclaredOp
from ckpred.kernels.lists import listed_mask
from ckpred.models import applicability_model, failure_model


def gemm_universal_mask(g: GraphBuilder, problem: str, catalogue: pd.DataFrame, *, op: OpDefinition,
                        arch: Any, dtype: Any, layout: Any) -> str:
    """``GemmUniversal.validity`` in ONNX: degenerate shapes, then per-operand divisibility.

    Degenerate (M < 1, N <= 1, K <= 1 or split_k < 1) -> nothing valid. Without padding the contiguous
    dimension of each operand must be a multiple of the tile along it: K % (tile_k * split_k) when A is
    row-major or B column-major, M % tile_m when A or C is column-major, N % tile_n when B or C
    is row-major. Pads are per-kernel constants of the catalogue.
    """
    layout_name = getattr(layout, "name", layout)
    a, b, c = layout_name
    names = list(op.problem_names)
    col = {d: g.column(problem, names.index(d), d) for d in ("m", "n", "k", "split_k")}
    one = g.const(1, dtype=np.int64)
    degenerate = g.op("Or", g.op("Or", g.op("LessOrEqual", col["n"], one), g.op("LessOrEqual", col["k"], one)),
                      g.op("Or", g.op("Less", col["m"], one), g.op("Less", col["split_k"], one)))  # [B, 1]
    all_true = g.const(np.ones((1, len(catalogue)), dtype=bool), "all_kernels")
    valid = g.op("And", g.op("Not", degenerate), all_true)  # [B, C]
    rules = (("k", "tile_k", "pad_k", a == "r" or b == "c"),
             ("m", "tile_m", "pad_m", a == "c" or c == "c"),
             ("n", "tile_n", "pad_n", b == "r" or c == "r"))
    for dim, tile, pad, needed in rules:
        if not needed:
            continue
        tiles = g.const(catalogue[tile].to_numpy(np.int64)[None, :], tile)
        if dim == "k":  # split-K: each of the split_k slices must be a whole number of tiles
            tiles = g.op("Mul", tiles, g.op("Max", col["split_k"], one))
        pads = g.const(catalogue[pad].to_numpy(bool)[None, :], pad)
        divisible = g.op("Equal", g.op("Mod", col[dim], tiles, fmod=0), g.const(0, dtype=np.int64))
        valid = g.op("And", valid, g.op("Or", pads, divisible))
    return valid


def rules_mask(g: GraphBuilder, problem: str, catalogue: pd.DataFrame, *, op: OpDefinition, arch: Any,
               dtype: Any, layout: Any) -> str:
    """A declared op's rules (``op.rules``) as a bool ``[B, C]`` mask: the expressions
    ``op.validity`` evaluates in numpy, walked with the selector's
    :class:`~ckpred.export.factorise.HybridOps` (kernel fields are catalogue constants, problem
    fields columns of the ``[B, P]`` input, ``hw.<name>`` the arch's constants)."""
    op = cast(DeclaredOp, op)  # mask_builder_for picks this builder for ops with rules only
    ops = HybridOps(g)
    n_kernels = len(catalogue)
    problem3 = g.op("Unsqueeze", g.op("Cast", problem, to=TensorProto.DOUBLE), g.const([1], dtype=np.int64))
    columns: dict[str, Any] = {}
    for j, name in enumerate(op.problem_names):  # [B, 1, 1]
        columns[name] = ops.symbol(g.op("Gather", problem3, g.const([j], dtype=np.int64), axis=2))
    for name, values in op.columns(catalogue, op.kernel_names).items():  # [1, C, 1]
        columns[name] = values.reshape(1, n_kernels, 1)
    hw = op.hardware(arch) if any(e.hw_names for e, _ in op.rules) else {}
    valid: Any = np.ones((1, n_kernels, 1), dtype=bool)
    for expr, _ in op.rules:
        ok = expr.evaluate_bool({n: columns[n] for n in expr.names}, hw, ops, categories=op.categories)
        if isinstance(ok, (bool, np.bool_)):
            ok = np.full((1, 1, 1), bool(ok))
        valid = ops.logical_and(valid, ok)
    b = g.op("Slice", g.op("Shape", problem), g.const([0], dtype=np.int64), g.const([1], dtype=np.int64))
    target = g.op("Concat", b, g.const([n_kernels, 1], dtype=np.int64), axis=0)  # [B, C, 1]
    if _static(valid):
        name = g.const(np.broadcast_to(np.asarray(valid, dtype=bool), (1, n_kernels, 1)).copy(), "rules_valid",
                       dtype=bool)
    else:
        name = g.op("Cast", valid.name, to=TensorProto.BOOL)
    return g.op("Reshape", g.op("Expand", name, target), g.const([-1, n_kernels], dtype=np.int64))


#: Op name -> mask builder, for ops that do not override ``validity_onnx``.
MASK_BUILDERS: dict[str, MaskBuilder] = {"gemm_universal": gemm_universal_mask}


def _learned_mask(base: MaskBuilder, pipeline: Pipeline, model: BaseEstimator, threshold: float, prefix: str,
                  flag: str | None = None, estimates: str | None = None) -> MaskBuilder:
    """``base`` narrowed by a model on the pipeline's features (estimate <= ``threshold`` stays),
    per problem ``base & (keep | ~any(base & keep))``; ``flag`` names a bool ``[B]`` tensor true
    where the narrowing was dropped (``base`` had a kernel, ``base & keep`` none), ``estimates``
    the ``[B, K]`` estimates (after the graph builder's prefix)."""
    converted = xo.convert_model_step(Pipeline([("features", pipeline.named_steps["features"]), ("model", model)]))

    def builder(g: GraphBuilder, problem: str, catalogue: pd.DataFrame, *, op: OpDefinition, **kw: Any) -> str:
        rule = base(g, problem, catalogue, op=op, **kw)  # [B, K]
        columns = xo.used_features(converted, converted.graph.input[0].type.tensor_type.shape.dim[1].dim_value)
        # [B*K, F'] in the order the packed feature graph makes the columns: the trees are
        # renumbered to it (as the selector's are) instead of a Gather putting them in order
        x, order = selector_feature_columns(g, pipeline, op, op.encode(catalogue, op.kernel_names), problem, columns)
        estimate = g.name(prefix.strip("/") + "_estimate")
        xo._add_pipeline(g, xo.keep_features(converted, [columns[i] for i in order]), x, estimate, prefix=prefix)
        estimate = g.op("Reshape", estimate, g.const([-1, len(catalogue)], dtype=np.int64),
                        out=None if estimates is None else g.prefix + estimates)
        keep = g.op("LessOrEqual", estimate, g.const(threshold, dtype=np.float64))
        axis = g.const([1], dtype=np.int64)
        any_kept = g.op("ReduceMax", g.op("Cast", g.op("And", rule, keep), to=TensorProto.INT64), axis,
                        keepdims=1)  # [B, 1]
        fallback = g.op("Not", g.op("Cast", any_kept, to=TensorProto.BOOL))
        if flag is not None:
            any_rule = g.op("ReduceMax", g.op("Cast", rule, to=TensorProto.INT64), axis, keepdims=1)
            fell = g.op("And", fallback, g.op("Cast", any_rule, to=TensorProto.BOOL))
            g.op("Reshape", fell, g.const([-1], dtype=np.int64), out=flag)
        return g.op("And", rule, g.op("Or", keep, fallback))

    return builder


def with_kernel_list(rules: MaskBuilder) -> MaskBuilder:
    """``rules`` narrowed by the kernel list of the arch the mask is built for
    (:mod:`ckpred.kernels.lists`): a kernel the arch's library build does not have is never a
    candidate there. ``rules``' own mask when the arch lists no kernels for the op."""
    def build(g: GraphBuilder, problem: str, catalogue: pd.DataFrame, **kw: Any) -> str:
        mask = rules(g, problem, catalogue, **kw)
        listed = listed_mask(kw["arch"], kw["op"], catalogue)
        if listed is None:
            return mask
        return str(g.op("And", mask, g.const(listed[None, :], "kernel_list", dtype=bool)))

    return build


def with_applicability(rules: MaskBuilder, pipeline: Pipeline) -> MaskBuilder:
    """``rules`` narrowed by the pipeline's learned applicability model, with the fallback.

    Returns ``rules`` itself when the pipeline has no applicability model. Otherwise a kernel
    whose estimate of being absent exceeds ``pipeline.ckpred_applicability_threshold_`` is
    masked; a problem left with no kernel keeps ``rules`` and its
    :data:`APPLICABILITY_FALLBACK` entry is true. The estimates are the tensor
    :data:`ckpred.export.onnx.APPLICABILITY_ESTIMATE` (the transfer recipe's scores use them).
    """
    model = applicability_model(pipeline)
    if model is None:
        return rules
    return _learned_mask(rules, pipeline, model, float(pipeline.ckpred_applicability_threshold_), "applicability/",
                         flag=APPLICABILITY_FALLBACK, estimates=xo.APPLICABILITY_ESTIMATE)


def with_learned_failures(rules: MaskBuilder, pipeline: Pipeline) -> MaskBuilder:
    """``rules`` narrowed by the pipeline's learned failure model, with the fallback.

    Returns ``rules`` itself when the pipeline has no failure model. Otherwise the builder
    computes the features of every (problem, scored kernel) pair
    (:func:`ckpred.export.factorise.selector_feature_columns`), runs the failure model on them
    (predicted to fail: estimate > ``pipeline.ckpred_failure_threshold_``) and returns
    ``rules & (runs | ~any(rules & runs))`` per problem.
    """
    model = failure_model(pipeline)
    if model is None:
        return rules
    return _learned_mask(rules, pipeline, model, float(pipeline.ckpred_failure_threshold_), "failure/")


def mask_builder_for(op: OpDefinition) -> MaskBuilder:
    """The mask builder of ``op`` (its ``validity_onnx`` override, else the registered one).

    Raises
    ------
    NotImplementedError
        When the op has neither; the selector cannot be exported without validity rules.
    """
    if getattr(type(op), "validity_onnx", None) is not None:
        def from_hook(g: GraphBuilder, problem: str, catalogue: pd.DataFrame, **kw: Any) -> str:
            kw.pop("op", None)
            return op.validity_onnx(g, problem, catalogue, **kw)

        return from_hook
    if op.name in MASK_BUILDERS:
        return MASK_BUILDERS[op.name]
    if hasattr(op, "rules") and "validity" not in getattr(op, "plugin_hooks", ("validity",)):
        return rules_mask  # a declared op whose validity is its rules
    raise NotImplementedError(
        f"op {op.name!r} has no ONNX validity mask: override OpDefinition.validity_onnx in its module "
        f"({type(op).__module__}) or register a builder in ckpred.export.validity.MASK_BUILDERS; "
        f"ops with one: {sorted(MASK_BUILDERS)}")


def bound_mask(builder: MaskBuilder, op: OpDefinition, arch: Any, dtype: Any, layout: Any) -> BoundMask:
    """``builder`` with ``op``, ``arch``, ``dtype`` and ``layout`` bound (the selector's ``mask``)."""
    return functools.partial(builder, op=op, arch=arch, dtype=dtype, layout=layout)
