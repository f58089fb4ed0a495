"""The stages of ingestion, which :mod:`ckpred.data.ingest` runs in order.

* :mod:`.options`: what a run reads (arch, dtype, layout, format, chunk size...), one object;
* :mod:`.rows`: the rows between the stages (arrow tables of numbers, texts as codes);
* :mod:`.read`: files -> row chunks (readers, the op's input mapping);
* :mod:`.check`: the per-row value checks and the op's rules per problem;
* :mod:`.merge`: hash partitions (held or spilled) and the median merge of repeats;
* :mod:`.write`: canonical parts into Parquet, rejects into CSV.
"""
