"""What an ingestion run reads: one options object instead of a list of values passed along."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from ckpred.data.mapping import InputMapping
from ckpred.data.readers import READERS, TABLE_READERS
from ckpred.errors import ConfigValueError
from ckpred.kernels.base import OpDefinition

#: Formats ``data.format`` may name.
FORMATS = ("auto", *READERS)
#: Bytes of input read per block by default (``data.chunk_mb`` in the config).
DEFAULT_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class IngestOptions:
    """How files are read into the canonical table of an op.

    Attributes
    ----------
    arch, dtype, layout : str
        What the measurements are. Rows whose kernel name, header or table columns say
        another dtype/layout (or arch/op, for parquet) are rejected, never mixed in.
    fmt : str
        ``auto`` (detect per file from its content) or one of :data:`FORMATS`.
    run_id : str
        Stored in ``run_id``; empty means the file's name.
    mapping : InputMapping or None
        How a table reader's columns become canonical rows (:mod:`ckpred.data.mapping`);
        ``None``: the op's own ``input``/``metric``/``failure`` sections (none for a
        Python-only op, which reads the CK formats only).
    arch_config : object or None
        The arch config (its hardware constants feed rules that read ``hw.<constant>``);
        ``None``: the name ``arch`` only.
    chunk_bytes : int
        Bytes of a file read per chunk.
    vectorised : bool
        ``False`` reads every line with the per-line readers: the reference the block
        readers are tested against (same rows, reasons and rejects).
    """

    arch: str
    dtype: str
    layout: str
    fmt: str = "auto"
    run_id: str = ""
    mapping: InputMapping | None = None
    arch_config: Any = None
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    vectorised: bool = True

    @classmethod
    def of(cls, options: "IngestOptions | None", fields: Mapping[str, Any]) -> "IngestOptions":
        """``options``, or the options made of ``fields`` (keywords of this class), not both."""
        if options is None:
            return cls(**fields)
        if fields:
            raise TypeError(f"options given twice: an IngestOptions and {sorted(fields)}")
        return options

    def for_op(self, op: OpDefinition) -> "IngestOptions":
        """These options with the op's own mapping filled in, checked.

        Raises
        ------
        ckpred.errors.ConfigValueError
            ``fmt`` or the mapping's format is not a known format.
        """
        if self.fmt not in FORMATS:
            raise ConfigValueError("data.format", self.fmt, f"one of {list(FORMATS)}")
        mapping = self.mapping if self.mapping is not None else InputMapping.of_op(op)
        if mapping is not None and mapping.format not in ("auto", *TABLE_READERS, *READERS):
            raise ConfigValueError("op.input.format", mapping.format,
                                   f"'auto' or a registered reader {sorted({*TABLE_READERS, *READERS})}")
        return dataclasses.replace(self, mapping=mapping)

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """(column, the run's value) of the table's header columns."""
        return (("arch", self.arch), ("dtype", self.dtype), ("layout", self.layout))

    @property
    def rules_arch(self) -> Any:
        """What the op's rules read hardware constants from: the arch config, else its name."""
        return self.arch_config if self.arch_config is not None else self.arch
