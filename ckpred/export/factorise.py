"""The selector's features, factorised into a kernel part fixed at export and a problem part.

Inside the selector every candidate kernel is a constant of the graph, so every feature (and
every sub-expression of a feature) that reads kernel fields only — tile areas, pipeline traits,
``log2(tile_m)``, the kernel half of an interaction — has the same value for every problem.
Evaluating them per call, as the generic pipeline graph does on the ``[B*K, P+Q]`` input, costs
one ONNX node (a few microseconds) each, which dominated the latency of a small candidate set.

:func:`selector_features` runs each feature group's own ``_compute`` with :class:`HybridOps`,
an ``xp`` namespace whose values are either

* **static** numpy arrays — kernel columns ``[1, K, 1]`` and anything computed from kernel
  columns and numbers only. They are evaluated *now*, with :class:`ckpred.features.base.NumpyOps`
  (the very functions ``transform`` uses, so the values are the pipeline's, bit for bit), and
  enter the graph as initializers;
* or **symbolic** ONNX tensors — problem columns ``[B, 1, 1]`` and whatever depends on them:
  ``[B, 1, 1]`` while they depend on the problem only (computed once per problem, not once
  per candidate), ``[B, K, 1]`` once a kernel value joins in. Their nodes are emitted by
  :class:`ckpred.export.converters.OnnxOps`, the namespace of the scorer graph.

The feature columns are then assembled into ``[B*K, F]``: one constant block for the static
features, one broadcast block for the problem-only ones, one block for the rest. The two
symbolic blocks are computed side by side by a few wide ops (:mod:`ckpred.export.pack`), in the
lane order packing finds cheapest; :func:`selector_feature_columns` returns that order (the
selector's trees read the columns in it) and :func:`selector_features` puts the columns in the
pipeline's feature order with a ``Gather``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numpy.typing import ArrayLike
from onnx import TensorProto, helper
from sklearn.pipeline import FeatureUnion, Pipeline

from ckpred.export.converters import OnnxOps, Sym, Value
from ckpred.export.graph import GraphBuilder
from ckpred.export.pack import pack_columns
from ckpred.features.base import FeatureGroup, NumpyOps
from ckpred.kernels.base import OpDefinition

__all__ = ["HybridOps", "selector_features", "selector_feature_columns", "feature_groups"]


def _static(x: Value) -> bool:
    """True for values known at export time (numpy arrays and Python numbers)."""
    return not isinstance(x, Sym)


class HybridOps(OnnxOps):
    """``xp`` namespace of the selector: numpy on static values, ONNX nodes on symbolic ones.

    Every tensor is 3-D: ``[B or 1, K or 1, R]`` (R = 1 except inside :meth:`row` blocks).

    Parameters
    ----------
    g : ckpred.export.graph.GraphBuilder
        The graph receiving nodes and initializers.
    """

    # pylint: disable=super-init-not-called  (no skl2onnx scope or container here)
    def __init__(self, g: GraphBuilder) -> None:
        self.g = g
        self._consts: dict[tuple[int, str], str] = {}
        self._numpy = NumpyOps(1)
        self.per_kernel: dict[str, bool] = {}  # tensor name -> varies along the candidate axis
        # Feature groups share sub-expressions (log2(m), ceil(m / tile_m), ...): each distinct
        # node and constant is emitted once (every node costs microseconds per call).
        self._nodes: dict[tuple[Any, ...], str] = {}
        self._arrays: dict[tuple[Any, ...], str] = {}

    # -- plumbing (GraphBuilder instead of skl2onnx's scope and container) ----------------------
    def node(self, op_type: str, inputs: list[str], hint: str | None = None, **attrs: Any) -> str:
        key = (op_type, tuple(inputs), tuple(sorted(attrs.items())))
        if key not in self._nodes:
            out = self.g.op(op_type, *inputs, **attrs)
            self.per_kernel[out] = any(self.per_kernel.get(i, False) for i in inputs)
            self._nodes[key] = out
        return self._nodes[key]

    def const(self, value: float, dtype: int = TensorProto.DOUBLE) -> str:
        key = (dtype, repr(float(value)))  # repr keeps -0.0 apart from 0.0 (1 / -0.0 = -inf)
        if key not in self._consts:
            np_dtype = np.int64 if dtype == TensorProto.INT64 else np.float64
            self._consts[key] = self.g.const([value], "cst", dtype=np_dtype)
        return self._consts[key]

    def array(self, value: np.ndarray) -> str:
        """An initializer holding a static array (its candidate axis recorded)."""
        array = np.asarray(value)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._arrays:
            name = self.g.const(array, "static", dtype=array.dtype)
            self.per_kernel[name] = array.ndim == 3 and array.shape[1] > 1
            self._arrays[key] = name
        return self._arrays[key]

    def _arg(self, x: Value) -> str:
        if isinstance(x, np.ndarray):
            return self.array(x)
        return super()._arg(x)

    def symbol(self, name: str) -> Sym:
        """A symbolic value of the graph tensor ``name``."""
        return Sym(self, name)

    def varies_by_kernel(self, x: Sym) -> bool:
        """Whether a symbolic value differs between candidates (``[B, K, 1]``, not ``[B, 1, 1]``)."""
        return self.per_kernel.get(x.name, False)

    def _lift(self, x: Value) -> Any:
        """Static arrays as symbolic constants (numbers stay numbers: OnnxOps takes those)."""
        return Sym(self, self.array(x)) if isinstance(x, np.ndarray) else x

    def _dispatch(self, fn: str, *args: Value) -> Any:
        if all(_static(a) for a in args):
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return getattr(self._numpy, fn)(*args)
        return getattr(OnnxOps, fn)(self, *(self._lift(a) for a in args))

    # -- the xp namespace --------------------------------------------------------------------
    # A static value where OnnxOps makes a symbol: the xp namespace allows both.
    def full(self, value: float) -> np.ndarray:  # type: ignore[override]
        return np.full((1, 1, 1), float(value))

    def log2(self, x: Value) -> Any:
        return self._dispatch("log2", x)

    def ceil(self, x: Value) -> Any:
        return self._dispatch("ceil", x)

    def floor(self, x: Value) -> Any:
        return self._dispatch("floor", x)

    def fmod(self, a: Value, b: Value) -> Any:
        return self._dispatch("fmod", a, b)

    def minimum(self, a: Value, b: Value) -> Any:
        return self._dispatch("minimum", a, b)

    def maximum(self, a: Value, b: Value) -> Any:
        return self._dispatch("maximum", a, b)

    def where(self, cond: Value, a: Value, b: Value) -> Any:
        return self._dispatch("where", cond, a, b)

    def equal(self, a: Value, b: Value) -> Any:
        return self._dispatch("equal", a, b)

    def less(self, a: Value, b: Value) -> Any:
        return self._dispatch("less", a, b)

    def indicator(self, cond: Value) -> Any:
        return self._dispatch("indicator", cond)

    def greater(self, a: Value, b: Value) -> Any:
        return self._dispatch("greater", a, b)

    def less_equal(self, a: Value, b: Value) -> Any:
        return self._dispatch("less_equal", a, b)

    def greater_equal(self, a: Value, b: Value) -> Any:
        return self._dispatch("greater_equal", a, b)

    def logical_and(self, a: Value, b: Value) -> Any:
        return self._dispatch("logical_and", a, b)

    def logical_or(self, a: Value, b: Value) -> Any:
        return self._dispatch("logical_or", a, b)

    def logical_not(self, a: Value) -> Any:
        return self._dispatch("logical_not", a)

    def power(self, a: Value, b: Value) -> Any:
        return self._dispatch("power", a, b)

    def sqrt(self, x: Value) -> Any:
        return self._dispatch("sqrt", x)

    def abs(self, x: Value) -> Any:
        return self._dispatch("abs", x)

    def as_column(self, x: Value) -> Any:
        return x  # already [., ., 1]

    def row(self, values: ArrayLike) -> np.ndarray:  # type: ignore[override]
        return np.asarray(values, dtype=np.float64)[None, None, :]

    def min_across(self, x: Value) -> Any:
        if not isinstance(x, Sym):  # static
            return np.asarray(x).min(axis=-1, keepdims=True)
        axes = self.g.const([-1], "axes", dtype=np.int64)
        return Sym(self, self.node("ReduceMin", [x.name, axes], keepdims=1))


def feature_groups(pipeline: Pipeline) -> list[FeatureGroup]:
    """The fitted feature groups of a ckpred pipeline (``features`` FeatureUnion, then a model).

    Raises
    ------
    TypeError
        When the pipeline is not a ``FeatureUnion`` of ckpred feature groups followed by one
        estimator (the layout :func:`ckpred.models.build_pipeline` makes), naming what it found.
    """
    steps = getattr(pipeline, "steps", None)
    if not steps or len(steps) != 2 or not isinstance(steps[0][1], FeatureUnion):
        found = [type(s).__name__ for _, s in steps] if steps else type(pipeline).__name__
        raise TypeError(f"the selector needs a Pipeline of a FeatureUnion of ckpred feature groups and one "
                        f"estimator (ckpred.models.build_pipeline); got {found}")
    union = steps[0][1]
    groups = [t for _, t in union.transformer_list]
    bad = [type(t).__name__ for t in groups if not isinstance(t, FeatureGroup)]
    if bad or union.transformer_weights:
        raise TypeError(f"the selector's FeatureUnion must hold unweighted ckpred feature groups only; "
                        f"found {bad or 'transformer_weights'}")
    return groups


def selector_feature_columns(g: GraphBuilder, pipeline: Pipeline, op: OpDefinition, kernels: np.ndarray, problem: str,
                             used: Sequence[int] | None = None, pack: bool = True) -> tuple[str, list[int]]:
    """Emit the feature matrix of every (problem, candidate) pair, columns in the order they are
    cheapest to compute in.

    Parameters
    ----------
    g : ckpred.export.graph.GraphBuilder
    pipeline : sklearn.pipeline.Pipeline
        Fitted ckpred pipeline (see :func:`feature_groups`).
    op : OpDefinition
    kernels : ndarray of int64, shape (K, Q)
        The candidates' kernel fields (``op.kernel_names`` order, categories encoded).
    problem : str
        Name of the int64 ``[B, P]`` problem input.
    used : sequence of int, optional
        Feature positions to emit, in this order (the ones a model's trees split on, see
        :func:`ckpred.export.onnx.used_features`); None = every feature. The nodes of the
        features left out are still emitted; :meth:`ckpred.export.graph.GraphBuilder.prune`
        removes them.
    pack : bool, default=True
        Compute the columns side by side with a few wide ops (:func:`ckpred.export.pack.pack_columns`)
        instead of one chain of nodes per column (same values, fewer nodes).

    Returns
    -------
    name : str
        A double ``[B*K, F]`` tensor, row ``b*K + j`` = problem ``b`` with candidate ``j``.
    order : list of int
        Column ``i`` of it is feature ``order[i]`` (the position in the pipeline's feature order,
        or in ``used``, F = ``len(used)``): a tree ensemble can read the columns in this order
        (:func:`ckpred.export.onnx.keep_features`) instead of a ``Gather`` putting them in order.
    """
    groups = feature_groups(pipeline)
    ops = HybridOps(g)
    n_kernels = kernels.shape[0]
    columns = _input_columns(g, ops, op, kernels, problem)
    parts, position = _split_features(groups, columns, ops, n_kernels)
    if used is not None:  # only these positions, renumbered in ``used`` order
        rank = {int(p): i for i, p in enumerate(used)}
        if not rank or len(rank) != len(used) or not set(rank) <= set(range(position)):
            raise ValueError(f"used must be distinct feature positions in [0, {position}), got {list(used)}")
        static, per_problem, per_pair = ([(rank[p], v) for p, v in part if p in rank] for part in parts)
        parts = (static, per_problem, per_pair)
        position = len(rank)
    return _assemble(g, op, problem, parts, position, n_kernels, pack)


#: The feature columns by kind, each a list of (feature position, value): static (a numpy
#: ``[1, K, 1]`` array), per problem and per (problem, kernel) pair (the names of symbolic tensors).
_Parts = tuple[list[tuple[int, Any]], list[tuple[int, Any]], list[tuple[int, Any]]]


def _input_columns(g: GraphBuilder, ops: HybridOps, op: OpDefinition, kernels: np.ndarray, problem: str) -> dict[str, Any]:
    """The groups' input columns: problem fields ``[B, 1, 1]`` (symbolic), kernel fields ``[1, K, 1]`` (static)."""
    n_kernels = kernels.shape[0]
    problem3 = g.op("Unsqueeze", g.op("Cast", problem, to=TensorProto.DOUBLE), g.const([1], dtype=np.int64))
    columns: dict[str, Any] = {}
    for j, name in enumerate(op.problem_names):  # [B, 1, 1] each, gathered once
        columns[name] = ops.symbol(g.op("Gather", problem3, g.const([j], dtype=np.int64), axis=2))
    for q, name in enumerate(op.kernel_names):  # [1, K, 1] each, known now
        columns[name] = kernels[:, q].astype(np.float64).reshape(1, n_kernels, 1)
    return columns


def _split_features(groups: list[FeatureGroup], columns: dict[str, Any], ops: HybridOps,
                    n_kernels: int) -> tuple[_Parts, int]:
    """Every group's outputs split by kind (static, per problem, per pair) and the feature count."""
    static: list[tuple[int, Any]] = []
    per_problem: list[tuple[int, Any]] = []
    per_pair: list[tuple[int, Any]] = []
    position = 0
    for group in groups:
        outputs = group._compute({c: columns[c] for c in group.input_columns}, ops)
        if len(outputs) != group.n_features_out_:
            raise RuntimeError(f"{type(group).__name__}: {len(outputs)} selector columns for "
                               f"{group.n_features_out_} features")
        for value in outputs:
            if _static(value):
                static.append((position, np.broadcast_to(np.asarray(value, dtype=np.float64), (1, n_kernels, 1))))
            elif ops.varies_by_kernel(value):
                per_pair.append((position, value.name))
            else:
                per_problem.append((position, value.name))
            position += 1
    return (static, per_problem, per_pair), position


def _assemble(g: GraphBuilder, op: OpDefinition, problem: str, parts: _Parts, position: int, n_kernels: int,
              pack: bool) -> tuple[str, list[int]]:
    """The ``[B*K, F]`` matrix of the three blocks side by side, and the feature order of its columns."""
    static, per_problem, per_pair = parts
    b = g.op("Slice", g.op("Shape", problem), g.const([0], dtype=np.int64), g.const([1], dtype=np.int64))
    target = g.op("Concat", b, g.const([n_kernels, 1], dtype=np.int64), axis=0)  # [B, K, 1]
    blocks: list[str] = []
    order: list[int] = []
    if static:
        values = np.concatenate([v for _, v in static], axis=2)  # [1, K, Fs]
        blocks.append(g.op("Expand", g.const(values, "static_features", dtype=np.float64), target))
    inputs = [helper.make_tensor_value_info(problem, TensorProto.INT64, ["B", len(op.problem_names)])]
    for part in (static, per_problem, per_pair):
        order.extend(p for p, _ in part)
    for start, part in ((len(static), per_problem), (len(static) + len(per_problem), per_pair)):
        if not part:
            continue
        names = [n for _, n in part]
        lanes = list(range(len(names)))
        if pack:  # a few wide ops, lanes in the order they come (ckpred.export.pack)
            block, lanes = pack_columns(g, names, inputs)
        else:
            block = names[0] if len(names) == 1 else g.op("Concat", *names, axis=2)
        order[start:start + len(names)] = [order[start + i] for i in lanes]
        blocks.append(g.op("Expand", block, target) if part is per_problem else block)
    x3 = blocks[0] if len(blocks) == 1 else g.op("Concat", *blocks, axis=2)
    return g.op("Reshape", x3, g.const([-1, position], dtype=np.int64)), order


def selector_features(g: GraphBuilder, pipeline: Pipeline, op: OpDefinition, kernels: np.ndarray, problem: str,
                      used: Sequence[int] | None = None, pack: bool = True) -> str:
    """Emit the feature matrix of every (problem, candidate) pair; returns its name.

    :func:`selector_feature_columns` with its columns put in order by a ``Gather`` (when they
    are not already); the parameters are its.

    Returns
    -------
    str
        Name of a double ``[B*K, F]`` tensor, row ``b*K + j`` = problem ``b`` with candidate
        ``j``, columns in the pipeline's feature order (or in ``used`` order, F = ``len(used)``).
    """
    x, order = selector_feature_columns(g, pipeline, op, kernels, problem, used, pack)
    if order != sorted(order):
        x = g.op("Gather", x, g.const(np.argsort(order), "feature_order", dtype=np.int64), axis=1)
    return x
