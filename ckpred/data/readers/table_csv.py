"""Reader of any delimited text table: CSV (``.csv``, ``.csv.gz``, ``.csv.bz2``) or TSV.

The first non-blank line is the header; every later non-blank line is one record. Values stay
text here (the op's ``input`` section types them), so a value that is not a number is named in
its row's reason instead of turning a whole column into strings; leading and trailing spaces
are dropped. Quoted fields follow the :mod:`csv` rules. A line with another number of fields
than the header is rejected with its line number; a UTF-8 byte-order mark before the header is
dropped. Duplicate header names are kept as they are: the column map refuses to read a
duplicated column (it cannot know which one is meant).

:func:`read_chunks` gives the records in tables of about ``chunk_bytes`` of (decompressed) text
each, cut between records, so a file of any size, or a compressed file of any ratio, is held a
chunk at a time; the header is judged with the first chunk. A block of lines that is plain
(ASCII, no quote, no carriage return, no blank line, every line with the header's field
count) is split by pyarrow's CSV parser into text columns; any other block, and the rest of a
file from the first quote on (a quoted field may span lines), is read by :mod:`csv` line by
line. Both give the same values (tested on mutated tables).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import IO, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from ckpred.data.readers.common import RawTable, ReadContext, Reject, decode_line, open_binary
from ckpred.errors import InputFileError

NAME = "csv"
#: Bytes split by pyarrow at a time (a few MB stay in the CPU caches).
_BLOCK_BYTES = 4 << 20
#: Bytes a plain block holds: printable ASCII, tab and line feed. Anything else (non-ASCII, a
#: carriage return, a control byte, which Python's ``strip`` may take as a space and pyarrow's
#: trim not) sends the block to the line-by-line reader.
_PLAIN_BYTES = bytes([9, 10, *range(0x20, 0x7f)])
#: A line that is empty or spaces only: skipped by the line reader, a record to pyarrow.
_BLANK_LINE = re.compile(rb'(?:^|\n)[ \t]*\n|(?:^|\n)[ \t]+\Z')


def _plain(block: bytes) -> bool:
    """Whether pyarrow's split of ``block`` gives the line reader's records (see :data:`_PLAIN_BYTES`)."""
    if block.translate(None, _PLAIN_BYTES):
        return False
    if block.startswith(b"\n") or b"\n\n" in block:
        return False
    # a line starting with a space or tab is rare: only then look for one that is blank
    if block[:1] in (b" ", b"\t") or b"\n " in block or b"\n\t" in block:
        return _BLANK_LINE.search(block) is None
    return True


def _delimiter(path: Path) -> str:
    name = path.name.lower()
    for suffix in (".gz", ".bz2"):
        name = name.removesuffix(suffix)
    return "\t" if name.endswith((".tsv", ".tab")) else ","


def read(path: Path, ctx: ReadContext) -> RawTable:
    """Read one delimited table whole; see the module docstring.

    Raises
    ------
    ckpred.errors.InputFileError
        When the compressed stream is damaged (the message names the line reached).
    """
    (table,) = read_chunks(path, ctx, None)
    return table


def read_chunks(path: Path, ctx: ReadContext, chunk_bytes: int | None) -> Iterator[RawTable]:
    """The records of one delimited table in tables of about ``chunk_bytes`` bytes of text each
    (``None``: one table); every table but the last ends with a whole record.

    Raises
    ------
    ckpred.errors.InputFileError
        When the compressed stream is damaged (the message names the line reached), or it is
        not readable CSV.
    """
    reader = _Reader(path, ctx, chunk_bytes)
    try:
        with open_binary(path) as fh:
            yield from reader.chunks(fh)
    except (OSError, EOFError) as exc:  # a truncated or damaged gzip/bz2 stream
        raise InputFileError(str(path), f"damaged compressed stream after {reader.records} rows ({exc})") from exc
    except csv.Error as exc:
        raise InputFileError(str(path), f"not a readable CSV ({exc})") from exc


class _Reader:
    """One file's records, block by block, gathered into chunks."""

    def __init__(self, path: Path, ctx: ReadContext, chunk_bytes: int | None) -> None:
        self.label, self.delimiter = ctx.label, _delimiter(path)
        self.chunk_bytes = chunk_bytes
        self.header: list[str] | None = None
        self.chunk = _Chunk(0, 0)
        #: Bytes read, lines read, records kept so far (the last for messages).
        self.consumed = self.lineno = self.records = 0

    def chunks(self, fh: IO[bytes]) -> Iterator[RawTable]:
        """The chunk tables of the file ``fh`` (binary, decompressed)."""
        blocks = _Blocks(fh)
        for block in blocks:
            if b'"' in block:  # a quoted field may hold line ends: by lines from here on
                yield from self._by_lines(_lines(block, blocks))
                break
            while self.header is None and block:  # the header's line(s) by csv, the rest of the block on
                end = block.find(b"\n") + 1 or len(block)
                yield from self._by_lines(iter([block[:end]]))
                block = block[end:]
            if not block:
                continue
            if self._fast(block):
                self.consumed += len(block)
                yield from self._flush()
            else:
                yield from self._by_lines(_lines(block, None))
        if self.header is None:
            self.chunk = _Chunk(0, 0)
        yield self.chunk.table(self.header or [], self.label, self.consumed)

    def _flush(self) -> Iterator[RawTable]:
        """The current chunk, when it is full, and a new one started."""
        if self.chunk_bytes is not None and self.consumed - self.chunk.offset >= self.chunk_bytes:
            yield self.chunk.table(self.header or [], self.label, self.consumed)
            self.chunk = _Chunk(self.consumed, len(self.header or []))

    def _by_lines(self, lines: Iterator[bytes]) -> Iterator[RawTable]:
        """Records of ``lines`` by :mod:`csv` (a record may span lines)."""
        numbered: list[tuple[int, str]] = []

        def texts() -> Iterator[str]:
            for raw in lines:
                self.consumed += len(raw)
                self.lineno += 1
                text = decode_line(raw) if self.lineno == 1 else raw.decode("utf-8", "replace").rstrip("\r\n")
                numbered.append((self.lineno, text))
                yield text

        for parts in csv.reader(texts(), delimiter=self.delimiter):
            lineno, text = numbered[-1]
            numbered.clear()
            if not parts or all(not p.strip() for p in parts):
                continue
            parts = [p.strip() for p in parts]
            if self.header is None:
                self.header = parts
                self.chunk = _Chunk(self.chunk.offset, len(parts))
                continue
            if len(parts) != len(self.header):
                self.chunk.rejects.append(Reject(f"{self.label}:{lineno}", f"wrong field count: expected "
                                          f"{len(self.header)} {'tab' if self.delimiter == chr(9) else 'comma'}-"
                                          f"separated fields, got {len(parts)}", text))
            else:
                self.chunk.add(parts, lineno)
                self.records += 1
            yield from self._flush()

    def _fast(self, block: bytes) -> bool:
        """Split a plain block by pyarrow into the chunk; ``False`` (nothing taken) when the
        block is not plain or pyarrow refuses it."""
        width = len(self.header or [])
        if width < 2 or not _plain(block):
            return False
        names = [f"c{i}" for i in range(width)]
        try:
            table = pcsv.read_csv(
                pa.py_buffer(block),
                read_options=pcsv.ReadOptions(column_names=names, use_threads=False,
                                              block_size=min(len(block) + 1, _BLOCK_BYTES)),
                parse_options=pcsv.ParseOptions(delimiter=self.delimiter, quote_char=False, double_quote=False,
                                                escape_char=False, newlines_in_values=False, ignore_empty_lines=False),
                convert_options=pcsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()), null_values=[],
                                                    strings_can_be_null=False, quoted_strings_can_be_null=False))
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a line of another field count: by lines
            return False
        lines = block.count(b"\n") + (not block.endswith(b"\n"))
        if table.num_rows != lines:
            return False
        self.chunk.add_columns([pc.ascii_trim_whitespace(table.column(i)) for i in range(width)],
                               np.arange(self.lineno + 1, self.lineno + 1 + lines, dtype=np.int64))
        self.lineno += lines
        self.records += lines
        return True


class _Blocks:
    """Blocks of whole lines of about :data:`_BLOCK_BYTES` of ``fh`` (the last without a line
    end only at the end of the file); :meth:`rest` gives the lines not yet given."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh, self.pending = fh, b""

    def __iter__(self) -> Iterator[bytes]:
        while True:
            data = self.fh.read(_BLOCK_BYTES)
            if not data:
                if self.pending:
                    block, self.pending = self.pending, b""
                    yield block
                return
            data = self.pending + data
            end = data.rfind(b"\n") + 1
            if end == 0:  # no line end yet: a long line
                self.pending = data
                continue
            self.pending = data[end:]
            yield data[:end]

    def rest(self) -> Iterator[bytes]:
        """The lines after the last block given."""
        pending, self.pending = self.pending, b""
        if pending:
            yield from _lines(pending + self.fh.readline(), None)
        yield from self.fh


def _lines(block: bytes, after: "_Blocks | None") -> Iterator[bytes]:
    """The lines of ``block`` (with their line ends), then those of ``after``'s rest."""
    start = 0
    while start < len(block):
        end = block.find(b"\n", start) + 1 or len(block)
        yield block[start:end]
        start = end
    if after is not None:
        yield from after.rest()


class _Chunk:
    """The records of one chunk as text columns: pieces split by pyarrow, and lists of the
    records read line by line (a list per column, not a list object per record)."""

    def __init__(self, offset: int, width: int) -> None:
        self.offset = offset  # bytes of the file before the chunk
        self.pieces: list[tuple[list[pa.Array], np.ndarray]] = []
        self.columns: list[list[str]] = [[] for _ in range(width)]
        self.lines: list[int] = []
        self.rejects: list[Reject] = []

    def add(self, parts: list[str], lineno: int) -> None:
        for column, value in zip(self.columns, parts):
            column.append(value)
        self.lines.append(lineno)

    def add_columns(self, columns: list[pa.Array], lines: np.ndarray) -> None:
        self._settle()
        self.pieces.append((columns, lines))

    def _settle(self) -> None:
        """The records read line by line so far as a piece (pieces keep the file's order)."""
        if self.lines:
            self.pieces.append(([pa.array(c, pa.string()) for c in self.columns], np.asarray(self.lines, np.int64)))
            self.columns = [[] for _ in self.columns]
            self.lines = []

    def table(self, header: list[str], label: str, consumed: int) -> RawTable:
        self._settle()
        width = len(header)
        columns = {i: pa.chunked_array([chunk for p in self.pieces for chunk in _chunks_of(p[0][i])], pa.string())
                   for i in range(width)}
        lines = np.concatenate([p[1] for p in self.pieces]) if self.pieces else np.zeros(0, np.int64)
        frame = pa.table({f"c{i}": c for i, c in columns.items()}).to_pandas() if width else \
            pd.DataFrame(index=range(len(lines)))
        frame.columns = header  # set afterwards: duplicate names stay (the column map refuses them)
        return RawTable(frame, None, self.rejects, input_bytes=consumed - self.offset, lines=lines, label=label)


def _chunks_of(column: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return column.chunks if isinstance(column, pa.ChunkedArray) else [column]
