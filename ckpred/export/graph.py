"""The small graph builder every selector part writes its ONNX nodes into (:class:`GraphBuilder`).

A module of its own below :mod:`ckpred.export.onnx` so that the parts the selector is made of
(:mod:`ckpred.export.factorise`, :mod:`ckpred.export.pack`, :mod:`ckpred.export.blend`) name its
type without importing the module that assembles them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike
import onnx
from onnx import helper, numpy_helper

__all__ = ["GraphBuilder"]


@dataclass
class GraphBuilder:
    """Collects nodes and constants of one graph with unique names (small on purpose)."""

    prefix: str = ""
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    _count: int = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}{hint}_{self._count}"

    def const(self, value: ArrayLike, hint: str = "const", dtype: DTypeLike | None = None) -> str:
        array = np.asarray(value, dtype=dtype)
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, *inputs: str, outputs: int = 1, out: str | list[str] | None = None,
           domain: str = "", **attrs: Any) -> Any:
        """Add a node; returns its output name (or names when ``outputs > 1``)."""
        if out is None:
            names = [self.name(op_type.lower()) for _ in range(outputs)]
        else:
            names = [out] if isinstance(out, str) else list(out)
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self.name(op_type),
                                           domain=domain, **attrs))
        return names[0] if len(names) == 1 else names

    def prune(self, outputs: list[str]) -> None:
        """Drop the nodes and initializers no graph output depends on (dead code).

        Feature builders emit every feature of a group; the selector keeps only the columns its
        trees split on, and this removes the rest (each node costs time on every call).
        """
        needed = set(outputs)
        kept: list[onnx.NodeProto] = []
        for node in reversed(self.nodes):  # nodes are in topological order
            if any(o in needed for o in node.output):
                kept.append(node)
                needed.update(i for i in node.input if i)
        self.nodes = kept[::-1]
        self.initializers = [t for t in self.initializers if t.name in needed]

    def column(self, matrix: str, index: int, hint: str = "col") -> str:
        """Column ``index`` of a 2-D tensor as ``[rows, 1]``."""
        return self.op("Slice", matrix, self.const([index], dtype=np.int64),
                       self.const([index + 1], dtype=np.int64), self.const([1], dtype=np.int64))
