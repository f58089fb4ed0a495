"""The open vocabularies: the dtypes, layouts and arch configs a run may name, read from config dirs.

A dtype is a file ``dtype/<name>.yaml``, a layout ``layout/<name>.yaml`` and an arch
``arch/<name>.yaml`` in a config dir: the package's ``conf/`` and any dir of the user's
(``--config-dir``, Hydra's search path). Nothing in the package lists them: the names the
schema checks accept, the bytes ``dtype_bytes(x)`` reads in an expression, the ``peak_tflops_<dtype>``
constants and the layout codes of the features all come from the files found there, so a user
adds a dtype (say mxfp4) or a layout with one YAML file in their own dir.

A dtype file may list ``aliases``: other spellings of the name in tables (``float16`` for fp16).

The command layer reads the vocabulary of the dirs Hydra searched (:func:`read`) and installs it
(:func:`use`) before the config's values are checked; a program that composes no config gets the
package's own (:func:`current`). An exported model carries the entries it was built with, which
the runtime adds (:func:`add`) so that a model made with a user's dtype loads without their dir.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, TypeGuard

import yaml

from ckpred.errors import ConfigValueError, ModelMismatchError
from ckpred.yamlfile import check_yaml


class _Dir(Protocol):
    """A config dir: a :class:`pathlib.Path` or an importlib Traversable (the package's conf)."""

    def __truediv__(self, name: str) -> Any: ...

    def is_dir(self) -> bool: ...


@dataclass(frozen=True)
class Dtype:
    """An element type (``conf/dtype/<name>.yaml``)."""

    name: str
    #: Bytes of one element: 1, 2, 4, or a fraction for a packed type (0.5 for a 4-bit one).
    bytes_per_element: float
    #: The dtype C is stored in.
    c_dtype: str
    accumulator: str = "fp32"
    #: Other spellings of the name in tables (``float16`` for fp16).
    aliases: tuple[str, ...] = ()
    #: The file it was read from (for messages).
    source: str = ""

    def record(self) -> dict[str, Any]:
        """The entry as plain data (an export's manifest carries it)."""
        return {"bytes_per_element": self.bytes_per_element, "c_dtype": self.c_dtype,
                "accumulator": self.accumulator, "aliases": list(self.aliases)}


@dataclass(frozen=True)
class Layout:
    """The majorness of A, B and C (``conf/layout/<name>.yaml``)."""

    name: str
    a: str
    b: str
    c: str
    #: The layout's model-input code (the features' ``layout_code``); unique per layout.
    code: int
    source: str = ""

    def record(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "c": self.c, "code": self.code}


@dataclass(frozen=True)
class Vocabulary:
    """Dtypes and layouts by name, and the config dirs they (and the arch configs) came from."""

    dtypes: Mapping[str, Dtype]
    layouts: Mapping[str, Layout]
    #: Config dirs in Hydra's search order (the first holding a file wins).
    dirs: tuple[Any, ...] = ()
    #: Where entries added from outside the dirs came from (an export), for messages.
    added_from: tuple[str, ...] = field(default=())

    @functools.cached_property
    def _by_alias(self) -> dict[str, str]:
        return {alias: d.name for d in self.dtypes.values() for alias in d.aliases}

    def dtype_name(self, name: str) -> str | None:
        """The dtype ``name`` spells (itself or an alias), or None."""
        name = str(name)
        return name if name in self.dtypes else self._by_alias.get(name)

    def dtype(self, name: str, key: str = "dtype") -> Dtype:
        """The dtype ``name`` spells; refused naming ``key`` when there is none."""
        found = self.dtype_name(name)
        if found is None:
            raise ConfigValueError(key, name, f"a dtype of {self.describe('dtype')}")
        return self.dtypes[found]

    def layout(self, name: str, key: str = "layout") -> Layout:
        if str(name) not in self.layouts:
            raise ConfigValueError(key, name, f"a layout of {self.describe('layout')}")
        return self.layouts[str(name)]

    @functools.cached_property
    def bytes_table(self) -> dict[str, float]:
        """Bytes per element of every dtype name and alias (``dtype_bytes(x)`` in expressions)."""
        table = {name: d.bytes_per_element for name, d in self.dtypes.items()}
        table.update({alias: self.dtypes[name].bytes_per_element for alias, name in self._by_alias.items()})
        return table

    def describe(self, group: str) -> str:
        """``[names]`` of a group and where they come from, for messages."""
        names = sorted(self.dtypes if group == "dtype" else self.layouts)
        return f"{names} (the {group}/*.yaml files of the config dirs)"

    def find(self, group: str, name: str) -> Any:
        """The file ``<group>/<name>.yaml`` of the first config dir holding it, or None."""
        for d in self.dirs:
            path = d / group / f"{name}.yaml"
            if path.is_file():
                return path
        return None

    def options(self, group: str) -> list[str]:
        """The option names of ``group`` over every config dir."""
        out: set[str] = set()
        for d in self.dirs:
            folder = d / group
            if folder.is_dir():
                out.update(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
        return sorted(out)

    def records(self) -> dict[str, Any]:
        """Every dtype and layout as plain data (what an export's manifest carries)."""
        return {"dtypes": {n: d.record() for n, d in sorted(self.dtypes.items())},
                "layouts": {n: layout.record() for n, layout in sorted(self.layouts.items())}}


def package_dir() -> Any:
    """The package's own config dir (``ckpred.conf``)."""
    return resources.files("ckpred.conf")


def _file_data(path: Any) -> dict[str, Any]:
    data = path.read_bytes()
    check_yaml(data, path)
    raw = yaml.safe_load(data.decode("utf-8")) or {}
    if not isinstance(raw, dict):
        raise ConfigValueError(str(path), raw, "a mapping of config keys")
    raw.pop("defaults", None)
    return raw


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _dtype_from(path: Any, stem: str) -> Dtype:
    raw = _file_data(path)
    where = f"dtype.name in {path}"
    name = raw.get("name")
    if name != stem:
        raise ConfigValueError(where, name, f"{stem!r} (the file's name: dtype={stem} selects it)")
    size = raw.get("bytes_per_element")
    if not (_number(size) and size > 0):
        raise ConfigValueError(f"dtype.bytes_per_element in {path}", size,
                               "a number > 0 (1, 2, 4, or 0.5 for a packed 4-bit type)")
    aliases = raw.get("aliases") or []
    if not (isinstance(aliases, list) and all(isinstance(a, str) and a for a in aliases)):
        raise ConfigValueError(f"dtype.aliases in {path}", aliases, "a list of names")
    return Dtype(name=stem, bytes_per_element=size, c_dtype=str(raw.get("c_dtype", "")),
                 accumulator=str(raw.get("accumulator", "fp32")), aliases=tuple(aliases), source=str(path))


def _layout_from(path: Any, stem: str) -> Layout:
    raw = _file_data(path)
    name = raw.get("name")
    if name != stem:
        raise ConfigValueError(f"layout.name in {path}", name, f"{stem!r} (the file's name: layout={stem} selects it)")
    code = raw.get("code")
    if not (isinstance(code, int) and not isinstance(code, bool) and code >= 0):
        raise ConfigValueError(f"layout.code in {path}", code,
                               "an integer >= 0, unique among the layouts (the layout's model-input code)")
    return Layout(name=stem, a=str(raw.get("a")), b=str(raw.get("b")), c=str(raw.get("c")), code=code,
                  source=str(path))


def read(dirs: Iterable[Any]) -> Vocabulary:
    """The vocabulary of config ``dirs`` (Hydra's search order: the first dir holding a file wins).

    Raises
    ------
    ckpred.errors.ConfigValueError
        A dtype or layout file that names itself otherwise than its file, a dtype whose size is
        not a positive number, whose ``c_dtype`` or ``accumulator`` is no dtype, or whose alias is
        another dtype's name or alias; a layout without a unique ``code``.
    ckpred.errors.InputFileError
        A file that is not plain YAML (:func:`ckpred.yamlfile.check_yaml`).
    """
    dirs = tuple(dirs)
    found: dict[str, dict[str, Any]] = {"dtype": {}, "layout": {}}
    for d in dirs:
        for group, entries in found.items():
            folder = d / group
            if not folder.is_dir():
                continue
            for path in sorted(folder.iterdir(), key=lambda p: p.name):
                stem = path.name[:-5] if path.name.endswith(".yaml") else None
                if stem and stem not in entries:
                    entries[stem] = _dtype_from(path, stem) if group == "dtype" else _layout_from(path, stem)
    vocabulary = Vocabulary(dtypes=found["dtype"], layouts=found["layout"], dirs=dirs)
    check(vocabulary)
    return vocabulary


def check(vocabulary: Vocabulary) -> None:
    """Cross-entry rules: ``c_dtype``/``accumulator`` name dtypes, aliases are unique, layout
    codes are unique."""
    spelled: dict[str, str] = {name: name for name in vocabulary.dtypes}
    for d in vocabulary.dtypes.values():
        for alias in d.aliases:
            if alias in spelled:
                raise ConfigValueError(f"dtype.aliases in {d.source or d.name}", alias,
                                       f"a name no other dtype has (dtype {spelled[alias]} already spells "
                                       f"{alias!r})")
            spelled[alias] = d.name
    for d in vocabulary.dtypes.values():
        for key in ("c_dtype", "accumulator"):
            if getattr(d, key) not in spelled:
                raise ConfigValueError(f"dtype.{key} in {d.source or d.name}", getattr(d, key),
                                       f"a dtype of {vocabulary.describe('dtype')}")
    codes: dict[int, str] = {}
    for layout in vocabulary.layouts.values():
        if layout.code in codes:
            raise ConfigValueError(f"layout.code in {layout.source or layout.name}", layout.code,
                                   f"a code no other layout has (layout {codes[layout.code]} has it)")
        codes[layout.code] = layout.name


_CURRENT: list[Vocabulary] = []


def current() -> Vocabulary:
    """The vocabulary in use: the one installed by :func:`use`, else the package's own."""
    if not _CURRENT:
        _CURRENT.append(read([package_dir()]))
    return _CURRENT[-1]


def use(vocabulary: Vocabulary) -> None:
    """Install ``vocabulary`` for the checks and lookups of this process (the command layer does,
    from the config dirs Hydra searched)."""
    _CURRENT[:] = [vocabulary]


def config_dirs(sources: Iterable[Mapping[str, Any]]) -> list[Any]:
    """The config dirs of Hydra's ``runtime.config_sources`` that can hold ckpred's groups, in order."""
    out: list[Any] = []
    for source in sources:
        if source["schema"] == "file":
            out.append(Path(source["path"]))
        elif source["schema"] == "pkg" and source["path"] == "ckpred.conf":
            out.append(package_dir())
    return out


def add(records: Mapping[str, Any], source: str) -> None:
    """Add the dtypes and layouts of ``records`` (:meth:`Vocabulary.records` of an export) that the
    vocabulary in use lacks.

    Raises
    ------
    ckpred.errors.ModelMismatchError
        When ``records`` defines a name the vocabulary in use defines otherwise.
    """
    now = current()
    dtypes, layouts = dict(now.dtypes), dict(now.layouts)
    try:
        for name, rec in (records.get("dtypes") or {}).items():
            size = rec["bytes_per_element"]
            if not (_number(size) and size > 0):
                raise ValueError(f"dtype {name}: bytes_per_element {size!r}")
            entry = Dtype(name=str(name), bytes_per_element=size, c_dtype=str(rec["c_dtype"]),
                          accumulator=str(rec.get("accumulator", "fp32")),
                          aliases=tuple(str(a) for a in rec.get("aliases") or ()), source=source)
            _merge(dtypes, entry, "dtype", source)
        for name, rec in (records.get("layouts") or {}).items():
            layout = Layout(name=str(name), a=str(rec["a"]), b=str(rec["b"]), c=str(rec["c"]), code=int(rec["code"]),
                            source=source)
            _merge(layouts, layout, "layout", source)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ModelMismatchError(f"{source}: vocabulary is not a mapping of dtype and layout entries ({exc})") from None
    merged = Vocabulary(dtypes=dtypes, layouts=layouts, dirs=now.dirs, added_from=(*now.added_from, source))
    try:
        check(merged)
    except ConfigValueError as exc:
        raise ModelMismatchError(f"{source}: its dtypes and layouts do not fit the ones in use: {exc}") from None
    _CURRENT[:] = [merged]


def _merge(entries: dict[str, Any], entry: Any, group: str, source: str) -> None:
    have = entries.get(entry.name)
    if have is None:
        entries[entry.name] = entry
    elif _facts(have) != _facts(entry):
        raise ModelMismatchError(f"{source} defines {group} {entry.name} as {entry.record()}, the {group} in use "
                                 f"({have.source or 'the package'}) as {have.record()}")


def _facts(entry: Any) -> tuple[Any, ...]:
    """What must agree for two definitions of one name to be the same (aliases may differ)."""
    if isinstance(entry, Dtype):
        return (float(entry.bytes_per_element), entry.c_dtype)
    return (entry.a, entry.b, entry.c, entry.code)
