"""The export manifest (``manifest.json``) and atomic writing of an export directory.

The manifest binds the ``.onnx`` files to what they were made for and from: op, arch, dtype,
layout, opset, the graphs' input/output names and order, the kernel catalogue (id -> name and
fields) with its hash, feature names, target transform, the training data's hash, the
problem ranges seen in training and each problem field's minimum, CV metrics when known,
package versions and the sha256 of every ``.onnx``. The same content (minus the file hashes, which cannot name themselves) is
written into each model's ``metadata_props`` under ``ckpred.manifest``.

An export directory is written next to its final place and swapped in with one atomic
``renameat2(RENAME_EXCHANGE)`` (or, where the filesystem lacks it, two renames;
:func:`ckpred.util.atomic_dir`), so readers see
either the previous complete export or the new complete one; an interrupted export leaves the
previous one untouched and removes its temporary directory.

Reading is strict (:func:`read_manifest`, :func:`check_manifest`): both runtimes refuse a
manifest whose keys they read are missing or of the wrong type, naming the key.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import math
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NoReturn, Sequence, TypeGuard

import numpy as np
import pandas as pd

from ckpred.data.table import data_hash
from ckpred.errors import InputFileError, MissingFileError, ModelMismatchError, OutputPathError
from ckpred.kernels.base import Field, OpDefinition
from ckpred.util import package_versions as _package_versions
from ckpred.util import OwnDirectory, atomic_dir, sha256_file

FORMAT = "ckpred.export/1"
MANIFEST = "manifest.json"
#: An export directory as ckpred writes it: the manifest and the ONNX graphs it lists. An
#: existing directory at an export's place is replaced only when it is one (or empty); a
#: symlink there is followed (``exports/current -> exports/v3``).
EXPORT_DIR = OwnDirectory("an export directory ckpred wrote", MANIFEST, re.compile(r"[\w.-]+\.onnx"),
                          follow_symlink=True)
SELECTOR_FILE = "model.onnx"
SCORER_FILE = "scorer.onnx"
#: Selector output saying, per problem, that the applicability mask left no kernel and the
#: answer ranks the rule-valid kernels instead (:mod:`ckpred.export.validity`).
APPLICABILITY_FALLBACK = "applicability_fallback"
#: Optional selector outputs, bool ``[B]``, present when a mask builder makes them.
SELECTOR_FLAGS: tuple[str, ...] = (APPLICABILITY_FALLBACK,)
#: Packages whose versions the manifest records.
PACKAGES = ("ckpred", "numpy", "pandas", "scikit-learn", "lightgbm", "onnx", "onnxruntime", "skl2onnx",
            "onnxmltools", "protobuf")


def export_name(op: str, arch: str, dtype: str, layout: str) -> str:
    """Directory name of an export: ``<op>_<arch>_<dtype>_<layout>``."""
    return f"{op}_{arch}_{dtype}_{layout}"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def package_versions() -> dict[str, str]:
    """Versions of :data:`PACKAGES` (see :func:`ckpred.util.package_versions`)."""
    return _package_versions(PACKAGES)


def _json_value(value: object) -> object:
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


def fields_section(fields: Iterable[Field]) -> list[dict[str, Any]]:
    return [{"name": f.name, "kind": f.kind, "categories": list(f.categories),
             "default": _json_value(f.default)} for f in fields]


def training_section(table: pd.DataFrame, op: OpDefinition, *, arch: Any = None, dtype: Any = None,
                     layout: Any = None, **extra: Any) -> dict[str, Any]:
    """Hash, size, per-field problem ranges and problem minima of the training table.

    The hash is :func:`ckpred.data.table.data_hash` of the table, the same value ``train``
    records in its run manifest (``data.hash``), so an export can be tied to the run it came from.
    ``problem_ranges`` (``[min, max]`` of each int problem field over the training shapes) is
    what both runtimes flag problems outside of (out of distribution). ``problem_minimum``
    (see :func:`problem_minimum`) needs the arch/dtype/layout, taken from the arguments or
    else from the table's own ``arch``/``dtype``/``layout`` columns; without them it is left
    out and the runtimes only refuse negative values.
    """
    problems = table[list(op.problem_names)].drop_duplicates()
    ranges = {f.name: [int(problems[f.name].min()), int(problems[f.name].max())]
              for f in op.problem_fields if f.kind == "int"}
    section: dict[str, Any] = {
        "data_hash": data_hash(table.reset_index(drop=True)),
        "rows": int(len(table)),
        "shapes": int(len(problems)),
        "problem_ranges": ranges,
    }
    if "arch" in table.columns:  # the GPUs trained on: a runtime on another one is zero-shot
        section["archs"] = sorted(str(a) for a in table["arch"].unique())
    given = {"arch": arch, "dtype": dtype, "layout": layout}
    for key, value in given.items():
        if value is None and key in table.columns and table[key].nunique() == 1:
            given[key] = str(table[key].iloc[0])
    if all(v is not None for v in given.values()):
        section["problem_minimum"] = problem_minimum(table, op, **given)
    return {**section, **extra}


def problem_minimum(table: pd.DataFrame, op: OpDefinition, *, arch: Any, dtype: Any, layout: Any,
                    probes: int = 8, kernels: int = 512) -> dict[str, int]:
    """Smallest value each int problem field may take at selection: 0 or 1.

    A field is 1 when the op's own validity rules accept no kernel of the table for any of
    ``probes`` training problems with that field set to 0 (an empty GEMM dimension, a zero
    stride), else 0 (a zero padding). The runtimes refuse a value below it (and any negative
    value) with a named error instead of answering "no kernel".
    """
    valid_rows = table[table["is_valid"].astype(bool)] if "is_valid" in table.columns else table
    if valid_rows.empty:
        valid_rows = table
    problems = valid_rows[list(op.problem_names)].drop_duplicates().head(probes).reset_index(drop=True)
    cat = valid_rows[list(op.kernel_names)].drop_duplicates().head(kernels).reset_index(drop=True)
    out = {}
    for f in op.problem_fields:
        if f.kind != "int":
            continue
        rows = problems.assign(**{f.name: 0}).merge(cat, how="cross")
        valid, _ = op.validity(rows, rows, arch=arch, dtype=dtype, layout=layout)
        out[f.name] = 0 if np.asarray(valid, dtype=bool).any() else 1
    return out


def graph_io(op: OpDefinition, catalogue_size: int, flags: Sequence[str] = ()) -> dict[str, Any]:
    """Names, types, shapes and column order of both graphs' inputs and outputs; ``flags`` are the
    selector's optional bool ``[B]`` outputs (``applicability_fallback``)."""
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
                *({"name": name, "dtype": "bool", "shape": ["B"]} for name in flags),
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
def write_export_dir(out_dir: str | Path, files: Mapping[str, bytes]) -> Path:
    """Write ``files`` (name -> bytes; ``manifest.json`` last) as directory ``out_dir``, atomically.

    The files are written and fsynced into a temporary sibling directory that is swapped in
    (:func:`ckpred.util.atomic_dir`): on any error a previous ``out_dir`` is untouched. A
    symlink ``out_dir`` is followed on purpose: the export replaces the directory it points to
    (at that directory's place) and the link stays, so a stable path such as
    ``exports/current -> exports/v3`` keeps working. Concurrent writers each swap in a
    complete export (the last one stays). A directory at ``out_dir`` that is not an export
    (:data:`EXPORT_DIR`: other files, sub-directories) is refused, never replaced.
    """
    with atomic_dir(out_dir, EXPORT_DIR) as tmp:
        try:
            for name in sorted(files, key=lambda n: n == MANIFEST):  # manifest last
                with open(tmp / name, "wb") as fh:
                    fh.write(files[name])
                    fh.flush()
                    os.fsync(fh.fileno())
        except OSError as exc:  # an fsync failure (EIO...) names no file: the export's place is the culprit
            raise OutputPathError(str(out_dir), exc.strerror or str(exc)) from None
    return Path(out_dir).resolve() if Path(out_dir).is_symlink() else Path(out_dir)


# -- reading and verifying -----------------------------------------------------------------------
#: Kinds a manifest field may declare (the op's :class:`ckpred.kernels.base.Field` kinds).
FIELD_KINDS = ("int", "float", "bool", "category")
#: Kinds a problem field may have: the selector graph's ``problem`` input is int64.
PROBLEM_KINDS = ("int", "bool", "category")
#: Largest int64: problem values, counts and ids beyond it cannot be graph inputs.
INT64_MAX = 2**63 - 1
_HEX64 = frozenset("0123456789abcdef")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return _is_int(value) or (type(value) is float and math.isfinite(value))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def read_manifest(model_dir: str | Path) -> dict[str, Any]:
    """Load ``manifest.json`` of an export directory and check its structure (:func:`check_manifest`).

    Raises
    ------
    ckpred.errors.MissingFileError
        No ``manifest.json`` in ``model_dir``.
    ckpred.errors.ModelMismatchError
        The file is not UTF-8, not JSON, not a ckpred export manifest, or a key the runtimes
        read is missing or has the wrong type/value; the message names the file and the key.
    """
    path = Path(model_dir) / MANIFEST
    if not path.is_file():
        raise MissingFileError(str(path), f"no manifest; is {model_dir} an export directory "
                                          "(python -m ckpred export ...)?")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputFileError(str(path), exc.strerror or str(exc)) from exc
    return parse_manifest(data, path)


def parse_manifest(data: bytes, path: str | Path = MANIFEST) -> dict[str, Any]:
    """The manifest in ``data`` (the bytes of ``path``): UTF-8, strict JSON, :func:`check_manifest`.

    Raises
    ------
    ckpred.errors.ModelMismatchError
        As :func:`read_manifest`.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelMismatchError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    try:
        manifest = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ModelMismatchError(f"{path}: not valid JSON ({exc})") from exc
    check_manifest(manifest, path)
    return manifest


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``): a message stays one line."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class _Checker:
    """Type checks of one manifest, each failure a ModelMismatchError naming file and key."""

    def __init__(self, path: builtins.str | Path) -> None:
        self.path = path

    def fail(self, key: builtins.str, value: object, allowed: builtins.str) -> NoReturn:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ModelMismatchError(f"{self.path}: key '{printable(key)}' is {shown}; expected {printable(allowed)}")

    def get(self, obj: Mapping[builtins.str, Any], key: builtins.str, where: builtins.str) -> Any:
        if key not in obj:
            raise ModelMismatchError(f"{self.path}: key '{printable(where + key)}' is missing")
        return obj[key]

    def dict(self, value: object, key: builtins.str) -> Mapping[builtins.str, Any]:
        if not isinstance(value, dict):
            self.fail(key, value, "an object")
        return value

    def list(self, value: object, key: builtins.str, *, nonempty: bool = False) -> builtins.list[Any]:
        if not isinstance(value, list) or (nonempty and not value):
            self.fail(key, value, "a non-empty array" if nonempty else "an array")
        return value

    def str(self, value: object, key: builtins.str) -> builtins.str:
        if not isinstance(value, str) or not value:
            self.fail(key, value, "a non-empty string")
        return value

    def int(self, value: object, key: builtins.str, lo: builtins.int = 0, hi: builtins.int = INT64_MAX) -> builtins.int:
        if not _is_int(value) or not lo <= value <= hi:
            self.fail(key, value, f"an integer in [{lo}, {hi}]")
        return value

    def file_name(self, value: object, key: builtins.str) -> builtins.str:
        name = self.str(value, key)
        if "/" in name or "\\" in name or name in (".", "..") or not name.isprintable():
            self.fail(key, value, "a file name inside the export directory (no path separators)")
        return name

    def sha256(self, value: object, key: builtins.str) -> builtins.str:
        if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX64:
            self.fail(key, value, "a sha256 (64 lowercase hex digits)")
        return value

    def fields(self, value: object, key: builtins.str, kinds: tuple[builtins.str, ...] = FIELD_KINDS
               ) -> builtins.list[builtins.dict[builtins.str, Any]]:
        fields = self.list(value, key, nonempty=True)
        names = []
        for i, f in enumerate(fields):
            where = f"{key}[{i}]"
            self.dict(f, where)
            names.append(self.str(self.get(f, "name", where + "."), where + ".name"))
            kind = self.get(f, "kind", where + ".")
            if kind not in kinds:
                self.fail(where + ".kind", kind, f"one of {list(kinds)}")
            cats = self.list(f.get("categories", []), where + ".categories")
            if kind == "category" and (not cats or not all(isinstance(c, str) for c in cats)):
                self.fail(where + ".categories", cats, "a non-empty array of strings")
            default = f.get("default")
            if default is not None:
                ok = {"int": _is_int(default) and -INT64_MAX - 1 <= default <= INT64_MAX,
                      "float": _is_number(default), "bool": isinstance(default, bool),
                      "category": default in cats}[kind]
                if not ok:
                    self.fail(where + ".default", default, f"null or a value of kind {kind}")
        if len(set(names)) != len(names):
            self.fail(key, names, "distinct field names")
        return fields


def check_manifest(manifest: object, path: str | Path = MANIFEST) -> None:
    """Check the structure of a parsed manifest: every key a runtime reads, with its type.

    Both runtimes (this package and ``scripts/cpp/ckpred_select.cpp``) check the same: the
    format; ``op``/``arch``/``dtype``/``layout`` strings; the selector graph's file (a plain
    file name with a sha256 in ``files``) and input/output names; the problem and kernel
    fields; the catalogue (``count`` rows of one value per column, ``kernel_id`` 0..n-1 in
    order, each value of its field's kind: int, float, bool or category string); ``selection``'s
    candidate ids; the training ranges and problem minima.

    Raises
    ------
    ckpred.errors.ModelMismatchError
        Naming ``path``, the key (``catalogue.rows[3][1]``), its value and what is expected.
    """
    c = _Checker(path)
    manifest = c.dict(manifest, "(top level)")
    fmt = manifest.get("format")
    if fmt != FORMAT:
        raise ModelMismatchError(f"{path}: format {fmt!r}, expected {FORMAT!r}")
    for key in ("op", "arch", "dtype", "layout"):
        c.str(c.get(manifest, key, ""), key)
    if not manifest["op"].isidentifier():  # the Python runtime imports ckpred.kernels.<op>, nothing else
        c.fail("op", manifest["op"], "an op name (a Python identifier such as 'gemm_universal')")
    _check_graph_files(c, manifest)
    problem = c.fields(c.get(manifest, "problem_fields", ""), "problem_fields", PROBLEM_KINDS)
    kernel = c.fields(c.get(manifest, "kernel_fields", ""), "kernel_fields")
    count = _check_catalogue(c, manifest, kernel)
    selection = manifest.get("selection")
    if selection is not None:
        c.dict(selection, "selection")
        ids = selection.get("candidate_ids")
        if ids is not None:
            c.list(ids, "selection.candidate_ids", nonempty=True)
            if not all(_is_int(v) and 0 <= v < count for v in ids) or len(set(ids)) != len(ids):
                c.fail("selection.candidate_ids", ids, f"distinct kernel ids in [0, {count})")
    training = manifest.get("training")
    if training is not None:
        _check_training(c, training, {f["name"]: f for f in problem})


def _check_graph_files(c: _Checker, manifest: Mapping[str, Any]) -> None:
    """:func:`check_manifest` of ``graphs.selector`` (file, input/output names) and ``files``."""
    graphs = c.dict(c.get(manifest, "graphs", ""), "graphs")
    selector = c.dict(c.get(graphs, "selector", "graphs."), "graphs.selector")
    sel_file = c.file_name(c.get(selector, "file", "graphs.selector."), "graphs.selector.file")
    for io in ("inputs", "outputs"):
        for i, item in enumerate(c.list(c.get(selector, io, "graphs.selector."), f"graphs.selector.{io}")):
            where = f"graphs.selector.{io}[{i}]"
            c.str(c.get(c.dict(item, where), "name", where + "."), where + ".name")
    files = c.dict(c.get(manifest, "files", ""), "files")
    for name, info in files.items():
        c.file_name(name, "files")
        c.sha256(c.get(c.dict(info, f"files.{name}"), "sha256", f"files.{name}."), f"files.{name}.sha256")
    if sel_file not in files:
        c.fail("files", sorted(files), f"an entry for the selector file {sel_file!r}")


#: A catalogue column's check: (is cell ``v`` of row ``i`` valid, what is allowed in row ``i``).
_CellCheck = tuple[Callable[[int, Any], bool], Callable[[int], str]]


def _column_checks(kernel: list[dict[str, Any]]) -> list[_CellCheck]:
    """One check per catalogue column: ``kernel_id``, ``kernel_name``, then each kernel field."""
    checks: list[_CellCheck] = [
        (lambda i, v: type(v) is int and v == i, lambda i: f"{i} (kernel ids are 0..n-1 in row order)"),
        (lambda i, v: type(v) is str and v != "", lambda i: "a kernel name"),
    ]
    for f in kernel:
        if f["kind"] == "int":
            checks.append((lambda i, v: type(v) is int and -INT64_MAX - 1 <= v <= INT64_MAX, lambda i: "an integer"))
        elif f["kind"] == "float":
            checks.append((lambda i, v: _is_number(v), lambda i: "a finite number"))
        elif f["kind"] == "bool":
            checks.append((lambda i, v: type(v) is bool, lambda i: "true or false"))
        else:
            checks.append(_category_check(frozenset(f.get("categories", ()))))
    return checks


def _category_check(allowed: frozenset[str]) -> _CellCheck:
    """The check of a category column: one of ``allowed``."""
    return (lambda i, v: type(v) is str and v in allowed, lambda i: f"one of {sorted(allowed)}")


def _check_catalogue(c: _Checker, manifest: Mapping[str, Any], kernel: list[dict[str, Any]]) -> int:
    """:func:`check_manifest` of ``catalogue``; returns its ``count``."""
    cat = c.dict(c.get(manifest, "catalogue", ""), "catalogue")
    c.sha256(c.get(cat, "hash", "catalogue."), "catalogue.hash")
    count = c.int(c.get(cat, "count", "catalogue."), "catalogue.count", 1)
    columns = ["kernel_id", "kernel_name", *(f["name"] for f in kernel)]
    if c.get(cat, "columns", "catalogue.") != columns:
        c.fail("catalogue.columns", cat["columns"], f"{columns} (kernel_id, kernel_name, the kernel fields)")
    rows = c.list(c.get(cat, "rows", "catalogue."), "catalogue.rows")
    if len(rows) != count:
        c.fail("catalogue.rows", f"<{len(rows)} rows>", f"catalogue.count = {count} rows")
    for i, row in enumerate(rows):
        if type(row) is not list or len(row) != len(columns):
            c.fail(f"catalogue.rows[{i}]", row, f"an array of {len(columns)} values (one per column)")
    # Column by column (the catalogue has thousands of rows): a fast test of the whole column,
    # then, only when it fails, the first bad cell for the message.
    for j, (column, (ok, allowed)) in enumerate(zip(zip(*rows), _column_checks(kernel))):
        if not all(ok(i, v) for i, v in enumerate(column)):
            i = next(i for i, v in enumerate(column) if not ok(i, v))
            c.fail(f"catalogue.rows[{i}][{j}] ({columns[j]})", column[i], allowed(i))
    return count


def _check_training(c: _Checker, value: object, names: Mapping[str, Any]) -> None:
    """:func:`check_manifest` of ``training``: problem ranges, archs, problem minima."""
    training = c.dict(value, "training")
    ranges = c.dict(training.get("problem_ranges", {}), "training.problem_ranges")
    for name, rng in ranges.items():
        key = f"training.problem_ranges.{name}"
        if name not in names:
            c.fail(key, rng, f"a range of a problem field ({list(names)})")
        if (not isinstance(rng, list) or len(rng) != 2 or not all(_is_int(v) for v in rng)
                or rng[0] > rng[1]):
            c.fail(key, rng, "[min, max] integers with min <= max")
    archs = c.list(training.get("archs", []), "training.archs")
    for i, name in enumerate(archs):
        c.str(name, f"training.archs[{i}]")
    minimum = c.dict(training.get("problem_minimum", {}), "training.problem_minimum")
    for name, value in minimum.items():
        if name not in names:
            c.fail(f"training.problem_minimum.{name}", value, f"a problem field ({list(names)})")
        c.int(value, f"training.problem_minimum.{name}", 0, 1)


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
