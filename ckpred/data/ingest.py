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
hash-partitions the checked rows by their query key (up to ``data.chunk_mb`` of them held in
memory, the rest in spill files), so the rule check (per problem), the merge of repeats (per
problem and kernel) and a query (what the ranker and the Dask backend take whole) each need
one partition in memory, and writes the table part by part (a directory output with the
manifest of :mod:`ckpred.data.partitions`); :func:`read_files` keeps one partition in memory
and returns the table in order of first appearance. Both run the same code.
"""

from __future__ import annotations

import csv
import functools
import glob
import logging
import math
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ckpred.util import resolve_path
from ckpred.data.mapping import HiddenFields, InputMapping, map_rows, op_flops
from ckpred.data.partitions import DATASET_DIR, MANIFEST, describe_part, read_manifest, write_manifest
from ckpred.data.readers import (CHUNKED_READERS, CHUNKED_TABLE_READERS, READERS, TABLE_READERS, FileRead,
                                 ReadContext, detect_format, detect_table_format)
from ckpred.data.readers.common import KernelResolver, Reject, RowBuffer
from ckpred.data.readers.table_parquet import is_canonical
from ckpred.data.table import HEADER_COLUMNS, TABLE_FILE, canonical_schema, conform_arrow
from ckpred.errors import ConfigValueError, InputFileError
from ckpred.kernels.base import OpDefinition, load_op
from ckpred.util import OwnFile, atomic_dir, atomic_path, check_replaceable, temporary_dir

#: Relative tolerance of the check ``tflops * latency == FLOPs`` (beyond printing steps).
CONSISTENCY_RTOL = 0.02
REJECT_COLUMNS = ("source", "reason", "raw")
FORMATS = ("auto", *READERS)
#: Bytes of input read per block by default (``data.chunk_mb`` in the config).
DEFAULT_CHUNK_BYTES = 64 << 20


def _is_rejects_file(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.readline().rstrip(b"\r\n") == ",".join(REJECT_COLUMNS).encode()


#: A rejects CSV (its header line): a write replaces an existing file only when it is one (or empty).
REJECTS_FILE = OwnFile("a rejects CSV", _is_rejects_file)


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
def expand_paths(spec: str | Path | Iterable[str | Path], op: OpDefinition | None = None) -> list[Path]:
    """Files named by ``spec``: a path, a glob, a comma-separated list of them, or a list.

    Relative paths are resolved against the user's original working directory. A directory
    stands for its ``.parquet`` files; a partitioned table (a directory with the manifest of
    :mod:`ckpred.data.partitions`) for the parts its manifest lists, in its order, once the
    manifest is checked against them (:func:`~ckpred.data.partitions.read_manifest`, with
    ``op``): the Dask backend reads the same files and rows.

    Raises
    ------
    ckpred.errors.InputFileError
        When a glob matches nothing, a named file does not exist or a partitioned table's
        manifest disagrees with its files; the message names it.
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
        elif resolved.is_dir() and op is not None and (resolved / MANIFEST).is_file():
            manifest = read_manifest(resolved, op, one_combo=False)
            paths += [resolved / part["file"] for part in manifest["partitions"]]
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
    for path in paths:
        _check_regular(path)
    return list(dict.fromkeys(paths))


#: What a path that is no regular file is, by its mode (for the refusal).
_SPECIAL_FILES = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _check_regular(path: Path) -> None:
    """Refuse a path that is not a regular file: a FIFO would block the read forever and a
    device such as ``/dev/zero`` never ends (a symbolic link to a regular file is fine)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise InputFileError(str(path), exc.strerror or str(exc)) from exc
    if not stat.S_ISREG(mode):
        what = next((name for test, name in _SPECIAL_FILES if test(mode)), "not a regular file")
        raise InputFileError(str(path), f"is {what}; allowed: regular files (data.path names files ckpred reads "
                                        "to their end)")


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
    tables: list[pa.Table] = []
    summary = _run(paths, op, arch=arch, dtype=dtype, layout=layout, fmt=fmt, run_id=run_id, mapping=mapping,
                   arch_config=arch_config, chunk_bytes=chunk_bytes, vectorised=vectorised, partitions=None,
                   on_rejects=rejects.extend, on_table=tables.append)
    schema = canonical_schema(op)
    table = pa.concat_tables([t.cast(schema) for t in tables]).to_pandas()
    reject_frame = pd.DataFrame([(r.source, r.reason, r.raw) for r in rejects], columns=list(REJECT_COLUMNS))
    return IngestResult(table=table, rejects=reject_frame, summary=summary)


def ingest_to_parquet(paths: str | Path | Iterable[str | Path], op: OpDefinition, out: str | Path,
                      rejects: str | Path, *, arch: str, dtype: str, layout: str, fmt: str = "auto",
                      run_id: str = "", mapping: InputMapping | None = None, arch_config: Any = None,
                      chunk_bytes: int = DEFAULT_CHUNK_BYTES, vectorised: bool = True) -> IngestSummary:
    """Stream benchmark files into canonical Parquet and a rejects CSV, memory bounded by a chunk.

    The same rows, reasons, rejects and counts as :func:`read_files` (whose parameters these
    are), without holding the table: each block of about ``chunk_bytes`` is read, checked and
    hash-partitioned by the query key into ``ceil(input bytes / chunk_bytes)`` partitions, held
    in memory up to ``chunk_bytes`` in all and spilled to a temporary directory past that; then
    each partition -- every measurement of its problems, so the rule check and the merge of
    repeats need nothing else -- is merged and written. ``out`` ending in ``.parquet`` is one
    file (a row group per partition); otherwise a directory of ``part-NNNNN.parquet`` files, one
    per partition (each holds whole queries), with the manifest ``model.backend=dask`` trains
    from (:func:`ckpred.data.partitions.write_manifest`). Rejects stream to ``rejects`` (CSV:
    source, reason, raw) as they are found. Within a partition rows keep their order of first
    appearance.

    Returns
    -------
    IngestSummary
        The counts; ``rows`` and ``valid_rows`` are those written.
    """
    out, rejects = Path(out), Path(rejects)
    files = expand_paths(paths, op)
    size = sum(p.stat().st_size for p in files)
    partitions = max(1, -(-size // max(int(chunk_bytes), 1)))
    out.parent.mkdir(parents=True, exist_ok=True)
    # An out or rejects that holds what ingest did not write is refused before anything is read.
    # The spill and the outputs' temporaries are named for this process and removed on every
    # error (a killed run's by the next write into the same directory).
    with (temporary_dir(out.parent, "ckpred-ingest") as spill,
          atomic_path(rejects, REJECTS_FILE) as reject_tmp, open(reject_tmp, "w", newline="") as reject_fh,
          _TableWriter(out, op) as writer):
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
    return summary


def _run(paths: str | Path | Iterable[str | Path], op: OpDefinition, *, arch: str, dtype: str, layout: str,
         fmt: str, run_id: str, mapping: InputMapping | None, arch_config: Any, chunk_bytes: int,
         vectorised: bool, partitions: tuple[int, Path] | None, on_rejects: Callable[[list[Reject]], None],
         on_table: Callable[[pa.Table], None]) -> IngestSummary:
    """The one ingestion: read and check in chunks, partition, then merge each partition.

    ``partitions`` is ``None`` (one partition, in memory: the table in order of first
    appearance) or (count, spill directory). Rejects and canonical table parts (arrow tables)
    go to the callbacks. Rows travel as arrow tables of numbers: texts (reasons, run ids) as
    codes into the run's :class:`_Texts`, the source as (file, line); the text columns are
    built once, when a part is written.
    """
    if fmt not in FORMATS:
        raise ConfigValueError("data.format", fmt, f"one of {list(FORMATS)}")
    mapping = mapping if mapping is not None else InputMapping.of_op(op)
    if mapping is not None and mapping.format not in ("auto", *TABLE_READERS, *READERS):
        raise ConfigValueError("op.input.format", mapping.format,
                               f"'auto' or a registered reader {sorted({*TABLE_READERS, *READERS})}")
    files = expand_paths(paths, op)
    # A field of the op is judged per row, not against the run's config.
    resolver = KernelResolver(op, dtype=None if "dtype" in op.problem_names else dtype,
                              layout=None if "layout" in op.problem_names else layout)
    labels = _labels(files)
    summary = IngestSummary(files=[labels[p] for p in files])
    texts = _Texts([labels[p] for p in files])
    store = _Partitions(op, *(partitions or (1, None)), hold_bytes=chunk_bytes)
    headers = (("arch", arch), ("dtype", dtype), ("layout", layout))
    seen: set[str] = set()  # header columns a table gives per row (input.columns.arch...)
    n_rows = n_rejects = 0
    rejected: Counter[str] = Counter()
    hidden = HiddenFields()
    sizes = [p.stat().st_size for p in files]
    for file, path in enumerate(files):
        read_bytes = 0
        for rows, rejects, nbytes in _file_chunks(path, fmt, mapping, op, resolver, summary, labels[path], texts,
                                                  file, hidden, arch=arch, dtype=dtype, layout=layout, run_id=run_id,
                                                  chunk_bytes=chunk_bytes, vectorised=vectorised):
            for h, value in headers:
                if h in rows.column_names and h not in op.problem_names:
                    seen.add(h)
                    rows = _filled(rows, h, value)
            store.add(_validate(rows, op, texts))
            n_rows += rows.num_rows
            n_rejects += len(rejects)
            rejected.update(_category(r.reason) for r in rejects)
            on_rejects(rejects)
            del rows, rejects
            # a compressed file holds more text than its size says: more partitions, each fitting a chunk
            read_bytes += nbytes
            sizes[file] = max(sizes[file], read_bytes)
            store.expect(sum(sizes))
    per_row = [h for h, _ in headers if h in seen]
    summary.records = n_rows + n_rejects
    summary.rejected = dict(rejected)
    summary.merge_key = (*op.problem_names, *per_row)
    kernels = _kernel_columns(resolver, op)
    rule_kernels = _rule_kernels(resolver, op)
    constants = {name: str(value) for name, value in (("op", op.name), *headers)
                 if name not in op.problem_names and name not in per_row}  # else the row's own value
    invalid: Counter[str] = Counter()
    for rows in store.parts(texts):
        count = rows.num_rows
        try:
            for h, value in headers:
                if h in per_row:
                    rows = _filled(rows, h, value)
            _check_unread(rows, op, per_row, hidden, texts)
            rows = _check_rules(rows, op, rule_kernels, texts, arch=arch_config if arch_config is not None else arch,
                                dtype=dtype, layout=layout)
            valid = _numpy(rows, "is_valid")
            summary.valid += int(valid.sum())
            if not valid.all():
                counts = np.bincount(_numpy(rows, "reason")[~valid])
                for code in np.flatnonzero(counts).tolist():
                    invalid[_category(texts.values[code])] += int(counts[code])
            table, superseded, sources = _merge(rows, op, texts, per_row)
        except MemoryError:
            raise InputFileError(", ".join(summary.files), f"out of memory merging {count:,} measurements: every "
                                 "repeat of a query is merged in memory (about 100 bytes each, its sources joined), "
                                 "and these files repeat one query more often than this process can hold (a "
                                 "compressed file repeating one line?)") from None
        del rows
        summary.superseded += len(superseded)
        on_rejects(superseded)
        table = _canonical_part(table, sources, op, kernels, constants, texts)
        summary.rows += table.num_rows
        summary.valid_rows += int(_numpy(table, "is_valid").sum())
        on_table(table)
    summary.invalid = dict(invalid)
    return summary


def _canonical_part(rows: pa.Table, sources: tuple[np.ndarray, pa.Array], op: OpDefinition,
                    kernels: dict[str, np.ndarray | pa.Array], constants: dict[str, str], texts: "_Texts") -> pa.Table:
    """Merged rows as a canonical table part (:func:`ckpred.data.table.conform_arrow`).

    The kernel fields come from the rows' kernel codes (:func:`_kernel_columns`), the header
    columns the rows do not carry from ``constants``; the text columns are built here, once
    per row: until now rows carried codes and line numbers. ``sources`` are the merged pairs'
    joined sources (:func:`_merge`).
    """
    codes = _numpy(rows, "kernel")
    columns = {name: _by_code(values, codes) for name, values in kernels.items()}
    for name, value in constants.items():
        columns[name] = _by_code(pa.array([value]), np.zeros(rows.num_rows, dtype=np.int32))
    columns["source"] = _patched(_source_texts(rows, texts), *sources)
    columns["invalid_reason"] = texts.take(_numpy(rows, "reason"))
    columns["run_id"] = texts.take(_numpy(rows, "run"))
    table = rows.drop_columns([c for c in CARRIER_COLUMNS if c in rows.column_names])
    for name, values in columns.items():
        table = _set(table, name, values)
    return conform_arrow(table, op)


def _file_chunks(path: Path, fmt: str, mapping: InputMapping | None, op: OpDefinition, resolver: KernelResolver,
                 summary: IngestSummary, label: str, texts: "_Texts", file: int, hidden: HiddenFields, *, arch: str,
                 dtype: str, layout: str, run_id: str, chunk_bytes: int,
                 vectorised: bool) -> Iterator[tuple[pa.Table, list[Reject], int]]:
    """(rows, rejects, bytes of text read) of each chunk of one file (0 bytes: the reader does
    not say); records the file's format in ``summary``."""
    table_reader, file_fmt = _reader_of(path, fmt, mapping, op)
    summary.formats.append(file_fmt or "empty")
    if file_fmt is None:  # empty file: nothing to read, nothing lost
        return
    ctx = ReadContext(op=op, resolver=resolver, dtype=dtype, layout=layout, arch=arch, label=label)
    try:
        before = os.stat(path)
        if table_reader:
            chunked_table = CHUNKED_TABLE_READERS.get(file_fmt)
            raws = (chunked_table(path, ctx, chunk_bytes) if chunked_table is not None
                    else iter([TABLE_READERS[file_fmt](path, ctx)]))
            for raw in raws:
                mapped = map_rows(raw, op, mapping, resolver,  # type: ignore[arg-type]
                                  label=label, run_id=run_id or label, run_arch=arch)
                rows = _frame_rows(mapped.frame, texts, file)
                for name, codes in hidden.codes(file, mapped.unread, texts.codes_of).items():
                    rows = rows.append_column(name, pa.array(codes))
                # in the file's order: the same rejects file whatever the chunks
                yield rows, _in_file_order(raw.rejects + mapped.rejects), raw.input_bytes
            _check_unchanged(path, before)
            return
        chunked = CHUNKED_READERS.get(file_fmt) if vectorised else None
        reads = chunked(path, ctx, chunk_bytes) if chunked is not None else iter([READERS[file_fmt](path, ctx)])
        for read in reads:
            yield (_frame_rows(read.frame, texts, file) if read.frame is not None
                   else _buffer_rows(read, op, texts, file, run_id or label)), read.rejects, 0
            if read.declared_records is not None and read.found_records is not None \
                    and read.found_records < read.declared_records:
                summary.missing[label] = read.declared_records - read.found_records
        _check_unchanged(path, before)
    except InputFileError:
        raise
    except OSError as exc:
        raise InputFileError(str(path), exc.strerror or str(exc)) from exc


def _check_unchanged(path: Path, before: os.stat_result) -> None:
    """Refuse a file that changed, other than by growing, while it was read.

    A file another process truncated, replaced or rewrote in place meanwhile was read partly
    as it was and partly as it is: its rows are not one file's rows. A file that grew (a
    benchmark still appending) is fine: what was read is whole lines of it.

    Raises
    ------
    ckpred.errors.InputFileError
        Naming the file and what changed.
    """
    after = os.stat(path)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        change = "was replaced by another file"
    elif after.st_size < before.st_size:
        change = f"shrank from {before.st_size:,} to {after.st_size:,} bytes"
    elif after.st_size == before.st_size and after.st_mtime_ns != before.st_mtime_ns:
        change = "was rewritten in place"
    else:
        return
    raise InputFileError(str(path), f"the file {change} while being read (by another process); read it again once "
                                    "it is complete")


def _in_file_order(rejects: list[Reject]) -> list[Reject]:
    """``rejects`` of one chunk by their line (``file:line`` or ``file:row n``; stable)."""
    def line(reject: Reject) -> int:
        tail = reject.source.rsplit(":", 1)[-1].removeprefix("row ")
        return int(tail) if tail.isdigit() else 0

    return sorted(rejects, key=line) if len(rejects) > 1 else rejects


def _check_unread(rows: pa.Table, op: OpDefinition, per_row: Sequence[str], hidden: HiddenFields,
                  texts: "_Texts") -> None:
    """Refuse a text column the op does not read that differs between repeats of one problem
    and kernel in this partition (:class:`ckpred.data.mapping.HiddenFields`)."""
    carried = {c: _numpy(rows, c) for c in rows.column_names if c.startswith(HiddenFields.PREFIX)}
    if not carried or rows.num_rows < 2:
        return
    carried = {c: np.nan_to_num(np.asarray(v, dtype=np.float64), nan=0).astype(np.int64) for c, v in carried.items()}
    group = group_ids([*(_numpy(rows, c) for c in (*op.problem_names, *per_row)), _numpy(rows, "kernel")])
    hidden.check(carried, group, _numpy(rows, "file"), texts.labels, texts.values, op)


#: Spill files are not compressed, and are read back memory-mapped: a partition's columns are
#: then the file's pages, with no decompression. The spill of a row of numbers is smaller than
#: its line of input text, so the temporary disk stays below the input's size.
_SPILL_OPTIONS = pa.ipc.IpcWriteOptions(compression=None)


class _Partitions:
    """Checked row chunks, hash-partitioned by the query key (:func:`hash_columns`).

    One partition keeps the chunks in memory (all of the input fits in one chunk, or the
    caller wants the table in memory anyway). With more, each chunk's share of every
    partition is held in memory while the held shares stay within ``hold_bytes``, and the
    rest spill to ``spill`` (Arrow IPC: the columns are written and read back as they are); a
    partition is put together only when it is merged. So memory holds one chunk or one
    partition at a time, plus at most ``hold_bytes`` of held rows. Holding saves the spill's
    write and read back, which cost system time per page written.

    The count is planned from the files' sizes; a compressed file holds more text than its
    size, so when the text read outgrows the plan (:meth:`expect`), the count doubles until
    each partition is planned for one chunk again and the rows so far are partitioned anew
    (every partition of the old count splits into two of the new: a hash modulo ``2n`` is
    its value modulo ``n`` or that plus ``n``).
    """

    def __init__(self, op: OpDefinition, count: int, spill: Path | None, hold_bytes: int = 0) -> None:
        self.op, self.count, self.spill, self.hold_bytes = op, count, spill, hold_bytes
        self.tables: list[pa.Table] = []
        #: Each partition's pieces in chunk order: a held table, or the spill file it was written to.
        self.pieces: list[list[pa.Table | Path]] = [[] for _ in range(count)]
        self.held = 0
        self.chunks = 0

    def add(self, rows: pa.Table) -> None:
        if self.spill is None or self.count == 1:  # one partition: the files fit in one chunk
            self.tables.append(rows)
            return
        names = list(hash_columns(self.op))
        keys = [_numpy(rows, c) for c in names]
        gid = group_ids(keys)  # a chunk holds few problems: each is hashed once, not once per row
        first = first_rows(gid)
        part = partition_of(pd.DataFrame({c: k[first] for c, k in zip(names, keys)}), self.count)[gid]
        # a stable sort of 16-bit keys is a radix sort
        order = np.argsort(part.astype(np.uint16) if self.count <= 1 << 16 else part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.count + 1))
        for p in range(self.count):
            if bounds[p] == bounds[p + 1]:
                continue
            piece = rows.take(pa.array(order[bounds[p]:bounds[p + 1]]))
            if self.held + piece.nbytes <= self.hold_bytes:
                self.pieces[p].append(piece)
                self.held += piece.nbytes
                continue
            path = self.spill / f"p{p:05d}-c{self.chunks:06d}.arrow"
            with pa.ipc.new_file(str(path), piece.schema, options=_SPILL_OPTIONS) as writer:
                writer.write_table(piece)
            self.pieces[p].append(path)
        self.chunks += 1

    def expect(self, input_bytes: int) -> None:
        """Plan for ``input_bytes`` of input text in all: more partitions when the count planned
        leaves more than ``hold_bytes`` of input per partition (see the class docstring)."""
        if self.spill is None or self.hold_bytes <= 0:
            return
        count = self.count
        while count * self.hold_bytes < input_bytes:
            count *= 2
        if count == self.count:
            return
        old = [self.tables] if self.count == 1 else self.pieces
        self.count, self.tables, self.pieces, self.held = count, [], [[] for _ in range(count)], 0
        for pieces in old:
            for piece in pieces:
                if isinstance(piece, pa.Table):
                    self.add(piece)
                    continue
                with pa.memory_map(str(piece)) as fh:
                    self.add(pa.ipc.open_file(fh).read_all())
                piece.unlink()

    def parts(self, texts: "_Texts") -> Iterator[pa.Table]:
        """Each non-empty partition (all partitions' rows in order of first appearance)."""
        if self.spill is None or self.count == 1:
            tables, self.tables = self.tables, []
            yield (_joined_chunks(tables) if tables else
                   _validate(_buffer_rows(None, self.op, texts, 0, ""), self.op, texts))
            return
        for p in range(self.count):
            pieces, self.pieces[p] = self.pieces[p], []
            if not pieces:
                continue
            tables = []
            for piece in pieces:
                if isinstance(piece, pa.Table):
                    self.held -= piece.nbytes
                    tables.append(piece)
                    continue
                with pa.memory_map(str(piece)) as fh:
                    tables.append(pa.ipc.open_file(fh).read_all())
                piece.unlink()
            del pieces
            yield _joined_chunks(tables)


def _joined_chunks(tables: list[pa.Table]) -> pa.Table:
    """One table of contiguous columns from the row chunks ``tables`` (their columns unified:
    a column some chunks lack is null there)."""
    table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    return table.combine_chunks()


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
        self.discarded = False
        # Measured values and sources are (nearly) unique per row: a dictionary page for them
        # is built and thrown away. Min/max statistics serve filters on the problem and its
        # hardware; of the measured values and the texts they would cost a quarter of the write.
        names = self.schema.names
        self.options: dict[str, Any] = {
            "use_dictionary": [c for c in names if c not in _UNIQUE_PER_ROW],
            "write_statistics": [c for c in names if c in (*HEADER_COLUMNS, *op.problem_names, "is_valid")],
            # values handed to the encoders per call: fewer calls, the same pages and bytes
            "write_batch_size": 1 << 16}

    def __enter__(self) -> "_TableWriter":
        self._atomic: Any = atomic_path(self.out, TABLE_FILE) if self.single else atomic_dir(self.out, DATASET_DIR)
        self.tmp = self._atomic.__enter__()
        self.writer: Any = None
        return self

    def _writer(self, path: Path, schema: pa.Schema) -> Any:
        """A Parquet writer of the canonical table: text columns that arrive dictionary-encoded
        are written as the plain text columns they stand for (no arrow schema is stored, so they
        read back as ``string``); the table's metadata is added at :meth:`_close`."""
        import pyarrow.parquet as pq

        return pq.ParquetWriter(path, schema, store_schema=False, **self.options)

    def _close(self, writer: Any) -> None:
        writer.add_key_value_metadata(self.schema.metadata)
        writer.close()

    def write(self, table: pa.Table) -> None:
        """Write one canonical part (:func:`ckpred.data.table.conform_arrow`)."""
        if self.single:
            self.writer = self.writer or self._writer(self.tmp, table.schema)
            self.writer.write_table(table)
        else:
            file = self.tmp / f"part-{self.parts:05d}.parquet"
            writer = self._writer(file, table.schema)
            writer.write_table(table)
            self._close(writer)
            # a part of an op whose dtype (say) is a problem field mixes dtypes: described with
            # null there, the manifest still marks the directory (Dask refuses such a dataset)
            self.entries.append(describe_part(file, table, mixed=True))
        self.parts += 1

    def discard(self) -> None:
        """Leave ``out`` as it was (nothing usable was read)."""
        self.discarded = True

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if self.single:  # an input without rows still leaves a table with the schema
            self._close(self.writer or self._writer(self.tmp, self.schema))
        if kind is None and self.discarded:
            kind, exc = _Discarded, _Discarded()
        if kind is None:
            if not self.single:
                write_manifest(self.tmp, self.op, self.entries)
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


# -- row tables --------------------------------------------------------------------------------
#: Columns of the rows between reading and writing that the canonical table does not have:
#: the kernel's code, the codes of the invalid reason and run id (:class:`_Texts`) and where
#: the row was read (the file's index and the line).
CARRIER_COLUMNS = ("kernel", "reason", "run", "file", "line")


class _Texts:
    """The texts of one ingestion stored once each (``""`` is code 0); rows carry their codes.

    Reasons and run ids repeat across many rows; coding them keeps the rows numeric until a
    part is written. ``labels`` are the files' names in ``source`` (by file index).
    """

    def __init__(self, labels: Sequence[str]) -> None:
        self.labels = list(labels)
        self.values: list[str] = [""]
        self.codes: dict[str, int] = {"": 0}
        self._array: pa.Array | None = None

    def code(self, text: str) -> int:
        """The code of ``text`` (new texts are added)."""
        found = self.codes.get(text)
        if found is None:
            found = self.codes[text] = len(self.values)
            self.values.append(text)
        return found

    def codes_of(self, values: Any) -> np.ndarray:
        """The codes of each text in ``values``, looked up once per distinct text."""
        found, uniques = pd.factorize(np.asarray(values, dtype=object), use_na_sentinel=False)
        table = np.array([self.code("" if u is None or u != u else str(u)) for u in uniques] or [0], dtype=np.int32)
        return table[found] if len(found) else np.zeros(0, dtype=np.int32)

    def take(self, codes: np.ndarray) -> pa.Array:
        """The texts of ``codes``, dictionary-coded (the texts are distinct: a Parquet writer
        stores them once, without hashing a text per row)."""
        if self._array is None or len(self._array) != len(self.values):
            self._array = pa.array(self.values, pa.string())
        return pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes, dtype=np.int32)), self._array)


def _buffer_rows(read: FileRead | None, op: OpDefinition, texts: _Texts, file: int, run_id: str) -> pa.Table:
    """One chunk's row buffer as an arrow table (no per-row Python work except reasons).

    Besides the canonical measurement columns: :data:`CARRIER_COLUMNS` and the format's
    printing steps ``quantum_ms``/``quantum_tflops`` (for :func:`_validate`).
    """
    rows = read.rows if read is not None else RowBuffer(op.problem_names)
    n = len(rows)

    def ints(values: Any) -> np.ndarray:  # a view of the buffer: no copy of the big columns
        return np.frombuffer(values, dtype=np.int64) if n else np.zeros(0, dtype=np.int64)

    def floats(values: Any) -> np.ndarray:
        return np.frombuffer(values, dtype=np.float64) if n else np.zeros(0)

    columns: dict[str, Any] = {name: ints(values) for name, values in zip(op.problem_names, rows.problem)}
    columns["kernel"] = ints(rows.kernel)
    columns.update(tflops=floats(rows.tflops), latency_ms=floats(rows.latency), bandwidth_gbs=floats(rows.bandwidth))
    reason = np.zeros(n, dtype=np.int32)
    for i, text in rows.reasons.items():
        reason[i] = texts.code(text)
    columns["reason"] = reason
    columns["run"] = (texts.codes_of([r or run_id for r in rows.run_ids]) if rows.run_ids is not None
                      else np.full(n, texts.code(run_id), dtype=np.int32))
    columns["file"] = np.full(n, file, dtype=np.int32)
    columns["line"] = ints(rows.line)
    if rows.sources is not None:  # the reader names each row's source itself
        columns["source"] = pa.array(rows.sources, pa.string())
    columns["repeats"] = ints(rows.repeats) if rows.repeats is not None else np.ones(n, dtype=np.int64)
    columns["spread"] = floats(rows.spreads) if rows.spreads is not None else np.full(n, np.nan)
    columns["quantum_ms"] = np.full(n, rows.quantum_ms)
    columns["quantum_tflops"] = np.full(n, rows.quantum_tflops)
    return pa.table(columns)


def _frame_rows(frame: pd.DataFrame, texts: _Texts, file: int) -> pa.Table:
    """A table reader's row frame (``invalid_reason``, ``run_id`` and ``source`` as text, or a
    ``line`` number for the source ``<file>:<line>``) as the rows :func:`_buffer_rows` gives."""
    n = len(frame)
    coded = {"reason": texts.codes_of(frame["invalid_reason"]) if "invalid_reason" in frame else np.zeros(n, np.int32),
             "run": texts.codes_of(frame["run_id"]) if "run_id" in frame else np.zeros(n, np.int32),
             "file": np.full(n, file, dtype=np.int32),
             "line": frame["line"].to_numpy(np.int64) if "line" in frame else np.zeros(n, dtype=np.int64)}
    table = pa.Table.from_pandas(frame.drop(columns=[c for c in ("invalid_reason", "run_id", "line") if c in frame]),
                                 preserve_index=False)
    # pandas' own string columns arrive as large_string, and an empty object column (every
    # record of the chunk rejected) as null: one text type throughout
    table = table.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_large_string(f.type)
                                  or pa.types.is_null(f.type) else f for f in table.schema]))
    for name, values in coded.items():
        table = table.append_column(name, pa.array(values))
    return table


def _source_texts(rows: pa.Table, texts: _Texts, at: np.ndarray | None = None) -> pa.Array:
    """``source`` of the rows (at the positions ``at``): the reader's own, else ``<file>:<line>``."""
    file, line = _numpy(rows, "file"), _numpy(rows, "line")
    if at is not None:
        file, line = file[at], line[at]
    names = pa.array([f"{label}:" for label in texts.labels] or [""], pa.string())
    lines = pc.cast(pa.array(line), pa.string())
    if len(file) and file.min() == file.max():  # rows of one file (the usual part): one prefix inserted
        built = pc.binary_replace_slice(lines, start=0, stop=0, replacement=names[int(file[0])].as_py())
    else:
        built = pc.binary_join_element_wise(names.take(pa.array(file)), lines, "")
    if "source" not in rows.column_names:
        return built
    given = rows.column("source").combine_chunks()
    return pc.coalesce(given if at is None else given.take(pa.array(at)), built)


def _numpy(table: pa.Table, name: str) -> np.ndarray:
    """Column ``name`` as a numpy array (read-only view when arrow allows; null floats NaN)."""
    column = table.column(name)
    array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return array.to_numpy(zero_copy_only=False)


def _set(table: pa.Table, name: str, values: Any) -> pa.Table:
    """``table`` with column ``name`` replaced by (or appended as) ``values``."""
    if isinstance(values, np.ndarray):
        values = pa.array(values)
    at = table.schema.get_field_index(name)
    return table.set_column(at, name, values) if at >= 0 else table.append_column(name, values)


def _filled(table: pa.Table, name: str, value: str) -> pa.Table:
    """``table`` with the nulls of text column ``name`` set to ``value`` (the run's own)."""
    column = table.column(name)
    if not pa.types.is_string(column.type):
        column = column.cast(pa.string())
    return _set(table, name, pc.fill_null(column, value))


def _by_code(values: np.ndarray | pa.Array, codes: np.ndarray) -> np.ndarray | pa.Array:
    """The per-row column of the per-code ``values``: numbers taken, text dictionary-coded
    (the rows share the texts instead of copying them)."""
    if isinstance(values, np.ndarray):
        return values[codes]
    if isinstance(values, pa.DictionaryArray):  # per code, an index into its distinct texts
        return pa.DictionaryArray.from_arrays(pa.array(values.indices.to_numpy()[codes]), values.dictionary)
    if pa.types.is_string(values.type) and not values.null_count:
        return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32, copy=False)), values)
    return values.take(pa.array(codes)) if len(values) else pa.array([], values.type)


def _kernel_columns(resolver: KernelResolver, op: OpDefinition) -> dict[str, np.ndarray | pa.Array]:
    """Each kernel field and ``kernel_name`` of every resolved kernel, by code: numbers and
    flags as numpy arrays (a row's value is then one numpy take), text without nulls as a
    dictionary array of its distinct values (a Parquet writer then adds each distinct text to
    its dictionary once, not once per kernel), other text as arrow arrays."""
    kernels = resolver.frame()
    columns: dict[str, np.ndarray | pa.Array] = {}
    for name in (*op.kernel_names, "kernel_name"):
        values = pa.array(kernels[name])
        if pa.types.is_large_string(values.type):  # pandas' text columns: one text type throughout
            values = values.cast(pa.string())
        plain = len(values) and not values.null_count and (pa.types.is_integer(values.type) or pa.types.is_boolean(
            values.type) or pa.types.is_floating(values.type))
        if plain:
            columns[name] = values.to_numpy(zero_copy_only=False)
        elif pa.types.is_string(values.type) and not values.null_count:
            columns[name] = pc.dictionary_encode(values)
        else:
            columns[name] = values
    return columns


# -- checks ------------------------------------------------------------------------------------
def _validate(rows: pa.Table, op: OpDefinition, texts: _Texts) -> pa.Table:
    """Mark rows invalid (first reason wins) and zero the TFLOPS of every invalid row."""
    t = np.asarray(_numpy(rows, "tflops"), dtype=np.float64)
    lat = np.asarray(_numpy(rows, "latency_ms"), dtype=np.float64)
    bw = np.asarray(_numpy(rows, "bandwidth_gbs"), dtype=np.float64)
    reason = np.array(_numpy(rows, "reason"), dtype=np.int32)
    free = reason == 0
    # A throughput metric without a FLOPs formula gives no latency: NaN there is not a defect.
    latency_known = (np.asarray(pc.fill_null(rows.column("latency_known"), True).to_numpy(zero_copy_only=False),
                                dtype=bool) if "latency_known" in rows.column_names else np.ones(len(rows), dtype=bool))

    def mark(mask: np.ndarray, text: Any) -> None:
        hit = np.flatnonzero(mask & free)
        if len(hit) and not callable(text):
            reason[hit] = texts.code(text)
        for i in hit.tolist() if callable(text) else ():
            reason[i] = texts.code(text(i))
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
            # the columns as they are (to_pandas would copy them into one block first)
            flops = op_flops(op, pd.DataFrame({c: _numpy(rows, c) for c in op.problem_names}, copy=False))
            qt = np.asarray(_numpy(rows, "quantum_tflops"), dtype=np.float64)
            ql = np.asarray(_numpy(rows, "quantum_ms"), dtype=np.float64)
            lo = np.maximum(t - qt, 0.0) * np.maximum(lat - ql, 0.0) * 1e9
            hi = (t + qt) * (lat + ql) * 1e9
            ok = (hi >= flops * (1 - CONSISTENCY_RTOL)) & (lo <= flops * (1 + CONSISTENCY_RTOL))
            known = np.isfinite(flops)

            def inconsistent(i: int) -> str:
                implied = flops[i] / (lat[i] * 1e9) if lat[i] > 0 else math.inf
                return (f"inconsistent tflops: tflops={t[i]:g} but latency_ms={lat[i]:g} and the problem's "
                        f"{flops[i]:.6g} FLOPs give {implied:.6g} (tolerance {CONSISTENCY_RTOL:.0%})")

            mark(known & ~ok, inconsistent)
    valid = free
    out = rows.drop_columns([c for c in ("quantum_ms", "quantum_tflops", "latency_known") if c in rows.column_names])
    out = _set(out, "reason", reason)
    out = _set(out, "is_valid", pa.array(valid))
    if not valid.all():
        # The canonical table's convention for failures: TFLOPS 0, latency a real number.
        out = _set(out, "tflops", np.where(valid, t, 0.0))
        bad_latency = ~valid & ~(np.isfinite(lat) & (lat >= 0))  # valid rows of unknown latency keep NaN
        out = _set(out, "latency_ms", np.where(bad_latency, 0.0, lat))
        out = _set(out, "bandwidth_gbs", np.where(~valid & ~(np.isfinite(bw) & (bw >= 0)), np.nan, bw))
    return out


def _rule_kernels(resolver: KernelResolver, op: OpDefinition) -> pd.DataFrame:
    """The kernel fields of every resolved kernel, by code, as the op's rules read them (text
    fields as categoricals: a row's kernel fields are then a take of small codes)."""
    kernels = resolver.frame()
    return kernels.astype({c: "category" for c in op.kernel_names if not pd.api.types.is_numeric_dtype(kernels[c])
                           and not pd.api.types.is_bool_dtype(kernels[c])})[list(op.kernel_names)]


def _check_rules(rows: pa.Table, op: OpDefinition, kernels: pd.DataFrame, texts: _Texts, *, arch: Any,
                 dtype: str, layout: str) -> pa.Table:
    """Mark invalid the measurements of a problem the op's rules say no kernel can run.

    When the op's validity rules (:meth:`OpDefinition.validity`) refuse *every* kernel measured
    valid on a problem -- a degenerate problem such as ``split_k=0`` -- the measurements
    contradict the op: they become invalid with the reason ``rule violation: <rule message>``.
    A problem some measured kernel may run is left as measured (a rule that is stricter than
    the hardware must not erase data). An op whose rules cannot be evaluated here (a rule
    needing an arch constant the run does not have) is not judged, with a warning. ``kernels``
    are the resolved kernels' fields (:func:`_rule_kernels`).
    """
    valid = _numpy(rows, "is_valid")
    if not valid.any():
        return rows
    idx = np.flatnonzero(valid)
    every = len(idx) == len(valid)  # the usual part: the columns as they are, not copies of them

    def of_valid(values: np.ndarray) -> np.ndarray:
        return values if every else values[idx]

    codes = of_valid(_numpy(rows, "kernel"))
    # a table that gives each row its arch is judged with each arch's own constants
    per_row_arch = "arch" in rows.column_names and "arch" not in op.problem_names
    row_arch = of_valid(_numpy(rows, "arch")) if per_row_arch else None
    problem_id = group_ids([*(of_valid(_numpy(rows, c)) for c in op.problem_names),
                            *([row_arch] if per_row_arch else [])])

    def judge(at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(may run, rule message) of the valid measurements at positions ``at``."""
        ok = np.ones(len(at), dtype=bool)
        why = np.full(len(at), "", dtype=object)
        problems = rows.select(list(op.problem_names)).take(pa.array(idx[at])).to_pandas()
        kernel_rows = kernels.iloc[codes[at]].reset_index(drop=True)
        names = row_arch[at] if row_arch is not None else np.full(len(at), getattr(arch, "name", arch), dtype=object)
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
    first = first_rows(problem_id)
    try:
        ok_first, _ = judge(first)
        suspect = np.zeros(problem_id.max() + 1, dtype=bool)
        suspect[problem_id[first[~ok_first]]] = True
        if not suspect.any():
            return rows
        at = np.flatnonzero(suspect[problem_id])
        ok, why = judge(at)
    except (ValueError, KeyError, NotImplementedError) as exc:  # no arch constants for a rule, or no rules:
        # kept as measured, and said so
        # (a rule no table can evaluate -- ordering a categorical -- is refused when the op is composed)
        _warn_once(f"op {op.name!r}: the validity rules were not judged on this table ({exc})")
        return rows
    runnable = np.bincount(problem_id[at], weights=ok.astype(np.float64), minlength=problem_id.max() + 1)
    dead = runnable[problem_id[at]] == 0
    if not dead.any():
        return rows
    bad = idx[at][dead]
    reason = np.array(_numpy(rows, "reason"), dtype=np.int32)
    reason[bad] = [texts.code(f"rule violation: {w or 'the op rules out every kernel for this problem'}")
                   for w in why[dead]]
    rows = _set(rows, "reason", reason)
    is_valid = valid.copy()
    is_valid[bad] = False
    tflops = np.array(_numpy(rows, "tflops"), dtype=np.float64)
    tflops[bad] = 0.0
    return _set(_set(rows, "is_valid", pa.array(is_valid)), "tflops", tflops)


@functools.lru_cache(maxsize=64)
def _warn_once(message: str) -> None:
    """Log ``message`` once per process (a table's partitions would repeat it)."""
    logging.getLogger(__name__).warning(message)


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

    The same numbering as ``DataFrame.groupby(keys, sort=False, dropna=False).ngroup()``.
    Rows come in runs of one key (a sweep measures every kernel of a problem in a row): when
    the runs are few, only each run's first row is numbered (:func:`_combined_group_ids`)
    and its number repeated over the run; otherwise every row is.
    """
    if not len(columns):
        return np.zeros(0, dtype=np.int64)
    columns = [np.asarray(c) for c in columns]
    n = len(columns[0])
    if n >= _RUN_MIN_ROWS:
        new_run = np.zeros(n, dtype=bool)
        new_run[0] = True
        for values in columns:  # a NaN starts a run of its own: runs only need to hold one key
            new_run[1:] |= values[1:] != values[:-1]
        starts = np.flatnonzero(new_run)
        if len(starts) <= n // 8:
            numbers = _combined_group_ids([values[starts] for values in columns])
            return np.repeat(numbers, np.diff(np.append(starts, n)))
    return _combined_group_ids(columns)


#: Rows below which :func:`group_ids` does not look for runs (it would save little).
_RUN_MIN_ROWS = 4096


def _combined_group_ids(columns: Sequence[np.ndarray]) -> np.ndarray:
    """:func:`group_ids` of every row: the columns are combined into one integer code (an
    integer column of a small range by its offset from the minimum, any other by
    ``pd.factorize``), which is factorized once: no group-by machinery over the whole frame,
    one hash pass instead of one per column."""
    gid = np.zeros(len(columns[0]), dtype=np.int64)
    groups = 1
    for values in columns:
        if values.dtype.kind in "iub" and len(values):
            low, high = int(values.min()), int(values.max())
            if low == high:  # one value: no group is split by it
                continue
            width = high - low + 1
            # added in place below; offset first where the sum could leave int64
            codes = values if values.dtype.kind in "ib" and -(1 << 61) < low and high < 1 << 61 \
                else values.astype(np.int64) - low
            low = low if codes is values else 0
        else:
            codes, uniques = pd.factorize(values, use_na_sentinel=False)
            low, width = 0, len(uniques)
        width = max(width, 1)
        if groups * width >= 1 << 62:  # keep the combined code in int64
            gid, uniques_gid = pd.factorize(gid)
            groups = max(len(uniques_gid), 1)
            if groups * width >= 1 << 62:  # a wide integer range: hash it after all
                codes, uniques = pd.factorize(values, use_na_sentinel=False)
                low, width = 0, max(len(uniques), 1)
        # in place (the key columns of a chunk are long): gid = gid * width + codes - low
        gid *= width
        gid += codes
        if low:
            gid -= low
        groups *= width
    return pd.factorize(gid)[0].astype(np.int64, copy=False)


def first_rows(gid: np.ndarray) -> np.ndarray:
    """The first row of each group of :func:`group_ids` (whose groups are numbered by first
    appearance, so a group's first row is where its id exceeds every id before it)."""
    if not len(gid):
        return np.zeros(0, dtype=np.int64)
    seen = np.maximum.accumulate(gid)
    return np.flatnonzero(np.r_[True, seen[1:] > seen[:-1]])


def _merge(rows: pa.Table, op: OpDefinition, texts: _Texts,
           extra: Sequence[str] = ()) -> tuple[pa.Table, list[Reject], tuple[np.ndarray, pa.Array]]:
    """One row per (problem, kernel): medians over valid repeats (see the module docstring).

    The output keeps each pair's first row (one copy of the table, in order of first
    appearance) and overwrites only the pairs measured more than once.

    Returns
    -------
    tuple
        The merged rows, the superseded measurements (rejects), and the ``;``-joined sources
        of the merged pairs -- (their positions in the merged rows, their texts) -- which
        replace the first row's own when the part is written.
    """
    unmerged = (np.zeros(0, dtype=np.int64), pa.array([], pa.string()))
    keys = [*op.problem_names, *extra, "kernel"]
    if not rows.num_rows:
        return rows, [], unmerged
    # the problem first (its rows come in runs), then the (problem, kernel) pairs
    problem = (group_ids([_numpy(rows, c) for c in keys[:-1]]) if len(keys) > 1
               else np.zeros(rows.num_rows, dtype=np.int64))
    gid = _combined_group_ids([problem, _numpy(rows, "kernel")])
    counts = np.bincount(gid)
    multi = counts[gid] > 1
    if not multi.any():
        return rows, [], unmerged
    first = first_rows(gid)
    # row g is group g; the columns the merge rewrites are taken by numpy below, not copied twice
    out = rows.drop_columns([c for c in _MERGED_COLUMNS if c in rows.column_names]).take(pa.array(first))
    at = np.flatnonzero(multi)
    sub_gid = gid[at]
    multi_ids = np.flatnonzero(counts > 1)  # ascending: the groups of sub_gid in order
    order = np.argsort(sub_gid, kind="stable")  # each group's rows together, in order of appearance
    sorted_gid = sub_gid[order]
    starts = np.flatnonzero(np.r_[True, sorted_gid[1:] != sorted_gid[:-1]])
    text = _source_texts(rows, texts, at[order])
    sources = pc.binary_join(pa.ListArray.from_arrays(pa.array(np.r_[starts, len(order)], pa.int32()), text), ";")
    run_codes = _joined_run_ids(_numpy(rows, "run")[at][order], sorted_gid, texts)
    sub = pd.DataFrame({"_gid": sub_gid, "is_valid": _numpy(rows, "is_valid")[at],
                        **{c: np.asarray(_numpy(rows, c), dtype=np.float64)[at]
                           for c in ("tflops", "latency_ms", "bandwidth_gbs")},
                        "repeats": _numpy(rows, "repeats")[at]})
    repeats = np.asarray(_numpy(rows, "repeats"), dtype=np.int64)[first]
    repeats[multi_ids] = np.bincount(sub_gid, weights=sub["repeats"].to_numpy(np.float64),
                                     minlength=len(first))[multi_ids].astype(np.int64)
    spread = np.asarray(_numpy(rows, "spread"), dtype=np.float64)[first]
    spread[multi_ids] = np.nan
    valid = sub[sub["is_valid"]].groupby("_gid")
    stats = pd.DataFrame({
        "tflops": valid["tflops"].median(), "latency_ms": valid["latency_ms"].median(),
        "bandwidth_gbs": valid["bandwidth_gbs"].median(), "tmin": valid["tflops"].min(),
        "tmax": valid["tflops"].max(), "n": valid.size(), "repeats": valid["repeats"].sum(),
    })
    idx = stats.index.to_numpy()
    columns: dict[str, np.ndarray] = {}
    for col in ("tflops", "latency_ms", "bandwidth_gbs"):
        values = np.asarray(_numpy(rows, col), dtype=np.float64)[first]
        values[idx] = stats[col].to_numpy()
        columns[col] = values
    repeats[idx] = stats["repeats"].to_numpy()
    columns["repeats"] = repeats
    spread[idx] = ((stats["tmax"] - stats["tmin"]) / stats["tflops"]).where(stats["n"] >= 2).to_numpy()
    columns["spread"] = spread
    is_valid = np.asarray(_numpy(rows, "is_valid"), dtype=bool)[first]
    is_valid[idx] = True
    columns["is_valid"] = is_valid
    reason = np.asarray(_numpy(rows, "reason"), dtype=np.int32)[first]
    reason[idx] = 0
    columns["reason"] = reason
    run = np.asarray(_numpy(rows, "run"), dtype=np.int32)[first]
    run[multi_ids] = run_codes
    columns["run"] = run
    for col, values in columns.items():
        out = _set(out, col, values)
    dropped = at[~sub["is_valid"].to_numpy() & np.isin(sub_gid, idx)]
    superseded = []
    if len(dropped):
        lost = rows.select(["reason", "tflops", "latency_ms"]).take(pa.array(dropped)).to_pydict()
        superseded = [Reject(source, f"superseded: {texts.values[code]} (a valid repeat of this problem and kernel "
                                     "is in the table)", f"tflops={t} latency_ms={lat}")
                      for source, code, t, lat in zip(_source_texts(rows, texts, dropped).to_pylist(), lost["reason"],
                                                      lost["tflops"], lost["latency_ms"])]
    return out, superseded, (multi_ids, sources)


#: Columns :func:`_merge` computes for every merged row (the rest are the group's first row's).
_MERGED_COLUMNS = ("tflops", "latency_ms", "bandwidth_gbs", "repeats", "spread", "is_valid", "reason", "run")


def _joined_run_ids(run: np.ndarray, gid: np.ndarray, texts: _Texts) -> np.ndarray:
    """The code of each group's distinct run ids, ``;``-joined in order of first appearance.

    ``run`` holds the run-id codes of rows sorted by their group ``gid`` (ascending; each
    group's rows in order of appearance). Most groups hold one run id: its own code.
    """
    pair = gid.astype(np.int64) * (int(run.max()) + 1) + run
    _, first = np.unique(pair, return_index=True)
    first.sort()  # group by group, each group's run ids in order of first appearance
    kept_gid, kept_run = gid[first], run[first]
    starts = np.flatnonzero(np.r_[True, kept_gid[1:] != kept_gid[:-1]])
    sizes = np.diff(np.r_[starts, len(kept_gid)])
    codes = kept_run[starts].astype(np.int32)
    for j in np.flatnonzero(sizes > 1).tolist():
        codes[j] = texts.code(";".join(texts.values[c] for c in kept_run[starts[j]:starts[j] + sizes[j]].tolist()))
    return codes


def _patched(column: Any, at: np.ndarray, values: pa.Array) -> pa.Array:
    """The text ``column`` with the text array ``values`` at the ascending positions ``at``."""
    base = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not len(at):
        return base
    mask = np.zeros(len(base), dtype=bool)
    mask[at] = True
    return pc.replace_with_mask(base.cast(pa.string()), pa.array(mask), values.cast(pa.string()))


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
        ``out`` or ``rejects`` is one of the input files, or the two are the same file; or
        holds something ingest did not write (:data:`ckpred.data.partitions.DATASET_DIR`,
        :data:`ckpred.data.table.TABLE_FILE`, :data:`REJECTS_FILE`), which it never replaces.
    """
    out = resolve_path(cfg.out)
    rejects = resolve_path(cfg.rejects) if cfg.get("rejects") else out.with_name(f"{out.stem}.rejects.csv")
    check_replaceable("out", cfg.out, TABLE_FILE if out.suffix == ".parquet" else DATASET_DIR)
    check_replaceable("rejects", cfg.rejects or rejects, REJECTS_FILE)
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
