"""skl2onnx shape calculators and converters of every ckpred feature transformer.

Registration
------------
:func:`register_converters` (idempotent; called when this module is imported and by
:func:`ckpred.export.lightgbm.register` before every conversion) registers each
:class:`~ckpred.features.base.FeatureGroup` subclass defined at that moment — the built-in
groups, :class:`~ckpred.features.expression.ExpressionFeatures` and any op's own group loaded
by ``module:Class`` — with :func:`skl2onnx.update_registered_converter`, under the alias
``Ckpred<ClassName>`` (e.g. ``CkpredExpressionFeatures``). The shared pair below serves every
group, because the formulas live in the transformer; a class needing its own graph sets the
class attributes ``onnx_shape_calculator`` and ``onnx_converter`` (skl2onnx's signatures) and
they are registered instead. Nothing depends on import order: a group imported late is
registered by the next conversion. A ``FeatureUnion`` of them needs nothing more: skl2onnx
converts each part and concatenates the double outputs. Convert a Pipeline with::

    from ckpred.export.converters import register_converters
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import Int64TensorType
    register_converters()
    onx = to_onnx(pipeline, initial_types=[("X", Int64TensorType([None, len(op.input_names)]))],
                  target_opset={"": 21, "ai.onnx.ml": 5})  # ckpred.export.onnx.OPSET; 17/3 works too

Graph contract
--------------
The input is the raw int64 matrix ``[N, len(op.input_names)]`` (column order = ``op.input_names``
= the DataFrame's columns at fit). Each converter gathers its columns by the positions learned
at fit (``input_indices_``), casts them to DOUBLE and evaluates the transformer's own
``_compute`` with :class:`OnnxOps`, a namespace that emits ONNX nodes instead of numpy calls —
the formulas exist once, in :mod:`ckpred.features`. Output: DOUBLE ``[N, n_features_out_]``.
Float32 would be wrong: integer sizes above 2^24 are not representable and products like
M*N*K lose digits.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
from numpy.typing import ArrayLike
from onnx import TensorProto
from skl2onnx import update_registered_converter
from skl2onnx._supported_operators import sklearn_operator_name_map
from skl2onnx.common.data_types import DoubleTensorType
from skl2onnx.common._container import ModelComponentContainer
from skl2onnx.common._topology import Operator, Scope
from skl2onnx.common.utils import check_input_and_output_numbers

from ckpred.features.base import FeatureGroup, NumpyOps
from ckpred.features.registry import EXPRESSION_CLASS, FEATURE_GROUPS, _import, group_class

__all__ = ["ALIAS_PREFIX", "OnnxOps", "alias", "calculate_feature_group_shape",
           "convert_feature_group", "register_converters", "registered_aliases"]

#: Every ckpred operator alias is this prefix plus the class name.
ALIAS_PREFIX = "Ckpred"


class Sym:
    """A double ONNX tensor of shape [N, 1] inside a converter; supports + - * / and unary -."""

    # numpy must not broadcast a Sym as an object array: ``array + sym`` calls ``sym.__radd__``.
    __array_ufunc__ = None

    def __init__(self, ops: "OnnxOps", name: str) -> None:
        self.ops, self.name = ops, name

    def __add__(self, other: Value) -> "Sym":
        return self.ops.binary("Add", self, other)

    def __radd__(self, other: Value) -> "Sym":
        return self.ops.binary("Add", other, self)

    def __sub__(self, other: Value) -> "Sym":
        return self.ops.binary("Sub", self, other)

    def __rsub__(self, other: Value) -> "Sym":
        return self.ops.binary("Sub", other, self)

    def __mul__(self, other: Value) -> "Sym":
        return self.ops.binary("Mul", self, other)

    def __rmul__(self, other: Value) -> "Sym":
        return self.ops.binary("Mul", other, self)

    def __truediv__(self, other: Value) -> "Sym":
        return self.ops.binary("Div", self, other)

    def __rtruediv__(self, other: Value) -> "Sym":
        return self.ops.binary("Div", other, self)

    def __neg__(self) -> "Sym":
        return self.ops.unary("Neg", self)


#: A value in the xp namespace's formulas: a symbolic tensor, a Python number or (in the selector,
#: :class:`ckpred.export.factorise.HybridOps`) a static numpy array.
Value: TypeAlias = "Sym | np.ndarray | float"


class OnnxOps:
    """ONNX twin of :class:`ckpred.features.base.NumpyOps`: each call adds nodes to the graph.

    Parameters
    ----------
    scope, container : skl2onnx Scope and ModelComponentContainer of the conversion.
    x_name : str
        Name of the raw input tensor (used for the row count of constant columns).
    """

    LN2 = NumpyOps.LN2

    def __init__(self, scope: Scope, container: ModelComponentContainer, x_name: str) -> None:
        self.scope, self.container, self.x_name = scope, container, x_name
        self._consts: dict[tuple[int, str], str] = {}
        self._zeros: Sym | None = None

    # -- plumbing ----------------------------------------------------------------------------
    def _name(self, hint: str) -> str:
        return self.scope.get_unique_variable_name(hint)

    def node(self, op_type: str, inputs: list[str], hint: str | None = None, **attrs: Any) -> str:
        out = self._name(hint or op_type.lower())
        self.container.add_node(op_type, inputs, [out], name=self.scope.get_unique_operator_name(op_type),
                                **attrs)
        return out

    def const(self, value: float, dtype: int = TensorProto.DOUBLE) -> str:
        """Name of a [1]-shaped constant initializer (deduplicated per value)."""
        key = (dtype, repr(float(value)))  # repr keeps -0.0 apart from 0.0 (1 / -0.0 = -inf)
        if key not in self._consts:
            name = self._name("cst")
            self.container.add_initializer(name, dtype, [1], [int(value) if dtype == TensorProto.INT64
                                                              else float(value)])
            self._consts[key] = name
        return self._consts[key]

    def _arg(self, x: Value) -> str:
        if isinstance(x, Sym):
            return x.name
        if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
            return self.const(float(x))
        raise TypeError(f"feature formulas may combine columns with Python numbers only, got {type(x)!r}")

    def binary(self, op_type: str, a: Value, b: Value) -> Sym:
        return Sym(self, self.node(op_type, [self._arg(a), self._arg(b)]))

    def unary(self, op_type: str, a: Value) -> Sym:
        return Sym(self, self.node(op_type, [self._arg(a)]))

    def column(self, index: int) -> Sym:
        """Column ``index`` of the raw input as DOUBLE [N, 1] (Gather + Cast)."""
        idx = self._name("col_index")
        self.container.add_initializer(idx, TensorProto.INT64, [1], [int(index)])
        gathered = self.node("Gather", [self.x_name, idx], hint="col", axis=1)
        return Sym(self, self.node("Cast", [gathered], hint="col_double", to=TensorProto.DOUBLE))

    def zeros(self) -> Sym:
        """A DOUBLE [N, 1] column of zeros (Shape -> Gather rows -> Concat [N, 1] -> Expand)."""
        if self._zeros is None:
            shape = self.node("Shape", [self.x_name])
            rows_idx = self._name("rows_index")
            self.container.add_initializer(rows_idx, TensorProto.INT64, [1], [0])
            rows = self.node("Gather", [shape, rows_idx], axis=0)
            one = self.const(1, TensorProto.INT64)
            target = self.node("Concat", [rows, one], axis=0)
            zero = self._name("zero_11")
            self.container.add_initializer(zero, TensorProto.DOUBLE, [1, 1], [0.0])
            self._zeros = Sym(self, self.node("Expand", [zero, target]))
        return self._zeros

    # -- the xp namespace (same names and meaning as NumpyOps) --------------------------------
    def full(self, value: float) -> Sym:
        return self.zeros() + float(value)

    def log2(self, x: Sym) -> Sym:
        # Rounded through float32 exactly as NumpyOps.log2 (see there for why).
        exact = self.unary("Log", x) / self.LN2
        single = self.node("Cast", [exact.name], hint="log2_f32", to=TensorProto.FLOAT)
        return Sym(self, self.node("Cast", [single], hint="log2_f64", to=TensorProto.DOUBLE))

    def ceil(self, x: Sym) -> Sym:
        return self.unary("Ceil", x)

    def floor(self, x: Sym) -> Sym:
        return self.unary("Floor", x)

    def fmod(self, a: Value, b: Value) -> Sym:
        return Sym(self, self.node("Mod", [self._arg(a), self._arg(b)], fmod=1))

    def minimum(self, a: Value, b: Value) -> Sym:
        return self.binary("Min", a, b)

    def maximum(self, a: Value, b: Value) -> Sym:
        return self.binary("Max", a, b)

    def where(self, cond: Sym, a: Value, b: Value) -> Sym:
        # Where broadcasts; a constant branch is a [1] tensor, the result is [N, 1].
        return Sym(self, self.node("Where", [cond.name, self._arg(a), self._arg(b)]))

    def equal(self, a: Value, b: Value) -> Sym:
        return self.binary("Equal", a, b)

    def less(self, a: Value, b: Value) -> Sym:
        return self.binary("Less", a, b)

    def indicator(self, cond: Sym) -> Sym:
        return Sym(self, self.node("Cast", [cond.name], hint="indicator", to=TensorProto.DOUBLE))

    def greater(self, a: Value, b: Value) -> Sym:
        return self.binary("Greater", a, b)

    def less_equal(self, a: Value, b: Value) -> Sym:
        return self.binary("LessOrEqual", a, b)

    def greater_equal(self, a: Value, b: Value) -> Sym:
        return self.binary("GreaterOrEqual", a, b)

    def logical_and(self, a: Sym, b: Sym) -> Sym:
        return self.binary("And", a, b)

    def logical_or(self, a: Sym, b: Sym) -> Sym:
        return self.binary("Or", a, b)

    def logical_not(self, a: Sym) -> Sym:
        return self.unary("Not", a)

    def power(self, a: Value, b: Value) -> Sym:
        return self.binary("Pow", a, b)

    def sqrt(self, x: Value) -> Sym:
        return self.unary("Sqrt", x)

    def abs(self, x: Value) -> Sym:
        return self.unary("Abs", x)

    def as_column(self, x: Sym) -> Sym:
        return x  # columns are [N, 1] already

    def row(self, values: ArrayLike) -> Sym:
        array = np.asarray(values, dtype=np.float64)
        name = self._name("row")
        self.container.add_initializer(name, TensorProto.DOUBLE, [1, len(array)], array.tolist())
        return Sym(self, name)

    def min_across(self, x: Sym) -> Sym:
        # ReduceMin takes its axes as an input from opset 18 on, as an attribute before.
        if self.container.target_opset >= 18:
            axes = self._name("axes")
            self.container.add_initializer(axes, TensorProto.INT64, [1], [1])
            return Sym(self, self.node("ReduceMin", [x.name, axes], keepdims=1))
        return Sym(self, self.node("ReduceMin", [x.name], axes=[1], keepdims=1))


# -- shape calculator and converter (shared by every FeatureGroup subclass) ----------------------
def calculate_feature_group_shape(operator: Operator) -> None:
    """Output of a ckpred feature transformer: DOUBLE [N, n_features_out_]."""
    check_input_and_output_numbers(operator, input_count_range=1, output_count_range=1)
    model: FeatureGroup = operator.raw_operator
    n_rows = operator.inputs[0].get_first_dimension()
    operator.outputs[0].type = DoubleTensorType([n_rows, int(model.n_features_out_)])


def convert_feature_group(scope: Scope, operator: Operator, container: ModelComponentContainer) -> None:
    """Emit the transformer's features: gather its columns, cast to double, run ``_compute``."""
    model: FeatureGroup = operator.raw_operator
    x = operator.inputs[0]
    n_cols = x.type.shape[1] if x.type.shape and len(x.type.shape) == 2 else None
    if n_cols is not None and n_cols != model.n_features_in_:
        raise RuntimeError(f"{type(model).__name__} was fitted on {model.n_features_in_} input columns "
                           f"but the ONNX input {x.onnx_name!r} has {n_cols}")
    ops = OnnxOps(scope, container, x.full_name)
    cols = {name: ops.column(j) for name, j in zip(model.input_columns, model.input_indices_)}
    outputs = model._compute(cols, ops)
    if len(outputs) != model.n_features_out_:
        raise RuntimeError(f"{type(model).__name__}: {len(outputs)} ONNX columns for "
                           f"{model.n_features_out_} features")
    container.add_node("Concat", [o.name for o in outputs], [operator.outputs[0].full_name],
                       name=scope.get_unique_operator_name("CkpredConcat"), axis=1)


def alias(cls: type) -> str:
    """The skl2onnx operator alias of a ckpred transformer class."""
    return f"{ALIAS_PREFIX}{cls.__name__}"


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    subs: list[type] = cls.__subclasses__()
    for sub in subs:
        out.append(sub)
        out.extend(_subclasses(sub))
    return out


def register_converters() -> dict[type, str]:
    """Register every feature transformer class with skl2onnx (idempotent).

    Imports the built-in Python groups, then registers every loaded concrete
    :class:`~ckpred.features.base.FeatureGroup` subclass: its own ``onnx_shape_calculator`` /
    ``onnx_converter`` when it sets them, else the shared pair.

    Returns
    -------
    dict
        Class -> alias that was registered.
    """
    for kind in FEATURE_GROUPS:
        group_class(kind)
    _import(EXPRESSION_CLASS, "features")
    done = {}
    for cls in _subclasses(FeatureGroup):
        if cls.__name__.startswith("_"):  # private bases (shared constructors)
            continue
        shape_calc = getattr(cls, "onnx_shape_calculator", None) or calculate_feature_group_shape
        converter = getattr(cls, "onnx_converter", None) or convert_feature_group
        update_registered_converter(cls, alias(cls), shape_calc, converter, overwrite=True)
        done[cls] = alias(cls)
    return done


def registered_aliases() -> dict[type, str]:
    """Class -> alias of every class skl2onnx currently knows whose alias is a ckpred one."""
    return {cls: name for cls, name in sklearn_operator_name_map.items()
            if isinstance(name, str) and name.startswith(ALIAS_PREFIX)}


register_converters()
