"""The canonical benchmark table: one row per (problem, kernel), the same for every source.

Columns (in order): the common header ``op, arch, dtype, layout`` (less any of them the op
declares as a problem field: a table mixing dtypes carries ``dtype`` as a problem column); the
op's problem fields;
the op's kernel fields; then the measurement block ``kernel_name, tflops, latency_ms,
bandwidth_gbs, is_valid, invalid_reason, repeats, spread, source, run_id``.

Types: int fields int64, float fields float64, bool fields bool, category (categorical)
fields string; ``tflops``/``latency_ms``/``bandwidth_gbs``/``spread`` float64 (``bandwidth_gbs`` may be
null when a source does not report it); ``repeats`` int64 (number of merged measurements).
Failed or unsupported kernels stay in the table with ``is_valid=False``, ``tflops=0`` and a
reason: a selector that picks one of them scores 0 for that shape.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ckpred.errors import TableSchemaError
from ckpred.util import OwnFile, atomic_path
from ckpred.kernels.base import Field, OpDefinition

HEADER_COLUMNS: tuple[str, ...] = ("op", "arch", "dtype", "layout")
MEASUREMENT_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("kernel_name", pa.string()),
    ("tflops", pa.float64()),
    ("latency_ms", pa.float64()),
    ("bandwidth_gbs", pa.float64()),
    ("is_valid", pa.bool_()),
    ("invalid_reason", pa.string()),
    ("repeats", pa.int64()),
    ("spread", pa.float64()),
    ("source", pa.string()),
    ("run_id", pa.string()),
)


_ARROW_TYPES = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "category": pa.string(),
                "categorical": pa.string()}


def _arrow_type(field: Field) -> pa.DataType:
    return _ARROW_TYPES[field.kind]


def header_columns(op: OpDefinition) -> tuple[str, ...]:
    """The header columns of ``op``'s table: ``op, arch, dtype, layout`` less its problem fields."""
    problem = set(op.problem_names)
    return tuple(c for c in HEADER_COLUMNS if c not in problem)


def canonical_schema(op: OpDefinition) -> pa.Schema:
    """The pyarrow schema of the canonical table for ``op``."""
    fields = [pa.field(c, pa.string(), nullable=False) for c in header_columns(op)]
    fields += [pa.field(f.name, _arrow_type(f), nullable=False) for f in op.problem_fields]
    fields += [pa.field(f.name, _arrow_type(f), nullable=False) for f in op.kernel_fields]
    fields += [pa.field(name, typ, nullable=(name in ("bandwidth_gbs", "spread"))) for name, typ in MEASUREMENT_COLUMNS]
    return pa.schema(fields, metadata={b"ckpred.table": b"canonical", b"ckpred.op": op.name.encode()})


def is_table_file(path: str | Path) -> bool:
    """Whether ``path`` is a canonical table ckpred wrote (its Parquet footer carries the
    ``ckpred.table`` tag of :func:`canonical_schema`; only the footer is read)."""
    try:
        tags = pq.read_schema(path).metadata or {}
    except Exception:  # not Parquet at all; pyarrow raises several types
        return False
    return tags.get(b"ckpred.table") == b"canonical"


#: A canonical table file: a write (``ingest out=<file.parquet>``, ``simulate out=``) replaces an
#: existing file only when it is one (or empty).
TABLE_FILE = OwnFile("a canonical Parquet table", is_table_file)


def canonical_columns(op: OpDefinition) -> list[str]:
    return list(canonical_schema(op).names)


#: Values of the optional measurement columns a source may lack.
COLUMN_DEFAULTS: dict[str, object] = {"repeats": 1, "invalid_reason": "", "source": "", "run_id": "",
                                      "bandwidth_gbs": np.nan, "spread": np.nan}


def conform(frame: pd.DataFrame, op: OpDefinition) -> pd.DataFrame:
    """Return ``frame`` with exactly the canonical columns, order and dtypes.

    Missing optional columns get their defaults (``split_k=1``, pads False, ``repeats=1``,
    empty ``invalid_reason``/``source``/``run_id``, null ``bandwidth_gbs``/``spread``).

    Raises
    ------
    ckpred.errors.TableSchemaError
        When a required column is missing or cannot be converted; the message names it.
    """
    # Columns are collected and the frame built once: inserting 40+ columns one by one costs
    # pandas an index rebuild each (60 ms per call on a 10-row table).
    out: dict[str, pd.Series] = {}
    schema = canonical_schema(op)
    fields = {f.name: f for f in op.problem_fields + op.kernel_fields}
    for col in schema:
        name = col.name
        if name in frame.columns:
            values = frame[name]
        elif name in fields and fields[name].default is not None:
            values = pd.Series(fields[name].default, index=frame.index)
        elif name in COLUMN_DEFAULTS:
            values = pd.Series(COLUMN_DEFAULTS[name], index=frame.index)
        else:
            raise TableSchemaError(f"canonical table for op {op.name!r} needs column {name!r}; "
                                   f"got columns {list(frame.columns)}")
        try:
            if pa.types.is_integer(col.type):
                if values.isna().any():
                    raise ValueError("null values")
                values = values.astype("int64")
            elif pa.types.is_boolean(col.type):
                values = values.astype(bool)
            elif pa.types.is_floating(col.type):
                values = values.astype("float64")
            else:
                values = values.fillna("").astype(str)
        except (TypeError, ValueError) as exc:
            raise TableSchemaError(f"column {name!r} cannot be converted to {col.type}: {exc}") from exc
        out[name] = values
    return pd.DataFrame(out, index=frame.index).reset_index(drop=True)


def conform_arrow(table: pa.Table, op: OpDefinition) -> pa.Table:
    """:func:`conform` for an arrow table: exactly the canonical columns, order and types.

    The same defaults and checks; as ``pa.Table.from_pandas`` would store them, NaN in a
    nullable float column (``bandwidth_gbs``, ``spread``) becomes null. A text column that
    arrives dictionary-encoded (without nulls) stays so: a Parquet writer that stores no arrow
    schema writes it as the plain text column it stands for (cast to the canonical schema for
    plain text in memory).

    Raises
    ------
    ckpred.errors.TableSchemaError
        When a required column is missing or cannot be converted; the message names it.
    """
    schema = canonical_schema(op)
    fields = {f.name: f for f in op.problem_fields + op.kernel_fields}
    columns = []
    for col in schema:
        name = col.name
        if name in table.column_names:
            values = table.column(name)
        elif name in fields and fields[name].default is not None:
            values = pa.chunked_array([pa.repeat(pa.scalar(fields[name].default), table.num_rows)])
        elif name in COLUMN_DEFAULTS:
            default = COLUMN_DEFAULTS[name]
            scalar = pa.scalar(None if default != default else default, col.type)  # NaN default: null
            values = pa.chunked_array([pa.repeat(scalar, table.num_rows)])
        else:
            raise TableSchemaError(f"canonical table for op {op.name!r} needs column {name!r}; "
                                   f"got columns {table.column_names}")
        try:
            if pa.types.is_integer(col.type):
                if values.null_count:
                    raise ValueError("null values")
                values = values.cast(pa.int64())
            elif pa.types.is_boolean(col.type):
                values = values.cast(pa.bool_())
            elif pa.types.is_floating(col.type):
                values = values.cast(pa.float64())
                if col.nullable:
                    values = pc.if_else(pc.is_nan(values), pa.scalar(None, pa.float64()), values)
                else:
                    values = pc.fill_null(values, math.nan)
            elif not (pa.types.is_dictionary(values.type) and pa.types.is_string(values.type.value_type)
                      and not values.null_count):
                values = pc.fill_null(values.cast(pa.string()), "")
        except (TypeError, ValueError, pa.ArrowException) as exc:
            raise TableSchemaError(f"column {name!r} cannot be converted to {col.type}: {exc}") from exc
        columns.append(values)
    return pa.Table.from_arrays(columns, schema=pa.schema([f.with_type(c.type) for f, c in zip(schema, columns)],
                                                          metadata=schema.metadata))


def canonical_arrow(frame: pd.DataFrame, op: OpDefinition) -> pa.Table:
    """``frame`` conformed (:func:`conform`) as a pyarrow table of ``op``'s canonical schema."""
    return pa.Table.from_pandas(conform(frame, op), schema=canonical_schema(op), preserve_index=False)


def write_table(frame: pd.DataFrame | pa.Table, path: str | Path, op: OpDefinition) -> Path:
    """Write ``frame`` as canonical parquet, atomically (temp file in the same dir + rename).

    ``frame`` may be the pyarrow table of :func:`canonical_arrow` (written as is), for a caller
    that goes on using the table it wrote.

    Raises
    ------
    ckpred.errors.TableSchemaError
        When a pyarrow ``frame`` does not have ``op``'s canonical schema.
    """
    path = Path(path)
    if isinstance(frame, pa.Table):
        if not frame.schema.equals(canonical_schema(op)):
            raise TableSchemaError(f"{path}: the arrow table to write is not the canonical table of op {op.name!r} "
                                   f"(columns {frame.schema.names}); convert it with canonical_arrow")
        table = frame
    else:
        table = canonical_arrow(frame, op)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def read_table(path: str | Path, op: OpDefinition) -> pd.DataFrame:
    """Read a canonical parquet file and check it against ``op``'s schema."""
    table = pq.read_table(path)
    missing = [c for c in canonical_columns(op) if c not in table.column_names]
    if missing:
        raise TableSchemaError(f"{path}: not a canonical ckpred table for op {op.name!r}; missing columns {missing}")
    return conform(table.to_pandas(), op)


def data_hash(table: pd.DataFrame) -> str:
    """sha256 over the table's row hashes (content, column order and row order)."""
    digest = hashlib.sha256(",".join(table.columns).encode())
    digest.update(pd.util.hash_pandas_object(table, index=False).to_numpy().tobytes())
    return digest.hexdigest()


def content_hash(table: pd.DataFrame) -> str:
    """:func:`data_hash` without the provenance columns ``source`` and ``run_id``: the same rows
    read from the same files hash alike whatever the working directory names the files by
    (both hold a path relative to it when the file is inside it)."""
    return data_hash(table.drop(columns=["source", "run_id"], errors="ignore"))
