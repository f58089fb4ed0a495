"""Reading a finished ``train`` run directory back (for ``export run_dir=...`` and warm starts).

A train run dir holds ``pipeline.joblib`` (with ``save_pipeline=true``), the run record
``run.json`` (:data:`RUN_RECORD`: the run's config, data hash, versions, metrics and the
pipeline's sha256) and the CV outputs. Both consumers need the same guarantees before they
trust the pickled pipeline: the files are there, and the pipeline is the one the record
describes, and loading it runs no code the file names (:func:`load_pipeline`). (An export
directory's ``manifest.json`` is a different file: :mod:`ckpred.export.manifest`.) The run folder
kinds (:func:`run_directory`) say what a rerun may find in an existing folder.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import io
import json
import os
import pickle
import stat
import sys
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from ckpred.evaluate import write_json
from ckpred.util import RunDirectory, file_kind, package_versions, resolve_path
from ckpred.errors import InputFileError, MissingFileError, ModelMismatchError
from ckpred.plugins import is_allowed

__all__ = ["RUN_RECORD", "DataRecord", "RunRecord", "TrainRun", "load_train_run", "run_directory", "run_record_path"]

#: The record ``train`` writes into its run directory.
RUN_RECORD = "run.json"
#: The same record's name in runs written before it was renamed; still read.
LEGACY_RUN_RECORD = "manifest.json"


#: Packages whose versions go into the run record.
RECORD_PACKAGES: tuple[str, ...] = ("ckpred", "lightgbm", "scikit-learn", "numpy", "pandas", "pyarrow", "hydra-core",
                                    "omegaconf", "scipy", "dask", "distributed")


@dataclass(kw_only=True)
class DataRecord:
    """What a run trained on: a table in one process (its hash, rows, shapes, valid rows and the
    range of each problem field) or a partitioned dataset (its folder, rows, partitions and
    arch/dtype/layout combos). Fields that do not apply are left out of ``run.json``."""

    rows: int
    hash: str | None = None
    #: The hash without the files' names (:func:`ckpred.data.table.content_hash`): what an
    #: export run from another working directory checks.
    content_hash: str | None = None
    shapes: int | None = None
    valid_rows: int | None = None
    shape_ranges: dict[str, list[Any]] | None = None
    partitioned: str | None = None
    partitions: int | None = None
    combos: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        order = ("hash", "content_hash", "rows", "shapes", "valid_rows", "shape_ranges", "partitioned", "partitions", "combos")
        values = asdict(self)
        return {k: values[k] for k in order if values[k] is not None}


@dataclass(kw_only=True)
class RunRecord:
    """The record ``train`` writes into its run directory (:data:`RUN_RECORD`), whichever backend
    ran it. Readers (``export run_dir=``, warm starts, replay, ``sweep-report``) take it as JSON."""

    op: str
    arch: str
    dtype: str
    layout: str
    model: str
    target: str
    features: str
    #: Output names of the saved pipeline's feature step (empty without a saved pipeline).
    feature_names: list[str]
    input_names: list[str]
    #: The op's kernel catalogue hash for (arch, dtype, layout); None when it has none there.
    catalogue_hash: str | None
    data: DataRecord
    #: The table the folds tested when it is not the training table (``cv=external``).
    test_data: DataRecord | None
    cv: str
    n_folds: int
    seed: int
    #: ``local`` or ``dask`` (``model.backend``).
    backend: str
    heading: str
    families: list[str]
    #: Whether the saved pipeline carries a learned failure model (each fold's: folds.json).
    failure_model: bool
    #: ``file`` and ``sha256`` of the saved pipeline (null without one) and its fit info.
    pipeline: dict[str, Any]
    #: Per method its headline metrics (metrics.json holds the breakdowns).
    metrics: dict[str, dict[str, Any]]
    timings_s: dict[str, float]
    config: dict[str, Any]
    #: The warm start's lineage (:func:`ckpred.warm_start.lineage`); None for a cold start.
    warm_start: dict[str, Any] | None = None
    #: Every fold tested GPUs its training rows do not come from (leave-one-GPU-out, an external
    #: test on another arch): its out-of-fold scores are zero-shot ones.
    zero_shot: bool = False
    #: The candidate set the folds ranked: the op's ``absence``, the tested problems, their
    #: rule-valid (problem, catalogue kernel) pairs and how many had no row
    #: (:class:`ckpred.fitting.Coverage`); None when not looked at (a partitioned dataset).
    candidates: dict[str, Any] | None = None
    command: str = "train"
    created: str = field(default_factory=lambda: datetime.now().astimezone().isoformat(timespec="seconds"))
    versions: dict[str, str] = field(default_factory=lambda: package_versions(RECORD_PACKAGES))
    argv: list[str] = field(default_factory=lambda: list(sys.argv))

    def to_json(self) -> dict[str, Any]:
        """The record as ``run.json`` holds it (``warm_start`` only for a warm start)."""
        out = {f: getattr(self, f) for f in ("command", "created", "op", "arch", "dtype", "layout", "model", "target",
                                             "features", "feature_names", "input_names", "catalogue_hash")}
        out["data"] = self.data.to_json()
        out["test_data"] = self.test_data.to_json() if self.test_data is not None else None
        out.update({f: getattr(self, f) for f in ("cv", "n_folds", "seed", "backend", "heading",
                                                  "families", "failure_model", "pipeline", "metrics", "timings_s",
                                                  "versions", "argv", "config")})
        if self.warm_start is not None:
            out["warm_start"] = self.warm_start
        if self.zero_shot:
            out["zero_shot"] = True
        if self.candidates is not None:
            out["candidates"] = self.candidates
        return out

    def write(self, run_dir: Path) -> Path:
        """Write the record into ``run_dir`` (NaN as null); returns its path."""
        return write_json(Path(run_dir) / RUN_RECORD, self.to_json())


def run_record_path(run_dir: str | Path) -> Path:
    """The run record of a train run directory: ``run.json``, or the ``manifest.json`` of a run
    written before the rename when only that exists."""
    run_dir = Path(run_dir)
    path, legacy = run_dir / RUN_RECORD, run_dir / LEGACY_RUN_RECORD
    return legacy if not path.is_file() and legacy.is_file() else path


def _recorded_train_run(path: Path) -> bool:
    """A train run folder written before run folders were marked: its run record says so."""
    record = run_record_path(path)
    try:
        if not record.is_file() or record.stat().st_size > 1 << 28:
            return False
        data = json.loads(record.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("command") == "train" and isinstance(data.get("created"), str)


def _replay_folder(path: Path) -> bool:
    """A replay folder written before run folders were marked: only ``replay.md``, ``replay.csv``
    (its header ``policy,...``) and ``replay.png``."""
    try:
        names = {p.name for p in path.iterdir()}
        with open(path / "replay.csv", "rb") as fh:
            header = fh.readline(4096)
    except OSError:
        return False
    return names <= {"replay.md", "replay.csv", "replay.png"} and header.startswith(b"policy,")


def run_directory(command: str) -> RunDirectory:
    """The run folder kind of ``command`` (what a rerun into an existing folder may find there)."""
    recognise = {"train": _recorded_train_run, "replay": _replay_folder}.get(command)
    return RunDirectory(command, recognise)


@dataclass(frozen=True)
class TrainRun:
    """A loaded train run: its directory, fitted pipeline, run record (``{}`` if absent) and the
    pipeline file's sha256."""

    path: Path
    pipeline: Any
    sha256: str
    record: dict[str, Any] = field(default_factory=dict)


def load_train_run(run_dir: str | Path, *, purpose: str, require_record: bool) -> TrainRun:
    """Load and verify a train run directory.

    Parameters
    ----------
    run_dir : str or Path
        The run directory (resolved against the original working directory).
    purpose : str
        Who asks (``"export"``, ``"warm_start"``); starts every error message.
    require_record : bool
        Refuse a directory without a run record written by ``train`` (warm starts need its
        lineage). Without it, a run dir holding only ``pipeline.joblib`` is accepted; a record
        that is present is still checked against the pipeline.

    Returns
    -------
    TrainRun

    Raises
    ------
    ckpred.errors.MissingFileError
        When the directory, its pipeline or (``require_record``) its run record is missing.
    ckpred.errors.InputFileError
        When the run record was not written by ``train``.
    ckpred.errors.ModelMismatchError
        When ``pipeline.joblib`` is not the file the run record names (replaced or damaged).
    """
    path = resolve_path(run_dir)
    if not path.is_dir():
        raise MissingFileError(str(path), f"{purpose}: no such directory (expected a train run dir, "
                                          "e.g. runs/train/<time>)")
    pipeline_file = path / "pipeline.joblib"
    record = _train_record(run_record_path(path), purpose, require_record)
    saved: dict[str, Any] = record["pipeline"] if isinstance(record.get("pipeline"), dict) else {}
    _require_pipeline(pipeline_file, record, saved, run_dir, purpose)
    data = _read_bounded(pipeline_file, _PIPELINE_MAX, purpose)  # the bytes hashed are the bytes loaded
    sha = hashlib.sha256(data).hexdigest()
    recorded = saved.get("sha256")
    if (recorded or require_record) and recorded != sha:
        raise ModelMismatchError(f"{purpose}: {pipeline_file}: sha256 {sha} differs from the run record's "
                                 f"{recorded} (the pipeline was replaced or damaged after training)")
    pipeline = load_pipeline(io.BytesIO(data), name=str(pipeline_file), purpose=purpose)
    _check_pipeline(pipeline, str(pipeline_file), purpose)
    return TrainRun(path=path, pipeline=pipeline, sha256=sha, record=record)


def _train_record(record_file: Path, purpose: str, require_record: bool) -> dict[str, Any]:
    """The run record of :func:`load_train_run` (``{}`` when there is none and none is required)."""
    record: dict[str, Any] = {}
    if record_file.is_file():
        record = _read_record(record_file, purpose)
        if require_record and record.get("command") != "train":
            raise InputFileError(str(record_file), f"{purpose}: written by command {record.get('command')!r}, "
                                                   "expected a 'train' run dir")
    elif require_record:
        raise MissingFileError(str(record_file), f"{purpose}: missing; the directory is not a finished train run")
    return record


def _require_pipeline(pipeline_file: Path, record: dict[str, Any], saved: dict[str, Any], run_dir: str | Path,
                      purpose: str) -> None:
    """Refuse a run directory without its fitted pipeline, saying why it has none."""
    path = pipeline_file.parent
    if record.get("command") == "train" and "sha256" in saved and saved["sha256"] is None:
        # a pipeline.joblib beside it is an earlier run's, left in the reused run folder
        raise MissingFileError(str(pipeline_file), f"{purpose}: no fitted pipeline in {run_dir} (the run was trained "
                                                   "with save_pipeline=false; rerun it with save_pipeline=true)")
    if not pipeline_file.is_file():
        if record.get("command") == "train" or (path / "metrics.json").is_file():
            why = "the run was trained with save_pipeline=false; rerun it with save_pipeline=true"
        else:  # e.g. the folder Hydra made for a run that failed before writing anything
            logs = sorted(p.name for p in path.glob("*.log"))
            why = (f"{run_dir} is not a finished train run: it holds no run record, metrics or pipeline (the run "
                   f"failed or is still running{'; see ' + logs[0] if logs else ''})")
        raise MissingFileError(str(pipeline_file), f"{purpose}: no fitted pipeline in {run_dir} ({why})")


def _check_pipeline(pipeline: object, name: str, purpose: str) -> None:
    """Refuse what ``train`` does not save: anything but a ``features -> model`` Pipeline without
    a cache folder (``memory``, where fitting would write)."""
    # lazy: scikit-learn and ckpred.transfer (the fitting stack) cost ~1.5 s; only a loaded pipeline needs them
    from sklearn.pipeline import Pipeline

    from ckpred.transfer import TransferModel  # lazy: as above

    if isinstance(pipeline, TransferModel):  # a zero-shot run's recipe: its learner is the pipeline
        _check_pipeline(pipeline.learner, name, purpose)
        return
    raw = getattr(pipeline, "steps", None) if isinstance(pipeline, Pipeline) else None
    steps = [s[0] if isinstance(s, tuple) and s else None for s in raw] if isinstance(raw, list) else []
    if steps != ["features", "model"] or getattr(pipeline, "memory", None) is not None:
        what = f"steps {steps}" if isinstance(pipeline, Pipeline) else f"an object of type {type(pipeline).__name__}"
        raise InputFileError(name, f"{purpose}: not a pipeline train saved ({what}; expected a scikit-learn "
                                   "Pipeline of the steps 'features' and 'model', without memory)")


#: The largest run record and pipeline read (a default train's pipeline is a few MB).
_RECORD_MAX, _PIPELINE_MAX = 256 << 20, 2 << 30


def _read_bounded(path: Path, limit: int, purpose: str) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``); anything else is refused by name."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(str(path), f"{purpose}: it is {file_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise InputFileError(str(path), f"{purpose}: {info.st_size:,} bytes, more than the {limit:,} read")
        with open(path, "rb") as fh:
            return fh.read(limit + 1)[:limit]
    except OSError as exc:
        if isinstance(exc, InputFileError):
            raise
        raise InputFileError(str(path), f"{purpose}: cannot read it ({exc.strerror or exc})") from None


def _read_record(path: Path, purpose: str) -> dict[str, Any]:
    """A run record: a JSON object, else a one-line error naming the file."""
    try:
        record = json.loads(_read_bounded(path, _RECORD_MAX, purpose))
    except (ValueError, RecursionError) as exc:
        raise InputFileError(str(path), f"{purpose}: not a run record ckpred wrote (not JSON: {exc})") from None
    if not isinstance(record, dict):
        raise InputFileError(str(path), f"{purpose}: not a run record ckpred wrote (a JSON {type(record).__name__}, "
                                        "not an object)")
    return record


# -- the pickled pipeline -------------------------------------------------------------------------
# pipeline.joblib is a pickle, and unpickling calls whatever the file names: a forged run folder
# could run any code when loaded. So it is read by an unpickler that looks up only the classes
# and functions a ckpred pipeline is made of (PIPELINE_GLOBALS, and feature-group classes of
# modules ckpred may import) and refuses anything else by name before it is imported or called.

#: Every global a pickled ckpred pipeline names, as (module, name): found by loading the pipelines
#: of every model, target, feature set, op and backend the tests and the default train produce.
#: Classes and the reconstructors pickle, numpy, pandas and scikit-learn use for them; nothing that
#: reaches the file system, a shell or an import (``builtins.getattr``, ``os``, ``numpy.load``...).
PIPELINE_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    # the pipeline and its steps
    ("sklearn.pipeline", "Pipeline"), ("sklearn.pipeline", "FeatureUnion"),
    ("sklearn.compose._target", "TransformedTargetRegressor"),
    ("ckpred.models", "Log1pTarget"), ("ckpred.models", "IdentityTarget"),
    ("lightgbm.sklearn", "LGBMRanker"), ("lightgbm.sklearn", "LGBMRegressor"),
    ("lightgbm.basic", "Booster"), ("lightgbm.basic", "_InnerPredictor"),
    # arrays (joblib stores their bytes beside the pickle), numpy scalars and dtypes
    ("joblib.numpy_pickle", "NumpyArrayWrapper"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    # containers the estimators keep
    ("collections", "OrderedDict"), ("collections", "defaultdict"),
    # a zero-shot run's transfer recipe: the learner's method with its recipe and configs (the
    # schema's dataclasses, see _config_class; OmegaConf nodes of them in runs of older versions)
    # and the static order (a pandas Series of text keys)
    ("ckpred.transfer", "TransferModel"), ("ckpred.fitting", "LearnedMethod"), ("ckpred.models", "Recipe"),
    ("omegaconf.base", "ContainerMetadata"), ("omegaconf.base", "Metadata"),
    ("omegaconf.dictconfig", "DictConfig"), ("omegaconf.listconfig", "ListConfig"),
    ("omegaconf.nodes", "AnyNode"), ("omegaconf.nodes", "BooleanNode"), ("omegaconf.nodes", "FloatNode"),
    ("omegaconf.nodes", "IntegerNode"), ("omegaconf.nodes", "StringNode"), ("omegaconf.nodes", "EnumNode"),
    ("typing", "Any"), ("typing", "Dict"), ("typing", "List"), ("typing", "Optional"), ("typing", "Union"),
    ("pandas", "Series"), ("pandas", "Index"), ("pandas", "StringDtype"), ("pandas.arrays", "ArrowStringArray"),
    ("pandas.core.indexes.base", "_new_Index"), ("pandas.core.internals.managers", "SingleBlockManager"),
    ("pyarrow.lib", "_restore_array"), ("pyarrow.lib", "py_buffer"), ("pyarrow.lib", "type_for_alias"),
    # value constructors (no attribute access, no I/O: builtins.getattr and eval stay refused)
    ("builtins", "bool"), ("builtins", "int"), ("builtins", "float"), ("builtins", "str"),
    ("builtins", "bytearray"), ("builtins", "list"), ("builtins", "dict"), ("builtins", "slice"),
    ("_operator", "getitem"),
})

#: Modules whose config dataclasses a pickled recipe may name (the schema's structured configs).
_CONFIG_MODULES = ("ckpred.schema", "ckpred.schema.arch", "ckpred.schema.op", "ckpred.schema.data",
                   "ckpred.schema.train", "ckpred.schema.commands", "ckpred.cv.schemes")

#: Module prefixes numpy renamed (numpy 2 moved ``numpy.core`` to ``numpy._core``): a pipeline
#: pickled under either is read.
_NUMPY_RENAMES = (("numpy.core.", "numpy._core."), ("numpy._core.", "numpy.core."))


def _allowed_global(module: str, name: str) -> bool:
    if (module, name) in PIPELINE_GLOBALS:
        return True
    return any(module.startswith(a) and (b + module[len(a):], name) in PIPELINE_GLOBALS for a, b in _NUMPY_RENAMES)


def _feature_group_class(module: str, name: str) -> Any:
    """A feature group class (:class:`ckpred.features.base.FeatureGroup`) of a module ckpred may
    import (its own, or a plug-in the user installed or allowed: :mod:`ckpred.plugins`); None
    otherwise, the module not imported."""
    # lazy: ckpred.features.base pulls scikit-learn (~1.5 s); only unpickling a pipeline needs it
    from ckpred.features.base import FeatureGroup

    if not name.isidentifier() or not is_allowed(module):
        return None
    try:
        obj = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return obj if isinstance(obj, type) and issubclass(obj, FeatureGroup) else None


def _config_class(module: str, name: str) -> Any:
    """A config dataclass of the schema (:data:`_CONFIG_MODULES`, ckpred's own modules); None
    otherwise, nothing imported."""
    if module not in _CONFIG_MODULES or not name.isidentifier():
        return None
    obj = getattr(importlib.import_module(module), name, None)
    return obj if isinstance(obj, type) and is_dataclass(obj) else None


class PipelineRefused(InputFileError):
    """A pickled pipeline names a global no ckpred pipeline holds (see :func:`load_pipeline`)."""


class _Restricted:
    """``find_class`` of the pipeline unpicklers: only what a ckpred pipeline names."""

    source, purpose = "", "load"

    def find_class(self, module: str, name: str) -> Any:
        if _allowed_global(module, name):
            return super().find_class(module, name)  # type: ignore[misc]
        found = _feature_group_class(module, name) or _config_class(module, name)
        if found is not None:
            return found
        raise PipelineRefused(self.source, f"{self.purpose}: it names {module}.{name}, which no ckpred pipeline "
                                           "holds; a pickle runs what it names, so it was neither imported nor "
                                           "called and the pipeline was not loaded (load only pipelines ckpred "
                                           "wrote)")


def _pipeline_unpickler() -> type:
    """The joblib unpickler (arrays stored beside the pickle stream) with :class:`_Restricted`'s
    ``find_class``; built on first use so importing this module does not import joblib's internals."""
    global _UNPICKLER
    if _UNPICKLER is not None:
        return _UNPICKLER
    # lazy: joblib's pickle internals (~0.1 s) only loading a pipeline needs
    from joblib.numpy_pickle import NumpyArrayWrapper, NumpyUnpickler

    class _ObjectArrayUnpickler(_Restricted, pickle._Unpickler):
        """The nested pickle of an array of Python objects, restricted the same way (joblib
        before 1.5 read it with an unrestricted ``pickle.load``)."""

    class _Unpickler(_Restricted, NumpyUnpickler):
        dispatch = NumpyUnpickler.dispatch.copy()

        def load_build(self) -> None:
            pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]
            wrapper = self.stack[-1]
            if not isinstance(wrapper, NumpyArrayWrapper):
                return
            self.stack.pop()
            if wrapper.dtype.hasobject:
                inner = _ObjectArrayUnpickler(self.file_handle)
                inner.source, inner.purpose = self.source, self.purpose
                self.stack.append(inner.load())
            elif "ensure_native_byte_order" in inspect.signature(wrapper.read).parameters:
                self.stack.append(wrapper.read(self, True))
            else:  # joblib before 1.4
                self.stack.append(wrapper.read(self))

        dispatch[pickle.BUILD[0]] = load_build

    _UNPICKLER = _Unpickler
    return _Unpickler


_UNPICKLER: type | None = None


def load_pipeline(source: str | Path | BinaryIO, *, name: str | None = None, purpose: str = "load") -> Any:
    """Load a ``pipeline.joblib`` that ``train`` wrote, running no code the file names.

    The file is unpickled by joblib's unpickler restricted to :data:`PIPELINE_GLOBALS` and the
    feature-group classes of modules ckpred may import (its own; plug-ins the user installed or
    allowed, :mod:`ckpred.plugins`): a pickle that names anything else (``os.system``, a module
    in the working directory) is refused by that name before it is imported or called.

    Parameters
    ----------
    source : path or binary file
        The file (compressed or not, as ``joblib.dump`` wrote it).
    name : str, optional
        The file's name in errors (default: ``source``).
    purpose : str, default="load"
        Who asks (``"export"``, ``"warm_start"``); starts every error message.

    Raises
    ------
    PipelineRefused
        When the pickle names a global outside the allowed set.
    ckpred.errors.InputFileError
        When the file is not a pipeline joblib wrote (damaged, another format).
    """
    from joblib.compressor import BinaryGzipFile, BinaryZlibFile  # lazy: as in _pipeline_unpickler

    label = name or str(source)
    fh = open(source, "rb") if isinstance(source, (str, Path)) else source
    try:
        head = fh.read(2)
        fh.seek(0)
        if head[:1] == b"\x78":  # zlib, what train writes (compress=3)
            stream: Any = BinaryZlibFile(fh, "rb")
        elif head == b"\x1f\x8b":
            stream = BinaryGzipFile(fh, "rb")
        elif head[:1] == b"\x80":  # an uncompressed pickle
            stream = fh
        else:
            raise InputFileError(label, f"{purpose}: not a pipeline joblib wrote (it starts with {head!r}; "
                                        "expected a zlib, gzip or plain pickle stream)")
        unpickler = _pipeline_unpickler()
        params = inspect.signature(unpickler).parameters  # its __init__'s, without self
        args = (label, stream, True) if "ensure_native_byte_order" in params else (label, stream)
        reader = unpickler(*args)
        reader.source, reader.purpose = label, purpose
        try:
            return reader.load()
        except InputFileError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a damaged or foreign stream raises
            raise InputFileError(label, f"{purpose}: not a pipeline ckpred can load ({type(exc).__name__}: "
                                        f"{str(exc)[:200]})") from None
    finally:
        if fh is not source:
            fh.close()
