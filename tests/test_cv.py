"""CV schemes are registered objects: a new scheme is one class and one YAML file, folds can test
their rows with an arch of their own, and the registry refuses what it cannot run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckpred.commands.train import train
from ckpred.config import compose
from ckpred.cv import CVScheme, Fold, register_scheme, scheme_for
from ckpred.cv import schemes as cv_schemes
from ckpred.errors import ConfigValueError
from ckpred.kernels.base import load_op
from ckpred.schema import CVConfig, arch_config
from tests.test_ops import MATMUL

#: Features of the test op, with two hardware constants (they follow each fold's arch).
TMM_FEATURES = """\
defaults:
  - base_features
  - _self_
name: tmm
groups:
  - kind: expressions
    name: tmm
    params:
      features:
        log2_rows: log2(rows)
        elem_bytes: dtype_bytes(precision)
        block_m: block_m
        num_warps: num_warps
        num_stages: num_stages
        tiles_m: ceil_div(rows, block_m)
        lds_share: (block_m + block_n) * 64 * dtype_bytes(precision) * num_stages / hw.lds_bytes
        hw_cus: hw.cus
"""

SMALL = ["model.n_estimators=6", "model.num_leaves=7", "model.n_jobs=1", "model.min_child_samples=2",
         "baselines.plain.model.n_estimators=6", "baselines.reference.enabled=false", "progress=false",
         "plots=false", "save_pipeline=false"]


# -- the toy scheme: one class (with its config) here, one YAML file in a user config dir -----------
@dataclass
class PartsConfig(CVConfig):
    """``cv=parts``: fold i tests the CV groups whose index is i modulo ``parts``."""

    parts: int = 2
    #: A packaged arch whose constants the last fold's test rows use ("" = the table's own).
    last_arch: str = ""


class Parts(CVScheme):
    name = "parts"
    config = PartsConfig

    def plan(self, data, test, seed):  # type: ignore[no-untyped-def]
        group = data.cv_groups % int(self.cv.parts)
        idx = np.arange(data.groups.n_shapes)
        folds = [Fold(f"part{i}", idx[group != i], idx[group == i]) for i in range(int(self.cv.parts))]
        if self.cv.last_arch:
            folds[-1].test_arch = arch_config(str(self.cv.last_arch))
        return folds


@pytest.fixture
def parts_scheme(tmp_path: Path):  # type: ignore[no-untyped-def]
    register_scheme(Parts)
    root = tmp_path / "conf"
    (root / "cv").mkdir(parents=True)
    (root / "cv" / "parts.yaml").write_text("defaults:\n  - base_parts\n  - _self_\nparts: 2\n")
    (root / "op").mkdir()
    (root / "op" / "tmm.yaml").write_text(MATMUL)
    (root / "features").mkdir()
    (root / "features" / "tmm.yaml").write_text(TMM_FEATURES)
    yield root
    cv_schemes._SCHEMES.pop("parts")


def _tmm_table() -> pd.DataFrame:
    """6 shapes x 2 precisions = 12 queries (6 CV groups), 12 kernels each; block_m=128 with 2
    stages in fp32 needs 80 KiB of LDS: it runs on gfx950 (160 KiB), not on gfx942 (64 KiB)."""
    rng = np.random.default_rng(3)
    rows = []
    for r in (16, 32, 64, 128, 256, 512):
        for p in ("fp16", "fp32"):
            for bm in (32, 64, 128):
                for stages in (1, 2):
                    for warps in (4, 8):
                        name = f"bm{bm}_bn32_w{warps}_s{stages}"
                        time = r * (1 + abs(bm - r) / 128) / warps * (1.2 if p == "fp32" else 1.0)
                        time *= rng.uniform(0.9, 1.1)
                        rows.append({"rows": r, "cols": 64, "depth": 64, "precision": p, "block_m": bm, "block_n": 32,
                                     "num_warps": warps, "num_stages": stages, "kernel_name": name, "time": time})
    return pd.DataFrame(rows)


def _train_parts(root: Path, tmp_path: Path, name: str, *extra: str) -> Path:
    table = tmp_path / "tmm.csv"
    if not table.exists():
        _tmm_table().to_csv(table, index=False)
    out = tmp_path / name
    train(compose("train", [f"hydra.searchpath=[file://{root}]", "op=tmm", "features=tmm", "arch=gfx950",
                            "data=path", f"data.path={table}", f"data.cache_dir={tmp_path / 'cache'}", "cv=parts",
                            *SMALL, f"out_dir={out}", *extra]))
    return out


@pytest.mark.slow
def test_a_new_scheme_is_one_class_and_one_yaml_file(parts_scheme: Path, tmp_path: Path) -> None:
    out = _train_parts(parts_scheme, tmp_path, "run")
    folds = json.loads((out / "folds.json").read_text())
    assert folds["cv"] == "parts" and [f["fold"] for f in folds["folds"]] == ["part0", "part1"]
    tested = [set(f["test_shapes"]) for f in folds["folds"]]
    assert not tested[0] & tested[1] and len(tested[0] | tested[1]) == 12
    for fold in folds["folds"]:  # a CV group (both precisions of a shape) is never split
        sizes = {s.rsplit("x", 1)[0] for s in fold["test_shapes"]}
        assert len(fold["test_shapes"]) == 2 * len(sizes)
        assert not set(fold["model"]["train_shapes"]) & set(fold["test_shapes"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"]["n_shapes"] == 12 and metrics["model"]["folds"]["n"] == 2
    record = json.loads((out / "run.json").read_text())
    assert record["cv"] == "parts" and record["config"]["cv"] == {"name": "parts", "parts": 2, "last_arch": ""}
    # the scheme's own options are typed and checked like every other key
    with pytest.raises(Exception, match="parts"):
        compose("train", [f"hydra.searchpath=[file://{parts_scheme}]", "cv=parts", "cv.parts=two"])
    with pytest.raises(Exception, match="n_splits"):
        compose("train", [f"hydra.searchpath=[file://{parts_scheme}]", "cv=parts", "cv.n_splits=3"])


def test_a_fold_tests_its_rows_with_its_own_arch(parts_scheme: Path, tmp_path: Path) -> None:
    own = _train_parts(parts_scheme, tmp_path, "own_arch", "cv.last_arch=gfx942")
    oof = pd.read_parquet(own / "oof_predictions.parquet")
    op = load_op(compose("train", [f"hydra.searchpath=[file://{parts_scheme}]", "op=tmm"]).op)
    rows = oof.merge(_tmm_table().assign(shape=lambda t: op.shape_keys(t)), on=["shape", "kernel_name"])
    assert len(rows) == len(oof) == 144
    needs = (rows["block_m"] == 128) & (rows["num_stages"] == 2) & (rows["precision"] == "fp32")
    last = rows["fold"] == 1
    # gfx950's rules on fold 0, gfx942's (64 KiB of LDS) on fold 1, as the scheme asked
    assert rows.loc[~last, "selectable"].all()
    assert (rows.loc[last, "selectable"] == ~needs[last]).all() and (last & needs).any()
    # so no pick of fold 1 is a kernel gfx942 cannot run
    per_shape = pd.read_csv(own / "per_shape.csv")
    chosen = per_shape[per_shape["fold"] == 1][["shape", "model_kernel"]].merge(
        rows[last], left_on=["shape", "model_kernel"], right_on=["shape", "kernel_name"])
    assert len(chosen) == 6 and chosen["selectable"].all()


def test_the_registry_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigValueError, match=r"cv.name.*group_kfold.*holdout.*external"):
        scheme_for(type("Cfg", (), {"name": "nope"})())

    class Twin(CVScheme):
        name = "group_kfold"
        config = CVConfig

    with pytest.raises(ValueError, match="registered already"):
        register_scheme(Twin)
    assert type(scheme_for(compose("train", ["cv=holdout"]).cv)).__name__ == "Holdout"


def test_a_partitioned_dataset_needs_a_scheme_with_hash_ranges(tmp_path: Path) -> None:
    from ckpred import scale
    from ckpred.data import load_table

    cfg = compose("train", ["shapes=tiny"])
    op = load_op(cfg.op)
    scale.write_partitions([load_table(cfg)], tmp_path / "parts", op)
    with pytest.raises(ConfigValueError, match="group_kfold or holdout with a partitioned dataset"):
        train(compose("train", ["model.backend=dask", "data=path", f"data.path={tmp_path / 'parts'}",
                                "cv=leave_family_out", f"out_dir={tmp_path / 'run'}", "progress=false"]))
