"""Hostile inputs to autotune and its result store, in both runtimes (Python and the C++ header
through ckpred_autotune_demo): every one ends in a named error before anything is measured, a
skipped line with a warning, or a result that says what happened -- never a traceback, a hang,
a crash, a file of the user's written to, or measurements lost.

Ids in the test names are those of ../shared/hostile-inputs-74e02af.md (F06, F07, F18, F19, F25,
F26, F27, F30).
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import pytest

from ckpred import autotune as at
from ckpred.autotune.checks import _real
from ckpred.errors import ConfigValueError
from ckpred.runtime import KernelSelector
from test_hostile_runtime import export, selector  # noqa: F401  (fixtures: a small gemm export)

PROBLEM = {"m": 128, "n": 1536, "k": 7168}
KEY = "m=128,n=1536,k=7168,split_k=1"


class Bench:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, name: str) -> float:
        self.calls.append(name)
        return 1e-3 + 1e-6 * len(self.calls)


def _line(sel: KernelSelector, **over: Any) -> dict[str, Any]:
    return {"format": at.STORE_FORMAT, "model": at.model_hash(sel.manifest), "op": "gemm_universal",
            "problem": KEY, "kernel_id": 3, "kernel": sel.kernel_name(3), "seconds": 1e-4, **over}


def _demo(demo: Path, model: Path, store: Path, rankings: list[Any], *args: str, times: dict | None = None,
          check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
    times_file = store.parent / (store.name.replace("/", "_") + ".times.json")
    times_file.write_text(json.dumps(times if times is not None else
                                     {k: 1e-3 for r in rankings for k in r.kernels}))
    done = subprocess.run([str(demo), str(model), "--store", str(store), "--times", str(times_file), *args],
                          input="".join(json.dumps(r.to_dict()) + "\n" for r in rankings), capture_output=True,
                          text=True, timeout=60, **kw)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def _out(done: subprocess.CompletedProcess) -> list[dict[str, Any]]:
    return [json.loads(x) for x in done.stdout.splitlines()]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- F07: store lines are checked before they are served -----------------------------------------
# The C++ reader gets the same lines (test_cpp_skips_the_same_bad_lines: cs01 cs03 cs04).
BAD_LINES: dict[str, Callable[[KernelSelector], str]] = {
    # well-formed, but not this model's kernel
    "st03-not-in-catalogue": lambda s: json.dumps(_line(s, kernel_id=999999, kernel="; rm -rf / #")),
    "st08-id-of-another-kernel": lambda s: json.dumps(_line(s, kernel_id=5, kernel=s.kernel_name(7))),
    # wrong types or values
    "st05-nan-seconds": lambda s: json.dumps(_line(s)).replace('"seconds": 0.0001', '"seconds": NaN'),
    "st06-negative-seconds": lambda s: json.dumps(_line(s, seconds=-1)),
    "cs04-float-kernel-id": lambda s: json.dumps(_line(s)).replace('"kernel_id": 3', '"kernel_id": 1e300'),
    "st04-text-seconds": lambda s: json.dumps(_line(s, seconds="abc")),
    "st07-text-kernel-id": lambda s: json.dumps(_line(s, kernel_id="x")),
    "bool-kernel-id": lambda s: json.dumps(_line(s, kernel_id=True)),
    "empty-kernel": lambda s: json.dumps(_line(s, kernel="")),
    # a line nested 100,000 deep (carrying this model's sha, so that it is parsed)
    "st09-deep": lambda s: json.dumps(_line(s))[:-1] + ', "x": ' + "[" * 100000 + "]" * 100000 + "}",
    "too-long": lambda s: json.dumps(_line(s, policy="p" * (at.MAX_LINE_BYTES + 10))),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_a_bad_store_line_is_skipped_with_a_warning_and_the_problem_benchmarked(selector, tmp_path, caplog,  # noqa: F811
                                                                              name) -> None:
    store = tmp_path / "s.jsonl"
    store.write_text(BAD_LINES[name](selector) + "\n")
    bench = Bench()
    with caplog.at_level(logging.WARNING, logger="ckpred.autotune"):
        r = selector.autotune(PROBLEM, bench, at.FixedK(2), store=store)
    assert not r.from_store and r.ok and r.stored and len(bench.calls) == 2
    assert r.kernel in selector.select(PROBLEM, top_k=16).kernels
    assert "skipped" in caplog.text and "Traceback" not in caplog.text
    again = selector.autotune(PROBLEM, Bench(), at.FixedK(2), store=store)  # the fresh line now wins
    assert again.from_store and again.kernel == r.kernel


def test_a_good_store_line_is_served(selector, tmp_path) -> None:  # noqa: F811
    """The control of the cases above: the same line, well-formed and this model's, is served."""
    store = tmp_path / "s.jsonl"
    store.write_text(json.dumps(_line(selector)) + "\n")
    bench = Bench()
    r = selector.autotune(PROBLEM, bench, at.FixedK(2), store=store)
    assert r.from_store and r.kernel == selector.kernel_name(3) and r.kernel_id == 3 and bench.calls == []


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_cpp_skips_the_same_bad_lines(selector, export, cpp_demo, tmp_path, name) -> None:  # noqa: F811
    store = tmp_path / "s.jsonl"
    store.write_text(BAD_LINES[name](selector) + "\n")
    ranked = selector.select(PROBLEM, top_k=16)
    done = _demo(cpp_demo, export, store, [ranked])
    (got,) = _out(done)
    assert not got["from_store"] and got["ok"] and got["benchmarks"] == 2 and got["stored"]
    assert got["kernel"] in ranked.kernels
    assert "skipped" in done.stderr and "ckpred autotune: " in done.stderr


def test_cpp_serves_a_good_line(selector, export, cpp_demo, tmp_path) -> None:  # noqa: F811
    store = tmp_path / "s.jsonl"
    store.write_text(json.dumps(_line(selector)) + "\n")
    (got,) = _out(_demo(cpp_demo, export, store, [selector.select(PROBLEM, top_k=16)]))
    assert got["from_store"] and got["kernel"] == selector.kernel_name(3) and got["benchmarks"] == 0


def test_st21_a_big_store_of_other_models_is_read_in_bounded_memory(selector, tmp_path) -> None:  # noqa: F811
    """200,000 lines of other models (~50 MB): a lookup does not parse them, nor hold the file."""
    store = tmp_path / "big.jsonl"
    other = json.dumps(_line(selector, model="0" * 64, measured=[{"kernel_id": 1, "kernel": "k", "seconds": 1.0}] * 3))
    with open(store, "w") as fh:
        for i in range(200):
            fh.write((other.replace(KEY, f"m={i},n=1,k=1,split_k=1") + "\n") * 1000)
    code = ("import resource, sys, time; from ckpred.autotune import ResultStore; s = ResultStore(sys.argv[1]); "
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; t = time.perf_counter(); "
            "hit = s.get('1' * 64, 'gemm_universal', 'm=1'); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, time.perf_counter() - t, hit)")
    out = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    grown_kb, seconds, hit = out.stdout.split()
    assert hit == "None" and int(grown_kb) < 30_000, out.stdout  # the file is ~50 MB; parsed whole it cost ~9x that


# -- F06 / F27: writers never follow links; compaction files ---------------------------------------
def test_st11_a_symlinked_store_is_refused_before_benchmarking_and_its_target_untouched(selector, tmp_path) -> None:  # noqa: F811
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "s.jsonl").symlink_to(victim)
    bench = Bench()
    with pytest.raises(at.AutotuneError, match=r"s.jsonl: a symbolic link \(a store is never used through one\)"):
        selector.autotune(PROBLEM, bench, at.FixedK(2), store=tmp_path / "s.jsonl")
    assert bench.calls == [] and victim.read_text() == "precious\n"


def test_a_symlinked_lock_is_refused(selector, tmp_path) -> None:  # noqa: F811
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "s.jsonl.lock").symlink_to(victim)
    with pytest.raises(at.AutotuneError, match=r"store lock .*s.jsonl.lock: a symbolic link"):
        selector.autotune(PROBLEM, Bench(), at.FixedK(2), store=tmp_path / "s.jsonl")
    assert victim.read_text() == "precious\n"


def test_cs09_cpp_refuses_a_symlinked_store(selector, export, cpp_demo, tmp_path) -> None:  # noqa: F811
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "s.jsonl").symlink_to(victim)
    done = _demo(cpp_demo, export, tmp_path / "s.jsonl", [selector.select(PROBLEM, top_k=16)], check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert "s.jsonl: a symbolic link (a store is never used through one)" in _one_line(done.stderr)
    assert victim.read_text() == "precious\n"


def _entry(i: int) -> dict[str, Any]:
    return {"model": "m", "op": "op", "problem": f"p={i}", "kernel": f"k{i}", "kernel_id": i, "seconds": 1e-3 * (i + 1)}


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("runtime", ["python", "cpp"])
def test_cc05_compaction_files_of_dead_writers_are_removed_live_ones_kept(selector, export, cpp_demo, tmp_path,  # noqa: F811
                                                                        runtime) -> None:
    store = tmp_path / "s.jsonl"
    host = socket.gethostname()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        planted = {"dead": tmp_path / f".s.jsonl.tmp-{host}-{_dead_pid()}-0123456789abcdef",
                   "live": tmp_path / f".s.jsonl.tmp-{host}-{sleeper.pid}-0123456789abcdef",
                   "old": tmp_path / ".s.jsonl.tmp-otherhost-1-0123456789abcdef",
                   "fresh": tmp_path / ".s.jsonl.tmp-otherhost-2-0123456789abcdef",
                   # the old C++ writer's predictable name (a link planted there): never touched
                   "legacy": tmp_path / f"s.jsonl.tmp.{os.getpid()}"}
        for path in planted.values():
            path.write_text("partial\n")
        os.utime(planted["old"], (time.time() - 2 * at.STALE_TEMP_S,) * 2)
        if runtime == "python":
            at.ResultStore(store, max_entries=1).put(_entry(1))
        else:
            _demo(cpp_demo, export, store, [selector.select(PROBLEM, top_k=16)], "--max-entries", "1")
        left = {k for k, p in planted.items() if p.exists()}
        assert left == {"live", "fresh", "legacy"}
    finally:
        sleeper.kill()
        sleeper.wait()


_WRITER = """
import sys
from ckpred import autotune as at
store = at.ResultStore(sys.argv[1], max_entries=8)
print("ready", flush=True)
i = 0
while True:
    store.put({"model": "m", "op": "op", "problem": f"p={i % 40}", "kernel": f"k{i}", "kernel_id": i,
               "seconds": 1e-3})
    i += 1
"""


@pytest.mark.slow
def test_cc04_python_writers_killed_mid_write_tear_no_line_and_leave_no_temporary(tmp_path) -> None:
    """cc04: two writers compacting the same store (max_entries=8: a compaction every few
    puts), SIGKILLed at staggered times, round after round; the store stays whole lines of the
    format, and the next writer removes the dead writers' compaction files."""
    import random

    store = tmp_path / "s.jsonl"
    rng = random.Random(4)
    for _ in range(6):
        procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(store)], stdout=subprocess.PIPE, text=True)
                 for _ in range(2)]
        try:
            for proc in procs:
                assert proc.stdout.readline() == "ready\n"
            for proc in procs:
                time.sleep(rng.uniform(0.02, 0.3))
                proc.kill()
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(30)
                proc.stdout.close()
        lines = store.read_text().splitlines()
        assert lines and all(json.loads(line)["format"] == at.STORE_FORMAT for line in lines)
    at.ResultStore(store, max_entries=1).put(_entry(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl", "s.jsonl.lock"]


@pytest.mark.parametrize("runtime", ["python", "cpp"])
def test_cs10_compaction_writes_an_exclusive_temporary_and_leaves_no_link_behind(selector, export, cpp_demo,  # noqa: F811
                                                                                tmp_path, runtime) -> None:
    store = tmp_path / "s.jsonl"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for pid in range(os.getpid(), os.getpid() + 200):  # links at every predictable name of the old writer
        (tmp_path / f"s.jsonl.tmp.{pid}").symlink_to(victim)
    store.write_text("".join(json.dumps({"format": at.STORE_FORMAT, **_entry(i)}) + "\n" for i in range(6)))
    if runtime == "python":
        at.ResultStore(store, max_entries=2).put(_entry(9))
    else:
        rankings = [selector.select({**PROBLEM, "m": m}, top_k=4) for m in (64, 96, 128)]
        _demo(cpp_demo, export, store, rankings, "--max-entries", "2")
    assert victim.read_text() == "precious\n" and not store.is_symlink()
    assert len(store.read_text().splitlines()) <= 2 * 2 + 1  # compacted
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".s.jsonl.tmp-")]  # no temporary left


# -- F18 / F19: store paths that cannot be used are refused before anything is measured -----------
def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "s.fifo"
    os.mkfifo(path)
    return path


def _dir(tmp_path: Path) -> Path:
    (tmp_path / "d").mkdir()
    return tmp_path / "d"


def _lock_dir(tmp_path: Path) -> Path:
    (tmp_path / "s.jsonl.lock").mkdir()
    return tmp_path / "s.jsonl"


def _below_file(tmp_path: Path) -> Path:
    (tmp_path / "f").write_text("x")
    return tmp_path / "f" / "s.jsonl"


STORE_PATHS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "st12-directory": (_dir, "d: a directory; allowed: a regular file"),
    "st13-fifo": (_fifo, "s.fifo: a FIFO; allowed: a regular file"),
    "st14-dev-full": (lambda _: Path("/dev/full"), "/dev/full: a character device; allowed: a regular file"),
    "st17-lock-is-a-directory": (_lock_dir, "store lock .*s.jsonl.lock: a directory"),
    "below-a-file": (_below_file, "f is not a directory"),
}


@pytest.mark.parametrize("name", sorted(STORE_PATHS))
def test_an_unusable_store_is_refused_before_benchmarking(selector, tmp_path, name) -> None:  # noqa: F811
    make, text = STORE_PATHS[name]
    store = make(tmp_path)
    bench = Bench()
    t0 = time.perf_counter()
    with pytest.raises(at.AutotuneError, match=text) as err:
        selector.autotune(PROBLEM, bench, at.FixedK(2), store=store)
    assert bench.calls == [] and time.perf_counter() - t0 < 10 and "\n" not in str(err.value)


@pytest.mark.parametrize("name", sorted(STORE_PATHS))
def test_cs06_cs07_cs08_cpp_refuses_the_same_stores_before_benchmarking(selector, export, cpp_demo, tmp_path,  # noqa: F811
                                                                      name) -> None:
    import re

    make, text = STORE_PATHS[name]
    store = make(tmp_path)
    times = tmp_path / "t.json"
    times.write_text("{}")
    done = subprocess.run([str(cpp_demo), str(export), "--store", str(store), "--times", str(times)],
                          input=json.dumps(selector.select(PROBLEM, top_k=4).to_dict()) + "\n", capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert re.search(text, _one_line(done.stderr)), done.stderr


@pytest.mark.parametrize("path", ["", "   "])
def test_st20_an_empty_store_path_is_refused(path) -> None:
    with pytest.raises(at.AutotuneError, match="ResultStore.path="):
        at.ResultStore(path)


def test_a_store_path_of_tilde_and_no_known_user_is_its_own_text(tmp_path, monkeypatch) -> None:
    """``~name`` of no known user made ``Path.expanduser`` raise ``RuntimeError``; like a shell,
    the store keeps the text (a folder of that name below the working directory), and ``~`` is
    the home directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert at.ResultStore("~ckpred-no-such-user/s.jsonl").path == Path("~ckpred-no-such-user/s.jsonl")
    assert at.ResultStore("~/s.jsonl").path == tmp_path / "home" / "s.jsonl"


def _as_nobody(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a forked child as uid/gid 65534 (root may write any file); fails when it raises."""
    if os.geteuid() != 0:
        fn()
        return
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.fixture()
def shared_dir() -> Path:
    """A directory another user can enter (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="ckpred-hostile-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_st19_a_read_only_store_and_st15_an_unwritable_directory_are_refused_before_benchmarking(
        selector, shared_dir) -> None:  # noqa: F811
    ro = shared_dir / "ro.jsonl"
    ro.write_text(json.dumps({"format": at.STORE_FORMAT, **_entry(1)}) + "\n")
    ro.chmod(0o444)
    locked = shared_dir / "locked"
    locked.mkdir(mode=0o755)

    def child() -> None:
        for store, text in ((ro, "cannot append to store .*ro.jsonl: Permission denied"),
                            (locked / "sub" / "s.jsonl", "directory .*locked is not writable")):
            bench = Bench()
            with pytest.raises(at.AutotuneError, match=text):
                selector.autotune(PROBLEM, bench, at.FixedK(2), store=store)
            assert bench.calls == []

    _as_nobody(child)
    assert ro.read_text().count("\n") == 1


def test_cpp_read_only_store_is_refused_before_benchmarking(selector, export, cpp_demo, shared_dir) -> None:  # noqa: F811
    if os.geteuid() != 0:
        pytest.skip("needs root to run the demo as another user")
    demo = shared_dir / "demo"
    shutil.copy(cpp_demo, demo)
    demo.chmod(0o755)
    model = shared_dir / "model"
    shutil.copytree(export, model)
    for p in [model, *model.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    ro = shared_dir / "ro.jsonl"
    ro.write_text("")
    ro.chmod(0o444)
    times = shared_dir / "t.json"
    times.write_text("{}")
    times.chmod(0o644)
    done = subprocess.run([str(demo), str(model), "--store", str(ro), "--times", str(times)],
                          input=json.dumps(selector.select(PROBLEM, top_k=4).to_dict()) + "\n", capture_output=True,
                          text=True, timeout=30, user=65534, group=65534)
    assert done.returncode == 2 and done.stdout == ""
    assert "cannot append to store" in _one_line(done.stderr) and "Permission denied" in done.stderr


def _file_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:  # the store's next write fails with EFBIG, after every benchmark ran
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return apply


@pytest.mark.slow
def test_st14_a_write_failure_after_benchmarking_returns_the_measurements(export, tmp_path) -> None:  # noqa: F811
    store = tmp_path / "s.jsonl"
    store.write_text(json.dumps({"format": at.STORE_FORMAT, **_entry(1)}) + "\n")
    code = f"""
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from ckpred.runtime import KernelSelector
from ckpred.autotune import FixedK
r = KernelSelector.load({str(export)!r}).autotune({PROBLEM!r}, lambda name: 1e-3, FixedK(2), store={str(store)!r})
print(json.dumps(dict(ok=r.ok, kernel=r.kernel, stored=r.stored, error=r.store_error, n=len(r.measured))))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          preexec_fn=_file_limit(store.stat().st_size))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["ok"] and got["n"] == 2 and not got["stored"]
    assert got["error"].startswith(f"cannot write store {store}: File too large")
    assert "the result is returned but not stored" in done.stderr and "Traceback" not in done.stderr


def test_cpp_write_failure_after_benchmarking_returns_the_measurements(selector, export, cpp_demo, tmp_path) -> None:  # noqa: F811
    store = tmp_path / "s.jsonl"
    store.write_text(json.dumps({"format": at.STORE_FORMAT, **_entry(1)}) + "\n")
    done = _demo(cpp_demo, export, store, [selector.select(PROBLEM, top_k=16)],
                 preexec_fn=_file_limit(store.stat().st_size))
    (got,) = _out(done)
    assert got["ok"] and got["benchmarks"] == 2 and not got["stored"]
    assert got["store_error"].startswith(f"cannot write store {store}: File too large")
    assert "the result is returned but not stored" in done.stderr


# -- F19 (au13 au14): a benchmark that never returns --------------------------------------------------
def test_au14_a_benchmark_that_never_returns_times_out_and_its_thread_ends_when_it_does(selector, tmp_path) -> None:  # noqa: F811
    ranked = selector.select(PROBLEM, top_k=4).kernels
    release = threading.Event()

    def bench(name: str) -> float:
        if name == ranked[1]:
            release.wait(120)  # hangs until the test lets it go
        return 1e-3

    t0 = time.perf_counter()
    r = selector.autotune(PROBLEM, bench, at.FixedK(3), store=tmp_path / "s.jsonl", timeout=0.3)
    assert time.perf_counter() - t0 < 10
    assert r.timed_out and r.ok and r.kernel == ranked[0] and r.stored
    assert [m.ok for m in r.measured] == [True, False]  # the search stopped at the hung call
    assert r.measured[1].error == "TimeoutError: no result after 0.3 s (the call was left running)"
    assert r.stop == f"benchmark of {ranked[1]} timed out after 0.3 s: search stopped"
    workers = [t for t in threading.enumerate() if t.name == "ckpred-autotune-benchmark"]
    assert len(workers) == 1 and workers[0].daemon  # the hung call, still running
    release.set()
    workers[0].join(10)
    assert not workers[0].is_alive()  # ends once the call returns: nothing leaks


def test_au13_without_timeout_benchmarks_run_in_the_callers_thread(selector) -> None:  # noqa: F811
    seen = []
    selector.autotune(PROBLEM, lambda name: seen.append(threading.current_thread()) or 1e-3, at.TimeBudget(1e-9, "wall"))
    assert seen == [threading.main_thread()]
    with_timeout: list[threading.Thread] = []
    selector.autotune(PROBLEM, lambda name: with_timeout.append(threading.current_thread()) or 1e-3, at.FixedK(3),
                      timeout=5)
    assert len(set(with_timeout)) == 1 and with_timeout[0] is not threading.main_thread()  # one worker per search


def test_cpp_a_benchmark_that_never_returns_times_out(selector, export, cpp_demo, tmp_path) -> None:  # noqa: F811
    ranked = selector.select(PROBLEM, top_k=4)
    times = {ranked.kernels[0]: 2e-3, ranked.kernels[1]: "hang", ranked.kernels[2]: 1e-3}
    t0 = time.perf_counter()
    (got,) = _out(_demo(cpp_demo, export, tmp_path / "s.jsonl", [ranked], "--budget", "fixed:3", "--timeout", "0.3",
                        times=times))
    assert time.perf_counter() - t0 < 20
    assert got["timed_out"] and got["ok"] and got["kernel"] == ranked.kernels[0] and got["benchmarks"] == 2
    assert got["stop"] == f"benchmark of {ranked.kernels[1]} timed out after 0.3 s: search stopped"


# -- F25 / F26: budgets, problems and benchmark results are checked, never coerced ------------------
@pytest.mark.parametrize(("make", "text"), [
    (lambda: at.FixedK(float("nan")), "FixedK.k=nan; allowed: an integer >= 1"),  # bu03
    (lambda: at.FixedK(float("inf")), "FixedK.k=inf"),  # bu04
    (lambda: at.FixedK("2"), "FixedK.k='2'"),  # bu06
    (lambda: at.FixedK(2.9), "FixedK.k=2.9"),  # bu07
    (lambda: at.FixedK(True), "FixedK.k=True"),
    (lambda: at.FixedK(2, max_benchmarks=float("nan")), "FixedK.max_benchmarks=nan"),  # bu19
    (lambda: at.FixedK(2, max_benchmarks=0), "FixedK.max_benchmarks=0"),
    (lambda: at.TimeBudget("abc"), "TimeBudget.seconds='abc'; allowed: a finite number > 0"),  # bu12
    (lambda: at.TimeBudget(float("nan")), "TimeBudget.seconds=nan"),
    (lambda: at.TimeBudget(True), "TimeBudget.seconds=True"),
    (lambda: at.TimeBudget(1, max_benchmarks=1.5), "TimeBudget.max_benchmarks=1.5"),
    (lambda: at.Confidence("0.9", 0.05), "Confidence.target='0.9'"),
    (lambda: at.Confidence(0.9, float("nan")), "Confidence.within=nan"),
    (lambda: at.ResultStore("s.jsonl", max_entries=float("nan")), "ResultStore.max_entries=nan"),  # st18
    (lambda: at.ResultStore("s.jsonl", max_entries=0), "ResultStore.max_entries=0"),
])
def test_bad_budgets_are_refused_by_name(make, text) -> None:
    with pytest.raises(at.AutotuneError, match=text.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        make()


def test_bu20_a_plain_int_budget_is_fixed_k(selector) -> None:  # noqa: F811
    bench = Bench()
    r = selector.autotune(PROBLEM, bench, 3)
    assert r.policy == "fixed(k=3)" and len(bench.calls) == 3
    assert at.as_budget(None) == at.FixedK(2)


@pytest.mark.parametrize("budget", ["fixed", 2.0, True, 0, -1, [2]])  # bu21 and siblings
def test_other_budgets_are_refused_by_name(selector, budget) -> None:  # noqa: F811
    bench = Bench()
    with pytest.raises(at.AutotuneError, match="budget=|FixedK.k="):
        selector.autotune(PROBLEM, bench, budget)
    assert bench.calls == []


@pytest.mark.parametrize("problem", [[128, 1536, 7168], None, "m=128", 128])  # pr08 pr09
def test_a_problem_that_is_not_a_mapping_is_refused_by_name(selector, problem) -> None:  # noqa: F811
    with pytest.raises(ConfigValueError) as err:
        selector.autotune(problem, Bench(), at.FixedK(1))
    assert err.value.key == "problem" and "a mapping of problem field -> value" in str(err.value)


@pytest.mark.parametrize("value", ["0.001", True, None, [1e-3], b"1"])  # au06 au08
def test_a_benchmark_result_that_is_not_a_number_is_refused_not_coerced(selector, value) -> None:  # noqa: F811
    with pytest.raises(at.AutotuneError, match=r"benchmark\(.*\) returned .*; allowed: seconds as a number"):
        selector.autotune(PROBLEM, lambda name: value, at.FixedK(1))


@pytest.mark.parametrize("kwargs", [{"timeout": "1"}, {"timeout": -1}, {"timeout": float("nan")}, {"timeout": 0},
                                    {"refresh": "yes"}, {"pass_id": 1}])
def test_bad_options_are_refused_by_name(selector, kwargs) -> None:  # noqa: F811
    key = next(iter(kwargs))
    with pytest.raises(at.AutotuneError, match=f"{key}="):
        selector.autotune(PROBLEM, Bench(), at.FixedK(1), **kwargs)


def test_numpy_numbers_are_numbers(selector) -> None:  # noqa: F811
    import numpy as np

    r = selector.autotune(PROBLEM, lambda name: np.float32(2e-3), at.FixedK(np.int64(2)))
    assert r.ok and r.seconds == pytest.approx(2e-3) and r.benchmarks == 2


# -- F30: the C++ demo's options ----------------------------------------------------------------------
@pytest.mark.parametrize(("args", "text"), [
    (("--max-entries", "-1"), "--max-entries '-1': allowed: an integer in [1, "),  # cs12
    (("--max-benchmarks", "99999999999"), "--max-benchmarks '99999999999': allowed: an integer in [1, "),  # cs16
    (("--max-benchmarks", "2.5"), "--max-benchmarks '2.5'"),
    (("--budget", "fixed:x"), "--budget fixed:K 'x'"),
    (("--budget", "fixed:0"), "--budget fixed:K '0'"),
    (("--budget", "time:nan"), "--budget time:S 'nan'"),
    (("--budget", "confidence:abc:0.02"), "--budget confidence:TARGET 'abc'"),
    (("--timeout", "-1"), "--timeout '-1'"),
    (("--timeout", "inf"), "--timeout 'inf'"),
    (("--bogus",), "unknown option --bogus"),
])
def test_cpp_demo_options_are_refused_by_name(selector, export, cpp_demo, tmp_path, args, text) -> None:  # noqa: F811
    done = _demo(cpp_demo, export, tmp_path / "s.jsonl", [selector.select(PROBLEM, top_k=4)], *args, check=False)
    assert done.returncode == 2 and done.stdout == "" and text in _one_line(done.stderr)
    assert not (tmp_path / "s.jsonl").exists()


def test_cpp_demo_refuses_a_ranking_line_that_is_not_one(selector, export, cpp_demo, tmp_path) -> None:  # noqa: F811
    times = tmp_path / "t.json"
    times.write_text("{}")
    done = subprocess.run([str(cpp_demo), str(export), "--store", str(tmp_path / "s.jsonl"), "--times", str(times)],
                          input='{"problem": {"m": 1.5}}\n', capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "ranking line 1:" in _one_line(done.stderr)


@pytest.mark.parametrize("make", [lambda d: Path("/dev/zero"), _fifo])
def test_cpp_demo_refuses_a_times_file_that_is_not_a_file(export, cpp_demo, tmp_path, make) -> None:  # noqa: F811
    times = make(tmp_path)
    done = subprocess.run([str(cpp_demo), str(export), "--store", str(tmp_path / "s.jsonl"), "--times", str(times)],
                          input="", capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "not a regular file" in _one_line(done.stderr)


def test_math_is_finite_helper_for_huge_ints() -> None:
    """An integer beyond a float (JSON 1e400 written out) is no finite number, not an OverflowError."""
    assert _real(10**400) == math.inf and _real(True) is None and _real("1") is None


# -- F05: the C++ autotune header verifies the export as ckpred_select and Python do ---------------
@pytest.fixture(scope="module")
def other_export(tmp_path_factory) -> Path:
    from export_helpers import export_gemm

    return export_gemm(tmp_path_factory.mktemp("other") / "gemm_universal_gfx950_fp8_rcr", n_estimators=4)


def _swap_model(d: Path, other: Path) -> None:  # x01d: another export's graph
    shutil.copy(other / "model.onnx", d / "model.onnx")


def _swap_model_resigned(d: Path, other: Path) -> None:  # x02d: ... and the manifest's sha256 updated
    import hashlib

    _swap_model(d, other)
    man = json.loads((d / "manifest.json").read_text())
    man["files"]["model.onnx"]["sha256"] = hashlib.sha256((d / "model.onnx").read_bytes()).hexdigest()
    (d / "manifest.json").write_text(json.dumps(man))


def _edit_calibration(d: Path, other: Path) -> None:  # x03d: manifest.json edited alone
    man = json.loads((d / "manifest.json").read_text())
    man["autotune"] = TABLE
    (d / "manifest.json").write_text(json.dumps(man))


def _link(name: str, target: str) -> Callable[[Path, Path], None]:
    def apply(d: Path, other: Path) -> None:
        (d / name).unlink()
        if target == "fifo":
            os.mkfifo(d / name)
        elif target == "dir":
            (d / name).mkdir()
        else:
            (d / name).symlink_to(target)
    return apply


EXPORT_TAMPERS: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "x01d-swapped-model": (_swap_model, "model.onnx: sha256 "),
    "x02d-swapped-model-resigned": (_swap_model_resigned, "does not match the manifest embedded in model.onnx"),
    "x03d-calibration-edited": (_edit_calibration, "does not match the manifest embedded in model.onnx"),
    "x09d-model-dev-zero": (_link("model.onnx", "/dev/zero"), "model.onnx: a character device, not a regular file"),
    "model-fifo": (_link("model.onnx", "fifo"), "model.onnx: a FIFO, not a regular file"),
    "x12d-manifest-dev-zero": (_link("manifest.json", "/dev/zero"), "manifest.json: a character device, not a regular file"),
    "x10d-manifest-fifo": (_link("manifest.json", "fifo"), "manifest.json: a FIFO, not a regular file"),
    "manifest-directory": (_link("manifest.json", "dir"), "manifest.json: a directory, not a regular file"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPORT_TAMPERS))
def test_f05_the_cpp_autotune_header_refuses_what_python_refuses(export, other_export, cpp_demo, tmp_path,  # noqa: F811
                                                                name) -> None:
    from ckpred.errors import CkpredError

    d = tmp_path / "m"
    shutil.copytree(export, d)
    tamper, text = EXPORT_TAMPERS[name]
    tamper(d, other_export)
    with pytest.raises(CkpredError, match=text.replace("(", r"\(")):
        KernelSelector.load(d)
    times = tmp_path / "t.json"
    times.write_text("{}")
    done = subprocess.run([str(cpp_demo), str(d), "--store", str(tmp_path / "s.jsonl"), "--times", str(times)],
                          input="", capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    line = _one_line(done.stderr)
    assert line.startswith("ckpred_autotune_demo: model refused: ") and text in line, line


# Calibrations written consistently into manifest.json and model.onnx, files re-signed: only the
# calibration check can refuse them, and every runtime must decide the same (x04c x05p x05c).
TABLE = {"format": at.CALIBRATION_FORMAT, "within": [0.02, 0.05], "edges": [0.5], "counts": [3, 3], "gap_to": 2,
         "probability": [[[0.5, 0.9], [0.9, 1.0]], [[0.6, 0.9], [0.95, 1.0]]]}
_N = len(at.SCORE_FEATURES) + 4 + 1
LOGISTIC = {"format": at.LOGISTIC_FORMAT, "within": [0.02, 0.05], "fields": ["m", "n", "k", "split_k"],
            "fill": [0.0] * _N, "lo": [-1e9] * _N, "hi": [1e9] * _N, "mean": [0.0] * _N, "scale": [1.0] * _N,
            "coef": [[[0.1] * _N, [0.2] * _N]] * 2, "intercept": [[0.0, 1.0]] * 2, "problems": 12}


def _with(base: dict, **over: Any) -> dict:
    return {**base, **over}


CALIBRATIONS: dict[str, tuple[Any, bool]] = {  # name -> (the manifest's "autotune", accepted)
    "null": (None, True),
    "table": (TABLE, True),
    "logistic": (LOGISTIC, True),
    "table-extra-key": (_with(TABLE, select="reranked", feature="score_gap"), True),
    "table-int-numbers": (_with(TABLE, edges=[1], probability=[[[0, 1], [1, 1]], [[0, 1], [1, 1]]]), True),
    "x04c-scale-zero": (_with(LOGISTIC, scale=[0.0] * _N), False),
    "x05-within-strings": (_with(LOGISTIC, within=["0.02", "0.05"]), False),
    "table-within-strings": (_with(TABLE, within=["0.02", "0.05"]), False),
    "within-bool": (_with(TABLE, within=[True, 0.05]), False),
    "probability-string": (_with(TABLE, probability=[[["0.5", 0.9], [0.9, 1.0]], [[0.6, 0.9], [0.95, 1.0]]]), False),
    "probability-above-one": (_with(TABLE, probability=[[[0.5, 1.5], [0.9, 1.0]], [[0.6, 0.9], [0.95, 1.0]]]), False),
    "counts-float": (_with(TABLE, counts=[3.0, 3]), False),
    "counts-beyond-int64": (_with(TABLE, counts=[2**70, 3]), False),
    "counts-negative": (_with(TABLE, counts=[-1, 3]), False),
    "gap-to-one": (_with(TABLE, gap_to=1), False),
    "gap-to-null": (_with(TABLE, gap_to=None), False),
    "edges-not-increasing": (_with(TABLE, edges=[0.5, 0.5], counts=[1, 1, 1],
                                   probability=[[[0.5, 0.9]] * 3, [[0.5, 0.9]] * 3]), False),
    "edges-huge-int": (_with(TABLE, edges=[10**400]), False),
    "within-duplicate": (_with(TABLE, within=[0.05, 0.05]), False),
    "rows-ragged": (_with(TABLE, probability=[[[0.5, 0.9], [0.9]], [[0.6, 0.9], [0.95, 1.0]]]), False),
    "missing-probability": ({k: v for k, v in TABLE.items() if k != "probability"}, False),
    "coef-huge": (_with(LOGISTIC, coef=[[[10**400] * _N, [0.2] * _N]] * 2), False),
    "field-not-a-problem-field": (_with(LOGISTIC, fields=["m", "n", "k", "q"]), False),
    "field-a-number": (_with(LOGISTIC, fields=["m", "n", "k", 4]), False),
    "problems-negative": (_with(LOGISTIC, problems=-1), False),
    "problems-float": (_with(LOGISTIC, problems=2.5), False),
    "fill-short": (_with(LOGISTIC, fill=[0.0] * (_N - 1)), False),
    "format-other": (_with(TABLE, format="ckpred.autotune.calibration/2"), False),
    "a-list": ([TABLE], False),
    "a-string": ("table", False),
}


def forged(export: Path, d: Path, calibration: Any) -> Path:
    from export_helpers import forge

    shutil.copytree(export, d)
    forge(d, {**json.loads((export / "manifest.json").read_text()), "autotune": calibration})
    return d


def python_accepts(d: Path) -> bool:
    from ckpred.errors import ModelMismatchError

    try:
        KernelSelector.load(d, cache_size=0)
    except ModelMismatchError as exc:
        assert "\n" not in str(exc)
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CALIBRATIONS))
def test_f05_forged_calibrations_python_and_the_cpp_header_decide_the_same(export, cpp_demo, tmp_path, name) -> None:  # noqa: F811
    calibration, accepted = CALIBRATIONS[name]
    d = forged(export, tmp_path / "m", calibration)
    assert python_accepts(d) == accepted
    times = tmp_path / "t.json"
    times.write_text("{}")
    done = subprocess.run([str(cpp_demo), str(d), "--store", str(tmp_path / "s.jsonl"), "--times", str(times)],
                          input="", capture_output=True, text=True, timeout=30)
    assert done.returncode == (0 if accepted else 2), done.stderr
    if not accepted:
        assert "autotune calibration" in _one_line(done.stderr)


@pytest.mark.slow
def test_x14_cpp_loads_racing_re_exports_give_the_old_or_the_new_model(selector, export, other_export, cpp_demo,  # noqa: F811
                                                                      tmp_path) -> None:
    from export_helpers import re_exporting

    target = tmp_path / "live" / export.name
    runs, deadline = 0, time.monotonic() + 60
    with re_exporting(target, (export, other_export)) as swaps:
        while runs < 30 or swaps[0] < 30:
            assert time.monotonic() < deadline, f"{swaps[0]} swaps, {runs} runs"
            done = _demo(cpp_demo, target, tmp_path / f"s{runs}.jsonl", [selector.select(PROBLEM, top_k=4)], check=False)
            assert done.returncode == 0, done.stderr
            runs += 1
