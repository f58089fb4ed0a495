"""Ingestion: benchmark output files -> the canonical table, losing nothing.

``python -m ckpred ingest data.path=<files, globs or a comma-separated list> out=<file.parquet>``

Each file is read by the reader of its format (:mod:`ckpred.data.readers`; detected from the
content unless ``data.format`` is set). Every measurement record ends in exactly one place:

* a **valid row** of the table;
* an **invalid row** (``is_valid=False``, ``tflops=0``, ``invalid_reason`` says why: the kernel
  failed, a value is non-numeric, NaN, infinite or negative, TFLOPS is zero, TFLOPS disagrees
  with latency and the problem's FLOPs, the problem disagrees with its header...);
* the **rejects** (``source`` = file:line, ``reason``, ``raw`` text) when it cannot be a row at
  all: malformed JSON, a kernel name that does not parse, a problem field that is not an
  integer, another dtype/layout/arch than the config, an unrecognised line.

Reasons read ``<category>: <detail>``; the summary counts them by category. Then repeated
measurements of the same (problem, kernel) — across files, runs or within a file — are merged
into one row: ``tflops``, ``latency_ms`` and ``bandwidth_gbs`` are the medians over the valid
measurements, ``repeats`` their count, ``spread`` = (max - min) / median of their TFLOPS (null
with fewer than two), ``source``/``run_id`` list every merged measurement (``;``-joined). Invalid
measurements of a pair that also has a valid one are listed in the rejects as ``superseded``;
a pair with no valid measurement stays an invalid row (first reason, all repeats counted).

Kernel fields always come from the op's name grammar (``op.parse_name``), and ``kernel_name``
is stored in the op's canonical form (``op.format_name``): the parity-sweep name
``gemm_fp16_rcr_...`` and the tile-engine name ``gemm_universal_fp16_rcr_...`` of one kernel
are one row. Nothing is cached: reading is fast (``scripts/bench/ingest_speed.py``).

Streaming: files are read in chunks of about ``data.chunk_mb`` MiB (the CSV sweep and the
streaming log by vectorised block readers, the other formats whole), each chunk checked on its
own (the value checks are per row). :func:`ingest_to_parquet` (``ckpred ingest``) then
hash-partitions the checked rows by their query key into spill files, so the rule check
(per problem), the merge of repeats (per problem and kernel) and a query (what the ranker and
the Dask backend take whole) each need one partition in memory, and writes the table part by
part (a directory output with the manifest of :mod:`ckpred.data.partitions`); :func:`read_files` keeps one partition in memory
and returns the table in order of first appearance. Both run the same code.
"""

from __future__ import annotations

import csv
import glob
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ckpred.util import resolve_path
from ckpred.data.mapping import InputMapping, map_rows, op_flops
from ckpred.data.partitions import describe_part, write_manifest
from ckpred.data.readers import (CHUNKED_READERS, READERS, TABLE_READERS, FileRead, ReadContext, detect_format,
                                 detect_table_format)
from ckpred.data.readers.common import KernelResolver, Reject, RowBuffer
from ckpred.data.readers.table_parquet import is_canonical
from ckpred.data.table import canonical_schema, conform
from ckpred.errors import ConfigValueError, InputFileError
from ckpred.kernels.base import OpDefinition, load_op
from ckpred.util import atomic_dir, atomic_path

#: Relative tolerance of the check ``tflops * latency == FLOPs`` (beyond printing steps).
CONSISTENCY_RTOL = 0.02
REJECT_COLUMNS = ("source", "reason", "raw")
FORMATS = ("auto", *READERS)
#: Bytes of input read per block by default (``data.chunk_mb`` in the config).
DEFAULT_CHUNK_BYTES = 64 << 20


@dataclass
class IngestSummary:
    """Counts of one ingestion. ``records == valid + sum(invalid) + sum(rejected)``."""

    files: list[str] = field(default_factory=list)
    #: Reader used for each file (``empty`` for an empty file).
    formats: list[str] = field(default_factory=list)
    #: Measurement records read (rows before merging, plus rejected records).
    records: int = 0
    valid: int = 0
    #: Invalid rows before merging, by reason category.
    invalid: dict[str, int] = field(default_factory=dict)
    #: Rejected records, by reason category.
    rejected: dict[str, int] = field(default_factory=dict)
    #: Invalid measurements dropped from the table because a valid repeat of the pair exists
    #: (they are listed in the rejects as ``superseded``).
    superseded: int = 0
    #: Rows of the merged table, and how many of them are valid.
    rows: int = 0
    valid_rows: int = 0
    #: Per file whose metadata declares more records than it holds (a truncated file): the
    #: number of declared records that are absent. They were never read, so they are not in
    #: ``records``; the summary prints them so the loss is seen.
    missing: dict[str, int] = field(default_factory=dict)
    #: The fields repeats are merged on (besides the kernel).
    merge_key: tuple[str, ...] = ()

    @property
    def merged(self) -> int:
        """Measurements folded into another row by the median merge."""
        return self.valid + sum(self.invalid.values()) - self.superseded - self.rows

    def as_dict(self) -> dict[str, Any]:
        return {"files": list(self.files), "formats": list(self.formats), "records": self.records,
                "valid": self.valid,
                "invalid": dict(self.invalid), "rejected": dict(self.rejected),
                "superseded": self.superseded, "merged": self.merged, "rows": self.rows,
                "valid_rows": self.valid_rows, "missing": dict(self.missing), "merge_key": list(self.merge_key)}


@dataclass
class IngestResult:
    """What :func:`read_files` returns."""

    #: The canonical table (merged; one row per problem x kernel).
    table: pd.DataFrame
    #: Records that could not be kept, with ``source`` (file:line), ``reason``, ``raw`` text;
    #: also the invalid measurements superseded by a valid repeat (reason ``superseded: ...``).
    rejects: pd.DataFrame
    summary: IngestSummary


# -- paths -------------------------------------------------------------------------------------
def expand_paths(spec: str | Path | Iterable[str | Path]) -> list[Path]:
    """Files named by ``spec``: a path, a glob, a comma-separated list of them, or a list.

    Relative paths are resolved against the user's original working directory.

    Raises
    ------
    ckpred.errors.InputFileError
        When a glob matches nothing or a named file does not exist; the message names it.
    """
    items: list[str] = []
    for part in ([spec] if isinstance(spec, (str, Path)) else list(spec)):
        items += [p.strip() for p in str(part).split(",") if p.strip()]
    if not items:
        raise InputFileError(str(spec), "no file given (data.path is empty)")
    paths: list[Path] = []
    for item in items:
        resolved = resolve_path(item)
        if glob.has_magic(str(resolved)):
            matches = sorted(Path(p) for p in glob.glob(str(resolved), recursive=True) if Path(p).is_file())
            if not matches:
                raise InputFileError(item, f"no file matches this pattern (looked for {resolved})")
            paths += matches
        elif resolved.is_dir():
            parts = sorted(p for p in resolved.glob("*.parquet") if p.is_file())
            if not parts:  # a partitioned table ingest wrote is read part by part
                raise InputFileError(item, "is a directory without .parquet parts; give files, a glob such as "
                                           "dir/*.csv, or a table directory ckpred ingest wrote")
            paths += parts
        elif not resolved.exists():
            raise InputFileError(item, f"no such file ({resolved})")
        else:
            paths.append(resolved)
    return list(dict.fromkeys(paths))


# -- reading -----------------------------------------------------------------------------------
def read_files(paths: str | Path | Iterable[str | Path], op: OpDefinition, *, arch: str, dtype: str,
               layout: str, fmt: str = "auto", run_id: str = "",
               mapping: InputMapping | None = None, arch_config: Any = None,
               chunk_bytes: int = DEFAULT_CHUNK_BYTES, vectorised: bool = True) -> IngestResult:
    """Read benchmark output files into the canonical table of ``op``, in memory.

    Parameters
    ----------
    paths
        Files or globs (a list, or one string with comma-separated items).
    op
        The op definition; kernel fields come from ``op.parse_name`` of each kernel name.
    arch, dtype, layout
        What the measurements are. Rows whose kernel name, header or table columns say
        another dtype/layout (or arch/op, for parquet) are rejected, never mixed in.
    fmt
        ``auto`` (detect per file from its content) or one of ``json``, ``log``, ``csv``,
        ``parquet``.
    run_id
        Stored in ``run_id``; empty means the file's name.
    mapping
        How a table reader's columns become canonical rows (:mod:`ckpred.data.mapping`);
        default: the op's own ``input``/``metric``/``failure`` sections, none for a Python-only
        op (which reads the CK formats only).
    arch_config
        The arch config (its hardware constants feed rules that read ``hw.<constant>``);
        default: the name ``arch`` only.
    chunk_bytes
        Bytes of a file read per block by the chunked readers (CSV sweep, streaming log).
    vectorised
        ``False`` reads every line with the per-line readers: the reference the block
        readers are tested against (same rows, reasons and rejects).

    Returns
    -------
    IngestResult
        The merged canonical table (rows in order of first appearance), the rejects and the
        summary counts.

    Raises
    ------
    ckpred.errors.InputFileError
        A file is missing, unreadable, or of an unknown format; a glob matches nothing.
    ckpred.errors.ConfigValueError
        ``fmt`` is not a known format.
    """
    rejects: list[Reject] = []
    tables: list[pd.DataFrame] = []
    summary = _run(paths, op, arch=arch, dtype=dtype, layout=layout, fmt=fmt, run_id=run_id, mapping=mapping,
                   arch_config=arch_config, chunk_bytes=chunk_bytes, vectorised=vectorised, partitions=None,
                   on_rejects=rejects.extend, on_table=tables.append)
    table = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
    reject_frame = pd.DataFrame([(r.source, r.reason, r.raw) for r in rejects], columns=list(REJECT_COLUMNS))
    return IngestResult(table=table, rejects=reject_frame, summary=summary)


def ingest_to_parquet(paths: str | Path | Iterable[str | Path], op: OpDefinition, out: str | Path,
                      rejects: str | Path, *, arch: str, dtype: str, layout: str, fmt: str = "auto",
                      run_id: str = "", mapping: InputMapping | None = None, arch_config: Any = None,
                      chunk_bytes: int = DEFAULT_CHUNK_BYTES, vectorised: bool = True) -> IngestSummary:
    """Stream benchmark files into canonical Parquet and a rejects CSV, memory bounded by a chunk.

    The same rows, reasons, rejects and counts as :func:`read_files` (whose parameters these
    are), without holding the table: each block of about ``chunk_bytes`` is read, checked and
    spilled to a temporary directory, hash-partitioned by the query key into
    ``ceil(input bytes / chunk_bytes)`` partitions; then each partition -- every measurement of
    its problems, so the rule check and the merge of repeats need nothing else -- is merged
    and written. ``out`` ending in ``.parquet`` is one file (a row group per partition);
    otherwise a directory of ``part-NNNNN.parquet`` files, one per partition (each holds whole
    queries), with the manifest ``model.backend=dask`` trains from
    (:func:`ckpred.data.partitions.write_manifest`). Rejects stream to ``rejects`` (CSV: source, reason, raw) as they are found.
    Within a partition rows keep their order of first appearance.

    Returns
    -------
    IngestSummary
        The counts; ``rows`` and ``valid_rows`` are those written.
    """
    import shutil
    import tempfile

    out, rejects = Path(out), Path(rejects)
    files = expand_paths(paths)
    size = sum(p.stat().st_size for p in files)
    partitions = max(1, -(-size // max(int(chunk_bytes), 1)))
    spill = Path(tempfile.mkdtemp(prefix=".ckpred-ingest-", dir=out.parent if out.parent.exists() else None))
    try:
        with atomic_path(rejects) as reject_tmp, open(reject_tmp, "w", newline="") as reject_fh, \
                _TableWriter(out, op) as writer:
            pd.DataFrame(columns=list(REJECT_COLUMNS)).to_csv(reject_fh, index=False)

            def on_rejects(batch: list[Reject]) -> None:
                # every field quoted: a raw line may hold a bare carriage return, which an
                # unquoted field would turn into a line break
                if batch:
                    pd.DataFrame([(r.source, r.reason, r.raw) for r in batch],
                                 columns=list(REJECT_COLUMNS)).to_csv(reject_fh, index=False, header=False,
                                                                      quoting=csv.QUOTE_ALL)

            summary = _run(files, op, arch=arch, dtype=dtype, layout=layout, fmt=fmt, run_id=run_id,
                           mapping=mapping, arch_config=arch_config, chunk_bytes=chunk_bytes, vectorised=vectorised,
                           partitions=(partitions, spill), on_rejects=on_rejects, on_table=writer.write)
            if summary.valid_rows == 0:
                writer.discard()
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    return summary


def _run(paths: str | Path | Iterable[str | Path], op: OpDefinition, *, arch: str, dtype: str, layout: str,
         fmt: str, run_id: str, mapping: InputMapping | None, arch_config: Any, chunk_bytes: int,
         vectorised: bool, partitions: tuple[int, Path] | None, on_rejects: Callable[[list[Reject]], None],
         on_table: Callable[[pd.DataFrame], None]) -> IngestSummary:
    """The one ingestion: read and check in chunks, partition, then merge each partition.

    ``partitions`` is ``None`` (one partition, in memory: the table in order of first
    appearance) or (count, spill directory). Rejects and table parts go to the callbacks.
    """
    if fmt not in FORMATS:
        raise ConfigValueError("data.format", fmt, f"one of {list(FORMATS)}")
    mapping = mapping if mapping is not None else InputMapping.of_op(op)
    if mapping is not None and mapping.format not in ("auto", *TABLE_READERS, *READERS):
        raise ConfigValueError("op.input.format", mapping.format,
                               f"'auto' or a registered reader {sorted({*TABLE_READERS, *READERS})}")
    files = expand_paths(paths)
    # A field of the op is judged per row, not against the run's config.
    resolver = KernelResolver(op, dtype=None if "dtype" in op.problem_names else dtype,
                              layout=None if "layout" in op.problem_names else layout)
    labels = _labels(files)
    summary = IngestSummary(files=[labels[p] for p in files])
    store = _Partitions(op, *(partitions or (1, None)))
    headers = (("arch", arch), ("dtype", dtype), ("layout", layout))
    seen: set[str] = set()  # header columns a table gives per row (input.columns.arch...)
    n_rows = n_rejects = 0
    rejected: Counter[str] = Counter()
    for path in files:
        for frame, rejects in _file_chunks(path, fmt, mapping, op, resolver, summary, labels[path], arch=arch,
                                           dtype=dtype, layout=layout, run_id=run_id, chunk_bytes=chunk_bytes,
                                           vectorised=vectorised):
            for h, value in headers:
                if h in frame.columns and h not in op.problem_names:
                    seen.add(h)
                    frame[h] = frame[h].where(frame[h].notna(), value)
            store.add(_validate(frame, op))
            n_rows += len(frame)
            n_rejects += len(rejects)
            rejected.update(_category(r.reason) for r in rejects)
            on_rejects(rejects)
            del frame, rejects
    per_row = [h for h, _ in headers if h in seen]
    summary.records = n_rows + n_rejects
    summary.rejected = dict(rejected)
    summary.merge_key = (*op.problem_names, *per_row)
    kernels = resolver.frame()
    invalid: Counter[str] = Counter()
    for rows in store.parts():
        for h, value in headers:
            if h in per_row:
                rows[h] = rows[h].where(rows[h].notna(), value) if h in rows.columns else value
        rows = _check_rules(rows, op, resolver, arch=arch_config if arch_config is not None else arch, dtype=dtype,
                            layout=layout)
        valid = rows["is_valid"].to_numpy(dtype=bool)
        summary.valid += int(valid.sum())
        invalid.update(_category(r) for r in rows["invalid_reason"].to_numpy(dtype=object)[~valid])
        table, superseded = _merge(rows, op, per_row)
        del rows
        summary.superseded += len(superseded)
        on_rejects(superseded)
        codes = table.pop("kernel").to_numpy()
        for name in (*op.kernel_names, "kernel_name"):
            # take() on the unique-kernel columns: string fields stay compact arrow arrays
            table[name] = kernels[name].array.take(codes) if len(kernels) else np.array([], dtype=object)
        for name, value in (("op", op.name), ("arch", arch), ("dtype", dtype), ("layout", layout)):
            if name not in op.problem_names and name not in per_row:  # else the row's own value
                # one arrow string repeated: no column of Python references to convert
                table[name] = pa.repeat(pa.scalar(str(value), pa.string()), len(table)).to_pandas()
        table = conform(table, op)
        summary.rows += len(table)
        summary.valid_rows += int(table["is_valid"].sum())
        on_table(table)
    summary.invalid = dict(invalid)
    return summary


def _file_chunks(path: Path, fmt: str, mapping: InputMapping | None, op: OpDefinition, resolver: KernelResolver,
                 summary: IngestSummary, label: str, *, arch: str, dtype: str, layout: str, run_id: str,
                 chunk_bytes: int, vectorised: bool) -> Iterator[tuple[pd.DataFrame, list[Reject]]]:
    """(row frame, rejects) of each chunk of one file; records the file's format in ``summary``."""
    table_reader, file_fmt = _reader_of(path, fmt, mapping, op)
    summary.formats.append(file_fmt or "empty")
    if file_fmt is None:  # empty file: nothing to read, nothing lost
        return
    ctx = ReadContext(op=op, resolver=resolver, dtype=dtype, layout=layout, arch=arch, label=label)
    try:
        if table_reader:
            raw = TABLE_READERS[file_fmt](path, ctx)
            mapped = map_rows(raw, op, mapping, resolver,  # type: ignore[arg-type]
                              label=label, run_id=run_id or label)
            yield mapped.frame, raw.rejects + mapped.rejects
            return
        chunked = CHUNKED_READERS.get(file_fmt) if vectorised else None
        reads = chunked(path, ctx, chunk_bytes) if chunked is not None else iter([READERS[file_fmt](path, ctx)])
        for read in reads:
            yield (read.frame if read.frame is not None else _buffer_frame(read, op, run_id or label, label)), \
                read.rejects
            if read.declared_records is not None and read.found_records is not None \
                    and read.found_records < read.declared_records:
                summary.missing[label] = read.declared_records - read.found_records
    except InputFileError:
        raise
    except OSError as exc:
        raise InputFileError(str(path), exc.strerror or str(exc)) from exc


class _Partitions:
    """Checked row chunks, hash-partitioned by the query key (:func:`hash_columns`).

    One partition keeps the chunks in memory (all of the input fits in one chunk, or the
    caller wants the table in memory anyway); more spill each chunk's share of every
    partition to ``spill`` (pickle: the frame's exact dtypes come back) and read a partition
    back only when it is merged, so memory holds one chunk or one partition at a time.
    """

    def __init__(self, op: OpDefinition, count: int, spill: Path | None) -> None:
        self.op, self.count, self.spill = op, count, spill
        self.frames: list[pd.DataFrame] = []
        self.chunks = 0

    def add(self, frame: pd.DataFrame) -> None:
        if self.spill is None or self.count == 1:  # one partition: the files fit in one chunk
            self.frames.append(frame)
            return
        import pickle

        part = partition_of(frame[list(hash_columns(self.op))], self.count)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.count + 1))
        for p in range(self.count):
            if bounds[p] == bounds[p + 1]:
                continue
            piece = frame.take(order[bounds[p]:bounds[p + 1]])
            with open(self.spill / f"p{p:05d}-c{self.chunks:06d}.pkl", "wb") as fh:
                pickle.dump(piece, fh, protocol=pickle.HIGHEST_PROTOCOL)
        self.chunks += 1

    def parts(self) -> Iterator[pd.DataFrame]:
        """Each non-empty partition (all partitions' rows in order of first appearance)."""
        if self.spill is None or self.count == 1:
            frames, self.frames = self.frames, []
            if not frames:
                yield _validate(_buffer_frame(None, self.op, ""), self.op)
                return
            yield pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
            return
        import pickle

        for p in range(self.count):
            names = sorted(self.spill.glob(f"p{p:05d}-c*.pkl"))
            if not names:
                continue
            frames = []
            for name in names:
                with open(name, "rb") as fh:
                    frames.append(pickle.load(fh))
                name.unlink()
            yield pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0].reset_index(drop=True)


def hash_columns(op: OpDefinition) -> tuple[str, ...]:
    """The columns rows are partitioned by: the query key, when it is made of problem fields.

    A problem's fields include its query key, so partitioning by the query keeps every
    measurement of a problem together (what the rule check and the merge need) and also every
    problem of a query (what LightGBM's Dask interface needs: it takes each file's query
    sizes on their own).
    """
    key = tuple(op.group_key)
    return key if key and set(key) <= set(op.problem_names) else tuple(op.problem_names)


def partition_of(problems: pd.DataFrame, count: int) -> np.ndarray:
    """The partition (``0 .. count-1``) of each row, from a hash of its problem fields.

    Every measurement of one problem lands in one partition, whatever file or chunk it
    comes from; the hash is pandas' stable row hash, so a problem's partition is the same
    in every run.
    """
    if count == 1:
        return np.zeros(len(problems), dtype=np.int64)
    hashed = pd.util.hash_pandas_object(problems, index=False).to_numpy()
    return (hashed % np.uint64(count)).astype(np.int64)


#: Canonical columns written without a Parquet dictionary (their values rarely repeat).
_UNIQUE_PER_ROW = frozenset({"source", "tflops", "latency_ms", "bandwidth_gbs", "spread"})


class _TableWriter:
    """Canonical table parts into one Parquet file (a row group each) or a directory of parts.

    Nothing is visible at ``out`` until the end: the file is written beside it and renamed,
    the directory of parts is written as a sibling and swapped in with one rename
    (:func:`ckpred.util.atomic_dir`), so a failed or killed run leaves the previous table
    whole, never a mix of old and new parts.
    """

    def __init__(self, out: Path, op: OpDefinition) -> None:
        self.out, self.op = out, op
        self.single = out.suffix == ".parquet"
        self.schema = canonical_schema(op)
        self.parts = 0
        self.entries: list[dict[str, Any]] = []
        self.no_manifest = ""
        self.discarded = False
        # Measured values and sources are (nearly) unique per row: a dictionary page for them
        # is built and thrown away, and min/max statistics of the source text serve no filter.
        names = self.schema.names
        self.options: dict[str, Any] = {
            "use_dictionary": [c for c in names if c not in _UNIQUE_PER_ROW],
            "write_statistics": [c for c in names if c != "source"]}

    def __enter__(self) -> "_TableWriter":
        import pyarrow.parquet as pq

        self._atomic: Any = atomic_path(self.out) if self.single else atomic_dir(self.out)
        self.tmp = self._atomic.__enter__()
        if self.single:
            self.writer: Any = pq.ParquetWriter(self.tmp, self.schema, **self.options)
        return self

    def write(self, table: pd.DataFrame) -> None:
        import pyarrow.parquet as pq

        arrow = pa.Table.from_pandas(table, schema=self.schema, preserve_index=False)
        if self.single:
            self.writer.write_table(arrow)
        else:
            file = self.tmp / f"part-{self.parts:05d}.parquet"
            pq.write_table(arrow, file, **self.options)
            if not self.no_manifest:
                try:
                    self.entries.append(describe_part(file, arrow))
                except InputFileError as exc:  # e.g. dtype is a problem field: parts mix dtypes
                    self.no_manifest = exc.reason
        self.parts += 1

    def discard(self) -> None:
        """Leave ``out`` as it was (nothing usable was read)."""
        self.discarded = True

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if self.single:
            self.writer.close()
        if kind is None and self.discarded:
            kind, exc = _Discarded, _Discarded()
        if kind is None:
            if not self.single and not self.no_manifest:
                write_manifest(self.tmp, self.op, self.entries)
            elif not self.single:
                logging.getLogger(__name__).warning("%s: no partition manifest, so model.backend=dask cannot train "
                                                    "from it: %s", self.out, self.no_manifest)
            self._atomic.__exit__(None, None, None)
            return
        try:
            self._atomic.__exit__(kind, exc, tb)
        except _Discarded:
            pass


class _Discarded(Exception):
    """Thrown into the atomic writer of a table that is not to be written."""


def _labels(files: Sequence[Path]) -> dict[Path, str]:
    """How each file is named in ``source``: its path relative to the working dir when inside it."""
    cwd = Path.cwd()
    out = {}
    for path in files:
        try:
            out[path] = str(path.relative_to(cwd))
        except ValueError:
            out[path] = str(path)
    return out


def _reader_of(path: Path, fmt: str, mapping: InputMapping | None, op: OpDefinition) -> tuple[bool, str | None]:
    """(is a table reader, format name) for one file; ``None`` for an empty file.

    ``data.format`` forces a CK record reader; ``op.input.format`` a table reader (or a record
    reader by its name). With ``auto``, an op without a column map whose problem fields are all
    integers or flags reads the CK formats as before; any other file goes to the table reader
    of its extension or content (a canonical ckpred table always to its own reader).
    """
    if fmt != "auto" or mapping is None:
        return False, detect_format(path) if fmt == "auto" else fmt
    if is_canonical(path):  # a table ingest wrote: read as it is, whatever the op's source format
        return False, "parquet"
    if mapping.format != "auto":
        return mapping.format in TABLE_READERS, mapping.format
    ck_error: InputFileError | None = None
    if mapping.is_identity and all(f.kind in ("int", "bool") for f in op.problem_fields):
        try:
            return False, detect_format(path)
        except InputFileError as exc:
            ck_error = exc
    try:
        table_fmt = detect_table_format(path)
    except InputFileError:
        if ck_error is not None:  # neither kind: the CK message names data.format
            raise ck_error from None
        raise
    return table_fmt is not None, table_fmt


def _category(reason: str) -> str:
    return reason.split(":", 1)[0]


def _buffer_frame(read: FileRead | None, op: OpDefinition, run_id: str, label: str = "") -> pd.DataFrame:
    """Columns of one file's row buffer as a frame (no per-row Python work except reasons)."""
    rows = read.rows if read is not None else RowBuffer(op.problem_names)
    n = len(rows)

    def ints(values: Any) -> np.ndarray:  # a view of the array's buffer: no copy of the big columns
        return np.frombuffer(values, dtype=np.int64) if n else np.zeros(0, dtype=np.int64)

    def floats(values: Any) -> np.ndarray:
        return np.frombuffer(values, dtype=np.float64).copy() if n else np.zeros(0)

    columns: dict[str, Any] = {name: ints(values) for name, values in zip(op.problem_names, rows.problem)}
    columns["kernel"] = ints(rows.kernel)
    columns.update(tflops=floats(rows.tflops), latency_ms=floats(rows.latency), bandwidth_gbs=floats(rows.bandwidth))
    reasons = np.full(n, "", dtype=object)
    for i, reason in rows.reasons.items():
        reasons[i] = reason
    columns["invalid_reason"] = pd.Series(reasons, dtype=object)  # object: no string inference
    if rows.sources is not None:
        columns["source"] = np.asarray(rows.sources, dtype=object)
    else:  # one vectorised build of compact arrow strings instead of a million f-strings
        import pyarrow.compute as pc

        columns["source"] = pc.binary_join_element_wise(
            pa.scalar(f"{label}:"), pc.cast(pa.array(ints(rows.line)), pa.string()), "").to_pandas()
    if rows.run_ids is not None:
        columns["run_id"] = np.asarray([r or run_id for r in rows.run_ids], dtype=object)
    else:  # one arrow string repeated, not a million Python references to convert
        columns["run_id"] = pa.repeat(pa.scalar(run_id, pa.string()), n).to_pandas()
    columns["repeats"] = ints(rows.repeats) if rows.repeats is not None else np.ones(n, dtype=np.int64)
    columns["spread"] = floats(rows.spreads) if rows.spreads is not None else np.full(n, np.nan)
    columns["quantum_ms"] = np.full(n, rows.quantum_ms)
    columns["quantum_tflops"] = np.full(n, rows.quantum_tflops)
    return pd.DataFrame(columns)


# -- checks ------------------------------------------------------------------------------------
def _validate(rows: pd.DataFrame, op: OpDefinition) -> pd.DataFrame:
    """Mark rows invalid (first reason wins) and zero the TFLOPS of every invalid row."""
    t = rows["tflops"].to_numpy(np.float64)
    lat = rows["latency_ms"].to_numpy(np.float64)
    bw = rows["bandwidth_gbs"].to_numpy(np.float64)
    reason = rows["invalid_reason"].to_numpy(dtype=object).copy()
    free = reason == ""
    # A throughput metric without a FLOPs formula gives no latency: NaN there is not a defect.
    latency_known = (rows["latency_known"].fillna(True).to_numpy(dtype=bool) if "latency_known" in rows
                     else np.ones(len(rows), dtype=bool))

    def mark(mask: np.ndarray, text: Any) -> None:
        hit = np.flatnonzero(mask & free)
        for i in hit:
            reason[i] = text(i) if callable(text) else text
        free[hit] = False

    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for name, v, zero_bad in (("tflops", t, True), ("latency_ms", lat, False)):
            mark(np.isnan(v) & (latency_known if name == "latency_ms" else True), f"NaN value: {name}")
            mark(np.isinf(v), lambda i, v=v, name=name: f"infinite value: {name}={v[i]}")
            mark(v < 0, lambda i, v=v, name=name: f"negative value: {name}={v[i]}")
            if zero_bad:
                mark(v == 0, "zero tflops: a kernel that ran cannot have 0 TFLOPS")
        mark(np.isinf(bw), lambda i: f"infinite value: bandwidth_gbs={bw[i]}")
        mark(bw < 0, lambda i: f"negative value: bandwidth_gbs={bw[i]}")
        if free.any():
            flops = op_flops(op, rows)
            qt = rows["quantum_tflops"].to_numpy(np.float64)
            ql = rows["quantum_ms"].to_numpy(np.float64)
            lo = np.maximum(t - qt, 0.0) * np.maximum(lat - ql, 0.0) * 1e9
            hi = (t + qt) * (lat + ql) * 1e9
            ok = (hi >= flops * (1 - CONSISTENCY_RTOL)) & (lo <= flops * (1 + CONSISTENCY_RTOL))
            known = np.isfinite(flops)

            def inconsistent(i: int) -> str:
                implied = flops[i] / (lat[i] * 1e9) if lat[i] > 0 else math.inf
                return (f"inconsistent tflops: tflops={t[i]:g} but latency_ms={lat[i]:g} and the problem's "
                        f"{flops[i]:.6g} FLOPs give {implied:.6g} (tolerance {CONSISTENCY_RTOL:.0%})")

            mark(known & ~ok, inconsistent)
    valid = reason == ""
    out = rows.drop(columns=[c for c in ("quantum_ms", "quantum_tflops", "latency_known") if c in rows])
    out["invalid_reason"] = pd.Series(reason, index=out.index, dtype=object)
    out["is_valid"] = valid
    # The canonical table's convention for failures: TFLOPS 0, latency a real number.
    out.loc[~valid, "tflops"] = 0.0
    bad_latency = ~valid & ~(np.isfinite(lat) & (lat >= 0))  # valid rows of unknown latency keep NaN
    out.loc[bad_latency, "latency_ms"] = 0.0
    out.loc[~valid & ~(np.isfinite(bw) & (bw >= 0)), "bandwidth_gbs"] = np.nan
    return out




def _check_rules(rows: pd.DataFrame, op: OpDefinition, resolver: KernelResolver, *, arch: Any, dtype: str,
                 layout: str) -> pd.DataFrame:
    """Mark invalid the measurements of a problem the op's rules say no kernel can run.

    When the op's validity rules (:meth:`OpDefinition.validity`) refuse *every* kernel measured
    valid on a problem -- a degenerate problem such as ``split_k=0`` -- the measurements
    contradict the op: they become invalid with the reason ``rule violation: <rule message>``.
    A problem some measured kernel may run is left as measured (a rule that is stricter than
    the hardware must not erase data). An op whose rules cannot be evaluated here (a rule
    needing an arch constant the run does not have) is not judged.
    """
    valid = rows["is_valid"].to_numpy(dtype=bool)
    if not valid.any():
        return rows
    kernels = resolver.frame()
    # text fields as categoricals: a row's kernel fields are then a take of small codes
    kernels = kernels.astype({c: "category" for c in op.kernel_names if not pd.api.types.is_numeric_dtype(kernels[c])
                              and not pd.api.types.is_bool_dtype(kernels[c])})[list(op.kernel_names)]
    idx = np.flatnonzero(valid)
    codes = rows["kernel"].to_numpy()[idx]
    # a table that gives each row its arch is judged with each arch's own constants
    row_arch = (rows["arch"].to_numpy(dtype=object)[idx] if "arch" in rows.columns and "arch" not in op.problem_names
                else np.full(len(idx), getattr(arch, "name", arch), dtype=object))
    problem_id = group_ids([*(rows[c].to_numpy()[idx] for c in op.problem_names), row_arch])

    def judge(at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(may run, rule message) of the valid measurements at positions ``at``."""
        ok = np.ones(len(at), dtype=bool)
        why = np.full(len(at), "", dtype=object)
        problems = rows.iloc[idx[at]][list(op.problem_names)].reset_index(drop=True)
        kernel_rows = kernels.iloc[codes[at]].reset_index(drop=True)
        names = row_arch[at]
        for name in pd.unique(names):
            sel = np.flatnonzero(names == name)
            with np.errstate(all="ignore"):
                got, text = op.validity(problems.iloc[sel].reset_index(drop=True),
                                        kernel_rows.iloc[sel].reset_index(drop=True),
                                        arch=_arch_named(name, arch), dtype=dtype, layout=layout)
            ok[sel] = np.asarray(got, dtype=bool)
            why[sel] = np.asarray(text, dtype=object)
        return ok, why

    # A problem is alive when one measured kernel may run: judge one measurement per problem
    # first, then every measurement of the problems whose first one is ruled out.
    _, first = np.unique(problem_id, return_index=True)
    try:
        ok_first, _ = judge(first)
        suspect = np.zeros(problem_id.max() + 1, dtype=bool)
        suspect[problem_id[first[~ok_first]]] = True
        if not suspect.any():
            return rows
        at = np.flatnonzero(suspect[problem_id])
        ok, why = judge(at)
    except Exception:  # rules this run cannot evaluate: the measurements are kept as they are
        return rows
    runnable = np.bincount(problem_id[at], weights=ok.astype(np.float64), minlength=problem_id.max() + 1)
    dead = runnable[problem_id[at]] == 0
    if not dead.any():
        return rows
    idx = idx[at]
    bad = idx[dead]
    reasons = rows["invalid_reason"].to_numpy(dtype=object).copy()
    reasons[bad] = [f"rule violation: {w or 'the op rules out every kernel for this problem'}" for w in why[dead]]
    rows = rows.assign(invalid_reason=reasons)
    rows.loc[bad, "is_valid"] = False
    rows.loc[bad, "tflops"] = 0.0
    return rows


def _arch_named(name: Any, run_arch: Any) -> Any:
    """The arch config of a row's arch name: the run's when it is that one, else the packaged
    config of that name, else the name alone (rules needing its constants are then not judged)."""
    if name == getattr(run_arch, "name", run_arch):
        return run_arch
    from ckpred.errors import ConfigValueError as _Missing
    from ckpred.schema import arch_config

    try:
        return arch_config(str(name))
    except _Missing:
        return name


# -- merging -----------------------------------------------------------------------------------
def group_ids(columns: Sequence[Any]) -> np.ndarray:
    """Group number of each row of the key ``columns``, groups numbered by first appearance.

    The same numbering as ``DataFrame.groupby(keys, sort=False, dropna=False).ngroup()``, by
    hashing each column once (``pd.factorize``) and combining the codes column by column,
    which avoids pandas' group-by machinery over the whole frame.
    """
    if not len(columns):
        return np.zeros(0, dtype=np.int64)
    gid = np.zeros(len(columns[0]), dtype=np.int64)
    groups = 1
    for values in columns:
        codes, uniques = pd.factorize(values, use_na_sentinel=False)
        width = max(len(uniques), 1)
        if groups * width >= 1 << 62:  # keep the combined code in int64
            gid, uniques_gid = pd.factorize(gid)
            groups = max(len(uniques_gid), 1)
        gid = gid * width + codes
        groups *= width
    return pd.factorize(gid)[0].astype(np.int64, copy=False)


def _merge(rows: pd.DataFrame, op: OpDefinition, extra: Sequence[str] = ()) -> tuple[pd.DataFrame, list[Reject]]:
    """One row per (problem, kernel): medians over valid repeats (see the module docstring).

    The output keeps each pair's first row (one copy of the table, in order of first
    appearance) and overwrites only the pairs measured more than once.
    """
    keys = [*op.problem_names, *extra, "kernel"]
    if not len(rows):
        return rows, []
    gid = group_ids([rows[c].to_numpy() for c in keys])
    counts = np.bincount(gid)
    multi = counts[gid] > 1
    if not multi.any():
        return rows, []
    _, first = np.unique(gid, return_index=True)
    out = rows.take(first).reset_index(drop=True)  # row g is group g
    sub = rows.loc[multi].assign(_gid=gid[multi])
    multi_ids = np.flatnonzero(counts > 1)
    sources, run_ids = _joined(sub, multi_ids)
    # whole columns are replaced (a patched copy): .loc writes into many columns cost more
    columns: dict[str, Any] = {"source": _patched(out["source"], multi_ids, sources),
                               "run_id": _patched(out["run_id"], multi_ids, run_ids)}
    repeats = out["repeats"].to_numpy(dtype=np.int64, copy=True)
    sub_gid = sub["_gid"].to_numpy()
    repeats[multi_ids] = np.bincount(sub_gid, weights=sub["repeats"].to_numpy(np.float64),
                                     minlength=len(out))[multi_ids].astype(np.int64)
    spread = out["spread"].to_numpy(dtype=np.float64, copy=True)
    spread[multi_ids] = np.nan
    valid = sub[sub["is_valid"]].groupby("_gid")
    stats = pd.DataFrame({
        "tflops": valid["tflops"].median(), "latency_ms": valid["latency_ms"].median(),
        "bandwidth_gbs": valid["bandwidth_gbs"].median(), "tmin": valid["tflops"].min(),
        "tmax": valid["tflops"].max(), "n": valid.size(), "repeats": valid["repeats"].sum(),
    })
    idx = stats.index.to_numpy()
    for col in ("tflops", "latency_ms", "bandwidth_gbs"):
        values = out[col].to_numpy(dtype=np.float64, copy=True)
        values[idx] = stats[col].to_numpy()
        columns[col] = values
    repeats[idx] = stats["repeats"].to_numpy()
    columns["repeats"] = repeats
    spread[idx] = ((stats["tmax"] - stats["tmin"]) / stats["tflops"]).where(stats["n"] >= 2).to_numpy()
    columns["spread"] = spread
    is_valid = out["is_valid"].to_numpy(dtype=bool, copy=True)
    is_valid[idx] = True
    columns["is_valid"] = is_valid
    reasons = out["invalid_reason"].to_numpy(dtype=object, copy=True)
    reasons[idx] = ""
    columns["invalid_reason"] = reasons
    for col, values in columns.items():
        out[col] = values
    superseded_rows = sub[~sub["is_valid"] & sub["_gid"].isin(idx)]
    superseded = [Reject(r.source, f"superseded: {r.invalid_reason} (a valid repeat of this problem and "
                                   "kernel is in the table)", f"tflops={r.tflops} latency_ms={r.latency_ms}")
                  for r in superseded_rows.itertuples(index=False)]
    return out, superseded


def _arrow_text(column: pd.Series) -> pa.Array:
    """A text column as one arrow string array (no copy when it is arrow-backed already)."""
    values = pa.array(column.array, pa.string()) if len(column) else pa.array([], pa.string())
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _patched(column: pd.Series, at: np.ndarray, values: pa.Array) -> pd.Series:
    """``column`` (text) with ``values`` at the positions ``at``, built as one arrow take."""
    base = _arrow_text(column)
    index = np.arange(len(column), dtype=np.int64)
    index[at] = len(column) + np.arange(len(at), dtype=np.int64)
    merged = pa.concat_arrays([base, values.cast(pa.string())]).take(pa.array(index))
    return pd.Series(merged.to_pandas(), index=column.index)


def _joined(sub: pd.DataFrame, order: pd.Index) -> tuple[pa.Array, pa.Array]:
    """``;``-joined sources and distinct run ids of each group, in ``order`` of group ids.

    Vectorised with arrow list joins: pandas' ``agg(";".join)`` takes the pure-Python path,
    slow for the tens of thousands of groups of a large sweep.
    """
    import pyarrow.compute as pc

    gid = sub["_gid"].to_numpy()
    sort = np.argsort(gid, kind="stable")
    sorted_gid = gid[sort]
    starts = np.flatnonzero(np.r_[True, sorted_gid[1:] != sorted_gid[:-1]])
    position = {g: i for i, g in enumerate(sorted_gid[starts].tolist())}
    pick = np.array([position[g] for g in np.asarray(order).tolist()], dtype=np.int64)

    def join(values: pd.Series, keep: np.ndarray) -> pa.Array:
        kept_gid = sorted_gid[keep]
        offsets = np.r_[np.flatnonzero(np.r_[True, kept_gid[1:] != kept_gid[:-1]]), len(kept_gid)]
        text = _arrow_text(values).take(pa.array(sort[keep]))
        joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), text), ";")
        return joined.take(pa.array(pick))

    sources = join(sub["source"], np.ones(len(sort), dtype=bool))
    # distinct run ids per group, in order of first appearance
    run_codes = pd.factorize(sub["run_id"].to_numpy(dtype=object)[sort])[0]
    _, first = np.unique(sorted_gid.astype(np.int64) * (int(run_codes.max()) + 1) + run_codes, return_index=True)
    keep = np.zeros(len(sort), dtype=bool)
    keep[first] = True
    return sources, join(sub["run_id"], keep)


# -- reporting ---------------------------------------------------------------------------------
def print_summary(summary: IngestSummary, *, out: Path | None = None, rejects: Path | None = None,
                  console: Any = None) -> None:
    """Print the summary as a rich table (rows read, valid, invalid and rejected by reason)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"ckpred ingest: {len(summary.files)} file(s)", show_header=True)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("records read", str(summary.records))
    table.add_row("valid", str(summary.valid))
    table.add_row("invalid (kept, is_valid=False)", str(sum(summary.invalid.values())))
    for reason, count in sorted(summary.invalid.items(), key=lambda kv: -kv[1]):
        table.add_row(f"  {reason}", str(count))
    table.add_row("rejected", str(sum(summary.rejected.values())))
    for reason, count in sorted(summary.rejected.items(), key=lambda kv: -kv[1]):
        table.add_row(f"  {reason}", str(count))
    table.add_row("superseded by a valid repeat", str(summary.superseded))
    key = ", ".join(summary.merge_key) or "the problem"
    table.add_row(f"merged into repeats (same {key} and kernel)", str(summary.merged))
    table.add_row("table rows (valid)", f"{summary.rows} ({summary.valid_rows})")
    if len(summary.files) <= 10:
        for name, fmt in zip(summary.files, summary.formats):
            console.print(f"read {name} ({fmt})")
    else:
        counts = ", ".join(f"{n} {fmt}" for fmt, n in Counter(summary.formats).items())
        console.print(f"read {len(summary.files)} files ({counts})")
    console.print(table)
    for name, count in summary.missing.items():
        console.print(f"[bold red]{name}: {count} record(s) its metadata declares are absent "
                      f"(num_kernels x num_problems; the file is truncated?)[/]")
    if out is not None:
        console.print(f"table   -> {out}")
    if rejects is not None:
        console.print(f"rejects -> {rejects}")


# -- config entry points -----------------------------------------------------------------------
def _path_spec(value: Any) -> Any:
    if isinstance(value, (str, Path)):
        return value
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return [str(v) for v in container]  # type: ignore[union-attr]


def output_paths(cfg: Any) -> tuple[Path, Path]:
    """(``out``, rejects file) of an ingest config, refusing any that would overwrite an input.

    Raises
    ------
    ckpred.errors.ConfigValueError
        ``out`` or ``rejects`` is one of the input files, or the two are the same file.
    """
    out = resolve_path(cfg.out)
    rejects = resolve_path(cfg.rejects) if cfg.get("rejects") else out.with_name(f"{out.stem}.rejects.csv")
    inputs = {p.resolve() for p in expand_paths(_path_spec(cfg.data.path))}
    for key, path in (("out", out), ("rejects", rejects)):
        if path.resolve() in inputs:
            raise ConfigValueError(key, str(path), "a path that is not one of the input files (data.path); "
                                                   "ingest never overwrites its input")
    if out.resolve() == rejects.resolve():
        raise ConfigValueError("rejects", str(rejects), f"a path other than out={out}")
    return out, rejects


def _config_kwargs(cfg: Any) -> dict[str, Any]:
    return {"arch": cfg.arch.name, "dtype": cfg.dtype.name, "layout": cfg.layout.name,
            "fmt": cfg.data.get("format", "auto") or "auto", "run_id": str(cfg.get("run_id", "") or ""),
            "arch_config": cfg.arch, "chunk_bytes": int(cfg.data.get("chunk_mb", 64)) << 20}


def read_config_inputs(cfg: Any) -> tuple[OpDefinition, IngestResult]:
    op = load_op(cfg.op)
    return op, read_files(_path_spec(cfg.data.path), op, **_config_kwargs(cfg))


def ingest_config_to_parquet(cfg: Any, out: Path, rejects: Path) -> IngestSummary:
    """:func:`ingest_to_parquet` of an ingest config (``data.chunk_mb`` per chunk)."""
    return ingest_to_parquet(_path_spec(cfg.data.path), load_op(cfg.op), out, rejects, **_config_kwargs(cfg))


def nothing_usable_message(result: IngestResult | IngestSummary) -> str:
    summary = result.summary if isinstance(result, IngestResult) else result
    top = sorted({**summary.rejected, **summary.invalid}.items(), key=lambda kv: -kv[1])[:3]
    reasons = "; ".join(f"{k} ({v})" for k, v in top) or "the files hold no measurement"
    return (f"no valid measurement in {', '.join(summary.files)}; {summary.records} record(s) read, "
            f"most common problems: {reasons}")


def ingest_for_config(cfg: Any) -> pd.DataFrame:
    """The canonical table of ``cfg.data.path`` (used by :func:`ckpred.data.load_table`).

    Prints the summary; caches nothing (reading is fast, see ``scripts/bench/ingest_speed.py``).

    Raises
    ------
    ckpred.errors.InputFileError
        A file cannot be read, or no valid measurement was read at all.
    """
    _, result = read_config_inputs(cfg)
    print_summary(result.summary)
    if result.summary.valid_rows == 0:
        raise InputFileError(str(cfg.data.path), nothing_usable_message(result))
    return result.table
