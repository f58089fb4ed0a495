"""Plain data <-> the schema's dataclasses, for the engine: the one place outside the command
layer that reads through OmegaConf.

A config the engine reads from a file (a packaged op or feature group) or gets as plain data is
checked here as its dataclass, as composing it would check it; the engine itself never holds
an OmegaConf node. This module imports no schema (the feature registry, which the schema
imports, reads its YAML files here).
"""

from __future__ import annotations

from typing import Any, Mapping, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from ckpred.errors import ConfigValueError

T = TypeVar("T")


def from_mapping(cls: type[T], raw: Mapping[str, Any], missing_prefix: str | None = None) -> T:
    """``raw`` (a mapping of the keys of ``cls``) checked as a ``cls`` dataclass: merged over the
    schema's defaults (OmegaConf converts each value to its key's type) and built, so its
    ``__post_init__`` checks run.

    With ``missing_prefix``, a mandatory key ``raw`` does not give is refused as
    :class:`~ckpred.errors.ConfigValueError` naming ``<missing_prefix><key>``.
    """
    node = OmegaConf.merge(OmegaConf.structured(cls), raw)
    try:
        out: T = OmegaConf.to_object(node)  # type: ignore[assignment]
    except MissingMandatoryValue as exc:
        if missing_prefix is None:
            raise
        raise ConfigValueError(f"{missing_prefix}{exc.full_key}", "???", "a value: the key is mandatory") from None
    return out


def to_plain(obj: object) -> Any:
    """A schema dataclass as plain data (dicts and lists), as the structured config holds it."""
    return OmegaConf.to_container(OmegaConf.structured(obj))


def yaml_mapping(text: str) -> dict[str, Any]:
    """The YAML config ``text`` as a plain mapping, its interpolations resolved."""
    raw = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    if not isinstance(raw, dict):
        raise TypeError(f"a config file holds a mapping, not {type(raw).__name__}")
    return {str(k): v for k, v in raw.items()}
