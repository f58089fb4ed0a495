"""Hostile inputs that used to lose data or run code from data: each is now refused by name.

Grouped as in the hostile-input report (ids in brackets):

* outputs never replace what ckpred did not write: a user's directory, ``out=.``, ``out=``
  (the working directory), a symlinked directory, ``${oc.env:HOME}`` [od01 od02 od03 cl15
  cl16], and the same for exports, datasets, table files, rejects and logs;
* a command re-run on its own previous output replaces it, with the umask's mode [ig35 cl32];
* a file truncated while it is ingested ends in a named error, never a partial table or
  SIGBUS, and leaves no temporary files [ig05 ig06];
* modules named by an export, an op YAML or a feature group are imported only when the user
  installed or allowed them [x06p pl02 pl08 ft03];
* a partition manifest that disagrees with its files is refused by both backends, which read
  the same rows [dk08 dk10 dk11 dk12 dk13 dk15 dk16 dk18];
* runs (train, tune, a sweep's jobs, replay, sweep-report's CSV) write their fixed-name files
  only into a folder ckpred made for such a run, never a user's (``out_dir=.``);
* a forged ``pipeline.joblib`` (``export run_dir=``, ``warm_start=``) runs nothing it names.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest

import ckpred.cli
from ckpred.errors import ConfigValueError, InputFileError, ModelMismatchError, OutputPathError
from tests.conftest import data_file
from tests.test_hostile import TRACEBACK, assert_named, digest, run

#: The real 4-shape CK table (fp16 parity sweep).
FOUR_SHAPES = ("ck_gemm_gfx950_results", "parity_sweep_results.csv")
INGEST = ["ingest", "dtype=fp16", "data.source=path"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hydra._internal.utils.is_under_debugger", lambda: False)


@pytest.fixture()
def src(tmp_path: Path) -> Path:
    path = tmp_path / "in.csv"
    path.write_bytes(data_file(*FOUR_SHAPES).read_bytes())
    return path


def tree(root: Path) -> dict[str, bytes | str]:
    """Every entry below ``root``: file bytes, ``dir`` or the target of a symlink."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        out[key] = f"-> {os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return out


def user_dir(path: Path) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "notes.txt").write_text("thesis")
    (path / "sub" / "important.dat").write_text("data")
    return path


# -- F01: a directory out replaces only what ckpred wrote --------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("case", ["od01 user directory", "od02 symlink to a directory", "od03 ${oc.env:HOME}",
                                  "cl15 out=.", "cl16 out= (empty)"])
def test_ingest_never_replaces_a_directory_it_did_not_write(case: str, tmp_path: Path, src: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    victim = user_dir(tmp_path / "victim")
    home = user_dir(tmp_path / "home")
    (home / ".bashrc").write_text("alias x=y")
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "link").symlink_to(victim)
    out, names = {"od01 user directory": ("out=victim", ["'out'", "'victim'", "_ckpred_partitions.json"]),
                  "od02 symlink to a directory": ("out=link", ["'out'", "'link'", "symlink"]),
                  "od03 ${oc.env:HOME}": ("out=${oc.env:HOME}", ["'out'", str(home), "ckpred did not write"]),
                  "cl15 out=.": ("out=.", ["'out'", "'.'", "ckpred did not write"]),
                  "cl16 out= (empty)": ("out=", ["'out'", "''", "working directory"])}[case]
    before = tree(tmp_path)
    rc, _, err = run([*INGEST, f"data.path={src}", out], capsys)
    assert_named(rc, err, "ingest", *names)
    after = tree(tmp_path)
    after = {k: v for k, v in after.items() if not k.startswith("runs")}  # Hydra's own run record
    assert after == before


@pytest.mark.slow
def test_ingest_replaces_its_own_directory_and_an_empty_one(tmp_path: Path, src: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    for out in ("empty", "table", "table"):  # an empty directory, a new one, then its own previous output
        rc, _, err = run([*INGEST, f"data.path={src}", f"out={out}"], capsys)
        assert rc == 0 and not TRACEBACK.search(err), err
        assert sorted(p.name for p in (tmp_path / out).iterdir()) == ["_ckpred_partitions.json",
                                                                      "part-00000.parquet"]
    (tmp_path / "table" / "notes.txt").write_text("mine now")  # a user's file added to ckpred's directory
    rc, _, err = run([*INGEST, f"data.path={src}", "out=table"], capsys)
    assert_named(rc, err, "ingest", "'out'", "notes.txt")
    assert (tmp_path / "table" / "notes.txt").read_text() == "mine now"


def test_library_writers_refuse_a_foreign_directory(tmp_path: Path) -> None:
    """The same rule below the CLI: the dataset writer, the ingest writer and the export
    writer refuse a directory they did not write (``OutputPathError``), keeping it whole."""
    from ckpred.data.ingest import ingest_to_parquet
    from ckpred.export import manifest as mf
    from ckpred.kernels.base import load_op
    from ckpred.scale import write_partitions

    op = load_op("gemm_universal")
    victim = user_dir(tmp_path / "victim")
    before = tree(victim)
    frame = pd.read_parquet(_ingested(tmp_path, op))
    with pytest.raises(OutputPathError, match="victim: it holds files and no _ckpred_partitions.json"):
        write_partitions([frame], victim, op)
    with pytest.raises(OutputPathError, match="victim: it holds files and no _ckpred_partitions.json"):
        ingest_to_parquet(data_file(*FOUR_SHAPES), op, victim, tmp_path / "r.csv", arch="gfx950", dtype="fp16",
                          layout="rcr")
    with pytest.raises(OutputPathError, match="victim: it holds files and no manifest.json"):
        mf.write_export_dir(victim, {"model.onnx": b"m", "manifest.json": b"{}"})
    (victim / "manifest.json").write_text("{}")  # a marker is not enough: notes.txt is not an export's file
    with pytest.raises(OutputPathError, match="'notes.txt', which ckpred does not write there"):
        mf.write_export_dir(victim, {"model.onnx": b"m", "manifest.json": b"{}"})
    (victim / "manifest.json").unlink()
    assert tree(victim) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporaries left


def _ingested(tmp_path: Path, op: Any) -> Path:
    from ckpred.data.ingest import ingest_to_parquet

    out = tmp_path / "t.parquet"
    ingest_to_parquet(data_file(*FOUR_SHAPES), op, out, tmp_path / "t.rejects.csv", arch="gfx950", dtype="fp16",
                      layout="rcr")
    return out


def test_export_refuses_a_foreign_directory_before_fitting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import ckpred.commands.export as export

    target = user_dir(tmp_path / "exports" / "gemm_universal_gfx950_fp8_rcr")
    before = tree(target)
    monkeypatch.setattr(export, "_fit_here", lambda *a: pytest.fail("fitted before the refusal"))
    rc, _, err = run(["export", f"out_dir={tmp_path / 'exports'}"], capsys)
    assert_named(rc, err, "export", "'out_dir'", "an export directory ckpred wrote")
    assert tree(target) == before


@pytest.mark.slow
@pytest.mark.parametrize(("command", "key", "extra"), [
    ("ingest", "out", ["data.path=in.csv"]),
    ("ingest", "rejects", ["data.path=in.csv", "out=t.parquet"]),
    ("simulate", "out", ["shapes=tiny"]),
    ("simulate", "log", ["shapes=tiny", "out=t.parquet"]),
])
def test_output_files_replace_only_their_own_kind(command: str, key: str, extra: list[str], tmp_path: Path,
                                                  src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user's file named as an output is refused before any work; the file stays."""
    mine = tmp_path / "mine.parquet"
    mine.write_bytes(b"my own notes, not a table")
    argv = [*(INGEST if command == "ingest" else [command]), *extra, f"{key}={mine}"]
    rc, _, err = run(argv, capsys)
    assert_named(rc, err, command, f"'{key}'", "ckpred wrote")
    assert mine.read_bytes() == b"my own notes, not a table"
    assert not (tmp_path / "t.parquet").exists()


# -- F09: a command re-run on its own output -----------------------------------------------------------
@pytest.mark.slow
def test_rerun_replaces_its_own_output_file_with_the_umask_mode(tmp_path: Path, src: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """ig35 / cl32: the second run replaces the first one's table, rejects and log; the files
    get 0666 less the umask, like any new file (not a temporary file's private 0600)."""
    old = os.umask(0o022)
    try:
        for _ in range(2):
            rc, _, err = run([*INGEST, f"data.path={src}", "out=t.parquet"], capsys)
            assert rc == 0 and not TRACEBACK.search(err), err
            rc, _, err = run(["simulate", "shapes=tiny", "out=F", "log=F.log"], capsys)
            assert rc == 0 and not TRACEBACK.search(err), err
    finally:
        os.umask(old)
    for name in ("t.parquet", "t.rejects.csv", "F", "F.log"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    assert len(pd.read_parquet(tmp_path / "t.parquet")) > 0 and len(pd.read_parquet(tmp_path / "F")) > 0
    rc, _, err = run([*INGEST, f"data.path={src}", "out=tdir"], capsys)
    assert rc == 0 and stat.S_IMODE((tmp_path / "tdir").stat().st_mode) == 0o755


@pytest.mark.slow
@pytest.mark.parametrize(("override", "words"), [
    ("rejects=/dev/null", ["'rejects'", "/dev/null is a character device"]),
    ("out=/dev/null", ["'out'", "/dev/null is a character device"]),
    ("out=/dev/full", ["'out'", "/dev/full is a character device"]),
    ("out=/dev/zero/t.parquet", ["'out'", "/dev/zero is a character device"]),
    ("out=in.csv/t.parquet", ["'out'", "a path below a directory", "in.csv is a file"]),
])
def test_devices_and_paths_below_files_are_named_as_such(override: str, words: list[str], src: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """cl07 cl27 cl31: an output that is a character device was refused as "a path below a
    directory (... is a file)"; it is named as the device it is, and nothing is written."""
    rc, _, err = run([*INGEST, f"data.path={src}", override], capsys)
    assert_named(rc, err, "ingest", *words)
    assert "is a file" not in err or "in.csv" in err


@pytest.mark.slow
@pytest.mark.parametrize("override", ["out=/dev/null", "log=/dev/null", "out=/dev/full", "log=/dev/full"])
def test_simulate_names_a_device_as_output(override: str, capsys: pytest.CaptureFixture[str]) -> None:
    """cl07 cl27 cl31 for simulate's table and log."""
    rc, _, err = run(["simulate", "shapes=tiny", override], capsys)
    key, _, device = override.partition("=")
    assert_named(rc, err, "simulate", f"'{key}'", f"{device} is a character device")


# -- F03 / F27: a file truncated while it is ingested ------------------------------------------------------
def _big_csv(path: Path, copies: int) -> Path:
    """The parity sweep's rows ``copies`` times (repeats of the same measurements)."""
    lines = data_file(*FOUR_SHAPES).read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"".join(lines[1:]) * copies)
    return path


def _cut_after_first_block(monkeypatch: pytest.MonkeyPatch, size: int, *, mapped: bool) -> list[bool]:
    """Make the CSV reader's file shorter (``size`` bytes) once its first block is read, as
    another process would between two blocks; returns, per block, whether it was mapped."""
    from ckpred.data.readers import common, csv_sweep

    real = csv_sweep.line_spans
    kinds: list[bool] = []
    if not mapped:  # as when a writer holds the file open: no lease, no map
        monkeypatch.setattr(common, "_lease", lambda fd: False, raising=False)
        monkeypatch.setattr(common, "_mappable", lambda *a: False)
    release = getattr(common, "_release", lambda fd: None)

    def spans(fh: Any, chunk: int) -> Any:
        for i, (buffer, start, end) in enumerate(real(fh, chunk)):
            kinds.append(isinstance(buffer, common.mmap.mmap))
            yield buffer, start, end
            if i == 0:
                release(fh.fileno())  # the block is done with: a truncation no longer waits
                os.truncate(fh.name, size)

    monkeypatch.setattr(csv_sweep, "line_spans", spans)
    return kinds


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "read"])
@pytest.mark.parametrize("out", ["t.parquet", "tdir"])
def test_a_file_truncated_between_blocks_is_refused_not_half_read(mapped: bool, out: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """ig05: the table the first blocks make is not written as if it were the file; the
    previous output stays, and no spill or temporary file is left (ig06)."""
    from ckpred.data.ingest import ingest_to_parquet
    from ckpred.kernels.base import load_op

    op = load_op("gemm_universal")
    big = _big_csv(tmp_path / "big.csv", 100)
    ingest_to_parquet(big, op, tmp_path / out, tmp_path / "r.csv", arch="gfx950", dtype="fp16", layout="rcr")
    before = tree(tmp_path)
    kinds = _cut_after_first_block(monkeypatch, 200_000, mapped=mapped)
    with pytest.raises(InputFileError, match=r"big\.csv: the file shrank while being read") as err:
        ingest_to_parquet(big, op, tmp_path / out, tmp_path / "r.csv", arch="gfx950", dtype="fp16", layout="rcr",
                          chunk_bytes=100_000)
    assert "\n" not in str(err.value)
    assert kinds[0] is mapped
    after = tree(tmp_path)
    assert after.pop("big.csv") != before.pop("big.csv")  # cut short, nothing else changed or left behind
    assert after == before


@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunks"])
def test_a_whole_file_reader_refuses_a_file_cut_while_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str], chunked: bool) -> None:
    """Readers that take a file whole (a table CSV read whole here) or in chunks of text (the
    table CSV's own reader) are checked the same way: the file's size, inode and time at the
    end of its read against its start."""
    from ckpred.data.readers import CHUNKED_TABLE_READERS, TABLE_READERS

    path = tmp_path / "t.csv"
    path.write_text("M,N,K,dtype,BLOCK_M,BLOCK_N,warps,stages,ms\n" +
                    "".join(f"{m},64,64,fp16,32,64,4,2,0.5\n" for m in range(64, 64 * 40, 64)))
    real, real_chunks = TABLE_READERS["csv"], CHUNKED_TABLE_READERS["csv"]

    def read_then_cut(p: Path, ctx: Any) -> Any:
        raw = real(p, ctx)
        os.truncate(p, 60)  # another process, while the rows are being checked
        return raw

    def chunks_then_cut(p: Path, ctx: Any, chunk_bytes: int | None) -> Any:
        for raw in real_chunks(p, ctx, chunk_bytes):
            yield raw
            os.truncate(p, 60)  # another process, after the first chunk was handed on

    if chunked:
        monkeypatch.setitem(CHUNKED_TABLE_READERS, "csv", chunks_then_cut)
    else:
        monkeypatch.delitem(CHUNKED_TABLE_READERS, "csv")
        monkeypatch.setitem(TABLE_READERS, "csv", read_then_cut)
    conf = Path(__file__).parent / "fixtures" / "user_op"
    rc, _, err = run(["ingest", "--config-dir", str(conf), "op=tmm", "dtype=fp16", "data.source=path",
                      f"data.path={path}", "out=t.parquet"], capsys)
    assert_named(rc, err, "ingest", "t.csv", "the file shrank from", "to 60 bytes while being read")
    assert not (tmp_path / "t.parquet").exists()


_TRUNCATED_WHILE_MAPPED = """
import sys, time
from ckpred.data.readers import csv_sweep
real = csv_sweep.line_spans

def spans(fh, chunk):
    for i, block in enumerate(real(fh, chunk)):
        if i == 0:  # the first block is mapped: the parent truncates the file now
            print("ready", flush=True)
            time.sleep(1.5)
        yield block

csv_sweep.line_spans = spans
from ckpred.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/sys/fs/lease-break-time").exists(), reason="needs Linux file leases")
def test_truncating_a_mapped_block_under_its_reader_is_no_sigbus(tmp_path: Path) -> None:
    """ig05, the documented SIGBUS: another process truncates the file while a mapped block is
    being read. The truncation waits until the block is done (a read lease), so the reader ends
    with the named error (or, had the truncation come after the read, a complete table), never
    SIGBUS, and leaves no temporary file (ig06)."""
    big = _big_csv(tmp_path / "big.csv", 200)
    proc = subprocess.Popen([sys.executable, "-c", _TRUNCATED_WHILE_MAPPED, *INGEST, f"data.path={big}",
                             "data.chunk_mb=1", "out=t.parquet", "hydra.run.dir=run"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        cut = threading.Thread(target=os.truncate, args=(big, 100))
        cut.start()
        out, err = proc.communicate(timeout=300)
        cut.join(60)
    finally:
        proc.kill()
    assert proc.returncode != -signal.SIGBUS, err
    assert not TRACEBACK.search(err), err
    if proc.returncode == 0:  # the whole file was read before the truncation landed
        table = pd.read_parquet(tmp_path / "t.parquet")
        assert table["repeats"].sum() == 200 * (len(data_file(*FOUR_SHAPES).read_bytes().splitlines()) - 1)
    else:
        lines = [line for line in err.splitlines() if line.strip()]
        assert proc.returncode == 1 and len(lines) == 1, err
        assert lines[0].startswith("ckpred ingest: error: cannot read") and "shrank" in lines[0], err
        assert not (tmp_path / "t.parquet").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_stale_temporaries_of_a_killed_ingest_are_removed_live_ones_kept(tmp_path: Path, src: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """ig06: a killed run's spill directory and rejects temporary (named for their host and
    process) are removed by the next ingest into the same directory; a running one's stay;
    files that only look alike are not touched."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host, pid = socket.gethostname(), int(dead.stdout)
    spill = tmp_path / f".ckpred-ingest.tmp-{host}-{pid}-abc123"
    spill.mkdir()
    (spill / "p00000-c000000.arrow").write_bytes(b"x" * 1000)
    rejects_tmp = tmp_path / f".t.rejects.csv.tmp-{host}-{pid}-k2j3h4"
    rejects_tmp.write_text("source,reason,raw\n")
    live = tmp_path / f".t.parquet.tmp-{host}-{os.getpid()}-zzz999"
    live.write_text("a running writer's")
    alike = tmp_path / ".t.rejects.csv.tmp-notes"
    alike.write_text("mine")
    rc, _, err = run([*INGEST, f"data.path={src}", "out=t.parquet"], capsys)
    assert rc == 0, err
    assert not spill.exists() and not rejects_tmp.exists()
    assert live.read_text() == "a running writer's" and alike.read_text() == "mine"


# -- F04: code named by data -------------------------------------------------------------------------
_PWN = "import pathlib; pathlib.Path({marker!r}).write_text('ran')\n"


def _plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    """A module ``name`` on sys.path (the working directory, as ``python -m`` has it) that
    writes a marker file when imported."""
    marker = tmp_path / f"PWNED_{name}"
    (tmp_path / f"{name}.py").write_text(_PWN.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("CKPRED_ALLOW_PLUGINS", raising=False)
    return marker


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export_helpers import export_gemm

    return export_gemm(tmp_path_factory.mktemp("plug") / "gemm_universal_gfx950_fp8_rcr", n_estimators=5)


@pytest.mark.slow
def test_a_forged_export_naming_a_plugin_runs_nothing(export: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """x06p: the manifest (and its copy in model.onnx, hashes recomputed) names a module of
    the working directory as its op's plug-in. Loading refuses it before importing it; the
    caller may allow it explicitly."""
    import shutil

    from ckpred.runtime import KernelSelector
    from export_helpers import forge
    from test_hostile_runtime import read

    marker = _plugin_module(tmp_path, monkeypatch, "rt_plug")
    forged = tmp_path / "forged"
    shutil.copytree(export, forged)
    man = read(forged)
    man["op_config"]["plugin"] = "rt_plug:X"
    forge(forged, man)
    with pytest.raises(ModelMismatchError) as err:
        KernelSelector.load(forged)
    message = str(err.value)
    assert "\n" not in message and "'rt_plug' is not one, so it was not imported" in message
    assert "CKPRED_ALLOW_PLUGINS=rt_plug" in message and "allow_plugins=['rt_plug']" in message
    assert not marker.exists() and "rt_plug" not in sys.modules
    with pytest.raises(ModelMismatchError, match="a subclass of ckpred.kernels.declared.DeclaredOp in rt_plug"):
        KernelSelector.load(forged, allow_plugins=["rt_plug"])  # allowed: imported, then refused by its type
    assert marker.exists()
    sys.modules.pop("rt_plug", None)
    assert KernelSelector.load(export).manifest["op"] == "gemm_universal"  # the packaged plug-in loads


def _user_conf(tmp_path: Path) -> Path:
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(Path(__file__).parent / "fixtures" / "user_op", conf)
    return conf


@pytest.mark.slow
@pytest.mark.parametrize(("case", "edit", "key"), [
    ("pl02 op plugin", lambda op, feats: (op.replace("name: tmm\n", "name: tmm\nplugin: evilplug:X\n"), feats),
     "op.plugin"),
    ("pl08 op plugin of the standard library", lambda op, feats: (op.replace("name: tmm\n", "name: tmm\nplugin: this:X\n"),
                                                                  feats), "op.plugin"),
    ("ft03 feature class", lambda op, feats: (op, feats.replace("  - kind: expressions", "  - kind: evilplug:F\n"
                                                                "  - kind: expressions", 1)), "features.groups[0].kind"),
])
def test_configs_naming_a_module_import_nothing(case: str, edit: Callable[[str, str], tuple[str, str]], key: str,
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """pl02 / pl08 / ft03: ``plugin:`` in an op YAML and ``kind: module:Class`` in a feature set
    are refused at compose, naming the module and how to allow it, before it is imported (the
    standard library's ``this`` would print the Zen of Python)."""
    marker = _plugin_module(tmp_path, monkeypatch, "evilplug")
    conf = _user_conf(tmp_path)
    op_file, feats_file = conf / "op" / "tmm.yaml", conf / "features" / "tmm_feats.yaml"
    op_text, feats_text = edit(op_file.read_text(), feats_file.read_text())
    op_file.write_text(op_text)
    feats_file.write_text(feats_text)
    sys.modules.pop("this", None)
    rc, out, err = run(["train", f"--config-dir={conf}", "op=tmm", "features=tmm_feats", "data=path",
                        "data.path=none.csv"], capsys)
    module = "this" if "this:" in op_text else "evilplug"
    assert_named(rc, err, "train", f"'{key}'", f"{module!r} is not one, so it was not imported",
                 f"CKPRED_ALLOW_PLUGINS={module}")
    assert not marker.exists() and "evilplug" not in sys.modules and "this" not in sys.modules
    assert "Beautiful is better" not in out
    if module == "evilplug":  # allowed by the user: passes compose (the op plug-in is imported there)
        monkeypatch.setenv("CKPRED_ALLOW_PLUGINS", "evilplug")
        rc, _, err = run(["train", f"--config-dir={conf}", "op=tmm", "features=tmm_feats", "data=path",
                          "data.path=none.csv"], capsys)
        assert_named(rc, err, "train", "evilplug" if key == "op.plugin" else "none.csv")
        assert marker.exists() == (key == "op.plugin")
    sys.modules.pop("evilplug", None)


def test_plugin_policy_allows_ckpred_registered_and_listed_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpred.plugins import allowed_plugins, is_allowed, registered_modules

    monkeypatch.delenv("CKPRED_ALLOW_PLUGINS", raising=False)
    assert {"ckpred.kernels.gemm_universal", "ckpred.kernels.grouped_conv_fwd"} <= registered_modules()
    assert is_allowed("ckpred.features.conv") and not is_allowed("ckpred.__main__")
    assert not is_allowed("mypkg.ops") and not is_allowed("os") and not is_allowed("../x")
    with allowed_plugins(["mypkg"]):
        assert is_allowed("mypkg.ops") and not is_allowed("mypkgx")
    assert not is_allowed("mypkg.ops")
    monkeypatch.setenv("CKPRED_ALLOW_PLUGINS", "mypkg, other.mod")
    assert is_allowed("mypkg") and is_allowed("other.mod.sub") and not is_allowed("other")
    with pytest.raises(ConfigValueError, match="allow_plugins"):
        with allowed_plugins(["../evil"]):
            pass


# -- F15 / F17: a partition manifest that disagrees with its files -----------------------------------
@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    """An ingest directory of three parts."""
    from ckpred.data.ingest import ingest_to_parquet
    from ckpred.kernels.base import load_op

    big = _big_csv(tmp_path / "big.csv", 2)
    out = tmp_path / "ds"
    ingest_to_parquet(big, load_op("gemm_universal"), out, tmp_path / "r.csv", arch="gfx950", dtype="fp16",
                      layout="rcr", chunk_bytes=12_000)
    assert len(list(out.glob("part-*.parquet"))) >= 3
    return out


def _manifest(ds: Path, change: Callable[[dict[str, Any], Path], Any]) -> None:
    path = ds / "_ckpred_partitions.json"
    manifest = json.loads(path.read_text())
    change(manifest, ds)
    path.write_text(json.dumps(manifest))


def _relabel(m: dict[str, Any], ds: Path) -> None:
    m["partitions"][0]["arch"] = "gfx90a"


def _traversal(m: dict[str, Any], ds: Path) -> None:
    m["partitions"][0]["arch"] = "../../etc/passwd"


def _rows(m: dict[str, Any], ds: Path) -> None:
    m["rows"] -= m["partitions"][0]["rows"] - 10
    m["partitions"][0]["rows"] = 10


def _left_out(m: dict[str, Any], ds: Path) -> None:
    gone = m["partitions"].pop()
    m["rows"] -= gone["rows"]


def _itself(m: dict[str, Any], ds: Path) -> None:
    m["partitions"][-1]["file"] = "_ckpred_partitions.json"


def _text_part(m: dict[str, Any], ds: Path) -> None:
    (ds / m["partitions"][-1]["file"]).write_text("M,N,K\n1,2,3\n")


def _symlink_part(m: dict[str, Any], ds: Path) -> None:
    part = ds / m["partitions"][-1]["file"]
    part.unlink()
    part.symlink_to("/etc/passwd")


def _foreign_parquet(m: dict[str, Any], ds: Path) -> None:
    part = ds / m["partitions"][-1]["file"]
    pd.DataFrame({"arch": ["gfx950"], "dtype": ["fp16"], "layout": ["rcr"]}).to_parquet(part)


MANIFEST_LIES = {
    "dk11 a part relabelled gfx90a": (_relabel, ["partitions[0].arch is 'gfx90a'", "holds ['gfx950']"]),
    "dk12 ../../etc/passwd as arch": (_traversal, ["partitions[0].arch is '../../etc/passwd'", "config name"]),
    "dk13 rows 10 for a larger part": (_rows, ["partitions[0].rows is 10", "rows"]),
    "dk15 a part left out": (_left_out, ["more Parquet files", "every part"]),
    "dk08 the manifest as a part": (_itself, ["partitions[", "'_ckpred_partitions.json'", "not _ckpred_partitions"]),
    "dk10 a text file as a part": (_text_part, ["not a readable Parquet file"]),
    "dk16 a symlink to /etc/passwd as a part": (_symlink_part, ["a symlink"]),
    "a Parquet file ckpred did not write": (_foreign_parquet, ["not a canonical table of op 'gemm_universal'"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(MANIFEST_LIES))
def test_both_backends_refuse_a_manifest_that_disagrees_with_its_files(case: str, dataset: Path) -> None:
    """The Dask backend (``read_manifest``, what ``scale`` trains from) and the in-memory one
    (``load_table`` of the directory) refuse the same dataset with the same one-line error
    naming the manifest and the entry."""
    from ckpred.config import compose
    from ckpred.data import load_table
    from ckpred.data.partitions import read_manifest
    from ckpred.kernels.base import load_op
    from ckpred.scale import partition_files

    change, words = MANIFEST_LIES[case]
    _manifest(dataset, change)
    errors = []
    with pytest.raises(InputFileError) as err:
        partition_files(dataset, load_op("gemm_universal"))  # what cross_validate_partitioned reads
    errors.append(str(err.value))
    with pytest.raises(InputFileError) as err:
        read_manifest(dataset, load_op("gemm_universal"))
    errors.append(str(err.value))
    with pytest.raises(InputFileError) as err:
        load_table(compose("train", ["dtype=fp16", "data=path", f"data.path={dataset}"]))
    errors.append(str(err.value))
    for message in errors:
        assert "\n" not in message and message.startswith(f"cannot read {dataset / '_ckpred_partitions.json'}: ")
        for word in words:
            assert word in message, (word, message)


def test_a_manifest_nested_100000_deep_is_one_named_error(dataset: Path) -> None:
    """dk18."""
    from ckpred.data.partitions import read_manifest
    from ckpred.kernels.base import load_op

    (dataset / "_ckpred_partitions.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputFileError, match="nested too deeply"):
        read_manifest(dataset, load_op("gemm_universal"))


def test_both_backends_read_the_same_files_and_rows(dataset: Path) -> None:
    from ckpred.config import compose
    from ckpred.data import load_table
    from ckpred.data.ingest import expand_paths
    from ckpred.data.partitions import read_manifest
    from ckpred.kernels.base import load_op
    from ckpred.scale import partition_files

    op = load_op("gemm_universal")
    assert [str(p) for p in expand_paths(str(dataset), op)] == partition_files(dataset, op)
    table = load_table(compose("train", ["dtype=fp16", "data=path", f"data.path={dataset}"]))
    assert len(table) == read_manifest(dataset, op)["rows"]


def test_manifest_check_reads_footers_not_rows(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check reads each part's Parquet footer (statistics of the combo columns), never its rows."""
    import pyarrow.parquet as pq

    from ckpred.data.partitions import read_manifest
    from ckpred.kernels.base import load_op

    monkeypatch.setattr(pq, "read_table", lambda *a, **k: pytest.fail("rows were read"))
    assert read_manifest(dataset, load_op("gemm_universal"))["rows"] > 0


def test_an_ingest_of_mixed_combos_still_marks_its_directory(tmp_path: Path) -> None:
    """Parts whose op makes dtype a problem field mix dtypes: the manifest records null there,
    so the directory is still ckpred's (a rerun replaces it) and the Dask backend refuses it by
    name, while the in-memory reader accepts it."""
    from ckpred.data.partitions import DATASET_DIR, read_manifest, write_manifest
    from ckpred.kernels.base import load_op

    op = load_op("gemm_universal")
    ds = tmp_path / "ds"
    ds.mkdir()
    table = pd.read_parquet(_ingested(tmp_path, op))
    (tmp_path / "t.parquet").rename(ds / "part-00000.parquet")
    write_manifest(ds, op, [{"file": "part-00000.parquet", "rows": len(table), "arch": "gfx950", "dtype": None,
                             "layout": "rcr"}])
    assert DATASET_DIR.refusal(ds) == ""
    assert read_manifest(ds, op, one_combo=False)["rows"] == len(table)
    with pytest.raises(InputFileError, match=r"partitions\[0\]\.dtype is None .*one arch, dtype and layout per file"):
        read_manifest(ds, op)


# -- F10: run folders hold only ckpred's runs ----------------------------------------------------------
def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test when a command starts its work (the refusal must come first)."""
    import ckpred.commands.train as train_command
    import ckpred.replay as replay

    monkeypatch.setattr(train_command, "cross_validate", lambda *a, **k: pytest.fail("trained before the refusal"))
    monkeypatch.setattr(replay, "load_run", lambda *a, **k: pytest.fail("replayed before the refusal"))


@pytest.mark.slow
@pytest.mark.parametrize(("case", "argv", "names"), [
    ("train out_dir=<a user's folder>", ["train", "out_dir=victim"], ["'out_dir'", "'victim'", "ckpred did not make"]),
    ("train out_dir=.", ["train", "out_dir=."], ["'out_dir'", "'.'", "ckpred did not make", ".ckpred-run.json"]),
    ("train out_dir=<symlink to a user's folder>", ["train", "out_dir=link"],
     ["'out_dir'", "'link'", "ckpred did not make"]),
    ("train hydra.run.dir=.", ["train", "hydra.run.dir=."], ["'hydra.run.dir'", "'.'", "ckpred did not make"]),
    ("tune out_dir=<a user's folder>", ["tune", "out_dir=victim"], ["'out_dir'", "'victim'"]),
    ("train -m out_dir=. (a job's folder)", ["train", "-m", "seed=0", "out_dir=."],
     ["'out_dir'", "'./0'", "'run.json'"]),
    ("replay out=<a user's folder>", ["replay", "run_dir=victim", "out=victim"], ["'out'", "'victim'"]),
    ("replay into a train run's user folder", ["replay", "run_dir=victim"], ["'out'", "replay", "'replay.md'"]),
    ("train out_dir=<a tune run folder>", ["train", "out_dir=tuned"], ["'out_dir'", "a tune run folder"]),
    ("train out_dir=<a forged marker>", ["train", "out_dir=forged"], ["'out_dir'", "not a marker ckpred wrote"]),
])
def test_runs_never_write_into_a_folder_ckpred_did_not_make(case: str, argv: list[str], names: list[str],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A run writes metrics.json, run.json, per_shape.csv, plots... (replay: replay.md/csv/png)
    into its folder: a folder holding a user's files of those names (or any files) is refused
    naming the key, before any work; nothing in it changes and nothing is left behind."""
    _no_work(monkeypatch)
    victim = user_dir(tmp_path / "victim")
    for name in ("metrics.json", "run.json", "per_shape.csv", "efficiency_cdf.png"):
        (victim / name).write_text(f"my own {name}")
    (victim / "replay").mkdir()
    (victim / "replay" / "replay.md").write_text("my replay notes")
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "run.json").write_text("my own run.json")
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / ".ckpred-run.json").write_text('{"command": "tune"}')
    (tmp_path / "forged").mkdir()
    (tmp_path / "forged" / ".ckpred-run.json").mkdir()
    (tmp_path / "notes.txt").write_text("thesis")
    before = tree(tmp_path)
    rc, _, err = run(argv, capsys)
    assert_named(rc, err, argv[0], *names)
    # a sweep's failed job keeps the folder Hydra made for it (sweep-report lists it)
    assert {k: v for k, v in tree(tmp_path).items() if not k.startswith("multirun")} == before


@pytest.mark.slow
def test_a_run_writes_into_a_new_or_empty_folder_and_its_own_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A new folder and an empty one are marked as the command's run folder; a rerun into it,
    and into a train run written before markers (its run.json), goes ahead."""
    import ckpred.commands.train as train_command
    from ckpred.util import RUN_MARKER, run_marker_command

    ran: list[Path] = []
    monkeypatch.setattr(train_command, "cross_validate", lambda cfg, out, *a: ran.append(out) or 0.5)
    (tmp_path / "empty").mkdir()
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "metrics.json").write_text("{}")
    (legacy / "run.json").write_text(json.dumps({"command": "train", "created": "2025-01-01T00:00:00+00:00"}))
    for out in ("new/run", "empty", "new/run", "legacy"):
        rc, _, err = run(["train", f"out_dir={out}"], capsys)
        assert rc == 0 and not TRACEBACK.search(err), err
        assert ran[-1] == tmp_path / out and run_marker_command(tmp_path / out / RUN_MARKER) == "train"
    assert len(ran) == 4


def test_hydras_run_folder_inside_the_run_folder_is_hydras_not_the_users(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``out_dir=X hydra.run.dir=X/hydra``: the sub-folder Hydra made for the run (``.hydra/`` and
    the command's log) does not make X a user's folder; a sub-folder with anything else does."""
    import ckpred.commands.train as train_command
    from ckpred.util import RunDirectory

    ran: list[Path] = []
    monkeypatch.setattr(train_command, "cross_validate", lambda cfg, out, *a: ran.append(out) or 0.5)
    rc, _, err = run(["train", "out_dir=runs/a", "hydra.run.dir=runs/a/hydra"], capsys)
    assert rc == 0 and not TRACEBACK.search(err), err
    assert ran == [tmp_path / "runs" / "a"]
    kind = RunDirectory("train")
    folder = tmp_path / "b"
    (folder / "hydra" / ".hydra").mkdir(parents=True)
    (folder / "hydra" / "train.log").write_text("")
    assert kind.refusal(folder) == ""
    (folder / "hydra" / "notes.txt").write_text("mine")
    assert "holds 'hydra'" in kind.refusal(folder)


@pytest.mark.slow
def test_a_refused_run_leaves_no_marker_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A run refused after its folder was made and marked (more folds than shapes) removes the
    folder it made; an empty folder the user made keeps nothing of the run."""
    from ckpred.errors import ConfigValueError as CVE
    import ckpred.commands.train as train_command

    def refuse(*a: Any, **k: Any) -> float:
        raise CVE("cv.n_splits", 99, "at most the 12 shapes")

    monkeypatch.setattr(train_command, "cross_validate", refuse)
    (tmp_path / "mine").mkdir()
    for out in ("made/run", "mine"):
        rc, _, err = run(["train", f"out_dir={out}"], capsys)
        assert_named(rc, err, "train", "'cv.n_splits'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"] and not any((tmp_path / "mine").iterdir())


def test_sweep_report_keeps_a_users_csv_of_its_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "sweep" / "0"
    job.mkdir(parents=True)
    (job / "metrics.json").write_text(json.dumps({"model": {"mean": 0.9, "p10": 0.8}}))
    mine = tmp_path / "sweep" / "sweep_report.csv"
    mine.write_text("my own table\n")
    rc, _, err = run(["sweep-report", "sweep"], capsys)
    assert_named(rc, err, "sweep-report", "'csv'", "a sweep report")
    assert mine.read_text() == "my own table\n"
    mine.unlink()
    for _ in range(2):  # its own report is replaced
        rc, _, err = run(["sweep-report", "sweep"], capsys)
        assert rc == 0 and not TRACEBACK.search(err), err
    assert mine.read_text().startswith("rank,job,status,")


# -- F11: a pickled pipeline runs nothing it names ----------------------------------------------------
def _calling(module: str, name: str, arg: str) -> bytes:
    """A pickle (protocol 4) that looks up ``module.name`` and calls it with ``arg``."""
    def text(s: str) -> bytes:
        data = s.encode()
        return b"\x8c" + bytes([len(data)]) + data

    return b"\x80\x04" + text(module) + text(name) + b"\x93" + text(arg) + b"\x85R."


class _System:
    """Pickles as a call of os.system (what a forged pipeline.joblib holds)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def _forged_pipelines(tmp_path: Path, marker: Path, victim: Path) -> dict[str, Callable[[Path], None]]:
    import joblib
    import numpy as np

    touch = f"touch {marker}"
    return {
        "os.system (zlib, as train writes)": lambda p: joblib.dump(_System(touch), p, compress=3),
        "os.system inside a list (plain pickle)": lambda p: joblib.dump([1, {"model": _System(touch)}], p),
        "os.system in an object array's nested pickle": lambda p: joblib.dump(
            {"features": np.array(["a", _System(touch)], dtype=object)}, p, compress=3),
        "builtins.exec": lambda p: p.write_bytes(_calling("builtins", "exec", f"open({str(marker)!r}, 'w')")),
        "builtins.getattr": lambda p: p.write_bytes(_calling("builtins", "getattr", "x")),
        "a dotted name through ckpred": lambda p: p.write_bytes(_calling("ckpred.util", "shutil.rmtree",
                                                                         str(victim))),
        "a function of ckpred": lambda p: p.write_bytes(_calling("ckpred.util", "sha256_file", str(victim))),
        "a module of the working directory": lambda p: p.write_bytes(_calling("pwnmod", "Thing", "x")),
        "numpy.load (pickles inside)": lambda p: p.write_bytes(_calling("numpy", "load", str(victim))),
        "joblib's compat wrapper (reads a side file)": lambda p: p.write_bytes(
            _calling("joblib.numpy_pickle_compat", "NDArrayWrapper", "x")),
    }


_FORGED = ["os.system (zlib, as train writes)", "os.system inside a list (plain pickle)",
           "os.system in an object array's nested pickle", "builtins.exec", "builtins.getattr",
           "a dotted name through ckpred", "a function of ckpred", "a module of the working directory",
           "numpy.load (pickles inside)", "joblib's compat wrapper (reads a side file)"]
_NAMED = {"os.system (zlib, as train writes)": "posix.system", "os.system inside a list (plain pickle)": "posix.system",
          "os.system in an object array's nested pickle": "posix.system", "builtins.exec": "builtins.exec",
          "builtins.getattr": "builtins.getattr", "a dotted name through ckpred": "ckpred.util.shutil.rmtree",
          "a function of ckpred": "ckpred.util.sha256_file", "a module of the working directory": "pwnmod.Thing",
          "numpy.load (pickles inside)": "numpy.load",
          "joblib's compat wrapper (reads a side file)": "joblib.numpy_pickle_compat.NDArrayWrapper"}


@pytest.mark.parametrize("case", _FORGED)
def test_a_forged_pipeline_runs_nothing_it_names(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline.joblib whose pickle calls os.system, exec, a dotted path through ckpred, or
    imports a module of the working directory is refused naming that global; no marker file
    appears, no module is imported, the victim folder stays."""
    from ckpred.runs import PipelineRefused, load_pipeline

    marker = _plugin_module(tmp_path, monkeypatch, "pwnmod")  # importing pwnmod writes this marker too
    victim = user_dir(tmp_path / "victim")
    path = tmp_path / "pipeline.joblib"
    _forged_pipelines(tmp_path, marker, victim)[case](path)
    with pytest.raises(PipelineRefused) as err:
        load_pipeline(path, purpose="export")
    message = str(err.value)
    assert "\n" not in message and f"it names {_NAMED[case]}," in message and "neither imported nor called" in message
    assert not marker.exists() and "pwnmod" not in sys.modules
    assert (victim / "notes.txt").read_text() == "thesis"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["export", "warm_start"])
def test_export_and_warm_start_of_a_forged_run_folder_run_nothing(command: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The same through the commands: a run folder whose run.json records the forged pickle's
    sha256 (the record is in the same folder, so it is no defence) is refused in one line."""
    import joblib

    from ckpred.util import sha256_file

    marker = tmp_path / "PWNED"
    run_dir = tmp_path / "forged_run"
    run_dir.mkdir()
    joblib.dump(_System(f"touch {marker}"), run_dir / "pipeline.joblib", compress=3)
    (run_dir / "run.json").write_text(json.dumps({
        "command": "train", "created": "2025-01-01T00:00:00+00:00", "op": "gemm_universal", "arch": "gfx950",
        "dtype": "fp8", "layout": "rcr", "pipeline": {"file": "pipeline.joblib",
                                                      "sha256": sha256_file(run_dir / "pipeline.joblib")}}))
    argv = ["export", "run_dir=forged_run", "out_dir=ex"] if command == "export" else \
        ["train", "shapes=tiny", "warm_start=forged_run", "out_dir=warm"]
    rc, _, err = run(argv, capsys)
    assert_named(rc, err, argv[0], "pipeline.joblib", "posix.system", "neither imported nor called")
    assert not marker.exists()


@pytest.mark.parametrize("model", ["ranker", "regressor"])
def test_pipelines_ckpred_writes_load_under_the_restriction(model: str, tmp_path: Path) -> None:
    """The restriction refuses nothing a ckpred pipeline holds (every model and feature set of
    the tests is also loaded this way by test_train, test_warm_start, test_scale, test_export_cli)."""
    import joblib

    from export_helpers import TRAIN_SHAPES, configs, fit_pipeline, gemm, synthetic_table
    from ckpred.models import failure_estimator, set_failure_model
    from ckpred.runs import load_pipeline
    from ckpred.schema import ValidityModelConfig

    op, cfg = gemm(), configs()
    table = synthetic_table(op, cfg, TRAIN_SHAPES[:4], kernels=100)
    pipe = fit_pipeline(op, cfg, table, model=model, n_estimators=3, features="gemm_universal")
    X = op.encode_frame(table)
    failure = failure_estimator(ValidityModelConfig(n_estimators=2, num_leaves=4, min_child_samples=5))
    set_failure_model(pipe, failure.fit(pipe.named_steps["features"].transform(X), ~table["is_valid"].to_numpy()),
                      0.5)
    for compress in (3, 0):
        joblib.dump(pipe, tmp_path / "pipeline.joblib", compress=compress)
        loaded = load_pipeline(tmp_path / "pipeline.joblib")
        assert (loaded.predict(X) == pipe.predict(X)).all()
        assert (loaded.ckpred_failure_model_.predict(pipe.named_steps["features"].transform(X))
                == failure.predict(pipe.named_steps["features"].transform(X))).all()


def test_a_run_folder_is_checked_before_its_pipeline_is_used(tmp_path: Path) -> None:
    """A run record that is not JSON, one that says the run saved no pipeline (a rerun with
    save_pipeline=false into the folder of an earlier run that did), and a pickle of allowed
    globals that is not a features -> model Pipeline are each one named error."""
    from collections import OrderedDict

    import joblib

    from ckpred.errors import MissingFileError
    from ckpred.runs import load_train_run
    from ckpred.util import sha256_file

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    joblib.dump(OrderedDict(a=1), run_dir / "pipeline.joblib", compress=3)
    (run_dir / "run.json").write_text("{not json")
    with pytest.raises(InputFileError, match="run.json: export: not a run record ckpred wrote"):
        load_train_run(run_dir, purpose="export", require_record=False)
    record = {"command": "train", "created": "2025-01-01T00:00:00+00:00", "pipeline": {"file": None, "sha256": None}}
    (run_dir / "run.json").write_text(json.dumps(record))
    with pytest.raises(MissingFileError, match="save_pipeline=false"):
        load_train_run(run_dir, purpose="export", require_record=False)
    record["pipeline"] = {"file": "pipeline.joblib", "sha256": sha256_file(run_dir / "pipeline.joblib")}
    (run_dir / "run.json").write_text(json.dumps(record))
    with pytest.raises(InputFileError, match="not a pipeline train saved \\(an object of type OrderedDict"):
        load_train_run(run_dir, purpose="warm_start", require_record=True)
