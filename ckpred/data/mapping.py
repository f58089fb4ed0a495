"""Input mapping: the records of a table reader -> canonical rows of a declared op.

An op's ``input``, ``metric`` and ``failure`` sections (:class:`ckpred.schema.OpConfig`) say how a
raw table (CSV, Parquet, JSON lines, MIOpen find-db, Kernel Tuner cache...) becomes rows:

* ``input.columns`` maps a canonical field to its source: a string renames a source column,
  ``{value: <constant>}`` fills a constant, ``{expr: "<expression>"}`` derives it with the one
  expression evaluator (:mod:`ckpred.expressions`) from source columns and other mapped
  fields, in dependency order (a cycle is refused naming its columns). A field the map does not
  name is read from the source column of the same name (exact, else the only
  case-insensitive match), else from the field's default.
* Each field is typed by its kind: ``int`` (an exact integer), ``float`` (a finite number),
  ``bool`` (true/false strings, 1/0), ``categorical`` (text, one of ``values`` when they are
  listed). A record whose problem or kernel field cannot be typed is rejected with the field,
  the value and what is allowed.
* The metric column is converted to the canonical unit (times to ``latency_ms``, throughputs
  to ``tflops``). With a ``flops`` expression the other of the two follows from the problem's
  FLOPs; without one, a time metric's ``tflops`` column holds ``1 / latency_ms`` (a throughput
  in 1/ms) so that ratios of it -- every per-query efficiency -- are ratios of latencies, and a
  throughput metric leaves ``latency_ms`` unknown (NaN, not judged).
* Failures: a metric value listed in ``failure.metric_values`` (``inf``, ``nan``, ``missing``,
  ``zero``, ``negative``) makes the row invalid with the reason ``kernel failed: ...``; the same
  value when not listed is still invalid, under its own category (``NaN value``, ``missing
  value``...), so nothing passes as a measurement. ``failure.valid_column`` is read with the
  op's true/false strings (compared lower-cased); a value in neither list makes the row
  invalid (``bad validity value``).

``input.columns`` may also give the table's ``arch`` (or ``dtype``, ``layout``) per row, from
a source column: a table of several GPUs then carries each row's own arch, and repeats merge
only within one arch. A duplicated source column that the map reads is refused (it cannot know which one is meant),
as is a text column the map does not read that differs between records the op would merge as
repeats of one (problem, kernel): that is how a table mixing dtypes, read by an op without a
dtype field, would otherwise be folded into medians of different problems.
"""

from __future__ import annotations

import functools
import math
from importlib import resources
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ckpred import expressions
from ckpred.data.readers.common import KernelResolver, RawTable, Reject, to_float, to_int, truth
from ckpred.errors import ConfigValueError, InputFileError
from ckpred.kernels.base import Field, OpDefinition
from ckpred.schema import THROUGHPUT_UNITS, TIME_UNITS, OpConfig

#: Table header columns ``input.columns`` may give per row (a table of several GPUs carries each
#: row's arch), unless the op declares them as problem fields.
ROW_HEADERS = ("arch", "dtype", "layout")
#: Most distinct values a text column may have to be checked as a hidden problem field.
HIDDEN_FIELD_MAX_VALUES = 64


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    try:
        return obj.get(key, default)  # DictConfig
    except AttributeError:
        return getattr(obj, key, default)


@dataclass(frozen=True)
class InputMapping:
    """The ``input``, ``metric``, ``failure`` and ``keys.query`` sections of an op, as ingestion
    uses them (see the module docstring)."""

    format: str = "auto"
    columns: tuple[tuple[str, Any], ...] = ()
    metric_column: str = "tflops"
    better: str = "higher"
    unit: str = "tflops"
    failure_values: tuple[str, ...] = ("inf", "nan", "missing")
    valid_column: str | None = None
    true_values: tuple[str, ...] = ("true", "1", "yes")
    false_values: tuple[str, ...] = ("false", "0", "no")
    query: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, cfg: OpConfig | Mapping[str, Any]) -> "InputMapping":
        """From an op config (:class:`ckpred.schema.OpConfig` or a mapping of its keys)."""
        spec, metric, failure = _get(cfg, "input"), _get(cfg, "metric"), _get(cfg, "failure")
        columns = _get(spec, "columns") or {}
        if hasattr(columns, "items"):
            items = tuple((str(k), v) for k, v in columns.items())
        else:
            raise ConfigValueError("op.input.columns", columns, "a mapping of canonical field -> source")
        lower = lambda values: tuple(str(v).strip().lower() for v in values)  # noqa: E731
        return cls(format=str(_get(spec, "format", "auto") or "auto"), columns=items,
                   metric_column=str(_get(metric, "column", "tflops")), better=str(_get(metric, "better", "higher")),
                   unit=str(_get(metric, "unit", "tflops")).lower(),
                   failure_values=lower(_get(failure, "metric_values", cls.failure_values)),
                   valid_column=_get(failure, "valid_column") or None,
                   true_values=lower(_get(failure, "true_values", cls.true_values)),
                   false_values=lower(_get(failure, "false_values", cls.false_values)),
                   query=tuple(_get(_get(cfg, "keys"), "query", ()) or ()))

    @classmethod
    def of_op(cls, op: OpDefinition) -> "InputMapping | None":
        """The mapping of a declared op (one built from config); ``None`` for a Python-only op."""
        cfg = getattr(op, "config", None)
        return None if cfg is None or _get(cfg, "input") is None else cls.from_config(cfg)

    @property
    def is_identity(self) -> bool:
        """No column map and no forced format: the CK formats may be read as they are."""
        return not self.columns and self.format == "auto"

    def metric_factor(self) -> tuple[str, float]:
        """(``latency_ms`` or ``tflops``, factor to that unit) of the metric.

        Raises
        ------
        ckpred.errors.ConfigValueError
            When the unit does not fit ``better`` (a time must be lower-is-better...).
        """
        if self.better == "lower" and self.unit in TIME_UNITS:
            return "latency_ms", TIME_UNITS[self.unit]
        if self.better == "higher" and self.unit in THROUGHPUT_UNITS:
            return "tflops", THROUGHPUT_UNITS[self.unit]
        allowed = (f"a time unit {sorted(TIME_UNITS)} with better=lower, or a throughput unit "
                   f"{sorted(THROUGHPUT_UNITS)} with better=higher")
        raise ConfigValueError("op.metric.unit", self.unit, allowed)


def check_input_columns(columns: Mapping[str, Any], *, key: str = "op.input.columns") -> list[str]:
    """Check an op's ``input.columns`` without a file: each source's form, each expression's
    grammar, and the derived columns' order (returned); for compose-time validation.

    A derived column that reads its own name reads the source column of that name
    (``time: {expr: "time / 1000"}``); any other loop is a cycle.

    Raises
    ------
    ckpred.errors.ConfigValueError
        Naming ``<key>.<column>``: a source that is none of the three forms, an expression
        outside the grammar, or a cycle of derived columns (``a -> b -> a``).
    """
    exprs = {}
    for target, spec in columns.items():
        if isinstance(spec, str) and spec:
            continue
        if isinstance(spec, Mapping) and sorted(spec) in (["value"], ["expr"]):
            if "expr" in spec:
                exprs[str(target)] = expressions.parse(spec["expr"], key=f"{key}.{target}.expr")
            continue
        raise ConfigValueError(f"{key}.{target}", spec, "a source column name, {value: <constant>} or "
                                                         "{expr: <expression>}")
    own = {t for t, e in exprs.items() if t in e.names}
    return expressions.topological_order(exprs, key=key, external=own)


def op_flops(op: OpDefinition, problems: pd.DataFrame) -> np.ndarray:
    """FLOPs of each problem; NaN where the op cannot compute them (no formula, a bad row)."""
    return flops_of(op, problems)[0]


def flops_of(op: OpDefinition, problems: pd.DataFrame) -> tuple[np.ndarray, str]:
    """FLOPs of each problem (NaN where the op cannot compute them) and, when the op's
    formula raised or gave no column, why (else ``""``)."""
    if not len(problems):
        return np.zeros(0), ""
    try:
        with np.errstate(all="ignore"):
            flops = np.asarray(op.flops(problems[list(op.problem_names)]), dtype=np.float64)
    except Exception as exc:  # a problem the op's formula cannot handle is judged by the caller
        return np.full(len(problems), np.nan), f"{type(exc).__name__}: {exc}"
    if flops.shape != (len(problems),):
        return np.full(len(problems), np.nan), f"the formula gave shape {flops.shape} for {len(problems)} problems"
    return flops, ""


def declares_flops(op: OpDefinition) -> bool:
    """Whether ``op`` declares a FLOPs formula (its ``flops`` key, or a plug-in's ``flops`` hook);
    an op without one keeps ``tflops = 1 / latency_ms`` (see the module docstring)."""
    cfg = getattr(op, "config", None)
    if cfg is None:
        return False
    return bool(_get(cfg, "flops")) or "flops" in getattr(op, "plugin_hooks", ())


def _flops_faults(op: OpDefinition, flops: np.ndarray, failed: str) -> np.ndarray:
    """Why each row's FLOPs cannot serve (``""`` where they can).

    With a formula, a row whose FLOPs are not a positive finite number would get a TFLOPS in
    another unit (``1 / latency_ms``) than its neighbours': it is rejected, never mixed in. An
    op without one (no row has finite FLOPs and none is declared) converts every row alike.
    """
    out = np.full(len(flops), "", dtype=object)
    usable = np.isfinite(flops) & (flops > 0)
    if usable.all() or not (declares_flops(op) or usable.any() or failed):
        return out
    if failed:
        out[~usable] = f"bad flops: the op's FLOPs formula failed on this problem ({failed})"
        return out
    for i in np.flatnonzero(~usable).tolist():
        out[i] = f"bad flops: the op's FLOPs formula gives {flops[i]:g} for this problem (a positive finite number " \
                 "is needed to convert the metric)"
    return out


# -- typing values -----------------------------------------------------------------------------------
def _per_unique(values: pd.Series, convert: Any, dtype: Any = object, fill: Any = None) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """``convert`` applied once per distinct value: (results as an array of ``dtype``, ``fill``
    where it gave ``None``; ok mask). A column repeats few values: no per-row Python work."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    converted = [convert(u) for u in uniques]
    ok_u = np.array([c is not None for c in converted] + [False], dtype=bool)
    out_u = np.empty(len(converted) + 1, dtype=dtype)
    out_u[:-1] = [fill if c is None else c for c in converted]
    out_u[-1] = fill
    return out_u[codes], ok_u[codes]


def _typed(field: Field, values: pd.Series) -> tuple[np.ndarray, np.ndarray, str]:
    """(typed values, ok mask, what is allowed) of one field's column."""
    if field.kind == "int":
        out, ok = _per_unique(values, to_int, np.int64, 0)
        return out, ok, "an integer"
    if field.kind == "float":
        def finite(v: Any) -> float | None:
            number = to_float(v)
            return number if number is not None and math.isfinite(number) else None
        out, ok = _per_unique(values, finite, np.float64, 0.0)
        return out, ok, "a finite number"
    if field.kind == "bool":
        out, ok = _per_unique(values, truth, bool, False)
        return out, ok, "true or false (true/1/yes, false/0/no)"
    allowed = set(field.categories)

    def category(v: Any) -> str | None:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        text = str(v).strip()
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            text = str(int(v))  # a numeric category read from a typed column: 16.0 -> "16"
        return text if text and (not allowed or text in allowed) else None

    out, ok = _per_unique(values, category, object, "")
    what = f"one of {list(field.categories)}" if allowed else "a non-empty text value"
    return out, ok, what


# -- metric and validity ------------------------------------------------------------------------------
def _metric_class(value: object) -> tuple[str, float]:
    """(class, number): class is ``ok``, ``missing``, ``nan``, ``inf``, ``negative``, ``zero`` or
    ``non-numeric``."""
    if value is None or value is pd.NA or (isinstance(value, str) and not value.strip()):
        return "missing", math.nan
    number = to_float(value)
    if number is None:
        return "non-numeric", math.nan
    if math.isnan(number):
        return "nan", number
    if math.isinf(number):
        return ("inf" if number > 0 else "negative"), number
    if number < 0:
        return "negative", number
    if number == 0:
        return "zero", number
    return "ok", number


#: A plain decimal number, which pyarrow's cast reads as Python's ``float`` does (both round
#: correctly); anything else is judged value by value by :func:`_metric_class`.
_PLAIN_NUMBER = r"^-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$"


def _plain_numbers(values: pd.Series) -> np.ndarray:
    """The value of each plain number of ``values`` (NaN for anything else), vectorised."""
    if values.dtype.kind in "fiu":
        return values.to_numpy(np.float64)
    if not len(values) or pd.api.types.infer_dtype(values, skipna=True) != "string":
        return np.full(len(values), np.nan)
    text = pc.utf8_trim_whitespace(pa.array(values, pa.string(), from_pandas=True))
    plain = pc.fill_null(pc.match_substring_regex(text, _PLAIN_NUMBER), False)
    return pc.if_else(plain, pc.cast(pc.if_else(plain, text, "0"), pa.float64()), np.nan).to_numpy(
        zero_copy_only=False)


def _judge_metric(values: pd.Series, mapping: InputMapping, target: str, factor: float) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """(number in the canonical unit, or as read when it is no measurement; why a row is no
    measurement, ``""`` where it is one) of each metric value; see :func:`_metric_class`."""
    number = _plain_numbers(values)
    ok = np.isfinite(number) & (number > 0)
    why = np.full(len(values), "", dtype=object)
    number = np.where(ok, number * factor, number)
    rest = np.flatnonzero(~ok)
    if len(rest):  # the few values that are no plain positive number, once per distinct value
        codes, uniques = pd.factorize(values.iloc[rest], use_na_sentinel=False)
        judged = [_metric_class(v) for v in uniques]
        num_u = np.array([num * factor if c == "ok" else num for c, num in judged], dtype=np.float64)
        why_u = np.array(["" if c == "ok" else _metric_reason(c, mapping.metric_column, v, num, mapping, target)
                          for v, (c, num) in zip(uniques, judged)], dtype=object)
        number[rest] = num_u[codes]
        why[rest] = why_u[codes]
    return number, why


def _metric_reason(cls: str, column: str, raw: Any, number: float, mapping: InputMapping, target: str) -> str:
    shown = f"{column}={raw!r}" if isinstance(raw, str) else f"{column}={number:g}"
    if cls in mapping.failure_values:
        return f"kernel failed: {shown} (a failure encoding of the op: {cls})"
    return {"missing": f"missing value: {column}",
            "non-numeric": f"non-numeric value: {column}={raw!r}",
            "nan": f"NaN value: {column}",
            "inf": f"infinite value: {column}={number}",
            "negative": f"negative value: {column}={number:g}",
            "zero": ("zero tflops: a kernel that ran cannot have 0 TFLOPS" if target == "tflops"
                     else f"zero time: {column}=0, a kernel that ran cannot take no time")}[cls]


# -- the mapping ---------------------------------------------------------------------------------------
@dataclass
class MappedRows:
    """Canonical rows of one file (the ingest row frame) and its rejects."""

    frame: pd.DataFrame
    rejects: list[Reject]
    #: The kept rows' values of each text column the op does not read: ingest refuses one that
    #: differs between records it would merge as repeats
    #: (:class:`ckpred.data.ingestion.check.HiddenFields`).
    unread: dict[str, np.ndarray] = field(default_factory=dict)


class _Sources:
    """The raw table's columns by name, refusing duplicated and missing ones with their key."""

    def __init__(self, raw: RawTable, label: str, op: OpDefinition) -> None:
        self.frame, self.label, self.op = raw.frame, label, op
        names = [str(c) for c in raw.frame.columns]
        self.names = names
        self.counts = pd.Series(names, dtype=object).value_counts().to_dict() if names else {}
        self.used: set[str] = set()

    def find(self, name: str) -> str | None:
        """The source column called ``name`` (exact, else the only case-insensitive match)."""
        if name in self.counts:
            return name
        matches = sorted({n for n in self.names if n.lower() == name.lower()})
        return matches[0] if len(matches) == 1 else None

    def get(self, name: str, key: str) -> pd.Series:
        column = self.find(name)
        if column is None:
            raise InputFileError(self.label, f"op {self.op.name!r} reads column {name!r} ({key}) but the file "
                                             f"has none; its columns are {self.names}")
        if self.counts[column] > 1:
            raise InputFileError(self.label, f"column {column!r} appears {self.counts[column]} times in the file; "
                                             f"{key} cannot tell which one is meant (rename or drop one)")
        self.used.add(column)
        return self.frame.loc[:, column]


def _numeric(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """A column as float64 for an expression, and where it held text that is no number (NaN
    there; an empty value is a missing one, NaN too, and not marked)."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "fiub":
        return values.astype(np.float64), np.zeros(len(values), dtype=bool)
    series = values if isinstance(values, pd.Series) else pd.Series(values)
    if series.dtype.kind in "fiub":
        return series.to_numpy(np.float64), np.zeros(len(series), dtype=bool)
    stripped = series.map(lambda v: v.strip() if isinstance(v, str) else v)
    numbers = pd.to_numeric(stripped, errors="coerce").to_numpy(np.float64)
    text = stripped.map(lambda v: isinstance(v, str) and v != "").to_numpy(dtype=bool)
    return numbers, text & np.isnan(numbers) & ~stripped.map(_nan_text).to_numpy(dtype=bool)


def _nan_text(value: object) -> bool:
    """Whether ``value`` is a text that spells a NaN (``nan``, ``NaN``): a number, not words."""
    return isinstance(value, str) and value.lower() in ("nan", "+nan", "-nan")


def _mapped_columns(src: _Sources, mapping: InputMapping, wanted: Sequence[str], n: int,
                    optional: set[str]) -> tuple[dict[str, Any], np.ndarray]:
    """Every wanted canonical column (rename, constant, derived, identity; see the module
    docstring), and why a row cannot be derived (``""`` where it can): a derived column reads a
    text that is no number."""
    faults = np.full(n, "", dtype=object)
    values: dict[str, Any] = {}
    exprs: dict[str, Any] = {}
    for target, spec in mapping.columns:
        key = f"op.input.columns.{target}"
        if isinstance(spec, str):
            values[target] = src.get(spec, key)
        elif isinstance(spec, Mapping) and "value" in spec:
            values[target] = pd.Series([spec["value"]] * n, dtype=object)
        elif isinstance(spec, Mapping) and "expr" in spec:
            exprs[target] = expressions.parse(spec["expr"], key=f"{key}.expr")
        else:
            raise ConfigValueError(key, spec, "a source column name, {value: <constant>} or {expr: <expression>}")
    if exprs:
        names = set().union(*(e.names for e in exprs.values()))
        columns: dict[str, np.ndarray] = {}
        for name in sorted(names):
            if name in values or src.find(name) is not None:
                raw = values[name] if name in values else src.get(name, "op.input.columns (an expression)")
                columns[name], text = _numeric(raw)
                if text.any():
                    _mark_text(faults, text, raw, name, [t for t, e in exprs.items() if name in e.names])
            elif name not in exprs:
                raise InputFileError(src.label, f"an expression of op.input.columns reads {name!r}, which is "
                                                f"neither a column of the file nor a mapped field; the file's "
                                                f"columns are {src.names}")
        # lazy: ckpred.features.base imports scikit-learn (~1.5 s), which ingesting does not need otherwise
        from ckpred.features.base import NumpyOps

        with np.errstate(all="ignore"):
            out = expressions.evaluate_derived(exprs, columns, xp=NumpyOps(n), key="op.input.columns")
        for target in exprs:
            values[target] = np.broadcast_to(np.asarray(out[target], dtype=np.float64), (n,))
    for target in wanted:
        if target in values:
            continue
        if src.find(target) is not None:
            values[target] = src.get(target, f"op field {target!r}")
        elif target not in optional:
            raise InputFileError(src.label, f"op {src.op.name!r} needs column {target!r} but the file has none and "
                                            f"op.input.columns does not map it; the file's columns are {src.names}")
    return values, faults


def _mark_text(faults: np.ndarray, text: np.ndarray, raw: Any, name: str, readers: Sequence[str]) -> None:
    """Mark the rows where column ``name``, read by the derived columns ``readers``, is text."""
    shown = (raw.to_numpy(dtype=object) if isinstance(raw, pd.Series) else np.asarray(raw, dtype=object))
    keys = ", ".join(f"op.input.columns.{t}.expr" for t in readers)
    for i in np.flatnonzero(text & (faults == "")).tolist():
        faults[i] = f"non-numeric value: {name}={_show(shown[i])} is read as a number by {keys}"


def map_rows(raw: RawTable, op: OpDefinition, mapping: InputMapping, resolver: KernelResolver, *, label: str,
             run_id: str, run_arch: str = "") -> MappedRows:
    """Canonical rows (the ingest row frame) of one raw table; see the module docstring.

    Raises
    ------
    ckpred.errors.InputFileError
        A column the op reads is missing or duplicated; an unread text column differs between
        repeats of one (problem, kernel).
    ckpred.errors.ConfigValueError
        A bad column map or metric unit (named by key).
    """
    rows = _RowMapping(raw, op, mapping, label)
    rows.type_fields()
    rows.kernel_codes(resolver)
    rows.type_headers(run_arch)
    rows.check_flops()
    rejects = rows.rejects()
    return MappedRows(rows.frame(run_id), rejects, _unread_texts(rows.src, rows.kept))


class _RowMapping:
    """One raw table on its way to canonical rows, step by step (:func:`map_rows`); each step
    may reject rows (the first reason of a row wins)."""

    def __init__(self, raw: RawTable, op: OpDefinition, mapping: InputMapping, label: str) -> None:
        self.raw, self.op, self.mapping = raw, op, mapping
        self.n = n = len(raw.frame)
        self.src = src = _Sources(raw, label, op)
        mapped = dict(mapping.columns)
        absent = [f.name for f in op.kernel_fields
                  if f.name not in mapped and src.find(f.name) is None and f.default is None]
        # a kernel_name the map names is what the user says the kernel is (else its fields are)
        self.kernel_by_fields = not absent and "kernel_name" not in mapped
        if absent and "kernel_name" not in mapped and src.find("kernel_name") is None:
            raise InputFileError(label, f"op {op.name!r} needs the kernel field column(s) {absent} (or a kernel_name "
                                        f"column) but the file has none and op.input.columns does not map them; the "
                                        f"file's columns are {src.names}")
        defaults = {f.name for f in op.problem_fields + op.kernel_fields if f.default is not None}
        wanted = [*op.problem_names, mapping.metric_column]
        wanted += list(op.kernel_names) if self.kernel_by_fields else ["kernel_name"]
        if mapping.valid_column:
            wanted.append(mapping.valid_column)
        self.headers = [h for h in ROW_HEADERS if h in mapped and h not in op.problem_names]
        wanted += self.headers
        self.values, self.reason = _mapped_columns(src, mapping, wanted, n, optional=defaults)
        self.typed: dict[str, np.ndarray] = {}
        self.codes = np.full(n, -1, dtype=np.int64)
        self.flops = np.full(n, np.nan)
        self.kept = np.zeros(0, dtype=np.int64)

    def reject(self, bad: np.ndarray, text: Any) -> None:
        """Reject the rows of ``bad`` that are not rejected yet, for ``text(row)``."""
        for i in np.flatnonzero(bad & (self.reason == "")):
            self.reason[i] = text(i)

    def column(self, f: Field) -> pd.Series:
        """The source values of field ``f`` (its default where the map gives none)."""
        if f.name in self.values:
            v = self.values[f.name]
            return v if isinstance(v, pd.Series) else pd.Series(v)
        return pd.Series([f.default] * self.n, dtype=object)

    def type_fields(self) -> None:
        """Each problem field (and kernel field, when the kernel is read by its fields) by its kind."""
        op = self.op
        for group, fields in (("problem", op.problem_fields),
                              ("kernel", op.kernel_fields if self.kernel_by_fields else ())):
            for f in fields:
                raw_values = self.column(f)
                out, ok, allowed = _typed(f, raw_values)
                self.reject(~ok, lambda i, f=f, shown=raw_values, allowed=allowed, group=group:
                            f"bad {group} field: {f.name}={_show(shown.iloc[i])} is not {allowed}")
                self.typed[f.name] = out

    def kernel_codes(self, resolver: KernelResolver) -> None:
        """Kernels from their fields (formatted by the op's kernel id) or from a kernel_name column."""
        live = np.flatnonzero(self.reason == "")
        if self.kernel_by_fields:
            names = list(self.op.kernel_names)
            if names and len(live):
                kcodes, firsts = _distinct_rows([self.typed[k][live] for k in names])
                resolved = [resolver.resolve_fields({k: self.typed[k][live[j]] for k in names})
                            for j in firsts.tolist()]
                _assign_codes(resolved, kcodes, live, self.codes, self.reason)
        else:
            names_col = self.column(Field("kernel_name", "category")).to_numpy(dtype=object)[live]
            ncodes, unames = pd.factorize(pd.Series(names_col, dtype=object), use_na_sentinel=False)
            _assign_codes([resolver.resolve(u) for u in unames], ncodes, live, self.codes, self.reason)

    def type_headers(self, run_arch: str) -> None:
        """A per-row arch (dtype, layout) of the table: text, never empty; an arch names an arch config."""
        for h in self.headers:
            shown_h = self.values[h] if isinstance(self.values[h], pd.Series) else pd.Series(self.values[h])
            out_h, ok, allowed = _typed(Field(h, "category"), shown_h)
            self.reject(~ok, lambda i, h=h, shown_h=shown_h: f"bad {h}: {h}={_show(shown_h.iloc[i])} is not a config "
                                                             f"name (op.input.columns.{h} must give one on every row)")
            if h == "arch":  # the row's rules and hardware features read its arch config's constants
                archs = known_archs(run_arch)
                self.reject(~pd.Series(out_h).isin(archs).to_numpy(),
                            lambda i, shown_h=shown_h, archs=archs: f"bad arch: arch={_show(shown_h.iloc[i])} names "
                                                                   f"no arch config (one of {sorted(archs)})")
            self.typed[h] = out_h

    def check_flops(self) -> None:
        """FLOPs of the rows still kept (a rejected row's fields are placeholders); rows whose
        FLOPs cannot convert the metric are rejected (:func:`_flops_faults`)."""
        live = np.flatnonzero(self.reason == "")
        flops, failed = flops_of(self.op, pd.DataFrame({name: self.typed[name][live] for name in self.op.problem_names}))
        faults = np.full(self.n, "", dtype=object)
        faults[live] = _flops_faults(self.op, flops, failed)
        self.reject(faults != "", lambda i: faults[i])
        self.flops[live] = flops

    def rejects(self) -> list[Reject]:
        """The rejected records (source, reason, raw record); the kept rows are fixed from here on."""
        keep = self.reason == ""
        bad = np.flatnonzero(~keep)
        texts = _row_texts(self.raw.frame, bad)
        self.kept = np.flatnonzero(keep)
        return [Reject(str(source), self.reason[i], text)
                for i, source, text in zip(bad, self.raw.source_texts(bad), texts)]

    def of_kept(self, values: np.ndarray) -> np.ndarray:
        """``values`` of the kept rows (the usual chunk keeps all: the column itself, no copy)."""
        return values if len(self.kept) == self.n else values[self.kept]

    def measured(self) -> tuple[np.ndarray, np.ndarray]:
        """(metric in its canonical unit, invalid reason) of each kept row."""
        mapping, idx = self.mapping, self.kept

        def kept(name: str) -> pd.Series:
            v = self.values[name]
            return (v if isinstance(v, pd.Series) else pd.Series(np.asarray(v, dtype=object))).iloc[idx]

        reason = np.full(len(idx), "", dtype=object)
        if mapping.valid_column:
            reason = _by_value(kept(mapping.valid_column), lambda v: (
                "" if truth(v, mapping.true_values, mapping.false_values) else
                f"kernel failed: {mapping.valid_column}={_show(v)}"
                if truth(v, mapping.true_values, mapping.false_values) is False else
                f"bad validity value: {mapping.valid_column}={_show(v)} is none of {list(mapping.true_values)} "
                f"(valid) or {list(mapping.false_values)} (failed)"))
        target, factor = mapping.metric_factor()
        number, why = _judge_metric(kept(mapping.metric_column), mapping, target, factor)
        return number, np.where(reason == "", why, reason)

    def frame(self, run_id: str) -> pd.DataFrame:
        """The kept rows as the ingest row frame."""
        n = len(self.kept)
        number, reason = self.measured()
        out: dict[str, Any] = {name: self.of_kept(self.typed[name]) for name in (*self.op.problem_names,
                                                                                  *self.headers)}
        out["kernel"] = self.of_kept(self.codes)
        converted = _converted(self.mapping.metric_factor()[0], number, self.of_kept(self.flops), reason == "")
        out.update(tflops=converted["tflops"], latency_ms=converted["latency_ms"], bandwidth_gbs=np.full(n, math.nan),
                   invalid_reason=reason, run_id=np.full(n, run_id, dtype=object), repeats=np.ones(n, dtype=np.int64),
                   spread=np.full(n, math.nan), quantum_ms=np.full(n, math.inf), quantum_tflops=np.full(n, math.inf),
                   latency_known=converted["latency_known"])
        if self.raw.lines is not None:  # the source is built from the file and line when written
            out["line"] = self.of_kept(self.raw.lines)
        else:
            out["source"] = self.raw.source_texts(self.kept)
        # object columns stay object (pandas would convert the texts into its string type, a copy)
        # and numbers are not copied into one block per type
        return pd.DataFrame({k: pd.Series(v, dtype=object, copy=False) if isinstance(v, np.ndarray)
                             and v.dtype == object else v for k, v in out.items()}, copy=False)


def _converted(target: str, number: np.ndarray, flops: np.ndarray, good: np.ndarray) -> dict[str, np.ndarray]:
    """``tflops``, ``latency_ms`` and ``latency_known`` of rows whose metric is ``number`` in the
    canonical unit of ``target``, from their FLOPs where known (see the module docstring)."""
    known = np.isfinite(flops) & (flops > 0)
    with np.errstate(all="ignore"):
        if target == "latency_ms":
            latency = number
            tflops = np.where(known, flops / (latency * 1e9), 1.0 / latency)
            latency_known = np.ones(len(number), dtype=bool)
        else:
            tflops = number
            latency = np.where(known, flops / (tflops * 1e9), math.nan)
            latency_known = known | ~good
    out = {"tflops": np.where(good, tflops, 0.0), "latency_ms": np.where(good, latency, 0.0),
           "latency_known": latency_known}
    # a failed row keeps a real latency where one was measured (the table's convention)
    if target == "latency_ms":
        out["latency_ms"] = np.where(good | ~np.isfinite(number) | (number < 0), out["latency_ms"], number)
    return out


def known_archs(run_arch: str = "") -> frozenset[str]:
    """The arch names a table's ``arch`` column may hold: the packaged arch configs and the
    run's own arch (which may come from a user config dir)."""
    return _packaged_archs() | ({run_arch} if run_arch else set())


@functools.lru_cache(maxsize=1)
def _packaged_archs() -> frozenset[str]:
    return frozenset(p.name[:-5] for p in (resources.files("ckpred.conf") / "arch").iterdir()
                     if p.name.endswith(".yaml"))


def _distinct_rows(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(code of each row's value tuple, first row of each code), codes numbered by first
    appearance: each column factorized, the codes combined into one integer and factorized."""
    combined = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:
        codes, uniques = pd.factorize(column, use_na_sentinel=False)
        if len(uniques) > 1:
            combined = pd.factorize(combined * len(uniques) + codes)[0]
    codes, _ = pd.factorize(combined)
    firsts = np.zeros(codes.max() + 1 if len(codes) else 0, dtype=np.int64)
    firsts[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    return codes, firsts


def _by_value(values: pd.Series, fn: Any) -> np.ndarray:
    """``fn`` of each value, computed once per distinct value (object array)."""
    codes, uniques = pd.factorize(values, use_na_sentinel=False)
    out = np.empty(len(uniques), dtype=object)
    out[:] = [fn(u) for u in uniques]
    return out[codes] if len(values) else np.zeros(0, dtype=object)


def _assign_codes(resolved: list[int | str], which: np.ndarray, rows: np.ndarray, codes: np.ndarray,
                  reject_reason: np.ndarray) -> None:
    """Kernel codes (or reject reasons) of ``rows`` from the resolution of their distinct kernels."""
    if not len(rows):
        return
    failed_u = np.array([isinstance(r, str) for r in resolved], dtype=bool)
    code_u = np.array([-1 if isinstance(r, str) else r for r in resolved], dtype=np.int64)
    failed = failed_u[which]
    codes[rows[~failed]] = code_u[which[~failed]]
    reason_u = np.array([r if isinstance(r, str) else "" for r in resolved], dtype=object)
    reject_reason[rows[failed]] = reason_u[which[failed]]


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _row_texts(frame: pd.DataFrame, rows: np.ndarray) -> list[str]:
    """``column=value,...`` of each of ``rows`` (the raw record of a reject)."""
    if not len(rows):
        return []
    columns = [(str(c), frame.iloc[rows, j].to_numpy(dtype=object)) for j, c in enumerate(frame.columns)]
    return [",".join(f"{c}={_raw(v[k])}" for c, v in columns) for k in range(len(rows))]


def _raw(value: object) -> str:
    """A value of a reject's record as text: a whole number without ``.0`` (a JSON column of
    integers holds floats in a chunk where some record lacks it, and not in another)."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer() and abs(float(value)) < 2**53:
        return str(int(value))
    return str(value)


def _unread_texts(src: _Sources, idx: np.ndarray) -> dict[str, np.ndarray]:
    """The kept rows' values of each text column (once in the file) the op did not read."""
    out = {}
    for name in src.names:
        if name in src.used or src.counts.get(name, 0) != 1:
            continue
        column = src.frame[name]
        if column.dtype.kind == "O" or pd.api.types.is_string_dtype(column.dtype):
            out[name] = column.to_numpy(dtype=object)[idx]
    return out
