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
streaming log by vectorised block readers, tables of declared ops in chunks of text, the other
formats whole), each chunk checked on its own (the value checks are per row). :func:`ingest_to_parquet` (``ckpred ingest``) then
hash-partitions the checked rows by their query key (up to ``data.chunk_mb`` of them held in
memory, the rest in spill files), so the rule check (per problem), the merge of repeats (per
problem and kernel) and a query (what the ranker and the Dask backend take whole) each need
one partition in memory, and writes the table part by part (a directory output with the
manifest of :mod:`ckpred.data.partitions`); :func:`read_files` keeps one partition in memory
and returns the table in order of first appearance. Both run the same code.

The stages live in :mod:`ckpred.data.ingestion` (options, rows, read, check, merge, write,
report); this module runs them and is what the rest of ckpred imports.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd
import pyarrow as pa

from ckpred.data.ingestion import check, merge, write
from ckpred.data.ingestion.check import CONSISTENCY_RTOL
from ckpred.data.ingestion.merge import hash_columns, partition_of
from ckpred.data.ingestion.options import DEFAULT_CHUNK_BYTES, FORMATS, IngestOptions
from ckpred.data.ingestion.read import FileReader, expand_paths, labels
from ckpred.data.ingestion.report import IngestResult, IngestSummary, nothing_usable_message, print_summary
from ckpred.data.ingestion.rows import CARRIER_COLUMNS, Texts, array_of, category, filled, first_rows, group_ids
from ckpred.data.ingestion.write import REJECT_COLUMNS, REJECTS_FILE, RejectsWriter, TableWriter
from ckpred.data.partitions import DATASET_DIR
from ckpred.data.readers.common import Reject
from ckpred.data.table import TABLE_FILE, canonical_schema
from ckpred.errors import ConfigValueError, InputFileError
from ckpred.kernels.base import OpDefinition, load_op
from ckpred.schema import IngestConfig, RecipeConfig
from ckpred.util import atomic_path, check_replaceable, resolve_path, temporary_dir

__all__ = ["CARRIER_COLUMNS", "CONSISTENCY_RTOL", "DEFAULT_CHUNK_BYTES", "FORMATS", "REJECT_COLUMNS", "REJECTS_FILE",
           "IngestOptions",
           "IngestResult", "IngestSummary", "expand_paths", "first_rows", "group_ids", "hash_columns",
           "ingest_config_to_parquet", "ingest_for_config", "ingest_to_parquet", "nothing_usable_message",
           "options_of", "output_paths", "partition_of", "print_summary", "read_config_inputs", "read_files"]

Paths = str | Path | Iterable[str | Path]


# -- the two ways to run it -------------------------------------------------------------------------
def read_files(paths: Paths, op: OpDefinition, options: IngestOptions | None = None, **fields: Any) -> IngestResult:
    """Read benchmark output files into the canonical table of ``op``, in memory.

    Parameters
    ----------
    paths
        Files or globs (a list, or one string with comma-separated items).
    op
        The op definition; kernel fields come from ``op.parse_name`` of each kernel name.
    options
        What the files are and how to read them (:class:`IngestOptions`); or give its fields
        as keywords instead (``arch=``, ``dtype=``, ``layout=``, ``fmt=``, ``chunk_bytes=``...).

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
        The format is not a known format.
    """
    options = IngestOptions.of(options, fields).for_op(op)  # a bad format is named before any file
    rejects: list[Reject] = []
    tables: list[pa.Table] = []
    summary = run(expand_paths(paths, op), op, options, None, rejects.extend, tables.append)
    schema = canonical_schema(op)
    table = pa.concat_tables([t.cast(schema) for t in tables]).to_pandas()
    reject_frame = pd.DataFrame([(r.source, r.reason, r.raw) for r in rejects], columns=list(REJECT_COLUMNS))
    return IngestResult(table=table, rejects=reject_frame, summary=summary)


def ingest_to_parquet(paths: Paths, op: OpDefinition, out: str | Path, rejects: str | Path,
                      options: IngestOptions | None = None, **fields: Any) -> IngestSummary:
    """Stream benchmark files into canonical Parquet and a rejects CSV, memory bounded by a chunk.

    The same rows, reasons, rejects and counts as :func:`read_files` (whose ``options`` these
    are), without holding the table: each chunk of about ``chunk_bytes`` is read, checked and
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
    options = IngestOptions.of(options, fields)
    out, rejects = Path(out), Path(rejects)
    files = expand_paths(paths, op)
    size = sum(p.stat().st_size for p in files)
    partitions = max(1, -(-size // max(int(options.chunk_bytes), 1)))
    out.parent.mkdir(parents=True, exist_ok=True)
    # An out or rejects that holds what ingest did not write is refused before anything is read.
    # The spill and the outputs' temporaries are named for this process and removed on every
    # error (a killed run's by the next write into the same directory).
    with (temporary_dir(out.parent, "ckpred-ingest") as spill,
          atomic_path(rejects, REJECTS_FILE) as reject_tmp, open(reject_tmp, "w", newline="") as reject_fh,
          TableWriter(out, op) as writer):
        summary = run(files, op, options, (partitions, spill), RejectsWriter(reject_fh), writer.write)
        if summary.valid_rows == 0:
            writer.discard()
    return summary


# -- the one ingestion ------------------------------------------------------------------------------
def run(files: list[Path], op: OpDefinition, options: IngestOptions, partitions: tuple[int, Path] | None,
        on_rejects: Callable[[list[Reject]], None], on_table: Callable[[pa.Table], None]) -> IngestSummary:
    """The one ingestion: read and check in chunks, partition, then merge each partition.

    ``partitions`` is ``None`` (one partition, in memory: the table in order of first
    appearance) or (count, spill directory). Rejects and canonical table parts (arrow tables)
    go to the callbacks. Rows travel as arrow tables of numbers (:mod:`ckpred.data.ingestion.rows`):
    texts (reasons, run ids) as codes into the run's :class:`~ckpred.data.ingestion.rows.Texts`,
    the source as (file, line); the text columns are built once, when a part is written.
    """
    options = options.for_op(op)
    names = labels(files)
    summary = IngestSummary(files=[names[p] for p in files])
    reader = FileReader(op, options, Texts([names[p] for p in files]), summary)
    count, spill = partitions or (1, None)
    store = merge.Partitions(op, count, spill, hold_bytes=options.chunk_bytes)
    per_row = _read_into(store, files, reader, on_rejects)
    summary.merge_key = (*op.problem_names, *per_row)
    _merge_parts(store, reader, per_row, on_rejects, on_table)
    return summary


def _read_into(store: merge.Partitions, files: list[Path], reader: FileReader,
               on_rejects: Callable[[list[Reject]], None]) -> list[str]:
    """Read and check every file's chunks into ``store``; the header columns a table gives per
    row (``input.columns.arch``...), which tell problems apart in the merge."""
    op, summary, texts = reader.op, reader.summary, reader.texts
    seen: set[str] = set()
    n_rows = n_rejects = 0
    rejected: Counter[str] = Counter()
    sizes = [p.stat().st_size for p in files]
    for file, path in enumerate(files):
        read_bytes = 0
        for rows, rejects, nbytes in reader.chunks(file, path):
            for h, value in reader.options.headers:
                if h in rows.column_names and h not in op.problem_names:
                    seen.add(h)
                    rows = filled(rows, h, value)
            store.add(check.validate(rows, op, texts))
            n_rows += rows.num_rows
            n_rejects += len(rejects)
            rejected.update(category(r.reason) for r in rejects)
            on_rejects(rejects)
            del rows, rejects
            # a compressed file holds more text than its size says: more partitions, each fitting a chunk
            read_bytes += nbytes
            sizes[file] = max(sizes[file], read_bytes)
            store.expect(sum(sizes))
    summary.records = n_rows + n_rejects
    summary.rejected = dict(rejected)
    return [h for h, _ in reader.options.headers if h in seen]


def _merge_parts(store: merge.Partitions, reader: FileReader, per_row: list[str],
                 on_rejects: Callable[[list[Reject]], None], on_table: Callable[[pa.Table], None]) -> None:
    """Check and merge each partition of ``store`` and hand on its canonical part."""
    op, options, summary, texts = reader.op, reader.options, reader.summary, reader.texts
    kernels = write.kernel_columns(reader.resolver, op)
    rule_kernels = check.rule_kernels(reader.resolver, op)
    constants = {name: str(value) for name, value in (("op", op.name), *options.headers)
                 if name not in op.problem_names and name not in per_row}  # else the row's own value
    invalid: Counter[str] = Counter()
    for rows in store.parts(texts):
        count = rows.num_rows
        try:
            for h, value in options.headers:
                if h in per_row:
                    rows = filled(rows, h, value)
            check.check_unread(rows, op, per_row, reader.hidden, texts)
            rows = check.check_rules(rows, op, rule_kernels, texts, options)
            _count_valid(rows, summary, invalid, texts)
            table, superseded, sources = merge.merge(rows, op, texts, per_row)
        except MemoryError:
            raise InputFileError(", ".join(summary.files), f"out of memory merging {count:,} measurements: every "
                                 "repeat of a query is merged in memory (about 100 bytes each, its sources joined), "
                                 "and these files repeat one query more often than this process can hold (a "
                                 "compressed file repeating one line?)") from None
        del rows
        summary.superseded += len(superseded)
        on_rejects(superseded)
        table = write.canonical_part(table, sources, op, kernels, constants, texts)
        summary.rows += table.num_rows
        summary.valid_rows += int(array_of(table, "is_valid").sum())
        on_table(table)
    summary.invalid = dict(invalid)


def _count_valid(rows: pa.Table, summary: IngestSummary, invalid: Counter[str], texts: Texts) -> None:
    """Add a checked partition's valid rows and invalid rows (by category) to the counts."""
    valid = array_of(rows, "is_valid")
    summary.valid += int(valid.sum())
    if not valid.all():
        counts = np.bincount(array_of(rows, "reason")[~valid])
        for code in np.flatnonzero(counts).tolist():
            invalid[category(texts.values[code])] += int(counts[code])


# -- config entry points -----------------------------------------------------------------------
def _path_spec(value: Any) -> Any:
    if isinstance(value, (str, Path)):
        return value
    return [str(v) for v in value]


def output_paths(cfg: IngestConfig) -> tuple[Path, Path]:
    """(``out``, rejects file) of an ingest config, refusing any that would overwrite an input.

    Raises
    ------
    ckpred.errors.ConfigValueError
        ``out`` or ``rejects`` is one of the input files, or the two are the same file; or
        holds something ingest did not write (:data:`ckpred.data.partitions.DATASET_DIR`,
        :data:`ckpred.data.table.TABLE_FILE`, :data:`REJECTS_FILE`), which it never replaces.
    """
    out = resolve_path(cfg.out)
    rejects = resolve_path(cfg.rejects) if cfg.rejects else out.with_name(f"{out.stem}.rejects.csv")
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


def options_of(cfg: RecipeConfig) -> IngestOptions:
    """The :class:`IngestOptions` of an ingest (or train) config."""
    return IngestOptions(arch=cfg.arch.name, dtype=cfg.dtype.name, layout=cfg.layout.name,
                         fmt=cfg.data.format or "auto", run_id=str(cfg.run_id if isinstance(cfg, IngestConfig) else ""),
                         arch_config=cfg.arch, chunk_bytes=int(cfg.data.chunk_mb) << 20)


def read_config_inputs(cfg: RecipeConfig) -> tuple[OpDefinition, IngestResult]:
    op = load_op(cfg.op)
    return op, read_files(_path_spec(cfg.data.path), op, options_of(cfg))


def ingest_config_to_parquet(cfg: IngestConfig, out: Path, rejects: Path) -> IngestSummary:
    """:func:`ingest_to_parquet` of an ingest config (``data.chunk_mb`` per chunk)."""
    return ingest_to_parquet(_path_spec(cfg.data.path), load_op(cfg.op), out, rejects, options_of(cfg))


def ingest_for_config(cfg: RecipeConfig) -> pd.DataFrame:
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
