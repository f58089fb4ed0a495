"""Reader of the CK Tile tile-engine benchmark JSON.

Format (CK Tile's tile-engine benchmark JSON; a failed kernel has time 0, tflops 0,
``is_valid`` false and the error text)::

    {"metadata": {"dtype", "layout", "num_kernels", "num_problems", "warmup", "repeat", "timestamp"},
     "problem_sizes": [{"m", "n", "k"}, ...],
     "results": [{"kernel_config": {"name", "dtype", "layout", "pipeline", ..., "warp_tile_k"},
                  "benchmarks": [{"kernel_name", "m", "n", "k", "avg_time_ms", "tflops",
                                  "is_valid", "error"}, ...]}, ...]}

Failed kernels have ``is_valid: false``, time 0 and an error text: they become rows with
``is_valid=False`` and the error as reason.

The file is read by scanning for objects rather than by one ``json.load``: every ``{`` is
decoded on its own (``JSONDecoder.raw_decode``); containers (the document, result entries) are
descended into, leaves (benchmarks, kernel configs, metadata, problem sizes) are taken whole.
On an intact file this costs a few passes of the C decoder and gives each benchmark its line
number; on a damaged one, everything outside the damaged object is still read, and the damaged
object is rejected with its line and text ("malformed JSON"), as is a leaf object of no known
kind ("unrecognised JSON object"). Kernel fields come from the
kernel name; a ``kernel_config`` of the same name that disagrees with it makes the rows
invalid (``kernel_config mismatch``). A benchmark whose problem is not among an intact
``problem_sizes`` list is invalid (``shape mismatch``); metadata naming another dtype, layout
or arch than the config rejects the file's rows. ``is_valid`` is read as a truth value
(``true/1/yes``, ``false/0/no``; anything else is a ``bad validity value``). The number of
benchmarks found is compared with ``num_kernels x num_problems`` of the metadata, and a
shortfall (a truncated file) is reported in the summary.
"""

from __future__ import annotations

import bisect
import json
import math
from pathlib import Path
from typing import Any

from ckpred.data.readers.common import FileRead, ReadContext, Reject, RowBuffer, to_float, to_int, truth

NAME = "json"
_BENCHMARK_KEYS = frozenset(("kernel_name", "avg_time_ms", "tflops", "is_valid", "error"))
_METADATA_KEYS = frozenset(("num_kernels", "num_problems", "warmup", "repeat", "timestamp"))
#: Longest raw text kept for a malformed block in the rejects file.
RAW_LIMIT = 2000


def read(path: Path, ctx: ReadContext) -> FileRead:
    """Read one benchmark JSON file; see the module docstring. Never raises on content."""
    scan = _Scan(path.read_bytes().decode("utf-8", "replace"), ctx)
    scan.run()
    file_reject = _metadata_reject(scan.metadata, ctx)
    rows = RowBuffer(ctx.op.problem_names)
    for lineno, obj, raw in scan.benchmarks:
        if file_reject:
            scan.rejects.append(Reject(f"{ctx.label}:{lineno}", file_reject, raw))
            continue
        _read_benchmark(lineno, obj, raw, ctx, scan, rows)
    # damaged objects count as found: they are in the rejects, not lost
    damaged = sum(r.reason.startswith("malformed JSON") for r in scan.rejects)
    return FileRead(rows, scan.rejects, declared_records=_declared(scan.metadata),
                    found_records=len(scan.benchmarks) + damaged)


class _Scan:
    """One scan of a file's text for objects: what it found (metadata, problem sizes, kernel
    configs, benchmarks with their line and text) and the rejects of damaged or unknown ones."""

    def __init__(self, text: str, ctx: ReadContext) -> None:
        self.text, self.label = text, ctx.label
        self.ctx = ctx
        self.newlines = _newlines(text)
        self.metadata: dict[str, Any] | None = None
        self.problem_sizes: set[tuple[int, ...]] | None = None
        self.size_keys: tuple[str, ...] = ()
        self.configs: dict[str, dict[str, Any]] = {}
        self.benchmarks: list[tuple[int, dict[str, Any], str]] = []
        self.rejects: list[Reject] = []
        self.problem_keys = set(ctx.op.problem_names)
        #: Lines already reported as nested too deeply.
        self.deep: set[int] = set()

    def line_of(self, pos: int) -> int:
        return bisect.bisect_left(self.newlines, pos) + 1

    def run(self) -> None:
        """Decode every ``{`` of the text (see the module docstring)."""
        text = self.text
        decoder = json.JSONDecoder()
        top_level = True
        pos = 0
        while True:
            start = text.find("{", pos)
            if start < 0:
                break
            try:
                obj, end = decoder.raw_decode(text, start)
            except json.JSONDecodeError as exc:
                self.damaged(start, exc)
                pos, top_level = start + 1, False
                continue
            except RecursionError:
                self.too_deep(start)
                pos, top_level = start + 1, False
                continue
            if top_level:
                top_level = False
                if isinstance(obj.get("metadata"), dict):
                    self.metadata = obj["metadata"]
                self.problem_sizes, self.size_keys = _problem_sizes(obj.get("problem_sizes"), self.ctx)
            pos = self.take(obj, start, end)

    def damaged(self, start: int, exc: json.JSONDecodeError) -> None:
        """Reject the object at ``start`` that does not decode, if it is the innermost damaged
        one (its error lies before any nested '{')."""
        text, line_of = self.text, self.line_of
        if "{" not in text[start + 1:exc.pos]:
            eol = text.find("\n", start)
            stop = max(exc.pos + 1, len(text) if eol < 0 else eol)
            self.rejects.append(Reject(f"{self.label}:{line_of(start)}", f"malformed JSON: {exc.msg} "
                                       f"(line {line_of(exc.pos)})", text[start:min(stop, start + RAW_LIMIT)]))

    def too_deep(self, start: int) -> None:
        """Reject a block nested too deeply, once: every object around it fails the same way, so
        it is reported at the line where the nesting gets too deep."""
        where = _too_deep_at(self.text, start)
        if self.line_of(where) not in self.deep:
            self.deep.add(self.line_of(where))
            self.rejects.append(Reject(f"{self.label}:{self.line_of(where)}", "malformed JSON: nested too deeply",
                                       self.text[where:where + RAW_LIMIT]))

    def take(self, obj: dict[str, Any], start: int, end: int) -> int:
        """File the object decoded at ``start:end`` by its keys; the position to scan on from."""
        keys = obj.keys()
        if "kernel_name" in keys or "avg_time_ms" in keys:
            self.benchmarks.append((self.line_of(start), obj, self.text[start:end]))
            return end
        if any(isinstance(v, (dict, list)) for v in obj.values()):
            return start + 1  # a container (document, result entry): its leaves are read one by one
        if not keys:
            return end
        if not _BENCHMARK_KEYS.isdisjoint(keys):
            self.benchmarks.append((self.line_of(start), obj, self.text[start:end]))
        elif "tile_m" in keys or ("name" in keys and "pipeline" in keys):
            if isinstance(obj.get("name"), str):
                self.configs[obj["name"]] = obj
        elif not _METADATA_KEYS.isdisjoint(keys):
            self.metadata = self.metadata if self.metadata is not None else obj
        elif not keys <= self.problem_keys:
            self.rejects.append(Reject(f"{self.label}:{self.line_of(start)}", "unrecognised JSON object: neither a "
                                       "benchmark, kernel_config, metadata nor problem size",
                                       self.text[start:end][:RAW_LIMIT]))
        return end


def _declared(metadata: dict[str, Any] | None) -> int | None:
    """Benchmarks the metadata says the file holds (``num_kernels x num_problems``), if it says."""
    if not metadata:
        return None
    kernels, problems = to_int(metadata.get("num_kernels")), to_int(metadata.get("num_problems"))
    if kernels is None or problems is None or kernels < 0 or problems < 0:
        return None
    return kernels * problems


def _too_deep_at(text: str, start: int, limit: int = 500) -> int:
    """Where the nesting that starts at ``start`` first exceeds ``limit`` (strings skipped)."""
    depth, i, n = 0, start, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return i
        elif ch in "]}":
            depth -= 1
        i += 1
    return start


def _newlines(text: str) -> list[int]:
    out, pos = [], text.find("\n")
    while pos >= 0:
        out.append(pos)
        pos = text.find("\n", pos + 1)
    return out


def _problem_sizes(value: object, ctx: ReadContext) -> tuple[set[tuple[int, ...]] | None, tuple[str, ...]]:
    """The set of problems an intact ``problem_sizes`` list declares (``None`` if unusable)."""
    if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
        return None, ()
    keys = tuple(f.name for f in ctx.op.problem_fields if f.name in value[0])
    if not keys:
        return None, ()
    sizes: set[tuple[int, ...]] = set()
    for entry in value:
        row = [to_int(entry.get(k)) for k in keys]
        ints = [v for v in row if v is not None]
        if len(ints) < len(row):
            return None, ()
        sizes.add(tuple(ints))
    return sizes, keys


#: Metadata keys naming the GPU architecture a file was measured on.
ARCH_KEYS = ("arch", "gpu_arch", "gfx_arch")


def _metadata_reject(metadata: dict[str, Any] | None, ctx: ReadContext) -> str:
    if not metadata:
        return ""
    checks = [("dtype", "dtype", ctx.dtype), ("layout", "layout", ctx.layout)]
    checks += [(key, "arch", ctx.arch) for key in ARCH_KEYS]
    for key, what, want in checks:
        got = metadata.get(key)
        if got is not None and got != want:
            return f"{what} mismatch: file metadata says {key}={got}, config has {what}={want}"
    return ""


def _same(a: object, b: object) -> bool:
    if isinstance(b, bool):
        return a is b or (isinstance(a, str) and a.lower() == str(b).lower())
    if isinstance(b, int):
        return to_int(a) == b
    return a == b


def _read_benchmark(lineno: int, obj: dict[str, Any], raw: str, ctx: ReadContext, scan: _Scan,
                    rows: RowBuffer) -> None:
    """Add the benchmark ``obj`` (at line ``lineno``, text ``raw``) to ``rows`` with its reason,
    or reject it (its kernel name or a problem field unusable)."""
    source, rejects = f"{ctx.label}:{lineno}", scan.rejects
    configs, problem_sizes, size_keys = scan.configs, scan.problem_sizes, scan.size_keys
    name = obj.get("kernel_name", obj.get("name"))
    code = ctx.resolver.resolve(name)
    if isinstance(code, str):
        rejects.append(Reject(source, code, raw))
        return
    reason = ""
    problem: list[int] = []
    for field in ctx.op.problem_fields:
        if field.name in obj:
            value = to_int(obj[field.name])
            if value is None:
                rejects.append(Reject(source, f"bad problem field: {field.name}={obj[field.name]!r} is not an "
                                              "integer", raw))
                return
        elif field.default is not None:
            value = int(field.default)
        else:
            rejects.append(Reject(source, f"missing problem field: {field.name}", raw))
            return
        if value < 0 and not reason:
            reason = f"negative problem field: {field.name}={value}"
        problem.append(value)

    valid = truth(obj.get("is_valid", True))
    if valid is None:
        reason = reason or (f"bad validity value: is_valid={obj.get('is_valid')!r} is none of true/1/yes "
                            "(valid) or false/0/no (failed)")
    elif not valid:
        error = obj.get("error") or "is_valid false, no error text"
        reason = reason or f"kernel failed: {error}"
    values: list[float] = []
    for key in ("tflops", "avg_time_ms"):
        number = to_float(obj.get(key))
        if number is None:
            reason = reason or (f"non-numeric value: {key}={obj[key]!r}" if key in obj else f"missing value: {key}")
            number = math.nan
        values.append(number)

    config = configs.get(name)  # type: ignore[arg-type]
    if config is not None and not reason:
        fields = ctx.resolver.kernels[code]
        wrong = [f"{k}={config[k]!r} vs {v!r}" for k, v in fields.items() if k in config and not _same(config[k], v)]
        if wrong:
            reason = f"kernel_config mismatch: kernel_config vs kernel name: {', '.join(wrong)}"
    if problem_sizes is not None and not reason:
        names = ctx.op.problem_names
        size = tuple(problem[names.index(k)] for k in size_keys)
        if size not in problem_sizes:
            shown = " ".join(f"{k}={v}" for k, v in zip(size_keys, size))
            reason = f"shape mismatch: problem {shown} is not in the file's problem_sizes"
    rows.add(lineno, code, problem, values[0], values[1], math.nan, reason)
