"""Benchmark data: the canonical table, its readers and the simulator.

:func:`load_table` is what every command calls to get the data of its config.
"""

from __future__ import annotations

from typing import Any

import pandas as pd


def load_table(cfg: Any) -> pd.DataFrame:
    """The canonical table for a composed command config (needs ``data``, ``op``, ``arch``,
    ``dtype``, ``layout``; ``shapes`` for simulated data).

    ``data.source=simulated`` runs (or reads from cache) :mod:`ckpred.data.simulate`;
    ``data.source=path`` reads measurement files through :mod:`ckpred.data.ingest`.
    Rows are filtered to the config's op, arch, dtype and layout; rows of other
    combinations in the input are rejected with a reason shown in the ingest summary, never
    silently mixed, and an input with no valid row at all is an error.
    """
    if cfg.data.source == "simulated":
        from ckpred.data.simulate import simulated_table

        return simulated_table(cfg)
    from ckpred.data.ingest import ingest_for_config

    return ingest_for_config(cfg)
