"""Small helpers every stage uses: atomic file writes, file hashes, package versions."""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ckpred.errors import OutputPathError


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename.

    A reader never sees a half-written file, and a failure (or ``kill -9``) leaves the old file
    untouched; on an exception the temporary file is removed. A place that cannot be written
    (no such directory, no permission, a directory at ``path``, a full or read-only filesystem)
    raises :class:`ckpred.errors.OutputPathError` naming ``path``.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputPathError(str(path), exc.strerror or str(exc)) from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.errno in _OUTPUT_ERRNOS or exc.filename in (tmp, str(path)):
            raise OutputPathError(str(path), exc.strerror or str(exc)) from None
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: Write errors that are about the output's place, whatever call raised them.
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EISDIR, errno.EACCES})


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (pipelines and exports record it)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def package_versions(packages: tuple[str, ...]) -> dict[str, str]:
    """Python's and each package's installed version ("not installed" when absent), for the
    provenance records of train runs and exports."""
    import platform
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def resolve_path(path: str | Path) -> Path:
    """``path`` as an absolute path, relative ones taken from the current directory.

    Commands run in the directory the user started them in (the CLI undoes Hydra's
    ``hydra.job.chdir``), so a relative path in a config means what the user typed.
    """
    return Path(path).expanduser().absolute()
