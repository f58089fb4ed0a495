"""Exceptions ckpred raises on bad input. Each message names where, what, and what is allowed."""

from __future__ import annotations

import difflib
from typing import Any


class CkpredError(Exception):
    """Base class of every error ckpred raises on purpose."""


class ConfigValueError(CkpredError, ValueError):
    """A config key holds a value outside its allowed set."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"config key '{key}' has invalid value {value!r}; allowed: {allowed}")


def check(key: str, value: Any, ok: bool, allowed: str) -> None:
    """Raise :class:`ConfigValueError` naming ``key``, ``value`` and ``allowed`` unless ``ok``."""
    if not ok:
        raise ConfigValueError(key, value, allowed)


class KernelNameError(CkpredError, ValueError):
    """A kernel name does not follow the op's name grammar."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason
        super().__init__(f"kernel name {name!r} does not parse: {reason}")


class InputFileError(CkpredError, OSError):
    """An input file cannot be read at all (missing, unreadable, unknown format)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"cannot read {path}: {reason}")


class MissingFileError(InputFileError, FileNotFoundError):
    """A file a command needs is absent; the reason says what produces it."""


class TableSchemaError(CkpredError, ValueError):
    """A table lacks columns or has values of the wrong type for the canonical schema."""


class ModelMismatchError(CkpredError, ValueError):
    """A model or artifact does not match the arch/dtype/layout/catalogue/features it is used with."""


class UnknownConfigKeyError(ConfigValueError):
    """A key added to a config (``+model.n_estimatorz=5``) that its schema does not declare.

    Hydra's ``+`` adds keys even to a schema-checked node and OmegaConf then sets them as plain
    attributes nobody reads: the run would silently ignore the setting.
    """

    def __init__(self, key: str, value: object, known: list[str]) -> None:
        name = key.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        super().__init__(key, value, f"a key the schema declares{hint}: {known}")
        self.args = (f"config key '{key}' (= {value!r}) is not in the schema{hint}; "
                     f"allowed keys there: {known}",)


class UnusedConfigKeyError(ConfigValueError):
    """A key set on the command line that the selected config does not read (``data.path=x``
    with ``data=simulated``): the run would silently ignore it."""

    def __init__(self, key: str, value: object, reason: str) -> None:
        super().__init__(key, value, reason)
        self.args = (f"config key '{key}' (= {value!r}) is not read: {reason}",)


class OutputPathError(CkpredError, OSError):
    """An output file or directory cannot be written (a directory where a file is expected,
    a file where a directory is expected, no permission, read-only or full filesystem)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"cannot write {path}: {reason}")

    def __str__(self) -> str:
        return f"cannot write {self.path}: {self.reason}"
