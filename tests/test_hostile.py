"""Hostile inputs through the CLI: a named one-line error, the right exit status, nothing lost.

Every case runs ``ckpred.cli.main`` in-process (the real Hydra composition, schema checks and
command code) in a temporary working directory, and asserts that

* a refused run exits non-zero with one line ``ckpred <command>: error: ...`` naming the key
  and value (or, for errors Hydra finds while composing -- an unknown option, a value of the
  wrong type, an override it cannot parse -- Hydra's own message naming the key);
* no traceback is printed, accepted or refused;
* input files, and outputs that existed before a refused run, are byte-identical afterwards.

A few runs go through a subprocess to check the same on the real process boundary. Structured
inputs (override values of config keys, benchmark rows) are generated with hypothesis.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckpred.cli
from ckpred.export import manifest as mf
from ckpred.util import clean_stale_temps
from tests.conftest import data_file

#: The real 4-shape CK table (fp16 parity sweep): fewer shapes than the default 5 CV folds.
FOUR_SHAPES = ("ck_gemm_gfx950_results", "parity_sweep_results.csv")
#: Small, fast settings for commands that get past composition.
TINY = ["shapes=tiny", "model.n_estimators=3", "model.n_jobs=1", "rows.max_per_shape=32",
        "baselines.reference.enabled=false", "plots=false", "progress=false", "save_pipeline=false"]
#: TINY for a table read from files (the shape set is the simulator's).
TINY_PATH = [o for o in TINY if not o.startswith("shapes=")]
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s+File \".*\", line \d+", re.M)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``python -m ckpred <argv>`` in-process: (exit status, stdout, stderr)."""
    try:
        rc = ckpred.cli.main(argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
        message = "" if isinstance(exc.code, int) or exc.code is None else f"{exc.code}\n"
    else:
        message = ""
    out, err = capsys.readouterr()
    err += message  # the interpreter prints a SystemExit message to stderr
    if os.environ.get("CKPRED_HOSTILE_TALLY"):  # counts for a report: one JSON line per run
        with open(os.environ["CKPRED_HOSTILE_TALLY"], "a") as fh:
            fh.write(json.dumps({"argv": argv, "rc": rc, "traceback": bool(TRACEBACK.search(err)),
                                 "named": bool(re.match(r"ckpred [\w-]+: error: ", err))}) + "\n")
    return rc, out, err


@pytest.fixture()
def composed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Replace every command's task by a recorder: the run stops after composition and the
    schema checks, which is where most hostile values must be refused."""
    seen: list[Any] = []
    monkeypatch.setattr(ckpred.cli, "_load_task", lambda spec: lambda cfg: seen.append(cfg))
    return seen


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Hydra's run dirs, data/cache and relative outputs land here, never in the checkout.
    monkeypatch.chdir(tmp_path)
    # Hydra re-raises instead of reporting when a tracer is set (hypothesis' explain phase and
    # coverage set one): keep what a user sees.
    monkeypatch.setattr("hydra._internal.utils.is_under_debugger", lambda: False)


def assert_named(rc: int, err: str, command: str, *names: str) -> None:
    """A refusal: non-zero exit, one ``ckpred <command>: error:`` line naming each of ``names``."""
    assert rc != 0
    assert not TRACEBACK.search(err), err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"ckpred {command}: error: "), err
    for name in names:
        assert name in lines[0], (name, err)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- refused when the config is composed (before any work) ----------------------------------------
COMPOSE_REFUSALS = [
    # (command, overrides, words the error must name)
    ("train", ["seed=-1"], ["'seed'", "-1", "[0, 4294967295]"]),
    ("train", [f"seed={2**32}"], ["'seed'", str(2**32)]),
    ("train", ["data.seed=-7"], ["'data.seed'", "-7"]),
    ("tune", ["tune.sampler_seed=-1"], ["'tune.sampler_seed'", "-1"]),
    ("train", ["+model.n_estimatorz=5"], ["'model.n_estimatorz'", "5", "did you mean 'n_estimators'"]),
    ("train", ["+cv.n_split=3"], ["'cv.n_split'", "'n_splits'"]),
    ("train", ["+epochs=3"], ["'epochs'", "allowed keys"]),
    # a typo without `+` gets the closest key too (Hydra's own error offers none)
    ("train", ["dtyp=fp8"], ["'dtyp'", "did you mean 'dtype'"]),
    ("train", ["model.n_estimatorz=5"], ["'model.n_estimatorz'", "did you mean 'n_estimators'"]),
    ("train", ["expriment=reference"], ["'expriment'", "did you mean 'experiment'"]),
    ("export", ["reranker.num_leafs=7"], ["'reranker.num_leafs'", "did you mean 'num_leaves'"]),
    ("export", ["+reranker.depth=3"], ["'reranker.depth'"]),
    ("select", ["problem.m=1", "problem.n=2", "problem.k=3", "+top_kk=3"], ["'top_kk'", "'top_k'"]),
    ("train", ["arch=gfx90a", "dtype=fp8"], ["'dtype'", "'fp8'", "arch=gfx90a", "'fp16'"]),
    ("train", ["arch=gfx90a", "dtype=bf8"], ["'dtype'", "'bf8'", "arch=gfx90a"]),
    ("simulate", ["arch=gfx90a", "dtype=fp8"], ["'dtype'", "arch=gfx90a"]),
    ("ingest", ["arch=gfx90a", "dtype=fp8", "data.path=x.csv"], ["'dtype'", "arch=gfx90a"]),
    ("train", ["model.n_jobs=0"], ["'model.n_jobs'", "0", "[1, "]),
    ("train", ["model.n_jobs=-1"], ["'model.n_jobs'", "-1", "'all cores'"]),
    ("train", ["model.n_jobs=100000"], ["'model.n_jobs'", "100000"]),
    ("train", ["baselines.reference.model.n_jobs=0"], ["'model.n_jobs'", "0"]),
    ("select", ["problem.m=1", "problem.n=2", "problem.k=3", "threads=0"], ["'threads'", "0"]),
    ("select", ["problem.m=1", "problem.n=2", "problem.k=3", "threads=4096"], ["'threads'", "4096"]),
    ("train", ["cv=holdout", "cv.test_fraction=1.0"], ["'cv.test_fraction'", "1.0"]),
    ("train", ["cv.n_splits=1"], ["'cv.n_splits'", "1"]),
    ("export", ["prune_top_n=0"], ["'prune_top_n'", "0"]),
    # a key the selected option does not read: refused, naming the option that reads it
    ("train", ["data.path=x.csv"], ["'data.path'", "'x.csv'", "data=path"]),
    ("train", ["data.format=csv"], ["'data.format'", "data=path"]),
    ("train", ["data=path", "data.path=x.csv", "data.seed=3"], ["'data.seed'", "data=simulated"]),
    ("train", ["data=path", "data.path=x.csv", "shapes=tiny"], ["'shapes'", "data=simulated"]),
    ("train", ["data=path", "data.path=x.csv", "shapes.max_shapes=3"], ["'shapes.max_shapes'", "data=simulated"]),
    ("train", ["cv.test_fraction=0.3"], ["'cv.test_fraction'", "cv=group_kfold", "cv=holdout"]),
    ("train", ["cv=holdout", "cv.n_splits=3"], ["'cv.n_splits'", "cv=group_kfold"]),
    ("train", ["model=lgbm_regressor", "model.relevance_exponent=2"], ["'model.relevance_exponent'",
                                                                       "model=lgbm_ranker"]),
    ("train", ["target=relative"], ["'target'", "model=lgbm_regressor"]),
    ("train", ["model=lgbm_regressor", "target.floor=0.01"], ["'target.floor'", "target=relative"]),
    ("train", ["model.dask.n_workers=4"], ["'model.dask.n_workers'", "model.backend=dask"]),
    ("train", ["model.validation_fraction=0.3"], ["'model.validation_fraction'", "early_stopping_rounds"]),
    ("export", ["select=pruned", "reranker.num_leaves=7"], ["'reranker.num_leaves'", "select=reranked"]),
    ("export", ["select=full", "prune_top_n=3"], ["'prune_top_n'", "select=full"]),
    ("export", ["autotune.kind=table"], ["'autotune.kind'", "run_dir"]),
    ("export", ["cv.n_splits=3"], ["'cv.n_splits'", "export does not read it"]),
    ("ingest", ["data.path=x.csv", "model.n_estimators=3"], ["'model.n_estimators'", "ingest reads only"]),
    ("select", ["problem.m=1", "problem.n=2", "problem.k=3", "model=lgbm_regressor"], ["'model'", "select answers"]),
    ("select", ["problem.m=1", "problem.n=2", "problem.k=3", "model_dir=x", "exports_dir=y"], ["'exports_dir'"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("command", "overrides", "names"), COMPOSE_REFUSALS,
                         ids=[" ".join(c[1]) for c in COMPOSE_REFUSALS])
def test_refused_at_compose(command: str, overrides: list[str], names: list[str],
                            composed: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run([command, *overrides], capsys)
    assert_named(rc, err, command, *names)
    assert composed == []  # the task never started


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    ["data=path", "data.path=x.csv"], ["data.source=path", "data.path=x.csv"], ["cv=holdout", "cv.test_fraction=0.3"],
    ["model=lgbm_regressor", "target=relative", "target.floor=0.01"], ["model.backend=dask", "model.dask.n_workers=1"],
    ["data=path", "data.path=x.csv", "cv=external", "shapes=tiny"],  # the external test table is simulated
    ["shapes=tiny"], ["model.early_stopping_rounds=5", "model.validation_fraction=0.3"],
])
def test_read_keys_are_accepted(overrides: list[str], composed: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["train", *overrides], capsys)
    assert rc == 0 and len(composed) == 1, err


def test_hydra_groups_and_modes(composed: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["train", "hydra/launcher=joblib", "hydra.launcher.n_jobs=1"], capsys)
    assert rc == 0 and len(composed) == 1, err  # Hydra's own groups are not ckpred's keys
    rc, _, err = run(["train", "-m", "seed=1,2", "--cfg", "job"], capsys)
    assert_named(rc, err, "train", "-m", "--cfg", "one of")


@pytest.mark.slow
def test_output_paths_refused_before_work(tmp_path: Path, composed: list[Any],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    a_dir, a_file, parquet_dir = tmp_path / "adir", tmp_path / "afile.parquet", tmp_path / "t.parquet"
    a_dir.mkdir()
    parquet_dir.mkdir()
    a_file.write_bytes(b"precious")
    cases = [
        ("simulate", [f"out={a_dir}"], ["'out'", "existing directory"]),
        ("simulate", [f"log={a_dir}"], ["'log'", "existing directory"]),
        ("simulate", [f"out={a_file}/x.parquet"], ["'out'", "is a file"]),
        # a .parquet out is one file; any other is the directory of a partitioned table
        ("ingest", ["data.path=in.csv", f"out={parquet_dir}"], ["'out'", "existing directory"]),
        ("ingest", ["data.path=in.csv", f"out={a_file}/table"], ["'out'", "is a file"]),
        ("ingest", ["data.path=in.csv", f"rejects={a_dir}"], ["'rejects'", "existing directory"]),
        ("train", [f"out_dir={a_file}"], ["'out_dir'", "existing file"]),
        ("train", [f"out_dir={a_file}/run"], ["'out_dir'", "is a file"]),
        ("export", [f"out_dir={a_file}"], ["'out_dir'", "existing file"]),
    ]
    for command, overrides, names in cases:
        rc, _, err = run([command, *overrides], capsys)
        assert_named(rc, err, command, *names)
    assert composed == [] and a_file.read_bytes() == b"precious" and list(a_dir.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only-mode directory")
def test_unwritable_output_dir_refused(tmp_path: Path, composed: list[Any],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    rc, _, err = run(["simulate", f"out={locked}/t.parquet"], capsys)
    assert_named(rc, err, "simulate", "'out'", "not writable")


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux /proc")
def test_output_the_filesystem_refuses_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # /proc passes the permission check (for root too) and refuses the write itself.
    rc, _, err = run(["simulate", "shapes=tiny", "out=/proc/ckpred-hostile.parquet"], capsys)
    assert_named(rc, err, "simulate", "cannot write /proc/ckpred-hostile.parquet")


@pytest.mark.slow
def test_hydra_composition_errors_name_the_key_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, name in ((["train", "arch=null"], "arch"), (["train", "model=0"], "model"),
                       (["train", "dtype=fp9"], "dtype"), (["train", "model.n_jobs=1.5"], "model.n_jobs"),
                       (["select", "problem.m=abc", "problem.n=2", "problem.k=3"], "problem.m"), (["train", "cv=nope"], "cv"),
                       (["select", "problem.m=true", "problem.n=2", "problem.k=3"], "problem.m")):
        rc, _, err = run(argv, capsys)
        assert rc == 1 and not TRACEBACK.search(err), err
        assert name in err


def test_unparsable_override_is_named(composed: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    for override in ("model.n_estimators=[1", "seed=1)", "a=b=c", "seed"):
        rc, _, err = run(["train", override], capsys)
        assert_named(rc, err, "train", f"cannot parse override {override!r}")
    assert composed == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["a b;$(touch PWNED)`touch PWNED`.csv", "|&><!#.csv", "ünï 表 \u00e9.csv",
                                  "q'uo\"te.csv", "-dash.csv", "~tilde%%{x}.csv"])
def test_shell_metacharacters_quotes_spaces_and_unicode_in_paths_are_plain_text(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cl01-cl05 cl20 cl21: such characters in a path are its name, nothing else -- the file is
    read and the output written under exactly that name, no shell runs, nothing else is made."""
    (tmp_path / name).write_bytes(data_file(*FOUR_SHAPES).read_bytes())
    out = name.replace(".csv", " out.parquet")
    quoted = lambda text: "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"  # Hydra's quoting
    rc, _, err = run(["ingest", "dtype=fp16", "data.source=path", f"data.path={quoted(name)}", f"out={quoted(out)}"],
                     capsys)
    assert rc == 0 and not TRACEBACK.search(err), err
    table = pd.read_parquet(tmp_path / out)
    assert len(table) > 0 and table["source"].str.startswith(f"{name}:").all()
    made = {p.name for p in tmp_path.iterdir()} - {name, "runs"}
    assert made == {out, out.replace(".parquet", ".rejects.csv")}, made


@pytest.mark.slow
def test_data_paths_read_from_a_directory_whose_name_holds_glob_characters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A relative ``data.path`` was globbed with the working directory's name in the pattern: in
    ``proj[1]`` no file could be read ("no file matches this pattern"). Only what the user wrote
    is a pattern; a file whose own name holds ``[`` is read when the pattern matches nothing."""
    work = tmp_path / "proj[1]*?"
    work.mkdir()
    monkeypatch.chdir(work)
    rows = data_file(*FOUR_SHAPES).read_bytes()
    (work / "in.csv").write_bytes(rows)
    (work / "[x].csv").write_bytes(rows)
    for path, out in (("in.csv", "a.parquet"), ("'i*.csv'", "b.parquet"), ("'[x].csv'", "c.parquet")):
        rc, _, err = run(["ingest", "dtype=fp16", "data.source=path", f"data.path={path}", f"out={out}"], capsys)
        assert rc == 0 and not TRACEBACK.search(err), (path, err)
        assert len(pd.read_parquet(work / out)) > 0
    rc, _, err = run(["ingest", "dtype=fp16", "data.source=path", "data.path='n*.csv'", "out=d.parquet"], capsys)
    assert_named(rc, err, "ingest", "n*.csv", "no file matches this pattern")


def test_an_unescaped_quote_inside_a_quoted_value_is_named(composed: list[Any],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """cl05: Hydra's grammar error, in one line naming the override and how to quote."""
    rc, _, err = run(["ingest", "data.path='q'uo\"te.csv'"], capsys)
    assert_named(rc, err, "ingest", "cannot parse override", "quote values")
    assert composed == []


@pytest.mark.parametrize("char", ["\x1b", "\r", "\x07", "\x08", "\x9b", "\u202e", "\n", "\t"])
def test_control_characters_are_refused_without_being_echoed(char: str, composed: list[Any],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """cl17: an ESC in an override reached the terminal raw (in Hydra's token error)."""
    rc, out, err = run(["train", f"data.path=a{char}[31mred"], capsys)
    assert_named(rc, err, "train", "control character", ascii(char))
    assert char not in err.rstrip("\n") and char not in out and composed == []


@pytest.mark.slow
def test_overlong_keys_values_and_paths_are_named_in_a_short_line(tmp_path: Path, composed: list[Any],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """cl09-cl12: File name too long, from Hydra's group lookup or the file system, was a traceback."""
    long = "x" * 10_000
    for argv, names in ((["train", f"+model.{long}=1"], ["too long", "at most 255"]),
                        (["train", f"{long}=1"], ["too long"]),
                        (["ingest", "data.path=in.csv", f"out={long}.parquet"], ["File name too long", "10,"]),
                        (["train", f"out_dir={tmp_path}/{long}"], ["File name too long"])):
        rc, _, err = run(argv, capsys)
        assert_named(rc, err, argv[0], *names)
        assert len(err) < 1000, err
    assert composed == []


@pytest.mark.slow
def test_overlong_data_path_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["ingest", f"data.path={'y' * 100_000}.csv", f"out={tmp_path / 'o.parquet'}"], capsys)
    assert_named(rc, err, "ingest")
    assert len(err) < 1000, err


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux /proc")
@pytest.mark.parametrize("argv", [["hydra.run.dir=/proc/self/x"], ["hydra.run.dir=/proc/ckpred-x"],
                                  ["hydra.sweep.dir=/proc/ckpred-x"], ["out_dir=/proc/ckpred-x"]])
def test_run_dirs_under_proc_are_named(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["train", "shapes=tiny", *argv], capsys)
    assert_named(rc, err, "train", "/proc/")


@pytest.mark.slow
def test_a_refused_run_leaves_no_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hydra makes runs/train/<time>/.hydra before the task starts; a refusal removes it (and the
    parents it made), but never a folder that was there before."""
    rc, _, err = run(["train", "seed=-1"], capsys)
    assert_named(rc, err, "train", "'seed'")
    rc, _, err = run(["train", "shapes=tiny", "data.seed=2", "data.cache_dir=/proc/ckpred-x"], capsys)
    assert rc == 1 and not TRACEBACK.search(err), err
    assert not (tmp_path / "runs").exists()
    (tmp_path / "runs" / "train" / "mine").mkdir(parents=True)
    run(["train", "seed=-1"], capsys)
    assert [p.name for p in (tmp_path / "runs" / "train").iterdir()] == ["mine"]
    (tmp_path / "given").mkdir()
    (tmp_path / "given" / "notes.txt").write_text("mine")
    run(["train", "seed=-1", f"hydra.run.dir={tmp_path / 'given'}"], capsys)
    assert (tmp_path / "given" / "notes.txt").read_text() == "mine"
    # an out_dir the run made before it was refused (more folds than the table's shapes)
    table = data_file(*FOUR_SHAPES)
    rc, _, err = run(["train", *TINY_PATH, "dtype=fp16", "data.source=path", f"data.path={table}",
                      f"out_dir={tmp_path / 'new' / 'run'}"], capsys)
    assert_named(rc, err, "train", "'cv.n_splits'")
    assert not (tmp_path / "new").exists()


# -- a user's config files (F20, F21) --------------------------------------------------------------
_BOMB = "x0: &x0 [a,a,a,a,a,a,a,a,a]\n" + "".join(
    f"x{i}: &x{i} [{','.join([f'*x{i - 1}'] * 9)}]\n" for i in range(1, 10))
HOSTILE_YAML = {
    # fd23: nine levels of nine aliases (1 KB) expand to 387 million nodes; it never finished
    "alias bomb": (_BOMB.encode(), ["alias bomb", "100,000 nodes"]),
    "duplicate key": (b"rows: 1\nrows: 2\n", ["'rows' given twice", "line 2"]),  # fd22
    "python tag": (b"x: !!python/object/apply:os.system ['touch PWNED']\n", ["!!python/object/apply"]),  # fd24
    "not UTF-8": (b"x: \"caf\xe9\"\n", ["byte 0xe9 is not UTF-8", "line 39"]),  # fd27 (after the op's 38 lines)
    "recursive alias": (b"x: &r [1, *r]\n", ["recursive"]),
    "deep nesting": (b"x: " + b"[" * 5000 + b"]" * 5000 + b"\n", ["nest"]),
    "not YAML": (b"x: [1, 2\n", ["not YAML"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(HOSTILE_YAML))
def test_hostile_yaml_in_a_user_config_dir_is_named_quickly(kind: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import REPO

    data, names = HOSTILE_YAML[kind]
    conf = tmp_path / "conf" / "op"
    conf.mkdir(parents=True)
    op = (REPO / "tests" / "fixtures" / "user_op" / "op" / "tmm.yaml").read_bytes()
    (conf / "tmm.yaml").write_bytes(data if kind == "duplicate key" else op + data)
    if kind == "duplicate key":  # a key given twice inside the op's own mapping
        (conf / "tmm.yaml").write_bytes(op.replace(b"  rows: {kind: int}\n", b"  rows: {kind: int}\n" * 2))
        names = ["'rows' given twice", "line 7"]
    start = time.perf_counter()
    rc, _, err = run(["ingest", "--config-dir", str(tmp_path / "conf"), "op=tmm", "data.path=x.csv",
                      f"out={tmp_path / 'o.parquet'}"], capsys)
    assert time.perf_counter() - start < 30
    assert_named(rc, err, "ingest", "cannot read", str(conf / "tmm.yaml"), *names)
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


def test_hostile_yaml_through_compose_raises_the_named_error(tmp_path: Path) -> None:
    from ckpred.config import compose
    from ckpred.errors import InputFileError

    (tmp_path / "op").mkdir()
    (tmp_path / "op" / "bad.yaml").write_bytes(_BOMB.encode())
    with pytest.raises(InputFileError, match="alias bomb"):
        compose("ingest", ["op=bad", "data.path=x.csv"], config_dir=tmp_path)


def test_a_plugin_raising_at_import_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """pl09: a plug-in module that raises while it is imported."""
    from tests.conftest import REPO

    (tmp_path / "boom_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "conf" / "op").mkdir(parents=True)
    op = (REPO / "tests" / "fixtures" / "user_op" / "op" / "tmm.yaml").read_text()
    (tmp_path / "conf" / "op" / "tmm.yaml").write_text(op.replace("name: tmm\n", "name: tmm\nplugin: boom_plugin:Op\n"))
    rc, _, err = run(["ingest", "--config-dir", str(tmp_path / "conf"), "op=tmm", "data.path=x.csv",
                      f"out={tmp_path / 'o.parquet'}"], capsys)
    assert_named(rc, err, "ingest", "'op.plugin'", "boom_plugin:Op")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["ingest", "train", "export", "select"])
@pytest.mark.parametrize(("group", "field"), [("problem_fields", "alpha: {kind: float, default: 1.5}"),
                                              ("kernel_fields", "ratio: {kind: float}")])
def test_a_float_field_is_refused_at_compose(command: str, group: str, field: str, tmp_path: Path,
                                             composed: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    """fd10, fd10e: a float problem field trained, then every selection failed inside onnxruntime
    (double against the int64 problem input); float kernel fields failed the export the same way."""
    from tests.conftest import REPO

    (tmp_path / "conf" / "op").mkdir(parents=True)
    op = (REPO / "tests" / "fixtures" / "user_op" / "op" / "tmm.yaml").read_text()
    (tmp_path / "conf" / "op" / "tmm.yaml").write_text(op.replace(f"{group}:\n", f"{group}:\n  {field}\n"))
    name = field.split(":")[0]
    extra = {"select": ["problem.rows=1", "problem.cols=1", "problem.depth=1", "problem.precision=fp16"]}.get(
        command, ["data=path", "data.path=x.csv"] if command != "ingest" else ["data.path=x.csv"])
    rc, _, err = run([command, "--config-dir", str(tmp_path / "conf"), "op=tmm", "features=minimal", *extra], capsys)
    assert_named(rc, err, command, f"'op.{group}.{name}.kind'", "'float'", "int64")
    assert composed == []


@pytest.mark.slow
def test_a_copy_of_an_arch_config_names_its_isa_then_simulates(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A copy of gfx950.yaml under another name was refused blaming the dtype, then (with the
    ISA set) the simulator raised a ValueError: the key to set is named, and the copy simulates."""
    from tests.conftest import REPO

    (tmp_path / "conf" / "arch").mkdir(parents=True)
    copy = (REPO / "conf" / "arch" / "gfx950.yaml").read_text().replace("name: gfx950", "name: mygpu")
    (tmp_path / "conf" / "arch" / "mygpu.yaml").write_text(copy)
    argv = ["simulate", "--config-dir", str(tmp_path / "conf"), "arch=mygpu", "shapes=tiny", "shapes.max_shapes=2",
            f"data.cache_dir={tmp_path / 'cache'}", f"out={tmp_path / 's.parquet'}"]
    rc, _, err = run(argv, capsys)
    assert_named(rc, err, "simulate", "'arch.isa'", "'mygpu'", "gfx950", "isa: <ISA>")
    (tmp_path / "conf" / "arch" / "mygpu.yaml").write_text(copy.replace("name: mygpu", "name: mygpu\nisa: gfx950"))
    rc, out, err = run(argv, capsys)
    assert rc == 0 and "2 shapes x 4,608 kernels" in out, err


# -- refused once the data is known (before any fitting) ------------------------------------------
def test_more_folds_than_shapes_of_a_real_table(capsys: pytest.CaptureFixture[str]) -> None:
    table = data_file(*FOUR_SHAPES)
    before = digest(table)
    rc, _, err = run(["train", *TINY_PATH, "dtype=fp16", "data.source=path", f"data.path={table}"], capsys)
    assert_named(rc, err, "train", "'cv.n_splits'", "5", "[2, 4]", "4 shapes")
    assert digest(table) == before


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "names"), [
    (["cv=holdout", "cv.test_fraction=0.99"], ["'cv.test_fraction'", "0.99", "12 shapes"]),
    (["cv=leave_family_out", f"shapes.families.mix.m=[{','.join(['1'] * 12)}]"],  # M=1 only: one family
     ["'cv'", "'leave_family_out'", "two families"]),
    (["arch=gfx1151", "dtype=fp8"], ["'arch.isa'", "'gfx1151'", "gfx950"]),  # no CK warp tiles for the ISA
    (["arch=gfx942", "dtype=fp32"], ["'dtype'", "'fp32'", "arch=gfx942", "'fp16'"]),
    (["arch=gfx90a", "dtype=fp32"], ["'dtype'", "'fp32'", "arch=gfx90a"]),
])
def test_refused_before_fitting(overrides: list[str], names: list[str], tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["train", *TINY, f"out_dir={tmp_path / 'run'}", *overrides], capsys)
    assert_named(rc, err, "train", *names)
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow
def test_features_params_unknown_to_the_transformer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["train", *TINY, "+features.groups.0.params.foo=1"], capsys)
    assert_named(rc, err, "train", "features.groups[0].params.foo")


# -- select ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export_helpers import TRAIN_SHAPES, configs, fit_pipeline, gemm, synthetic_table

    from ckpred.export.build import export_pipeline

    op, cfg = gemm(), configs()
    table = synthetic_table(op, cfg, TRAIN_SHAPES, kernels=200)
    pipe = fit_pipeline(op, cfg, table, n_estimators=10)
    out = tmp_path_factory.mktemp("exports") / "gemm_universal_gfx950_fp8_rcr"
    export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=out,
                    training=mf.training_section(table, op))
    return out


@pytest.mark.slow
def test_select_unknown_problem_field(export_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {p.name: digest(p) for p in export_dir.iterdir()}
    rc, _, err = run(["select", f"model_dir={export_dir}", "problem.m=128", "problem.n=1536", "problem.k=7168",
                      "+problem.q=3"], capsys)
    assert_named(rc, err, "select", "'problem.q'", "3", "'split_k'")
    rc, out, err = run(["select", f"model_dir={export_dir}", "problem.m=128", "problem.n=1536",
                        "problem.k=7168", "json=true"], capsys)
    assert rc == 0 and '"ok": true' in out and not err
    assert {p.name: digest(p) for p in export_dir.iterdir()} == before


#: The Python runtime's own problem-value checks (bools, > int64, below a field's minimum).
RUNTIME_CHECKS = hasattr(mf, "check_manifest")


@pytest.mark.slow
@pytest.mark.skipif(not RUNTIME_CHECKS, reason="needs the runtime's problem-value checks (ckpred.runtime)")
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["m", "n", "k", "split_k"]),
       value=st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([2**63, 2**63 - 1, -(2**63), 0, -1])))
def test_select_problem_values(field: str, value: int, export_dir: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    problem = {"m": 128, "n": 1536, "k": 7168, "split_k": 1, field: value}
    rc, out, err = run(["select", f"model_dir={export_dir}", "json=true",
                        *(f"problem.{k}={v}" for k, v in problem.items())], capsys)
    assert not TRACEBACK.search(err), err
    if rc:
        assert_named(rc, err, "select", f"problem.{field}")
    else:
        assert out.startswith("{")


# -- structured fuzz of config overrides ----------------------------------------------------------
#: Keys of ``train`` with the kind of value their schema declares.
TRAIN_KEYS = ["seed", "data.seed", "model.n_estimators", "model.learning_rate", "model.num_leaves",
              "model.max_depth", "model.n_jobs", "model.subsample", "model.max_bin", "cv.n_splits",
              "cv.test_fraction", "rows.max_per_shape", "rows.keep_top", "target.floor", "arch", "dtype",
              "layout", "cv", "model", "out_dir", "warm_start", "plots"]
VALUES = st.one_of(
    st.integers(-(2**66), 2**66).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "null", "true", "???", "${seed}", "${oops}", "[1,2]", "{a: 1}", "-0", "1e309",
                     "'x y'", "gfx9000", "fp4", "\\", "'", "nan", "inf", "0x10"]),
    st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=12),
)


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(TRAIN_KEYS), value=VALUES, add=st.booleans())
def test_fuzzed_train_overrides(key: str, value: str, add: bool, composed: list[Any],
                                capsys: pytest.CaptureFixture[str]) -> None:
    composed.clear()
    override = f"{'+' if add else ''}{key}={value}"
    rc, _, err = run(["train", override], capsys)
    assert not TRACEBACK.search(err), (override, err)
    if rc == 0:
        assert len(composed) == 1  # accepted: the task ran with a schema-valid config
    else:
        assert composed == [] and err.strip(), override
        first = err.strip().splitlines()[0]
        # Either ckpred's one-line error or Hydra's composition error; both name the key.
        assert first.startswith("ckpred train: error: ") or key.split(".")[0] in err \
            or "override" in err.lower() or "interpolation" in err.lower(), (override, err)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True),
       node=st.sampled_from(["", "model.", "cv.", "rows.", "data.", "baselines.", "features."]))
def test_fuzzed_added_keys_are_refused_or_declared(name: str, node: str, composed: list[Any],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    composed.clear()
    rc, _, err = run(["train", f"+{node}{name}=1"], capsys)
    assert not TRACEBACK.search(err), err
    if rc == 0:  # accepted only when the schema declares the key (then `+` adds nothing new)
        pytest.fail(f"+{node}{name}=1 was accepted")
    assert composed == []


# -- benchmark rows -------------------------------------------------------------------------------
GOOD_KERNEL = "gemm_fp16_rcr_compv3_cshuffle_intrawave_False_False_False_False_64x64x64_4x1x1_16x16x16"
CELL = st.one_of(st.integers(-(2**64), 2**64).map(str), st.floats().map(repr),
                 st.sampled_from(["", "nan", "-0", "1e400", "abc", "True", " 7", "\ufeff1", '"1,2"']))


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from(["M", "K", "latency_ms", "tflops", "kernel", "none"]), CELL),
                     min_size=1, max_size=8))
def test_fuzzed_benchmark_rows_are_kept_or_rejected(rows: list[tuple[str, str]], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / f"bench-{len(list(tmp_path.glob('bench-*.csv')))}.csv"
    lines = ["kernel,problem_idx,M,N,K,latency_ms,tflops,non_zero"]
    for i, (column, cell) in enumerate(rows):
        # N is unique per row, so no two rows are repeats of one measurement (nothing merges).
        rec = {"kernel": GOOD_KERNEL, "problem_idx": str(i), "M": "256", "N": str(256 * (i + 1)), "K": "1024",
               "latency_ms": "0.05", "tflops": "10.0", "non_zero": "1"}
        if column != "none":
            rec[column] = cell.replace(",", ";").replace("\n", " ")
        lines.append(",".join(rec.values()))
    src.write_text("\n".join(lines) + "\n")
    before = digest(src)
    out = src.with_suffix(".parquet")
    rc, _, err = run(["ingest", "dtype=fp16", "data.source=path", f"data.path={src}", f"out={out}"], capsys)
    assert not TRACEBACK.search(err), err
    assert digest(src) == before
    if rc:  # refused as a whole: nothing usable, a named reason, no table written
        assert_named(rc, err, "ingest", "nothing written")
        assert not out.exists()
        return
    rejects = out.with_name(f"{out.stem}.rejects.csv")
    rejected = len(pd.read_csv(rejects))
    kept = len(pd.read_parquet(out))  # valid rows and kept invalid ones (is_valid=False)
    assert kept + rejected == len(rows), (kept, rejected, lines)  # rows lost: 0


@pytest.mark.slow
def test_refused_ingest_leaves_inputs_and_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.csv"
    src.write_bytes(data_file(*FOUR_SHAPES).read_bytes())
    out = tmp_path / "table.parquet"
    out.write_bytes(b"an earlier table")
    for bad in (["seed=-1"], ["+data.formatt=csv"], ["arch=gfx90a", "dtype=fp8"], [f"rejects={tmp_path}"]):
        rc, _, err = run(["ingest", "dtype=fp16", "data.source=path", f"data.path={src}", f"out={out}", *bad],
                         capsys)
        assert rc != 0 and not TRACEBACK.search(err), err
        assert out.read_bytes() == b"an earlier table"
        assert src.read_bytes() == data_file(*FOUR_SHAPES).read_bytes()


# -- the simulator cache --------------------------------------------------------------------------
@pytest.mark.slow
def test_truncated_cache_is_regenerated_not_fatal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    argv = ["simulate", "shapes=tiny", f"data.cache_dir={cache}"]
    assert run([*argv, "out=a.parquet"], capsys)[0] == 0
    (cached,) = cache.glob("*.parquet")
    cached.write_bytes(cached.read_bytes()[: cached.stat().st_size // 3])
    rc, out, err = run([*argv, "out=b.parquet"], capsys)
    assert rc == 0 and not TRACEBACK.search(err), err
    assert "unusable" in out + err and "regenerating" in out + err
    rc, out, err = run([*argv, "out=c.parquet"], capsys)  # the damage does not persist
    assert rc == 0 and "unusable" not in out + err
    assert digest(tmp_path / "a.parquet") == digest(tmp_path / "b.parquet") == digest(tmp_path / "c.parquet")
    assert [p.name for p in cache.iterdir()] == [cached.name]


# -- export directory: symlink, races, killed writers ---------------------------------------------
FILES = {"model.onnx": b"m" * 4096, "scorer.onnx": b"s" * 4096, "manifest.json": b"{}"}


def test_symlinked_export_dir_is_followed(tmp_path: Path) -> None:
    real = tmp_path / "v3"
    mf.write_export_dir(real, {**FILES, "manifest.json": b"old"})
    link = tmp_path / "current"
    link.symlink_to(real)
    mf.write_export_dir(link, FILES)
    assert link.is_symlink() and link.resolve() == real
    assert (real / "manifest.json").read_bytes() == b"{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "v3"]


def _write_one(args: tuple[str, int, float]) -> str:
    parent, i, start = args
    while time.time() < start:  # every writer reaches the swap at about the same moment
        pass
    try:
        mf.write_export_dir(Path(parent) / "new" / "gemm", {**FILES, "manifest.json": str(i).encode()})
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return repr(exc)
    return ""


@pytest.mark.slow
def test_concurrent_first_exports_into_a_new_directory(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for round_ in range(3):
        parent = tmp_path / str(round_)
        start = time.time() + 0.5
        with ctx.Pool(24) as pool:
            errors = [e for e in pool.map(_write_one, [(str(parent), i, start) for i in range(24)]) if e]
        assert errors == []
        final = parent / "new" / "gemm"
        assert sorted(p.name for p in (parent / "new").iterdir()) == ["gemm"]  # no temporary left
        assert sorted(p.name for p in final.iterdir()) == sorted(FILES)
        assert int((final / "manifest.json").read_text()) in range(24)  # one writer's complete export


_KILLED_WRITER = """
import os, signal, sys
from ckpred.export import manifest as mf
from ckpred.util import clean_stale_temps
os.fsync = lambda fd: os.kill(os.getpid(), signal.{sig})
mf.write_export_dir(sys.argv[1], {{"model.onnx": b"x", "manifest.json": b"{{}}"}})
"""


def _writer(target: Path, sig: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _KILLED_WRITER.format(sig=sig), str(target)])


def _temps(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.mark.slow
def test_temporaries_of_killed_writers_are_cleaned_live_ones_kept(tmp_path: Path) -> None:
    target = tmp_path / "gemm_universal_gfx950_fp8_rcr"
    mf.write_export_dir(target, FILES)
    killed = _writer(target, "SIGKILL")
    assert killed.wait(60) == -signal.SIGKILL
    (left,) = _temps(tmp_path)
    assert left.startswith(f".{target.name}.tmp-")
    live = _writer(target, "SIGSTOP")  # stopped mid-write: a writer that is still running
    try:
        for _ in range(600):
            if len(_temps(tmp_path)) == 2:
                break
            time.sleep(0.05)
        (live_tmp,) = set(_temps(tmp_path)) - {left}
        mf.write_export_dir(tmp_path / "other", FILES)  # the next export into the same parent
        assert _temps(tmp_path) == [live_tmp]
        assert (target / "manifest.json").read_bytes() == b"{}"
    finally:
        os.kill(live.pid, signal.SIGKILL)
        live.wait(60)
    mf.write_export_dir(target, FILES)
    assert _temps(tmp_path) == []


def test_previous_export_of_a_writer_killed_between_renames_is_restored(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    name = "gemm_universal_gfx950_fp8_rcr"
    old = tmp_path / f".{name}.old-{os.uname().nodename}-{pid}-abc123"
    old.mkdir()
    (old / "manifest.json").write_bytes(b"previous")
    clean_stale_temps(tmp_path)
    assert (tmp_path / name / "manifest.json").read_bytes() == b"previous" and not old.exists()


# -- a few through a real process (what a user sees) ----------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ["train", "seed=-1"],
    ["train", "+model.n_estimatorz=5"],
    ["train", "arch=gfx90a", "dtype=fp8"],
    ["simulate", "out=."],
])
def test_subprocess_one_line_no_traceback(argv: list[str], tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "ckpred", *argv], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 1
    assert_named(proc.returncode, proc.stderr, argv[0])
    assert list(tmp_path.iterdir()) == []  # no stub run folder


@pytest.mark.slow
def test_subprocess_more_folds_than_shapes(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "ckpred", "train", *TINY_PATH, "dtype=fp16", "data.source=path",
                           f"data.path={data_file(*FOUR_SHAPES)}"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert_named(proc.returncode, proc.stderr, "train", "'cv.n_splits'")
