"""Element types as the dtype configs (``conf/dtype/*.yaml``) define them.

The dtype configs are the one place that says how many bytes an element of each type takes and
which type C is stored in. A composed ``cfg.dtype`` carries that for A and B; code that holds
only a dtype *name* (the C type ``c_dtype``, a catalogue built from a name, ``dtype_bytes(x)`` in
an expression) reads the same YAML here, through the package data ``ckpred.conf`` and without
Hydra.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from omegaconf import OmegaConf

from ckpred.errors import ConfigValueError
from ckpred.schema import DtypeConfig


@cache
def dtype_configs() -> dict[str, DtypeConfig]:
    """Every packaged dtype config by name, each checked as a :class:`~ckpred.schema.DtypeConfig`."""
    configs: dict[str, DtypeConfig] = {}
    folder = resources.files("ckpred.conf") / "dtype"
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            fields = OmegaConf.to_container(OmegaConf.create(entry.read_text()))
            assert isinstance(fields, dict)
            fields.pop("defaults", None)
            config = DtypeConfig(**fields)
            configs[config.name] = config
    return configs


def load_dtype(name: str) -> DtypeConfig:
    """The packaged dtype config ``conf/dtype/<name>.yaml``.

    Raises
    ------
    ckpred.errors.ConfigValueError
        When no dtype config has that name.
    """
    configs = dtype_configs()
    if name not in configs:
        raise ConfigValueError("dtype", name, f"one of {sorted(configs)}")
    return configs[name]


def bytes_per_element(dtype: str | DtypeConfig) -> int:
    """Bytes of one element of ``dtype``: a dtype config (its ``bytes_per_element``) or a name."""
    if isinstance(dtype, str):
        return load_dtype(dtype).bytes_per_element
    return int(dtype.bytes_per_element)


def c_bytes_per_element(dtype: str | DtypeConfig) -> int:
    """Bytes of one element of C for A/B of type ``dtype`` (a dtype config or a name): the size
    of its ``c_dtype`` (fp8 and bf8 kernels write fp16)."""
    c_dtype = load_dtype(dtype).c_dtype if isinstance(dtype, str) else str(dtype.c_dtype)
    return load_dtype(c_dtype).bytes_per_element
