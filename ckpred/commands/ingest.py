"""``python -m ckpred ingest``: benchmark output -> canonical parquet + rejects CSV, with the reconciliation."""

from __future__ import annotations

from typing import Any

from ckpred.data.ingest import nothing_usable_message, output_paths, print_summary, read_config_inputs, write_rejects
from ckpred.data.table import write_table


def ingest_command(cfg: Any) -> int:
    """``ckpred ingest``: write the canonical parquet ``out`` and the rejects CSV, print the summary.

    Returns the number of valid table rows. Exits with status 1 (``SystemExit``) only when
    nothing usable was read; the rejects are still written then, to show why.
    """
    out, rejects = output_paths(cfg)
    op, result = read_config_inputs(cfg)
    write_rejects(result.rejects, rejects)
    if result.summary.valid_rows == 0:
        print_summary(result.summary, rejects=rejects)
        raise SystemExit(f"ckpred ingest: error: {nothing_usable_message(result)}; nothing written to {out}")
    write_table(result.table, out, op)
    print_summary(result.summary, out=out, rejects=rejects)
    return result.summary.valid_rows
