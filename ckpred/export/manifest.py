"""The export manifest (``manifest.json``) and atomic writing of an export directory.

The manifest binds the ``.onnx`` files to what they were made for and from: op, arch, dtype,
layout, opset, the graphs' input/output names and order, the kernel catalogue (id -> name and
fields) with its hash, feature names, target transform, the training data's hash and the
problem ranges seen in training, CV metrics when known, package versions and the sha256 of
every ``.onnx``. The same content (minus the file hashes, which cannot name themselves) is
written into each model's ``metadata_props`` under ``ckpred.manifest``.

An export directory is written next to its final place and swapped in with one atomic
``renameat2(RENAME_EXCHANGE)`` (or, where the filesystem lacks it, two renames), so readers see
either the previous complete export or the new complete one; an interrupted export leaves the
previous one untouched and removes its temporary directory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ckpred.errors import MissingFileError, ModelMismatchError
from ckpred.data.table import data_hash
from ckpred.kernels.base import OpDefinition
from ckpred.util import package_versions as _package_versions
from ckpred.util import sha256_file

FORMAT = "ckpred.export/1"
MANIFEST = "manifest.json"
SELECTOR_FILE = "model.onnx"
SCORER_FILE = "scorer.onnx"
#: Packages whose versions the manifest records.
PACKAGES = ("ckpred", "numpy", "pandas", "scikit-learn", "lightgbm", "onnx", "onnxruntime", "skl2onnx",
            "onnxmltools", "protobuf")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def package_versions() -> dict[str, str]:
    """Versions of :data:`PACKAGES` (see :func:`ckpred.util.package_versions`)."""
    return _package_versions(PACKAGES)


def _json_value(value: Any) -> Any:
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def catalogue_section(op: OpDefinition, catalogue: pd.DataFrame) -> dict[str, Any]:
    """The catalogue as ``{hash, count, columns, rows}`` (rows in kernel_id order)."""
    columns = ["kernel_id", "kernel_name", *op.kernel_names]
    rows = [[_json_value(v) for v in row] for row in catalogue[columns].itertuples(index=False, name=None)]
    return {"hash": op.catalogue_hash(catalogue), "count": len(catalogue), "columns": columns, "rows": rows}


def catalogue_frame(section: Mapping[str, Any]) -> pd.DataFrame:
    """Inverse of :func:`catalogue_section`."""
    return pd.DataFrame(section["rows"], columns=section["columns"])


def fields_section(fields: Any) -> list[dict[str, Any]]:
    return [{"name": f.name, "kind": f.kind, "categories": list(f.categories),
             "default": _json_value(f.default)} for f in fields]


def training_section(table: pd.DataFrame, op: OpDefinition, **extra: Any) -> dict[str, Any]:
    """Hash, size and per-field problem ranges of the training table.

    The hash is :func:`ckpred.data.table.data_hash` of the table, the same value ``train``
    records in its run manifest (``data.hash``), so an export can be tied to the run it came from.
    """
    problems = table[list(op.problem_names)].drop_duplicates()
    ranges = {name: [int(problems[name].min()), int(problems[name].max())] for name in op.problem_names}
    return {
        "data_hash": data_hash(table.reset_index(drop=True)),
        "rows": int(len(table)),
        "shapes": int(len(problems)),
        "problem_ranges": ranges,
        **extra,
    }


def graph_io(op: OpDefinition, catalogue_size: int) -> dict[str, Any]:
    """Names, types, shapes and column order of both graphs' inputs and outputs."""
    p, k = list(op.problem_names), list(op.kernel_names)
    return {
        "selector": {
            "file": SELECTOR_FILE,
            "inputs": [
                {"name": "problem", "dtype": "int64", "shape": ["B", len(p)], "columns": p},
                {"name": "top_k", "dtype": "int64", "shape": [1]},
            ],
            "outputs": [
                {"name": "kernel_ids", "dtype": "int64", "shape": ["B", f"min(top_k,{catalogue_size})"]},
                {"name": "scores", "dtype": "float64", "shape": ["B", f"min(top_k,{catalogue_size})"]},
                {"name": "num_valid", "dtype": "int64", "shape": ["B"]},
            ],
        },
        "scorer": {
            "file": SCORER_FILE,
            "inputs": [
                {"name": "problem", "dtype": "int64", "shape": ["N", len(p)], "columns": p},
                {"name": "kernel", "dtype": "int64", "shape": ["N", len(k)], "columns": k},
            ],
            "outputs": [{"name": "score", "dtype": "float64", "shape": ["N"]}],
        },
    }


def metadata_payload(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The ``metadata_props`` of each model: the manifest without ``files`` plus quick keys."""
    body = {k: v for k, v in manifest.items() if k != "files"}
    return {
        "ckpred.format": FORMAT,
        "ckpred.op": manifest["op"], "ckpred.arch": manifest["arch"], "ckpred.dtype": manifest["dtype"],
        "ckpred.layout": manifest["layout"], "ckpred.catalogue_hash": manifest["catalogue"]["hash"],
        "ckpred.manifest": json.dumps(body, sort_keys=True, separators=(",", ":")),
    }


def now_utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- atomic directory write ----------------------------------------------------------------------
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


def write_export_dir(out_dir: str | Path, files: Mapping[str, bytes]) -> Path:
    """Write ``files`` (name -> bytes; ``manifest.json`` last) as directory ``out_dir``, atomically.

    The files go to a temporary sibling directory, are fsynced, and the directory is swapped in.
    On any error the temporary directory is removed and a previous ``out_dir`` is untouched.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        ordered = sorted(files, key=lambda n: n == MANIFEST)  # manifest last
        for name in ordered:
            with open(tmp / name, "wb") as fh:
                fh.write(files[name])
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o755)
        if out_dir.exists():
            if _exchange(tmp, out_dir):
                shutil.rmtree(tmp)  # tmp now holds the previous export
            else:
                old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
                old.rmdir()
                os.rename(out_dir, old)
                os.rename(tmp, out_dir)
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


# -- reading and verifying -----------------------------------------------------------------------
def read_manifest(model_dir: str | Path) -> dict[str, Any]:
    """Load ``manifest.json`` of an export directory, checking its format."""
    path = Path(model_dir) / MANIFEST
    if not path.is_file():
        raise MissingFileError(str(path), f"no manifest; is {model_dir} an export directory "
                                          "(python -m ckpred export ...)?")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelMismatchError(f"{path}: not valid JSON ({exc})") from exc
    if manifest.get("format") != FORMAT:
        raise ModelMismatchError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def verify_files(model_dir: str | Path, manifest: Mapping[str, Any]) -> None:
    """Check every file listed in the manifest against its sha256.

    Raises
    ------
    ckpred.errors.ModelMismatchError
        Naming the file and both hashes when one differs, or a missing file.
    """
    for name, info in manifest.get("files", {}).items():
        path = Path(model_dir) / name
        if not path.is_file():
            raise ModelMismatchError(f"{path}: listed in the manifest but missing")
        digest = sha256_file(path)
        if digest != info["sha256"]:
            raise ModelMismatchError(f"{path}: sha256 {digest} does not match the manifest's {info['sha256']} "
                                     "(file modified or replaced after export)")
