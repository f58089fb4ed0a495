"""Small helpers every stage uses: atomic file and directory writes, file hashes, package versions,
value conversions that never raise."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import json
import math
import os
import platform
import re
import shutil
import socket
import stat
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ckpred.errors import ConfigValueError, OutputPathError


# -- what a write may replace ---------------------------------------------------------------------
# A write replaces what is at its path only when the path's kind (OwnFile, OwnDirectory) finds
# nothing to object to (``refusal``): nothing is there, an empty file or directory, or an output
# of that kind ckpred wrote, recognised by its content. Anything else (a user's file or
# directory, a symlink, a device) is refused before any work: nothing ckpred did not write is
# ever deleted or overwritten.

def _lstat(path: Path) -> tuple[os.stat_result | None, str]:
    """``path``'s own status (a symlink not followed), or None with why it may not be replaced:
    ``""`` when nothing is there, the error when it cannot be inspected."""
    try:
        return os.lstat(path), ""
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"cannot inspect it ({exc.strerror})"


@dataclass(frozen=True)
class OwnFile:
    """An output file, recognised as ckpred's by ``recognise`` (its header or metadata)."""

    #: The kind of file, as the errors name it (``a canonical Parquet table``).
    what: str
    recognise: Callable[[Path], bool]

    @property
    def allowed(self) -> str:
        """What may be at the path, for the one-line refusal (``allowed: ...``)."""
        return f"a new file, an empty one, or {self.what} ckpred wrote (a regular file, not a symlink)"

    def refusal(self, path: Path) -> str:
        """Why the existing ``path`` may not be replaced; ``""`` when it may (or nothing is there)."""
        info, why = _lstat(path)
        if info is None:
            return why
        if not stat.S_ISREG(info.st_mode):
            return f"it is {file_kind(info.st_mode)}"
        if info.st_size == 0 or self.recognise(path):
            return ""
        return f"it is a file that is not {self.what} ckpred wrote"


@dataclass(frozen=True)
class OwnDirectory:
    """An output directory written as a whole: the file ``marker`` and regular files whose
    names match ``names``, nothing else."""

    #: The kind of directory, as the errors name it (``a partitioned table ckpred wrote``).
    what: str
    marker: str
    names: re.Pattern[str]
    #: A symlink at the path is followed (the directory it points to is replaced, the link stays).
    follow_symlink: bool = False

    @property
    def allowed(self) -> str:
        """What may be at the path, for the one-line refusal (``allowed: ...``)."""
        link = "" if self.follow_symlink else ", not a symlink"
        return f"a new or empty directory, or {self.what} (only {self.marker} and its files{link})"

    def refusal(self, path: Path) -> str:
        """Why the existing ``path`` may not be replaced; ``""`` when it may (or nothing is there)."""
        info, why = _lstat(path)
        if info is None:
            return why
        if stat.S_ISLNK(info.st_mode):
            if not self.follow_symlink:
                return "it is a symlink"
            try:
                info = os.stat(path)
            except OSError:
                return "it is a dangling symlink"
        if not stat.S_ISDIR(info.st_mode):
            return f"it is {file_kind(info.st_mode)}"
        try:
            entries = list(os.scandir(path))
        except OSError as exc:
            return f"cannot list it ({exc.strerror})"
        if not entries:
            return ""
        if self.marker not in {e.name for e in entries}:
            return f"it holds files and no {self.marker}, so ckpred did not write it"
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                kind = "a symlink" if entry.is_symlink() else file_kind(entry.stat(follow_symlinks=False).st_mode)
                return f"it holds {entry.name!r} ({kind}), which ckpred does not write there"
            if entry.name != self.marker and not self.names.fullmatch(entry.name):
                return f"it holds {entry.name!r}, which ckpred does not write there"
        return ""


#: The file that marks a folder as a command's run folder ckpred made (``{"command": ...}``).
RUN_MARKER = ".ckpred-run.json"
#: The largest marker read (a marker is a few dozen bytes).
_RUN_MARKER_MAX = 1 << 16


@dataclass(frozen=True)
class RunDirectory:
    """A command's run folder (``train out_dir=``, ``tune out_dir=``, ``replay out=``): ckpred writes
    files of fixed names into it (``metrics.json``, ``run.json``, plots...), beside anything else
    there, so it may be only a folder this command made (marked with :data:`RUN_MARKER`), a new
    or empty one, or a folder holding only what Hydra writes for the run (``.hydra/`` and the
    ``<command>.log``)."""

    #: The command whose run folder it is (the marker records it).
    command: str
    #: Recognises this command's run folder written before markers existed (its run record).
    recognise: Callable[[Path], bool] | None = None

    @property
    def allowed(self) -> str:
        """What may be at the path, for the one-line refusal (``allowed: ...``)."""
        return f"a new or empty directory, or a {self.command} run folder ckpred made (it holds {RUN_MARKER})"

    def refusal(self, path: Path) -> str:
        """Why ckpred may not write this command's run into ``path``; ``""`` when it may. A
        symlink to a folder is followed (the files go into the folder it names)."""
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return "it is a dangling symlink" if os.path.islink(path) else ""
        except OSError as exc:
            return f"cannot inspect it ({exc.strerror})"
        if not stat.S_ISDIR(info.st_mode):
            return f"it is {file_kind(info.st_mode)}"
        try:
            names = sorted(e.name for e in os.scandir(path))
        except OSError as exc:
            return f"cannot list it ({exc.strerror})"
        if RUN_MARKER in names:
            command = run_marker_command(path / RUN_MARKER)
            if command == self.command:
                return ""
            if command is None:
                return f"its {RUN_MARKER} is not a marker ckpred wrote"
            return f"it is a {command} run folder (its {RUN_MARKER}), not a {self.command} one"
        hydra_files = {".hydra", f"{self.command}.log"}
        # Hydra's own output for this run, also in a sub-folder (hydra.run.dir=<out_dir>/hydra)
        foreign = [n for n in names if n not in hydra_files and not _holds_only(path / n, hydra_files)]
        if not foreign or (self.recognise is not None and self.recognise(path)):
            return ""
        return f"it holds {foreign[0]!r} and no {RUN_MARKER}, so ckpred did not make it"


def _holds_only(path: Path, names: set[str]) -> bool:
    """Whether ``path`` is a folder (not a symlink) holding nothing but some of ``names``."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and {e.name for e in os.scandir(path)} <= names
    except OSError:
        return False


def run_marker_command(path: Path) -> str | None:
    """The command a run folder's marker names; None when ``path`` is not such a marker (not a
    regular file, too large, not a JSON object naming a command)."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _RUN_MARKER_MAX:
            return None
        marker = json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
    command = marker.get("command") if isinstance(marker, dict) else None
    return command if isinstance(command, str) else None


def claim_run_dir(key: str, value: object, kind: RunDirectory) -> Path:
    """Make ``value`` this command's run folder and return it (absolute), before any work.

    A path that :meth:`RunDirectory.refusal` objects to (a user's folder, ``out_dir=.``, another
    command's run) is refused as :class:`ckpred.errors.ConfigValueError` naming ``key``; nothing
    is created or written then. Otherwise the folder (and its parents) is created and marked
    with :data:`RUN_MARKER`, so a rerun writes into it again. A place that cannot be written
    raises :class:`ckpred.errors.OutputPathError`.
    """
    path = resolve_path(str(value))
    reason = kind.refusal(path)
    if reason:
        raise ConfigValueError(key, str(value), f"{kind.allowed} ({path}: {reason})")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a place the permission check passes and the file system refuses (/proc)
        raise OutputPathError(str(path), exc.strerror or str(exc)) from None
    if run_marker_command(path / RUN_MARKER) != kind.command:
        with atomic_path(path / RUN_MARKER) as tmp:
            created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            tmp.write_text(json.dumps({"command": kind.command, "created": created}) + "\n")
    return path


def max_threads() -> int:
    """Upper bound of every thread count (``model.n_jobs``, ``threads``, the runtime's
    ``threads``): the CPUs this process may run on (its affinity; at least 1).

    More threads than that only spin; 0 and -1 (LightGBM's and OpenMP's "all cores") are refused
    by the config checks, because the thread count changes LightGBM's result bit-wise and a run
    must say it.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def file_kind(mode: int) -> str:
    """``a directory``, ``a character device``... for the file mode ``mode`` (for messages)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISREG, "a file")):
        if test(mode):
            return name
    return "a special file"


#: The kinds of output a write may replace (or, for a run folder, write into).
Replaceable = OwnFile | OwnDirectory | RunDirectory


def check_replaceable(key: str, value: object, kind: Replaceable) -> None:
    """Refuse (:class:`ckpred.errors.ConfigValueError` naming ``key``) an output path ``value``
    that holds something a write of ``kind`` may not replace (its ``refusal``)."""
    path = resolve_path(str(value))
    reason = kind.refusal(path)
    if reason:
        raise ConfigValueError(key, str(value), f"{kind.allowed} ({path}: {reason})")


def _refuse_foreign(path: Path, kind: OwnFile | OwnDirectory | None) -> None:
    reason = kind.refusal(path) if kind is not None else ""
    if kind is not None and reason:
        raise OutputPathError(str(path), f"{reason}; allowed: {kind.allowed}")


# -- atomic writes -------------------------------------------------------------------------------
@contextmanager
def atomic_path(path: str | Path, replaces: OwnFile | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename.

    A reader never sees a half-written file, and a failure (or ``kill -9``) leaves the old file
    untouched; on an exception the temporary file is removed (a killed writer's by the next
    write into the same parent, :func:`clean_stale_temps`). With ``replaces``, an existing
    ``path`` that is not an output of that kind is refused before anything is written
    (:meth:`OwnFile.refusal`). The file gets the mode a new file gets (0666 less the umask),
    not the private mode of a temporary file. A place that cannot be written (no such
    directory, no permission, a directory at ``path``, a full or read-only filesystem) raises
    :class:`ckpred.errors.OutputPathError` naming ``path``.
    """
    path = Path(path)
    _refuse_foreign(path, replaces)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path, "tmp"), dir=path.parent)
        os.fchmod(fd, 0o666 & ~_umask())
    except OSError as exc:
        raise OutputPathError(str(path), exc.strerror or str(exc)) from None
    os.close(fd)
    try:
        yield Path(tmp)
        _refuse_foreign(path, replaces)  # the same check at the rename: the path may have changed meanwhile
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OutputPathError):
            raise
        if exc.errno in _OUTPUT_ERRNOS or exc.filename in (tmp, str(path)):
            raise OutputPathError(str(path), exc.strerror or str(exc)) from None
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask: from ``/proc/self/status`` on Linux, else by setting it and setting
    it back (which another thread creating a file meanwhile could see)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: Write errors that are about the output's place, whatever call raised them.
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EISDIR, errno.EACCES})


@contextmanager
def atomic_dir(path: str | Path, replaces: OwnDirectory) -> Iterator[Path]:
    """Yield a temporary sibling directory of ``path``; on success it replaces ``path`` at once.

    An existing ``path`` is replaced only when it is empty or a directory of the kind
    ``replaces`` (:meth:`OwnDirectory.refusal`): anything else is refused before anything is
    written, and checked again just before the swap. The caller writes the whole directory
    into the yielded one; when the block ends without error it is swapped in with one rename
    (``renameat2(RENAME_EXCHANGE)`` where the filesystem has it, else two renames) and the
    previous directory is removed. A reader sees the old or the new set of files, never a
    mix; an exception (or ``kill -9``) leaves the previous directory untouched and the
    temporary one is removed (a killed writer's by the next write into the same parent,
    :func:`clean_stale_temps`). A symlink ``path`` is refused, or followed when ``replaces``
    says so (the directory it points to is replaced and the link stays). A place that cannot
    be written raises :class:`ckpred.errors.OutputPathError` naming ``path``.
    """
    path = Path(path)
    _refuse_foreign(path, replaces)
    if path.is_symlink():
        path = path.resolve()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(path.parent)
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path, "tmp"), dir=path.parent))
    except OSError as exc:
        raise OutputPathError(str(path), exc.strerror or str(exc)) from None
    swapping = False
    try:
        yield tmp
        swapping = True
        os.chmod(tmp, 0o777 & ~_umask())
        _refuse_foreign(path, replaces)
        previous = _swap_in(tmp, path)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OutputPathError):
            raise
        if swapping or exc.errno in _OUTPUT_ERRNOS or str(exc.filename or "").startswith(str(tmp)):
            raise OutputPathError(str(path), exc.strerror or str(exc)) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)


@contextmanager
def temporary_dir(parent: str | Path, name: str) -> Iterator[Path]:
    """A private working directory in ``parent``, removed at the end, also on error.

    Named like the temporaries of :func:`atomic_dir` (``.<name>.tmp-<host>-<pid>-<random>``),
    so the next write into ``parent`` removes it when this process was killed.
    """
    parent = Path(parent)
    clean_stale_temps(parent)
    path = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-{socket.gethostname()}-{os.getpid()}-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False when unsupported here."""
    libname = ctypes.util.find_library("c")
    if not libname:
        return False
    libc = ctypes.CDLL(libname, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (38, 22, 95):  # ENOSYS, EINVAL, EOPNOTSUPP: fall back to two renames
        return False
    raise OSError(err, os.strerror(err), f"{a} <-> {b}")


#: glibc's ``mallopt`` parameters (``malloc.h``).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(limit_bytes: int = 1 << 28) -> bool:
    """Ask glibc to keep freed blocks of up to ``limit_bytes`` in the heap for reuse.

    Chunked work allocates and frees chunk-sized arrays over and over. By default glibc maps
    each large one afresh and unmaps it on free, so every page of the next chunk's arrays
    faults in zeroed again, which is system time. Kept in the heap, the pages are reused.
    Memory still follows the largest chunk, not the input. The setting holds for the rest of
    the process. Returns False (nothing done) where the C library has no ``mallopt``.
    """
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(limit_bytes))) and bool(mallopt(_M_TRIM_THRESHOLD, 2 * int(limit_bytes)))


#: Attempts of :func:`_swap_in` when concurrent writers keep replacing ``out_dir`` under it.
_SWAP_ATTEMPTS = 100
#: ``.<directory name>.<tmp|old>-<host>-<pid>-<random>``: the writer of a temporary directory.
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<host>.+)-(?P<pid>\d+)-[A-Za-z0-9_]+$")
#: Temporaries of older versions, without host and pid: a directory's, ingestion's spill directory.
_LEGACY_TEMP = re.compile(r"^\.(.+)\.(tmp|old)-[A-Za-z0-9_]+$")
_LEGACY_SPILL = re.compile(r"^\.ckpred-ingest-[A-Za-z0-9_]{8}$")
#: Temporary directories of writers older than this module (no host/pid in the name) are
#: removed once they are this old: no write takes that long.
_UNNAMED_STALE_S = 24 * 3600


def _temp_prefix(out_dir: Path, kind: str) -> str:
    return f".{out_dir.name}.{kind}-{socket.gethostname()}-{os.getpid()}-"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def clean_stale_temps(parent: Path) -> list[Path]:
    """Remove the temporaries killed writers left in ``parent``; returns them.

    Only temporaries named by this module (``.<name>.<tmp|old>-<host>-<pid>-<random>``:
    directories of :func:`atomic_dir` and :func:`temporary_dir`, files of
    :func:`atomic_path`) of writers on this host whose process no longer exists are touched,
    so a concurrent writer's temporary is never removed. A ``.old-`` directory of a writer
    killed between its two renames holds the only copy of the previous directory when the
    directory itself is missing: it is renamed back into place instead of removed. Unnamed
    temporary directories of older versions (``.<name>.tmp-<random>``, ``.ckpred-ingest-<random>``)
    are removed once they are a day old.
    """
    removed: list[Path] = []
    host = socket.gethostname()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith("."):
            continue
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            is_file = entry.is_file(follow_symlinks=False)
        except OSError:
            continue
        match = _TEMP_NAME.match(entry.name)
        path = Path(entry.path)
        if match is None:
            legacy = is_dir and (_LEGACY_TEMP.match(entry.name) or _LEGACY_SPILL.match(entry.name))
            try:
                stale = bool(legacy) and time.time() - entry.stat(follow_symlinks=False).st_mtime > _UNNAMED_STALE_S
            except OSError:
                stale = False
            if not stale:
                continue
        elif not (is_dir or (is_file and match["kind"] == "tmp")):
            continue
        elif match["host"] != host or _process_alive(int(match["pid"])):
            continue
        elif match["kind"] == "old" and not (parent / match["name"]).exists():
            try:
                os.rename(path, parent / match["name"])
                continue
            except OSError:
                pass  # a concurrent writer put a new directory there meanwhile
        if is_dir:
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _swap_in(tmp: Path, out_dir: Path) -> Path | None:
    """Move the complete directory ``tmp`` to ``out_dir``; returns the directory now holding the
    previous directory (for the caller to remove), or None when there was none.

    No existence check precedes a rename: between a check and the rename a concurrent writer
    may put its directory at ``out_dir``. Each step instead handles what it finds and starts over
    when another writer moved ``out_dir`` meanwhile.
    """
    for _ in range(_SWAP_ATTEMPTS):
        try:
            os.rename(tmp, out_dir)  # no directory there yet (or an empty directory)
            return None
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        try:
            if _exchange(tmp, out_dir):
                return tmp  # tmp now holds the previous directory
        except FileNotFoundError:
            continue  # out_dir was moved away by a concurrent two-rename swap: start over
        old = Path(tempfile.mkdtemp(prefix=_temp_prefix(out_dir, "old"), dir=out_dir.parent))
        old.rmdir()
        try:
            os.rename(out_dir, old)
        except FileNotFoundError:
            continue
        try:
            os.rename(tmp, out_dir)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                os.rename(old, out_dir)  # put the previous directory back
                raise
            shutil.rmtree(old, ignore_errors=True)  # a concurrent writer's directory landed first
            continue
        return old
    raise OSError(errno.EBUSY, f"{out_dir} kept changing under {_SWAP_ATTEMPTS} attempts to swap in {tmp}")


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
    from importlib import metadata  # lazy: importlib.metadata costs ~0.1 s, only provenance records need it

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
    ``hydra.job.chdir``), so a relative path in a config means what the user typed. ``~`` and
    ``~user`` are expanded as a shell does: ``~name`` of no known user stays the path's own text
    (``Path.expanduser`` raises ``RuntimeError`` there).
    """
    return Path(os.path.expanduser(path)).absolute()


# -- values ------------------------------------------------------------------------------------
#: Largest magnitude kept for an integer field (int64 range).
INT_LIMIT = 2**63 - 1


def to_float(value: object) -> float | None:
    """``value`` as a float (NaN/inf pass through for later checks); ``None`` if not a number."""
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    return None


#: Strings read as true / false in a validity column or flag (compared lower-cased and stripped).
TRUE_STRINGS = ("true", "1", "yes")
FALSE_STRINGS = ("false", "0", "no")


def truth(value: object, true_values: tuple[str, ...] = TRUE_STRINGS,
          false_values: tuple[str, ...] = FALSE_STRINGS) -> bool | None:
    """``value`` as a truth value: ``True``/``False`` for a listed string (or a bool, or the
    numbers 1/0), ``None`` for anything else (the caller names it as a bad value)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        text = "1" if value == 1 else "0" if value == 0 else str(value)
    elif isinstance(value, str):
        text = value
    else:
        return None
    text = text.strip().lower()
    if text in true_values:
        return True
    if text in false_values:
        return False
    return None


def to_int(value: object) -> int | None:
    """``value`` as an integer when it is one exactly (``"1024"``, ``1024.0``); else ``None``."""
    if type(value) is int:
        return value if abs(value) <= INT_LIMIT else None
    number = to_float(value)
    if number is None or not math.isfinite(number) or number != int(number) or abs(number) > INT_LIMIT:
        if isinstance(value, str):
            try:  # big exact integers written as text
                parsed = int(value.strip())
                return parsed if abs(parsed) <= INT_LIMIT else None
            except ValueError:
                return None
        return None
    return int(number)
