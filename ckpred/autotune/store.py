"""The persistent store of measured winners (format ``ckpred.autotune/1``).

A UTF-8 text file of JSON objects, one per line (JSON lines), append-only. Each line::

    {"format": "ckpred.autotune/1", "model": "<sha256 of the selector graph>",
     "op": "grouped_conv_fwd", "problem": "n=1,c=256,...", "kernel_id": 3,
     "kernel": "<name>", "seconds": 1.2e-05, "policy": "fixed(k=2)",
     "measured": [{"kernel_id": 3, "kernel": "<name>", "seconds": 1.2e-05},
                  {"kernel_id": 7, "kernel": "<name>", "error": "RuntimeError: ..."}],
     "created": "2026-11-25T08:40:00Z", "writer": "python"}

* The key is ``(model, op, problem)``; ``problem`` is ``field=value`` pairs joined by commas in
  the manifest's problem-field order (defaults filled in). The last line of a key wins.
* ``model`` is the sha256 of the selector graph recorded in the manifest; entries of any other
  model (a re-trained or re-exported one) are ignored on lookup, so a stale model's winners are
  never served.
* Writers hold an exclusive ``flock`` on ``<store>.lock`` while appending; a line is written
  with one ``write`` call. Neither the store nor its lock is ever opened through a symbolic
  link, and only a regular file is read or written.
* Readers read complete lines only (at most :data:`MAX_LINE_BYTES` each, nested at most
  :data:`MAX_LINE_DEPTH` deep) and skip a line that does not parse or whose fields have the
  wrong types (logged, counted in :attr:`ResultStore.skipped_lines`); :func:`~ckpred.autotune.autotune` serves a
  stored kernel only when its id is in the model's catalogue under that name.
* Bounded: when the file holds more than twice ``max_entries`` lines, the writer compacts it
  under the lock (last line per key, the newest ``max_entries`` keys, kept verbatim) into a
  temporary file (``.<store>.tmp-<host>-<pid>-<random>``, created exclusively) that replaces
  the store atomically (``rename``); compaction files of writers that died are removed.

The C++ header ``scripts/cpp/ckpred_autotune.hpp`` reads and writes the same file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import re
import secrets
import socket
import stat
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ckpred.autotune.checks import AutotuneError, _count, _real, _short

log = logging.getLogger(__name__)

#: Format tag of every store line.
STORE_FORMAT = "ckpred.autotune/1"
#: Longest store line read (bytes). A line of 16 measurements is a few kB; a longer one is
#: skipped unparsed, and so is one nested deeper than MAX_LINE_DEPTH (the format nests 3 deep),
#: so a hostile line costs neither memory nor recursion.
MAX_LINE_BYTES = 1 << 20
MAX_LINE_DEPTH = 8
_READ_BLOCK = 1 << 20
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(rb"[\[\]{}]")
#: A compaction file older than this is removed by the next compaction even when its writer's
#: host or pid cannot be checked (a writer on another host of a shared file system).
STALE_TEMP_S = 3600.0


def problem_key(problem: Mapping[str, Any], fields: Sequence[str] | None = None) -> str:
    """``field=value`` pairs joined by commas, in ``fields`` order (default: the mapping's)."""
    names = list(fields) if fields is not None else list(problem)
    return ",".join(f"{name}={int(problem[name])}" for name in names)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link (a store is never used through one)"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _too_deep(raw: bytes) -> bool:
    """True when a line nests arrays/objects deeper than MAX_LINE_DEPTH (strings do not count)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_LINE_DEPTH:
        return False
    depth = 0
    for m in _BRACKET.finditer(_STRING.sub(b'""', raw)):
        depth += 1 if m.group() in (b"[", b"{") else -1
        if depth > MAX_LINE_DEPTH:
            return True
    return False


def check_entry(entry: object) -> str:
    """What is wrong with one parsed store line ("" when it is a well-formed entry): the format
    tag; model, op, problem and kernel non-empty strings; kernel_id an integer >= 0; seconds a
    finite number > 0. Whether it belongs to a model (its kernel) is checked when it is served."""
    if not isinstance(entry, dict):
        return f"a JSON {type(entry).__name__}, not an object"
    if entry.get("format") != STORE_FORMAT:
        return f"format {_short(entry.get('format'))}, expected {STORE_FORMAT!r}"
    for key in ("model", "op", "problem", "kernel"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            return f"{key} is {_short(entry.get(key, '<missing>'))}; expected a non-empty string"
    kid = entry.get("kernel_id")
    if isinstance(kid, bool) or not isinstance(kid, int) or not 0 <= kid < 2**63:
        return f"kernel_id is {_short(kid)}; expected an integer >= 0"
    seconds = _real(entry.get("seconds"))
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return f"seconds is {_short(entry.get('seconds'))}; expected a finite number > 0"
    return ""


@dataclass
class _Cursor:
    offset: int = 0  # first byte not consumed (lines before it were read)
    long: bool = False  # inside a line longer than MAX_LINE_BYTES: its bytes are dropped


def _complete_lines(fd: int, size: int, cur: _Cursor) -> Iterator[bytes | None]:
    """The complete lines of ``fd`` from ``cur.offset`` to ``size``, read in bounded blocks
    (None for a line longer than MAX_LINE_BYTES, never held whole); ``cur`` advances past them.
    An incomplete last line (a writer mid-line) is read next time."""
    pos, carry = cur.offset, b""
    while pos < size:
        block = os.pread(fd, min(_READ_BLOCK, size - pos), pos)
        if not block:
            return
        pos += len(block)
        if cur.long:
            nl = block.find(b"\n")
            if nl < 0:
                cur.offset += len(block)
                continue
            cur.offset += nl + 1
            cur.long = False
            block = block[nl + 1:]
            yield None
        data = carry + block
        end = data.rfind(b"\n") + 1
        lines = data[:end].split(b"\n")
        lines.pop()
        cur.offset += end
        carry = data[end:]
        yield from lines
        if len(carry) > MAX_LINE_BYTES:
            cur.offset += len(carry)
            carry = b""
            cur.long = True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it runs under another user
        return True
    return True


class ResultStore:
    """The persistent, process-safe, bounded store of measured winners (format in the module doc).

    The store is a regular file, never used through a symbolic link; reading never blocks on a
    FIFO and holds at most :data:`MAX_LINE_BYTES` of one line. Lines that do not parse, nest
    deeper than :data:`MAX_LINE_DEPTH` or fail :func:`check_entry` are skipped with a warning and
    counted in :attr:`skipped_lines`; lines of models nobody asked for are not parsed at all.
    Every I/O failure is an :class:`AutotuneError` naming the path (:meth:`check` finds most of
    them before anything is measured).

    Parameters
    ----------
    path : path
        The JSON-lines file (created on first write, its directory too; ``~`` is expanded).
    max_entries : int, default=10000
        Keys kept by compaction (newest first).
    """

    def __init__(self, path: str | os.PathLike[str], *, max_entries: int = 10000) -> None:
        if not isinstance(path, (str, os.PathLike)) or not str(os.fspath(path)).strip():
            raise AutotuneError(f"ResultStore.path={path!r}; allowed: a file path")
        self.max_entries = _count("ResultStore.max_entries", max_entries)
        self.path = Path(os.path.expanduser(path))  # ~name of no known user stays as written
        #: Lines of the file as last read that were skipped (malformed, too long or too deep).
        self.skipped_lines = 0
        self._models: set[str] | None = set()  # models whose lines are indexed (None: every model)
        self._cleaned = False
        self._reset()

    def _reset(self) -> None:
        self._index: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._lines = 0
        self._cursor = _Cursor()
        self._ino: tuple[int, int] | None = None
        self.skipped_lines = 0

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    # -- opening, never through a link, never blocking ------------------------------------------
    def _refusal(self, path: Path, what: str, doing: str, exc: OSError | None = None) -> AutotuneError:
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            return AutotuneError(f"{what} {path}: {_kind(st.st_mode)}; allowed: a regular file (or a path that does "
                                 "not exist yet)")
        reason = (exc.strerror or str(exc)) if exc is not None else "not a regular file"
        return AutotuneError(f"cannot {doing} {what} {path}: {reason}")

    def _open(self, path: Path, what: str, flags: int, doing: str) -> int | None:
        """``path`` opened with ``flags`` (no symlink followed, no FIFO waited on), checked to be a
        regular file; None when it does not exist (and ``flags`` does not create it)."""
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            if flags & os.O_CREAT:
                raise AutotuneError(f"cannot {doing} {what} {path}: its directory does not exist") from None
            return None
        except OSError as exc:
            raise self._refusal(path, what, doing, exc) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise self._refusal(path, what, doing)
        return fd

    def check(self) -> None:
        """Refuse a store this process cannot append to, before anything is measured: a directory,
        FIFO or device, a symbolic link, a read-only file, a lock path that is not a file, a
        directory that is not writable (or cannot be made). What only a write can tell (a full
        disk) is reported by :meth:`put`.

        Raises
        ------
        AutotuneError
            Naming the path and why.
        """
        for path, what, flags in ((self.path, "store", os.O_WRONLY | os.O_APPEND), (self.lock_path, "store lock",
                                                                                   os.O_RDWR)):
            try:
                os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):  # the directory check below names it
                continue
            except OSError as exc:
                raise self._refusal(path, what, "use", exc) from exc
            fd = self._open(path, what, flags, "append to" if what == "store" else "open")
            if fd is not None:
                os.close(fd)
        ancestor = self.path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise AutotuneError(f"cannot create store {self.path}: {ancestor} is not a directory")
        if not (self.path.exists() and self.lock_path.exists()) and not os.access(ancestor, os.W_OK | os.X_OK):
            raise AutotuneError(f"cannot create store {self.path}: directory {ancestor} is not writable")

    # -- reading ---------------------------------------------------------------------------
    def _skip(self, lineno: int, why: str) -> None:
        self.skipped_lines += 1
        log.warning("%s:%d: skipped a store line (%s)", self.path, lineno, why[:300])

    def _parse(self, raw: bytes, lineno: int) -> dict[str, Any] | None:
        if len(raw) > MAX_LINE_BYTES:
            why = f"longer than {MAX_LINE_BYTES} bytes"
        elif _too_deep(raw):
            why = f"nested deeper than {MAX_LINE_DEPTH}"
        else:
            try:
                entry = json.loads(raw)
                why = check_entry(entry)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                why = f"does not parse: {_short(str(exc), 120)}"
        if why:
            self._skip(lineno, why)
            return None
        return entry

    def _want(self, model: str | None) -> None:
        """Index ``model``'s lines from now on (None: every model's), re-reading when that widens."""
        if self._models is None:
            return
        if model is None:
            self._models = None
        elif model in self._models:
            return
        else:
            self._models.add(model)
        self._reset()

    def refresh(self) -> None:
        """Read what other processes appended since the last read (all of it after a compaction).

        Raises
        ------
        AutotuneError
            The path is a directory, FIFO, device or symbolic link, or cannot be read.
        """
        fd = self._open(self.path, "store", os.O_RDONLY, "read")
        if fd is None:
            self._reset()
            return
        try:
            st = os.fstat(fd)  # identity and size of the file actually opened (a compaction may replace it)
            ino = (st.st_dev, st.st_ino)
            if ino != self._ino or st.st_size < self._cursor.offset:
                self._reset()
                self._ino = ino
            wanted = None if self._models is None else [m.encode() for m in self._models]
            try:
                for raw in _complete_lines(fd, st.st_size, self._cursor):
                    self._lines += 1
                    if raw is None:
                        self._skip(self._lines, f"longer than {MAX_LINE_BYTES} bytes")
                    elif raw.strip() and (wanted is None or any(m in raw for m in wanted)):
                        entry = self._parse(raw, self._lines)
                        if entry is not None:
                            key = self._key(entry)
                            self._index.pop(key, None)  # re-insert: dict order = newest last
                            self._index[key] = entry
            except OSError as exc:
                raise AutotuneError(f"cannot read store {self.path}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)

    @staticmethod
    def _key(entry: Mapping[str, Any]) -> tuple[str, str, str]:
        return (entry["model"], entry["op"], entry["problem"])

    def get(self, model: str, op: str, problem: str) -> dict[str, Any] | None:
        """The newest entry of ``(model, op, problem)``, or None (entries of other models never match)."""
        self._want(model)
        self.refresh()
        return self._index.get((model, op, problem))

    def entries(self, model: str | None = None) -> list[dict[str, Any]]:
        """Current entries (last per key), oldest first; only ``model``'s when given."""
        self._want(model)
        self.refresh()
        return [e for e in self._index.values() if model is None or e["model"] == model]

    # -- writing ---------------------------------------------------------------------------
    def _locked(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AutotuneError(f"cannot create the directory of store {self.path}: {exc.strerror or exc}") from exc
        fd = self._open(self.lock_path, "store lock", os.O_RDWR | os.O_CREAT, "open")
        assert fd is not None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def put(self, entry: Mapping[str, Any]) -> None:
        """Append one entry (adds ``format``, ``created`` and ``writer`` when absent); compacts
        when the file holds more than ``2 * max_entries`` lines.

        Raises
        ------
        AutotuneError
            The entry is not a valid store line, or the store cannot be written (named).
        """
        record = {"format": STORE_FORMAT, **entry}
        record.setdefault("created", _now())
        record.setdefault("writer", "python")
        why = check_entry(record)
        if why:
            raise AutotuneError(f"store entry refused: {why}")
        try:
            line = json.dumps(record, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        except (TypeError, ValueError) as exc:
            raise AutotuneError(f"store entry refused: {exc}") from exc
        if len(line) > MAX_LINE_BYTES:
            raise AutotuneError(f"store entry refused: {len(line)} bytes, longer than {MAX_LINE_BYTES}")
        fd = self._locked()
        try:
            if not self._cleaned:
                self._clean_temps()
            out = self._open(self.path, "store", os.O_RDWR | os.O_APPEND | os.O_CREAT, "append to")
            assert out is not None
            try:
                size = os.fstat(out).st_size
                if size and os.pread(out, 1, size - 1) != b"\n":  # a crashed writer's partial line must not swallow ours
                    line = b"\n" + line
                written = os.write(out, line)
                if written != len(line):
                    raise AutotuneError(f"cannot write store {self.path}: wrote {written} of {len(line)} bytes")
            except OSError as exc:
                raise AutotuneError(f"cannot write store {self.path}: {exc.strerror or exc}") from exc
            finally:
                os.close(out)
            self.refresh()
            if self._lines > 2 * self.max_entries:
                self._compact_locked()
        finally:
            os.close(fd)

    def compact(self) -> None:
        """Rewrite the file with the last line of each key, newest ``max_entries`` keys."""
        fd = self._locked()
        try:
            self._compact_locked()
        finally:
            os.close(fd)

    def _temp_prefix(self) -> str:
        return f".{self.path.name}.tmp-"

    def _clean_temps(self) -> None:
        """Remove compaction files of writers that died (same host, pid gone) or are old; called
        under the lock, so no live writer of this store is compacting."""
        self._cleaned = True
        prefix, host, now = self._temp_prefix(), socket.gethostname(), time.time()
        try:
            found = [e for e in os.scandir(self.path.parent) if e.name.startswith(prefix)]
        except OSError:
            return
        for e in found:
            parts = e.name[len(prefix):].rsplit("-", 2)
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            dead = len(parts) == 3 and parts[0] == host and parts[1].isdigit() and not _alive(int(parts[1]))
            if stat.S_ISREG(st.st_mode) and (dead or now - st.st_mtime > STALE_TEMP_S):
                with contextlib.suppress(OSError):
                    os.unlink(e.path)

    def _compact_locked(self) -> None:
        fd = self._open(self.path, "store", os.O_RDONLY, "read")
        if fd is None:
            return
        keep: dict[tuple[str, str, str], bytes] = {}
        try:
            for lineno, raw in enumerate(_complete_lines(fd, os.fstat(fd).st_size, _Cursor()), 1):
                entry = None if raw is None or not raw.strip() else self._parse(raw, lineno)
                if entry is not None and raw is not None:  # kept verbatim: fields unknown here survive
                    keep.pop(self._key(entry), None)
                    keep[self._key(entry)] = raw
        except OSError as exc:
            raise AutotuneError(f"cannot read store {self.path}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        self._clean_temps()
        tmp = self.path.parent / f"{self._temp_prefix()}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(8)}"
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(out, "wb") as fh:
                fh.write(b"".join(raw + b"\n" for raw in list(keep.values())[-self.max_entries:]))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise AutotuneError(f"cannot compact store {self.path}: {exc.strerror or exc}") from exc
            raise
        self._reset()
        self.refresh()
