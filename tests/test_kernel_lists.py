"""An arch's kernel list: on a GPU whose library build lacks kernels the training GPU had, only the
listed kernels are candidates, in cross-validation, in ``plan`` and in the exported selector
(Python and C++)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from ckpred.errors import ConfigValueError, InputFileError, MissingFileError
from ckpred.kernels.lists import NOT_LISTED, check_catalogue, kernel_list, validity_on
from tests.test_cpp import _run, binary  # noqa: F401 (binary: the built C++ selector, a fixture)
from tests.test_sparse import _bound, _pruned_find_db, tiny_op, tiny_table
from tests.test_yaml_ops_train import OPS_DIR, SOLVERS


def _arch(path: Path | str, op: str = "tiny") -> SimpleNamespace:
    return SimpleNamespace(name="newgpu", kernel_lists={op: str(path)})


def test_the_list_narrows_the_rules_and_says_why(tmp_path: Path) -> None:
    table = tiny_table([(4, 4, 3.0), (4, 1, 2.0), (4, 2, 1.0), (8, 2, 7.0)])
    op = _bound(tiny_op(), table)
    listed = tmp_path / "kernels.txt"
    listed.write_text("# the build's kernels\nt1\n\nt2   # a comment after a name\nt2\n")
    problems, kernels = table[["m"]], table[["t"]]
    valid, reason = validity_on(op, problems, kernels, arch=_arch(listed), dtype="fp16", layout="rcr")
    assert valid.tolist() == [False, True, True, True]
    assert reason[0].startswith(NOT_LISTED) and "arch.kernel_lists.tiny" in reason[0]
    found = kernel_list(_arch(listed), op)
    assert found is not None and found.names == {"t1", "t2"} and len(found.sha256) == 64
    # a kernel the rules refuse keeps the rules' reason; no list: the rules alone
    rules_valid, rules_reason = op.validity(pd.DataFrame({"m": [1]}), pd.DataFrame({"t": [2]}), arch=None,
                                            dtype="fp16", layout="rcr")
    got, why = validity_on(op, pd.DataFrame({"m": [1]}), pd.DataFrame({"t": [2]}), arch=_arch(listed),
                           dtype="fp16", layout="rcr")
    assert not got[0] and why[0] == rules_reason[0] == "tile larger than the problem"
    plain, _ = validity_on(op, problems, kernels, arch=SimpleNamespace(name="x", kernel_lists={}), dtype="fp16",
                           layout="rcr")
    assert plain.all()


def test_bad_lists_are_refused_naming_file_line_and_key(tmp_path: Path) -> None:
    table = tiny_table([(4, 4, 3.0), (4, 1, 2.0)])
    op = _bound(tiny_op(), table)
    with pytest.raises(MissingFileError, match=r"arch\.kernel_lists\.tiny names it and it does not exist"):
        kernel_list(_arch(tmp_path / "absent.txt"), op)
    bad = tmp_path / "bad.txt"
    bad.write_text("t1\n  \nsolver_x\n")
    with pytest.raises(InputFileError, match=r"bad\.txt:3: arch\.kernel_lists\.tiny: 'solver_x' is not a kernel "
                                             r"name of op 'tiny'"):
        kernel_list(_arch(bad), op)
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing yet\n")
    with pytest.raises(InputFileError, match="lists no kernel"):
        kernel_list(_arch(empty), op)
    # names that parse but that no model was trained on: refused when none is in the catalogue
    other = tmp_path / "other.txt"
    other.write_text("t64\nt128\n")
    with pytest.raises(InputFileError, match=r"none of its 2 kernels is in the model's catalogue of 2"):
        check_catalogue(_arch(other), op, op.catalogue("x", "fp16", "rcr"))
    # the arch config checks the key's value
    from ckpred.schema import ArchConfig
    from ckpred.schema.convert import from_mapping
    import yaml
    from tests.conftest import REPO

    gfx942 = yaml.safe_load((REPO / "conf" / "arch" / "gfx942.yaml").read_text())
    gfx942.pop("defaults")
    with pytest.raises(ConfigValueError, match=r"arch\.kernel_lists\.tiny"):
        from_mapping(ArchConfig, {**gfx942, "kernel_lists": {"tiny": " "}})


def test_a_zero_shot_run_names_the_new_gpus_that_list_no_kernels(tmp_path: Path) -> None:
    """Where the op's missing rows mean "not applicable", a zero-shot run says which held-out GPUs
    list no kernels (only a list can say what their library lacks); never in distribution, never
    for an op whose missing rows mean nothing, never for a GPU with a list."""
    from ckpred.cv.driver import unlisted_new_gpus
    from ckpred.cv.schemes import Fold

    table = tiny_table([(4, 4, 3.0), (4, 1, 2.0), (8, 2, 7.0)])
    listed = tmp_path / "kernels.txt"
    listed.write_text("t1\nt2\n")
    gpus = {"a": SimpleNamespace(name="a", kernel_lists={}), "b": SimpleNamespace(name="b", kernel_lists={}),
            "c": SimpleNamespace(name="c", kernel_lists={"tiny": str(listed)})}

    def prepared(*names: str) -> SimpleNamespace:  # a table of these GPUs, shape i of names[i]
        return SimpleNamespace(archs=tuple(gpus[n] for n in names), arch=gpus[names[0]],
                               arch_names=lambda shapes=None: sorted({names[int(s)] for s in shapes}))

    six = prepared("a", "b", "c")
    logo = [Fold(f"leave {n} out", np.delete(np.arange(3), i), np.array([i])) for i, n in enumerate("abc")]
    op = _bound(tiny_op(absence="not_applicable"), table)
    assert unlisted_new_gpus(op, SimpleNamespace(train=six, test=six), logo) == ["a", "b"]
    assert unlisted_new_gpus(_bound(tiny_op(), table), SimpleNamespace(train=six, test=six), logo) == []
    external = [Fold("external", np.array([0]), np.array([0]), test_arch=gpus["b"])]
    one, other = prepared("a"), prepared("a")
    other.arch_names = lambda shapes=None: ["b"]
    assert unlisted_new_gpus(op, SimpleNamespace(train=one, test=other), external) == ["b"]
    assert unlisted_new_gpus(op, SimpleNamespace(train=one, test=one), [Fold("in", np.array([0]), np.array([0]))]) == []


@pytest.fixture(scope="module")
def listed_run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Zero-shot onto gfx90a_mi210 with a kernel list that leaves out one solver per direction,
    and the run's export for that arch: (run dir, export dir, listed, dropped, common overrides)."""
    from ckpred.commands.export import export_command
    from ckpred.config import compose
    from ckpred.cv.driver import cross_validate

    tmp_path = tmp_path_factory.mktemp("listed")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        train_db = _pruned_find_db(tmp_path / "gfx942.fdb.txt")
        test_db = _pruned_find_db(tmp_path / "other.fdb.txt")
        dropped = {solvers[0] for solvers in SOLVERS.values()}  # each best on the large convolutions
        listed = sorted({s for solvers in SOLVERS.values() for s in solvers} - dropped)
        (tmp_path / "gfx90a_kernels.txt").write_text("\n".join(listed) + "\n")
        common = [f"hydra.searchpath=[file://{OPS_DIR}]", "op=miopen_conv", "dtype=fp16", "data=path",
                  f"data.path={train_db}"]
        run = tmp_path / "run"
        run.mkdir()
        cross_validate(compose("train", [*common, "arch=gfx942", f"out_dir={run}", "model.n_estimators=20",
                                         "model.n_jobs=1", "baselines.plain.model.n_estimators=10",
                                         "applicability.n_estimators=30", "plots=false", "progress=false",
                                         "cv=external", "cv.data.source=path", f"cv.data.path={test_db}",
                                         "+arch@cv.arch=gfx90a_mi210",
                                         "+cv.arch.kernel_lists.miopen_conv=gfx90a_kernels.txt"]), run)
        out = export_command(compose("export", [*common, "arch=gfx90a_mi210", "+arch.kernel_lists.miopen_conv="
                                                "gfx90a_kernels.txt", f"run_dir={run}", "out_dir=ex",
                                                "parity.shapes=40"]))
        # the new GPU's problems, as ingest reads them
        from ckpred.cli import main

        assert main(["ingest", f"hydra.searchpath=[file://{OPS_DIR}]", "op=miopen_conv", "arch=gfx90a_mi210",
                     "dtype=fp16", "data=path", f"data.path={test_db}", "out=other.parquet"]) == 0
    return SimpleNamespace(dir=tmp_path, run=run, export=Path(out), listed=listed, dropped=dropped, common=common,
                           table=tmp_path / "other.parquet")


@pytest.mark.slow
def test_cv_of_a_new_gpu_ranks_its_listed_kernels_only(listed_run) -> None:  # type: ignore[no-untyped-def]
    oof = pd.read_parquet(listed_run.run / "oof_predictions.parquet")
    unlisted = oof["kernel_name"].isin(listed_run.dropped).to_numpy()
    assert unlisted.any() and not oof.loc[unlisted, "selectable"].any()
    assert oof.loc[~unlisted, "selectable"].any()
    top1 = oof[oof["selectable"]].sort_values("score_model", ascending=False).groupby("shape").head(1)
    assert not top1["kernel_name"].isin(listed_run.dropped).any()
    assert oof.loc[unlisted, "score_model"].isna().all()  # not even scored
    # the test table measures the dropped solvers, fastest on some problems: the list is what keeps them out
    best = oof[oof["measured"]].sort_values("perf", ascending=False).groupby("shape").head(1)
    assert best["kernel_name"].isin(listed_run.dropped).any()


@pytest.mark.slow
def test_the_export_for_the_new_gpu_holds_its_list(listed_run, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from ckpred.commands.export import export_command
    from ckpred.config import compose
    from ckpred.runtime import KernelSelector

    manifest = json.loads((listed_run.export / "manifest.json").read_text())
    record = manifest["selection"]["kernel_list"]
    assert record["key"] == "arch.kernel_lists.miopen_conv" and record["listed"] == len(listed_run.listed)
    assert record["in_catalogue"] == len(listed_run.listed) and manifest["parity"]["top1_agreement"] == 1.0
    sel = KernelSelector.load(listed_run.export, cache_size=0)
    answers = sel.select_many(_problems(listed_run, sel), top_k=9)
    assert all(a.ok and not set(a.kernels) & listed_run.dropped for a in answers)
    assert max(a.num_valid for a in answers) <= len(listed_run.listed)
    # a list naming no kernel the run was trained on is refused before anything is written
    monkeypatch.chdir(listed_run.dir)
    (listed_run.dir / "none.txt").write_text("ConvMlirIgemmFwdXdlops\n")
    with pytest.raises(InputFileError, match="none of its 1 kernels is in the model's catalogue"):
        export_command(compose("export", [*listed_run.common, "arch=gfx90a_mi210",
                                          "+arch.kernel_lists.miopen_conv=none.txt", f"run_dir={listed_run.run}",
                                          "out_dir=ex2"]))
    assert not (listed_run.dir / "ex2").exists()


def _problems(listed_run, sel) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    table = pd.read_parquet(listed_run.table)
    return table[list(sel.problem_fields)].drop_duplicates().reset_index(drop=True)


@pytest.mark.slow
def test_the_cpp_selector_answers_the_listed_kernels_as_python(listed_run, binary, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ckpred.runtime import KernelSelector

    sel = KernelSelector.load(listed_run.export, cache_size=0)
    problems = _problems(listed_run, sel)
    answers = sel.select_many(problems, top_k=9)
    shape_file = tmp_path / "shapes.txt"
    shape_file.write_text("\n".join(",".join(f"{k}={v}" for k, v in r.items())
                                    for r in problems.to_dict("records")) + "\n")
    got = _run(binary, listed_run.export, "--top-k", 9, "--shapes", shape_file)
    assert got.returncode == 0, got.stderr
    cpp = [json.loads(line) for line in got.stdout.splitlines()]
    assert [[k["id"] for k in g["kernels"]] for g in cpp] == [list(a.ids) for a in answers]
    assert all(not {k["name"] for k in g["kernels"]} & listed_run.dropped for g in cpp)
