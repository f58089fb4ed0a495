"""The search: benchmark the model's ranked candidates until the budget is spent, keep the fastest.

With a store, :func:`autotune` checks it before anything is measured
(:meth:`~ckpred.autotune.ResultStore.check`), reads it first (a stored winner of this model,
whose kernel is in the model's catalogue under that name, is returned without benchmarking) and
writes it after a successful search. A write that fails after the search does not lose it: the
result comes back with ``stored=False`` and ``store_error`` saying why (also logged).

With a ``timeout``, the benchmark calls run in one worker thread (created per search, ended
after it). A call still running after ``timeout`` is recorded as failed (``TimeoutError``), the
search stops there (nothing else is launched while the device may still run it) and the best
kernel measured so far, if any, is returned (and stored) with ``timed_out=True``. Python cannot
stop the call: it keeps running in the worker thread, which discards its result and exits when
it returns. A benchmark that can hang for good should bound itself (a device-side timeout) or
run in a subprocess. Without ``timeout`` the calls run in the caller's thread.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence, Sized

import numpy as np

from ckpred.autotune.budget import Budget, Confidence, _Spent, as_budget, shift_of, size_confidence
from ckpred.autotune.calibration import Calibration, LogisticCalibration
from ckpred.autotune.checks import AutotuneError, _real, _short
from ckpred.autotune.store import ResultStore, problem_key
from ckpred.errors import ConfigValueError, ModelMismatchError

log = logging.getLogger(__name__)

#: The caller's benchmark: a kernel's name (its catalogue id with ``pass_id``) -> seconds.
Benchmark = Callable[[Any], float]


class Ranking(Protocol):
    """What :func:`autotune` reads of a selector's answer (:class:`ckpred.runtime.Selection`)."""

    @property
    def ids(self) -> Sequence[int]: ...
    @property
    def kernels(self) -> Sequence[str]: ...
    @property
    def scores(self) -> Sequence[float]: ...
    @property
    def ok(self) -> bool: ...
    @property
    def reason(self) -> str: ...


class Selector(Protocol):
    """What :func:`autotune` uses of a selector (:class:`ckpred.runtime.KernelSelector`, which
    imports this package: a protocol, not an import, keeps the dependency one-way)."""

    @property
    def model_dir(self) -> Path: ...
    @property
    def manifest(self) -> dict[str, Any]: ...
    @property
    def calibration(self) -> Calibration | LogisticCalibration | None: ...
    @property
    def problem_fields(self) -> list[str]: ...
    @property
    def catalogue(self) -> Sized: ...
    def problem_row(self, *values: object, **fields: object) -> dict[str, int]: ...
    def select(self, *values: object, top_k: int = 5, **fields: object) -> Ranking: ...
    def kernel_name(self, kernel_id: object) -> str | None: ...


@dataclass(frozen=True)
class Measurement:
    """One benchmark call: the kernel, its time in seconds, or why it failed."""

    kernel_id: int
    kernel: str
    seconds: float | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.seconds is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kernel_id": self.kernel_id, "kernel": self.kernel}
        if self.ok:
            out["seconds"] = self.seconds
        else:
            out["error"] = self.error
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Measurement":
        seconds = d.get("seconds")
        return cls(int(d["kernel_id"]), str(d["kernel"]), None if seconds is None else float(seconds),
                   str(d.get("error", "")))


@dataclass(frozen=True)
class TuneResult:
    """What :func:`autotune` found for one problem.

    Attributes
    ----------
    problem : str
        The problem key (see :func:`problem_key`).
    kernel, kernel_id, seconds
        The measured best (``None`` when nothing was measured successfully).
    measured : tuple of Measurement
        Every benchmark call in order (empty when the answer came from the store).
    from_store : bool
        The answer was read from the store; nothing was benchmarked.
    policy : str
        The budget that was spent.
    stop : str
        Why the search stopped.
    stored : bool
        The answer is in the store (read from it, or written to it by this call).
    store_error : str
        Why writing it to the store failed ("" otherwise); the measurements are here all the same.
    timed_out : bool
        A benchmark call did not return within ``timeout``; the search stopped there.
    """

    problem: str
    kernel: str | None
    kernel_id: int | None
    seconds: float | None
    measured: tuple[Measurement, ...] = ()
    from_store: bool = False
    policy: str = ""
    stop: str = ""
    stored: bool = False
    store_error: str = ""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.kernel is not None

    @property
    def benchmarks(self) -> int:
        return len(self.measured)


class _TimedOut(Exception):
    pass


class _Worker:
    """One daemon thread that runs the caller's benchmark calls, so that the caller can stop
    waiting for one (``timeout``). Python cannot stop a running function: a call that timed out
    is left to finish in this thread, its result is discarded, and the thread then exits. Being
    a daemon, it does not hold up the process's exit."""

    def __init__(self, benchmark: Benchmark) -> None:
        self._benchmark = benchmark
        self._tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="ckpred-autotune-benchmark", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            arg, box, done = task
            try:
                box.append((True, self._benchmark(arg)))
            except BaseException as exc:  # handed to the caller, who re-raises what is not an Exception
                box.append((False, exc))
            done.set()

    def call(self, arg: int | str, timeout: float) -> object:
        box: list[tuple[bool, object]] = []
        done = threading.Event()
        self._tasks.put((arg, box, done))
        if not done.wait(timeout):
            raise _TimedOut
        ok, value = box[0]
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        return value

    def close(self) -> None:
        self._tasks.put(None)  # the thread exits after its current call, if one is still running


def _measure(benchmark: Benchmark, arg: int | str, kernel_id: int, name: str, worker: _Worker | None,
             timeout: float | None) -> tuple[Measurement, float, bool]:
    """One benchmark call: (measurement, wall seconds, timed out)."""
    t0 = time.perf_counter()
    try:
        value = benchmark(arg) if worker is None else worker.call(arg, timeout)  # type: ignore[arg-type]
    except _TimedOut:
        error = f"TimeoutError: no result after {timeout:g} s (the call was left running)"
        return Measurement(kernel_id, name, None, error), time.perf_counter() - t0, True
    except Exception as exc:  # the caller's kernel failed: record it, try the next one
        return Measurement(kernel_id, name, None, f"{type(exc).__name__}: {exc}"[:500]), time.perf_counter() - t0, False
    wall = time.perf_counter() - t0
    seconds = _real(value)
    if seconds is None:
        raise AutotuneError(f"benchmark({arg!r}) returned {_short(value)} ({type(value).__name__}); allowed: seconds as "
                            "a number (nan, inf or an exception mark a failed kernel)")
    if not math.isfinite(seconds) or seconds <= 0:
        return Measurement(kernel_id, name, None, f"non-finite or non-positive time {value!r}"), wall, False
    return Measurement(kernel_id, name, seconds), wall, False


def _check_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    value = _real(timeout)
    if value is None or not math.isfinite(value) or value <= 0:
        raise AutotuneError(f"timeout={timeout!r}; allowed: None or a finite number of seconds > 0")
    return value


@dataclass(frozen=True)
class ProblemContext:
    """What :func:`autotune_ranked` knows of the problem besides its ranked candidates.

    Attributes
    ----------
    key : str
        The problem key (:func:`~ckpred.autotune.problem_key`), copied into the result.
    values : mapping, optional
        The problem's field values; they feed a :class:`~ckpred.autotune.LogisticCalibration`.
    shift : str
        Why the problem is outside what the calibration measured (:func:`~ckpred.autotune.shift_of`,
        "" when it is not); it sizes a :class:`~ckpred.autotune.Confidence` budget by
        :func:`~ckpred.autotune.size_confidence`.
    """

    key: str = ""
    values: Mapping[str, float] | None = None
    shift: str = ""


def _stop_reason(budget: Budget, scores: Sequence[float], spent: _Spent) -> str:
    """Why the search stops before its next call ("" when it goes on): the soft budget is spent
    (only once something succeeded) or ``max_benchmarks`` calls were made."""
    if spent.successes and budget.spent(scores, spent):
        return "budget spent"
    if spent.attempts >= budget.max_benchmarks:
        return f"max_benchmarks={budget.max_benchmarks} reached"
    return ""


def _result(problem: str, budget: Budget, measured: list[Measurement], stop: str, timed_out: bool) -> TuneResult:
    """The fastest successful measurement (none: a result without a kernel, saying why)."""
    good = [m for m in measured if m.ok]
    if not good:
        if measured:
            stop = f"{stop}: all {len(measured)} benchmarks failed"
        return TuneResult(problem, None, None, None, tuple(measured), False, budget.describe(), stop,
                          timed_out=timed_out)
    best = min(good, key=lambda m: m.seconds)  # type: ignore[arg-type, return-value]
    return TuneResult(problem, best.kernel, best.kernel_id, best.seconds, tuple(measured), False,
                      budget.describe(), stop, timed_out=timed_out)


def autotune_ranked(ids: Sequence[int] | np.ndarray, names: Sequence[str], scores: Sequence[float],
                    benchmark: Benchmark, budget: Budget, *, pass_id: bool = False,
                    problem: ProblemContext = ProblemContext(), timeout: float | None = None) -> TuneResult:
    """Benchmark ranked candidates (valid ones, best first) until ``budget`` is spent.

    This is the store-free core of :func:`autotune`; the replay and the C++ header follow the
    same rules: count successes against the soft budget, stop at ``budget.max_benchmarks``
    calls, and past the soft budget continue only while nothing has succeeded. ``problem`` (its
    key, field values and shift, :class:`ProblemContext`) sizes a :class:`Confidence` budget
    by :func:`size_confidence`. With ``timeout``, see :func:`autotune`.
    """
    if not isinstance(budget, Budget):
        raise AutotuneError(f"budget={budget!r}; allowed: FixedK, TimeBudget or Confidence")
    timeout = _check_timeout(timeout)
    if isinstance(budget, Confidence):  # sized once, from the scores (and the problem)
        budget = size_confidence(budget, scores, problem.values, problem.shift)
    spent = _Spent()
    measured: list[Measurement] = []
    candidates = list(zip(ids, names))
    stop = "no valid kernel" if not candidates else "candidates exhausted"
    timed_out = False
    worker = _Worker(benchmark) if timeout is not None and candidates else None
    try:
        for kernel_id, name in candidates:
            why = _stop_reason(budget, scores, spent)
            if why:
                stop = why
                break
            m, wall, timed_out = _measure(benchmark, int(kernel_id) if pass_id else name, int(kernel_id), name, worker,
                                          timeout)
            measured.append(m)
            spent.attempts += 1
            spent.wall_s += wall
            if m.ok:
                spent.successes += 1
                spent.kernel_s += float(m.seconds)  # type: ignore[arg-type]
            if timed_out:  # the device may still run it: start nothing else
                stop = f"benchmark of {name} timed out after {timeout:g} s: search stopped"
                break
        else:
            stop = _stop_reason(budget, scores, spent) or stop
    finally:
        if worker is not None:
            worker.close()
    return _result(problem.key, budget, measured, stop, timed_out)


def model_hash(manifest: Mapping[str, Any]) -> str:
    """The store's model key: the sha256 of the selector graph recorded in the manifest."""
    selector = manifest["graphs"]["selector"]["file"]
    try:
        return str(manifest["files"][selector]["sha256"])
    except KeyError as exc:
        raise ModelMismatchError(f"manifest has no sha256 for {selector}") from exc


def _not_this_models(hit: Mapping[str, Any], selector: Selector) -> str:
    """Why a stored entry (already well-formed) cannot be this model's answer ("" when it can)."""
    name = selector.kernel_name(hit["kernel_id"])
    if name is None:
        return f"kernel_id {hit['kernel_id']} is not in the model's catalogue of {len(selector.catalogue)} kernels"
    if name != hit["kernel"]:
        return f"kernel_id {hit['kernel_id']} is {name!r} in the model's catalogue, the line says {_short(hit['kernel'])}"
    return ""


def _check_call(selector: Selector, problem: object, benchmark: object, pass_id: object, refresh: object) -> None:
    """Refuse a problem that is not a mapping, a benchmark that is not callable and flags that
    are not booleans, by name."""
    if not isinstance(problem, Mapping):
        raise ConfigValueError("problem", problem, f"a mapping of problem field -> value (fields: "
                                                   f"{selector.problem_fields})")
    if not callable(benchmark):
        raise AutotuneError(f"benchmark={_short(benchmark)}; allowed: a callable kernel -> seconds")
    for flag, value in (("pass_id", pass_id), ("refresh", refresh)):
        if not isinstance(value, bool):
            raise AutotuneError(f"{flag}={value!r}; allowed: True or False")


def _calibrated(budget: Confidence, selector: Selector) -> Confidence:
    """``budget`` with the selector's calibration when it was given none (refused when there is none)."""
    cal = getattr(selector, "calibration", None)  # checked by KernelSelector.load
    return budget.with_calibration(selector.manifest.get("autotune") if cal is None else cal, str(selector.model_dir))


def _stored(store: ResultStore, selector: Selector, model: str, key: str, refresh: bool) -> TuneResult | None:
    """The store's answer for this model and problem, when it has one this model can serve
    (checked before anything is measured; None with ``refresh``)."""
    store.check()  # before anything is measured
    hit = None if refresh else store.get(model, selector.manifest["op"], key)
    if hit is None:
        return None
    why = _not_this_models(hit, selector)
    if not why:
        return TuneResult(key, hit["kernel"], hit["kernel_id"], float(hit["seconds"]), (), True,
                          str(hit.get("policy", "")), "from store", stored=True)
    log.warning("%s: skipped the stored answer for %s (%s); benchmarking", store.path, key, why)
    return None


def _store(store: ResultStore, selector: Selector, model: str, result: TuneResult) -> TuneResult:
    """``result`` written to the store (``stored=True``), or with ``store_error`` when it cannot be."""
    manifest = selector.manifest
    try:
        store.put({"model": model, "op": manifest["op"], "arch": manifest["arch"],
                   "dtype": manifest["dtype"], "layout": manifest["layout"], "problem": result.problem,
                   "kernel_id": result.kernel_id, "kernel": result.kernel, "seconds": result.seconds,
                   "policy": result.policy, "measured": [m.to_dict() for m in result.measured]})
    except AutotuneError as exc:
        log.warning("%s; the result is returned but not stored", exc)
        return replace(result, store_error=str(exc))
    return replace(result, stored=True)


def autotune(selector: Selector, problem: Mapping[str, Any], benchmark: Benchmark,
             budget: Budget | int | None = None, *, store: ResultStore | str | os.PathLike[str] | None = None,
             pass_id: bool = False, refresh: bool = False, timeout: float | None = None) -> TuneResult:
    """Benchmark the model's best valid kernels for ``problem`` and return the fastest.

    Parameters
    ----------
    selector : KernelSelector
        A loaded selector (ranks the candidates; its manifest gives the model hash and the
        confidence calibration).
    problem : mapping
        Problem fields by name, as in ``select`` (category fields by their value, e.g.
        ``precision="fp32"``; defaults filled in).
    benchmark : callable
        ``benchmark(kernel_name) -> seconds`` (``benchmark(kernel_id)`` with ``pass_id``). An
        exception, nan, inf or a time <= 0 is recorded and the kernel skipped. A result that is
        not a number (text, a bool, None) is refused: :class:`AutotuneError`.
    budget : Budget or int, default=FixedK(2)
        When to stop (:class:`FixedK`, :class:`TimeBudget`, :class:`Confidence`); an int ``k``
        is ``FixedK(k)``.
    store : ResultStore or path, optional
        Checked first, read before benchmarking, written after a successful search (see
        :mod:`ckpred.autotune.search` for what happens when the write fails).
    refresh : bool, default=False
        Benchmark even when the store has an answer (and overwrite it).
    timeout : float, optional
        Seconds to wait for one benchmark call: past it the call is recorded as failed, the
        search stops and returns the best so far with ``timed_out=True`` (the call itself keeps
        running: see :mod:`ckpred.autotune.search`).

    Returns
    -------
    TuneResult

    Raises
    ------
    AutotuneError
        A bad budget, timeout or benchmark result; a store that cannot be used (named).
    ckpred.errors.ConfigValueError
        A problem that is not a mapping or whose values the model refuses (``problem.<field>``).
    """
    budget = as_budget(budget)
    _check_call(selector, problem, benchmark, pass_id, refresh)
    timeout = _check_timeout(timeout)
    budget = _calibrated(budget, selector) if isinstance(budget, Confidence) else budget
    store = ResultStore(store) if store is not None and not isinstance(store, ResultStore) else store
    row = selector.problem_row(dict(problem))
    key = problem_key(row, selector.problem_fields)
    model = model_hash(selector.manifest)
    hit = None if store is None else _stored(store, selector, model, key, refresh)
    if hit is not None:
        return hit
    # the problem as the caller gave it: select checks it and encodes category values itself
    answer = selector.select(dict(problem), top_k=max(1, min(budget.max_benchmarks, len(selector.catalogue))))
    shift = shift_of(selector.manifest, row, budget.calibration) if isinstance(budget, Confidence) else ""
    result = autotune_ranked(answer.ids, answer.kernels, answer.scores, benchmark, budget, pass_id=pass_id,
                             problem=ProblemContext(key, row, shift), timeout=timeout)
    if not answer.ok:
        result = TuneResult(key, None, None, None, (), False, budget.describe(), answer.reason)
    return _store(store, selector, model, result) if store is not None and result.ok else result
