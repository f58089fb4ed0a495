"""The op definition contract: what ckpred needs to know about one kernel family.

An op (CK Tile ``gemm_universal``, ``grouped_conv_fwd``, a HIP scaled-mm family...) is a YAML
file, ``conf/op/<name>.yaml``, built into an :class:`OpDefinition` by
:class:`ckpred.kernels.declared.DeclaredOp` (with an optional Python plug-in for what data
cannot say); training, evaluation and export only talk to this interface.

Fields are typed: ``int``, ``float`` and ``bool`` fields are stored as such in the canonical table;
``category`` fields are stored as strings and encoded as the index of the value in
``Field.categories`` wherever a number is needed (model inputs, the ONNX graphs). Category
lists only ever grow at the end, so codes stay stable across versions.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal, Mapping, TypeAlias

import numpy as np
import pandas as pd

from ckpred.schema import ArchConfig, DtypeConfig, LayoutConfig

#: An arch, dtype or layout as catalogues, validity rules and the simulator take them: the
#: schema's config (an arch also as a composed node or a mapping with its keys), or its name.
ArchSpec: TypeAlias = "ArchConfig | Mapping[str, Any] | str"
DtypeSpec: TypeAlias = "DtypeConfig | str"
LayoutSpec: TypeAlias = "LayoutConfig | str"


def spec_name(spec: DtypeSpec | LayoutSpec) -> str:
    """The name of a dtype or layout given as its config (or a node with a ``name``) or its name."""
    return spec if isinstance(spec, str) else str(spec.name)

FieldKind = Literal["int", "float", "bool", "category"]


@dataclass(frozen=True)
class Field:
    """One problem or kernel field of an op."""

    name: str
    kind: FieldKind = "int"
    categories: tuple[str, ...] = ()
    #: Value used when a source does not carry the field (``None`` = required).
    default: Any = None

    def encode(self, values: pd.Series | np.ndarray) -> np.ndarray:
        """Encode values as int64 (category index, 0/1 for bools); unknown categories -> -1."""
        if self.kind == "category":
            # Vectorised lookup (a Python loop here dominated encoding 774k-row tables);
            # values outside ``categories`` get code -1.
            codes = pd.Categorical(np.asarray(values, dtype=object), categories=list(self.categories)).codes
            return codes.astype(np.int64)
        if self.kind == "float":
            return np.asarray(values, dtype=np.float64)
        return np.asarray(values, dtype=np.int64)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`encode`."""
        codes = np.asarray(codes, dtype=np.int64)
        if self.kind == "category":
            return np.asarray(self.categories, dtype=object)[codes]
        if self.kind == "bool":
            return codes.astype(bool)
        return codes


class OpDefinition(ABC):
    """Everything op-specific: fields, name grammar, candidate space, validity, FLOPs.

    Subclasses set the class attributes and implement the abstract methods. All methods
    taking tables are vectorised over rows.
    """

    #: Op name as used in config (``op=<name>``) and in the canonical table's ``op`` column.
    name: str
    #: Fields that describe a problem (one benchmark "shape").
    problem_fields: tuple[Field, ...]
    #: Fields that describe a kernel configuration.
    kernel_fields: tuple[Field, ...]
    #: The query key: problem fields of one selection (the ranker's query group and the unit of
    #: per-shape efficiency). CV folds hold out :attr:`cv_group_key` groups of queries; reports
    #: break them down by :meth:`family`.
    group_key: tuple[str, ...]
    #: Labels of the problem families, in order (see :meth:`family`).
    families: tuple[str, ...]
    #: What a (problem, catalogue kernel) pair without a row in the table means
    #: (:data:`ckpred.schema.ABSENCE`): ``unknown`` (a full sweep, where a missing row is a gap)
    #: or ``not_applicable`` (the table lists only the kernels that apply to each problem).
    absence: str = "unknown"

    # -- names ---------------------------------------------------------------------------------
    @abstractmethod
    def parse_name(self, name: str) -> dict[str, Any]:
        """Parse a kernel name into kernel fields (plus ``dtype``/``layout`` when present).

        Raises
        ------
        ckpred.errors.KernelNameError
            When ``name`` does not follow the grammar; the message says which part is wrong.
        """

    @abstractmethod
    def format_name(self, kernel: Mapping[str, Any], *, dtype: str, layout: str) -> str:
        """Canonical kernel name of ``kernel`` (a mapping of kernel fields)."""

    # -- candidate space -----------------------------------------------------------------------
    @abstractmethod
    def catalogue(self, arch: ArchSpec, dtype: DtypeSpec, layout: LayoutSpec) -> pd.DataFrame:
        """Every candidate kernel for (arch, dtype, layout) configs.

        Returns a frame with ``kernel_id`` (stable 0..n-1, the row order), ``kernel_name`` and
        one column per kernel field.
        """

    @abstractmethod
    def validity(self, problems: pd.DataFrame, kernels: pd.DataFrame, *, arch: ArchSpec, dtype: DtypeSpec,
                 layout: LayoutSpec) -> tuple[np.ndarray, np.ndarray]:
        """Whether each kernel can run each problem, row by row (frames are row-aligned).

        Returns
        -------
        valid : ndarray of bool
        reason : ndarray of object
            Empty string where valid, else why the kernel cannot run the problem.
        """

    @abstractmethod
    def flops(self, problems: pd.DataFrame) -> np.ndarray:
        """Floating-point operations of each problem (for TFLOPS <-> latency)."""

    @abstractmethod
    def family(self, problems: pd.DataFrame) -> np.ndarray:
        """Family label of each problem (one of :attr:`families`), for per-family reports."""

    # -- optional hooks ------------------------------------------------------------------------
    #: ONNX version of :meth:`validity` for the exported selector graph; ``None`` = not provided
    #: (then :mod:`ckpred.export.validity` uses a builder registered for the op's name). An op
    #: overriding it defines ``validity_onnx(self, g, problem, catalogue, *, arch, dtype, layout)``
    #: returning the name of a bool [B, C] tensor built with ``g`` (an
    #: ``ckpred.export.onnx.GraphBuilder``) from the int64 [B, P] tensor named ``problem``; it
    #: must equal :meth:`validity` row for row (ckpred's export tests check that).
    validity_onnx: Any = None

    def gemm_view(self, problems: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The problem as the (M, N, K) of the GEMM a kernel tiles (implicit GEMM for convs).

        Optional: ops without a GEMM view raise ``NotImplementedError``, and the analytical
        baseline, which needs one, is skipped for them with that reason.
        """
        raise NotImplementedError(f"op {self.name!r} has no GEMM view (OpDefinition.gemm_view)")

    # -- helpers shared by every op ------------------------------------------------------------
    @property
    def problem_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.problem_fields)

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.kernel_fields)

    @property
    def input_names(self) -> tuple[str, ...]:
        """Column order of the raw model input: problem fields, then kernel fields."""
        return self.problem_names + self.kernel_names

    def field(self, name: str) -> Field:
        for f in self.problem_fields + self.kernel_fields:
            if f.name == name:
                return f
        raise KeyError(f"op {self.name!r} has no field {name!r}; fields: {list(self.input_names)}")

    def encode(self, frame: pd.DataFrame, names: tuple[str, ...] | None = None) -> np.ndarray:
        """int64 matrix of ``names`` (default: :attr:`input_names`) with categories encoded."""
        names = self.input_names if names is None else names
        if len(frame) == 0:
            return np.zeros((0, len(names)), dtype=np.int64)
        return np.column_stack([self.field(n).encode(frame[n].to_numpy()) for n in names])

    def encode_frame(self, frame: pd.DataFrame, names: tuple[str, ...] | None = None) -> pd.DataFrame:
        """Like :meth:`encode` but as a DataFrame with the field names as columns."""
        names = self.input_names if names is None else names
        return pd.DataFrame(self.encode(frame, names), columns=list(names), index=frame.index)

    #: Problem fields a CV fold holds out together (a subset of :attr:`group_key`); ``None`` =
    #: the group key itself.
    cv_group_key: tuple[str, ...] | None = None

    def _key(self, frame: pd.DataFrame, names: tuple[str, ...]) -> pd.Series:
        cols = []
        for c in names:
            kind = next((f.kind for f in self.problem_fields + self.kernel_fields if f.name == c), "int")
            cols.append(frame[c].astype(str) if kind in ("category", "float") else frame[c].astype("int64").astype(str))
        key = cols[0]
        for c in cols[1:]:
            key = key + "x" + c
        return key

    def shape_keys(self, frame: pd.DataFrame) -> pd.Series:
        """One key per row identifying its query (the group key): the ranking group, the unit of
        per-shape efficiency."""
        return self._key(frame, self.group_key)

    def cv_group_keys(self, frame: pd.DataFrame) -> pd.Series:
        """One key per row identifying what a CV fold holds out together (:attr:`cv_group_key`)."""
        return self._key(frame, self.cv_group_key or self.group_key)

    def catalogue_hash(self, catalogue: pd.DataFrame) -> str:
        """sha256 of the catalogue's ids, names and fields (binds a model to its candidates)."""
        payload = catalogue[["kernel_id", "kernel_name", *self.kernel_names]].astype(str)
        blob = json.dumps(payload.to_numpy().tolist(), separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()
