"""The transfer recipe inside the selector graph: the static order, the rank-percentile blend and
the learner's expected throughput under an applicability mask (:func:`expected`).

A :class:`ckpred.transfer.TransferModel` exported for an arch scores a problem's candidates as
(1 - w) * p(learner) + w * p(static): ``p`` is the within-problem rank percentile over the
valid candidates (:func:`ckpred.transfer.rank_percentile`), the learner's scores are the trees'
(``[B, K]``, -inf for an invalid kernel) and the static order is a constant ``[S, K]`` matrix,
one row per stratum of ``best_static_by`` (the product of its categorical fields' values; one
row without it), gathered by the problem's stratum. The percentile is computed by sorting:

1. invalid candidates are set to -inf (the learner's and the static order's values of valid
   candidates are finite: a kernel the static order never saw holds ``UNSEEN``);
2. ``TopK`` sorts each row ascending (all K; ties keep the lower index first);
3. runs of equal values get a group id (``CumSum`` of "differs from the previous one"), their
   sizes come from a ``ScatterElements`` add and their first positions from an exclusive ``CumSum``;
4. rank = first + (size + 1) / 2 - number invalid (the invalid ones form the lowest run), divided
   by the number of valid candidates, then scattered back to the kernels' positions.

Every value is an integer or a half until the one division, so the graph's doubles are the
numpy reference's exactly.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np
import pandas as pd
from onnx import TensorProto

from ckpred.errors import ConfigValueError
from ckpred.export.graph import GraphBuilder
from ckpred.kernels.base import OpDefinition
from ckpred.models import FLOOR
from ckpred.transfer import UNSEEN, TransferModel


def static_matrix(model: TransferModel, op: OpDefinition, kernels: pd.DataFrame) -> tuple[np.ndarray, list[str], list[int]]:
    """The static order as ``[S, K]`` doubles (``UNSEEN`` for a kernel never seen in a stratum),
    the ``best_static_by`` fields and their number of values (the strata's mixed radix).

    Raises
    ------
    ckpred.errors.ConfigValueError
        When a ``best_static_by`` field is not a categorical problem field (the selector gathers
        a stratum by its fields' codes).
    """
    by = list(model.static_by)
    sizes = []
    values = []
    for name in by:
        field = op.field(name)
        cats = [str(v) for v in (getattr(field, "categories", None) or getattr(field, "values", None) or ())]
        if getattr(field, "kind", None) not in ("category", "categorical") or not cats:
            raise ConfigValueError("baselines.best_static_by", name,
                                   "categorical problem fields only in an exported transfer recipe (the selector "
                                   "looks the static order up by the field's code)")
        sizes.append(len(cats))
        values.append(cats)
    names = kernels["kernel_name"].astype(str).to_numpy(dtype=object)
    rows = []
    for combo in itertools.product(*values) if by else [()]:
        keys = names if not by else names + "@" + "|".join(combo)
        rows.append(pd.Series(keys).map(model.static).fillna(UNSEEN).to_numpy(dtype=np.float64))
    return np.vstack(rows), by, sizes


def static_scores(g: GraphBuilder, problem: str, matrix: np.ndarray, by: Sequence[str], sizes: Sequence[int],
                  op: OpDefinition) -> str:
    """``[B, K]`` static scores of each problem's stratum (a ``Gather`` of the matrix's rows)."""
    table = g.const(matrix, "static_order", dtype=np.float64)
    if not by:
        index = g.op("Mul", g.op("ReduceSum", problem, g.const([1], dtype=np.int64), keepdims=0),
                     g.const(0, dtype=np.int64))  # [B] zeros
    else:
        index = None
        stride = int(np.prod(sizes))
        for name, size in zip(by, sizes):
            stride //= size
            col = g.op("Reshape", g.column(problem, list(op.problem_names).index(name)),
                       g.const([-1], dtype=np.int64))
            term = g.op("Mul", col, g.const(stride, dtype=np.int64))
            index = term if index is None else g.op("Add", index, term)
    return g.op("Gather", table, index, axis=0)


def rank_percentile(g: GraphBuilder, values: str, mask: str, K: int) -> str:
    """``[B, K]`` rank percentiles of ``values`` among the ``mask``-ed entries of each row
    (garbage where the mask is off: the caller masks the result)."""
    ninf = g.const(-np.inf, dtype=np.float64)
    v = g.op("Where", mask, values, ninf)
    k = g.const([K], dtype=np.int64)
    sorted_v, index = g.op("TopK", v, k, axis=1, largest=0, sorted=1, outputs=2)
    if K > 1:
        head = g.op("Slice", sorted_v, g.const([1], dtype=np.int64), g.const([K], dtype=np.int64),
                    g.const([1], dtype=np.int64))
        tail = g.op("Slice", sorted_v, g.const([0], dtype=np.int64), g.const([K - 1], dtype=np.int64),
                    g.const([1], dtype=np.int64))
        differs = g.op("Not", g.op("Equal", head, tail))
        first = g.op("Expand", g.const([[True]], dtype=bool), g.op("Shape", g.column(sorted_v, 0)))
        new = g.op("Concat", first, differs, axis=1)
    else:
        new = g.op("Expand", g.const([[True]], dtype=bool), g.op("Shape", sorted_v))
    one = g.op("Cast", new, to=TensorProto.INT64)
    group = g.op("Sub", g.op("CumSum", one, g.const(1, dtype=np.int64)), g.const(1, dtype=np.int64))
    zeros = g.op("Mul", one, g.const(0, dtype=np.int64))
    ones = g.op("Add", zeros, g.const(1, dtype=np.int64))
    size = g.op("ScatterElements", zeros, group, ones, axis=1, reduction="add")
    start = g.op("CumSum", size, g.const(1, dtype=np.int64), exclusive=1)
    as_double = TensorProto.DOUBLE
    first_pos = g.op("Cast", g.op("GatherElements", start, group, axis=1), to=as_double)
    run = g.op("Cast", g.op("GatherElements", size, group, axis=1), to=as_double)
    n_valid = g.op("ReduceSum", g.op("Cast", mask, to=as_double), g.const([1], dtype=np.int64), keepdims=1)
    n_invalid = g.op("Sub", g.const(float(K), dtype=np.float64), n_valid)
    half = g.op("Div", g.op("Add", run, g.const(1.0, dtype=np.float64)), g.const(2.0, dtype=np.float64))
    rank = g.op("Sub", g.op("Add", first_pos, half), n_invalid)
    pct_sorted = g.op("Div", rank, n_valid)
    base = g.op("Mul", g.op("Cast", zeros, to=as_double), g.const(0.0, dtype=np.float64))
    return g.op("ScatterElements", base, index, pct_sorted, axis=1)


def blended(g: GraphBuilder, learner: str, static: str, mask: str, K: int, weight: float) -> str:
    """``[B, K]`` scores of the recipe: the learner's (w = 0), the static order's (w = 1) or
    (1 - w) * p(learner) + w * p(static); -inf where ``mask`` is off."""
    ninf = g.const(-np.inf, dtype=np.float64)
    if weight == 0.0:
        return learner
    if weight == 1.0:
        return g.op("Where", mask, static, ninf)
    a = g.op("Mul", rank_percentile(g, learner, mask, K), g.const(1.0 - weight, dtype=np.float64))
    b = g.op("Mul", rank_percentile(g, static, mask, K), g.const(weight, dtype=np.float64))
    return g.op("Where", mask, g.op("Add", a, b), ninf)


def expected(g: GraphBuilder, learner: str, absent: str, mask: str) -> str:
    """``[B, K]`` expected throughput of the learner's picks, ``max(score, FLOOR) * clip(1 - absent,
    FLOOR, 1)`` (:func:`ckpred.models.expected_throughput`), ``absent`` being the applicability
    mask's ``[B, K]`` estimates; -inf where ``mask`` is off."""
    floor = g.const(FLOOR, dtype=np.float64)
    applies = g.op("Clip", g.op("Sub", g.const(1.0, dtype=np.float64), absent), floor,
                   g.const(1.0, dtype=np.float64))
    value = g.op("Mul", g.op("Max", learner, floor), applies)
    return g.op("Where", mask, value, g.const(-np.inf, dtype=np.float64))
