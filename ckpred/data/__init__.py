"""Benchmark data: the canonical table, its readers and the simulator.

:func:`load_table` is what every command calls to get the data of its config.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ckpred.kernels.base import OpDefinition, load_op
from ckpred.schema import RecipeConfig



def load_table(cfg: RecipeConfig) -> pd.DataFrame:
    """The canonical table for a composed command config (needs ``data``, ``op``, ``arch``,
    ``dtype``, ``layout``; ``shapes`` for simulated data).

    ``data.source=simulated`` runs (or reads from cache) :mod:`ckpred.data.simulate`;
    ``data.source=path`` reads measurement files through :mod:`ckpred.data.ingest`.
    Rows are filtered to the config's op, arch, dtype and layout; rows of other
    combinations in the input are rejected with a reason shown in the ingest summary, never
    silently mixed, and an input with no valid row at all is an error.

    The rows come in canonical order (:func:`canonical_order`), so every consumer breaks
    score ties the way the exported selector does.
    """
    if cfg.data.source == "simulated":
        # lazy: ckpred.data is imported for its submodules; the simulator (~0.02 s) is for this branch only
        from ckpred.data.simulate import simulated_table

        table = simulated_table(cfg)
    else:
        # lazy: the readers of ckpred.data.ingest cost ~0.1 s over this package (which is imported
        # for its submodules); only data.source=path needs them
        from ckpred.data.ingest import ingest_for_config

        table = ingest_for_config(cfg)
    return canonical_order(table, load_op(cfg.op), cfg)


def canonical_order(table: pd.DataFrame, op: OpDefinition, cfg: RecipeConfig) -> pd.DataFrame:
    """Rows grouped by shape (in order of first appearance), kernels in catalogue-id order.

    Evaluation breaks ties in predicted score by row order and the exported selector's TopK
    by catalogue id; putting the rows in catalogue order makes the two agree, whatever order
    the benchmark files listed the kernels in. Kernels outside the catalogue (or ops without
    one for this arch/dtype/layout) keep their file order after the catalogued ones.
    """
    if len(table) == 0:
        return table
    try:
        from_table: Any = getattr(op, "catalogue_from_table", None)
        if getattr(op, "catalogue_from_data", False):
            # a data catalogue is sorted by field values: any table's own kernels keep that order
            catalogue = from_table(table, dtype=cfg.dtype, layout=cfg.layout)
        else:
            catalogue = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
        kernel_rank = dict(zip(catalogue["kernel_name"], catalogue["kernel_id"]))
    except ValueError:
        kernel_rank = {}
    shape_rank = pd.factorize(op.shape_keys(table))[0]
    kernel_ids = table["kernel_name"].map(kernel_rank).fillna(np.iinfo(np.int64).max).to_numpy()
    order = np.lexsort((np.arange(len(table)), kernel_ids, shape_rank))
    if np.array_equal(order, np.arange(len(table))):
        return table.reset_index(drop=True)
    return table.iloc[order].reset_index(drop=True)
