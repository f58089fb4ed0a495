"""Reader of the CK Tile streaming benchmark log.

Format (CK Tile's tile-engine streaming output): a shape header ``Shape i: M=16 N=1536 K=7168 dtype=fp8
layout=rcr`` between ``=====`` rules, then one JSON object per kernel::

    {"name": "...", "problem": {"split_k": 1, "m": 16, "n": 1536, "k": 7168, ...},
     "perf_result": {"latency(ms)": 0.01, "tflops(TFlops)": 12.34, "bandwidth(GB/s)": 567.89}}

Values are printed with 2 decimals, so the TFLOPS/latency consistency check allows half a
printing step on each. Failed kernels print nothing, so every row here is a measurement.

Per line: rules and blank lines are skipped; a header sets the current shape (a header that
does not parse is rejected and clears it, so no row is checked against a stale shape); a JSON
line becomes a row; anything else is rejected as an unrecognised line. A row whose problem
disagrees with its shape header is kept invalid (``shape mismatch``); a header whose dtype,
layout or arch differs from the config rejects the rows under it. A UTF-8 byte-order mark
before the first line is dropped.

Speed: :func:`read_chunks` decodes blocks of rows at once (:mod:`msgspec` into typed
structs, flattened into numpy columns piece by piece; numpy checks); :func:`read` is the
per-line reference (one ``orjson.loads`` per row), which also reads every line the block
decoder cannot vouch for. The kernel name is parsed once per distinct name (see
:class:`~ckpred.data.readers.common.KernelResolver`), and each row's name is looked up once
in the file's map of names to kernel codes.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import attrgetter, ne
from pathlib import Path
from typing import Any, Iterator

import msgspec
import numpy as np
import orjson
from msgspec.structs import astuple

from ckpred.data.readers.common import (_INT_LIMIT, FileRead, KernelResolver, ReadContext, Reject, RowBuffer, line_spans,
                                        sorted_rejects, to_float, to_int)

NAME = "log"
#: Half the printing step of the log's 2-decimal values.
QUANTUM = 0.005
HEADER = re.compile(r"^\s*Shape\s+(\d+)\s*:(.*)$")
RULE = re.compile(rb"^\s*=+\s*$")
_KV = re.compile(r"(\w+)\s*=\s*(\S+)")
BOM = "\ufeff".encode()
#: Keys of the perf_result object (first found wins).
LATENCY_KEYS = ("latency(ms)", "latency_ms")
TFLOPS_KEYS = ("tflops(TFlops)", "tflops")
BANDWIDTH_KEYS = ("bandwidth(GB/s)", "bandwidth_gbs")


class _Header:
    """The current shape header: problem values by field name, or the reason its rows are rejected."""

    def __init__(self, text: str, lineno: int, ctx: ReadContext) -> None:
        self.text, self.lineno = text, lineno
        self.problem: dict[str, int] = {}
        self.reject = ""
        fields = {f.name.lower(): f.name for f in ctx.op.problem_fields}
        for key, value in _KV.findall(text):
            low = key.lower()
            if low in ("dtype", "layout", "arch"):
                want = {"dtype": ctx.dtype, "layout": ctx.layout, "arch": ctx.arch}[low]
                if value != want and not self.reject:
                    self.reject = (f"{low} mismatch: shape header (line {lineno}) says {low}={value}, "
                                   f"config has {low}={want}")
            elif low in fields:
                number = to_int(value)
                if number is None:
                    raise ValueError(f"{key}={value!r} is not an integer")
                self.problem[fields[low]] = number


class _LineReader:
    """The per-line reader: the current shape header, and one line at a time into rows or rejects.

    Every line the vectorised path of :func:`read_chunks` cannot vouch for goes through
    :meth:`line`, so the two paths share one set of rules.
    """

    def __init__(self, ctx: ReadContext) -> None:
        self.ctx = ctx
        self.header: _Header | None = None
        self.fields = [(f.name, f.default) for f in ctx.op.problem_fields]

    def line(self, lineno: int, raw: bytes, rows: RowBuffer, rejects: list[Reject]) -> None:
        """Read one line (with its newline, when it has one) into ``rows`` or ``rejects``."""
        if lineno == 1 and raw.startswith(BOM):  # a byte-order mark before the first line
            raw = raw[len(BOM):]
        if raw[:1] in b" \t":  # an indented row or header
            raw = raw.lstrip(b" \t")
        if raw[:1] == b"{":
            self._row(lineno, raw, rows, rejects)
        elif not raw.strip() or RULE.match(raw):
            return
        else:
            self._header_line(lineno, raw, rejects)

    def _row(self, lineno: int, raw: bytes, rows: RowBuffer, rejects: list[Reject]) -> None:
        """Read a JSON row line into ``rows`` (with its reason) or ``rejects``."""
        label = self.ctx.label
        header = self.header
        # orjson parses a log line three times faster than json.loads; lines it refuses go
        # through the standard library, which also accepts the NaN/Infinity literals a C++
        # printer may emit, so both read the same rows.
        try:
            obj = orjson.loads(raw)
        except ValueError:
            obj = _slow_loads(raw)
        if type(obj) is not dict:
            rejects.append(Reject(f"{label}:{lineno}", _json_error(raw), _text(raw)))
            return
        if header is not None and header.reject:
            rejects.append(Reject(f"{label}:{lineno}", header.reject, _text(raw)))
            return
        code = self.ctx.resolver.resolve(obj.get("name"))
        if isinstance(code, str):
            rejects.append(Reject(f"{label}:{lineno}", code, _text(raw)))
            return
        problem = obj.get("problem")
        if type(problem) is not dict:
            problem = {}
        values, reason = self._problem(problem)
        if values is None:
            rejects.append(Reject(f"{label}:{lineno}", reason, _text(raw)))
            return
        tflops, latency, bandwidth, why = _perf(obj.get("perf_result"))
        rows.add(lineno, code, values, tflops, latency, bandwidth, reason or why)

    def _problem(self, problem: dict[str, Any]) -> tuple[list[int] | None, str]:
        """The row's problem field values and the reason it is invalid so far (a negative field,
        another problem than its header's), or ``(None, why)`` to reject it."""
        header = self.header
        values: list[int] = []
        reason = ""
        for name, default in self.fields:
            value = problem.get(name)
            if type(value) is not int or not -_INT_LIMIT <= value <= _INT_LIMIT:
                value = _problem_value(problem, name, default, header)
                if isinstance(value, str):
                    return None, value
            if value < 0 and not reason:
                reason = f"negative problem field: {name}={value}"
            values.append(value)
        if header is not None:
            for name, want in header.problem.items():
                if problem.get(name, want) != want:
                    reason = reason or _mismatch(header, problem)
                    break
        return values, reason

    def _header_line(self, lineno: int, raw: bytes, rejects: list[Reject]) -> None:
        """Read a shape header line (the header of the rows after it), or reject the line."""
        label = self.ctx.label
        text = _text(raw)
        match = HEADER.match(text)
        if match is None:
            rejects.append(Reject(f"{label}:{lineno}", "unrecognised line: not a shape header, "
                                                       "rule or JSON object", text))
            return
        try:
            self.header = _Header(match.group(2), lineno, self.ctx)
        except ValueError as exc:
            self.header = None
            rejects.append(Reject(f"{label}:{lineno}", f"bad shape header: {exc}", text))


def _perf(perf: object) -> tuple[float, float, float, str]:
    """TFLOPS, latency and bandwidth of a row's ``perf_result`` and the first reason they make
    it invalid ("" when none)."""
    reason = ""
    if type(perf) is dict:
        tflops = perf.get("tflops(TFlops)")
        latency = perf.get("latency(ms)")
        bandwidth = perf.get("bandwidth(GB/s)", math.nan)
        if type(tflops) is not float or type(latency) is not float or type(bandwidth) is not float:
            tflops, why = _perf_value(perf, TFLOPS_KEYS)
            reason = reason or why
            latency, why = _perf_value(perf, LATENCY_KEYS)
            reason = reason or why
            bandwidth, why = _perf_value(perf, BANDWIDTH_KEYS, required=False)
            reason = reason or why
    else:
        tflops = latency = bandwidth = math.nan
        reason = reason or "missing value: no perf_result object"
    return tflops, latency, bandwidth, reason


def read(path: Path, ctx: ReadContext) -> FileRead:
    """Read one streaming log line by line; see the module docstring. Never raises on content.

    The reference of :func:`read_chunks` (which gives the same rows and rejects, faster).
    """
    reader = _LineReader(ctx)
    rows = new_buffer(ctx)
    rejects: list[Reject] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            reader.line(lineno, raw, rows, rejects)
    return FileRead(rows, rejects)


def new_buffer(ctx: ReadContext) -> RowBuffer:
    """An empty row buffer with the log's printing step."""
    return RowBuffer(ctx.op.problem_names, quantum_ms=QUANTUM, quantum_tflops=QUANTUM)


def read_chunks(path: Path, ctx: ReadContext, chunk_bytes: int) -> Iterator[FileRead]:
    """Read one streaming log in blocks of about ``chunk_bytes`` (whole lines), vectorised.

    Per block, the rows of the common form (a JSON object on one line of ASCII text, with
    the kernel name, every problem field as an integer and the three perf values as numbers)
    are decoded by :mod:`msgspec` (runs of lines in pieces of about ``_PIECE_BYTES``, each
    piece's typed structs turned into numpy columns and kernel codes at once) and checked
    with numpy; every other line (headers, rules, blank or indented lines, a row with a
    missing, null or unusual value, a kernel name that is rejected) goes through the
    per-line reader, in the same header context. A block the decoder refuses as a whole is
    read line by line. So the rows, reasons and rejects are those of :func:`read`.
    """
    reader = _LineReader(ctx)
    decoder = _decoder(ctx.op.problem_names)
    codes = _KernelCodes()
    lineno = 1
    with open(path, "rb") as fh:
        for buffer, start, end in line_spans(fh, chunk_bytes):
            read, lines = _read_block(memoryview(buffer)[start:end], lineno, reader, decoder, codes, ctx)
            yield read
            lineno += lines


def _decoder(problem_names: tuple[str, ...]) -> _Decoders:
    """msgspec decoders of log rows into structs of only the fields the table needs (see
    :class:`_Decoders`)."""
    problem = msgspec.defstruct("Problem", [(n, int) for n in problem_names], gc=False)
    perf = msgspec.defstruct("Perf", [("latency", float, msgspec.field(name="latency(ms)")),
                                      ("tflops", float, msgspec.field(name="tflops(TFlops)")),
                                      ("bandwidth", float, msgspec.field(name="bandwidth(GB/s)"))], gc=False)
    row = msgspec.defstruct("Row", [("name", str), ("problem", msgspec.Raw), ("perf_result", perf)], gc=False)
    return _Decoders(msgspec.json.Decoder(row), msgspec.json.Decoder(problem), perf)


class _Decoders:
    """The decoders of :func:`_decode`: ``row`` (a row's ``problem`` kept as its raw JSON text),
    ``problem`` (problem objects, one per line), and the packing of perf structs into numbers.

    Consecutive rows of a sweep carry the same problem object, byte for byte, and it holds
    many keys the table does not read: a row keeps its problem's text, and each distinct run
    of them is decoded once.

    A piece's perf structs are written by msgspec's MessagePack encoder, which writes every
    float as its 8 bytes (``0xcb`` and the big-endian double) and a struct as a map of its
    fields in order, so every struct takes the same bytes at the same offsets: numpy reads the
    three columns out of the packed bytes (``perf_dtype``, found by packing a struct of known
    values), instead of a Python-level pass over each row's floats.
    """

    def __init__(self, row: msgspec.json.Decoder[Any], problem: msgspec.json.Decoder[Any], perf: type) -> None:
        self.row, self.problem = row, problem
        self.perf_encoder = msgspec.msgpack.Encoder()
        values = (1.25, 2.5, 3.75)  # distinct, exact: each found once in the packed struct
        packed = self.perf_encoder.encode(perf(*values))
        offsets = [packed.index(b"\xcb" + struct.pack(">d", v)) + 1 for v in values]
        self.perf_dtype = np.dtype({"names": ["latency", "tflops", "bandwidth"], "formats": [">f8"] * 3,
                                    "offsets": offsets, "itemsize": len(packed)})


#: Longest line the vectorised path decodes (a longer one is read by the per-line reader,
#: whose JSON library also decides how deep an object may nest).
_LONG_LINE = 4096
#: Bytes that make a line one for the per-line reader: a control character, or a byte past ASCII
#: (UTF-8, which the line reader decodes with replacement). Tab, CR and the newline are fine; so
#: is DEL, which JSON takes in a string as any other character (msgspec as the line reader's
#: orjson and json do) and refuses elsewhere (the block is then read line by line).
_ODD_BYTE = np.ones(256, dtype=bool)
_ODD_BYTE[32:128] = False
_ODD_BYTE[[9, 10, 13]] = False


#: Bytes per pass of :func:`_scan` (its temporaries stay in the CPU cache).
_SCAN_BYTES = 1 << 20


def _scan(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``arr`` (the bytes of a block) of the newlines, and of the bytes of
    :data:`_ODD_BYTE`.

    One pass per piece of ``_SCAN_BYTES`` marks every byte below 32 or past ASCII (read as a
    signed byte, below 32: one comparison), into reused buffers; the marks are searched 8 at a
    time (as 64-bit words: a line's one newline leaves most words blank), then within the few
    marked words; the few found are sorted into newlines and odd bytes.
    """
    size = min(_SCAN_BYTES, len(arr))
    signed = arr.view(np.int8)
    mask = np.zeros(-(-size // 8) * 8, dtype=bool)  # the bytes past a part stay unmarked
    words = mask.view(np.uint64)
    eights = mask.reshape(-1, 8)
    marked = np.empty(len(words), dtype=bool)
    ends: list[np.ndarray] = []
    odd: list[np.ndarray] = []
    for start in range(0, len(arr), _SCAN_BYTES):
        part = arr[start:start + _SCAN_BYTES]
        k = len(part)
        np.less(signed[start:start + k], 32, out=mask[:k])
        if k < size:  # the last part, shorter: no marks left from the one before
            mask[k:] = False
        word = np.flatnonzero(np.not_equal(words, 0, out=marked))
        within = np.flatnonzero(eights[word])
        found = word[within >> 3] * 8 + (within & 7)
        kind = part[found]
        found += start
        newline = kind == 10
        if newline.all():
            ends.append(found)
        else:
            ends.append(found[newline])
            odd.append(found[_ODD_BYTE[kind]])
    none = np.zeros(0, dtype=np.int64)
    return (np.concatenate(ends) if ends else none), (np.concatenate(odd) if odd else none)


def _read_block(block: memoryview, first_line: int, reader: _LineReader, decoder: _Decoders, codes: _KernelCodes,
                ctx: ReadContext) -> tuple[FileRead, int]:
    """Rows and rejects of the whole lines in ``block``, the first being line ``first_line``;
    and the number of those lines. ``codes``: the kernel codes of the names met so far in the
    file."""
    end = len(block)
    arr = np.frombuffer(block, dtype=np.uint8)
    ends, odd = _scan(arr)
    if not len(ends) or ends[-1] != end - 1:
        ends = np.append(ends, end - 1)  # the file's last line, without a newline
    starts = np.r_[0, ends[:-1] + 1]
    n_lines = len(starts)
    lengths = ends - starts
    fast = (arr[starts] == ord("{")) & (lengths < _LONG_LINE)
    if len(odd):
        fast[np.searchsorted(starts, odd, side="right") - 1] = False
    if first_line == 1:
        fast[0] = False  # a byte-order mark is dropped by the line reader
    slow_rows, slow_rejects = new_buffer(ctx), list[Reject]()
    start_header = reader.header

    def by_line(index: int) -> None:
        reader.line(first_line + index, bytes(block[starts[index]:ends[index] + 1]), slow_rows, slow_rejects)

    # lines the per-line reader takes, in order: they move the header; each fast line reads
    # under the header left by the last of them before it
    special = np.flatnonzero(~fast)
    headers: list[_Header | None] = []
    for index in special.tolist():
        by_line(index)
        headers.append(reader.header)
    fast_idx = np.flatnonzero(fast)
    if not len(fast_idx):
        return FileRead(slow_rows, slow_rejects), n_lines
    header_of = np.searchsorted(special, fast_idx) - 1  # -1: the header from before the block
    header_list = [start_header, *headers]
    header_of += 1
    # runs of consecutive fast lines are contiguous bytes: one decoder call per run, no copy
    breaks = np.flatnonzero(np.diff(fast_idx) != 1)
    run_first = fast_idx[np.r_[0, breaks + 1]]
    run_last = fast_idx[np.r_[breaks, len(fast_idx) - 1]]
    decoded = _decode(_Lines(block, starts, ends), run_first, run_last, len(fast_idx), decoder, codes, ctx)
    if decoded is None:  # the block is read line by line
        reader.header = start_header
        rows, rejects = new_buffer(ctx), list[Reject]()
        for index in range(n_lines):
            reader.line(first_line + index, bytes(block[starts[index]:ends[index] + 1]), rows, rejects)
        return FileRead(rows, rejects), n_lines
    reader_header = reader.header
    fast_rows, deferred = _vector_rows(*decoded, fast_idx + first_line, header_of, header_list, ctx)
    for i in deferred.tolist():  # rows the vectorised checks leave to the per-line reader
        reader.header = header_list[header_of[i]]
        by_line(int(fast_idx[i]))
    reader.header = reader_header
    return FileRead(RowBuffer.merged([slow_rows, fast_rows]), sorted_rejects(slow_rejects)), n_lines


#: Bytes of lines per decoder call: a piece's structs become numpy columns and are freed
#: while they are still in the CPU cache (decoding a whole block first is slower).
_PIECE_BYTES = 1 << 20
#: Kernel code of a name not yet looked up in :class:`_KernelCodes`.
_UNSEEN = -2
#: Most stretches of the names' first-met order a piece's names are compared with (see
#: :class:`_KernelCodes`); the rest of the piece is looked up name by name.
_STRETCHES = 8


class _KernelCodes:
    """The kernel codes of the names met so far in one file (``-1``: a rejected name, left to
    the per-line reader), and the order the names were first met in.

    A sweep prints the same kernels in the same order for every shape, so a piece's names are
    mostly a stretch of that order (or two, across a shape's end): one list comparison of the
    names with the stretch (a byte comparison per name) gives their codes, instead of a dict
    lookup per row (which hashes each freshly decoded name). A piece that stops matching (a
    kernel missing from a shape, another order, a name not met before), or whose stretches are
    short (a few kernels per shape), is looked up name by name from there. The codes are those
    of the names, whichever way they are found.
    """

    def __init__(self) -> None:
        self.code_of: dict[str, int] = {}
        #: The names in the order first met, the index of each, and their codes (the first
        #: ``len(order)`` of a buffer that grows by doubling).
        self.order: list[str] = []
        self.position: dict[str, int] = {}
        self.codes = np.empty(1024, dtype=np.int64)

    def fill(self, out: np.ndarray, names: list[str], resolver: KernelResolver) -> None:
        """The codes of ``names`` into ``out``; new names are resolved by ``resolver`` (a
        :class:`~ckpred.data.readers.common.KernelResolver`) in the order they first appear, so
        the codes are those one pass over the names would give."""
        k, order, position = len(names), self.order, self.position
        done = 0
        for _ in range(_STRETCHES):
            at = position.get(names[done]) if done < k else None
            if at is None:
                break
            m = min(k - done, len(order) - at)
            if (names if m == k else names[done:done + m]) != order[at:at + m]:
                break
            out[done:done + m] = self.codes[at:at + m]
            done += m
        if done < k:
            self._look_up(out[done:], names[done:] if done else names, resolver)

    def _look_up(self, out: np.ndarray, names: list[str], resolver: KernelResolver) -> None:
        out[:] = np.fromiter(map(self.code_of.get, names, repeat(_UNSEEN)), dtype=np.int64, count=len(names))
        if out.min() != _UNSEEN:
            return
        new = np.flatnonzero(out == _UNSEEN)
        unseen = [names[i] for i in new.tolist()]
        fresh = list(dict.fromkeys(unseen))
        start = len(self.order)
        if start + len(fresh) > len(self.codes):
            self.codes = np.resize(self.codes, 2 * (start + len(fresh)))
        for i, (name, code) in enumerate(zip(fresh, resolver.resolve_all(fresh)), start):
            code = code if type(code) is int else -1
            self.code_of[name] = code
            self.position[name] = i
            self.codes[i] = code
        self.order.extend(fresh)
        out[new] = [self.code_of[name] for name in unseen]


@dataclass(frozen=True)
class _Lines:
    """The lines of a block: its bytes, and each line's first and last byte offsets (the last
    is its newline's, or the block's last byte)."""

    view: memoryview
    starts: np.ndarray
    ends: np.ndarray


def _decode(lines: _Lines, run_first: np.ndarray, run_last: np.ndarray, n: int, decoder: _Decoders,
            codes: _KernelCodes, ctx: ReadContext) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Kernel codes, problem values (``problem fields x n``) and perf values (``3 x n``: latency,
    TFLOPS, bandwidth) of the ``n`` lines of the runs of consecutive lines ``run_first[i]`` to
    ``run_last[i]``; ``None`` when the decoder refuses a line (or a piece decodes into another
    number of rows than it has lines).

    ``codes``: the kernel codes of the names met so far in the file (a piece's new names are
    resolved as they come, see :class:`_KernelCodes`). Each column is one contiguous row of its
    array: the row buffer takes it without a copy.
    """
    view, starts, ends = lines.view, lines.starts, lines.ends
    n_fields = len(ctx.op.problem_names)
    row_decoder, problem_decoder = decoder.row, decoder.problem
    kernel = np.empty(n, dtype=np.int64)
    problems = np.empty((n_fields, n), dtype=np.int64)
    perf = np.empty((3, n), dtype=np.float64)
    get_name, get_problem, get_perf = attrgetter("name"), attrgetter("problem"), attrgetter("perf_result")
    done = 0
    try:
        for first, last in zip(run_first.tolist(), run_last.tolist()):
            while first <= last:
                stop = min(last, max(first, int(np.searchsorted(starts, starts[first] + _PIECE_BYTES)) - 1))
                piece = row_decoder.decode_lines(view[starts[first]:ends[stop] + 1])
                k = len(piece)
                if k != stop - first + 1:
                    return None
                # each run of rows with the same problem text: its problem decoded once
                texts = list(map(get_problem, piece))
                run = [0]
                _changes(texts, 0, k, run)
                distinct = problem_decoder.decode_lines(b"\n".join([texts[i] for i in run]))
                if len(distinct) != len(run):  # a problem text that is not one JSON object
                    return None
                values = np.fromiter(chain.from_iterable(map(astuple, distinct)), dtype=np.int64,
                                     count=len(run) * n_fields).reshape(len(run), n_fields)
                if len(run) == 1:
                    problems[:, done:done + k] = values.T
                else:
                    run.append(k)
                    problems[:, done:done + k] = np.repeat(values, np.diff(run), axis=0).T
                _perf_columns(perf[:, done:done + k], list(map(get_perf, piece)), decoder)
                codes.fill(kernel[done:done + k], list(map(get_name, piece)), ctx.resolver)
                done += k
                first = stop + 1
    except (msgspec.DecodeError, msgspec.ValidationError, OverflowError):  # overflow: an integer beyond int64
        return None
    return (kernel, problems, perf) if done == n else None


#: Shortest stretch of problem texts :func:`_changes` searches for its changes as long runs;
#: a shorter one (or one of short runs) is compared pair by pair.
_PAIRWISE = 64


def _changes(texts: list[Any], lo: int, hi: int, out: list[int]) -> None:
    """Append to ``out`` each ``i`` (``lo < i < hi``, in order) where ``texts[i] != texts[i - 1]``.

    A sweep's rows carry the same problem text for a whole shape, so a piece holds a few long
    runs. Each is found by loops in C instead of a comparison call per row: a stretch whose
    last text is its first is counted whole (``list.count``: all the same, or halved when it
    holds another run inside); otherwise a binary search finds where the first text stops, and
    a count of the stretch before it proves it one run. A stretch of short runs (a binary
    search that ends early, a count of less than three quarters) is compared pair by pair, so
    a file of changing problems costs no more than the pairwise comparison.
    """
    while hi - lo > _PAIRWISE:
        first = texts[lo]
        if texts[hi - 1] == first:
            same = (texts if lo == 0 and hi == len(texts) else texts[lo:hi]).count(first)
            if same == hi - lo:
                return
            if 4 * same < 3 * (hi - lo):
                break
            mid = (lo + hi) // 2
            _changes(texts, lo, mid + 1, out)
            lo = mid
            continue
        a, b = lo, hi - 1  # texts[a] is the first text, texts[b] is not
        while b - a > 1:
            mid = (a + b) // 2
            if texts[mid] == first:
                a = mid
            else:
                b = mid
        if b - lo < _PAIRWISE or texts[lo:b].count(first) != b - lo:
            break
        out.append(b)
        lo = b
    if hi - lo > 1:
        out.extend(compress(range(lo + 1, hi), map(ne, texts[lo + 1:hi], texts[lo:hi - 1])))


def _perf_columns(out: np.ndarray, perfs: list[Any], decoder: _Decoders) -> None:
    """Latency, TFLOPS and bandwidth (the rows of ``out``, ``3 x k``) of the ``k`` perf structs
    ``perfs``, read out of their MessagePack bytes (see :class:`_Decoders`)."""
    k = len(perfs)
    packed = decoder.perf_encoder.encode(perfs)
    head = len(packed) - k * decoder.perf_dtype.itemsize  # the array's header: 1, 3 or 5 bytes
    if head == (1 if k < 16 else 3 if k < 1 << 16 else 5):
        records = np.frombuffer(packed, dtype=decoder.perf_dtype, count=k, offset=head)
        out[0], out[1], out[2] = records["latency"], records["tflops"], records["bandwidth"]
    else:  # never seen: a struct packed otherwise than the one of known values
        out[:] = np.fromiter(chain.from_iterable(map(astuple, perfs)), dtype=np.float64, count=3 * k).reshape(k, 3).T


def _vector_rows(kernel: np.ndarray, problems: np.ndarray, perf: np.ndarray, linenos: np.ndarray,
                 header_of: np.ndarray, headers: list[_Header | None],
                 ctx: ReadContext) -> tuple[RowBuffer, np.ndarray]:
    """Rows of the decoded lines (columns as :func:`_decode` gives them), and the indices of
    those left to the per-line reader.

    Left over: a rejected kernel name, or a row under a header that rejects its rows (both
    rejects, whose text the line reader writes). The rest are judged here as the line
    reader would: the first negative problem field, else a mismatch with the shape header.
    """
    n = len(kernel)
    names = ctx.op.problem_names
    deferred = kernel < 0
    header_rejects = np.array([h is not None and bool(h.reject) for h in headers])
    if header_rejects.any():
        deferred |= header_rejects[header_of]
    columns = list(problems)
    reason = np.zeros(n, dtype=np.int64)  # 0 none, 1 + i: problem field i negative, -1 header mismatch
    if problems.size and problems.min() < 0:
        for i, column in enumerate(columns):
            reason[(reason == 0) & (column < 0)] = i + 1
    mismatch = np.zeros(n, dtype=bool)
    for i, name in enumerate(names):
        has = np.array([h is not None and name in h.problem for h in headers])
        if not has.any():
            continue
        want = np.array([h.problem[name] if h is not None and name in h.problem else 0 for h in headers],
                        dtype=np.int64)
        wrong = columns[i] != want[header_of]
        mismatch |= wrong if has.all() else has[header_of] & wrong
    reason[(reason == 0) & mismatch] = -1
    keep = ~deferred
    every = not deferred.any()  # the common case: a column is taken as it is, not masked

    def kept(values: np.ndarray) -> np.ndarray:  # a contiguous array of the kept rows
        return values if every else values[keep]

    rows = new_buffer(ctx)
    rows.line = kept(linenos)
    rows.kernel = kept(kernel)
    rows.problem = [kept(c) for c in columns]
    rows.latency, rows.tflops, rows.bandwidth = (kept(c) for c in perf)
    kept_reason = kept(reason)
    kept_header = kept(header_of)
    for j in np.flatnonzero(kept_reason).tolist():
        code = int(kept_reason[j])
        if code > 0:
            rows.reasons[j] = f"negative problem field: {names[code - 1]}={int(rows.problem[code - 1][j])}"
        else:
            header = headers[kept_header[j]]
            assert header is not None
            rows.reasons[j] = _mismatch(header, {name: int(c[j]) for name, c in zip(names, rows.problem)})
    return rows, np.flatnonzero(deferred)


def _slow_loads(raw: bytes) -> Any:
    """``json.loads`` for what orjson refuses; ``None`` when the line is no JSON object."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _json_error(raw: bytes) -> str:
    """The reason a line that starts with '{' is not one JSON object (slow path, errors only)."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return f"malformed JSON: {exc}"
    return "malformed JSON: not an object" if not isinstance(obj, dict) else "malformed JSON"


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").rstrip("\r\n")


def _problem_value(problem: dict[str, Any], name: str, default: Any, header: _Header | None) -> int | str:
    """A problem field from the row's problem object, else its shape header, else its default."""
    if name in problem:
        raw = problem[name]
        value = to_int(raw)
        if value is None:
            return f"bad problem field: {name}={raw!r} is " + \
                ("beyond int64" if type(raw) is int else "not an integer")
        return value
    if header is not None and name in header.problem:
        return header.problem[name]
    if default is not None:
        return int(default)
    return f"missing problem field: {name} (neither in the row's problem nor in a shape header)"


def _mismatch(header: _Header, problem: dict[str, Any]) -> str:
    said = " ".join(f"{k}={v}" for k, v in header.problem.items())
    got = " ".join(f"{k}={problem.get(k)}" for k in header.problem)
    return f"shape mismatch: shape header (line {header.lineno}) says {said}, the row's problem has {got}"


def _perf_value(perf: dict[str, Any], keys: tuple[str, ...], *, required: bool = True) -> tuple[float, str]:
    for key in keys:
        if key in perf:
            raw = perf[key]
            value = raw if type(raw) is float else to_float(raw)
            if value is None:
                return math.nan, f"non-numeric value: {key}={raw!r}"
            return value, ""
    if required:
        return math.nan, f"missing value: perf_result has no {keys[0]!r}"
    return math.nan, ""
