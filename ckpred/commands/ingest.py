"""``python -m ckpred ingest``: benchmark output -> canonical parquet + rejects CSV, with the reconciliation."""

from __future__ import annotations

from ckpred.data.ingest import ingest_config_to_parquet, nothing_usable_message, output_paths, print_summary
from ckpred.schema import IngestConfig
from ckpred.util import keep_freed_memory


def ingest_command(cfg: IngestConfig) -> int:
    """``ckpred ingest``: stream the inputs into the canonical parquet ``out`` (a file, or a
    directory of parts) and the rejects CSV, chunk by chunk; print the summary.

    Returns the number of valid table rows. Exits with status 1 (``SystemExit``) only when
    nothing usable was read; the rejects are still written then, to show why, and ``out`` is
    left as it was.
    """
    out, rejects = output_paths(cfg)
    keep_freed_memory()  # each chunk reuses the last one's memory instead of faulting in fresh pages
    summary = ingest_config_to_parquet(cfg, out, rejects)
    if summary.valid_rows == 0:
        print_summary(summary, rejects=rejects)
        raise SystemExit(f"ckpred ingest: error: {nothing_usable_message(summary)}; nothing written to {out}")
    print_summary(summary, out=out, rejects=rejects)
    return summary.valid_rows
