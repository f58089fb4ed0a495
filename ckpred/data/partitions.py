"""The manifest of a partitioned Parquet dataset: which files, how many rows, which combo each.

A partitioned dataset is a directory of ``part-NNNNN.parquet`` canonical tables plus the
manifest ``_ckpred_partitions.json``. Both writers of such directories leave it: ``ckpred
ingest`` with a directory ``out`` and :func:`ckpred.scale.write_partitions`. The Dask backend
trains on the directory file by file, so the manifest records per file its row count and its
one (arch, dtype, layout); a query must lie whole in one file, which the trainer checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from ckpred.errors import InputFileError
from ckpred.kernels.base import OpDefinition

#: The manifest file beside the Parquet parts.
MANIFEST = "_ckpred_partitions.json"
#: The columns that name a partition's hardware and number format (one value each per file).
COMBO_COLUMNS: tuple[str, ...] = ("arch", "dtype", "layout")


def describe_part(file: str | Path, table: Any = None) -> dict[str, Any]:
    """The manifest entry of one Parquet part: its name, row count and its one combo.

    ``table`` is the part's pyarrow table when the caller has just written it (the file is not
    read again); otherwise the combo columns are read from ``file``.

    Raises
    ------
    InputFileError
        When the file mixes several (arch, dtype, layout) combinations or lacks one of their
        columns: the Dask backend computes a partition's hardware features from its one combo.
    """
    path = Path(file)
    names = table.schema.names if table is not None else pq.read_schema(path).names
    absent = [c for c in COMBO_COLUMNS if c not in names]
    if absent:
        raise InputFileError(str(path), f"no column {absent} (the op makes it a problem field, so one file may mix "
                                        "values); allowed: one arch, dtype and layout per partition file")
    if table is None:
        table = pq.read_table(path, columns=list(COMBO_COLUMNS))
    combo: dict[str, str] = {}
    for column in COMBO_COLUMNS:
        values = pc.unique(table.column(column)).to_pylist()
        if len(values) > 1:
            raise InputFileError(str(path), f"column {column!r} holds {len(values)} values {sorted(map(str, values))[:5]}; "
                                            "allowed: one arch, dtype and layout per partition file")
        combo[column] = str(values[0]) if values else ""
    return {"file": path.name, "rows": int(table.num_rows), **combo}


def write_manifest(root: str | Path, op: OpDefinition, parts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Write the manifest of the dataset in ``root`` and return it.

    ``parts`` are the entries of :func:`describe_part`; without them every ``part-*.parquet``
    in ``root`` is described, in name order.
    """
    root = Path(root)
    if parts is None:
        parts = [describe_part(f) for f in sorted(root.glob("part-*.parquet"))]
    manifest = {"op": op.name, "query_columns": [*COMBO_COLUMNS, *op.group_key], "partitions": parts,
                "rows": int(sum(p["rows"] for p in parts))}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def is_partitioned(path: Any) -> bool:
    """Whether ``path`` is a dataset directory with a manifest."""
    return isinstance(path, (str, Path)) and (Path(str(path)) / MANIFEST).is_file()


def read_manifest(path: str | Path, op: OpDefinition) -> dict[str, Any]:
    """The manifest of a partitioned dataset, checked against ``op`` and the files present."""
    root = Path(path)
    file = root / MANIFEST
    if not file.is_file():
        raise InputFileError(str(root), f"not a partitioned dataset (no {MANIFEST}; write it with "
                                        "`ckpred ingest out=<directory>` or ckpred.scale.write_partitions)")
    try:
        manifest = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise InputFileError(str(file), f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if manifest.get("op") != op.name:
        raise InputFileError(str(file), f"the dataset holds op {manifest.get('op')!r}, the config trains {op.name!r}")
    missing = [p["file"] for p in manifest["partitions"] if not (root / p["file"]).is_file()]
    if missing:
        raise InputFileError(str(root), f"partition files listed in {MANIFEST} are missing: {missing[:5]}")
    return manifest
