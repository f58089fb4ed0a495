"""The one expression language of ckpred: parsed with :mod:`ast`, evaluated on numpy or ONNX.

Op configs (FLOPs and bytes, validity rules, derived input columns) and feature sets
(:class:`ckpred.features.expression.ExpressionFeatures`) write formulas as Python-syntax
expressions. They are parsed with :func:`ast.parse` and walked node by node; nothing is ever
passed to ``eval`` or ``exec``, and anything outside the grammar below is refused with a
:class:`~ckpred.errors.ConfigValueError` naming the config key.

Grammar
-------
* numbers (``2``, ``1e6``), ``True``/``False`` and string literals (category values and dtype
  names only: ``dtype == 'fp16'``, ``dtype_bytes('fp8')``);
* names: fields of the op (problem, kernel or table columns);
* ``hw.<name>``: a constant of the table's own arch (and dtype) config;
* ``+ - * / // % **`` and unary ``-``/``+``; ``a // b`` is ``floor(a / b)`` and ``a % b`` is
  C ``fmod`` (the two agree with Python for the non-negative values of sizes); a literal
  integer exponent 0 to 4 is expanded into products (``x ** 2`` is ``x * x``), so both
  backends round alike;
* comparisons ``< <= > >= == !=`` (chains allowed), ``and``, ``or``, ``not`` and the
  conditional ``a if cond else b``;
* functions: ``log2, ceil, floor, min, max, ceil_div, where, abs, sqrt, dtype_bytes``
  and ``contains(field, 'text')`` (:data:`FUNCTIONS`): true where a categorical field's value
  contains the text (case-sensitive), e.g. ``contains(solver, 'Xdlops')`` -- a tag parsed from
  a kernel's name, so a kernel never seen in training gets the tags of its name.

Values
------
Arithmetic is float64. A comparison gives a boolean that counts as 1.0/0.0 in arithmetic; a
number used as a condition is true when non-zero. A categorical field holds its category code
(index in the field's values); comparing it with a string compares with that value's code, so
``pipeline == 'compv4'`` is a one-hot column. ``log2`` is rounded to float32 exactly as
:meth:`ckpred.features.base.NumpyOps.log2` (see there for why). Sub-expressions of numbers and
``hw`` constants only are folded once, in numpy float64 (the same IEEE operations).

Backends
--------
:meth:`Expression.evaluate` takes an ``xp`` namespace: :class:`ckpred.features.base.NumpyOps`
on numpy columns, :class:`ckpred.export.converters.OnnxOps` on ONNX tensors (or the
selector's :class:`ckpred.export.factorise.HybridOps`). The walk is the same for all of them,
so a formula is written once and the exported graph computes what ``transform`` computes.
"""

from __future__ import annotations

import ast
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

import numpy as np

from ckpred import vocab
from ckpred.errors import ConfigValueError

__all__ = ["FUNCTIONS", "Expression", "dtype_bytes_table", "evaluate_derived", "parse", "topological_order"]

#: Function name -> (minimum, maximum) number of arguments (None: any number >= minimum).
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "log2": (1, 1),
    "ceil": (1, 1),
    "floor": (1, 1),
    "min": (2, None),
    "max": (2, None),
    "ceil_div": (2, 2),
    "where": (3, 3),
    "abs": (1, 1),
    "sqrt": (1, 1),
    "dtype_bytes": (1, 1),
    "contains": (2, 2),
}

#: Name of the hardware-constant namespace (``hw.cus``).
HW = "hw"

#: Longest expression text accepted (the project's longest is under 200 characters): a bound
#: checked before :func:`ast.parse`, whose own recursion a long chain of operators exhausts.
MAX_CHARS = 2000
#: Deepest expression tree accepted (operators nested in operators); the checks and the
#: evaluation walk the tree recursively.
MAX_DEPTH = 100

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**"}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def dtype_bytes_table() -> dict[str, float]:
    """Bytes per element of each dtype name and alias (the dtype configs in use,
    :func:`ckpred.vocab.current`); ``dtype_bytes(x)`` in an expression looks its value up here."""
    return vocab.current().bytes_table


# -- values during evaluation ----------------------------------------------------------------------
@dataclass(frozen=True)
class _Value:
    """A value of the walk: a number, a boolean or a string, scalar (folded) or a column."""

    value: Any
    kind: str  # "num" | "bool" | "str"
    scalar: bool
    field: str | None = None  # set for a categorical field's column of codes


def _np_scalar(fn: Callable[..., Any], *args: Any) -> Any:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = fn(*args)
    if isinstance(out, (bool, np.bool_)) or (isinstance(out, np.ndarray) and out.dtype == bool):
        return bool(out)
    return float(out)


class Expression:
    """A parsed expression; parse with :meth:`parse` (or :func:`parse`).

    Attributes
    ----------
    text : str
        The source text.
    key : str
        The config key it came from (named in every error).
    names : frozenset of str
        Free field names it reads.
    hw_names : frozenset of str
        Hardware constants it reads (``hw.<name>``).
    functions : frozenset of str
        Functions it calls.
    strings : frozenset of str
        String literals it contains.
    """

    def __init__(self, text: str, key: str, tree: ast.expr) -> None:
        self.text, self.key, self._tree = text, key, tree
        names: set[str] = set()
        hw: set[str] = set()
        functions: set[str] = set()
        strings: set[str] = set()
        self._check(tree, names, hw, functions, strings)
        self.names = frozenset(names)
        self.hw_names = frozenset(hw)
        self.functions = frozenset(functions)
        self.strings = frozenset(strings)

    def __repr__(self) -> str:
        return f"Expression({self.text!r}, key={self.key!r})"

    # -- parsing -----------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: object, *, key: str) -> "Expression":
        """Parse ``text``; refuse anything outside the grammar, naming ``key``.

        Parameters
        ----------
        text : str or number
            The expression (a bare number is accepted as a constant).
        key : str
            The config key holding it, e.g. ``features.groups[3].params.features.waves``.

        Raises
        ------
        ckpred.errors.ConfigValueError
            On a syntax error or a construct the language does not have.
        """
        if isinstance(text, bool) or not isinstance(text, (str, int, float)):
            raise ConfigValueError(key, text, "an expression string (Python syntax, e.g. 'log2(m * n)')")
        source = str(text)
        if not source.strip():
            raise ConfigValueError(key, text, "a non-empty expression")
        if len(source) > MAX_CHARS:
            raise ConfigValueError(key, f"{source[:40]}... ({len(source):,} characters)",
                                   f"an expression of at most {MAX_CHARS:,} characters")
        try:
            module = ast.parse(source.strip(), mode="eval")
        except SyntaxError as exc:
            where = f" at column {exc.offset}" if exc.offset else ""
            raise ConfigValueError(key, _shown(source), f"a Python-syntax expression ({exc.msg}{where})") from None
        except (RecursionError, MemoryError):  # Python's parser gives up on deep nesting
            raise ConfigValueError(key, _shown(source), f"an expression nested at most {MAX_DEPTH} deep") from None
        depth = _depth(module.body)
        if depth > MAX_DEPTH:
            raise ConfigValueError(key, _shown(source), f"an expression nested at most {MAX_DEPTH} deep "
                                                        f"(this one is {depth} deep)")
        return cls(source, key, module.body)

    def _refuse(self, node: ast.AST, what: str) -> ConfigValueError:
        snippet = ast.get_source_segment(self.text.strip(), node) or type(node).__name__
        return ConfigValueError(self.key, self.text,
                                f"numbers, field names, hw.<constant>, + - * / // % **, comparisons, "
                                f"and/or/not, 'a if c else b' and the functions {sorted(FUNCTIONS)} "
                                f"(refused: {what} {snippet!r})")

    def _check(self, node: ast.AST, names: set[str], hw: set[str], functions: set[str],
               strings: set[str]) -> None:
        rec = functools.partial(self._check, names=names, hw=hw, functions=functions, strings=strings)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                strings.add(node.value)
            elif not isinstance(node.value, (int, float)):  # bool is an int
                raise self._refuse(node, "the constant")
            elif not _finite(node.value):  # 1e999, or an integer past float64 (a 400-digit literal)
                raise ConfigValueError(self.key, _shown(self.text),
                                       f"number literals within float64's range (|x| < 1.8e308; refused: "
                                       f"{_shown(repr(node.value))})")
        elif isinstance(node, ast.Name):
            if node.id == HW:
                raise self._refuse(node, "hw without a constant name, write hw.<constant>:")
            if node.id in FUNCTIONS:
                raise self._refuse(node, "a function name without a call")
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            if not (isinstance(node.value, ast.Name) and node.value.id == HW):
                raise self._refuse(node, "the attribute")
            hw.add(node.attr)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                raise self._refuse(node, "the operator in")
            rec(node.left)
            rec(node.right)
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
                raise self._refuse(node, "the operator in")
            rec(node.operand)
        elif isinstance(node, ast.BoolOp):
            for v in node.values:
                rec(v)
        elif isinstance(node, ast.Compare):
            if any(type(op) not in _CMPOPS for op in node.ops):
                raise self._refuse(node, "the comparison")
            rec(node.left)
            for v in node.comparators:
                rec(v)
        elif isinstance(node, ast.IfExp):
            rec(node.test)
            rec(node.body)
            rec(node.orelse)
        elif isinstance(node, ast.Call):
            if self._check_call(node, names, functions):
                for a in node.args:
                    rec(a)
        else:
            raise self._refuse(node, "the construct")

    def _check_call(self, node: ast.Call, names: set[str], functions: set[str]) -> bool:
        """Check a call's function and arity; whether its arguments remain to check."""
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise self._refuse(node, "the call")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise self._refuse(node, "keyword or starred arguments in")
        low, high = FUNCTIONS[node.func.id]
        if len(node.args) < low or (high is not None and len(node.args) > high):
            count = str(low) if low == high else f"at least {low}"
            raise self._refuse(node, f"{node.func.id}() takes {count} argument(s):")
        functions.add(node.func.id)
        if node.func.id == "contains":
            field, text = node.args
            if not isinstance(field, ast.Name) or field.id in FUNCTIONS:
                raise self._refuse(node, "contains() takes a categorical field first:")
            if not (isinstance(text, ast.Constant) and isinstance(text.value, str) and text.value):
                raise self._refuse(node, "contains() takes a non-empty string literal second:")
            names.add(field.id)  # the text is searched for, not a category value: not in strings
            return False
        return True

    # -- validation --------------------------------------------------------------------------
    def validate(self, allowed_fields: Iterable[str], allowed_hw: Iterable[str] | None = None, *,
                 categories: Mapping[str, Sequence[str]] | None = None) -> "Expression":
        """Check that every name, hw constant and string literal is known; returns self.

        Parameters
        ----------
        allowed_fields : iterable of str
            Field names the expression may read.
        allowed_hw : iterable of str or None
            Hardware constants it may read (None: any, checked at evaluation).
        categories : mapping or None
            Categorical field -> its values; string literals must be one of them or a dtype.

        Raises
        ------
        ckpred.errors.ConfigValueError
            Naming the key, the first unknown name and what is allowed.
        """
        fields = sorted(set(allowed_fields))
        unknown = sorted(self.names - set(fields))
        if unknown:
            raise ConfigValueError(self.key, unknown[0],
                                   f"a field of {fields} or hw.<constant> (in expression {self.text!r})")
        if allowed_hw is not None:
            hw = sorted(set(allowed_hw))
            unknown = sorted(self.hw_names - set(hw))
            if unknown:
                raise ConfigValueError(self.key, f"hw.{unknown[0]}",
                                       f"hw constants {hw} (in expression {self.text!r})")
        if categories is not None:
            known = set(dtype_bytes_table())
            for values in categories.values():
                known.update(str(v) for v in values)
            unknown = sorted(self.strings - known)
            if unknown:
                raise ConfigValueError(self.key, unknown[0],
                                       f"a value of a categorical field or a dtype name {sorted(known)} "
                                       f"(in expression {self.text!r})")
        return self

    def check_constants(self) -> "Expression":
        """Refuse a constant part that is no finite number and a division by a constant zero.

        Such an expression (``10**10**10 * m``, ``sqrt(-1) * m``, ``m // 0``) can only give an
        infinite or undefined value wherever it is evaluated. Returns self.

        Raises
        ------
        ckpred.errors.ConfigValueError
            Naming the key, the expression and the part at fault.
        """
        constant: dict[int, bool] = {}
        for node in _post_order(self._tree):
            constant[id(node)] = _is_constant(node, constant)
        for node in ast.walk(self._tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) \
                    and constant[id(node.right)] and self._constant_value(node.right) == 0.0:
                raise self._bad_part(node, "a division by zero")
            if isinstance(node, ast.expr) and constant[id(node)] and not isinstance(node, ast.Constant):
                value = self._constant_value(node)
                if value is not None and not math.isfinite(value):
                    raise self._bad_part(node, f"{value}")
        return self

    def _constant_value(self, node: ast.AST) -> float | None:
        """The number a constant part folds to (``None``: not a number, e.g. a string)."""
        walker = _Walker(self, {}, {}, _numpy_ops(1), {}, None)
        try:
            value = walker.visit(node)
        except ConfigValueError:  # a type error: the trial evaluation names it
            return None
        return float(value.value) if value.kind in ("num", "bool") else None

    def _bad_part(self, node: ast.AST, what: str) -> ConfigValueError:
        snippet = ast.get_source_segment(self.text.strip(), node) or type(node).__name__
        return ConfigValueError(self.key, _shown(self.text),
                                f"an expression whose constant parts are finite numbers (refused: "
                                f"{_shown(snippet)!r} is {what})")

    def trial(self, *, categories: Mapping[str, Sequence[str]] | None = None, condition: bool = False) -> "Expression":
        """Evaluate once on a row of ones (a categorical field: its first value; ``hw`` constants:
        one) to refuse what no table can evaluate: ordering a categorical field, ``dtype_bytes``
        of a number, a string in arithmetic... Returns self.

        Raises
        ------
        ckpred.errors.ConfigValueError
            Naming the key, the expression and the part at fault.
        """
        categories = dict(categories or {})
        columns = {n: np.zeros(1) if n in categories else np.ones(1) for n in self.names}
        hw = dict.fromkeys(self.hw_names, 1.0)
        with np.errstate(all="ignore"):
            if condition:
                self.evaluate_bool(columns, hw, _numpy_ops(1), categories=categories)
            else:
                self.evaluate(columns, hw, _numpy_ops(1), categories=categories)
        return self

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, columns: Mapping[str, Any], hw: Mapping[str, float] | None = None, xp: Any = None, *,
                 categories: Mapping[str, Sequence[str]] | None = None,
                 dtype_bytes: Mapping[str, float] | None = None, broadcast: bool = True) -> Any:
        """The expression's value as a float64 column of ``xp`` (or a number).

        Parameters
        ----------
        columns : mapping
            Field name -> column (numpy array, ONNX symbol) or a constant (number, or a string
            for a categorical field fixed for the whole table).
        hw : mapping or None
            Hardware constant name -> number.
        xp : array namespace
            :class:`ckpred.features.base.NumpyOps` (default: one sized from the first numpy
            column) or the ONNX namespace.
        categories : mapping or None
            Categorical field -> its values in code order.
        dtype_bytes : mapping or None
            dtype name -> bytes per element (default :func:`dtype_bytes_table`).
        broadcast : bool, default=True
            Return a constant as a column (``xp.full``) rather than a Python number.

        Returns
        -------
        column or float
            Booleans are returned as 1.0/0.0.
        """
        xp = xp if xp is not None else _default_ops(columns)
        walker = _Walker(self, columns, hw or {}, xp, categories or {}, dtype_bytes)
        out = walker.number(walker.visit(self._tree), self._tree)
        if out.scalar:
            return xp.full(out.value) if broadcast else float(out.value)
        return out.value

    def evaluate_bool(self, columns: Mapping[str, Any], hw: Mapping[str, float] | None = None, xp: Any = None, *,
                      categories: Mapping[str, Sequence[str]] | None = None,
                      dtype_bytes: Mapping[str, float] | None = None) -> Any:
        """The expression as a condition: a boolean column, or a Python bool when constant."""
        xp = xp if xp is not None else _default_ops(columns)
        walker = _Walker(self, columns, hw or {}, xp, categories or {}, dtype_bytes)
        return walker.boolean(walker.visit(self._tree), self._tree).value


def _shown(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters for a message (a refused text may be huge)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _post_order(tree: ast.AST) -> list[ast.AST]:
    """The nodes of ``tree``, each after its children (without recursion)."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out[::-1]


def _is_constant(node: ast.AST, known: Mapping[int, bool]) -> bool:
    """Whether ``node`` reads no field and no ``hw`` constant (its children already judged in
    ``known``); a call's function name does not count as a field."""
    if isinstance(node, ast.Constant) or not isinstance(node, ast.expr):
        return True
    if isinstance(node, (ast.Name, ast.Attribute)):
        return False
    if isinstance(node, ast.Call):
        return all(known[id(a)] for a in node.args)
    return all(known[id(c)] for c in ast.iter_child_nodes(node))


def _finite(value: int | float) -> bool:
    """Whether a number literal is a finite float64 (evaluation is float64)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _depth(tree: ast.AST) -> int:
    """Depth of ``tree`` (a leaf is 1), walked without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def parse(text: object, *, key: str) -> Expression:
    """Shorthand for :meth:`Expression.parse`."""
    return Expression.parse(text, key=key)


def _default_ops(columns: Mapping[str, Any]) -> Any:
    first = next((value for value in columns.values() if isinstance(value, np.ndarray)), None)
    return _numpy_ops(1 if first is None else len(first))


def _numpy_ops(n_rows: int) -> Any:
    # lazy: ckpred.features.base imports scikit-learn (~1.5 s), which composing and checking configs does not need
    from ckpred.features.base import NumpyOps

    return NumpyOps(n_rows)


class _Walker:
    """One evaluation: visits the tree, folding constants and calling ``xp`` on columns."""

    def __init__(self, expr: Expression, columns: Mapping[str, Any], hw: Mapping[str, float], xp: Any,
                 categories: Mapping[str, Sequence[str]], dtype_bytes: Mapping[str, float] | None) -> None:
        self.expr, self.columns, self.hw, self.xp = expr, columns, hw, xp
        self.categories = {k: [str(v) for v in vals] for k, vals in categories.items()}
        self._dtype_bytes = dtype_bytes

    @property
    def dtype_bytes(self) -> Mapping[str, float]:
        if self._dtype_bytes is None:
            self._dtype_bytes = dtype_bytes_table()
        return self._dtype_bytes

    def error(self, node: ast.AST, value: object, allowed: str) -> ConfigValueError:
        snippet = ast.get_source_segment(self.expr.text.strip(), node)
        where = f" (in {snippet!r} of expression {self.expr.text!r})" if snippet else ""
        return ConfigValueError(self.expr.key, value, allowed + where)

    # -- conversions -------------------------------------------------------------------------
    def number(self, v: _Value, node: ast.AST) -> _Value:
        if v.kind == "num":
            return v
        if v.kind == "bool":
            if v.scalar:
                return _Value(1.0 if v.value else 0.0, "num", True)
            return _Value(self.xp.indicator(v.value), "num", False)
        raise self.error(node, v.value, "a number here (a string only compares with a categorical field "
                                        "or names a dtype in dtype_bytes)")

    def boolean(self, v: _Value, node: ast.AST) -> _Value:
        if v.kind == "bool":
            return v
        v = self.number(v, node)
        if v.scalar:
            return _Value(v.value != 0.0, "bool", True)
        return _Value(self.xp.logical_not(self.xp.equal(v.value, 0.0)), "bool", False)

    # -- nodes -------------------------------------------------------------------------------
    def visit(self, node: ast.AST) -> _Value:
        method = getattr(self, f"visit_{type(node).__name__}")
        return method(node)

    def visit_Constant(self, node: ast.Constant) -> _Value:
        if isinstance(node.value, bool):
            return _Value(node.value, "bool", True)
        if isinstance(node.value, str):
            return _Value(node.value, "str", True)
        return _Value(float(cast(float, node.value)), "num", True)  # _check admitted numbers only

    def visit_Name(self, node: ast.Name) -> _Value:
        if node.id not in self.columns:
            raise self.error(node, node.id, f"a field of {sorted(self.columns)} or hw.<constant>")
        value = self.columns[node.id]
        if isinstance(value, str):
            return _Value(value, "str", True)
        if isinstance(value, (bool, np.bool_)):
            return _Value(bool(value), "bool", True)
        if isinstance(value, (int, float, np.integer, np.floating)):
            return _Value(float(value), "num", True)
        return _Value(value, "num", False, field=node.id if node.id in self.categories else None)

    def visit_Attribute(self, node: ast.Attribute) -> _Value:
        if node.attr not in self.hw:
            raise self.error(node, f"hw.{node.attr}", f"hw constants {sorted(self.hw)}")
        return _Value(float(self.hw[node.attr]), "num", True)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> _Value:
        operand = self.visit(node.operand)
        if isinstance(node.op, ast.Not):
            b = self.boolean(operand, node.operand)
            if b.scalar:
                return _Value(not b.value, "bool", True)
            return _Value(self.xp.logical_not(b.value), "bool", False)
        v = self.number(operand, node.operand)
        if isinstance(node.op, ast.UAdd):
            return _Value(v.value, "num", v.scalar)
        if v.scalar:
            return _Value(-v.value, "num", True)
        return _Value(-v.value, "num", False)

    def visit_BinOp(self, node: ast.BinOp) -> _Value:
        a = self.number(self.visit(node.left), node.left)
        op = _BINOPS[type(node.op)]
        if op == "**" and isinstance(node.right, ast.Constant) and isinstance(node.right.value, int) \
                and not isinstance(node.right.value, bool) and 0 <= node.right.value <= 4:
            return self._integer_power(a, node.right.value)
        b = self.number(self.visit(node.right), node.right)
        return self.arith(op, a, b)

    def _integer_power(self, a: _Value, exponent: int) -> _Value:
        if exponent == 0:
            return _Value(1.0, "num", True)
        out = a
        for _ in range(exponent - 1):
            out = self.arith("*", out, a)
        return out

    def arith(self, op: str, a: _Value, b: _Value) -> _Value:
        x, y = a.value, b.value
        if a.scalar and b.scalar:
            x, y = np.float64(x), np.float64(y)
            fn = cast(Callable[..., Any], {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
                                           "//": lambda p, q: np.floor(p / q), "%": np.fmod, "**": np.power}[op])
            return _Value(_np_scalar(fn, x, y), "num", True)
        xp = self.xp
        if op == "+":
            out = x + y
        elif op == "-":
            out = x - y
        elif op == "*":
            out = x * y
        elif op == "/":
            out = x / y
        elif op == "//":
            out = xp.floor(x / y)
        elif op == "%":
            out = xp.fmod(x, y)
        else:
            out = xp.power(x, y)
        return _Value(out, "num", False)

    def visit_BoolOp(self, node: ast.BoolOp) -> _Value:
        values = [self.boolean(self.visit(v), v) for v in node.values]
        is_and = isinstance(node.op, ast.And)
        out = values[0]
        for v in values[1:]:
            out = self.logical(is_and, out, v)
        return out

    def logical(self, is_and: bool, a: _Value, b: _Value) -> _Value:
        if a.scalar and b.scalar:
            return _Value((a.value and b.value) if is_and else (a.value or b.value), "bool", True)
        # A constant operand decides or drops out: no node for it.
        for const, other in ((a, b), (b, a)):
            if const.scalar:
                if const.value:
                    return other if is_and else const
                return const if is_and else other
        fn = self.xp.logical_and if is_and else self.xp.logical_or
        return _Value(fn(a.value, b.value), "bool", False)

    def visit_Compare(self, node: ast.Compare) -> _Value:
        left_node, left = node.left, self.visit(node.left)
        result: _Value | None = None
        for op, right_node in zip(node.ops, node.comparators):
            right = self.visit(right_node)
            part = self.compare(_CMPOPS[type(op)], left, left_node, right, right_node)
            result = part if result is None else self.logical(True, result, part)
            left_node, left = right_node, right
        assert result is not None
        return result

    def _code(self, column: _Value, column_node: ast.AST, string: _Value) -> _Value:
        """A string compared with a categorical column: the string's code in that field."""
        if column.field is None:
            raise self.error(column_node, string.value,
                             f"a comparison of a string with a categorical field "
                             f"({sorted(self.categories) or 'none in this op'})")
        values = self.categories[column.field]
        if string.value not in values:
            raise self.error(column_node, string.value, f"a value of field {column.field!r}: {values}")
        return _Value(float(values.index(string.value)), "num", True)

    def compare(self, op: str, a: _Value, a_node: ast.AST, b: _Value, b_node: ast.AST) -> _Value:
        if a.kind == "str" and b.kind == "str":
            if op not in ("==", "!="):
                raise self.error(a_node, op, "== or != between strings")
            return _Value((a.value == b.value) == (op == "=="), "bool", True)
        if a.kind == "str" or b.kind == "str":
            if op not in ("==", "!="):
                raise self.error(a_node, op, "== or != between a categorical field and a string")
            if a.kind == "str":
                a = self._code(b, b_node, a)
            else:
                b = self._code(a, a_node, b)
        a, b = self.number(a, a_node), self.number(b, b_node)
        if a.scalar and b.scalar:
            fn = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
                  "==": np.equal, "!=": np.not_equal}[op]
            return _Value(_np_scalar(fn, np.float64(a.value), np.float64(b.value)), "bool", True)
        xp = self.xp
        x, y = a.value, b.value
        if op == "<":
            out = xp.less(x, y)
        elif op == "<=":
            out = xp.less_equal(x, y)
        elif op == ">":
            out = xp.greater(x, y)
        elif op == ">=":
            out = xp.greater_equal(x, y)
        elif op == "==":
            out = xp.equal(x, y)
        else:
            out = xp.logical_not(xp.equal(x, y))
        return _Value(out, "bool", False)

    def visit_IfExp(self, node: ast.IfExp) -> _Value:
        return self.select(node.test, node.body, node.orelse)

    def select(self, test: ast.AST, body: ast.AST, orelse: ast.AST) -> _Value:
        cond = self.boolean(self.visit(test), test)
        a = self.number(self.visit(body), body)
        b = self.number(self.visit(orelse), orelse)
        if cond.scalar:
            return a if cond.value else b
        if a.scalar and b.scalar and a.value == b.value and math.copysign(1, a.value) == math.copysign(1, b.value):
            return a
        return _Value(self.xp.where(cond.value, a.value, b.value), "num", False)

    def visit_Call(self, node: ast.Call) -> _Value:
        name = node.func.id  # type: ignore[attr-defined]  # checked at parse
        args = node.args
        if name == "where":
            return self.select(*args)
        if name == "dtype_bytes":
            return self.dtype_bytes_of(args[0])
        if name == "contains":
            return self.contains(args[0], args[1].value)  # type: ignore[attr-defined]  # checked at parse
        values = [self.number(self.visit(a), a) for a in args]
        if name in ("min", "max"):
            out = values[0]
            for v in values[1:]:
                out = self.call("minimum" if name == "min" else "maximum", out, v)
            return out
        if name == "ceil_div":
            return self.call("ceil", self.arith("/", values[0], values[1]))
        return self.call(name, *values)

    def call(self, fn: str, *values: _Value) -> _Value:
        if all(v.scalar for v in values):
            return _Value(_np_scalar(getattr(_numpy_ops(1), fn), *(np.float64(v.value) for v in values)), "num", True)
        return _Value(getattr(self.xp, fn)(*(v.value for v in values)), "num", False)

    def contains(self, node: ast.AST, text: str) -> _Value:
        """A categorical field's value contains ``text``: its code is one of the values that do
        (an ``Or`` of ``Equal``s, nothing when no value does)."""
        v = self.visit(node)
        if v.kind == "str":  # a categorical field fixed for the whole table
            return _Value(text in v.value, "bool", True)
        if v.field is None:
            raise self.error(node, getattr(node, "id", v.value),
                             f"a categorical field in contains() ({sorted(self.categories) or 'none in this op'})")
        codes = [i for i, value in enumerate(self.categories[v.field]) if text in value]
        out = _Value(False, "bool", True)
        for code in codes:
            out = self.logical(False, out, _Value(self.xp.equal(v.value, float(code)), "bool", False))
        return out

    def dtype_bytes_of(self, node: ast.AST) -> _Value:
        v = self.visit(node)
        table = self.dtype_bytes
        if v.kind == "str":
            if v.value not in table:
                raise self.error(node, v.value, f"a dtype name of {sorted(table)}")
            return _Value(float(table[v.value]), "num", True)
        if v.field is None:
            raise self.error(node, ast.get_source_segment(self.expr.text.strip(), node) or v.value,
                             "a categorical dtype field or a dtype name string in dtype_bytes()")
        values = self.categories[v.field]
        unknown = [c for c in values if c not in table]
        if unknown:
            raise self.error(node, unknown[0], f"values of field {v.field!r} that are dtype names {sorted(table)}")
        # A chain of Where over the codes: exact values, NaN for a code outside the field.
        out: Any = float("nan")
        for code in reversed(range(len(values))):
            out = self.xp.where(self.xp.equal(v.value, float(code)), float(table[values[code]]), out)
        return _Value(out, "num", False)


# -- derived columns -----------------------------------------------------------------------------
def topological_order(expressions: Mapping[str, Expression], *, key: str,
                      external: Iterable[str] = ()) -> list[str]:
    """Order derived columns so each comes after the derived columns it reads.

    Parameters
    ----------
    expressions : mapping
        Derived column name -> its :class:`Expression`.
    key : str
        Config key of the mapping (errors name ``<key>.<column>``).
    external : iterable of str
        Names available from outside (source columns); a derived column may read an external
        column of its own name (``time: time_us / 1000`` is fine when ``time`` is only a
        source), any other self-reference is a cycle.

    Returns
    -------
    list of str
        The names of ``expressions``; ties keep mapping order.

    Raises
    ------
    ckpred.errors.ConfigValueError
        On a cycle, naming its columns in order.
    """
    external = set(external)
    deps = {name: sorted(n for n in e.names if n in expressions and not (n == name and n in external))
            for name, e in expressions.items()}
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = path[path.index(name):] + [name]
            raise ConfigValueError(f"{key}.{cycle[0]}", " -> ".join(cycle),
                                   "derived columns that do not depend on themselves (a cycle)")
        state[name] = 1
        for dep in deps[name]:
            visit(dep, path + [name])
        state[name] = 2
        order.append(name)

    for name in expressions:
        visit(name, [])
    return order


def evaluate_derived(expressions: Mapping[str, Expression], columns: Mapping[str, Any],
                     hw: Mapping[str, float] | None = None, xp: Any = None, *, key: str,
                     categories: Mapping[str, Sequence[str]] | None = None,
                     dtype_bytes: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Evaluate derived columns in dependency order; returns ``columns`` plus the new ones."""
    out = dict(columns)
    for name in topological_order(expressions, key=key, external=columns):
        out[name] = expressions[name].evaluate(out, hw, xp, categories=categories, dtype_bytes=dtype_bytes)
    return out
