"""The manifest of a partitioned Parquet dataset: which files, how many rows, which combo each.

A partitioned dataset is a directory of ``part-NNNNN.parquet`` canonical tables plus the
manifest ``_ckpred_partitions.json``. Both writers of such directories leave it: ``ckpred
ingest`` with a directory ``out`` and :func:`ckpred.scale.write_partitions`. The Dask backend
trains on the directory file by file, so the manifest records per file its row count and its
one (arch, dtype, layout); a query must lie whole in one file, which the trainer checks.

The manifest is also what marks the directory as ckpred's: a write replaces an existing
directory only when it holds the manifest and part files and nothing else (:data:`DATASET_DIR`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

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


def describe_part(file: str | Path, table: Any, *, mixed: bool = False) -> dict[str, Any]:
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


def is_partitioned(path: Any) -> bool:
    """Whether ``path`` is a dataset directory with a manifest."""
    return isinstance(path, (str, Path)) and (Path(str(path)) / MANIFEST).is_file()


def read_manifest(path: str | Path, op: OpDefinition) -> dict[str, Any]:
    """The manifest of a partitioned dataset, checked against ``op`` and the files present.

    The manifest may be edited by hand (a part dropped or added), so every key the trainer
    reads is checked here, before any cluster starts: a malformed manifest is one
    :class:`~ckpred.errors.InputFileError` naming the manifest, the key or entry, the value
    and what is allowed, never a ``KeyError`` deep inside training.

    Raises
    ------
    InputFileError
        No manifest, not JSON, another op, or a key or part entry of the wrong shape: a
        ``partitions`` list of ``{file, rows, arch, dtype, layout}`` entries whose ``file`` is
        a Parquet part present inside the directory (each listed once) and whose ``rows`` add
        up to the top-level ``rows``.
    """
    root = Path(path)
    file = root / MANIFEST
    if not file.is_file():
        raise InputFileError(str(root), f"not a partitioned dataset (no {MANIFEST}; write it with "
                                        "`ckpred ingest out=<directory>` or ckpred.scale.write_partitions)")
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputFileError(str(file), f"not valid JSON ({exc.msg} at line {exc.lineno}); allowed: the JSON "
                                        "object the dataset writers leave") from None
    except UnicodeDecodeError as exc:
        raise InputFileError(str(file), f"not UTF-8 text (byte {exc.start}); allowed: the JSON object the "
                                        "dataset writers leave") from None

    def bad(where: str, value: Any, allowed: str) -> InputFileError:
        text = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        shown = f"{text} ({type(value).__name__})" if value is not _ABSENT else "absent"
        return InputFileError(str(file), f"{where} is {shown}; allowed: {allowed}")

    if not isinstance(manifest, dict):
        raise bad("the top level", manifest, "a JSON object with keys op, partitions and rows")
    if manifest.get("op") != op.name:
        raise InputFileError(str(file), f"the dataset holds op {manifest.get('op')!r}, the config trains {op.name!r}")
    parts = manifest.get("partitions", _ABSENT)
    if not isinstance(parts, list) or not parts:
        raise bad("key 'partitions'", parts, f"a non-empty list of part entries {_ENTRY}")
    seen: set[str] = set()
    for i, part in enumerate(parts):
        where = f"partitions[{i}]"
        if not isinstance(part, dict):
            raise bad(where, part, f"a part entry {_ENTRY}")
        name = part.get("file", _ABSENT)
        if not isinstance(name, str) or not name:
            raise bad(f"{where}.file", name, "the name of a Parquet part file in the dataset directory")
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise bad(f"{where}.file", name, f"a path inside {root} (relative, without '..')")
        if name in seen:
            raise bad(f"{where}.file", name, "each part file listed once (a second entry would train on it twice)")
        seen.add(name)
        if not (root / name).is_file():
            raise bad(f"{where}.file", name, f"a Parquet part file present in {root}")
        rows = part.get("rows", _ABSENT)
        if not _is_count(rows):
            raise bad(f"{where}.rows", rows, "the part's row count, an integer >= 0")
        for column in COMBO_COLUMNS:
            value = part.get(column, _ABSENT)
            if not isinstance(value, str):
                raise bad(f"{where}.{column}", value, f"the part's one {column} name, a string")
    total = manifest.get("rows", _ABSENT)
    counted = sum(p["rows"] for p in parts)
    if not _is_count(total) or total != counted:
        raise bad("key 'rows'", total, f"the sum of the parts' rows, {counted}")
    return manifest


#: Stands for a key a manifest lacks (``None`` is a value a hand edit can write).
_ABSENT = object()
#: The keys of one part entry, as the errors name them.
_ENTRY = "{file, rows, " + ", ".join(COMBO_COLUMNS) + "}"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
