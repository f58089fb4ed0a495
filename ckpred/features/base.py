"""Common machinery of every ckpred feature transformer.

Each feature group is a stateless scikit-learn transformer: ``fit`` only learns *where* its
input columns are (by name from a DataFrame, else by position) and how many features it
makes; ``transform`` computes the features vectorised in float64. Constants such as bytes per
element or the number of CUs are constructor parameters that
:func:`ckpred.features.build_features` fills from the arch and dtype configs.

Column selection
----------------
The raw model input X is the int64 DataFrame ``op.encode_frame(table)`` whose columns are
``op.input_names``. A transformer fitted on a DataFrame records ``feature_names_in_`` and finds
its columns by name; a DataFrame at transform time must carry the same columns. Fitted on a
plain ndarray, column ``j`` is taken to be ``input_names[j]`` when the ``input_names``
parameter is set (``build_features`` sets it to ``op.input_names``), otherwise the first
``len(input_columns)`` columns are taken, in the order of :attr:`FeatureGroup.input_columns`.
Either way the learned positions are ``input_indices_``; the ONNX converters gather exactly
those columns from the raw int64 matrix.

Values
------
Inputs must be finite and non-negative (GEMM sizes, tile sizes, codes and flags are all
>= 0); negative values raise ``ValueError``. Zero sizes are not GEMM problems, but they are not
refused: they follow IEEE arithmetic (``log2(0) = -inf``, ``x / 0 = inf``) exactly as the ONNX
graph does, so the Python and ONNX paths agree even there. Routing degenerate shapes away from
the model is the runtime's job.

One definition, two backends
----------------------------
Each transformer writes its formulas once, in :meth:`FeatureGroup._compute`, against a small
array namespace ``xp`` (arithmetic operators plus :class:`NumpyOps`' functions). ``transform``
runs it with :class:`NumpyOps` on float64 arrays; the ONNX converter
(:mod:`ckpred.export.converters`) runs the very same method with a namespace that emits ONNX
nodes in double precision. The graph therefore never re-implements a feature, and both
backends apply the same IEEE operations in the same order.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import (
    _check_feature_names_in,
    check_is_fitted,
    validate_data,
)


def positive_real() -> list[Any]:
    """``_parameter_constraints`` entry of a number > 0."""
    return [Interval(Real, 0, None, closed="neither")]


def positive_int() -> list[Any]:
    """``_parameter_constraints`` entry of an integer >= 1."""
    return [Interval(Integral, 1, None, closed="left")]


class FeatureGroup(TransformerMixin, BaseEstimator):
    """Base class: column lookup, validation and feature names; subclasses compute features.

    Subclasses set :attr:`input_columns` and implement :meth:`_feature_names` and
    :meth:`_compute`; both must agree on the number and order of features.
    """

    #: Raw input columns this group reads, by name (a subset of ``op.input_names``).
    input_columns: ClassVar[tuple[str, ...]] = ()

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "input_names": [None, list, tuple],
    }

    # -- to implement ------------------------------------------------------------------------
    def _feature_names(self) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:  # pragma: no cover - abstract
        """Features as a list of columns, in :meth:`_feature_names` order.

        ``cols`` maps each of :attr:`input_columns` to a float64 column; ``xp`` is
        :class:`NumpyOps` or the ONNX namespace. Use only arithmetic operators, Python numbers
        and ``xp`` functions, so both backends compute the same thing.
        """
        raise NotImplementedError

    # -- sklearn API -------------------------------------------------------------------------
    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        # Sizes, codes and flags are non-negative; fit refuses negatives like sklearn expects.
        tags.input_tags.positive_only = True
        tags.requires_fit = True
        return tags

    def fit(self, X: npt.ArrayLike, y: object = None) -> "FeatureGroup":
        """Learn where the input columns are; no statistics are learned.

        Parameters
        ----------
        X : DataFrame or array-like of shape (n_samples, n_features)
            Raw int64 input (columns ``op.input_names``).
        y : ignored

        Returns
        -------
        self
        """
        self._validate_params()
        checked: np.ndarray = validate_data(self, X, dtype=np.float64, reset=True)
        self._check_non_negative(checked, "fit")
        self.input_indices_ = self._locate_columns()
        self.n_features_out_ = len(self._feature_names())
        return self

    def transform(self, X: npt.ArrayLike) -> np.ndarray:
        """Compute the features of each row.

        Parameters
        ----------
        X : DataFrame or array-like of shape (n_samples, n_features)
            Same columns as at fit.

        Returns
        -------
        ndarray of shape (n_samples, n_features_out_), float64
        """
        check_is_fitted(self, "input_indices_")
        checked: np.ndarray = validate_data(self, X, dtype=np.float64, reset=False)
        self._check_non_negative(checked, "transform")
        used = checked[:, list(self.input_indices_)]
        cols = {name: used[:, i] for i, name in enumerate(self.input_columns)}
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = self._compute(cols, NumpyOps(checked.shape[0]))
        return np.column_stack([np.asarray(c, dtype=np.float64) for c in out])

    def get_feature_names_out(self, input_features: npt.ArrayLike | None = None) -> np.ndarray:
        """Names of the output features (same for every input).

        Parameters
        ----------
        input_features : array-like of str or None
            Checked against ``feature_names_in_`` when given; does not change the output.
        """
        check_is_fitted(self, "input_indices_")
        _check_feature_names_in(self, input_features, generate_names=False)
        return np.asarray(self._feature_names(), dtype=object)

    # -- helpers -----------------------------------------------------------------------------
    def _check_non_negative(self, X: np.ndarray, method: str) -> None:
        """Refuse negative values, naming the first one's column, row and value."""
        if X.size == 0 or X.min() >= 0:
            return
        row, col = (int(i[0]) for i in np.nonzero(X < 0))
        names = getattr(self, "feature_names_in_", None)
        column = str(names[col]) if names is not None else f"column {col}"
        # "Negative values in data" is the phrase sklearn's positive_only checks look for.
        raise ValueError(f"Negative values in data passed to {type(self).__name__}.{method}: {column!r} "
                         f"is {X[row, col]:g} in row {row}; sizes, tile sizes, category codes and flags "
                         f"must be >= 0")

    def _locate_columns(self) -> tuple[int, ...]:
        """Positions of :attr:`input_columns` in X (see the module docstring)."""
        needed = self.input_columns
        name = type(self).__name__
        if hasattr(self, "feature_names_in_"):
            present = list(self.feature_names_in_)
            missing = [c for c in needed if c not in present]
            if missing:
                raise ValueError(f"{name} needs input columns {list(needed)}; X lacks {missing} "
                                 f"(X has columns {present})")
            return tuple(present.index(c) for c in needed)
        if self.input_names is not None:
            names = [str(n) for n in self.input_names]
            if len(names) != self.n_features_in_:
                raise ValueError(f"{name}: input_names lists {len(names)} columns {names} but X has "
                                 f"{self.n_features_in_} feature(s)")
            missing = [c for c in needed if c not in names]
            if missing:
                raise ValueError(f"{name} needs input columns {list(needed)}; input_names lacks {missing}")
            return tuple(names.index(c) for c in needed)
        if self.n_features_in_ < len(needed):
            raise ValueError(f"{name} needs {len(needed)} input columns {list(needed)} (in this order "
                             f"when X is an array without input_names) but X has "
                             f"{self.n_features_in_} feature(s)")
        return tuple(range(len(needed)))


class NumpyOps:
    """The numpy backend of the ``xp`` namespace used by :meth:`FeatureGroup._compute`.

    Every function has an ONNX twin in :mod:`ckpred.export.converters` built from the ONNX
    operator named in its docstring; keep the two in step.
    """

    #: ln 2; log2 is computed as Log(x) / ln 2 in both backends (ONNX has no Log2).
    LN2 = float(np.log(2.0))

    def __init__(self, n_rows: int) -> None:
        self.n_rows = n_rows

    def full(self, value: float) -> np.ndarray:
        """A constant column (ONNX: Expand of a constant to [N, 1])."""
        return np.full(self.n_rows, float(value))

    def log2(self, x: np.ndarray) -> np.ndarray:
        """log2 as Log(x) / ln 2, rounded to float32 (ONNX: Log, Div, Cast float, Cast double).

        ``log`` is not correctly rounded: numpy's and onnxruntime's double ``Log`` differ in the
        last bit on ~13% of inputs, and LightGBM may put a threshold between two ulp-adjacent
        values, so the exported graph took other branches than the sklearn pipeline. Rounding
        both results to the nearest float32 (IEEE, identical in both backends) makes them equal
        except on the ~2^-29 share of values within an ulp of a float32 rounding midpoint,
        at a precision (7 digits) far below what any split needs.
        """
        return (np.log(x) / self.LN2).astype(np.float32).astype(np.float64)

    def ceil(self, x: np.ndarray) -> np.ndarray:
        """ONNX: Ceil."""
        return np.ceil(x)

    def floor(self, x: np.ndarray) -> np.ndarray:
        """ONNX: Floor."""
        return np.floor(x)

    def fmod(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """C fmod, exact for integers held in doubles (ONNX: Mod with fmod=1)."""
        return np.fmod(a, b)

    def minimum(self, a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
        """ONNX: Min."""
        return np.minimum(a, b)

    def maximum(self, a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
        """ONNX: Max."""
        return np.maximum(a, b)

    def where(self, cond: np.ndarray, a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
        """ONNX: Where."""
        return np.where(cond, a, b).astype(np.float64)

    def equal(self, a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
        """Boolean a == b (ONNX: Equal)."""
        return np.equal(a, b)

    def less(self, a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
        """Boolean a < b (ONNX: Less)."""
        return np.less(a, b)

    def indicator(self, cond: np.ndarray) -> np.ndarray:
        """1.0 where ``cond`` else 0.0 (ONNX: Cast to double)."""
        return np.asarray(cond, dtype=np.float64)

    def greater(self, a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
        """Boolean a > b (ONNX: Greater)."""
        return np.greater(a, b)

    def less_equal(self, a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
        """Boolean a <= b (ONNX: LessOrEqual)."""
        return np.less_equal(a, b)

    def greater_equal(self, a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
        """Boolean a >= b (ONNX: GreaterOrEqual)."""
        return np.greater_equal(a, b)

    def logical_and(self, a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
        """ONNX: And."""
        return np.logical_and(a, b)

    def logical_or(self, a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
        """ONNX: Or."""
        return np.logical_or(a, b)

    def logical_not(self, a: npt.ArrayLike) -> np.ndarray:
        """ONNX: Not."""
        return np.logical_not(a)

    def power(self, a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
        """a ** b (ONNX: Pow; not correctly rounded in general, like ``log``)."""
        return np.power(a, b)

    def sqrt(self, x: npt.ArrayLike) -> np.ndarray:
        """Correctly rounded square root (ONNX: Sqrt)."""
        return np.sqrt(x)

    def abs(self, x: npt.ArrayLike) -> np.ndarray:
        """ONNX: Abs."""
        return np.abs(x)

    # A feature evaluated for several constants at once (e.g. every reference tile) runs as
    # one broadcast [N, R] chain: the same IEEE operations per element as R scalar chains,
    # at a fraction of the graph nodes (each ONNX node costs microseconds per call).
    def as_column(self, x: np.ndarray) -> np.ndarray:
        """A column as [N, 1] for broadcasting against a :meth:`row` (ONNX: already [N, 1])."""
        return np.asarray(x)[:, None]

    def row(self, values: npt.ArrayLike) -> np.ndarray:
        """Constants as a [1, R] row (ONNX: a [1, R] DOUBLE initializer)."""
        return np.asarray(values, dtype=np.float64)[None, :]

    def min_across(self, x: np.ndarray) -> np.ndarray:
        """Row-wise minimum of an [N, R] block, back to one column (ONNX: ReduceMin axis 1)."""
        return x.min(axis=1)


def ceil_div(a: Any, b: Any, xp: Any) -> Any:
    """ceil(a / b) (exact for the integer sizes of GEMMs held in doubles)."""
    return xp.ceil(a / b)


def last_tile_fill(x: Any, tile: Any, xp: Any) -> Any:
    """Fraction of the last tile along a dimension that holds data: (x mod t)/t, 1 if divisible."""
    rem = xp.fmod(x, tile)
    return xp.where(xp.equal(rem, 0.0), 1.0, rem / tile)
