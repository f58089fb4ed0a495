"""The manifest of a partitioned Parquet dataset: which files, how many rows, which combo each.

A partitioned dataset is a directory of ``part-NNNNN.parquet`` canonical tables plus the
manifest ``_ckpred_partitions.json``. Both writers of such directories leave it: ``ckpred
ingest`` with a directory ``out`` and :func:`ckpred.scale.write_partitions`. The Dask backend
trains on the directory file by file, so the manifest records per file its row count and its
one (arch, dtype, layout); a query must lie whole in one file, which the trainer checks.

The manifest is also what marks the directory as ckpred's: a write replaces an existing
directory only when it holds the manifest and part files and nothing else (:data:`DATASET_DIR`).
Both backends read a dataset through :func:`read_manifest`, which checks the manifest against
the parts' Parquet footers (the rows are not read), so they read the same files and rows.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ckpred.errors import InputFileError
from ckpred.kernels.base import OpDefinition
from ckpred.util import OwnDirectory

#: The manifest file beside the Parquet parts.
MANIFEST = "_ckpred_partitions.json"
#: The columns that name a partition's hardware and number format (one value each per file).
COMBO_COLUMNS: tuple[str, ...] = ("arch", "dtype", "layout")
#: A partitioned dataset directory as ckpred writes it; only such a directory (or an empty one)
#: is replaced by a write.
DATASET_DIR = OwnDirectory("a partitioned table ckpred wrote", MANIFEST, re.compile(r"part-\d{5,}\.parquet"))
#: A combo value a manifest may hold: a config name (``gfx950``, ``fp8``, ``rcr``), never a path.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,99}")
#: Largest manifest read (a million parts take about 100 MB).
_MAX_MANIFEST_BYTES = 256 << 20


def describe_part(file: str | Path, table: pa.Table, *, mixed: bool = False) -> dict[str, Any]:
    """The manifest entry of one Parquet part: its name, row count and its one combo.

    ``table`` is the part's pyarrow table, which the caller has just written to ``file`` (the
    file is not read again). With ``mixed``, a combo column that holds several values (the
    op makes it a problem field) or none is recorded as ``null``: the dataset is still
    marked and checked, but the Dask backend, which needs one combo per file, refuses it.

    Raises
    ------
    InputFileError
        When the file mixes several (arch, dtype, layout) combinations or lacks one of their
        columns (and not ``mixed``): the Dask backend computes a partition's hardware features
        from its one combo.
    """
    path = Path(file)
    names = table.schema.names
    combo: dict[str, str | None] = {}
    for column in COMBO_COLUMNS:
        if column not in names:
            if mixed:
                combo[column] = None
                continue
            raise InputFileError(str(path), f"no column {column!r} (the op makes it a problem field, so one file may "
                                            "mix values); allowed: one arch, dtype and layout per partition file")
        values = pc.unique(table.column(column)).to_pylist()
        if len(values) > 1 and not mixed:
            raise InputFileError(str(path), f"column {column!r} holds {len(values)} values {sorted(map(str, values))[:5]}; "
                                            "allowed: one arch, dtype and layout per partition file")
        combo[column] = (str(values[0]) if values else "") if len(values) <= 1 else None
    return {"file": path.name, "rows": int(table.num_rows), **combo}


def write_manifest(root: str | Path, op: OpDefinition, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Write the manifest of the dataset in ``root`` (``parts``: the entries of
    :func:`describe_part`, in order) and return it."""
    root = Path(root)
    manifest = {"op": op.name, "query_columns": [*COMBO_COLUMNS, *op.group_key], "partitions": parts,
                "rows": int(sum(p["rows"] for p in parts))}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def is_partitioned(path: object) -> bool:
    """Whether ``path`` is a dataset directory with a manifest."""
    return isinstance(path, (str, Path)) and (Path(str(path)) / MANIFEST).is_file()


def read_manifest(path: str | Path, op: OpDefinition, *, one_combo: bool = True) -> dict[str, Any]:
    """The manifest of a partitioned dataset, checked against ``op`` and the files present.

    The manifest may be edited by hand (a part dropped or added) or forged, so every key the
    readers use is checked here, before any cluster starts, and so is every claim it makes
    about the parts, against their Parquet footers (no rows are read): each part is a
    regular Parquet file in the directory holding a canonical table of ``op``, with the rows
    the manifest says and, in its footer statistics (or, where a writer left none, its combo
    columns), the one arch, dtype and layout the manifest says; and every Parquet file of the
    directory is listed. A malformed or disagreeing manifest is one
    :class:`~ckpred.errors.InputFileError` naming the manifest, the key or entry, the value
    and what is allowed, never a ``KeyError`` deep inside training.

    ``one_combo`` (the Dask backend): every part holds one arch, dtype and layout; without it
    (the in-memory reader), a part ingest marked as mixing them (``null``) is accepted.

    Raises
    ------
    InputFileError
        No manifest, not JSON, another op, or a key or part entry of the wrong shape: a
        ``partitions`` list of ``{file, rows, arch, dtype, layout}`` entries whose ``file`` is
        a Parquet part present inside the directory (each listed once) and whose ``rows`` add
        up to the top-level ``rows``; or a part that disagrees with its entry.
    """
    root = Path(path)
    file = root / MANIFEST
    manifest = _load_manifest(root, file)
    if not isinstance(manifest, dict):
        raise _bad(file, "the top level", manifest, "a JSON object with keys op, partitions and rows")
    if manifest.get("op") != op.name:
        raise InputFileError(str(file), f"the dataset holds op {_shown(manifest.get('op'))}, the config trains "
                                        f"{op.name!r}")
    parts = manifest.get("partitions", _ABSENT)
    if not isinstance(parts, list) or not parts:
        raise _bad(file, "key 'partitions'", parts, f"a non-empty list of part entries {_ENTRY}")
    seen: set[str] = set()
    for i, part in enumerate(parts):
        _check_entry(file, f"partitions[{i}]", part, seen, one_combo=one_combo)
    total = manifest.get("rows", _ABSENT)
    counted = sum(p["rows"] for p in parts)
    if not _is_count(total) or total != counted:
        raise _bad(file, "key 'rows'", total, f"the sum of the parts' rows, {counted}")
    unlisted = sorted(e.name for e in os.scandir(root) if e.name.endswith(".parquet") and e.name not in seen)
    if unlisted:
        raise InputFileError(str(file), f"lists {len(parts)} parts, the directory holds {len(unlisted)} more "
                                        f"Parquet files {unlisted[:5]}; allowed: a manifest listing every part "
                                        "(both backends read the same rows)")
    for i, part in enumerate(parts):
        _check_part(root / part["file"], part, f"partitions[{i}]", op, str(file))
    return manifest


def _load_manifest(root: Path, file: Path) -> object:
    """The parsed JSON of the manifest ``file`` of dataset ``root`` (any JSON value; the caller
    checks its shape)."""
    if not file.is_file():
        raise InputFileError(str(root), f"not a partitioned dataset (no {MANIFEST}; write it with "
                                        "`ckpred ingest out=<directory>` or ckpred.scale.write_partitions)")
    allowed_json = "the JSON object the dataset writers leave"
    try:
        with open(file, "rb") as fh:
            raw = fh.read(_MAX_MANIFEST_BYTES + 1)
        if len(raw) > _MAX_MANIFEST_BYTES:
            raise InputFileError(str(file), f"larger than {_MAX_MANIFEST_BYTES >> 20} MiB; allowed: {allowed_json}")
        manifest: object = json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise InputFileError(str(file), f"not valid JSON ({exc.msg} at line {exc.lineno}); allowed: "
                                        f"{allowed_json}") from None
    except UnicodeDecodeError as exc:
        raise InputFileError(str(file), f"not UTF-8 text (byte {exc.start}); allowed: {allowed_json}") from None
    except RecursionError:
        raise InputFileError(str(file), f"nested too deeply to read; allowed: {allowed_json}") from None
    except OSError as exc:
        raise InputFileError(str(file), exc.strerror or str(exc)) from None
    return manifest


def _bad(file: Path, where: str, value: object, allowed: str) -> InputFileError:
    """The error for manifest ``file`` whose ``where`` holds ``value`` (or lacks it: ``_ABSENT``)."""
    text = _shown(value)
    shown = f"{text} ({type(value).__name__})" if value is not _ABSENT else "absent"
    return InputFileError(str(file), f"{where} is {shown}; allowed: {allowed}")


def _check_entry(file: Path, where: str, part: object, seen: set[str], *, one_combo: bool) -> None:
    """Refuse the manifest entry ``part`` (at ``where``) unless it names, once (``seen``: the
    names listed before it, which this adds to), a regular Parquet file directly in the
    directory, with a row count and a combo name per column (``None`` when not ``one_combo``)."""
    root = file.parent
    if not isinstance(part, dict):
        raise _bad(file, where, part, f"a part entry {_ENTRY}")
    name = part.get("file", _ABSENT)
    if not isinstance(name, str) or not name:
        raise _bad(file, f"{where}.file", name, "the name of a Parquet part file in the dataset directory")
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise _bad(file, f"{where}.file", name, f"a path inside {root} (relative, without '..')")
    if "/" in name or os.sep in name or name == MANIFEST or not name.endswith(".parquet"):
        raise _bad(file, f"{where}.file", name, f"the name of a .parquet file directly in {root} (not {MANIFEST})")
    if name in seen:
        raise _bad(file, f"{where}.file", name, "each part file listed once (a second entry would train on it twice)")
    seen.add(name)
    try:
        info = os.lstat(root / name)
    except OSError:
        raise _bad(file, f"{where}.file", name, f"a Parquet part file present in {root}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise _bad(file, f"{where}.file", name, f"a regular Parquet file in {root} (this one is {kind})")
    rows = part.get("rows", _ABSENT)
    if not _is_count(rows):
        raise _bad(file, f"{where}.rows", rows, "the part's row count, an integer >= 0")
    for column in COMBO_COLUMNS:
        value = part.get(column, _ABSENT)
        if value is None and not one_combo:
            continue
        if not isinstance(value, str):
            allowed = f"the part's one {column} name, a string"
            raise _bad(file, f"{where}.{column}", value, allowed + (" (model.backend=dask trains on one arch, dtype and "
                                                                    "layout per file)" if value is None else ""))
        if not _NAME.fullmatch(value) and not (value == "" and rows == 0):  # a part without rows has no combo
            raise _bad(file, f"{where}.{column}", value, f"the config name of the part's {column} (letters, digits, "
                                                         "_ . + -), not a path")


def _check_part(path: Path, part: dict[str, Any], where: str, op: OpDefinition, manifest: str) -> None:
    """Refuse a part whose Parquet footer disagrees with its manifest entry: not Parquet, not a
    canonical table of ``op``, another row count, or a combo column whose values (footer
    statistics; the column itself where the writer left none) are not the entry's one value."""
    try:
        meta = pq.read_metadata(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise InputFileError(manifest, f"{where}.file {part['file']!r} is not a readable Parquet file "
                                       f"({type(exc).__name__}); allowed: a part ckpred wrote") from None
    tags = meta.metadata or {}
    if tags.get(b"ckpred.table") != b"canonical" or tags.get(b"ckpred.op", op.name.encode()) != op.name.encode():
        raise InputFileError(manifest, f"{where}.file {part['file']!r} is not a canonical table of op {op.name!r} "
                                       "(no ckpred metadata); allowed: a part ckpred wrote")
    if meta.num_rows != part["rows"]:
        raise InputFileError(manifest, f"{where}.rows is {part['rows']}, the file {part['file']!r} holds "
                                       f"{meta.num_rows} rows; allowed: the part's row count")
    columns = {meta.schema.column(j).name: j for j in range(meta.num_columns)}
    for column in COMBO_COLUMNS:
        claimed = part[column]
        if claimed is None:
            continue
        if column not in columns:
            raise InputFileError(manifest, f"{where}.{column} is {claimed!r}, the file {part['file']!r} has no column "
                                           f"{column!r}; allowed: the part's one {column}")
        found = _values_of(path, meta, columns[column], column)
        if meta.num_rows and found != {claimed}:
            shown = sorted(found)[:5]
            raise InputFileError(manifest, f"{where}.{column} is {claimed!r}, the file {part['file']!r} holds "
                                           f"{shown}; allowed: the part's one {column}")


def _values_of(path: Path, meta: pq.FileMetaData, index: int, column: str) -> set[str]:
    """The distinct values of a string column: from each row group's min/max statistics
    when they say the group holds one value, else read from the column."""
    found: set[str] = set()
    for g in range(meta.num_row_groups):
        chunk = meta.row_group(g).column(index)
        stats = chunk.statistics
        if chunk.num_values == 0:
            continue
        if stats is None or not stats.has_min_max or stats.null_count:
            break
        found.update({_text(stats.min), _text(stats.max)})
    else:
        return found
    values = pq.read_table(path, columns=[column]).column(column)
    return {str(v) for v in pc.unique(values).to_pylist()}


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _shown(value: object) -> str:
    try:
        text = repr(value)
    except RecursionError:  # a value nested too deeply to print
        return f"a deeply nested {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


#: Stands for a key a manifest lacks (``None`` is a value a hand edit can write).
_ABSENT = object()
#: The keys of one part entry, as the errors name them.
_ENTRY = "{file, rows, " + ", ".join(COMBO_COLUMNS) + "}"


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
