"""Feature groups declared as expressions: one generic transformer for any op.

A feature set declares a group of features as a mapping *feature name -> expression* over the
op's problem and kernel fields and the ``hw.*`` constants (:mod:`ckpred.expressions` has the
language)::

    - kind: expressions
      name: tiles                      # prefix of the output names (default: the kind)
      params:
        terms:                         # helpers, not output
          grid: ceil_div(m, block_m) * ceil_div(n, block_n)
        features:
          log2_m: log2(m)
          m_over_n: m / n
          tiles_k: ceil_div(k, block_k)
          waves: ceil(grid / hw.cus)
          compute_bound: 2 * m * n * k / ((m * k + k * n + m * n) * dtype_bytes(dtype)) > hw.peak_tflops * 1e3 / hw.memory_bandwidth_gbs
        one_hot: [dtype]               # dtype_fp8, dtype_fp16, ... (1.0 / 0.0)

Features and terms may read each other (evaluated in dependency order; a cycle is refused,
naming it); only what the outputs need is evaluated. :func:`ckpred.features.build_features`
adds the op's ``flops`` and ``bytes`` expressions as terms. :class:`ExpressionFeatures` evaluates them through the ``xp`` namespace of
:mod:`ckpred.features.base`, so the shared ONNX converter and the selector's factorisation
(:mod:`ckpred.export.factorise`) compute the very same values, with no code per group.
The built-in groups ``problem``, ``kernel``, ``interaction``, ``tile_quantization``, ``wave``,
``occupancy`` and ``hardware`` are such declarations (``conf/features/groups/<kind>.yaml``).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Mapping, Sequence

import numpy.typing as npt

from ckpred.errors import ConfigValueError
from ckpred.expressions import Expression, topological_order
from ckpred.features.base import FeatureGroup

__all__ = ["ExpressionFeatures", "compile_features"]


class _Program:
    """Parsed features and terms of one parameter set, in evaluation order."""

    def __init__(self, features: tuple[tuple[str, str], ...], terms: tuple[tuple[str, str], ...],
                 one_hot: tuple[str, ...], key: str) -> None:
        seen: dict[str, str] = {}
        for kind, entries in (("terms", terms), ("features", features)):
            for name, _ in entries:
                if not name.isidentifier():
                    raise ConfigValueError(f"{key}.{kind}.{name}", name,
                                           "a feature name that is a Python identifier (letters, digits, _)")
                if name in seen:
                    raise ConfigValueError(f"{key}.{kind}.{name}", name,
                                           f"names used once across features and terms (also in {seen[name]})")
                seen[name] = kind
        self.exprs: dict[str, Expression] = {}
        for kind, entries in (("terms", terms), ("features", features)):
            for name, text in entries:
                self.exprs[name] = Expression.parse(text, key=f"{key}.{kind}.{name}")
        self.outputs = tuple(name for name, _ in features)
        self.one_hot = one_hot
        # A derived name reading itself means the input field of that name (``m: m``).
        try:
            order = topological_order(self.exprs, key=key,
                                      external=[n for n, e in self.exprs.items() if n in e.names])
        except ConfigValueError as exc:  # name the section of the cycle's first member
            first = str(exc.value).split(" -> ")[0]
            raise ConfigValueError(f"{key}.{seen[first]}.{first}", exc.value, exc.allowed) from None
        # Only what the outputs need is evaluated (and read from the input): an unused term
        # costs nothing.
        needed = set(self.outputs)
        for name in reversed(order):
            if name in needed:
                needed.update(n for n in self.exprs[name].names if n in self.exprs and n != name)
        self.order = [name for name in order if name in needed]
        free: list[str] = []
        for name in self.order:
            for field in sorted(self.exprs[name].names):
                if (field not in self.exprs or field == name) and field not in free:
                    free.append(field)
        for field in one_hot:
            if field not in free:
                free.append(field)
        self.input_columns = tuple(free)
        self.hw_names = frozenset().union(*(self.exprs[n].hw_names for n in self.order))


@functools.lru_cache(maxsize=256)
def _program(features: tuple[tuple[str, str], ...], terms: tuple[tuple[str, str], ...],
             one_hot: tuple[str, ...], key: str) -> _Program:
    return _Program(features, terms, one_hot, key)


def _items(mapping: object, key: str) -> tuple[tuple[str, str | int | float], ...]:
    if mapping is None:
        return ()
    if not isinstance(mapping, Mapping):
        raise ConfigValueError(key, mapping, "a mapping of feature name -> expression")
    out = []
    for name, text in mapping.items():
        if isinstance(text, bool) or not isinstance(text, (str, int, float)):
            raise ConfigValueError(f"{key}.{name}", text, "an expression string (Python syntax, e.g. 'log2(m * n)')")
        out.append((str(name), text))
    return tuple(out)


def compile_features(features: Mapping[str, Any] | None, terms: Mapping[str, Any] | None = None,
                     one_hot: Sequence[str] | None = None, *, key: str = "params") -> _Program:
    """Parse and order a group's expressions (cached); errors name ``<key>.features.<name>``."""
    return _program(_items(features, f"{key}.features"), _items(terms, f"{key}.terms"),
                    tuple(str(f) for f in (one_hot or ())), key)


class ExpressionFeatures(FeatureGroup):
    """Features declared as expressions over fields and hardware constants.

    Features (in order): each key of ``features``, then for each field of ``one_hot`` one
    column ``<field>_<value>`` per category value (1.0 where the row has that value).

    Parameters
    ----------
    features : mapping of str to str
        Feature name -> expression (:mod:`ckpred.expressions`); may read other features and
        ``terms`` by name.
    terms : mapping of str to str or None, default=None
        Named helper expressions that are not output.
    one_hot : sequence of str or None, default=None
        Categorical fields to expand into one indicator column per value.
    hw : mapping of str to float or None, default=None
        The ``hw.*`` constants (:func:`ckpred.features.constants_from_config` of the table's
        arch and dtype; :func:`ckpred.features.build_features` fills it).
    categories : mapping of str to list of str or None, default=None
        Categorical field -> its values in code order (from the op's fields; filled by
        :func:`~ckpred.features.build_features`).
    input_names : sequence of str or None, default=None
        Column names of X when it is a plain array (see :mod:`ckpred.features.base`).
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **FeatureGroup._parameter_constraints,
        "features": [None, dict],
        "terms": [None, dict],
        "one_hot": [None, list, tuple],
        "hw": [None, dict],
        "categories": [None, dict],
    }

    def __init__(self, *, features: Mapping[str, str] | None = None, terms: Mapping[str, str] | None = None,
                 one_hot: Sequence[str] | None = None, hw: Mapping[str, float] | None = None,
                 categories: Mapping[str, Sequence[str]] | None = None,
                 input_names: Sequence[str] | None = None) -> None:
        self.features = features
        self.terms = terms
        self.one_hot = one_hot
        self.hw = hw
        self.categories = categories
        self.input_names = input_names

    # -- the program -------------------------------------------------------------------------
    def _program(self) -> _Program:
        if not self.features and not self.one_hot:
            raise ConfigValueError("params.features", self.features,
                                   "a non-empty mapping of feature name -> expression (or one_hot fields)")
        return compile_features(self.features, self.terms, self.one_hot)

    @property
    def input_columns(self) -> tuple[str, ...]:  # type: ignore[override]
        """Fields the expressions and one-hot expansions read, in first-use order."""
        return self._program().input_columns

    def _categories(self) -> dict[str, list[str]]:
        return {str(k): [str(v) for v in values] for k, values in (self.categories or {}).items()}

    def fit(self, X: npt.ArrayLike, y: object = None) -> "ExpressionFeatures":
        """Parse and check the expressions, then learn where the input columns are.

        Raises
        ------
        ckpred.errors.ConfigValueError
            On an expression that does not parse, reads an unknown ``hw`` constant, a one-hot
            field that is not categorical, or a cycle between features and terms.
        """
        self._validate_params()
        program = self._program()
        hw = dict(self.hw or {})
        for name in program.order:
            program.exprs[name].validate([*program.input_columns, *program.exprs], hw, categories=self._categories())
        categories = self._categories()
        for field in program.one_hot:
            if field not in categories:
                raise ConfigValueError("params.one_hot", field,
                                       f"a categorical field of the op: {sorted(categories) or 'none'}")
        return super().fit(X, y)

    def _feature_names(self) -> list[str]:
        program = self._program()
        categories = self._categories()
        names = list(program.outputs)
        for field in program.one_hot:
            names += [f"{field}_{value}" for value in categories[field]]
        return names

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        program = self._program()
        categories = self._categories()
        hw = {str(k): float(v) for k, v in (self.hw or {}).items()}
        env = dict(cols)
        for name in program.order:
            env[name] = program.exprs[name].evaluate(env, hw, xp, categories=categories)
        out = [env[name] for name in program.outputs]
        for field in program.one_hot:
            out += [xp.indicator(xp.equal(cols[field], float(code))) for code in range(len(categories[field]))]
        return out
