"""Reader of Kernel Tuner cache files (``*.json`` / ``*.json.gz``): one tuned kernel, one problem,
one GPU per file.

Format::

    {"device_name": "...", "kernel_name": "...", "problem_size": [4096, 4096],
     "tune_params_keys": [...], "tune_params": {...}, "objective": "time",
     "cache": {"16,1,1,...": {<tune params>, "time": 3.44, "times": [...], "GFLOP/s": ..., ...}, ...}}

One row per cache entry: the entry's scalar fields (tunable parameters, ``time``, ``GFLOP/s``,
``compile_time``...; the list ``times`` is left out), the entry's cache key as ``config``, and
the file's ``device_name``, ``kernel_function`` (the document's ``kernel_name``),
``problem_size_0``, ``problem_size_1``..., ``gpu`` and ``arch``. A failed configuration has a string in
``time`` (``CompilationFailedConfig``, ``RuntimeFailedConfig``, ``InvalidConfig``): the row
gets ``time`` empty and the string in ``status``; a measured one has ``status`` ``ok``.

``gpu`` is the model word of ``device_name``: its last word, words split at spaces and hyphens,
after dropping trailing memory and form-factor words (``NVIDIA A100-PCIE-40GB`` -> ``A100``,
``AMD Radeon PRO W7800`` -> ``W7800``); where the cache leaves ``device_name`` empty (it
does on some GPUs), the last ``_``-separated word of the file name (caches are stored as
``<GPU>.json.gz``). ``arch`` is the packaged arch config whose product is that GPU
(:func:`~.common.arch_for_device`; empty when none is). An entry whose tunable parameters
disagree with its cache key is rejected
(``config mismatch``).

A truncated or damaged file keeps the entries before the damage: the cache is decoded entry by
entry, and the damage is one reject naming the entry count reached.
"""

from __future__ import annotations

import bz2
import json
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ckpred.data.readers.common import RawTable, ReadContext, Reject, arch_for_device, compression
from ckpred.errors import InputFileError

NAME = "kernel_tuner"
#: Top-level keys that mark a Kernel Tuner cache.
MARKERS = ("tune_params_keys", "cache")
_HEADER_KEYS = ("device_name", "kernel_name", "problem_size", "tune_params_keys", "objective")
_CACHE = re.compile(r'"cache"\s*:\s*\{')
RAW_LIMIT = 2000


#: Most text a cache may hold: it is one JSON document, read whole (a compressed file that
#: decompresses past this is refused before it is held).
MAX_TEXT_BYTES = 1 << 30


def _text(path: Path) -> str:
    """The file's text; a truncated gzip stream gives what was decompressed before the cut.

    Raises
    ------
    ckpred.errors.InputFileError
        When the file is (or decompresses to) more than :data:`MAX_TEXT_BYTES`.
    """
    if path.stat().st_size > MAX_TEXT_BYTES:
        raise InputFileError(str(path), f"holds {path.stat().st_size:,} bytes; a Kernel Tuner cache is read whole, "
                                        f"at most {MAX_TEXT_BYTES:,} bytes of text")
    data = path.read_bytes()
    if compression(path) == "gzip":
        data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, MAX_TEXT_BYTES + 1)
    elif compression(path) == "bz2":
        try:
            data = bz2.BZ2Decompressor().decompress(data, MAX_TEXT_BYTES + 1)
        except (OSError, ValueError, EOFError) as exc:
            raise InputFileError(str(path), f"damaged bzip2 stream ({exc})") from exc
    if len(data) > MAX_TEXT_BYTES:
        raise InputFileError(str(path), f"decompresses to more than {MAX_TEXT_BYTES:,} bytes; a Kernel Tuner cache "
                                        "is read whole (a compression bomb?)")
    return data.decode("utf-8", "replace").lstrip("\ufeff")


def _header(text: str, cache_at: int, path: Path) -> dict[str, Any]:
    """The document's top-level fields, read one by one (the cache may be cut short)."""
    decoder = json.JSONDecoder()
    out: dict[str, Any] = {}
    for key in _HEADER_KEYS:
        match = re.search(r'"%s"\s*:\s*' % re.escape(key), text[:cache_at] if cache_at >= 0 else text)
        if match:
            try:
                out[key], _ = decoder.raw_decode(text, match.end())
            except json.JSONDecodeError:
                pass
    if "tune_params_keys" not in out or not isinstance(out["tune_params_keys"], list):
        raise InputFileError(str(path), "not a Kernel Tuner cache: no readable 'tune_params_keys' list")
    return out


#: Trailing words of a device name that say its memory or board, not its model
#: (``40GB``, ``HBM3``, ``PCIE``, ``SXM4``, ``NVL``).
_NOT_A_MODEL = re.compile(r"^(\d+GB|HBM\w*|PCIE|SXM\d*|NVL)$", re.IGNORECASE)


def gpu_name(device_name: str, path: Path) -> str:
    """The GPU a cache was timed on (see the module docstring)."""
    words = [w for w in re.split(r"[\s-]+", device_name) if w]
    while len(words) > 1 and _NOT_A_MODEL.match(words[-1]):
        words.pop()
    if words:
        return words[-1]
    stem = path.name
    for suffix in (".gz", ".bz2", ".json"):
        stem = stem.removesuffix(suffix)
    return stem.rsplit("_", 1)[-1]


def read(path: Path, ctx: ReadContext) -> RawTable:
    """Read one cache file; see the module docstring.

    Raises
    ------
    ckpred.errors.InputFileError
        When the file has no ``tune_params_keys`` or no ``cache`` object at all.
    """
    text = _text(path)
    match = _CACHE.search(text)
    cache_at = match.start() if match else -1
    header = _header(text, cache_at, path)
    if match is None:
        raise InputFileError(str(path), "not a Kernel Tuner cache: no 'cache' object")
    keys = [str(k) for k in header["tune_params_keys"]]
    common = _common_columns(header, path)
    records: list[dict[str, Any]] = []
    sources: list[str] = []
    rejects: list[Reject] = []
    lines = _LineCounter(text)
    pos = match.end()
    n = len(text)
    while True:
        pos = _skip(text, pos, " \t\r\n,")
        if pos < n and text[pos] == "}":
            break
        start = pos
        try:
            name, entry, pos = _next_entry(text, pos)
        except json.JSONDecodeError as exc:
            rejects.append(Reject(f"{ctx.label}:{lines.at(start)}",
                                  f"malformed JSON: {exc.msg} after {len(records)} cache entries (file truncated "
                                  "or damaged; the entries after this point are lost)", text[start:start + RAW_LIMIT]))
            break
        source = f"{ctx.label}:{lines.at(start)}"
        row, why = _entry_row(name, entry, keys)
        if row is None:
            rejects.append(Reject(source, why, text[start:pos][:RAW_LIMIT]))
            continue
        row.update(common)
        records.append(row)
        sources.append(source)
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame()
    return RawTable(frame, np.asarray(sources, dtype=object), rejects)


def _common_columns(header: dict[str, Any], path: Path) -> dict[str, Any]:
    """The columns every row of the cache shares: its device, GPU and arch, kernel function,
    objective and problem size."""
    device = str(header.get("device_name") or "")
    gpu = gpu_name(device, path)
    common: dict[str, Any] = {"device_name": device, "gpu": gpu, "arch": arch_for_device(gpu),
                              "kernel_function": header.get("kernel_name", ""),
                              "objective": header.get("objective", "")}
    size = header.get("problem_size")
    for i, value in enumerate(size if isinstance(size, list) else []):
        common[f"problem_size_{i}"] = value
    return common


class _LineCounter:
    """The line of a position in ``text``, counted incrementally (positions only grow, so the
    text is scanned once)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.line, self.counted = 1, 0

    def at(self, pos: int) -> int:
        self.line += self.text.count("\n", self.counted, pos)
        self.counted = pos
        return self.line


_DECODER = json.JSONDecoder()


def _skip(text: str, pos: int, chars: str) -> int:
    """The first position from ``pos`` whose character is not one of ``chars``."""
    n = len(text)
    while pos < n and text[pos] in chars:
        pos += 1
    return pos


def _next_entry(text: str, pos: int) -> tuple[object, object, int]:
    """The cache entry at ``pos``: its key, its value and the position after it.

    Raises
    ------
    json.JSONDecodeError
        When the text there is not ``<JSON key> : <JSON value>``.
    """
    name, pos = _DECODER.raw_decode(text, pos)
    pos = _skip(text, pos, " \t\r\n")
    if pos >= len(text) or text[pos] != ":":
        raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
    entry, pos = _DECODER.raw_decode(text, _skip(text, pos + 1, " \t\r\n"))
    return name, entry, pos


def _entry_row(name: object, entry: object, keys: list[str]) -> tuple[dict[str, Any] | None, str]:
    """The row of cache entry ``name: entry`` (its scalar values, ``status``, ``config``), or
    ``(None, why)`` when the entry is not an object or its parameters disagree with its key."""
    if not isinstance(entry, dict):
        return None, "unrecognised JSON object: a cache entry is not an object"
    row = {k: v for k, v in entry.items() if not isinstance(v, (list, dict))}
    given = [str(entry.get(k)) for k in keys]
    if str(name).split(",") != given:
        return None, f"config mismatch: cache key {name!r} but the entry's parameters are {','.join(given)}"
    time = entry.get("time")
    if isinstance(time, (int, float)) and not isinstance(time, bool):
        row["status"] = "ok"
    else:
        row["status"] = "" if time is None else str(time)
        row["time"] = ""
    row["config"] = str(name)
    return row, ""
