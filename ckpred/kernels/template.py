"""Kernel-name templates: one string that formats a kernel's name and parses it back.

A template is text with ``{field}`` placeholders, e.g. ``bm{block_m}_bn{block_n}_{dtype}``.
Formatting substitutes the values; parsing matches a regular expression built from the same
template, where each placeholder matches what its field's kind allows (an integer, a number,
``True``/``False`` or one of a categorical field's values). A template whose names do not
parse back to the values that formatted them (two integers side by side, a categorical value
that contains the separator...) is refused when the op config is composed: see
:func:`check_round_trip`.
"""

from __future__ import annotations

import re
import string
from operator import call, getitem, itemgetter
from typing import Any, Mapping, Sequence

from ckpred.errors import ConfigValueError, KernelNameError

#: Regular expression of a placeholder per field kind (categoricals: their values).
_KIND_PATTERNS = {"int": r"-?\d+", "float": r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?",
                  "bool": r"True|False|true|false"}
_BOOL_TEXT = {"True": True, "true": True, "False": False, "false": False}
#: The canonical text of a value, per field kind: (normalise, %-format conversion), i.e.
#: ``str(int(v))``, ``repr(float(v))``, ``str(bool(v))`` and ``str(v)``.
_TO_TEXT = {"int": (int, "%s"), "float": (float, "%r"), "bool": (bool, "%s"), "categorical": (str, "%s")}
#: The type of a value that its kind's normalising call returns unchanged.
_NORMAL_TYPE = {"int": int, "float": float, "bool": bool, "categorical": str}


class _ConvertedTexts(dict):
    """Placeholder text -> its value, converted by ``convert`` when first met.

    Names repeat the same few numbers (tile sizes, warp counts...): a lookup is cheaper than
    converting the text again. Cleared when it grows past ``limit`` entries, so names with ever
    new numbers cost a conversion each, not memory.
    """

    def __init__(self, convert: Any, limit: int = 1 << 16) -> None:
        super().__init__()
        self.convert, self.limit = convert, limit

    def __missing__(self, text: str) -> Any:
        value = self.convert(text)  # raises as the conversion does (an int of too many digits)
        if len(self) >= self.limit:
            self.clear()
        self[text] = value
        return value


class KernelTemplate:
    """A compiled template over fields of known kinds.

    Parameters
    ----------
    text : str
        The template.
    kinds : mapping
        Field name -> ``(kind, values)`` for every name the template may use; ``kind`` is
        ``int``, ``float``, ``bool`` or ``categorical`` (``values`` its allowed strings).
    key : str
        The config key of the template (named in errors).
    """

    def __init__(self, text: str, kinds: Mapping[str, tuple[str, Sequence[str]]], *, key: str) -> None:
        self.text, self.key = text, key
        self.parts: list[tuple[str, str | None]] = []  # (literal, placeholder or None)
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise ConfigValueError(key, text, f"a template with balanced {{field}} placeholders ({exc})") from None
        pattern = ["^"]
        seen: list[str] = []
        for literal, name, spec, conversion in parsed:
            pattern.append(re.escape(literal))
            if name is None:
                self.parts.append((literal, None))
                continue
            if spec or conversion or not name.isidentifier():
                raise ConfigValueError(key, text, f"plain {{field}} placeholders (got {{{name}"
                                                  f"{'!' + conversion if conversion else ''}"
                                                  f"{':' + spec if spec else ''}}})")
            if name not in kinds:
                raise ConfigValueError(key, name, f"a placeholder naming one of {sorted(kinds)} "
                                                  f"(in template {text!r})")
            if name in seen:
                raise ConfigValueError(key, name, f"each field at most once in the template {text!r}")
            seen.append(name)
            kind, values = kinds[name]
            if kind == "categorical":
                alternatives = sorted((str(v) for v in values), key=len, reverse=True)
                regex = "|".join(re.escape(v) for v in alternatives)
            else:
                regex = _KIND_PATTERNS[kind]
            pattern.append(f"(?P<{name}>{regex})")
            self.parts.append((literal, name))
        pattern.append("$")
        self.names: tuple[str, ...] = tuple(seen)
        self.kinds = {n: kinds[n] for n in seen}
        self.regex = re.compile("".join(pattern))
        # Parsing and formatting run once per distinct kernel name of every file read, so the
        # per-field work is planned here: the regex's groups are the placeholders in order,
        # and a name is one %-format of the fields' normalised values.
        # The value of each placeholder's text is a lookup: a categorical's text is its value,
        # a bool's one of four texts, and numbers are converted once per distinct text.
        numbers = {"int": _ConvertedTexts(int), "float": _ConvertedTexts(float)}
        self._texts = tuple({str(v): str(v) for v in self.kinds[n][1]} if self.kinds[n][0] == "categorical"
                            else _BOOL_TEXT if self.kinds[n][0] == "bool" else numbers[self.kinds[n][0]]
                            for n in seen)
        self._normalise = tuple(_TO_TEXT[self.kinds[n][0]][0] for n in seen)
        self._normal_types = tuple(_NORMAL_TYPE[self.kinds[n][0]] for n in seen)
        self._lookup = _lookup(self.names)
        self._format_text = "".join(literal.replace("%", "%%") + (_TO_TEXT[self.kinds[name][0]][1] if name else "")
                                    for literal, name in self.parts)

    def format(self, values: Mapping[str, Any]) -> str:
        """The name of ``values`` (a mapping holding every placeholder's value)."""
        try:
            got = self._lookup(values)
        except Exception:  # raised again below, in the order the definition raises it
            got = None
        # Values of their kind's own type (what :meth:`parse` gives) are normalised already.
        if got is not None and tuple(map(type, got)) == self._normal_types:
            return self._format_text % got
        # Field by field in template order, as each value is looked up and normalised: a
        # missing or bad value raises what ``values[name]`` or the normalising call raises.
        return self._format_text % tuple(map(call, self._normalise, map(values.__getitem__, self.names)))

    def parse(self, name: str) -> dict[str, Any]:
        """The placeholder values of ``name``.

        Raises
        ------
        ckpred.errors.KernelNameError
            When ``name`` does not match the template.
        """
        if not isinstance(name, str):
            raise KernelNameError(str(name), "not a string")
        match = self.regex.match(name)
        if match is None:
            raise KernelNameError(name, self._diagnose(name))
        return dict(zip(self.names, map(getitem, self._texts, match.groups())))

    def _diagnose(self, name: str) -> str:
        """Which part of the template ``name`` first fails to match, and the text found there."""
        pattern = "^"
        for literal, field_name in self.parts:
            for piece, what in ((re.escape(literal), f"the text {literal!r}"),
                                (self._group(field_name), self._describe(field_name))):
                if not piece:
                    continue
                trial = re.compile(pattern + piece)
                if trial.match(name) is None:
                    done = re.compile(pattern).match(name)
                    rest = name[done.end():] if done else name
                    return f"expected {what} at {rest!r} (template {self.text!r})"
                pattern += piece
        done = re.compile(pattern).match(name)
        rest = name[done.end():] if done else name
        return f"unexpected text {rest!r} after the template's last part (template {self.text!r})"

    def _group(self, field_name: str | None) -> str:
        if field_name is None:
            return ""
        kind, values = self.kinds[field_name]
        if kind == "categorical":
            return "(?:" + "|".join(re.escape(v) for v in sorted(values, key=len, reverse=True)) + ")"
        return "(?:" + _KIND_PATTERNS[kind] + ")"

    def _describe(self, field_name: str | None) -> str:
        if field_name is None:
            return ""
        kind, values = self.kinds[field_name]
        allowed = f"one of {list(values)}" if kind == "categorical" else \
            {"int": "an integer", "float": "a number", "bool": "True or False"}[kind]
        return f"{field_name} ({allowed})"


def _lookup(names: tuple[str, ...]) -> Any:
    """``values -> tuple(values[n] for n in names)``, in one call of ``itemgetter`` from two names
    on (of one name it gives the value, not a tuple)."""
    if len(names) > 1:
        return itemgetter(*names)
    return lambda values: tuple(values[n] for n in names)


def sample_values(kinds: Mapping[str, tuple[str, Sequence[str]]], names: Sequence[str]) -> list[dict[str, Any]]:
    """Values that exercise a template: distinct multi-digit integers per field (so that two
    integer placeholders side by side cannot split back the same way), each bool both ways,
    every categorical value at least once."""
    rounds = max([2] + [len(kinds[n][1]) for n in names if kinds[n][0] == "categorical"])
    out = []
    for r in range(rounds):
        row: dict[str, Any] = {}
        for i, n in enumerate(names):
            kind, values = kinds[n]
            if kind == "int":
                row[n] = int(f"{i + 1}{r + 2}{i + 3}")
            elif kind == "float":
                row[n] = float(f"{i + 1}.{r + 2}5")
            elif kind == "bool":
                row[n] = (r + i) % 2 == 0
            else:
                row[n] = str(values[(r + i) % len(values)])
        out.append(row)
    return out


def check_round_trip(template: KernelTemplate) -> None:
    """Refuse a template whose formatted names do not parse back to the same values.

    Raises
    ------
    ckpred.errors.ConfigValueError
        Naming the template's key, the template, and the example that came back different.
    """
    for values in sample_values(template.kinds, template.names):
        name = template.format(values)
        try:
            back = template.parse(name)
        except KernelNameError:
            back = None
        if back != values:
            raise ConfigValueError(template.key, template.text,
                                   f"a template whose names parse back to their fields: {values} formats as "
                                   f"{name!r}, which parses as {back} (separate placeholders with text that "
                                   f"no value contains)")
