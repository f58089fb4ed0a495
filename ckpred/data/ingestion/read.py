"""Reading: the files a run names, and each file's chunks as rows (by the reader of its
format; a table's records through the op's input mapping)."""

from __future__ import annotations

import glob
import os
import stat
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import pyarrow as pa

from ckpred.data.ingestion.check import HiddenFields
from ckpred.data.ingestion.options import IngestOptions
from ckpred.data.ingestion.report import IngestSummary
from ckpred.data.ingestion.rows import Texts, buffer_rows, frame_rows
from ckpred.data.mapping import InputMapping, map_rows
from ckpred.data.partitions import MANIFEST, read_manifest
from ckpred.data.readers import (CHUNKED_READERS, CHUNKED_TABLE_READERS, READERS, TABLE_READERS, ReadContext,
                                 detect_format, detect_table_format)
from ckpred.data.readers.common import KernelResolver, Reject
from ckpred.data.readers.table_parquet import is_canonical
from ckpred.errors import InputFileError
from ckpred.kernels.base import OpDefinition
from ckpred.util import resolve_path


# -- paths -----------------------------------------------------------------------------------------
def expand_paths(spec: str | Path | Iterable[str | Path], op: OpDefinition | None = None) -> list[Path]:
    """Files named by ``spec``: a path, a glob, a comma-separated list of them, or a list.

    Relative paths are resolved against the user's original working directory. A directory
    stands for its ``.parquet`` files; a partitioned table (a directory with the manifest of
    :mod:`ckpred.data.partitions`) for the parts its manifest lists, in its order, once the
    manifest is checked against them (:func:`~ckpred.data.partitions.read_manifest`, with
    ``op``): the Dask backend reads the same files and rows. Every file must be a regular
    file (a FIFO would block the read, a device never ends).

    Raises
    ------
    ckpred.errors.InputFileError
        When a glob matches nothing, a named file does not exist or is no regular file, or a
        partitioned table's manifest disagrees with its files; the message names it.
    """
    items: list[str] = []
    for part in ([spec] if isinstance(spec, (str, Path)) else list(spec)):
        items += [p.strip() for p in str(part).split(",") if p.strip()]
    if not items:
        raise InputFileError(str(spec), "no file given (data.path is empty)")
    paths: list[Path] = []
    for item in items:
        resolved = resolve_path(item)
        written = os.path.expanduser(item)
        if glob.has_magic(written):  # what the user wrote, not the working directory's name
            pattern = written if os.path.isabs(written) else os.path.join(glob.escape(os.getcwd()), written)
            matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
            if not matches and resolved.is_file():  # a file whose own name holds * ? or [
                matches = [resolved]
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
        check_regular(path)
    return list(dict.fromkeys(paths))


#: What a path that is no regular file is, by its mode (for the refusal).
_SPECIAL_FILES = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def check_regular(path: Path) -> None:
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


# -- files -----------------------------------------------------------------------------------------
def labels(files: Sequence[Path]) -> dict[Path, str]:
    """How each file is named in ``source``: its path relative to the working dir when inside it."""
    cwd = Path.cwd()
    out = {}
    for path in files:
        try:
            out[path] = str(path.relative_to(cwd))
        except ValueError:
            out[path] = str(path)
    return out


def reader_of(path: Path, fmt: str, mapping: InputMapping | None, op: OpDefinition) -> tuple[bool, str | None]:
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


class FileReader:
    """The row chunks of each file of one run, with what the files share: the kernel resolver
    (a kernel has one code across files), the texts, the text columns carried to the merge and
    the summary's per-file records (format, declared records that are absent).
    """

    def __init__(self, op: OpDefinition, options: IngestOptions, texts: Texts, summary: IngestSummary) -> None:
        self.op, self.options, self.texts, self.summary = op, options, texts, summary
        # A field of the op is judged per row, not against the run's config.
        self.resolver = KernelResolver(op, dtype=None if "dtype" in op.problem_names else options.dtype,
                                       layout=None if "layout" in op.problem_names else options.layout)
        self.hidden = HiddenFields()

    def chunks(self, file: int, path: Path) -> Iterator[tuple[pa.Table, list[Reject], int]]:
        """(rows, rejects, bytes of text read) of each chunk of file number ``file`` (0 bytes:
        the reader does not say); records the file's format in the summary."""
        options = self.options
        table_reader, file_fmt = reader_of(path, options.fmt, options.mapping, self.op)
        self.summary.formats.append(file_fmt or "empty")
        if file_fmt is None:  # empty file: nothing to read, nothing lost
            return
        label = self.texts.labels[file]
        ctx = ReadContext(op=self.op, resolver=self.resolver, dtype=options.dtype, layout=options.layout,
                          arch=options.arch, label=label)
        try:
            before = os.stat(path)
            if table_reader:
                yield from self._table_chunks(file, path, file_fmt, ctx)
            else:
                yield from self._record_chunks(file, path, file_fmt, ctx)
            check_unchanged(path, before)
        except InputFileError:
            raise
        except OSError as exc:
            raise InputFileError(str(path), exc.strerror or str(exc)) from exc

    def _table_chunks(self, file: int, path: Path, fmt: str,
                      ctx: ReadContext) -> Iterator[tuple[pa.Table, list[Reject], int]]:
        """A table's chunks, each mapped to canonical rows by the op's input mapping."""
        chunked = CHUNKED_TABLE_READERS.get(fmt)
        raws = chunked(path, ctx, self.options.chunk_bytes) if chunked is not None else iter([TABLE_READERS[fmt](path,
                                                                                                               ctx)])
        for raw in raws:
            mapped = map_rows(raw, self.op, self.options.mapping, self.resolver,  # type: ignore[arg-type]
                              label=ctx.label, run_id=self.options.run_id or ctx.label, run_arch=self.options.arch)
            rows = frame_rows(mapped.frame, self.texts, file)
            for name, codes in self.hidden.codes(file, mapped.unread, self.texts.codes_of).items():
                rows = rows.append_column(name, pa.array(codes))
            # in the file's order: the same rejects file whatever the chunks
            yield rows, in_file_order(raw.rejects + mapped.rejects), raw.input_bytes

    def _record_chunks(self, file: int, path: Path, fmt: str,
                       ctx: ReadContext) -> Iterator[tuple[pa.Table, list[Reject], int]]:
        """A CK format's chunks (a block reader's, or the whole file's)."""
        chunked = CHUNKED_READERS.get(fmt) if self.options.vectorised else None
        reads = chunked(path, ctx, self.options.chunk_bytes) if chunked is not None else iter([READERS[fmt](path, ctx)])
        for read in reads:
            yield (frame_rows(read.frame, self.texts, file) if read.frame is not None
                   else buffer_rows(read, self.op, self.texts, file, self.options.run_id or ctx.label)), read.rejects, 0
            if read.declared_records is not None and read.found_records is not None \
                    and read.found_records < read.declared_records:
                self.summary.missing[ctx.label] = read.declared_records - read.found_records


def check_unchanged(path: Path, before: os.stat_result) -> None:
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


def in_file_order(rejects: list[Reject]) -> list[Reject]:
    """``rejects`` of one chunk by their line (``file:line`` or ``file:row n``; stable)."""
    def line(reject: Reject) -> int:
        tail = reject.source.rsplit(":", 1)[-1].removeprefix("row ")
        return int(tail) if tail.isdigit() else 0

    return sorted(rejects, key=line) if len(rejects) > 1 else rejects
