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

Speed: one ``orjson.loads`` per row and a handful of dict lookups; the kernel name is parsed
once per distinct name (see :class:`~ckpred.data.readers.common.KernelResolver`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import orjson

from ckpred.data.readers.common import FileRead, ReadContext, Reject, RowBuffer, to_float, to_int

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


def read(path: Path, ctx: ReadContext) -> FileRead:
    """Read one streaming log; see the module docstring. Never raises on content."""
    op = ctx.op
    rows = RowBuffer(op.problem_names, quantum_ms=QUANTUM, quantum_tflops=QUANTUM)
    rejects: list[Reject] = []
    label = ctx.label
    resolve = ctx.resolver.resolve
    fields = [(f.name, f.default) for f in op.problem_fields]
    # orjson parses a log line three times faster than json.loads (it bounds the whole
    # reader); lines it refuses go through the standard library, which also accepts the
    # NaN/Infinity literals a C++ printer may emit, so both paths read the same rows.
    fast_loads = orjson.loads
    # Bound appends: this loop runs once per kernel row.
    add_line, add_kernel = rows.line.append, rows.kernel.append
    add_problem = [column.append for column in rows.problem]
    add_tflops, add_latency, add_bandwidth = rows.tflops.append, rows.latency.append, rows.bandwidth.append
    reasons = rows.reasons
    nan = math.nan
    count = 0
    header: _Header | None = None
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1 and raw.startswith(BOM):  # a byte-order mark before the first line
                raw = raw[len(BOM):]
            if raw[:1] in b" \t":  # an indented row or header
                raw = raw.lstrip(b" \t")
            if raw[:1] == b"{":
                try:
                    obj = fast_loads(raw)
                except ValueError:
                    obj = _slow_loads(raw)
                if type(obj) is not dict:
                    rejects.append(Reject(f"{label}:{lineno}", _json_error(raw), _text(raw)))
                    continue
                if header is not None and header.reject:
                    rejects.append(Reject(f"{label}:{lineno}", header.reject, _text(raw)))
                    continue
                code = resolve(obj.get("name"))
                if type(code) is str:
                    rejects.append(Reject(f"{label}:{lineno}", code, _text(raw)))
                    continue
                problem = obj.get("problem")
                if type(problem) is not dict:
                    problem = {}
                values: list[int] = []
                reason = ""
                for name, default in fields:
                    value = problem.get(name)
                    if type(value) is not int:
                        value = _problem_value(problem, name, default, header)
                        if type(value) is str:
                            break
                    if value < 0 and not reason:
                        reason = f"negative problem field: {name}={value}"
                    values.append(value)
                else:
                    value = 0
                if type(value) is str:
                    rejects.append(Reject(f"{label}:{lineno}", value, _text(raw)))
                    continue
                if header is not None:
                    for name, want in header.problem.items():
                        if problem.get(name, want) != want:
                            reason = reason or _mismatch(header, problem)
                            break
                perf = obj.get("perf_result")
                if type(perf) is dict:
                    tflops = perf.get("tflops(TFlops)")
                    latency = perf.get("latency(ms)")
                    bandwidth = perf.get("bandwidth(GB/s)", nan)
                    if type(tflops) is not float or type(latency) is not float or type(bandwidth) is not float:
                        tflops, why = _perf_value(perf, TFLOPS_KEYS)
                        reason = reason or why
                        latency, why = _perf_value(perf, LATENCY_KEYS)
                        reason = reason or why
                        bandwidth, why = _perf_value(perf, BANDWIDTH_KEYS, required=False)
                        reason = reason or why
                else:
                    tflops = latency = bandwidth = nan
                    reason = reason or "missing value: no perf_result object"
                if reason:
                    reasons[count] = reason
                count += 1
                add_line(lineno)
                add_kernel(code)
                for append, value in zip(add_problem, values):
                    append(value)
                add_tflops(tflops)
                add_latency(latency)
                add_bandwidth(bandwidth)
            elif not raw.strip() or RULE.match(raw):
                continue
            else:
                text = _text(raw)
                match = HEADER.match(text)
                if match is None:
                    rejects.append(Reject(f"{label}:{lineno}", "unrecognised line: not a shape header, "
                                                               "rule or JSON object", text))
                    continue
                try:
                    header = _Header(match.group(2), lineno, ctx)
                except ValueError as exc:
                    header = None
                    rejects.append(Reject(f"{label}:{lineno}", f"bad shape header: {exc}", text))
    return FileRead(rows, rejects)


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
        value = to_int(problem[name])
        if value is None:
            return f"bad problem field: {name}={problem[name]!r} is not an integer"
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
