"""Hostile inputs to the C++ selector: it refuses what the Python runtime refuses, in one line.

The tampered and malformed exports are the Python suite's (test_hostile_runtime.TAMPERS and its
manifest fuzz); each must end with exit code 3 and one line on stderr, never an abort or a
signal. Bad problems and options end with exit code 2. Out-of-distribution flags equal the
Python runtime's.
"""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpred.errors import CkpredError
from ckpred.runtime import KernelSelector
from test_cpp import _run, binary  # noqa: F401  (fixture: builds the binary)
from test_hostile_autotune import CALIBRATIONS, EXPORT_TAMPERS, forged, other_export, python_accepts  # noqa: F401
from test_hostile_runtime import TAMPERS, export, mutate, selector  # noqa: F401  (fixtures: an export)

# builds and runs the C++ binaries: the developer loop (-m "not slow") skips the module
pytestmark = pytest.mark.slow


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_tampered_export_is_refused_like_the_python_runtime(binary, export, tmp_path, name) -> None:  # noqa: F811
    d = tmp_path / export.name
    shutil.copytree(export, d)
    TAMPERS[name][0](d)
    out = _run(binary, d, "128,1536,7168")
    assert out.returncode == 3 and out.stdout == "", out.stdout + out.stderr
    line = _one_line(out.stderr)
    assert line.startswith("ckpred_select: model refused: ") and TAMPERS[name][2] in line


@pytest.mark.parametrize(("args", "text"), [
    (("--arch", "gfx942"), "model is for arch 'gfx950', asked for 'gfx942'"),
    (("--dtype", "bf16"), "model is for dtype 'fp8', asked for 'bf16'"),
    (("--layout", "rrr"), "model is for layout 'rcr', asked for 'rrr'"),
    (("--op", "grouped_conv_fwd"), "model is for op 'gemm_universal', asked for 'grouped_conv_fwd'"),
])
def test_wrong_arch_dtype_layout_op_is_refused(binary, export, args, text) -> None:  # noqa: F811
    out = _run(binary, export, *args, "128,1536,7168")
    assert out.returncode == 3 and text in _one_line(out.stderr)


@pytest.mark.parametrize(("shape", "text"), [
    ("-5,1536,7168", "problem field m=-5 is negative; allowed: an integer in [1, 9223372036854775807]"),
    ("0,1536,7168", "problem field m=0 is below the field's minimum; allowed: an integer in [1,"),
    ("128,1536,7168,0", "problem field split_k=0 is below the field's minimum"),
    ("9223372036854775808,1536,7168", "problem field m=9223372036854775808 is beyond int64"),
    ("-9223372036854775809,1,1", "problem field m=-9223372036854775809 is beyond int64"),
    ("1.5,1536,7168", "problem field m=1.5 is not an integer"),
    ("true,1536,7168", "problem field m=true is not an integer"),
    (",1536,7168", "problem field m='' is not an integer"),
    ("m=1,m=2,n=3,k=4", "problem field 'm' given twice"),
    ("m=1,n=2,k=3,q=4", "unknown problem field 'q'"),
])
def test_bad_problem_values_are_refused(binary, export, shape, text) -> None:  # noqa: F811
    out = _run(binary, export, shape)
    assert out.returncode == 2 and out.stdout == "" and text in _one_line(out.stderr)


@pytest.mark.parametrize("args", [
    ("--top-k", "2.7"), ("--top-k", "0"), ("--top-k", "9223372036854775808"), ("--threads", "0"),
    ("--threads", "100000"), ("--threads", "1e3"), ("--bench", "-1"), ("--cache", "x"),
])
def test_bad_options_are_refused(binary, export, args) -> None:  # noqa: F811
    out = _run(binary, export, *args, "128,1536,7168")
    assert out.returncode == 2 and f"{args[0]} '{args[1]}': allowed: an integer in [" in _one_line(out.stderr)


def test_largest_int64_is_a_legal_problem_value(binary, export, selector) -> None:  # noqa: F811
    out = _run(binary, export, "9223372036854775807,1536,7168")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    want = selector.select(2**63 - 1, 1536, 7168).to_dict()
    assert got["ood_fields"] == want["ood_fields"] and [k["id"] for k in got["kernels"]] == \
        [k["id"] for k in want["kernels"]]


def test_out_of_distribution_flags_equal_the_python_runtime(binary, export, selector, tmp_path) -> None:  # noqa: F811
    shapes = [(128, 1536, 7168), (100000, 1536, 7168), (1, 100, 100), (64, 1, 4096), (64, 4096, 1),
              (16384, 9216, 7168), (16385, 9216, 7168), (128, 1536, 7168, 2), (7, 575, 513)]
    shape_file = tmp_path / "shapes.txt"
    shape_file.write_text("\n".join(",".join(map(str, s)) for s in shapes) + "\n")
    out = _run(binary, export, "--top-k", 3, "--shapes", shape_file)
    assert out.returncode == 0, out.stderr
    flagged = 0
    for line, shape in zip(out.stdout.splitlines(), shapes, strict=True):
        got, want = json.loads(line), selector.select(*shape, top_k=3).to_dict()
        assert got["out_of_distribution"] == want["out_of_distribution"]
        assert got["ood_fields"] == want["ood_fields"]
        assert got["ok"] == want["ok"] and [k["id"] for k in got["kernels"]] == [k["id"] for k in want["kernels"]]
        flagged += got["out_of_distribution"]
    assert flagged == 7  # every shape but the two inside the ranges (first and sixth)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_malformed_manifests_are_refused_like_python_never_aborting(binary, export, tmp_path_factory,  # noqa: F811
                                                                    data) -> None:
    d = tmp_path_factory.mktemp("cppfuzz") / export.name
    d.mkdir()
    for name in ("model.onnx", "scorer.onnx"):
        (d / name).symlink_to(export / name)
    man = mutate((export / "manifest.json").read_text(), data)
    (d / "manifest.json").write_text(json.dumps(man))
    out = _run(binary, d, "128,1536,7168")
    assert out.returncode in (0, 3), out.stderr  # never a signal (negative) or an abort
    try:
        KernelSelector.load(d, cache_size=0)
        python_ok = True
    except CkpredError:
        python_ok = False
    assert (out.returncode == 0) == python_ok, out.stderr
    if out.returncode:
        assert _one_line(out.stderr).startswith("ckpred_select: model refused: ")


shape_text = st.text(alphabet="0123456789-+,=mnkq_ .eE\t", max_size=30)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=shape_text)
def test_any_shape_text_is_answered_or_refused_in_one_line(binary, export, selector, shape) -> None:  # noqa: F811
    out = _run(binary, export, shape)
    assert out.returncode in (0, 2), out.stderr
    if out.returncode:
        assert _one_line(out.stderr).startswith("ckpred_select: ")
    else:  # accepted: the same answer as the Python runtime for the parsed problem
        for line in out.stdout.splitlines():
            got = json.loads(line)
            want = selector.select(got["problem"], top_k=5).to_dict()
            assert [k["id"] for k in got["kernels"]] == [k["id"] for k in want["kernels"]]


# -- files that are not regular files, forged calibrations, the --shapes file ----------------------
@pytest.mark.parametrize("name", sorted(n for n in EXPORT_TAMPERS if "swapped" not in n and "calibration" not in n))
def test_x09c_x10c_x12c_manifest_or_model_that_is_no_file_is_refused_without_reading(binary, export, other_export,  # noqa: F811
                                                                                   tmp_path, name) -> None:
    d = tmp_path / "m"
    shutil.copytree(export, d)
    tamper, text = EXPORT_TAMPERS[name]
    tamper(d, other_export)
    out = _run(binary, d, "128,1536,7168")
    assert out.returncode == 3 and out.stdout == ""
    line = _one_line(out.stderr)
    assert line.startswith("ckpred_select: model refused: ") and text in line, line


@pytest.mark.parametrize("name", sorted(CALIBRATIONS))
def test_x04c_x05c_forged_calibrations_ckpred_select_decides_as_python(binary, export, tmp_path, name) -> None:  # noqa: F811
    calibration, accepted = CALIBRATIONS[name]
    d = forged(export, tmp_path / "m", calibration)
    assert python_accepts(d) == accepted
    out = _run(binary, d, "128,1536,7168")
    assert out.returncode == (0 if accepted else 3), out.stderr
    if not accepted:
        assert "autotune calibration" in _one_line(out.stderr)


@pytest.mark.parametrize("kind", ["cx01-dev-zero", "cx02-fifo", "directory"])
def test_a_shapes_file_that_is_no_file_is_refused_without_reading(binary, export, tmp_path, kind) -> None:  # noqa: F811
    import os

    if kind == "cx01-dev-zero":
        shapes, text = "/dev/zero", "a character device, not a regular file"
    elif kind == "cx02-fifo":
        shapes, text = str(tmp_path / "s.fifo"), "a FIFO, not a regular file"
        os.mkfifo(shapes)
    else:
        shapes, text = str(tmp_path), "a directory, not a regular file"
    out = _run(binary, export, "--shapes", shapes)
    assert out.returncode == 2 and f"ckpred_select: shapes file {shapes}: {text}" == _one_line(out.stderr)
