"""Which Python modules ckpred may import because a config or a model names them.

An op YAML (``plugin: package.module:Class``), a feature group (``kind: package.module:Class``)
and an export's manifest (its op config's ``plugin``) name classes. Importing a module runs its
code, and configs and exports are data: a config copied from elsewhere, or a forged export
whose hashes were recomputed, must not run code. So ckpred imports a named module only when
the user installed and allowed it:

* ckpred's own modules (``ckpred.*``), which ship the packaged plug-ins (they are also
  registered below);
* modules an installed package registers in the entry-point group :data:`ENTRY_POINT_GROUP`
  (``[project.entry-points."ckpred.plugins"]`` ``myop = "mypkg.ops:MyOp"`` in its
  ``pyproject.toml``): installing the package is the user's consent;
* modules the user allows explicitly: the environment variable :data:`ENV_VAR`
  (``CKPRED_ALLOW_PLUGINS=mymod,other.pkg``, for the command line), or :func:`allowed_plugins`
  around a call (``KernelSelector.load(..., allow_plugins=["mymod"])`` uses it).

Allowing a package allows its submodules. Any other name is refused before anything is
imported (not even looked up: finding a submodule imports its parent package), with a
one-line error naming the module and how to allow it.
"""

from __future__ import annotations

import importlib
import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterable, Iterator

from ckpred.errors import ConfigValueError

#: The entry-point group installed packages register their plug-in classes in.
ENTRY_POINT_GROUP = "ckpred.plugins"
#: Environment variable listing further allowed modules (comma-separated).
ENV_VAR = "CKPRED_ALLOW_PLUGINS"

#: A dotted module name (no relative names, no paths).
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: Modules allowed by :func:`allowed_plugins` in the current context.
_ALLOWED: ContextVar[tuple[str, ...]] = ContextVar("ckpred_allowed_plugins", default=())


@contextmanager
def allowed_plugins(modules: Iterable[str]) -> Iterator[None]:
    """Allow importing ``modules`` (and their submodules) inside the ``with`` block.

    Raises
    ------
    ckpred.errors.ConfigValueError
        When an entry is not a dotted module name (``allow_plugins``).
    """
    names = tuple(modules) if not isinstance(modules, str) else (modules,)
    for name in names:
        if not isinstance(name, str) or not _MODULE.fullmatch(name):
            raise ConfigValueError("allow_plugins", name, "dotted module names such as 'mypkg.ops'")
    token = _ALLOWED.set(_ALLOWED.get() + names)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def registered_modules() -> set[str]:
    """Modules of the classes installed packages register in :data:`ENTRY_POINT_GROUP` (read
    from the packages' metadata; nothing is imported)."""
    from importlib.metadata import entry_points  # lazy: importlib.metadata costs ~0.1 s, only listing plug-ins needs it

    return {ep.value.partition(":")[0].strip() for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _env_modules() -> set[str]:
    return {m.strip() for m in os.environ.get(ENV_VAR, "").split(",") if m.strip()}


def is_allowed(module: str) -> bool:
    """Whether ckpred may import ``module`` (see the module docstring)."""
    if not _MODULE.fullmatch(module) or module.split(".")[-1] == "__main__":
        return False
    allowed = {"ckpred", *registered_modules(), *_env_modules(), *_ALLOWED.get()}
    parts = module.split(".")
    return any(".".join(parts[:i]) in allowed for i in range(1, len(parts) + 1))


def check_allowed(spec: str, key: str, what: str) -> tuple[str, str]:
    """(module, name) of ``package.module:Name``, refused unless the module is allowed
    (:func:`is_allowed`); nothing is imported.

    Raises
    ------
    ckpred.errors.ConfigValueError
        When ``spec`` is not ``package.module:Name`` or names a module that is not allowed.
    """
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not _MODULE.fullmatch(module_name) or not attr.isidentifier():
        raise ConfigValueError(key, spec, f"'package.module:Class' ({what})")
    if not is_allowed(module_name):
        top = module_name.split(".")[0]
        raise ConfigValueError(key, spec, f"{what} in a module ckpred may import; {module_name!r} is not one, so it "
                                          f"was not imported. Allowed: ckpred's own modules, modules an installed "
                                          f"package registers in the entry-point group {ENTRY_POINT_GROUP!r}, and "
                                          f"modules you allow ({ENV_VAR}={top} on the command line, "
                                          f"allow_plugins=[{top!r}] in Python)")
    return module_name, attr


def import_named(spec: str, key: str, what: str) -> Any:
    """The object ``package.module:Name`` names, imported only when the module is allowed.

    ``key`` is the config key that named it (``op.plugin``), ``what`` what it must be (for the
    error). Returns ``None`` when the module has no such name (the caller checks the type).

    Raises
    ------
    ckpred.errors.ConfigValueError
        When ``spec`` is not ``package.module:Name``, names a module that is not allowed
        (nothing is imported then), or a module that does not import.
    """
    module_name, attr = check_allowed(spec, key, what)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigValueError(key, spec, f"an importable module ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - any error the module raises while it is imported
        raise ConfigValueError(key, spec, f"a module that imports without error (importing {module_name} raised "
                                          f"{type(exc).__name__}: {exc})") from None
    return getattr(module, attr, None)
