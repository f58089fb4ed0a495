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


#: Texts a number placeholder is tried with when looking for two kernels of one name (of
#: several lengths and a sign, so that a neighbour's text can overlap them).
_NUMBER_TEXTS = {"int": ("1", "2", "11", "12", "-1"), "float": ("0.5", "12.25", "1e-05", "-0.5"),
                 "bool": ("True", "False")}


def placeholder_texts(kinds: Mapping[str, tuple[str, Sequence[str]]], name: str) -> tuple[str, ...]:
    """The texts :func:`find_collision` tries for placeholder ``name``: every categorical value,
    both booleans, and numbers of a few lengths."""
    kind, values = kinds[name]
    return tuple(str(v) for v in values) if kind == "categorical" else _NUMBER_TEXTS[kind]


def find_collision(parts: Sequence[tuple[str, str | None]],
                   texts: Mapping[str, Sequence[str]]) -> tuple[dict[str, str], dict[str, str]] | None:
    """Two different choices of placeholder texts that print the same name, or ``None``.

    ``parts`` are (literal, placeholder or ``None``) in order; ``texts`` the texts each
    placeholder may take (non-empty). Every combination is covered without enumerating them:
    the two names are built side by side, the side behind consuming what the side ahead
    printed beyond it (the "overhang", always a suffix of one part's text, so the states are
    few), until both end together after having chosen differently.
    """
    tokens: list[tuple[str, Sequence[str]]] = []  # (placeholder or "", texts it may print)
    for literal, name in parts:
        if literal:
            tokens.append(("", (literal,)))
        if name is not None:
            tokens.append((name, tuple(texts[name])))
    end = len(tokens)
    # state: (index of side a, index of side b, overhang of side a beyond b; "" when level)
    # reached with the choices made so far (for the message); a is the side ahead
    start: list[tuple[int, int, str, tuple[tuple[str, str, str], ...]]] = []
    for i, (name, options) in enumerate(tokens):  # the two names agree up to token i, then differ
        if not name:
            continue
        for x in options:
            for y in options:
                if x != y and x.startswith(y):
                    start.append((i + 1, i + 1, x[len(y):], (("a", name, x), ("b", name, y))))
    seen: set[tuple[int, int, str]] = set()
    stack = start
    while stack:
        ia, ib, over, chosen = stack.pop()
        if (ia, ib, over) in seen:
            continue
        seen.add((ia, ib, over))
        if not over:
            if ia == ib:  # level at the same point: the rest can be printed alike
                return _sides(chosen, tokens)
            if ia == end or ib == end:  # one name ended, the other has text left
                continue
            # level: side a prints its next token, which b must then match
            name, options = tokens[ia]
            for x in options:
                stack.append((ia + 1, ib, x, chosen + ((("a", name, x),) if name else ())))
            continue
        if ib == end:
            continue
        name, options = tokens[ib]
        for y in options:
            step = chosen + ((("b", name, y),) if name else ())
            if over.startswith(y):
                stack.append((ia, ib + 1, over[len(y):], step))
            elif y.startswith(over):  # b now ahead: swap the sides' roles
                swapped = tuple(("b" if s == "a" else "a", n, t) for s, n, t in step)
                stack.append((ib + 1, ia, y[len(over):], swapped))
    return None


def _sides(chosen: Sequence[tuple[str, str, str]],
           tokens: Sequence[tuple[str, Sequence[str]]]) -> tuple[dict[str, str], dict[str, str]]:
    """The two sides' placeholder texts, in template order (a placeholder neither side chose,
    before their difference or after they level, is printed alike: its first text)."""
    a = {n: t for s, n, t in chosen if s == "a"}
    b = {n: t for s, n, t in chosen if s == "b"}
    names = [name for name, _ in tokens if name]
    first = {name: options[0] for name, options in tokens if name}
    return ({n: a.get(n, first[n]) for n in names}, {n: b.get(n, first[n]) for n in names})


def check_unique_names(template: KernelTemplate) -> None:
    """Refuse a template that prints two different kernels the same way (``{variant}{tail}``
    with values ``x, xy`` and ``yz, z``: ``x`` + ``yz`` and ``xy`` + ``z``), checked over every
    combination of the categorical values (numbers: a few texts of each kind); ingest would
    otherwise merge the two kernels' measurements as repeats of one.

    Raises
    ------
    ckpred.errors.ConfigValueError
        Naming the template's key, the template and the two kernels.
    """
    texts = {n: placeholder_texts(template.kinds, n) for n in template.names}
    found = find_collision(template.parts, texts)
    if found is None:
        return
    a, b = found
    name = "".join(literal + (a[n] if n else "") for literal, n in template.parts)
    differ = [n for n in a if a[n] != b[n]]
    raise ConfigValueError(template.key, template.text,
                           f"a template that names each kernel once: "
                           f"{', '.join(f'{n}={a[n]}' for n in differ)} and {', '.join(f'{n}={b[n]}' for n in differ)} "
                           f"both print {name!r} (separate placeholders with text that no value contains)")


def check_round_trip(template: KernelTemplate) -> None:
    """Refuse a template whose formatted names do not parse back to the same values, or that
    prints two kernels alike (:func:`check_unique_names`).

    Raises
    ------
    ckpred.errors.ConfigValueError
        Naming the template's key, the template, and the example that came back different.
    """
    check_unique_names(template)
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
