"""Merging: checked row chunks into hash partitions by query (held in memory up to a budget,
spilled past it), then each partition's repeats of one (problem, kernel) into one row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ckpred.data.ingestion.check import validate
from ckpred.data.ingestion.rows import (Texts, array_of, buffer_rows, combined_group_ids, first_rows, group_ids,
                                        set_column, source_texts)
from ckpred.data.readers.common import Reject
from ckpred.kernels.base import OpDefinition


# -- partitions ---------------------------------------------------------------------------------
#: Spill files are not compressed, and are read back memory-mapped: a partition's columns are
#: then the file's pages, with no decompression. The spill of a row of numbers is smaller than
#: its line of input text, so the temporary disk stays below the input's size.
SPILL_OPTIONS = pa.ipc.IpcWriteOptions(compression=None)


class Partitions:
    """Checked row chunks, hash-partitioned by the query key (:func:`hash_columns`).

    One partition keeps the chunks in memory (all of the input fits in one chunk, or the
    caller wants the table in memory anyway). With more, each chunk's share of every
    partition is held in memory while the held shares stay within ``hold_bytes``, and the
    rest spill to ``spill`` (Arrow IPC: the columns are written and read back as they are); a
    partition is put together only when it is merged. So memory holds one chunk or one
    partition at a time, plus at most ``hold_bytes`` of held rows. Holding saves the spill's
    write and read back, which cost system time per page written.

    The count is planned from the files' sizes; a compressed file holds more text than its
    size, so when the text read outgrows the plan (:meth:`expect`), the count doubles until
    each partition is planned for one chunk again and the rows so far are partitioned anew
    (every partition of the old count splits into two of the new: a hash modulo ``2n`` is
    its value modulo ``n`` or that plus ``n``).
    """

    def __init__(self, op: OpDefinition, count: int, spill: Path | None, hold_bytes: int = 0) -> None:
        self.op, self.count, self.spill, self.hold_bytes = op, count, spill, hold_bytes
        self.tables: list[pa.Table] = []
        #: Each partition's pieces in chunk order: a held table, or the spill file it was written to.
        self.pieces: list[list[pa.Table | Path]] = [[] for _ in range(count)]
        self.held = 0
        self.chunks = 0

    def add(self, rows: pa.Table) -> None:
        if self.spill is None or self.count == 1:  # one partition: the files fit in one chunk
            self.tables.append(rows)
            return
        names = list(hash_columns(self.op))
        keys = [array_of(rows, c) for c in names]
        gid = group_ids(keys)  # a chunk holds few problems: each is hashed once, not once per row
        first = first_rows(gid)
        part = partition_of(pd.DataFrame({c: k[first] for c, k in zip(names, keys)}), self.count)[gid]
        # a stable sort of 16-bit keys is a radix sort
        order = np.argsort(part.astype(np.uint16) if self.count <= 1 << 16 else part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.count + 1))
        for p in range(self.count):
            if bounds[p] == bounds[p + 1]:
                continue
            piece = rows.take(pa.array(order[bounds[p]:bounds[p + 1]]))
            if self.held + piece.nbytes <= self.hold_bytes:
                self.pieces[p].append(piece)
                self.held += piece.nbytes
                continue
            path = self.spill / f"p{p:05d}-c{self.chunks:06d}.arrow"
            with pa.ipc.new_file(str(path), piece.schema, options=SPILL_OPTIONS) as writer:
                writer.write_table(piece)
            self.pieces[p].append(path)
        self.chunks += 1

    def expect(self, input_bytes: int) -> None:
        """Plan for ``input_bytes`` of input text in all: more partitions when the count planned
        leaves more than ``hold_bytes`` of input per partition (see the class docstring)."""
        if self.spill is None or self.hold_bytes <= 0:
            return
        count = self.count
        while count * self.hold_bytes < input_bytes:
            count *= 2
        if count == self.count:
            return
        old = [self.tables] if self.count == 1 else self.pieces
        self.count, self.tables, self.pieces, self.held = count, [], [[] for _ in range(count)], 0
        for pieces in old:
            for piece in pieces:
                if isinstance(piece, pa.Table):
                    self.add(piece)
                    continue
                with pa.memory_map(str(piece)) as fh:
                    self.add(pa.ipc.open_file(fh).read_all())
                piece.unlink()

    def parts(self, texts: Texts) -> Iterator[pa.Table]:
        """Each non-empty partition (all partitions' rows in order of first appearance)."""
        if self.spill is None or self.count == 1:
            tables, self.tables = self.tables, []
            yield (joined_chunks(tables) if tables else
                   validate(buffer_rows(None, self.op, texts, 0, ""), self.op, texts))
            return
        for p in range(self.count):
            pieces, self.pieces[p] = self.pieces[p], []
            if not pieces:
                continue
            tables = []
            for piece in pieces:
                if isinstance(piece, pa.Table):
                    self.held -= piece.nbytes
                    tables.append(piece)
                    continue
                with pa.memory_map(str(piece)) as fh:
                    tables.append(pa.ipc.open_file(fh).read_all())
                piece.unlink()
            del pieces
            yield joined_chunks(tables)


def joined_chunks(tables: list[pa.Table]) -> pa.Table:
    """One table of contiguous columns from the row chunks ``tables`` (their columns unified:
    a column some chunks lack is null there)."""
    table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    return table.combine_chunks()


def hash_columns(op: OpDefinition) -> tuple[str, ...]:
    """The columns rows are partitioned by: the query key, when it is made of problem fields.

    A problem's fields include its query key, so partitioning by the query keeps every
    measurement of a problem together (what the rule check and the merge need) and also every
    problem of a query (what LightGBM's Dask interface needs: it takes each file's query
    sizes on their own).
    """
    key = tuple(op.group_key)
    return key if key and set(key) <= set(op.problem_names) else tuple(op.problem_names)


def partition_of(problems: pd.DataFrame, count: int) -> np.ndarray:
    """The partition (``0 .. count-1``) of each row, from a hash of its problem fields.

    Every measurement of one problem lands in one partition, whatever file or chunk it
    comes from; the hash is pandas' stable row hash, so a problem's partition is the same
    in every run.
    """
    if count == 1:
        return np.zeros(len(problems), dtype=np.int64)
    hashed = pd.util.hash_pandas_object(problems, index=False).to_numpy()
    return (hashed % np.uint64(count)).astype(np.int64)


def merge(rows: pa.Table, op: OpDefinition, texts: Texts,
          extra: Sequence[str] = ()) -> tuple[pa.Table, list[Reject], tuple[np.ndarray, pa.Array]]:
    """One row per (problem, kernel): medians over valid repeats (see :mod:`ckpred.data.ingest`).

    The output keeps each pair's first row (one copy of the table, in order of first
    appearance) and overwrites only the pairs measured more than once. ``extra``: header
    columns the rows carry per row (a table's own arch), which tell problems apart too.

    Returns
    -------
    tuple
        The merged rows, the superseded measurements (rejects), and the ``;``-joined sources
        of the merged pairs -- (their positions in the merged rows, their texts) -- which
        replace the first row's own when the part is written.
    """
    unmerged = (np.zeros(0, dtype=np.int64), pa.array([], pa.string()))
    groups = _Repeats.of(rows, op, extra)
    if groups is None:
        return rows, [], unmerged
    # row g is group g; the columns the merge rewrites are taken by numpy below, not copied twice
    out = rows.drop_columns([c for c in MERGED_COLUMNS if c in rows.column_names]).take(pa.array(groups.first))
    text = source_texts(rows, texts, groups.at[groups.order])
    sources = pc.binary_join(pa.ListArray.from_arrays(pa.array(np.r_[groups.starts, len(groups.order)], pa.int32()),
                                                      text), ";")
    run_codes = joined_run_ids(array_of(rows, "run")[groups.at][groups.order], groups.sorted_gid, texts)
    sub = pd.DataFrame({"_gid": groups.sub_gid, "is_valid": array_of(rows, "is_valid")[groups.at],
                        **{c: np.asarray(array_of(rows, c), dtype=np.float64)[groups.at]
                           for c in ("tflops", "latency_ms", "bandwidth_gbs")},
                        "repeats": array_of(rows, "repeats")[groups.at]})
    columns, merged = _merged_columns(rows, groups, sub)
    run = np.asarray(array_of(rows, "run"), dtype=np.int32)[groups.first]
    run[groups.multi_ids] = run_codes
    columns["run"] = run
    for col, values in columns.items():
        out = set_column(out, col, values)
    dropped = groups.at[~sub["is_valid"].to_numpy() & np.isin(groups.sub_gid, merged)]
    return out, _superseded(rows, texts, dropped), (groups.multi_ids, sources)


@dataclass
class _Repeats:
    """The (problem, kernel) groups of a partition's rows that hold repeats."""

    #: Group of each row (numbered by first appearance), and each group's first row.
    gid: np.ndarray
    first: np.ndarray
    #: The rows of the groups measured more than once, their groups, and those groups (ascending).
    at: np.ndarray
    sub_gid: np.ndarray
    multi_ids: np.ndarray
    #: ``at`` sorted by group (each group's rows together, in order of appearance), the sorted
    #: groups, and where each group starts.
    order: np.ndarray
    sorted_gid: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, rows: pa.Table, op: OpDefinition, extra: Sequence[str]) -> "_Repeats | None":
        """The groups of ``rows``; ``None`` when no pair is measured twice."""
        keys = [*op.problem_names, *extra, "kernel"]
        if not rows.num_rows:
            return None
        # the problem first (its rows come in runs), then the (problem, kernel) pairs
        problem = (group_ids([array_of(rows, c) for c in keys[:-1]]) if len(keys) > 1
                   else np.zeros(rows.num_rows, dtype=np.int64))
        gid = combined_group_ids([problem, array_of(rows, "kernel")])
        counts = np.bincount(gid)
        multi = counts[gid] > 1
        if not multi.any():
            return None
        at = np.flatnonzero(multi)
        sub_gid = gid[at]
        order = np.argsort(sub_gid, kind="stable")
        sorted_gid = sub_gid[order]
        return cls(gid=gid, first=first_rows(gid), at=at, sub_gid=sub_gid, multi_ids=np.flatnonzero(counts > 1),
                   order=order, sorted_gid=sorted_gid,
                   starts=np.flatnonzero(np.r_[True, sorted_gid[1:] != sorted_gid[:-1]]))


def _merged_columns(rows: pa.Table, groups: _Repeats, sub: pd.DataFrame) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The merged values of every group (medians over valid repeats, counts, spread, validity)
    and the groups that have a valid measurement."""
    first, multi_ids = groups.first, groups.multi_ids
    repeats = np.asarray(array_of(rows, "repeats"), dtype=np.int64)[first]
    repeats[multi_ids] = np.bincount(groups.sub_gid, weights=sub["repeats"].to_numpy(np.float64),
                                     minlength=len(first))[multi_ids].astype(np.int64)
    spread = np.asarray(array_of(rows, "spread"), dtype=np.float64)[first]
    spread[multi_ids] = np.nan
    valid = sub[sub["is_valid"]].groupby("_gid")
    stats = pd.DataFrame({
        "tflops": valid["tflops"].median(), "latency_ms": valid["latency_ms"].median(),
        "bandwidth_gbs": valid["bandwidth_gbs"].median(), "tmin": valid["tflops"].min(),
        "tmax": valid["tflops"].max(), "n": valid.size(), "repeats": valid["repeats"].sum(),
    })
    idx = stats.index.to_numpy()
    columns: dict[str, np.ndarray] = {}
    for col in ("tflops", "latency_ms", "bandwidth_gbs"):
        values = np.asarray(array_of(rows, col), dtype=np.float64)[first]
        values[idx] = stats[col].to_numpy()
        columns[col] = values
    repeats[idx] = stats["repeats"].to_numpy()
    columns["repeats"] = repeats
    spread[idx] = ((stats["tmax"] - stats["tmin"]) / stats["tflops"]).where(stats["n"] >= 2).to_numpy()
    columns["spread"] = spread
    is_valid = np.asarray(array_of(rows, "is_valid"), dtype=bool)[first]
    is_valid[idx] = True
    columns["is_valid"] = is_valid
    reason = np.asarray(array_of(rows, "reason"), dtype=np.int32)[first]
    reason[idx] = 0
    columns["reason"] = reason
    return columns, idx


def _superseded(rows: pa.Table, texts: Texts, dropped: np.ndarray) -> list[Reject]:
    """The invalid measurements ``dropped`` because a valid repeat of their pair is kept."""
    if not len(dropped):
        return []
    lost = rows.select(["reason", "tflops", "latency_ms"]).take(pa.array(dropped)).to_pydict()
    return [Reject(source, f"superseded: {texts.values[code]} (a valid repeat of this problem and kernel "
                           "is in the table)", f"tflops={t} latency_ms={lat}")
            for source, code, t, lat in zip(source_texts(rows, texts, dropped).to_pylist(), lost["reason"],
                                            lost["tflops"], lost["latency_ms"])]


#: Columns :func:`merge` computes for every merged row (the rest are the group's first row's).
MERGED_COLUMNS = ("tflops", "latency_ms", "bandwidth_gbs", "repeats", "spread", "is_valid", "reason", "run")


def joined_run_ids(run: np.ndarray, gid: np.ndarray, texts: Texts) -> np.ndarray:
    """The code of each group's distinct run ids, ``;``-joined in order of first appearance.

    ``run`` holds the run-id codes of rows sorted by their group ``gid`` (ascending; each
    group's rows in order of appearance). Most groups hold one run id: its own code.
    """
    pair = gid.astype(np.int64) * (int(run.max()) + 1) + run
    _, first = np.unique(pair, return_index=True)
    first.sort()  # group by group, each group's run ids in order of first appearance
    kept_gid, kept_run = gid[first], run[first]
    starts = np.flatnonzero(np.r_[True, kept_gid[1:] != kept_gid[:-1]])
    sizes = np.diff(np.r_[starts, len(kept_gid)])
    codes = kept_run[starts].astype(np.int32)
    for j in np.flatnonzero(sizes > 1).tolist():
        codes[j] = texts.code(";".join(texts.values[c] for c in kept_run[starts[j]:starts[j] + sizes[j]].tolist()))
    return codes
