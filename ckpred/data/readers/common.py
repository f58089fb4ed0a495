"""What every reader shares: column buffers for measurement records, the kernel-name cache,
value conversion that never raises, and the reject record.

A reader walks one file and, for every measurement record it finds, either appends a row to
a :class:`RowBuffer` (possibly with an invalid reason known at read time) or appends a
:class:`Reject` (a record that cannot become a table row: no parseable kernel name, no
problem, another dtype...). Vectorised checks (NaN, negative, zero, TFLOPS vs latency) run
later on the whole buffer in :mod:`ckpred.data.ingest`.

Buffers are ``array`` columns, not lists of dicts, so a million-row log costs a few bytes per
value and no per-row pandas work.
"""

from __future__ import annotations

import bz2
import gc
import gzip
import io
import mmap
import os
import re
import stat
from array import array
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from itertools import repeat
from operator import is_
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Sequence, TypeAlias, cast

import numpy as np
import pandas as pd

from ckpred import expressions
from ckpred.errors import KernelNameError
from ckpred.kernels.base import OpDefinition
# the value conversions the readers use live with the other helpers every stage uses (an op's
# config is checked with them when composed); imported here under their historical home
from ckpred.util import FALSE_STRINGS, INT_LIMIT, TRUE_STRINGS, to_float, to_int, truth  # noqa: F401

#: Largest magnitude kept for an integer problem field (int64 range).
_INT_LIMIT = INT_LIMIT


@dataclass(frozen=True)
class Reject:
    """A record that could not become a table row."""

    source: str
    reason: str
    raw: str


# Kernel fields are stored as int64: a name with a larger number is refused, not overflowed.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class _NoDefault:
    """The type of :data:`_NO_DEFAULT` alone, so a column's types tell whether it holds it."""


#: Marks a kernel field without a default (``None`` can be a value a plug-in's name parser gives).
_NO_DEFAULT = _NoDefault()
#: Types of kernel field values that are never at fault (an int is when beyond int64).
_FAULTLESS_TYPES = frozenset((str, float, bool, type(None)))


class KernelResolver:
    """Kernel name -> row of the unique-kernel table, or the reason it cannot be used.

    Names are parsed once (a sweep repeats each of a few thousand names on every shape), the
    kernel's ``dtype``/``layout`` from the name are checked against the config, and every
    accepted name is normalised to the op's canonical form (``op.format_name``), so the same
    kernel written in two name forms merges into one row.
    """

    def __init__(self, op: OpDefinition, *, dtype: str | None, layout: str | None) -> None:
        self.op, self.dtype, self.layout = op, dtype, layout
        self._cache: dict[Any, int | str] = {}
        #: Parsed kernel fields of each accepted unique kernel, in code order.
        self.kernels: list[dict[str, Any]] = []
        self.canonical_names: list[str] = []
        self._by_canonical: dict[str, int] = {}
        self._frame: pd.DataFrame | None = None
        #: Each kernel field, in the op's order, and its default or ``_NO_DEFAULT``.
        self._field_names = tuple(f.name for f in op.kernel_fields)
        self._defaults = tuple(_NO_DEFAULT if f.default is None else f.default for f in op.kernel_fields)
        #: (key, the config's value) of the name parts checked against the config.
        self._config_checks = tuple((k, v) for k, v in (("dtype", dtype), ("layout", layout)) if v is not None)

    def resolve(self, name: object) -> int | str:
        """The kernel code (``int >= 0``) of ``name``, or a reject reason (``str``)."""
        if not isinstance(name, str):
            return f"missing kernel name: got {name!r}"
        hit = self._cache.get(name)
        if hit is None:
            self._resolve_new([name])
            hit = self._cache[name]
        return hit

    def resolve_all(self, names: list[Any]) -> list[int | str]:
        """:meth:`resolve` of each of ``names``; the new ones judged by the op's kernel rules in
        one vectorised pass (a sweep brings thousands of kernels at once)."""
        new = list(dict.fromkeys(n for n in names if isinstance(n, str) and n not in self._cache))
        if new:
            with _gc_paused():  # thousands of small containers, none of them cyclic garbage
                self._resolve_new(new)
        cache = self._cache  # holds every name now: a lookup, not a call of resolve, per name
        return [cache[n] if isinstance(n, str) else self.resolve(n) for n in names]

    def _resolve_new(self, names: list[str]) -> None:
        """Resolve ``names`` (distinct, not yet cached) into the cache.

        The kernel fields of the parsed names are checked and judged by the kernel rules a field
        at a time, over the column of its values in every name, rather than name by name.
        """
        parsed = [self._parse(n) for n in names]
        # Each field's value or default in the op's field order, one tuple per parsed name.
        rows = [tuple(map(p.get, self._field_names, self._defaults)) for p in parsed if not isinstance(p, str)]
        columns = list(zip(*rows))
        if _faultless_columns(columns):
            faults: Iterator[str] = repeat("")
        else:  # a field missing or beyond int64 somewhere: name the first one of each name
            found = [self._fault(row) for row in rows]
            rows = [row for row, fault in zip(rows, found) if not fault]
            columns, faults = list(zip(*rows)), iter(found)
        reasons = iter(kernel_rule_columns(self.op, dict(zip(self._field_names, columns)), len(rows)))
        clean = iter(rows)
        for name, got in zip(names, parsed):
            if isinstance(got, str):
                self._cache[name] = got
            elif fault := next(faults):
                self._cache[name] = fault
            else:
                self._cache[name] = self._add(dict(zip(self._field_names, next(clean))), name, got.get("dtype", ""),
                                              got.get("layout", ""), reason=next(reasons))

    def _fault(self, row: tuple[Any, ...]) -> str:
        """The reason to reject a name whose kernel fields are ``row``; empty when none."""
        for n, value in zip(self._field_names, row):  # in field order: the first field at fault is named
            if value is _NO_DEFAULT:
                return f"unparseable kernel name: the name gives no {n}"
            if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:  # (a bool is in range)
                return f"unparseable kernel name: {n}={value} is beyond int64"
        return ""

    def _parse(self, name: str) -> Any:
        """What the op's ``parse_name`` gives for ``name`` (a mapping), or the reason it is rejected."""
        try:
            parsed = self.op.parse_name(name)
        except KernelNameError as exc:
            return f"unparseable kernel name: {exc.reason}"
        except Exception as exc:  # a grammar bug must not stop ingestion; the row is kept in rejects
            return f"unparseable kernel name: {type(exc).__name__}: {exc}"
        for key, want in self._config_checks:
            got = parsed.get(key)
            if got is not None and got != want:
                return f"{key} mismatch: kernel name says {key}={got}, config has {key}={want}"
        return parsed

    def resolve_fields(self, fields: dict[str, Any]) -> int | str:
        """The kernel code of a kernel given by its fields (named by the op's kernel id), or a
        reject reason; cached per distinct field tuple like :meth:`resolve`."""
        key = tuple(sorted((k, repr(v)) for k, v in fields.items()))
        hit = self._cache.get(key)
        if hit is None:
            try:
                name = self.op.format_name(fields, dtype=self.dtype or "", layout=self.layout or "")
            except Exception as exc:  # a kernel id the op cannot format
                hit = f"unnamed kernel: the op cannot name {fields} ({type(exc).__name__}: {exc})"
            else:
                hit = self._add(dict(fields), name, "", "")
            self._cache[key] = hit
        return hit

    def _add(self, fields: dict[str, Any], name: str, dtype: str, layout: str, *, reason: str | None = None) -> int | str:
        why = kernel_rule_reason(self.op, fields) if reason is None else reason
        if why:  # no problem can make this kernel valid: no configuration of the op is this kernel
            return f"impossible kernel: {why}"
        try:
            canonical = self.op.format_name(fields, dtype=self.dtype or dtype, layout=self.layout or layout)
        except Exception:  # keep the given name when the op cannot format it back
            canonical = name
        code = self._by_canonical.get(canonical)
        if code is None:
            code = len(self.kernels)
            self._by_canonical[canonical] = code
            self.kernels.append(fields)
            self.canonical_names.append(canonical)
        return code

    def frame(self) -> pd.DataFrame:
        """Kernel fields and canonical ``kernel_name`` of every accepted kernel, by code.

        Built once per number of kernels (kernels are only ever appended); each call returns
        its own shallow copy, so a caller that sets or drops a column changes no other's frame.
        """
        if self._frame is None or len(self._frame) != len(self.kernels):
            frame = pd.DataFrame(self.kernels, columns=list(self.op.kernel_names))
            frame["kernel_name"] = self.canonical_names
            self._frame = frame
        return self._frame.copy(deep=False)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block (restored after it, whatever happens).

    Parsing a batch of new kernel names allocates a few small containers per name, none of
    them cyclic garbage; the full collections their allocations trigger walk every tracked
    object of the process and find nothing to free.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _kernel_rules(op: OpDefinition) -> list[tuple[Any, str]]:
    """The op's validity rules that read kernel fields only (no problem field, no ``hw``)."""
    cached = getattr(op, "_ckpred_kernel_rules", None)
    if cached is not None:
        return cached
    rules: list[tuple[Any, str]] = []
    config = getattr(op, "config", None)
    kernel_names = set(op.kernel_names)
    for i, rule in enumerate(getattr(config, "rules", None) or []):
        expr = expressions.parse(rule.expr, key=f"op.rules[{i}].expr")
        if expr.names and expr.names <= kernel_names and not expr.hw_names:
            rules.append((expr, str(rule.message)))
    try:
        op._ckpred_kernel_rules = rules  # type: ignore[attr-defined]
    except AttributeError:  # an op object that takes no attributes: recompute next time
        pass
    return rules


def kernel_rule_reason(op: OpDefinition, fields: dict[str, Any]) -> str:
    """The message of the first rule of ``op`` over kernel fields alone that ``fields`` fail.

    Such a rule holds or fails whatever the problem: a kernel failing it is one no
    configuration of the op can be (for example a 7x7x7 block tile over 3x3x3 warp tiles,
    against ``tile_m % (warp_m * warp_tile_m) == 0``). Empty when every such rule holds.
    """
    return kernel_rule_reasons(op, [fields])[0]


def kernel_rule_reasons(op: OpDefinition, kernels: list[dict[str, Any]]) -> list[str]:
    """:func:`kernel_rule_reason` of many kernels at once (one evaluation of each rule)."""
    if not _kernel_rules(op) or not kernels:
        return [""] * len(kernels)
    return kernel_rule_columns(op, {f.name: [k.get(f.name, f.default) for k in kernels] for f in op.kernel_fields},
                               len(kernels))


def kernel_rule_columns(op: OpDefinition, columns: dict[str, Sequence[Any]], count: int) -> list[str]:
    """:func:`kernel_rule_reasons` of ``count`` kernels given as their columns: each kernel field's
    value (or its default) in every kernel, by field name."""
    rules = _kernel_rules(op)
    if not rules or not count:
        return [""] * count
    categories = {f.name: f.categories for f in op.kernel_fields if f.kind == "category"}
    read = set().union(*(expr.names for expr, _ in rules))
    judged = np.ones(count, dtype=bool)  # a kernel missing a field the rules need is not judged
    values: dict[str, np.ndarray] = {}
    for f in op.kernel_fields:
        column = columns[f.name]
        # ``is None`` of each value, not ``==`` (a value may compare in its own way); a mask
        # only for a column that has one (seldom)
        has_none = any(map(is_, column, repeat(None)))
        if has_none:
            missing = np.fromiter(map(is_, column, repeat(None)), dtype=bool, count=count)
            judged &= ~missing
        if f.name not in read:  # only whether the kernel has it
            continue
        raw = np.empty(count, dtype=object)
        raw[:] = column
        if has_none:
            raw[missing] = raw[~missing][0] if (~missing).any() else 0
        values[f.name] = (f.encode(raw).astype(np.float64) if f.kind in ("category", "bool")
                          else np.asarray(raw, dtype=np.float64))
    # lazy: ckpred.features.base imports scikit-learn (~1.5 s), which reading files does not need otherwise
    from ckpred.features.base import NumpyOps

    out = np.full(count, "", dtype=object)
    for expr, message in rules:
        with np.errstate(all="ignore"):
            ok = np.broadcast_to(np.asarray(expr.evaluate_bool({n: values[n] for n in expr.names}, {},
                                                               NumpyOps(count), categories=categories),
                                            dtype=bool), (count,))
        out[judged & ~ok & (out == "")] = message
    return out.tolist()


def _faultless_columns(columns: Iterable[Sequence[Any]]) -> bool:
    """Whether no value of any of ``columns`` is ``_NO_DEFAULT`` or an int beyond int64.

    By the set of each column's types (a column of ints and bools by its least and greatest
    value), so a thousand names cost a few calls per field rather than a test per value.
    """
    for column in columns:
        types = set(map(type, column))
        if types <= _FAULTLESS_TYPES:
            continue
        if not types <= {int, bool} or min(column) < _INT64_MIN or max(column) > _INT64_MAX:
            return False
    return True


#: A column of a :class:`RowBuffer`: an array grown row by row, or a numpy array set whole.
IntColumn: TypeAlias = "array[int] | np.ndarray"
FloatColumn: TypeAlias = "array[float] | np.ndarray"


class RowBuffer:
    """Column buffers of the rows read from one file.

    Parameters
    ----------
    problem_names
        The op's problem fields, in order.
    quantum_ms, quantum_tflops
        Half the printing step of latency and TFLOPS in this format (the streaming log prints
        2 decimals, so 0.005); widens the TFLOPS/latency consistency check.
    """

    def __init__(self, problem_names: tuple[str, ...], *, quantum_ms: float = 0.0,
                 quantum_tflops: float = 0.0) -> None:
        self.problem_names = problem_names
        self.quantum_ms, self.quantum_tflops = quantum_ms, quantum_tflops
        # arrays while rows are added one by one; numpy arrays when a vectorised reader sets a
        # column whole (or :meth:`merged` concatenates them)
        self.line: IntColumn = array("q")
        self.kernel: IntColumn = array("q")
        self.problem: list[IntColumn] = [array("q") for _ in problem_names]
        self.tflops: FloatColumn = array("d")
        self.latency: FloatColumn = array("d")
        self.bandwidth: FloatColumn = array("d")
        #: Invalid reasons known at read time, by row index (most rows have none).
        self.reasons: dict[int, str] = {}
        #: Optional per-row source labels overriding ``file:line`` (canonical parquet input).
        self.sources: list[str] | None = None
        self.run_ids: list[str] | None = None
        self.repeats: IntColumn | None = None
        self.spreads: FloatColumn | None = None

    def __len__(self) -> int:
        return len(self.line)

    @classmethod
    def merged(cls, buffers: list["RowBuffer"]) -> "RowBuffer":
        """One buffer of the rows of ``buffers`` (same op and format), ordered by line."""
        filled = [b for b in buffers if len(b)]
        if len(filled) == 1:  # already in line order
            return filled[0]
        first = buffers[0]
        out = cls(first.problem_names, quantum_ms=first.quantum_ms, quantum_tflops=first.quantum_tflops)
        line = np.concatenate([np.asarray(b.line, dtype=np.int64) for b in buffers])
        order = np.argsort(line, kind="stable")
        out.line = line[order]

        def cat(values: list[Any], dtype: Any) -> np.ndarray:
            return np.concatenate([np.asarray(v, dtype=dtype) for v in values])[order]

        out.kernel = cat([b.kernel for b in buffers], np.int64)
        out.problem = [cat([b.problem[i] for b in buffers], np.int64) for i in range(len(first.problem_names))]
        out.tflops = cat([b.tflops for b in buffers], np.float64)
        out.latency = cat([b.latency for b in buffers], np.float64)
        out.bandwidth = cat([b.bandwidth for b in buffers], np.float64)
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order))
        offset = 0
        for b in buffers:
            for i, reason in b.reasons.items():
                out.reasons[int(position[offset + i])] = reason
            offset += len(b)
        return out

    def add(self, line: int, kernel: int, problem: tuple[int, ...] | list[int], tflops: float,
            latency: float, bandwidth: float, reason: str = "") -> None:
        """Append one row; ``reason`` marks it invalid already (rows are added to a buffer
        whose columns are still arrays, hence the ignores)."""
        if reason:
            self.reasons[len(self.line)] = reason
        self.line.append(line)  # type: ignore[union-attr]
        self.kernel.append(kernel)  # type: ignore[union-attr]
        for column, value in zip(self.problem, problem):
            column.append(value)  # type: ignore[union-attr]
        self.tflops.append(tflops)  # type: ignore[union-attr]
        self.latency.append(latency)  # type: ignore[union-attr]
        self.bandwidth.append(bandwidth)  # type: ignore[union-attr]


def sorted_rejects(rejects: list[Reject]) -> list[Reject]:
    """``rejects`` of one file in line order (``source`` is ``file:line``; stable)."""
    return sorted(rejects, key=lambda r: int(r.source.rsplit(":", 1)[1]))


@dataclass
class ReadContext:
    """What a reader needs besides the file: the op, the shared kernel resolver, the config's
    dtype/layout (to reject rows of another kind) and the label used in ``source``."""

    op: OpDefinition
    resolver: KernelResolver
    dtype: str
    layout: str
    arch: str
    #: How the file is named in ``source`` (``<label>:<line>``) and messages.
    label: str


@dataclass
class FileRead:
    """Rows and rejects read from one file."""

    rows: RowBuffer
    rejects: list[Reject]
    #: Records the file's own metadata says it holds (``None`` = it does not say), and how
    #: many record objects were found; a shortfall is a truncated file, reported by ingest.
    declared_records: int | None = None
    found_records: int | None = None
    #: Rows already as the ingest row frame (instead of ``rows``), for readers of tables whose
    #: problem fields are not all integers.
    frame: pd.DataFrame | None = None


@dataclass
class RawTable:
    """What a table reader returns: the file's records as source columns, not yet mapped.

    A table reader (CSV, Parquet, JSON lines, MIOpen find-db, Kernel Tuner cache) knows the
    file's syntax but not the op: the op's ``input`` section
    (:mod:`ckpred.data.mapping`) turns these columns into canonical rows.
    """

    #: One row per measurement record, with the file's own column names.
    frame: pd.DataFrame
    #: ``file:line`` (or ``file:row n``) of each row, for ``source`` and rejects; ``None`` when
    #: the rows are given by ``lines`` instead (``<label>:<line>``, built only when written).
    sources: np.ndarray | None = None
    #: Records that are not rows at all (malformed lines, truncated objects).
    rejects: list[Reject] = field(default_factory=list)
    #: Measurement records the file says it holds (a header's count), when it says so; a
    #: reader compares it with what it read and reports the difference as a reject.
    declared_records: int | None = None
    #: Bytes of (decompressed) text these records were read from; 0 when the reader does not
    #: say (ingest then counts the file's size).
    input_bytes: int = 0
    #: The line of each row (int64), when ``sources`` is ``None``; ``label`` names the file.
    lines: np.ndarray | None = None
    label: str = ""

    def source_texts(self, at: np.ndarray | None = None) -> np.ndarray:
        """``source`` of the rows (at positions ``at``) as text."""
        if self.sources is not None:
            return np.asarray(self.sources, dtype=object)[at] if at is not None else np.asarray(self.sources,
                                                                                               dtype=object)
        assert self.lines is not None  # a table without sources has lines
        lines = self.lines if at is None else self.lines[at]
        return np.asarray([f"{self.label}:{n}" for n in lines.tolist()], dtype=object)


#: Magic bytes of the compressions a table file may use.
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bz2"}


def compression(path: Path) -> str | None:
    """``gzip``, ``bz2`` or ``None`` (plain), from the file's first bytes."""
    with open(path, "rb") as fh:
        head = fh.read(3)
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    return None


def open_binary(path: Path) -> IO[bytes]:
    """``path`` opened for reading bytes, decompressed when it is gzip or bz2."""
    kind = compression(path)
    if kind == "gzip":
        return cast(IO[bytes], gzip.open(path, "rb"))
    if kind == "bz2":
        return bz2.open(path, "rb")
    return open(path, "rb")


def read_head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` after decompression ('' when it is damaged)."""
    try:
        with open_binary(path) as fh:
            return fh.read(size)
    except (OSError, EOFError, ValueError):
        return b""


def arch_for_device(device: str) -> str:
    """The packaged arch config whose ``product`` names ``device`` (``""`` when none or several).

    A device is named by its model word (``W7800``, ``MI250X``; for ``AMD Radeon PRO W7800`` the
    last word); an arch config matches when that word is one of the words of its ``product``.
    The arch configs are the one record of which product is which ISA.
    """
    words = re.findall(r"[A-Za-z0-9+]+", device.upper())
    if not words:
        return ""
    model = words[-1]
    matches = []
    for entry in (resources.files("ckpred.conf") / "arch").iterdir():
        if not entry.name.endswith(".yaml"):
            continue
        text = entry.read_text()
        found = re.search(r"^product:\s*(.+)$", text, re.MULTILINE)
        if found and model in re.findall(r"[A-Za-z0-9+]+", found.group(1).upper()):
            matches.append(entry.name[:-5])
    return matches[0] if len(matches) == 1 else ""


def line_spans(fh: IO[bytes], chunk_bytes: int) -> Iterator[tuple[bytearray | mmap.mmap, int, int]]:
    """Blocks of whole lines of about ``chunk_bytes`` from ``fh`` (a seekable binary file), as
    ``(buffer, start, end)``: ``buffer[start:end]`` is whole lines (the last one without a
    newline only at the end of the file; a line longer than ``chunk_bytes`` makes a longer
    block). ``buffer`` has the methods ``find`` and ``rfind`` and slices as bytes; its bytes
    are read through ``memoryview(buffer)``. A caller keeps nothing of a block, or of a view
    of it, past the next one.

    A regular file is memory-mapped a block at a time while the system grants a read lease on
    it (:func:`_mapped_spans`); any other stream, or a file it cannot lease, is read into one
    buffer (:func:`_read_spans`). A file that grows meanwhile is read to its new end; a file
    found shorter than it was (another process truncated or rewrote it) is refused, naming
    it (:class:`FileShrankError`), before another block is read and at the end: the read
    never ends early with part of the lines as if they were all.
    """
    return _mapped_spans(fh, chunk_bytes) if _mappable(fh, chunk_bytes) else _read_spans(fh, chunk_bytes)


class FileShrankError(OSError):
    """A file became shorter while it was being read (truncated or rewritten by another process)."""

    def __init__(self, name: str, was: int, now: int) -> None:
        self.path = name
        self.message = (f"the file shrank while being read (from {was:,} to {now:,} bytes; another process "
                        "truncated or rewrote it): read it again once it is complete")
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class _Size:
    """The largest size a file being read has had; refuses it when it is found shorter."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fd = fh.fileno()
        self.name = str(getattr(fh, "name", "the file"))
        info = os.fstat(self.fd)
        self.largest = info.st_size
        #: A regular file that tells its size (those of ``/proc`` say 0 whatever they hold).
        self.sized = stat.S_ISREG(info.st_mode) and info.st_size > 0

    def now(self, offset: int = 0) -> int:
        """The file's size now (at least ``offset``, the bytes read so far, or it shrank)."""
        size = os.fstat(self.fd).st_size
        if self.sized and size < max(self.largest, offset):
            raise FileShrankError(self.name, max(self.largest, offset), size)
        self.largest = max(self.largest, size)
        return size


#: Bytes of a memory page: :func:`_read_spans` reads a block to the same offset within a page
#: as it has in the file.
_PAGE = 4096


def _read_spans(fh: IO[bytes], chunk_bytes: int, watch: "_Size | None" = None) -> Iterator[tuple[bytearray, int, int]]:
    """The blocks of :func:`line_spans` read into one buffer, again for each block (a new
    object of ``chunk_bytes`` per block costs more in fresh memory than the read itself).

    A block's partial last line is not copied off: the stream is sought back to its start,
    so it begins the next block. Each block is read to the offset within a memory page that
    it has in the file: the system copies a file's cached pages to a buffer at the same
    offset faster than to one shifted by a few bytes. The buffer is no larger than what is
    left of the file when it starts (a small file does not cost a chunk of memory; a file
    that grows meanwhile is read in more blocks). A regular file's size is checked before
    each block and at the end (:class:`FileShrankError`; ``watch``: the caller's, when it read
    the first blocks itself).
    """
    size = max(int(chunk_bytes), 1)
    try:
        watch = watch or _Size(fh)
        if watch.sized:  # not a pipe, nor a file that tells no size
            size = max(1, min(size, watch.largest - fh.tell()))
    except (OSError, ValueError):  # not a file of the system (an in-memory stream): a whole chunk
        watch = None
    buffer = bytearray(size + _PAGE)
    view = memoryview(buffer)
    base = np.frombuffer(buffer, dtype=np.uint8).ctypes.data
    while True:
        if watch is not None:
            watch.now(fh.tell())
        start = (fh.tell() - base) % _PAGE
        got = fh.readinto(view[start:start + size])  # type: ignore[attr-defined]
        if not got:
            if watch is not None:
                watch.now(fh.tell())  # a file cut short ends the read here: refused, not a partial table
            return
        block, stop = buffer, start + got
        end = block.rfind(b"\n", start, stop) + 1
        while end == 0:  # no line end yet: a long line (or the file's last line)
            more = fh.read(size)
            if not more:
                end = stop
                break
            block = block[start:stop] + more  # a new buffer (the shared one keeps its size)
            start, stop = 0, len(block)
            end = block.rfind(b"\n") + 1
        if end < stop:
            fh.seek(end - stop, 1)
        yield block, start, end


#: Largest block mapped: a block is processed while its lease holds, and the system breaks a
#: lease a writer waits on after ``/proc/sys/fs/lease-break-time`` (45 s by default); larger
#: chunks are read instead.
_MAX_MAPPED = 256 << 20


def _mappable(fh: IO[bytes], chunk_bytes: int = 0) -> bool:
    """Whether ``fh`` reads a regular file's own bytes (not a pipe, a decompressing stream or
    an in-memory one) that the system can map: a file that tells no size (as those of
    ``/proc`` do), a file system without maps, or a block larger than :data:`_MAX_MAPPED` is
    read instead."""
    raw = fh.raw if isinstance(fh, io.BufferedReader) else fh
    if not isinstance(raw, io.FileIO) or chunk_bytes > _MAX_MAPPED:
        return False
    try:
        info = os.fstat(raw.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            return False
        mmap.mmap(raw.fileno(), min(info.st_size, mmap.PAGESIZE), access=mmap.ACCESS_READ).close()
    except (OSError, ValueError):
        return False
    return True


def _lease(fd: int) -> bool:
    """Take a read lease on ``fd``; False when the system refuses one.

    While the lease is held, another process that opens the file for writing or truncates it
    waits until the lease is released (:func:`_release`), so the pages of a mapped block stay
    there while it is read. The system refuses a lease on a file open for writing (a writer
    still appending), on another user's file and on file systems without leases. The notice
    the system sends when someone waits is delivered as SIGURG, which a process ignores by
    default (the default SIGIO would end it): ckpred does not need it, the lease is released
    after each block anyway.
    """
    import fcntl  # lazy: Unix only (leases are a Linux optimisation; elsewhere none is taken)
    import signal

    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except (OSError, AttributeError):  # refused, or not Linux
        return False
    return True


def _release(fd: int) -> None:
    import fcntl  # lazy: Unix only, as in _lease

    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError:  # the file is closed already (its lease went with it)
        pass


def _mapped_spans(fh: IO[bytes], chunk_bytes: int) -> Iterator[tuple[mmap.mmap | bytearray, int, int]]:
    """The blocks of :func:`line_spans` as read-only maps of the file, one at a time.

    The readers take their lines straight from the system's cached pages: no copy into a
    buffer, and no fresh buffer memory to fault in. A block is mapped from the page boundary
    at or before its first line (a map starts on one) and unmapped when the next is asked
    for, so the mapped pages, which count in the process's resident memory, stay within about
    one chunk. A line longer than the chunk gets a longer map; a file that grows meanwhile is
    read to its new end. When done, ``fh`` is at the end of what was read.

    A mapped page past the end of a file that another process cut shorter cannot be read:
    the system would stop the process (SIGBUS). So a block is mapped only under a read lease
    (:func:`_lease`): a truncation waits until the block is done, and the size is checked
    (:class:`_Size`) once the lease is held, before the block is mapped. Where no lease is
    granted (a writer has the file open, another user's file, a file system without leases)
    the rest of the file is read into a buffer (:func:`_read_spans`), where a truncation only
    shortens a read.
    """
    size = max(int(chunk_bytes), 1)
    fd = fh.fileno()
    offset = fh.tell()
    watch = _Size(fh)
    leased = False
    try:
        while True:
            if not _lease(fd):
                fh.seek(offset)
                yield from _read_spans(fh, chunk_bytes, watch)
                offset = fh.tell()
                return
            leased = True
            total = watch.now(offset)
            if offset >= total:
                return
            base = offset - offset % mmap.ALLOCATIONGRANULARITY
            start = offset - base
            length = min(total - base, start + size)
            while True:
                mapped = mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=base)
                end = mapped.rfind(b"\n", start) + 1
                if end or base + length == total:
                    break
                mapped.close()  # no line end yet: a line longer than the chunk
                length = min(total - base, start + 2 * (length - start))
            end = end or length  # the file's last line, without a newline
            yield mapped, start, end
            offset = base + end
            try:
                mapped.close()
            except BufferError:  # a view of the block is still alive: the map goes with it
                pass
            _release(fd)
            leased = False
    finally:
        if leased:
            _release(fd)
        if not fh.closed:
            fh.seek(offset)


def decode_line(raw: bytes) -> str:
    """One line as text: UTF-8 (bad bytes replaced), a leading BOM and the line end removed."""
    text = raw.decode("utf-8", "replace").rstrip("\r\n")
    return text[1:] if text.startswith("\ufeff") else text

