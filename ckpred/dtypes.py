"""Element types as the dtype configs (``dtype/*.yaml`` of the config dirs) define them.

The dtype configs are the one place that says how many bytes an element of each type takes,
which type C is stored in and how tables may spell it (``aliases``). A composed ``cfg.dtype``
carries that for A and B; code that holds only a dtype *name* (the C type ``c_dtype``, a
catalogue built from a name, ``dtype_bytes(x)`` in an expression) reads the same files here,
through the vocabulary in use (:mod:`ckpred.vocab`: the package's configs and a user's).
"""

from __future__ import annotations

from ckpred import vocab
from ckpred.schema import DtypeConfig


def dtype_configs() -> dict[str, DtypeConfig]:
    """Every dtype config in use by name, each checked as a :class:`~ckpred.schema.DtypeConfig`."""
    return {name: load_dtype(name) for name in sorted(vocab.current().dtypes)}


def load_dtype(name: str) -> DtypeConfig:
    """The dtype config ``dtype/<name>.yaml`` (or the one ``name`` is an alias of).

    Raises
    ------
    ckpred.errors.ConfigValueError
        When no dtype config has that name or alias.
    """
    d = vocab.current().dtype(name)
    return DtypeConfig(name=d.name, bytes_per_element=_number(d.bytes_per_element), accumulator=d.accumulator,
                       c_dtype=d.c_dtype, aliases=list(d.aliases))


def _number(value: float) -> float:
    """``value`` as an int when it is whole (1, 2, 4 bytes), else as is (0.5)."""
    return int(value) if float(value).is_integer() else float(value)


def bytes_per_element(dtype: str | DtypeConfig) -> float:
    """Bytes of one element of ``dtype``: a dtype config (its ``bytes_per_element``) or a name
    (an int for whole bytes, a fraction for a packed type)."""
    if isinstance(dtype, str):
        return _number(vocab.current().dtype(dtype).bytes_per_element)
    return _number(dtype.bytes_per_element)


def c_bytes_per_element(dtype: str | DtypeConfig) -> float:
    """Bytes of one element of C for A/B of type ``dtype`` (a dtype config or a name): the size
    of its ``c_dtype`` (fp8 and bf8 kernels write fp16)."""
    c_dtype = vocab.current().dtype(dtype).c_dtype if isinstance(dtype, str) else str(dtype.c_dtype)
    return _number(vocab.current().dtype(c_dtype, "dtype.c_dtype").bytes_per_element)
