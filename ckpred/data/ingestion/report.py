"""Reporting: the counts of an ingestion (every record ends in exactly one place) and their
printed reconciliation."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

@dataclass
class IngestSummary:
    """Counts of one ingestion. ``records == valid + sum(invalid) + sum(rejected)``."""

    files: list[str] = field(default_factory=list)
    #: Reader used for each file (``empty`` for an empty file).
    formats: list[str] = field(default_factory=list)
    #: Measurement records read (rows before merging, plus rejected records).
    records: int = 0
    valid: int = 0
    #: Invalid rows before merging, by reason category.
    invalid: dict[str, int] = field(default_factory=dict)
    #: Rejected records, by reason category.
    rejected: dict[str, int] = field(default_factory=dict)
    #: Invalid measurements dropped from the table because a valid repeat of the pair exists
    #: (they are listed in the rejects as ``superseded``).
    superseded: int = 0
    #: Rows of the merged table, and how many of them are valid.
    rows: int = 0
    valid_rows: int = 0
    #: Per file whose metadata declares more records than it holds (a truncated file): the
    #: number of declared records that are absent. They were never read, so they are not in
    #: ``records``; the summary prints them so the loss is seen.
    missing: dict[str, int] = field(default_factory=dict)
    #: The fields repeats are merged on (besides the kernel).
    merge_key: tuple[str, ...] = ()

    @property
    def merged(self) -> int:
        """Measurements folded into another row by the median merge."""
        return self.valid + sum(self.invalid.values()) - self.superseded - self.rows

    def as_dict(self) -> dict[str, Any]:
        return {"files": list(self.files), "formats": list(self.formats), "records": self.records,
                "valid": self.valid,
                "invalid": dict(self.invalid), "rejected": dict(self.rejected),
                "superseded": self.superseded, "merged": self.merged, "rows": self.rows,
                "valid_rows": self.valid_rows, "missing": dict(self.missing), "merge_key": list(self.merge_key)}


@dataclass
class IngestResult:
    """What :func:`read_files` returns."""

    #: The canonical table (merged; one row per problem x kernel).
    table: pd.DataFrame
    #: Records that could not be kept, with ``source`` (file:line), ``reason``, ``raw`` text;
    #: also the invalid measurements superseded by a valid repeat (reason ``superseded: ...``).
    rejects: pd.DataFrame
    summary: IngestSummary


def print_summary(summary: IngestSummary, *, out: Path | None = None, rejects: Path | None = None,
                  console: Console | None = None) -> None:
    """Print the summary as a rich table (rows read, valid, invalid and rejected by reason)."""
    console = console or Console()
    table = Table(title=f"ckpred ingest: {len(summary.files)} file(s)", show_header=True)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("records read", str(summary.records))
    table.add_row("valid", str(summary.valid))
    table.add_row("invalid (kept, is_valid=False)", str(sum(summary.invalid.values())))
    for reason, count in sorted(summary.invalid.items(), key=lambda kv: -kv[1]):
        table.add_row(f"  {reason}", str(count))
    table.add_row("rejected", str(sum(summary.rejected.values())))
    for reason, count in sorted(summary.rejected.items(), key=lambda kv: -kv[1]):
        table.add_row(f"  {reason}", str(count))
    table.add_row("superseded by a valid repeat", str(summary.superseded))
    key = ", ".join(summary.merge_key) or "the problem"
    table.add_row(f"merged into repeats (same {key} and kernel)", str(summary.merged))
    table.add_row("table rows (valid)", f"{summary.rows} ({summary.valid_rows})")
    if len(summary.files) <= 10:
        for name, fmt in zip(summary.files, summary.formats):
            console.print(f"read {name} ({fmt})")
    else:
        counts = ", ".join(f"{n} {fmt}" for fmt, n in Counter(summary.formats).items())
        console.print(f"read {len(summary.files)} files ({counts})")
    console.print(table)
    for name, count in summary.missing.items():
        console.print(f"[bold red]{name}: {count} record(s) its metadata declares are absent "
                      f"(num_kernels x num_problems; the file is truncated?)[/]")
    if out is not None:
        console.print(f"table   -> {out}")
    if rejects is not None:
        console.print(f"rejects -> {rejects}")


def nothing_usable_message(result: IngestResult | IngestSummary) -> str:
    summary = result.summary if isinstance(result, IngestResult) else result
    top = sorted({**summary.rejected, **summary.invalid}.items(), key=lambda kv: -kv[1])[:3]
    reasons = "; ".join(f"{k} ({v})" for k, v in top) or "the files hold no measurement"
    return (f"no valid measurement in {', '.join(summary.files)}; {summary.records} record(s) read, "
            f"most common problems: {reasons}")
