"""The kernels an arch's library build has, where its arch config lists them.

A model trained on one GPU ranks the kernels of its catalogue on every GPU. A new GPU's library
may not build all of them: MIOpen's find-db on gfx942 never lists 43 of the solvers gfx90a's
does, and a selector that picks one of those on gfx942 picks a kernel that does not exist.
Measurements cannot say so before the GPU is measured; the user's build can. An arch config's
``kernel_lists`` maps an op's name to a text file of the kernel names that build has (one per
line, ``#`` starts a comment); on that arch only those kernels are candidates, wherever ckpred
ranks candidates (cross-validation's test folds, ``plan``, the exported selector). An op the
arch does not list keeps every kernel its rules allow.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ckpred.errors import InputFileError, KernelNameError, MissingFileError
from ckpred.kernels.definition import ArchSpec, OpDefinition
from ckpred.util import resolve_path

log = logging.getLogger(__name__)

#: ``invalid_reason`` prefix of a kernel the arch's list leaves out.
NOT_LISTED = "not in the arch's kernel list"


@dataclass(frozen=True)
class KernelList:
    """The kernels one arch's list names for one op.

    Attributes
    ----------
    key : str
        The config key that names the file (``arch.kernel_lists.<op>``).
    path : Path
        The file, absolute.
    names : frozenset of str
        The kernel names it lists.
    kernels : DataFrame
        Their kernel fields (the op's ``kernel_names``), parsed from the names.
    sha256 : str
        The file's hash (recorded where the list shaped an export).
    """

    key: str
    path: Path
    names: frozenset[str]
    kernels: pd.DataFrame
    sha256: str

    def mask(self, kernels: pd.DataFrame, op: OpDefinition) -> np.ndarray:
        """True for each row of ``kernels`` (the op's kernel fields) the list names."""
        fields = list(op.kernel_names)
        wanted = pd.MultiIndex.from_frame(self.kernels[fields].astype(object))
        return np.asarray(pd.MultiIndex.from_frame(kernels[fields].astype(object)).isin(wanted), dtype=bool)

    def record(self, catalogue: pd.DataFrame, op: OpDefinition) -> dict[str, Any]:
        """What a manifest or run records of the list: file, hash, kernels listed and how many of
        them ``catalogue`` holds (the others were never measured in training: no model ranks them)."""
        return {"key": self.key, "file": str(self.path), "sha256": self.sha256, "listed": len(self.names),
                "in_catalogue": int(self.mask(catalogue, op).sum())}


_READ: dict[tuple[str, str, float, int], KernelList] = {}


def kernel_list(arch: ArchSpec | None, op: OpDefinition) -> KernelList | None:
    """The list ``arch``'s config gives for ``op`` (``arch.kernel_lists.<op name>``); None when it
    gives none (an arch by name, or no list for the op).

    Raises
    ------
    ckpred.errors.MissingFileError
        The file does not exist (the message names the key and the path).
    ckpred.errors.InputFileError
        The file cannot be read, lists no kernel, or a line is no kernel name of the op (the
        message names the file, the line, the text and what a name looks like).
    """
    lists = getattr(arch, "kernel_lists", None) or {}
    if op.name not in lists:
        return None
    key = lists_key(op)
    path = resolve_path(str(lists[op.name]))
    try:
        stat = path.stat()
    except OSError:
        raise MissingFileError(str(path), f"{key} names it and it does not exist (a text file of the kernel names "
                                          f"arch {getattr(arch, 'name', arch)!r} builds, one per line)") from None
    cache_key = (str(path), op.name, stat.st_mtime, stat.st_size)
    if cache_key not in _READ:
        _READ[cache_key] = _read(path, key, op)
    return _READ[cache_key]


def _read(path: Path, key: str, op: OpDefinition) -> KernelList:
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(str(path), f"{key}: {exc}") from None
    names: list[str] = []
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        name = line.split("#", 1)[0].strip()
        if not name or name in names:
            continue
        try:
            rows.append(op.parse_name(name))
        except KernelNameError as exc:
            raise InputFileError(f"{path}:{number}", f"{key}: {name!r} is not a kernel name of op {op.name!r} "
                                                     f"({exc.reason})") from None
        names.append(name)
    if not names:
        raise InputFileError(str(path), f"{key}: the file lists no kernel (one kernel name per line, "
                                        f"'#' starts a comment)")
    kernels = pd.DataFrame(rows, columns=list(op.kernel_names))
    return KernelList(key, path, frozenset(names), kernels, hashlib.sha256(data).hexdigest())


def listed_mask(arch: ArchSpec | None, op: OpDefinition, kernels: pd.DataFrame) -> np.ndarray | None:
    """True for each row of ``kernels`` that ``arch``'s list for ``op`` names; None without a list."""
    found = kernel_list(arch, op)
    return None if found is None else found.mask(kernels, op)


def validity_on(op: OpDefinition, problems: pd.DataFrame, kernels: pd.DataFrame, *, arch: ArchSpec,
                dtype: Any, layout: Any) -> tuple[np.ndarray, np.ndarray]:
    """The op's validity rules with ``arch``'s constants, narrowed by ``arch``'s kernel list.

    What every ranking of candidates on an arch uses (the rules alone say whether a kernel can
    run a problem; the list, whether the arch's build has the kernel at all). ``reason`` names
    the list for a kernel it leaves out.
    """
    valid, reason = op.validity(problems, kernels, arch=arch, dtype=dtype, layout=layout)
    listed = listed_mask(arch, op, kernels)
    if listed is None:
        return valid, reason
    valid = np.asarray(valid, dtype=bool)
    dropped = valid & ~listed
    if dropped.any():
        reason = np.asarray(reason, dtype=object).copy()
        reason[dropped] = f"{NOT_LISTED} ({lists_key(op)})"
    return valid & listed, reason


def lists_key(op: OpDefinition) -> str:
    """The config key of ``op``'s kernel list in an arch config."""
    return f"arch.kernel_lists.{op.name}"


def check_catalogue(arch: ArchSpec | None, op: OpDefinition, catalogue: pd.DataFrame) -> KernelList | None:
    """``arch``'s list for ``op``, checked against the model's ``catalogue``: a list none of whose
    kernels the catalogue holds is refused (nothing could be ranked); listed kernels the catalogue
    lacks are logged (never measured in training, no model can rank them)."""
    found = kernel_list(arch, op)
    if found is None:
        return None
    known = found.mask(catalogue, op)
    if not known.any():
        raise InputFileError(str(found.path), f"{found.key}: none of its {len(found.names)} kernels is in the "
                                              f"model's catalogue of {len(catalogue)} (e.g. "
                                              f"{catalogue['kernel_name'].iloc[0]!r})")
    unknown = len(found.names) - int(known.sum())
    if unknown:
        log.warning("%s (%s): %d of its %d kernels are not in the model's catalogue (never measured in "
                    "training, so no model ranks them)", found.key, found.path, unknown, len(found.names))
    return found
