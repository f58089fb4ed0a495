"""Pack many one-column feature computations into a few wide ONNX ops.

The selector's feature graph (:mod:`ckpred.export.factorise`) computes every feature column as
its own chain of small elementwise nodes on ``[B, 1, 1]`` (per problem) or ``[B, K, 1]`` (per
candidate) tensors, and concatenates the columns at the end. onnxruntime spends about the same
fixed time on a node whatever its size, so the cost of that graph is mostly its node count, not
its arithmetic. Many columns are computed by the same chain of operations on different values —
``ceil(m / tile_m)``, ``ceil(n / tile_n)``, ``ceil(k / tile_k)``, or ``log2`` followed by the
float32 round trip for a dozen different quantities — so the chains can run side by side: one
``Div`` over a ``[B, K, 3]`` tensor instead of three over ``[B, K, 1]``.

:func:`pack_columns` does this (it is what compilers call superword-level parallelism): the
columns to concatenate form a *pack*; a pack whose members are all produced by the same
elementwise operation (type, attributes, operand types) becomes one node whose operands are the
packs of the members' operands, recursively; a pack whose members come from different operations
is split into groups of alike members (same operations down to a few levels), each group packed
and the groups concatenated; a member with too few alike partners keeps its own nodes. A pack of
one repeated value is that value (it broadcasts); a pack of constants is one constant; a pack of
``Gather`` s of single columns of one tensor is one ``Gather``. Lanes come in the order packing
makes them: a node takes its operands' lanes in its leading operand's order, a ``Gather``
reorders another operand only where the orders differ, and the final order is returned to the
caller (the selector's trees read the columns in it). Where members share sub-expressions with
other columns, packing can cost more nodes than it saves, so :func:`pack_columns` tries a few
grouping thresholds and keeps the cheapest graph, the plain ``Concat`` included.

Each lane applies its original node's operation to the same double values: IEEE-exact
operations (arithmetic, ``Ceil``, ``Mod``, comparisons, casts) give the same bits.
onnxruntime's ``Log`` is not correctly rounded and its vectorised code may differ in the last
bit from its scalar code, so a ``log`` may change by one ulp with the width of its tensor (as it
already did between one problem and a batch); the features round ``log2`` to float32
(:meth:`ckpred.features.base.NumpyOps.log2`), which absorbs it. The original nodes are left in
place for :meth:`ckpred.export.graph.GraphBuilder.prune` to remove.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ckpred.export.graph import GraphBuilder
from ckpred.export.opset import IR_VERSION, OPSET

__all__ = ["pack_columns"]

#: Elementwise operators (with numpy broadcasting) whose lanes are independent.
ELEMENTWISE = frozenset({
    "Abs", "Add", "And", "Cast", "Ceil", "Div", "Equal", "Exp", "Floor", "Greater", "GreaterOrEqual",
    "IsInf", "IsNaN", "Less", "LessOrEqual", "Log", "Max", "Min", "Mod", "Mul", "Neg", "Not", "Or", "Pow",
    "Reciprocal", "Round", "Sign", "Sqrt", "Sub", "Where", "Xor",
})
#: Elementwise operators whose operands may be swapped (canonical order: symbolic first).
COMMUTATIVE = frozenset({"Add", "And", "Equal", "Mul", "Or", "Xor"})  # not Max/Min: NaN order

Shape = tuple[Any, Any, Any]  # (batch: "B" or 1, candidates: int or 1, width: int)
_Pack = tuple[str, Shape, "tuple[int, ...] | None"]  # (tensor, shape, lane i = names[perm[i]])


def _attrs(node: onnx.NodeProto) -> tuple[Any, ...]:
    return tuple(sorted((a.name, helper.get_attribute_value(a)) for a in node.attribute))


class _Packer:
    """One packing session over a :class:`~ckpred.export.graph.GraphBuilder`'s current nodes."""

    def __init__(self, g: GraphBuilder, shapes: dict[str, Shape], types: dict[str, int], source: str,
                 min_group: int, depth: int) -> None:
        self.g = g
        self.min_group = min_group
        self.depth = depth
        self._keys: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.source = source
        self.shapes = shapes
        self.types = types
        self.producer = {o: n for n in g.nodes for o in n.output}
        self.consts = {t.name: numpy_helper.to_array(t) for t in g.initializers}
        self.types.update({t.name: t.data_type for t in g.initializers})
        self.memo: dict[Any, _Pack] = {}
        self.lane_gathers: set[str] = set()
        self._batch: str | None = None

    # -- helpers ---------------------------------------------------------------------------------
    def _shape(self, name: str) -> Shape | None:
        if name in self.consts:
            arr = self.consts[name]
            if arr.ndim > 3:
                return None
            full = (1,) * (3 - arr.ndim) + tuple(arr.shape)
            return full[0], full[1], full[2]
        return self.shapes.get(name)

    def _lane(self, name: str) -> bool:
        """Whether ``name`` is one column (width 1, rank 3 or a broadcastable constant)."""
        shape = self._shape(name)
        return shape is not None and shape[2] == 1

    def _signature(self, name: str) -> tuple[Any, ...] | None:
        """What produces ``name`` when it can be packed with others of the same signature."""
        node = self.producer.get(name)
        if node is None or node.domain or len(node.output) != 1:
            return None
        if node.op_type in ELEMENTWISE and all(self._lane(i) for i in node.input):
            # operand types too: Cast(to=double) of a bool and of a float are different operations
            return ("elementwise", node.op_type, tuple(self.types.get(i) for i in node.input), _attrs(node))
        if (node.op_type == "Gather" and node.input[1] in self.consts and self.consts[node.input[1]].shape == (1,)
                and self._shape(node.input[0]) is not None):
            axis = _attrs(node)
            if dict(axis).get("axis", 0) in (2, -1):
                return ("gather", node.input[0], axis)
        return None

    def _key(self, name: str, depth: int) -> tuple[Any, ...]:
        """What ``name`` is grouped by when a pack is split: its signature and those of its
        operands down to ``depth`` levels (the deeper, the longer a group's chains stay alike)."""
        memo = (name, depth)
        if memo not in self._keys:
            sig = self._signature(name)
            if sig is None:
                key: tuple[Any, ...] = ("const", self.types.get(name)) if name in self.consts else ("leaf", name)
            elif depth == 0 or sig[0] == "gather":
                key = sig
            else:
                key = sig + tuple(self._key(i, depth - 1) for i in self._operands(self.producer[name]))
            self._keys[memo] = key
        return self._keys[memo]

    def _operands(self, node: onnx.NodeProto) -> list[str]:
        ins = list(node.input)
        if node.op_type in COMMUTATIVE and len(ins) == 2 and ins[0] in self.consts and ins[1] not in self.consts:
            ins.reverse()
        return ins

    def _batch_shape(self, k: int, width: int) -> str:
        """An int64 shape ``[B, k, width]`` tensor (B from the problem input)."""
        if self._batch is None:
            self._batch = self.g.op("Slice", self.g.op("Shape", self.source), self.g.const([0], dtype=np.int64),
                                    self.g.const([1], dtype=np.int64))
        return self.g.op("Concat", self._batch, self.g.const([k, width], dtype=np.int64), axis=0)

    def _concat(self, parts: list[tuple[str, Shape]]) -> tuple[str, Shape]:
        """Concatenate packed parts along the last axis, broadcasting them to a common batch and
        candidate extent first."""
        batch = "B" if any(s[0] == "B" for _, s in parts) else 1
        k = max(int(s[1]) for _, s in parts)
        width = sum(int(s[2]) for _, s in parts)
        names = []
        for name, (b, pk, w) in parts:
            if name in self.consts and self.consts[name].ndim != 3:  # a scalar constant as [1, 1, 1]
                value = self.consts[name].reshape(1, 1, 1)
                name = self.g.const(value, "lane", dtype=value.dtype)
                self.consts[name] = value
            if (b, pk) == (batch, k):
                names.append(name)
            elif b == batch:  # the candidate axis is missing: a constant shape will do
                names.append(self.g.op("Expand", name, self.g.const([1, k, 1], dtype=np.int64)))
            else:
                names.append(self.g.op("Expand", name, self._batch_shape(k, int(w))))
        out = names[0] if len(names) == 1 else self.g.op("Concat", *names, axis=2)
        return out, (batch, k, width)

    # -- packing ---------------------------------------------------------------------------------
    # A pack is returned as (tensor, shape, perm): lane i of the tensor holds names[perm[i]]
    # (a pack of one repeated value is that value, width 1, perm None: it broadcasts). Callers
    # that can use the lanes in any order take them as they come (no Gather to reorder).
    def pack(self, names: tuple[str, ...], exact: bool = False) -> _Pack:
        """The pack of ``names``, lanes in ``names`` order when ``exact``."""
        if names not in self.memo:
            self.memo[names] = self._pack(names)
        out, shape, perm = self.memo[names]
        if exact and perm is not None and list(perm) != sorted(perm):
            key = (names, "exact")
            if key not in self.memo:
                gathered = self.g.op("Gather", out, self.g.const(np.argsort(perm), "lanes", dtype=np.int64), axis=2)
                self.lane_gathers.add(gathered)
                self.memo[key] = (gathered, shape, tuple(range(len(names))))
            return self.memo[key]
        return out, shape, perm

    def _pack(self, names: tuple[str, ...]) -> _Pack:
        identity = tuple(range(len(names)))
        if len(set(names)) == 1:
            return names[0], self._shape(names[0]), None  # type: ignore[return-value]
        if all(n in self.consts for n in names):
            arrays = [self.consts[n].reshape((1,) * (3 - self.consts[n].ndim) + self.consts[n].shape) for n in names]
            dtype = np.result_type(*arrays)
            if all(a.dtype == dtype for a in arrays):
                k = max(a.shape[1] for a in arrays)
                value = np.concatenate([np.broadcast_to(a, (1, k, 1)) for a in arrays], axis=2)
                name = self.g.const(value, "packed", dtype=dtype)
                self.consts[name] = value
                return name, (1, k, len(names)), identity
        signatures = [self._signature(n) for n in names]
        if signatures[0] is not None and all(s == signatures[0] for s in signatures):
            return self._pack_same(names, signatures[0])
        # split by key; a value that cannot be packed further, or has too few partners to be worth
        # a wide op, is a part of its own (computed by its own nodes); parts are concatenated
        groups: dict[Any, list[int]] = {}
        for i, name in enumerate(names):
            groups.setdefault(self._key(name, self.depth), []).append(i)
        for key in list(groups):
            if len({names[i] for i in groups[key]}) < self.min_group:
                for i in groups.pop(key):
                    groups.setdefault(("leaf", names[i]), []).append(i)
        parts: list[tuple[str, Shape]] = []
        order: list[int] = []
        for positions in groups.values():
            name, shape, perm = self.pack(tuple(names[i] for i in positions))
            if perm is None:  # one repeated value: as many lanes as positions
                if len(positions) > 1:
                    name, shape = self._concat([(name, shape)] * len(positions))
                perm = tuple(range(len(positions)))
            parts.append((name, shape))
            order.extend(positions[i] for i in perm)
        out, shape = self._concat(parts)
        return out, shape, tuple(order)

    def _pack_same(self, names: tuple[str, ...], signature: tuple[Any, ...]) -> _Pack:
        nodes = [self.producer[n] for n in names]
        first = nodes[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in first.attribute}
        if signature[0] == "gather":
            data = first.input[0]
            index = np.concatenate([self.consts[n.input[1]] for n in nodes]).astype(np.int64)
            b, k, _ = self._shape(data)  # type: ignore[misc]
            out = self.g.op("Gather", data, self.g.const(index, "columns", dtype=np.int64), **attrs)
            return out, (b, k, len(names)), tuple(range(len(names)))
        operands = [self._operands(n) for n in nodes]
        columns = [tuple(ops[j] for ops in operands) for j in range(len(first.input))]
        # the operand with the most kinds of producers leads: its lanes come in whatever order its
        # pack has, the others are packed in that order
        lead = max(range(len(columns)), key=lambda j: (len({self._key(n, 0) for n in columns[j]}), -j))
        _, _, perm = self.pack(columns[lead])
        if perm is None:
            perm = tuple(range(len(names)))
        packed = []
        for j, column in enumerate(columns):
            name, shape, _ = self.pack(tuple(column[i] for i in perm), exact=True)
            packed.append((name, shape))
        batch = "B" if any(s[0] == "B" for _, s in packed) else 1
        k = max(int(s[1]) for _, s in packed)
        width = max(int(s[2]) for _, s in packed)
        out = self.g.op(first.op_type, *(p for p, _ in packed), **attrs)
        return out, (batch, k, width), (perm if width > 1 else None)


def _inferred_shapes(g: GraphBuilder, inputs: list[onnx.ValueInfoProto]) -> tuple[dict[str, Shape], dict[str, int]]:
    """Rank-3 shapes of the graph's tensors (batch dim as "B") and the element types of all, by
    ONNX shape inference."""
    graph = helper.make_graph(g.nodes, "pack", inputs, [], initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSET.items()],
                              ir_version=IR_VERSION)
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph.value_info
    out: dict[str, Shape] = {}
    types = {i.name: i.type.tensor_type.elem_type for i in [*inputs, *inferred]}
    for info in inferred:
        dims = info.type.tensor_type.shape.dim
        if len(dims) != 3:
            continue
        values = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
        if values[0] not in (1, "B") or not all(isinstance(v, int) and v > 0 for v in values[1:]):
            continue
        out[info.name] = (values[0], values[1], values[2])
    return out, types


def pack_columns(g: GraphBuilder, columns: list[str], inputs: list[onnx.ValueInfoProto]) -> tuple[str, list[int]]:
    """Emit a tensor holding ``columns`` side by side along its last axis, with as few nodes as
    packing allows, in the order packing finds cheapest.

    Parameters
    ----------
    g : ckpred.export.graph.GraphBuilder
        The graph that computes ``columns`` (its nodes are read, new nodes appended).
    columns : list of str
        Rank-3 tensors of one column each (``[B or 1, K or 1, 1]``), all with the same batch and
        candidate extents (as ``Concat`` requires).
    inputs : list of onnx.ValueInfoProto
        The graph's inputs (for shape inference; the batch dimension named ``B``); the first one
        has the batch extent (a constant broadcast to it reads its shape).

    Returns
    -------
    name : str
        The ``[., ., len(columns)]`` tensor.
    order : list of int
        Lane ``i`` of it is ``columns[order[i]]`` (a permutation; ``Gather`` it to restore the
        order, or renumber the consumer's columns instead).
    """
    identity = list(range(len(columns)))
    if len(columns) == 1:
        return columns[0], identity
    shapes, types = _inferred_shapes(g, inputs)

    def attempt(option: tuple[int, int] | None) -> tuple[str, list[int], set[str]]:
        if option is None or not all(shapes.get(c, (0, 0, 0))[2] == 1 for c in columns):
            return g.op("Concat", *columns, axis=2), identity, set()
        packer = _Packer(g, shapes, dict(types), inputs[0].name, *option)
        name, shape, perm = packer.pack(tuple(columns))
        if perm is None or shape[2] != len(columns):
            return g.op("Concat", *columns, axis=2), identity, set()
        return name, list(perm), packer.lane_gathers

    # How far to split mixed packs is a trade (a split costs a Concat, maybe a Gather): try a few
    # thresholds and keep the cheapest graph; None (plain Concat) bounds it by the unpacked one.
    options: list[tuple[int, int] | None] = [(m, d) for d in (0, 1, 2, 3, 6, 12) for m in (2, 3, 4)]
    cost: list[tuple[int, bool, int, tuple[int, int] | None]] = []
    for option in [*options, None]:
        n_nodes, n_inits, count = len(g.nodes), len(g.initializers), g._count
        name, _, gathers = attempt(option)
        cost.append((_cost(g.nodes, name, gathers), option is None, len(cost), option))
        g.nodes, g.initializers, g._count = g.nodes[:n_nodes], g.initializers[:n_inits], count
    name, order, _ = attempt(min(cost)[-1])
    return name, order


#: Cost of a Gather reordering lanes, in nodes (it copies element by element: several times an
#: elementwise node of the same size).
LANE_GATHER_COST = 5


def _cost(nodes: list[onnx.NodeProto], out: str, lane_gathers: set[str]) -> int:
    """The nodes ``out`` depends on, a lane Gather counted :data:`LANE_GATHER_COST` times."""
    producer = {o: n for n in nodes for o in n.output}
    seen: set[str] = set()
    cost = 0
    stack = [out]
    while stack:
        name = stack.pop()
        node = producer.get(name)
        if node is not None and node.name not in seen:
            seen.add(node.name)
            cost += LANE_GATHER_COST if name in lane_gathers else 1
            stack.extend(node.input)
    return cost
