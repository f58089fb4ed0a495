"""Reading a user's YAML config file without surprises.

Hydra (through OmegaConf) reads a config file with PyYAML and expands it in memory before any
schema sees it: a file of a few hundred bytes whose aliases nest nine levels deep expands to
hundreds of millions of nodes and never finishes; a duplicate key, a ``!!python/...`` tag or a
byte that is not UTF-8 ends in a traceback. :func:`check_yaml` looks at the file's bytes and
its node graph first (aliases are not expanded there, so it takes time proportional to the
file) and refuses each of these in one line naming the file, the line and what is allowed.
:func:`read_yaml` is the checked read for code that loads a config file itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ckpred.errors import InputFileError

#: A config file larger than this is refused (configs are text of a few KiB).
MAX_BYTES = 16 << 20
#: Nodes a file may hold once its aliases are expanded (an op file has a few hundred).
MAX_NODES = 100_000
#: Nesting depth of lists and mappings (a config nests a handful of levels).
MAX_DEPTH = 100
#: The tags of plain YAML data: what a config holds, and all that is allowed.
PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in
                       ("str", "int", "float", "bool", "null", "seq", "map", "merge", "timestamp"))
_ALLOWED = "plain YAML (UTF-8 text of strings, numbers, booleans, null, lists and mappings)"


def _refuse(path: Any, what: str, line: int | None = None) -> None:
    where = f" at line {line}" if line else ""
    raise InputFileError(str(path), f"{what}{where}; allowed: {_ALLOWED}")


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _tag(tag: str) -> str:
    return "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag


def check_yaml(data: bytes, path: Any) -> None:
    """Refuse ``data`` (the bytes of config file ``path``) unless it is plain, bounded YAML.

    Raises
    ------
    ckpred.errors.InputFileError
        For a file over :data:`MAX_BYTES`, bytes that are not UTF-8, YAML that does not parse,
        a tag outside :data:`PLAIN_TAGS` (``!!python/object``: nothing is constructed), a key
        given twice in one mapping, lists or mappings nested deeper than :data:`MAX_DEPTH`, an
        alias inside its own anchor, or aliases expanding to more than :data:`MAX_NODES` nodes.
    """
    if len(data) > MAX_BYTES:
        _refuse(path, f"a config file of {len(data):,} bytes (at most {MAX_BYTES:,})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        _refuse(path, f"byte 0x{data[exc.start]:02x} is not UTF-8", line)
    try:
        root = yaml.compose(text, Loader=yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)
    except RecursionError:
        _refuse(path, f"lists or mappings nested deeper than {MAX_DEPTH} levels")
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        _refuse(path, f"not YAML: {exc.problem or exc.context}", mark.line + 1 if mark else None)
    except yaml.YAMLError as exc:
        _refuse(path, f"not YAML: {' '.join(str(exc).split())}")
    if root is not None:
        _check_nodes(root, path)


def _check_nodes(root: yaml.Node, path: Any) -> None:
    """Tags, duplicate keys, depth and expanded size of the node graph, without recursion: an
    alias is the same node object as its anchor, so each node is visited once."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            if size[key] > MAX_NODES:
                _refuse(path, f"aliases expanding to more than {MAX_NODES:,} nodes (an alias bomb?)", _line(node))
            continue
        if key in size:
            continue
        if key in on_path:
            _refuse(path, "an alias inside its own anchor (a recursive structure)", _line(node))
        if depth > MAX_DEPTH:
            _refuse(path, f"lists or mappings nested deeper than {MAX_DEPTH} levels", _line(node))
        if node.tag not in PLAIN_TAGS:
            _refuse(path, f"the tag {_tag(node.tag)!r}", _line(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for k, _ in node.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    if k.value in seen:
                        _refuse(path, f"the key {k.value!r} given twice in one mapping (first at line "
                                      f"{seen[k.value]})", _line(k))
                    seen[k.value] = _line(k)
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in _children(node))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def read_yaml(path: str | Path) -> Any:
    """The plain data of YAML file ``path``, checked by :func:`check_yaml` first.

    Raises
    ------
    ckpred.errors.InputFileError
        When the file cannot be read or :func:`check_yaml` refuses it.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputFileError(str(path), exc.strerror or str(exc)) from None
    check_yaml(data, path)
    return yaml.safe_load(data.decode("utf-8"))
