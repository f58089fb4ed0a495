"""Checking rows: the per-row value checks of each chunk, and per partition the op's rules
(a problem no kernel may run) and the text columns the op does not read (:class:`HiddenFields`)."""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ckpred.data.ingestion.options import IngestOptions
from ckpred.data.ingestion.rows import Texts, array_of, first_rows, group_ids, set_column
from ckpred.data.mapping import HIDDEN_FIELD_MAX_VALUES, op_flops
from ckpred.data.readers.common import KernelResolver
from ckpred.util import to_float
from ckpred.errors import ConfigValueError, InputFileError
from ckpred.kernels.base import OpDefinition
from ckpred.schema import arch_config

#: Relative tolerance of the check ``tflops * latency == FLOPs`` (beyond printing steps).
CONSISTENCY_RTOL = 0.02


# -- values, per chunk -------------------------------------------------------------------------
class _Marks:
    """Reasons of a chunk's rows, the first one of a row wins (codes into the run's texts)."""

    def __init__(self, reason: np.ndarray, texts: Texts) -> None:
        self.reason, self.texts = reason, texts
        self.free = reason == 0

    def mark(self, mask: np.ndarray, text: str | Callable[..., str]) -> None:
        """Give the rows of ``mask`` that have no reason yet ``text`` (or ``text(row)``)."""
        hit = np.flatnonzero(mask & self.free)
        if callable(text):
            for i in hit.tolist():
                self.reason[i] = self.texts.code(text(i))
        elif len(hit):
            self.reason[hit] = self.texts.code(text)
        self.free[hit] = False


def validate(rows: pa.Table, op: OpDefinition, texts: Texts) -> pa.Table:
    """Mark rows invalid (first reason wins) and zero the TFLOPS of every invalid row."""
    t = np.asarray(array_of(rows, "tflops"), dtype=np.float64)
    lat = np.asarray(array_of(rows, "latency_ms"), dtype=np.float64)
    bw = np.asarray(array_of(rows, "bandwidth_gbs"), dtype=np.float64)
    marks = _Marks(np.array(array_of(rows, "reason"), dtype=np.int32), texts)
    # A throughput metric without a FLOPs formula gives no latency: NaN there is not a defect.
    latency_known = (np.asarray(pc.fill_null(rows.column("latency_known"), True).to_numpy(zero_copy_only=False),
                                dtype=bool) if "latency_known" in rows.column_names else np.ones(len(rows), dtype=bool))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        _mark_values(marks, t, lat, bw, latency_known)
        if marks.free.any():
            _mark_inconsistent(marks, rows, op, t, lat)
    return _with_marks(rows, marks, t, lat, bw)


def _mark_values(marks: _Marks, t: np.ndarray, lat: np.ndarray, bw: np.ndarray, latency_known: np.ndarray) -> None:
    """NaN, infinite, negative and zero values."""
    for name, v, zero_bad in (("tflops", t, True), ("latency_ms", lat, False)):
        marks.mark(np.isnan(v) & (latency_known if name == "latency_ms" else True), f"NaN value: {name}")
        marks.mark(np.isinf(v), lambda i, v=v, name=name: f"infinite value: {name}={v[i]}")
        marks.mark(v < 0, lambda i, v=v, name=name: f"negative value: {name}={v[i]}")
        if zero_bad:
            marks.mark(v == 0, "zero tflops: a kernel that ran cannot have 0 TFLOPS")
    marks.mark(np.isinf(bw), lambda i: f"infinite value: bandwidth_gbs={bw[i]}")
    marks.mark(bw < 0, lambda i: f"negative value: bandwidth_gbs={bw[i]}")


def _mark_inconsistent(marks: _Marks, rows: pa.Table, op: OpDefinition, t: np.ndarray, lat: np.ndarray) -> None:
    """TFLOPS that disagrees with latency and the problem's FLOPs, beyond the printing steps."""
    # the columns as they are (to_pandas would copy them into one block first)
    flops = op_flops(op, pd.DataFrame({c: array_of(rows, c) for c in op.problem_names}, copy=False))
    qt = np.asarray(array_of(rows, "quantum_tflops"), dtype=np.float64)
    ql = np.asarray(array_of(rows, "quantum_ms"), dtype=np.float64)
    lo = np.maximum(t - qt, 0.0) * np.maximum(lat - ql, 0.0) * 1e9
    hi = (t + qt) * (lat + ql) * 1e9
    ok = (hi >= flops * (1 - CONSISTENCY_RTOL)) & (lo <= flops * (1 + CONSISTENCY_RTOL))
    known = np.isfinite(flops)

    def inconsistent(i: int) -> str:
        implied = flops[i] / (lat[i] * 1e9) if lat[i] > 0 else math.inf
        return (f"inconsistent tflops: tflops={t[i]:g} but latency_ms={lat[i]:g} and the problem's "
                f"{flops[i]:.6g} FLOPs give {implied:.6g} (tolerance {CONSISTENCY_RTOL:.0%})")

    marks.mark(known & ~ok, inconsistent)


def _with_marks(rows: pa.Table, marks: _Marks, t: np.ndarray, lat: np.ndarray, bw: np.ndarray) -> pa.Table:
    """The rows with their reasons and validity, without the check's own columns."""
    valid = marks.free
    out = rows.drop_columns([c for c in ("quantum_ms", "quantum_tflops", "latency_known") if c in rows.column_names])
    out = set_column(out, "reason", marks.reason)
    out = set_column(out, "is_valid", pa.array(valid))
    if not valid.all():
        # The canonical table's convention for failures: TFLOPS 0, latency a real number.
        out = set_column(out, "tflops", np.where(valid, t, 0.0))
        bad_latency = ~valid & ~(np.isfinite(lat) & (lat >= 0))  # valid rows of unknown latency keep NaN
        out = set_column(out, "latency_ms", np.where(bad_latency, 0.0, lat))
        out = set_column(out, "bandwidth_gbs", np.where(~valid & ~(np.isfinite(bw) & (bw >= 0)), np.nan, bw))
    return out


# -- the op's rules, per partition ---------------------------------------------------------------
def rule_kernels(resolver: KernelResolver, op: OpDefinition) -> pd.DataFrame:
    """The kernel fields of every resolved kernel, by code, as the op's rules read them (text
    fields as categoricals: a row's kernel fields are then a take of small codes)."""
    kernels = resolver.frame()
    return kernels.astype({c: "category" for c in op.kernel_names if not pd.api.types.is_numeric_dtype(kernels[c])
                           and not pd.api.types.is_bool_dtype(kernels[c])})[list(op.kernel_names)]


class _Judge:
    """The op's rules on the valid measurements of a partition (see :func:`check_rules`)."""

    def __init__(self, rows: pa.Table, op: OpDefinition, kernels: pd.DataFrame, options: IngestOptions) -> None:
        self.rows, self.op, self.kernels, self.options = rows, op, kernels, options
        valid = array_of(rows, "is_valid")
        self.idx = np.flatnonzero(valid)
        every = len(self.idx) == len(valid)  # the usual part: the columns as they are, not copies of them
        of_valid: Callable[[np.ndarray], np.ndarray] = (lambda v: v) if every else (lambda v: v[self.idx])
        self.codes = of_valid(array_of(rows, "kernel"))
        # a table that gives each row its arch is judged with each arch's own constants
        per_row_arch = "arch" in rows.column_names and "arch" not in op.problem_names
        self.row_arch = of_valid(array_of(rows, "arch")) if per_row_arch else None
        self.problem_id = group_ids([*(of_valid(array_of(rows, c)) for c in op.problem_names),
                                     *([self.row_arch] if per_row_arch else [])])

    def __call__(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(may run, rule message) of the valid measurements at positions ``at``."""
        op, arch = self.op, self.options.rules_arch
        ok = np.ones(len(at), dtype=bool)
        why = np.full(len(at), "", dtype=object)
        problems = self.rows.select(list(op.problem_names)).take(pa.array(self.idx[at])).to_pandas()
        kernel_rows = self.kernels.iloc[self.codes[at]].reset_index(drop=True)
        names = (self.row_arch[at] if self.row_arch is not None
                 else np.full(len(at), getattr(arch, "name", arch), dtype=object))
        for name in pd.unique(names):
            sel = np.flatnonzero(names == name)
            with np.errstate(all="ignore"):
                got, text = op.validity(problems.iloc[sel].reset_index(drop=True),
                                        kernel_rows.iloc[sel].reset_index(drop=True),
                                        arch=arch_named(name, arch), dtype=self.options.dtype,
                                        layout=self.options.layout)
            ok[sel] = np.asarray(got, dtype=bool)
            why[sel] = np.asarray(text, dtype=object)
        return ok, why

    def dead(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(positions among the valid rows, rule message) of the measurements of problems no
        measured kernel may run; ``None`` when there are none."""
        # A problem is alive when one measured kernel may run: judge one measurement per problem
        # first, then every measurement of the problems whose first one is ruled out.
        problem_id = self.problem_id
        first = first_rows(problem_id)
        ok_first, _ = self(first)
        suspect = np.zeros(problem_id.max() + 1, dtype=bool)
        suspect[problem_id[first[~ok_first]]] = True
        if not suspect.any():
            return None
        at = np.flatnonzero(suspect[problem_id])
        ok, why = self(at)
        runnable = np.bincount(problem_id[at], weights=ok.astype(np.float64), minlength=problem_id.max() + 1)
        dead = runnable[problem_id[at]] == 0
        return (at[dead], why[dead]) if dead.any() else None


def check_rules(rows: pa.Table, op: OpDefinition, kernels: pd.DataFrame, texts: Texts,
                options: IngestOptions) -> pa.Table:
    """Mark invalid the measurements of a problem the op's rules say no kernel can run.

    When the op's validity rules (:meth:`OpDefinition.validity`) refuse *every* kernel measured
    valid on a problem -- a degenerate problem such as ``split_k=0`` -- the measurements
    contradict the op: they become invalid with the reason ``rule violation: <rule message>``.
    A problem some measured kernel may run is left as measured (a rule that is stricter than
    the hardware must not erase data). An op whose rules cannot be evaluated here (a rule
    needing an arch constant the run does not have) is not judged, with a warning. ``kernels``
    are the resolved kernels' fields (:func:`rule_kernels`).
    """
    if not array_of(rows, "is_valid").any():
        return rows
    judge = _Judge(rows, op, kernels, options)
    try:
        found = judge.dead()
    except (ValueError, KeyError, NotImplementedError) as exc:  # no arch constants for a rule, or no rules:
        # kept as measured, and said so (a rule no table can evaluate -- ordering a categorical
        # -- is refused when the op is composed)
        _warn_once(f"op {op.name!r}: the validity rules were not judged on this table ({exc})")
        return rows
    if found is None:
        return rows
    at, why = found
    bad = judge.idx[at]
    reason = np.array(array_of(rows, "reason"), dtype=np.int32)
    reason[bad] = [texts.code(f"rule violation: {w or 'the op rules out every kernel for this problem'}")
                   for w in why]
    rows = set_column(rows, "reason", reason)
    is_valid = np.array(array_of(rows, "is_valid"), dtype=bool)
    is_valid[bad] = False
    tflops = np.array(array_of(rows, "tflops"), dtype=np.float64)
    tflops[bad] = 0.0
    return set_column(set_column(rows, "is_valid", pa.array(is_valid)), "tflops", tflops)


@functools.lru_cache(maxsize=64)
def _warn_once(message: str) -> None:
    """Log ``message`` once per process (a table's partitions would repeat it)."""
    logging.getLogger("ckpred.data.ingest").warning(message)


def arch_named(name: Any, run_arch: Any) -> Any:
    """The arch config of a row's arch name: the run's when it is that one, else the packaged
    config of that name, else the name alone (rules needing its constants are then not judged)."""
    if name == getattr(run_arch, "name", run_arch):
        return run_arch
    try:
        return arch_config(str(name))
    except ConfigValueError:
        return name


# -- text columns the op does not read, per partition -------------------------------------------
def check_unread(rows: pa.Table, op: OpDefinition, per_row: Sequence[str], hidden: HiddenFields,
                 texts: Texts) -> None:
    """Refuse a text column the op does not read that differs between repeats of one problem
    and kernel in this partition (:class:`HiddenFields`)."""
    carried = {c: array_of(rows, c) for c in rows.column_names if c.startswith(HiddenFields.PREFIX)}
    if not carried or rows.num_rows < 2:
        return
    carried = {c: np.nan_to_num(np.asarray(v, dtype=np.float64), nan=0).astype(np.int64) for c, v in carried.items()}
    group = group_ids([*(array_of(rows, c) for c in (*op.problem_names, *per_row)), array_of(rows, "kernel")])
    hidden.check(carried, group, array_of(rows, "file"), texts.labels, texts.values, op)


class HiddenFields:
    """Text columns the op does not read, judged over whole files across their chunks.

    A text column whose values are few (at most :data:`HIDDEN_FIELD_MAX_VALUES` in each file
    that has it; more are free text, not judged) and not numbers is a field the op does not
    declare -- a ``dtype`` column read by an op without a dtype field. Such a column that
    differs between records the op would merge as repeats of one (problem, kernel) would fold
    different problems into one median: ingest refuses it. Repeats may lie in different chunks
    of a file, or in different files (one file per dtype), so each chunk's values travel with
    its rows as codes (:meth:`codes`) and are compared where the repeats are merged
    (:meth:`check`).
    """

    #: Prefix of the row columns carrying a column's codes.
    PREFIX = "unread:"

    def __init__(self) -> None:
        #: (file, column) -> its distinct values so far (dropped once there are too many).
        self.distinct: dict[tuple[int, str], set[Any]] = {}
        self.too_many: set[tuple[int, str]] = set()

    def codes(self, file: int, unread: Mapping[str, np.ndarray], code_of: Any) -> dict[str, np.ndarray]:
        """Row columns of one chunk of file ``file``: each candidate column's values as codes
        (``code_of``: texts -> int32 codes, 0 for a missing value)."""
        out = {}
        for name, values in unread.items():
            key = (file, name)
            if key in self.too_many:
                continue
            seen = self.distinct.setdefault(key, set())
            seen.update(v for v in pd.unique(values) if v is not None and v == v and v != "")
            if len(seen) > HIDDEN_FIELD_MAX_VALUES:  # free text (notes, times): not a field
                self.too_many.add(key)
                del self.distinct[key]
                continue
            out[self.PREFIX + name] = code_of(values)
        return out

    def judged(self, name: str) -> bool:
        """Whether column ``name`` is a field the op does not declare: two values or more in the
        files where it has few, not all of them numbers (ids, counts, times are measurements)."""
        seen = set().union(*(v for (_, n), v in self.distinct.items() if n == name))
        return len(seen) >= 2 and not all(to_float(v) is not None for v in seen)

    def check(self, columns: Mapping[str, np.ndarray], group: np.ndarray, file: np.ndarray, labels: Sequence[str],
              texts: Sequence[str], op: OpDefinition) -> None:
        """Refuse a carried column that differs within one group of ``group`` (the merge's
        (problem, kernel) groups; ``file``: each row's file index)."""
        for column, codes in columns.items():
            name = column[len(self.PREFIX):]
            if not self.judged(name):
                continue
            few = np.array([(f, name) in self.distinct for f in range(len(labels))] or [False], dtype=bool)
            at = np.flatnonzero((codes > 0) & few[file])
            if not len(at):
                continue
            pairs = pd.DataFrame({"g": group[at], "v": codes[at]}).drop_duplicates()
            counts = pairs["g"].value_counts()
            if (counts > 1).any():
                g = counts.index[counts.to_numpy() > 1][0]
                shown = sorted(texts[c] for c in pairs.loc[pairs["g"] == g, "v"])
                where = labels[int(file[at[group[at] == g][0]])]
                raise InputFileError(where, f"column {name!r} is not read by op {op.name!r} but differs between "
                                            f"records the op would merge as repeats of one problem and kernel (values "
                                            f"{shown}); declare it a problem field in the op (or map/filter it) so "
                                            f"different problems are not merged")
