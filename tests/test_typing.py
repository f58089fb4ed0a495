"""Typed all the way down: the engine takes the schema dataclasses and plain values, and mypy passes.

``python -m tests.test_typing`` prints the counts the tests check (parameters typed ``Any``,
config parameters typed ``Any`` or as an OmegaConf node, engine modules importing OmegaConf or
Hydra); ``-v`` lists them.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO

#: Most parameters typed ``Any``: a share of every parameter of ckpred/ (``self`` and ``cls`` not counted).
MAX_ANY_SHARE = 0.05
#: Modules that may import OmegaConf or Hydra: the command layer and the schema package.
CONFIG_LAYER = ("ckpred/cli.py", "ckpred/config.py", "ckpred/schema/", "ckpred/commands/")


def _is_any(annotation: ast.expr | None) -> bool:
    return annotation is not None and ast.unparse(annotation).replace("typing.", "") in (
        "Any", "Optional[Any]", "Any | None", "'Any'")


def _is_config_name(name: str) -> bool:
    return name in ("cfg", "config") or name.endswith("_cfg")


@dataclass
class Counts:
    """Parameters of every function of ckpred/ by their annotation."""

    parameters: int = 0
    typed_any: list[str] = field(default_factory=list)
    #: Parameters of the engine (outside :data:`CONFIG_LAYER`, which turns OmegaConf nodes into the
    #: dataclasses) holding a config (``cfg``, ``config``, ``*_cfg``) typed ``Any`` or as an OmegaConf node.
    untyped_configs: list[str] = field(default_factory=list)
    unannotated: list[str] = field(default_factory=list)
    #: Modules outside :data:`CONFIG_LAYER` importing omegaconf or hydra.
    omegaconf_modules: list[str] = field(default_factory=list)

    @property
    def any_share(self) -> float:
        return len(self.typed_any) / max(self.parameters, 1)


def _imports_omegaconf(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        names = [node.module or ""]
    else:
        return False
    return any(n.split(".")[0] in ("omegaconf", "hydra") for n in names)


def _count_function(node: ast.FunctionDef | ast.AsyncFunctionDef, rel: str, out: Counts) -> None:
    a = node.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
    for i, p in enumerate(params):
        if i == 0 and p.arg in ("self", "cls"):
            continue
        where = f"{rel}:{node.lineno} {node.name}({p.arg})"
        out.parameters += 1
        if p.annotation is None:
            out.unannotated.append(where)
        elif _is_any(p.annotation):
            out.typed_any.append(where)
        if not rel.startswith(CONFIG_LAYER) and _is_config_name(p.arg) and p.annotation is not None and (
                _is_any(p.annotation) or "DictConfig" in ast.unparse(p.annotation)):
            out.untyped_configs.append(where)


def count(root: Path = REPO) -> Counts:
    """The counts of every module of ``root/ckpred``."""
    out = Counts()
    for path in sorted((root / "ckpred").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not rel.startswith(CONFIG_LAYER) and _imports_omegaconf(node) and rel not in out.omegaconf_modules:
                out.omegaconf_modules.append(rel)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                _count_function(node, rel, out)
    return out


def test_the_counter_sees_what_it_counts(tmp_path: Path) -> None:
    """The counter flags an ``Any`` config, an unannotated parameter and an engine module that
    imports OmegaConf (so the tests below cannot pass by counting nothing)."""
    (tmp_path / "ckpred" / "schema").mkdir(parents=True)
    (tmp_path / "ckpred" / "engine.py").write_text(
        "from typing import Any\nfrom omegaconf import DictConfig\n\n"
        "def f(cfg: Any, model_cfg: DictConfig, x, n: int) -> None: ...\n")
    (tmp_path / "ckpred" / "schema" / "data.py").write_text(
        "from typing import Any\nfrom omegaconf import MISSING\n\ndef g(cfg: Any) -> None: ...\n")
    c = count(tmp_path)
    assert c.parameters == 5
    assert [w.split()[-1] for w in c.untyped_configs] == ["f(cfg)", "f(model_cfg)"]
    assert [w.split()[-1] for w in c.unannotated] == ["f(x)"]
    assert c.omegaconf_modules == ["ckpred/engine.py"]


def test_parameters_are_typed() -> None:
    """Every parameter has an annotation, no config travels as ``Any`` or an OmegaConf node, and
    ``Any`` types under 5% of the parameters (where a value is truly dynamic: a user's mapping,
    a plug-in's argument, an estimator of a library without types)."""
    counts = count()
    assert counts.parameters > 1000
    assert not counts.unannotated, "parameters without a type: " + ", ".join(counts.unannotated[:20])
    assert not counts.untyped_configs, "configs typed Any or DictConfig: " + ", ".join(counts.untyped_configs)
    assert counts.any_share < MAX_ANY_SHARE, (
        f"{len(counts.typed_any)} of {counts.parameters} parameters ({counts.any_share:.1%}) are typed Any "
        f"(at most {MAX_ANY_SHARE:.0%}): " + ", ".join(counts.typed_any[:40]))


def test_only_the_config_layer_imports_omegaconf() -> None:
    """Engine modules take the schema dataclasses: none converts, merges or reads an OmegaConf node."""
    assert not count().omegaconf_modules


@pytest.mark.slow
def test_mypy_passes_on_the_package(tmp_path: Path) -> None:
    """mypy, at the strictness set in pyproject.toml ([tool.mypy]), finds nothing in ckpred/.

    Slow: a run without a cache takes about a minute of CPU; the cache goes to a temporary
    directory so the checkout stays clean.
    """
    pytest.importorskip("mypy")
    env = {**os.environ, "MYPY_CACHE_DIR": str(tmp_path / "mypy_cache")}
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


if __name__ == "__main__":
    c = count()
    print(f"parameters: {c.parameters}, typed Any: {len(c.typed_any)} ({c.any_share:.1%}), "
          f"unannotated: {len(c.unannotated)}, configs typed Any or DictConfig: {len(c.untyped_configs)}, "
          f"engine modules importing omegaconf/hydra: {len(c.omegaconf_modules)}")
    if "-v" in sys.argv:
        print("\n".join(c.typed_any + c.untyped_configs + c.unannotated + c.omegaconf_modules))
