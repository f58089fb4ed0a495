"""Python runtime: load an exported selector, verify it, and pick kernels for problems.

>>> sel = KernelSelector.load("exports/gemm_universal_gfx950_fp8_rcr", arch="gfx950", dtype="fp8")
>>> choice = sel.select(128, 1536, 7168, top_k=5)       # or sel.select(m=128, n=1536, k=7168)
>>> choice.kernels[0], choice.scores[0], choice.out_of_distribution

:meth:`KernelSelector.load` reads ``manifest.json`` and checks its structure
(:func:`ckpred.export.manifest.check_manifest`), that the requested op/arch/dtype/layout match,
the sha256 of every ``.onnx`` it lists, that the manifest inside the model's metadata is the one
beside it, that the catalogue rows hash to the recorded hash, that the catalogue is the one this
ckpred's op definition enumerates for that arch/dtype/layout (or the one passed in), and that
the graph ranks exactly the manifest's candidates. The C++ selector (``scripts/cpp``) runs the
same checks in the same order. Any difference raises :class:`ckpred.errors.ModelMismatchError`
naming it; a malformed manifest (not UTF-8, not JSON, a missing key, a wrong type) or model
file (not ONNX) too.

:meth:`KernelSelector.select` runs the selector graph (``model.onnx``: problem -> top-k
kernel ids, scores, number of valid kernels). A problem for which no kernel is valid (the
degenerate N=1 or K=1 GEMMs, or dimensions no tile divides) gets an explicit "no kernel"
answer (``ok=False``) with the op's reason instead of a guess. Problems outside the field
ranges seen in training are answered but flagged ``out_of_distribution`` with the fields and
ranges concerned. Answers are cached per (problem, top_k) in a bounded LRU cache.

Arguments are checked, not coerced: a problem value must be an integer (``True`` and ``2.5`` are
refused) within int64 and at least the field's minimum (0 or 1, recorded at export; negative
values are always refused), ``top_k`` an integer in [1, 2^63-1], ``threads`` an integer in
[1, :func:`max_threads`] (the CPUs this process may run on). Each refusal is a :class:`ckpred.errors.ConfigValueError` naming the
argument (``problem.m``), the value and what is allowed. A symlinked export directory is read
through its link; the files' sha256 are what is trusted, not their paths.

The export directory is opened once and its files are opened through that descriptor before
the manifest is read; each is read once, must be a regular file of bounded size (a FIFO or
``/dev/zero`` is refused unread), and the bytes verified are the bytes the session is made
from: a load racing a re-export gives the old model or the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, cast

import numpy as np
import onnx
import pandas as pd

from ckpred import vocab
from ckpred.autotune import (AutotuneError, Budget, Calibration, LogisticCalibration, ResultStore, TuneResult, autotune,
                             load_calibration)
from ckpred.autotune.search import Benchmark
from ckpred.errors import CkpredError, ConfigValueError, InputFileError, MissingFileError, ModelMismatchError
from ckpred.export import manifest as mf
from ckpred.kernels.base import OpDefinition, load_op
from ckpred.plugins import allowed_plugins
from ckpred.util import max_threads

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

__all__ = ["KernelSelector", "Selection"]

#: What a model is asked to be made for (``KernelSelector.load``'s keywords).
IDENTITY = ("arch", "dtype", "layout", "op")


class Named(Protocol):
    """A config object that names its option (an arch, dtype, layout or op config)."""

    @property
    def name(self) -> str: ...


class _BindsCatalogue(Protocol):
    """An op whose catalogue is learned from the training table (``catalogue_from_data``)."""

    def bind_catalogue(self, catalogue: pd.DataFrame) -> None: ...


@dataclass(frozen=True)
class Selection:
    """The answer for one problem.

    Attributes
    ----------
    problem : dict
        The problem fields as used (defaults filled in).
    kernels : tuple of str
        Kernel names, best first (empty when ``ok`` is False).
    ids : tuple of int
        Their catalogue ids.
    scores : tuple of float
        Their scores in the model's output space (higher is better).
    ok : bool
        False when no kernel can run the problem; ``reason`` says why.
    reason : str
        Why there is no kernel ("" when ``ok``).
    num_valid : int
        Catalogue kernels that can run the problem.
    out_of_distribution : bool
        Some problem field lies outside the range seen in training.
    ood_fields : dict
        Field -> (value, [min, max] seen in training) for each such field.
    applicability_fallback : bool or None
        With an applicability mask (an op whose table lists only the kernels that apply to each
        problem): True when no kernel is predicted to apply to the problem, so the kernels are
        ranked among every rule-valid one (none known to apply); None for a selector without one.
    """

    problem: dict[str, int]
    kernels: tuple[str, ...]
    ids: tuple[int, ...]
    scores: tuple[float, ...]
    ok: bool
    reason: str
    num_valid: int
    out_of_distribution: bool = False
    ood_fields: dict[str, Any] = field(default_factory=dict)
    applicability_fallback: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"problem": self.problem, "ok": self.ok, "reason": self.reason, "num_valid": self.num_valid,
               "out_of_distribution": self.out_of_distribution,
               "ood_fields": {k: [v[0], list(v[1])] for k, v in self.ood_fields.items()}}
        if self.applicability_fallback is not None:
            out["applicability_fallback"] = self.applicability_fallback
        out["kernels"] = [{"id": i, "name": n, "score": s} for i, n, s in zip(self.ids, self.kernels, self.scores)]
        return out


def _metadata(data: bytes, model_path: Path) -> dict[str, str]:
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf DecodeError and friends: the file is no ONNX model
        raise ModelMismatchError(f"{model_path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from exc
    return {p.key: p.value for p in model.metadata_props}


#: Largest manifest and model file read (bytes); a larger one is refused unread (an ONNX file
#: cannot pass 2 GiB, protobuf's limit). scripts/cpp/manifest.hpp has the same bounds.
MAX_MANIFEST_BYTES = 256 << 20
MAX_MODEL_BYTES = 2 << 30
_READ_ATTEMPTS = 5
_EAGER_FILES = 64  # files of an export directory opened before its manifest is read


class _Replaced(Exception):
    """A file went missing from an export directory that a re-export swapped out meanwhile."""


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _open_at(dfd: int, name: str, path: Path) -> int:
    """A descriptor of the regular file ``name`` of the directory ``dfd`` (FileNotFoundError when
    it is missing). Anything else (a FIFO, a device, a directory) is refused by its kind without
    being opened; the open is non-blocking all the same, and :func:`_read_fd` checks again."""
    try:
        st = os.stat(name, dir_fd=dfd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelMismatchError(f"{path}: {_file_kind(st.st_mode)}, not a regular file")
        return os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InputFileError(str(path), exc.strerror or str(exc)) from exc


def _read_fd(fd: int, path: Path, limit: int) -> bytes:
    """The bytes of the open file ``fd`` (closed here): a regular file (a FIFO or device is
    refused before a byte is read) of at most ``limit`` bytes."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelMismatchError(f"{path}: {_file_kind(st.st_mode)}, not a regular file")
        chunks, total = [], 0
        while total <= limit:
            block = os.read(fd, min(1 << 24, limit + 1 - total))
            if not block:
                break
            chunks.append(block)
            total += len(block)
        if total > limit:
            raise ModelMismatchError(f"{path}: larger than {limit} bytes, the most this file may hold")
        return b"".join(chunks)
    except OSError as exc:
        raise InputFileError(str(path), exc.strerror or str(exc)) from exc
    finally:
        os.close(fd)


def _replaced(model_dir: Path, pinned: tuple[int, int]) -> bool:
    """True when ``model_dir`` is no longer the directory (device, inode) ``pinned`` (or is gone)."""
    try:
        now = os.stat(model_dir)
    except OSError:
        return True
    return (now.st_dev, now.st_ino) != pinned


def _open_all(dfd: int, model_dir: Path) -> tuple[dict[str, int], dict[str, Exception]]:
    """Descriptors of the (first :data:`_EAGER_FILES`) files of the directory ``dfd``, and why
    each of the others could not be opened (raised only if the manifest lists it). Every file is
    opened first (an export holds three), so a re-export that swaps the directory out and deletes
    it meanwhile leaves them readable."""
    fds: dict[str, int] = {}
    failed: dict[str, Exception] = {}
    try:
        names = sorted(os.listdir(dfd))[:_EAGER_FILES]
    except OSError as exc:
        raise InputFileError(str(model_dir), exc.strerror or str(exc)) from exc
    try:
        for name in names:
            try:
                fds[name] = _open_at(dfd, name, model_dir / name)
            except (OSError, CkpredError) as exc:  # raised only if the manifest lists it
                failed[name] = exc
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds, failed


def _read_manifest(model_dir: Path, fds: dict[str, int], failed: Mapping[str, Exception],
                   pinned: tuple[int, int]) -> dict[str, Any]:
    """The manifest of the opened files ``fds`` (its descriptor is taken out and closed), checked
    for structure; :class:`_Replaced` when it is missing because the directory was swapped out."""
    if mf.MANIFEST not in fds:
        if _replaced(model_dir, pinned):
            raise _Replaced
        if mf.MANIFEST in failed and not isinstance(failed[mf.MANIFEST], FileNotFoundError):
            raise failed[mf.MANIFEST]
        raise MissingFileError(str(model_dir / mf.MANIFEST), _NO_MANIFEST.format(model_dir=model_dir))
    data = _read_fd(fds.pop(mf.MANIFEST), model_dir / mf.MANIFEST, MAX_MANIFEST_BYTES)
    return mf.parse_manifest(data, model_dir / mf.MANIFEST)


def _read_listed(dfd: int, model_dir: Path, manifest: Mapping[str, Any], fds: dict[str, int],
                 failed: Mapping[str, Exception], pinned: tuple[int, int]) -> dict[str, bytes]:
    """The bytes of every file the manifest lists, read through the descriptors ``fds`` (taken
    out and closed) or opened now through ``dfd`` (a directory of more than _EAGER_FILES files)."""
    files = {}
    for name in manifest["files"]:
        if name in failed and not isinstance(failed[name], FileNotFoundError):
            raise failed[name]
        if name not in fds:
            try:  # (a directory of more than _EAGER_FILES files)
                fds[name] = _open_at(dfd, name, model_dir / name)
            except FileNotFoundError:
                if _replaced(model_dir, pinned):
                    raise _Replaced from None
                raise ModelMismatchError(f"{model_dir / name}: listed in the manifest but missing") from None
        files[name] = _read_fd(fds.pop(name), model_dir / name, MAX_MODEL_BYTES)
    return files


_NO_MANIFEST = "no manifest; is {model_dir} an export directory (python -m ckpred export ...)?"


def _read_export(model_dir: Path, wanted: Mapping[str, str | Named | None]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The checked manifest (structure, then the identity ``wanted``) and the bytes of every file
    it lists, all read through one descriptor of ``model_dir`` (a symlinked directory is followed
    once). :class:`_Replaced` when a file is missing because a re-export swapped the directory out
    before it was opened."""
    try:
        dfd = os.open(model_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise MissingFileError(str(model_dir / mf.MANIFEST), _NO_MANIFEST.format(model_dir=model_dir)) from None
    except OSError as exc:
        raise InputFileError(str(model_dir), exc.strerror or str(exc)) from exc
    fds: dict[str, int] = {}
    try:
        st = os.fstat(dfd)
        pinned = (st.st_dev, st.st_ino)
        fds, failed = _open_all(dfd, model_dir)
        manifest = _read_manifest(model_dir, fds, failed, pinned)
        check_identity(manifest, model_dir, **wanted)
        return manifest, _read_listed(dfd, model_dir, manifest, fds, failed, pinned)
    finally:
        for fd in fds.values():
            os.close(fd)
        os.close(dfd)


def _identity(expected: Mapping[str, str | Named | None]) -> dict[str, str | Named | None]:
    """``load``'s identity keywords, every one of :data:`IDENTITY` (None: not asked); another
    keyword is refused as Python refuses an unknown keyword argument."""
    unknown = [key for key in expected if key not in IDENTITY]
    if unknown:
        raise TypeError(f"KernelSelector.load() got an unexpected keyword argument {unknown[0]!r}")
    return {key: expected.get(key) for key in IDENTITY}


def _verified(model_dir: Path, wanted: Mapping[str, str | Named | None]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and the bytes of the files it lists (:func:`_read_export`, again when a
    re-export swapped the directory out meanwhile), each file's sha256 checked against the
    manifest's and the manifest against the one embedded in the selector graph. Every file is
    read once, through one descriptor of the directory, and the bytes checked are the bytes
    used: a re-export swapped in meanwhile gives the old model or the new one, never a mix."""
    for attempt in range(_READ_ATTEMPTS):
        try:
            manifest, files = _read_export(model_dir, wanted)
            break
        except _Replaced:
            time.sleep(0.05 * (attempt + 1))
    else:
        raise ModelMismatchError(f"{model_dir}: replaced while being read, {_READ_ATTEMPTS} times in a row")
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        if digest != manifest["files"][name]["sha256"]:
            raise ModelMismatchError(f"{model_dir / name}: sha256 {digest} does not match the manifest's "
                                     f"{manifest['files'][name]['sha256']} (file modified or replaced after export)")
    selector_file = manifest["graphs"]["selector"]["file"]
    _check_embedded(manifest, model_dir, selector_file, files[selector_file])
    return manifest, files


def _check_embedded(manifest: Mapping[str, Any], model_dir: Path, selector_file: str, data: bytes) -> None:
    """Refuse a manifest that is not the one embedded in the selector graph's metadata."""
    meta = _metadata(data, model_dir / selector_file)
    body = {k: v for k, v in manifest.items() if k != "files"}
    try:
        embedded = json.loads(meta.get("ckpred.manifest", "null"))
    except ValueError as exc:
        raise ModelMismatchError(f"{model_dir}/{selector_file}: embedded manifest is not JSON ({exc})") from exc
    if embedded != body:
        raise ModelMismatchError(f"{model_dir}: manifest.json does not match the manifest embedded in "
                                 f"{selector_file} (manifest edited, or files from different exports?)")


def _op_of(manifest: Mapping[str, Any], model_dir: Path, allow_plugins: Iterable[str]) -> OpDefinition:
    """The op the manifest names (its config), importing only ckpred's own or allowed plug-ins."""
    try:
        with allowed_plugins(allow_plugins):  # the manifest is data: only allowed plug-ins are imported
            return load_op(manifest.get("op_config") or manifest["op"])
    except ConfigValueError as exc:
        if exc.key not in ("op.plugin", "allow_plugins"):
            raise
        raise ModelMismatchError(f"{model_dir}/{mf.MANIFEST}: op_config.plugin: {exc}") from None


def _check_catalogue(manifest: Mapping[str, Any], model_dir: Path, op_def: OpDefinition,
                     catalogue: pd.DataFrame | None, check_catalogue: bool) -> None:
    """Refuse catalogue rows that do not hash to the manifest's hash, and a runtime catalogue (the
    caller's, else the op's for the manifest's arch/dtype/layout) that differs from them. An op
    whose catalogue is learned from the training table is bound to the manifest's rows."""
    section = manifest["catalogue"]
    own = mf.catalogue_frame(section)
    if op_def.catalogue_hash(own) != section["hash"]:
        raise ModelMismatchError(f"{model_dir}/{mf.MANIFEST}: catalogue rows do not hash to the recorded "
                                 f"{section['hash']} (manifest edited?)")
    if getattr(op_def, "catalogue_from_data", False):  # learned from the training table: the manifest's
        cast(_BindsCatalogue, op_def).bind_catalogue(own)
    if catalogue is None and check_catalogue:
        catalogue = op_def.catalogue(manifest["arch"], manifest["dtype"], manifest["layout"])
    if catalogue is not None:
        expected = op_def.catalogue_hash(catalogue)
        if expected != section["hash"]:
            raise ModelMismatchError(
                f"{model_dir}: kernel catalogue differs: model has {section['count']} kernels (hash "
                f"{section['hash'][:12]}), the runtime's catalogue has {len(catalogue)} (hash {expected[:12]}) "
                f"{_first_catalogue_difference(own, catalogue)}")


def _checked_session(manifest: Mapping[str, Any], model_dir: Path, files: dict[str, bytes],
                     threads: int) -> InferenceSession:
    """The selector graph's session (its bytes taken out of ``files``), its inputs and outputs
    checked against the manifest's."""
    selector_file = manifest["graphs"]["selector"]["file"]
    sess = _session(files.pop(selector_file), model_dir / selector_file, threads)
    got_in = [i.name for i in sess.get_inputs()]
    got_out = [o.name for o in sess.get_outputs()]
    want_in = [i["name"] for i in manifest["graphs"]["selector"]["inputs"]]
    want_out = [o["name"] for o in manifest["graphs"]["selector"]["outputs"]]
    if got_in != want_in or got_out != want_out:
        raise ModelMismatchError(f"{model_dir}/{selector_file}: inputs {got_in} / outputs {got_out}, manifest "
                                 f"says {want_in} / {want_out}")
    return sess


_DECIMAL = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _check_int(key: str, value: object, lo: int, hi: int = mf.INT64_MAX) -> int:
    """``value`` as an int when it is an integer (not a bool, not a float) in [lo, hi]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not lo <= int(value) <= hi:
        raise ConfigValueError(key, value, f"an integer in [{lo}, {hi}]")
    return int(value)


def out_of_distribution(row: Mapping[str, int], ranges: Mapping[str, Any]) -> dict[str, Any]:
    """Field -> (value, (min, max)) for each field of ``row`` outside its training range."""
    return {name: (row[name], tuple(rng)) for name, rng in ranges.items()
            if name in row and not (rng[0] <= row[name] <= rng[1])}


class KernelSelector:
    """An exported kernel selector, verified and ready to answer problems.

    Use :meth:`load`; the constructor takes already-verified parts.
    """

    def __init__(self, model_dir: Path, manifest: dict[str, Any], op: OpDefinition, session: InferenceSession, *,
                 cache_size: int = 4096) -> None:
        self.model_dir = model_dir
        self.manifest = manifest
        self.op = op
        self._session = session
        self._names = [row[1] for row in manifest["catalogue"]["rows"]]
        self._catalogue: pd.DataFrame | None = None
        self._problem_fields = [f["name"] for f in manifest["problem_fields"]]
        self._defaults = {f["name"]: f["default"] for f in manifest["problem_fields"]}
        training = manifest.get("training") or {}
        self._ranges = training.get("problem_ranges", {})
        self._minimum = training.get("problem_minimum", {})
        self._kinds = {f["name"]: f for f in manifest["problem_fields"]}
        self._int_minimum = {f["name"]: int(self._minimum.get(f["name"], 0)) for f in manifest["problem_fields"]
                             if f["kind"] == "int"}
        self._cache: OrderedDict[tuple[Any, ...], Selection] = OrderedDict()
        #: The selector's optional per-problem flags it outputs (``applicability_fallback``).
        self._flags = [o.name for o in session.get_outputs() if o.name in mf.SELECTOR_FLAGS]
        #: The ``top_k`` input of the last run, reused while ``top_k`` stays the same (a new
        #: array per call slowed ``select`` down measurably); read-only.
        self._top_k_feed: tuple[int, np.ndarray] = (0, np.zeros(1, dtype=np.int64))
        self.cache_size = cache_size
        self.cache_hits = 0
        #: The confidence budget's calibration (:class:`ckpred.autotune.Calibration` or
        #: :class:`~ckpred.autotune.LogisticCalibration`) from the
        #: manifest's ``autotune`` section, checked at :meth:`load`; None when the export has none.
        self.calibration: Calibration | LogisticCalibration | None = None

    # -- loading -------------------------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: str | Path, *, catalogue: pd.DataFrame | None = None, threads: int = 1,
             cache_size: int = 4096, check_catalogue: bool = True, allow_plugins: Iterable[str] = (),
             **expected: str | Named | None) -> "KernelSelector":
        """Load and verify an export directory.

        Parameters
        ----------
        model_dir : path
            ``exports/<op>_<arch>_<dtype>_<layout>`` (holds ``model.onnx`` and ``manifest.json``).
        arch, dtype, layout, op : str or config, optional
            What the caller runs on (keywords; no other is accepted); each given one must equal
            the manifest's.
        catalogue : DataFrame, optional
            The caller's kernel catalogue (``kernel_id``, ``kernel_name``, kernel fields); by
            default the catalogue ckpred's op definition enumerates for the manifest's
            arch/dtype/layout. Its hash must equal the manifest's.
        threads : int, default=1
            onnxruntime intra-op threads, in [1, :func:`max_threads`].
        cache_size : int, default=4096
            Answers kept in the per-problem LRU cache (0 = no cache).
        check_catalogue : bool, default=True
            Compare the catalogue (set False only for ops whose catalogue needs configs that
            are not available by name).
        allow_plugins : iterable of str, default=()
            Modules (packages) the manifest's op config may name as its plug-in besides
            ckpred's own, those installed packages register in the ``ckpred.plugins`` entry-point
            group and those of ``CKPRED_ALLOW_PLUGINS`` (:mod:`ckpred.plugins`). Any other
            plug-in is refused before it is imported: loading an export runs no code of its own.

        Raises
        ------
        ckpred.errors.MissingFileError
            No manifest in ``model_dir``.
        ckpred.errors.ConfigValueError
            ``threads`` or ``cache_size`` out of range.
        ckpred.errors.ModelMismatchError
            Malformed manifest (:func:`ckpred.export.manifest.check_manifest`), tampered file
            (sha256), manifest/model metadata disagreement, catalogue rows that do not hash to
            the recorded hash or whose count differs from the graph's, arch/dtype/layout/op/
            catalogue different from what was asked; the message names what differs.
        """
        wanted = _identity(expected)
        threads = _check_int("threads", threads, 1, max_threads())
        cache_size = _check_int("cache_size", cache_size, 0)
        model_dir = Path(model_dir)
        # The same checks in the same order as scripts/cpp (so both name the same first failure);
        # nothing named by the manifest (the op, its config) is imported before the manifest is
        # known to be the one embedded in the verified model.
        manifest, files = _verified(model_dir, wanted)
        calibration = _calibration(manifest, model_dir)
        # the dtypes and layouts the model was made with (a user's own dtype loads without their dir)
        vocab.add(manifest.get("vocabulary") or {}, source=str(model_dir / mf.MANIFEST))
        op_def = _op_of(manifest, model_dir, allow_plugins)
        _check_catalogue(manifest, model_dir, op_def, catalogue, check_catalogue)
        sess = _checked_session(manifest, model_dir, files, threads)
        selector = cls(model_dir, manifest, op_def, sess, cache_size=cache_size)
        selector.calibration = calibration
        selector._check_graph_width()
        return selector

    def _probe_value(self, name: str) -> int:
        """A legal value of one problem field for a probe run (the training minimum if known)."""
        if self._kinds[name]["kind"] != "int":
            return 0
        if name in self._ranges:
            return int(self._ranges[name][0])
        return max(1, int(self._minimum.get(name, 1)))

    def _check_graph_width(self) -> None:
        """The graph ranks exactly the manifest's candidates: one run with top_k past their number.

        ``kernel_ids`` is ``[B, min(top_k, K)]`` with K the kernels the graph scores (the
        catalogue, or ``selection.candidate_ids``); a catalogue shortened or padded after
        export, or a graph from another export, shows here.
        """
        ids = self.manifest.get("selection", {}) or {}
        ids = ids.get("candidate_ids")
        want = len(ids) if ids else int(self.manifest["catalogue"]["count"])
        probe = np.array([[self._probe_value(n) for n in self._problem_fields]], dtype=np.int64)
        try:
            got_ids, _, _ = self.run(probe, want + 1)
        except Exception as exc:  # onnxruntime's own failure types; the graph cannot run at all
            raise ModelMismatchError(f"{self.model_dir}/{self.manifest['graphs']['selector']['file']}: "
                                     f"the selector graph does not run ({type(exc).__name__}: {exc})") from exc
        width = got_ids.shape[1] if got_ids.ndim == 2 else -1
        if width != want or (got_ids.size and not (0 <= got_ids.min() and got_ids.max() < len(self._names))):
            raise ModelMismatchError(
                f"{self.model_dir}: the selector graph ranks {width} kernels, the manifest's catalogue has "
                f"{len(self._names)} rows and {want} candidates (catalogue edited after export?)")

    # -- selection -----------------------------------------------------------------------------
    @property
    def problem_fields(self) -> list[str]:
        return list(self._problem_fields)

    def kernel_name(self, kernel_id: object) -> str | None:
        """The catalogue name of ``kernel_id`` (None when the catalogue has no such id)."""
        if isinstance(kernel_id, (bool, np.bool_)) or not isinstance(kernel_id, (int, np.integer)):
            return None
        return self._names[kernel_id] if 0 <= kernel_id < len(self._names) else None

    @property
    def catalogue(self) -> pd.DataFrame:
        """The model's kernel catalogue (from the manifest)."""
        if self._catalogue is None:
            self._catalogue = mf.catalogue_frame(self.manifest["catalogue"])
        return self._catalogue

    def problem_row(self, *values: object, **fields: object) -> dict[str, int]:
        """Normalise positional values / a mapping / keywords into the full problem dict.

        Raises
        ------
        ckpred.errors.ConfigValueError
            Too many values, an unknown, repeated or missing field, or a value that is not an
            integer in [the field's minimum, 2^63-1] (``problem.<field>`` is named).
        """
        if len(values) == 1 and isinstance(values[0], Mapping):
            fields = {**values[0], **fields}
            values = ()
        if len(values) > len(self._problem_fields):
            raise ConfigValueError("problem", values, f"at most {len(self._problem_fields)} values, one per "
                                                      f"problem field {self._problem_fields}")
        given = dict(zip(self._problem_fields, values))
        for key, value in fields.items():
            key = str(key).lower() if str(key).lower() in self._problem_fields else key
            if key not in self._problem_fields:
                raise ConfigValueError(f"problem.{key}", value, f"a field of op {self.op.name!r}: "
                                                                f"{self._problem_fields}")
            if key in given:
                raise ConfigValueError(f"problem.{key}", value, "one value per field (given twice)")
            given[key] = value
        row = {}
        for name in self._problem_fields:
            if name in given:
                value = given[name]
            elif self._defaults.get(name) is not None:
                value = self._defaults[name]
            else:
                raise ConfigValueError(f"problem.{name}", None, f"a value (required; fields: {self._problem_fields})")
            row[name] = self._problem_value(name, value)
        return row

    def _problem_value(self, name: str, value: object) -> int:
        """One problem value as the graph's int64 code, checked against the field's kind."""
        lo = self._int_minimum.get(name)
        if type(value) is int and lo is not None and lo <= value <= mf.INT64_MAX:  # the common case, first
            return value
        spec = self._kinds[name]
        key = f"problem.{name}"
        if spec["kind"] == "bool":
            if isinstance(value, (bool, np.bool_)):
                return int(bool(value))
            raise ConfigValueError(key, value, "true or false")
        if spec["kind"] == "category":
            if isinstance(value, str) and value in spec["categories"]:
                return spec["categories"].index(value)
            raise ConfigValueError(key, value, f"one of {spec['categories']}")
        # an int field (the manifest allows no other kind): lo is its minimum from _int_minimum
        if isinstance(value, str):  # decimal text ("128") is fine, as in the C++ selector; "1.5", "1_0", "x" are not
            if not _DECIMAL.fullmatch(value.strip(" \t\r\n")):
                raise ConfigValueError(key, value, f"an integer in [{lo}, {mf.INT64_MAX}]")
            value = int(value.strip(" \t\r\n"))
        assert lo is not None  # an int field: _int_minimum holds its minimum
        return _check_int(key, value, lo)

    def select(self, *values: object, top_k: int = 5, **fields: object) -> Selection:
        """Best ``top_k`` kernels for one problem.

        Parameters
        ----------
        *values
            Problem fields in ``problem_fields`` order (``select(128, 1536, 7168)``), or one
            mapping of field -> value.
        top_k : int, default=5
            Number of kernels to return (fewer when fewer are valid).
        **fields
            Problem fields by name (``select(m=128, n=1536, k=7168)``); missing fields with a
            default (``split_k=1``) take it.

        Returns
        -------
        Selection
        """
        top_k = _check_int("top_k", top_k, 1)
        row = self.problem_row(*values, **fields)
        key = (*row.values(), top_k)
        if self.cache_size:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.cache_hits += 1
                return hit
        answer = self._select_batch([row], top_k)[0]
        if self.cache_size:
            self._cache[key] = answer
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return answer

    def autotune(self, problem: Mapping[str, Any], benchmark: Benchmark, budget: Budget | int | None = None, *,
                 store: ResultStore | str | os.PathLike[str] | None = None, pass_id: bool = False,
                 refresh: bool = False, timeout: float | None = None) -> TuneResult:
        """Benchmark the best valid kernels of ``problem`` with the caller's ``benchmark`` and keep
        the fastest (see :func:`ckpred.autotune.autotune` for the budgets, the store and options)."""
        return autotune(self, problem, benchmark, budget, store=store, pass_id=pass_id, refresh=refresh,
                        timeout=timeout)

    def select_many(self, problems: pd.DataFrame | list[Mapping[str, Any]], top_k: int = 5,
                    batch: int = 16) -> list[Selection]:
        """:meth:`select` for many problems, ``batch`` of them per graph run (no cache)."""
        top_k = _check_int("top_k", top_k, 1)
        batch = _check_int("batch", batch, 1)
        records = problems.to_dict("records") if isinstance(problems, pd.DataFrame) else list(problems)
        rows = [self.problem_row(r) for r in records]
        out: list[Selection] = []
        for start in range(0, len(rows), batch):
            out.extend(self._select_batch(rows[start:start + batch], top_k))
        return out

    def run(self, problems: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raw graph call: int64 [B, P] problems -> (kernel_ids, scores, num_valid)."""
        return self._run(problems, top_k, [])[:3]  # type: ignore[return-value]

    def _run(self, problems: np.ndarray, top_k: int, flags: list[str]) -> list[np.ndarray]:
        """The graph's ``kernel_ids``, ``scores``, ``num_valid`` and then the outputs ``flags``."""
        last = self._top_k_feed
        if last[0] != top_k:
            feed = np.full(1, top_k, dtype=np.int64)
            feed.flags.writeable = False
            self._top_k_feed = last = (top_k, feed)
        return self._session.run(["kernel_ids", "scores", "num_valid", *flags],
                                 {"problem": np.ascontiguousarray(problems, dtype=np.int64), "top_k": last[1]})

    def _select_batch(self, rows: list[dict[str, int]], top_k: int) -> list[Selection]:
        matrix = np.array([[r[n] for n in self._problem_fields] for r in rows], dtype=np.int64)
        ids, scores, nvalid, *flags = self._run(matrix, top_k, self._flags)
        # Python ints and floats in one call each (element by element costs microseconds per shape)
        ids, scores, nvalid = ids.tolist(), scores.tolist(), nvalid.tolist()
        fell = flags[0].tolist() if flags else [None] * len(rows)
        out = []
        for j, row in enumerate(rows):
            ood = out_of_distribution(row, self._ranges)
            n = min(top_k, nvalid[j], len(ids[j]))
            if n == 0:
                out.append(Selection(row, (), (), (), False, self._no_kernel_reason(row), 0, bool(ood), ood,
                                     fell[j]))
                continue
            chosen = tuple(ids[j][:n])
            if not all(0 <= i < len(self._names) for i in chosen):
                raise ModelMismatchError(f"{self.model_dir}: the selector graph returned kernel ids {chosen} "
                                         f"outside the catalogue's {len(self._names)} rows")
            out.append(Selection(row, tuple(self._names[i] for i in chosen), chosen,
                                 tuple(scores[j][:n]), True, "", nvalid[j], bool(ood), ood, fell[j]))
        return out

    def _no_kernel_reason(self, row: dict[str, int]) -> str:
        """The op's own reason(s) why no catalogue kernel runs ``row`` (most frequent first)."""
        cat = self.catalogue
        # column by column (a frame from len(cat) row dicts took most of the time)
        problems = pd.DataFrame({name: np.full(len(cat), value, dtype=np.int64) for name, value in row.items()})
        try:
            _, reasons = self.op.validity(problems, cat, arch=self.manifest["arch"], dtype=self.manifest["dtype"],
                                          layout=self.manifest["layout"])
        except Exception as exc:  # the graph already said "none valid"; keep the answer explicit
            return f"no valid kernel in the catalogue (reason unavailable: {exc})"
        counts = Counter(r for r in reasons if r)
        if not counts:
            return "no valid kernel in the catalogue"
        top = counts.most_common(2)
        text = "; ".join(f"{reason} ({count} kernels)" for reason, count in top)
        return f"no valid kernel: {text}"


def _calibration(manifest: Mapping[str, Any], model_dir: Path) -> Calibration | LogisticCalibration | None:
    """The manifest's ``autotune`` calibration, parsed and checked (None when absent or null)."""
    section = manifest.get("autotune")
    if section is None:
        return None
    where = f"{model_dir}/{mf.MANIFEST}: autotune"
    try:
        calibration = load_calibration(section, where=where)
    except AutotuneError as exc:
        raise ModelMismatchError(str(exc)) from exc
    ints = [f["name"] for f in manifest["problem_fields"] if f["kind"] == "int"]
    foreign = [f for f in getattr(calibration, "fields", ()) if f not in ints]
    if foreign:  # the logistic model reads these values from every problem
        raise ModelMismatchError(f"{where}: fields {foreign} are not integer problem fields; allowed: {ints}")
    return calibration


def check_identity(manifest: Mapping[str, Any], model_dir: str | Path, **wanted: str | Named | None) -> None:
    """Refuse a model made for another op/arch/dtype/layout than the ones asked for (None = any)."""
    diffs = [f"{key}: model is for {manifest[key]!r}, asked for {getattr(v, 'name', v)!r}"
             for key, v in wanted.items() if v is not None and str(getattr(v, "name", v)) != manifest[key]]
    if diffs:
        raise ModelMismatchError(f"{model_dir} does not match: " + "; ".join(diffs))


def _session(data: bytes, path: Path, threads: int) -> InferenceSession:
    """An onnxruntime session of the model bytes ``data`` (read from ``path``); bytes onnxruntime
    cannot load are a ModelMismatchError."""
    # lazy: ckpred.export.onnx imports scikit-learn and skl2onnx (~3 s) for export; loading needs its session() only
    from ckpred.export.onnx import session as make_session

    try:
        return make_session(data, threads=threads)
    except Exception as exc:  # onnxruntime raises its own (non-Python-standard) exception types
        raise ModelMismatchError(f"{path}: onnxruntime cannot load it ({type(exc).__name__}: {exc})") from exc


def _first_catalogue_difference(model_cat: pd.DataFrame, other: pd.DataFrame) -> str:
    if len(model_cat) != len(other):
        return "(different number of kernels)"
    for i, (a, b) in enumerate(zip(model_cat["kernel_name"], other["kernel_name"])):
        if a != b:
            return f"(first difference at kernel_id {i}: model {a!r}, runtime {b!r})"
    return "(same names, different fields)"
