"""The declared layout holds: configs at the top level shipped in the wheel, user config dirs."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


def _packages_on_disk() -> set[str]:
    found = {str(p.parent.relative_to(REPO)).replace(os.sep, ".") for p in (REPO / "ckpred").rglob("__init__.py")}
    return found | {"ckpred.conf"}


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert listed == _packages_on_disk()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy of the checkout's tracked files: setuptools builds in <source>/build/,
    # which would leave clutter in the checkout and let a stale build/ leak old files into the wheel.
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("wheel_src")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(out), str(src)], check=True, capture_output=True, cwd=out)
    (path,) = out.glob("ckpred-*.whl")
    return path


@pytest.mark.slow
def test_wheel_carries_every_config_and_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for cfg in (REPO / "conf").rglob("*.yaml"):
        assert f"ckpred/conf/{cfg.relative_to(REPO / 'conf').as_posix()}" in names
    for module in (REPO / "ckpred").rglob("*.py"):
        assert module.relative_to(REPO).as_posix() in names


@pytest.mark.slow
def test_wheel_composes_configs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run([sys.executable, "-c", "import ckpred, ckpred.config as c; print(ckpred.__file__); "
                            "print(c.CONF_DIR)"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(site)) for line in probe.stdout.split()), probe.stdout
    job = subprocess.run([sys.executable, "-m", "ckpred", "train", "arch=gfx942", "dtype=fp16", "--cfg", "job"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    assert "name: gfx942" in job.stdout


def test_user_config_dir_adds_an_option_without_editing_the_package(tmp_path: Path) -> None:
    user = tmp_path / "my_conf" / "arch"
    user.mkdir(parents=True)
    gfx950 = (REPO / "conf" / "arch" / "gfx950.yaml").read_text()
    (user / "mygpu.yaml").write_text(gfx950.replace("name: gfx950", "name: mygpu").replace("compute_units: 256", "compute_units: 128"))
    job = subprocess.run([sys.executable, "-m", "ckpred", "train", "--config-dir", str(tmp_path / "my_conf"),
                          "arch=mygpu", "--cfg", "job"], cwd=tmp_path, capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    assert "name: mygpu" in job.stdout and "compute_units: 128" in job.stdout


#: Engine stages in data-flow order; a module may import only from its own stage or earlier ones.
#: The command layer (cli, config, commands) sits on top and may import anything.
STAGES = [
    # features.registry is the table of group names the schema validates ``kind`` against;
    # features.base holds the array namespaces (numpy / ONNX) the expression evaluator runs on.
    # kernels.opschema (and the kernel-name templates it checks) run when an op config is composed.
    {"errors", "util", "plugins", "yamlfile", "vocab", "hardware", "schema", "dtypes", "expressions", "features.registry", "features.base",
     "kernels.opschema", "kernels.template"},
    {"kernels"},
    {"data"},
    {"features"},
    {"models"},
    {"evaluate"},
    {"fitting", "runs", "warm_start", "scale", "transfer"},
    {"cv"},
    {"export"},
    {"runtime", "autotune", "replay", "guided_search", "plan"},
]
COMMAND_LAYER = {"cli", "config", "commands", "__main__", "conf"}


def _stage_of(module: str) -> int | None:
    parts = module.split(".")[1:]
    for name in (".".join(parts[:2]), parts[0] if parts else ""):
        for i, names in enumerate(STAGES):
            if name in names:
                return i
    return None


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if node.module == "ckpred"}
    return found


def _engine_modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted((REPO / "ckpred").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        top = module.split(".")[1] if module.count(".") else ""
        if top in COMMAND_LAYER or module == "ckpred.__init__":
            continue
        out.append((module, path))
    return out


def test_every_engine_module_has_a_stage() -> None:
    modules = _engine_modules()
    assert len(modules) > 30
    missing = [m for m, _ in modules if _stage_of(m) is None]
    assert not missing, f"modules outside the declared stages: {missing}"


def test_data_flows_one_way_and_only_commands_touch_hydra() -> None:
    problems = []
    for module, path in _engine_modules():
        mine = _stage_of(module)
        for imported in _imports(path):
            if imported.split(".")[0] in ("hydra",) or imported.startswith(("ckpred.config", "ckpred.commands",
                                                                              "ckpred.cli")):
                problems.append(f"{module} imports {imported} (only the command layer may)")
            elif imported.startswith("ckpred.") and mine is not None:
                theirs = _stage_of(imported)
                if theirs is not None and theirs > mine:
                    problems.append(f"{module} (stage {mine}) imports {imported} (later stage {theirs})")
    assert not problems, "\n".join(problems)


def _body_imports_without_reason(path: Path) -> list[str]:
    """``<line>: <import>`` of each function-body import of ``path`` with no ``# lazy: <reason>``
    comment: on its own lines, on the comment lines just above it or above the first import of
    its group (blank lines and the group's other imports in between), or at the end of the line
    those comments follow (``try:  # lazy: ...``)."""
    text = path.read_text()
    lines = text.splitlines()
    found = {(s.lineno, s.end_lineno or s.lineno) for f in ast.walk(ast.parse(text))
             if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for s in ast.walk(f) if isinstance(s, (ast.Import, ast.ImportFrom))}
    import_lines = {i for first, last in found for i in range(first, last + 1)}
    missing = []
    for first, last in sorted(found):
        ok = any("# lazy:" in line for line in lines[first - 1:last])
        above = first - 1  # 1-based number of the line above
        while not ok and above >= 1:
            line = lines[above - 1].strip()
            ok = "# lazy:" in line
            if line and not line.startswith("#") and above not in import_lines:
                break
            above -= 1
        if not ok:
            missing.append(f"{first}: {lines[first - 1].strip()}")
    return missing


def test_every_function_body_import_says_why_it_is_lazy() -> None:
    """An import inside a function hides what a module needs (and cycles, issue 29): each one
    says why it cannot sit at the module top, e.g. ``# lazy: scikit-learn ~4 s, only the fit needs it``."""
    missing = [f"{path.relative_to(REPO)}:{m}" for path in sorted((REPO / "ckpred").rglob("*.py"))
               for m in _body_imports_without_reason(path)]
    assert not missing, "function-body imports without a '# lazy: <reason>' comment:\n" + "\n".join(missing)


def test_the_lazy_import_check_finds_an_import_without_a_reason(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("""import os


def reasoned():
    # lazy: costs 2 s, only this branch needs it
    import json
    import csv

    from pathlib import Path


def inline():
    import json  # lazy: as above


def after_try():
    try:  # lazy: an optional extra
        import dask
    except ImportError:
        pass


def bare():
    x = 1
    import json


def reason_of_another_statement():
    # lazy: this comment belongs to the import above the assignment
    import csv
    y = 2
    import json
""")
    assert _body_imports_without_reason(planted) == ["25: import json", "32: import json"]


def _module_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_cycles(root: Path) -> list[list[str]]:
    """Groups of modules under ``root`` that import one another in a cycle, counting the imports
    inside functions (``from a import b`` leads to the module ``a.b`` when there is one, else ``a``)."""
    paths = {_module_of(p, root): p for p in sorted(root.rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        names = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names += [f"{node.module}.{a.name}" for a in node.names]
        graph[module] = {m for m in map(resolve, names) if m is not None and m != module}
    # Tarjan's strongly connected components; a component of two or more modules is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = [stack.pop()]
            while group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles_counting_function_body_imports() -> None:
    """Issue 29 found three cycles hidden in function-body imports (schema -> kernels.opschema ->
    expressions -> dtypes -> schema)."""
    assert _import_cycles(REPO / "ckpred") == []


def test_the_cycle_check_finds_a_cycle_through_a_function_body(tmp_path: Path) -> None:
    pkg = tmp_path / "ckpred"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from ckpred.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ckpred import a  # lazy: planted\n")
    (pkg / "c.py").write_text("from ckpred import a\n")
    assert _import_cycles(pkg) == [["ckpred.a", "ckpred.sub.b"]]


# -- the docs match what a fresh install does (issue 28's newcomer frictions) ----------------------
DOCS = [REPO / "README.md", REPO / "pyproject.toml", *sorted((REPO / "docs").glob("*.md"))]


def test_the_readmes_shape_counts_are_the_configs() -> None:
    """README said ``shapes=tiny`` is 16 shapes; the config has 12. The tour's counts (the
    default set, the smoke run) are read from the shape configs."""
    import re

    from ckpred.config import compose
    from ckpred.data.shapes import load_shapes

    readme = (REPO / "README.md").read_text()
    (tiny,) = re.findall(r"train shapes=tiny\s+# (\d+) small shapes", readme)
    (default,) = re.findall(r"gfx950, (\d+)\s+shapes x 4,608 kernels", readme)
    for name, said in (("tiny", tiny), ("default", default)):
        assert len(load_shapes(compose("simulate", [f"shapes={name}"]).shapes)) == int(said), name


def test_every_test_file_the_docs_cite_exists() -> None:
    """pyproject.toml cited a test file that did not exist."""
    import re

    cited = {(doc.name, m) for doc in DOCS for m in re.findall(r"tests/[\w/]+\.py", doc.read_text())}
    assert cited and not {(doc, m) for doc, m in cited if not (REPO / m).is_file()}


def test_docs_name_the_shared_data_relative_to_the_checkout() -> None:
    """The docs named one machine's absolute path for the shared data (``../shared/data``)."""
    import re

    absolute = {(doc.name, m) for doc in DOCS for m in re.findall(r"(?<![.\w])/[\w./-]*shared/data", doc.read_text())}
    assert not absolute


def test_the_design_names_every_command() -> None:
    """docs/design.md omitted ``replay``: its command layer lists every command of the CLI, in order."""
    import re

    from ckpred.cli import COMMANDS

    design = " ".join((REPO / "docs" / "design.md").read_text().split())
    (listed,) = re.findall(r"one thin module per command \(([^)]*)\)", design)
    assert [c.strip() for c in listed.split(",")] == list(COMMANDS)


def test_the_design_shows_every_engine_module_in_the_order_the_layout_checks() -> None:
    """docs/design.md ordered data before kernels while :data:`STAGES` checked the reverse, and
    six engine modules were not on it: every top-level engine module or package is named there as
    ``ckpred.<name>``, and the stages after the bottom one first appear in :data:`STAGES`' order."""
    import re

    design = (REPO / "docs" / "design.md").read_text()
    named = [m.group(1) for m in re.finditer(r"ckpred\.(\w+)", design)]
    tops = {module.split(".")[1] for module, _ in _engine_modules()}
    assert not tops - set(named), f"engine modules docs/design.md does not name: {sorted(tops - set(named))}"
    firsts = [min(named.index(name) for name in stage if name in named) for stage in STAGES[1:]]
    assert firsts == sorted(firsts), [sorted(stage) for stage in STAGES[1:]]
