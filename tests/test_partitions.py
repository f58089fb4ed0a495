"""The manifest of a partitioned dataset (``_ckpred_partitions.json``): a hand-edited one that
is malformed is refused with one named line, in the library and through ``ckpred train``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest

from ckpred.data.partitions import MANIFEST, read_manifest
from ckpred.data.simulate import simulate
from ckpred.dtypes import load_dtype
from ckpred.errors import InputFileError
from ckpred.kernels.base import load_op
from ckpred.scale import layout_config, write_partitions
from ckpred.schema import arch_config

OP = load_op("gemm_universal")


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    """Two parts, one shape each, and their manifest."""
    shapes = pd.DataFrame({"m": [256, 1024], "n": [512, 2048], "k": [1024, 512], "split_k": [1, 1]})
    frames = (simulate(shapes.iloc[[i]], OP, arch_config("gfx942"), load_dtype("fp16"), layout_config("rcr"))
              for i in range(2))
    write_partitions(frames, tmp_path / "ds", OP)
    return tmp_path / "ds"


def _edit(dataset: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Apply ``change`` to the manifest in place (its return value is ignored)."""
    manifest = json.loads((dataset / MANIFEST).read_text())
    change(manifest)
    (dataset / MANIFEST).write_text(json.dumps(manifest))


def test_the_written_manifest_is_accepted(dataset: Path) -> None:
    manifest = read_manifest(dataset, OP)
    assert [p["file"] for p in manifest["partitions"]] == ["part-00000.parquet", "part-00001.parquet"]
    assert manifest["rows"] == sum(p["rows"] for p in manifest["partitions"]) > 0


# (edit of the manifest, words the one-line error must hold besides the manifest's path)
BAD = {
    "no partitions": (lambda m: m.pop("partitions"), ["key 'partitions' is absent", "allowed: a non-empty list"]),
    "partitions a dict": (lambda m: m.update(partitions={"file": "part-00000.parquet"}),
                          ["key 'partitions' is {'file': 'part-00000.parquet'} (dict)", "list of part entries"]),
    "partitions empty": (lambda m: m.update(partitions=[]), ["key 'partitions' is [] (list)", "non-empty"]),
    "entry a string": (lambda m: m["partitions"].__setitem__(1, "part-00001.parquet"),
                       ["partitions[1] is 'part-00001.parquet' (str)", "{file, rows, arch, dtype, layout}"]),
    "entry without file": (lambda m: m["partitions"][0].pop("file"),
                           ["partitions[0].file is absent", "Parquet part file"]),
    "file a number": (lambda m: m["partitions"][1].update(file=7), ["partitions[1].file is 7 (int)"]),
    "file absent from the directory": (lambda m: m["partitions"][1].update(file="part-00009.parquet"),
                                       ["partitions[1].file is 'part-00009.parquet' (str)", "present in"]),
    "file escaping the directory": (lambda m: m["partitions"][0].update(file="../ds/part-00000.parquet"),
                                    ["partitions[0].file is '../ds/part-00000.parquet'", "without '..'"]),
    "absolute file": (lambda m: m["partitions"][0].update(file="/etc/hostname"),
                      ["partitions[0].file is '/etc/hostname'", "relative"]),
    "file listed twice": (lambda m: m["partitions"][1].update(file="part-00000.parquet"),
                          ["partitions[1].file is 'part-00000.parquet'", "listed once"]),
    "rows a string": (lambda m: m["partitions"][0].update(rows="12"), ["partitions[0].rows is '12' (str)", ">= 0"]),
    "entry without arch": (lambda m: m["partitions"][1].pop("arch"), ["partitions[1].arch is absent", "string"]),
    "total rows off": (lambda m: m.update(rows=m["rows"] + 1), ["key 'rows'", "sum of the parts' rows"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_malformed_manifest_is_one_named_error(dataset: Path, case: str) -> None:
    change, words = BAD[case]
    _edit(dataset, change)
    with pytest.raises(InputFileError) as err:
        read_manifest(dataset, OP)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"cannot read {dataset / MANIFEST}: ")
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize(("text", "word"), [("{\"op\": \"gemm_universal\", ", "not valid JSON"),
                                            (b"\xff\xfe{}", "not UTF-8"),
                                            ('[{"op": "gemm_universal"}]', "the top level is .* \\(list\\)")])
def test_a_manifest_that_is_not_an_object_is_one_named_error(dataset: Path, text: str | bytes, word: str) -> None:
    if isinstance(text, bytes):
        (dataset / MANIFEST).write_bytes(text)
    else:
        (dataset / MANIFEST).write_text(text)
    with pytest.raises(InputFileError, match=f"^cannot read {dataset / MANIFEST}: {word}"):
        read_manifest(dataset, OP)


@pytest.mark.slow
def test_train_on_a_malformed_manifest_prints_one_line(dataset: Path, tmp_path: Path) -> None:
    """Through the CLI: refused before a Dask cluster starts, one line, no traceback."""
    _edit(dataset, lambda m: m["partitions"][0].pop("file"))
    done = subprocess.run([sys.executable, "-m", "ckpred", "train", "model.backend=dask", "data=path",
                           f"data.path={dataset}", "arch=gfx942", "dtype=fp16", "progress=false",
                           f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith("ckpred train: error: cannot read "), done.stderr
    assert f"{MANIFEST}: partitions[0].file is absent" in lines[0]


def test_write_partitions_describes_each_part_from_the_table_it_wrote(tmp_path: Path, monkeypatch) -> None:
    """No part is read back to describe it: the manifest comes from the arrow table written."""
    import pyarrow.parquet as pq

    def no_reading(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a written part was read back")

    monkeypatch.setattr(pq, "read_table", no_reading)
    monkeypatch.setattr(pq, "read_schema", no_reading)
    shapes = pd.DataFrame({"m": [256, 1024], "n": [512, 2048], "k": [1024, 512], "split_k": [1, 1]})
    frames = [simulate(shapes.iloc[[i]], OP, arch_config(arch), load_dtype(dtype), layout_config("rcr"))
              for i, (arch, dtype) in enumerate([("gfx942", "fp16"), ("gfx950", "bf16")])]
    manifest = write_partitions(frames, tmp_path / "ds", OP)
    assert [(p["rows"], p["arch"], p["dtype"], p["layout"]) for p in manifest["partitions"]] == \
        [(len(frames[0]), "gfx942", "fp16", "rcr"), (len(frames[1]), "gfx950", "bf16", "rcr")]
    assert json.loads((tmp_path / "ds" / MANIFEST).read_text()) == manifest
    # a part mixing combos is refused, naming the part; the previous dataset stays whole
    with pytest.raises(InputFileError, match=r"part-00000\.parquet: column 'arch' holds 2 values"):
        write_partitions([pd.concat(frames)], tmp_path / "ds", OP)
    assert json.loads((tmp_path / "ds" / MANIFEST).read_text()) == manifest


def test_write_table_refuses_an_arrow_table_that_is_not_canonical(tmp_path: Path) -> None:
    import pyarrow as pa

    from ckpred.data.table import canonical_arrow, write_table
    from ckpred.errors import TableSchemaError

    shapes = pd.DataFrame({"m": [256], "n": [512], "k": [1024], "split_k": [1]})
    arrow = canonical_arrow(simulate(shapes, OP, arch_config("gfx942"), load_dtype("fp16"), layout_config("rcr")), OP)
    write_table(arrow, tmp_path / "ok.parquet", OP)
    assert pa.parquet.read_table(tmp_path / "ok.parquet").equals(arrow)
    with pytest.raises(TableSchemaError, match="not the canonical table of op 'gemm_universal'"):
        write_table(arrow.drop_columns(["tflops"]), tmp_path / "bad.parquet", OP)
    assert not (tmp_path / "bad.parquet").exists()
