"""Value checks the config schemas share: seeds, thread counts, output paths, positive numbers."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ckpred.errors import check
from ckpred.util import file_kind, max_threads, resolve_path

DATA_SOURCES: tuple[str, ...] = ("simulated", "path")
DATA_FORMATS: tuple[str, ...] = ("auto", "json", "log", "csv", "parquet")


#: Seeds reach numpy's ``RandomState``, scikit-learn and LightGBM, which take 0 .. 2**32 - 1.
SEED_MAX = 2**32 - 1


def check_threads(key: str, value: int) -> None:
    """Check a thread count: an integer in [1, :func:`max_threads`]."""
    top = max_threads()
    check(key, value, 1 <= value <= top,
          f"an integer in [1, {top}] (this machine's CPUs; 0 / -1 for 'all cores' are not accepted: "
          f"give the count)")


def check_seed(key: str, value: int) -> None:
    """Check a seed: an integer in [0, 2**32 - 1] (what numpy, scikit-learn and LightGBM take)."""
    check(key, value, 0 <= value <= SEED_MAX, f"an integer in [0, {SEED_MAX}]")


def _first_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def check_output_path(key: str, value: str, *, kind: str, required: bool = False) -> None:
    """Refuse an output path that cannot be written before any work starts.

    ``kind`` is ``file`` or ``dir``. Refused: a directory given for a file (or a file for a
    directory), a device, FIFO or socket, a path below an existing file, and a nearest
    existing directory without write permission. An empty value is the command's default
    place (not checked), unless ``required``: then it is refused (an empty path would
    name the working directory). Whether an existing output may be replaced (only what
    ckpred wrote may) is checked by the command before it starts (:func:`ckpred.util.check_replaceable`);
    what only the write itself can tell (a full or read-only filesystem) is refused there, by
    :func:`ckpred.util.atomic_path`.
    """
    if not str(value).strip():
        check(key, value, not required, "a path (an empty one would name the working directory)")
        return
    path = resolve_path(str(value))
    if path.exists():  # (through a symlink: the command refuses a symlink where it replaces the output)
        mode = path.stat().st_mode
        if kind == "file":
            check(key, value, not stat.S_ISDIR(mode), "a file path (this is an existing directory)")
            check(key, value, stat.S_ISREG(mode), f"a regular file path ({path} is {file_kind(mode)})")
        else:
            check(key, value, not stat.S_ISREG(mode), "a directory path (this is an existing file)")
            check(key, value, stat.S_ISDIR(mode), f"a directory path ({path} is {file_kind(mode)})")
            check(key, value, os.access(path, os.W_OK | os.X_OK), f"a writable location ({path} is not writable)")
    parent = _first_existing(path.parent)
    check(key, value, parent.is_dir(), f"a path below a directory ({parent} is {_kind_of(parent)})")
    check(key, value, os.access(parent, os.W_OK | os.X_OK), f"a writable location ({parent} is not writable)")


def _kind_of(path: Path) -> str:
    try:
        return file_kind(path.stat().st_mode)
    except OSError:
        return "not a directory"


def check_positive(prefix: str, obj: object, names: tuple[str, ...], *, allow_zero: bool = False) -> None:
    """Check that each attribute in ``names`` of ``obj`` is > 0 (or >= 0)."""
    for name in names:
        value = getattr(obj, name)
        if allow_zero:
            check(f"{prefix}.{name}", value, value >= 0, "a number >= 0")
        else:
            check(f"{prefix}.{name}", value, value > 0, "a number > 0")
