"""Every option of every config group composes; bad values fail naming key, value, allowed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hydra.errors import MissingConfigException

from ckpred.config import CONF_DIR, compose
from tests.conftest import REPO
from ckpred.errors import ConfigValueError

#: Primary configs and the overrides they need to compose on their own.
PRIMARY = {"ingest": ["data.path=x.csv"], "train": [], "simulate": [], "export": [],
           "select": ["problem.m=128", "problem.n=1536", "problem.k=7168"], "tune": [],
           "sweep_report": ["dir=multirun/train/x"], "replay": ["run_dir=runs/train/x"]}


#: Required problem fields of each op's ``problem`` option (``select``).
PROBLEM_FIELDS = {"gemm_universal": ["problem.m=128", "problem.n=1536", "problem.k=7168"],
                  "grouped_conv_fwd": ["dtype=bf16", "problem.n=1", "problem.c=64", "problem.k=128",
                                       "problem.hi=56", "problem.wi=56", "problem.y=3", "problem.x=3"]}


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _groups() -> list[str]:
    return sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and not p.name.startswith("_")
                  and p.name != "hydra" and any(p.glob("*.yaml")))


#: Groups a primary config composes without reading them (so that experiment=<name> composes).
UNREAD = {"ingest": {"shapes", "features", "model", "target", "cv"}, "export": {"cv"},
          "select": {"data", "shapes", "features", "model", "target", "cv"}}


def _cases() -> list[tuple[str, str, str]]:
    cases = []
    for group in _groups():
        for option in _options(group):
            primary = next((name for name in PRIMARY if group in _primary_groups(name)
                            and group not in UNREAD.get(name, ())), None)
            cases.append((primary or "", group, option))
    return cases


def _primary_groups(name: str) -> set[str]:
    text = (CONF_DIR / f"{name}.yaml").read_text()
    return {line.split(":")[0].strip(" -").removeprefix("optional ") for line in text.splitlines()
            if line.startswith("  - ") and ":" in line}


@pytest.mark.slow
@pytest.mark.parametrize(("primary", "group", "option"), _cases())
def test_every_option_composes(primary: str, group: str, option: str) -> None:
    if not primary:
        pytest.skip(f"group {group!r} is used by a primary config not listed in PRIMARY")
    overrides = [*PRIMARY[primary], f"{group}={option}"]
    if group == "arch":  # the default dtype (fp8) is not one every arch runs (gfx90a has no fp8)
        overrides.append("dtype=fp16")
    if group == "target":  # only a regressor reads a target (the default model is the ranker)
        overrides.append("model=lgbm_regressor")
    if group == "data" and option != "path":  # only data=path reads data.path
        overrides = [o for o in overrides if not o.startswith("data.path=")]
    if group == "problem":  # a problem option belongs to the op of the same name, with its own fields
        overrides = [f"op={option}", *PROBLEM_FIELDS[option], f"problem={option}"]
    cfg = compose(primary, overrides)
    if group == "experiment":  # `# @package _global_` bundles merge into the root, not a key
        return
    assert getattr(cfg, group) is not None


def test_arch_specs_are_real() -> None:
    cfg = compose("ingest", ["data.path=x", "arch=gfx950"])
    assert (cfg.arch.compute_units, cfg.arch.dies, cfg.arch.shared_memory_kib, cfg.arch.peak_tflops["fp8"]) == (
        256, 8, 160, 5033.0)
    cfg = compose("ingest", ["data.path=x", "arch=gfx942"])
    assert (cfg.arch.compute_units, cfg.arch.memory_bandwidth_gbs, cfg.arch.peak_tflops["fp16"]) == (304, 5300.0, 1307.0)
    cfg = compose("ingest", ["data.path=x", "arch=sm80_a100", "dtype=fp16"])
    assert (cfg.arch.vendor, cfg.arch.isa, cfg.arch.compute_units, cfg.arch.warp_size, cfg.arch.shared_memory_kib,
            cfg.arch.l2_mib_per_die, cfg.arch.memory_bandwidth_gbs) == ("nvidia", "sm_80", 108, 32, 164, 40.0, 1555.0)


def test_an_arch_written_with_the_old_amd_names_still_composes(tmp_path: Path) -> None:
    """A user's arch config from before the neutral names: each old key fills its neutral one,
    and expressions read the constants under both names."""
    from ckpred.schema import arch_constants

    (tmp_path / "arch").mkdir()
    (tmp_path / "arch" / "old_gpu.yaml").write_text(
        "defaults:\n  - base_arch\n  - _self_\nname: old_gpu\nproduct: Old GPU\ngfx: gfx90a\ncus: 96\n"
        "xcds: 2\nshader_engines: 4\nsimds_per_cu: 4\nwave_size: 64\nmax_waves_per_cu: 32\nclock_mhz: 2000\n"
        "lds_kib: 64\nl1_kib: 16\nl2_mib_per_xcd: 4.0\nllc_mib: 0.0\nmemory_bandwidth_gbs: 1000.0\n"
        "peak_tflops: {fp16: 100.0}\n")
    cfg = compose("ingest", [f"hydra.searchpath=[file://{tmp_path}]", "data.path=x", "arch=old_gpu", "dtype=fp16"])
    assert (cfg.arch.compute_units, cfg.arch.dies, cfg.arch.warp_size, cfg.arch.shared_memory_kib, cfg.arch.isa,
            cfg.arch.l2_mib_per_die) == (96, 2, 64, 64, "gfx90a", 4.0)
    hw = arch_constants(cfg.arch)
    assert hw["cus"] == hw["compute_units"] == 96 and hw["l2_mib"] == 8.0 and hw["lds_bytes"] == 65536
    assert np.isnan(hw["registers_kib"])  # not given: nan, never another arch's number
    # a new-style override of an old-style config wins consistently
    cfg = compose("ingest", [f"hydra.searchpath=[file://{tmp_path}]", "data.path=x", "arch=old_gpu", "dtype=fp16",
                             "arch.cus=80"])
    assert cfg.arch.compute_units == 80


@pytest.mark.parametrize(("override", "group", "value"), [("dtype=fp9", "dtype", "fp9"),
                                                          ("arch=gfx999", "arch", "gfx999"),
                                                          ("layout=xyz", "layout", "xyz")])
def test_unknown_option_names_group_value_and_options(override: str, group: str, value: str) -> None:
    with pytest.raises(MissingConfigException) as err:
        compose("ingest", ["data.path=x", override])
    text = str(err.value)
    assert f"{group}/{value}" in text and f"Available options in '{group}'" in text
    for option in _options(group):
        assert option in text


@pytest.mark.slow
@pytest.mark.parametrize(("override", "key", "allowed"), [
    ("arch.compute_units=-3", "arch.compute_units", "> 0"),
    ("arch.warp_size=48", "arch.warp_size", "32 or 64"),
    ("arch.vendor=intel", "arch.vendor", "nvidia"),
    # an old AMD name that disagrees with the neutral key the config gives
    ("arch.cus=3", "arch.cus", "compute_units"),
    ("data.format=xml", "data.format", "json"),
    ("dtype.bytes_per_element=0", "dtype.bytes_per_element", "a number > 0"),
    ("layout.code=3", "layout.code", "the code of layout rcr"),
])
def test_bad_value_names_key_value_allowed(override: str, key: str, allowed: str) -> None:
    with pytest.raises(ConfigValueError) as err:
        compose("ingest", ["data.path=x", override])
    assert err.value.key == key
    assert key in str(err.value) and override.split("=")[1] in str(err.value) and allowed in str(err.value)


def test_missing_mandatory_key_is_named_with_how_to_give_it() -> None:
    """A conv ``select`` without its filter height: the key and the override to pass, not a traceback."""
    with pytest.raises(ConfigValueError) as err:
        compose("select", ["op=grouped_conv_fwd", "dtype=bf16", "problem.n=1", "problem.c=8", "problem.k=8",
                           "problem.hi=4", "problem.wi=4", "problem.x=1"])
    assert err.value.key == "problem.y" and "pass problem.y=<value>" in str(err.value)


def test_wrong_type_is_rejected_at_composition() -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="cus"):
        compose("ingest", ["data.path=x", "arch.cus=many"])


def test_unknown_key_is_rejected() -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="num_cus"):
        compose("ingest", ["data.path=x", "arch.num_cus=3"])


#: Every experiment shipped (conf/experiment) or documented (tests/ops/experiment, docs/ops.md).
EXPERIMENTS = [(None, p.stem) for p in sorted((CONF_DIR / "experiment").glob("*.yaml"))] + \
    [(REPO / "tests" / "ops", p.stem) for p in sorted((REPO / "tests" / "ops" / "experiment").glob("*.yaml"))]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "tune", "export", "select", "ingest"])
@pytest.mark.parametrize(("config_dir", "experiment"), EXPERIMENTS, ids=[e for _, e in EXPERIMENTS])
def test_every_experiment_composes_for_every_recipe_command(config_dir, experiment: str, command: str) -> None:
    """An experiment sets a recipe (and train's cv / baselines): every command that takes a
    recipe composes it, and reads its op, arch, dtype and layout (export names the same model
    select answers from; ingest reads the experiment's table)."""
    def composed(name: str, *overrides: str):
        try:
            return compose(name, [f"experiment={experiment}", *overrides], config_dir=config_dir)
        except ConfigValueError as err:  # an experiment of data=path without the files: give them
            if err.key != "data.path":
                raise
            return compose(name, [f"experiment={experiment}", *overrides, "data.path=x"], config_dir=config_dir)

    trained = composed("train")
    problem = [f"++problem.{k}=1" for k in (trained.op.problem_fields or {"m": 0, "n": 0, "k": 0})]
    cfg = composed(command, *(problem if command == "select" else []))
    for key in ("op", "arch", "dtype", "layout"):
        assert getattr(cfg, key).name == getattr(trained, key).name


# -- open vocabularies: dtypes and layouts are the files of the config dirs --------------------------
def _user_dir(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


MXFP4 = "defaults: [base_dtype, _self_]\nname: mxfp4\nbytes_per_element: 0.5\nc_dtype: bf16\naliases: [fp4x2]\n"
RRC = "defaults: [base_layout, _self_]\nname: rrc\na: r\nb: r\nc: c\ncode: 7\n"


@pytest.mark.slow
def test_a_dtype_and_a_layout_in_a_user_config_dir_are_in_the_vocabulary(tmp_path) -> None:
    from ckpred import vocab
    from ckpred.expressions import dtype_bytes_table
    from ckpred.schema import arch_constant_names, dtype_names, layout_names

    user = _user_dir(tmp_path, {"dtype/mxfp4.yaml": MXFP4, "layout/rrc.yaml": RRC})
    cfg = compose("ingest", ["data.path=x", "dtype=mxfp4", "layout=rrc", "+arch.peak_tflops.mxfp4=10066"],
                  config_dir=user)
    assert (cfg.dtype.name, cfg.dtype.bytes_per_element, cfg.layout.code) == ("mxfp4", 0.5, 7)
    assert "mxfp4" in dtype_names() and "rrc" in layout_names() and "peak_tflops_mxfp4" in arch_constant_names()
    assert dtype_bytes_table()["fp4x2"] == 0.5 and vocab.current().dtype("fp4x2").name == "mxfp4"
    compose("ingest", ["data.path=x"])  # the package's own again
    assert "mxfp4" not in dtype_names()


@pytest.mark.slow
@pytest.mark.parametrize(("files", "key", "fragment"), [
    ({"dtype/mxfp4.yaml": MXFP4.replace("name: mxfp4", "name: fp4")}, "dtype.name", "'mxfp4' (the file's name"),
    ({"dtype/mxfp4.yaml": MXFP4.replace("0.5", "-1")}, "dtype.bytes_per_element", "a number > 0"),
    ({"dtype/mxfp4.yaml": MXFP4.replace("c_dtype: bf16", "c_dtype: bf17")}, "dtype.c_dtype", "a dtype of"),
    ({"dtype/mxfp4.yaml": MXFP4.replace("[fp4x2]", "[float16]")}, "dtype.aliases", "dtype fp16 already spells"),
    ({"layout/rrc.yaml": RRC.replace("code: 7", "code: 0")}, "layout.code", "layout rcr has it"),
    ({"layout/rrc.yaml": RRC.replace("code: 7\n", "")}, "layout.code", "an integer >= 0"),
])
def test_a_bad_vocabulary_file_is_named(tmp_path, files: dict[str, str], key: str, fragment: str) -> None:
    with pytest.raises(ConfigValueError) as err:
        compose("ingest", ["data.path=x"], config_dir=_user_dir(tmp_path, files))
    assert err.value.key.startswith(key) and str(tmp_path) in err.value.key and fragment in str(err.value)


# -- defaults that neither oversubscribe nor spin ---------------------------------------------------
def test_every_model_of_the_default_train_fits_with_one_thread() -> None:
    cfg = compose("train", [])
    threads = (cfg.model.n_jobs, cfg.baselines.plain.model.n_jobs, cfg.baselines.reference.model.n_jobs,
               cfg.validity.n_jobs)
    assert threads == (1, 1, 1, 1)


def test_the_command_line_puts_openmps_waiting_threads_to_sleep() -> None:
    """LightGBM's OpenMP threads busy-wait between parallel regions unless told otherwise; the
    command process tells them (OpenMP reads the policy when LightGBM loads), a caller's own
    choice stays."""
    import os
    import subprocess
    import sys

    code = "import os; from ckpred.cli import main; main(['--help']); print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"}, capture_output=True,
                         text=True, check=True)
    assert out.stdout.splitlines()[-1] == "ACTIVE"
