#!/usr/bin/env python
"""Per-shape selection latency of an export against a baseline export, with the time breakdown.

One run prints, for the *current* path (``--baseline``: an export made by the previous code,
run with the previous session options) and the *new* one (``--model``: this code's export and
session options), on the same unseen shapes, one thread:

* Python ``KernelSelector.select`` (cache off) per shape: median / p99 wall and thread-CPU time,
  and the median over passes of the paired ratio (the two paths alternate pass by pass);
* C++ ``ckpred_select --bench 1`` per shape (``--cpp`` / ``--baseline-cpp`` binaries, default
  build/cpp/ckpred_select for both): median / p99 of ``--repeats`` alternating runs;
* the breakdown of one ``Run`` in thread-CPU time, by timing sub-graphs cut out of the selector
  (``onnx.utils.Extractor``) and run alone on the real intermediate tensors: the feature graph
  (problem -> feature matrix), the trees (on the rows they see), the rest (validity mask, row
  selection, scores scattered back, TopK, id mapping) and TopK alone, less a one-node graph's
  Run (the per-Run overhead of the runtime);
  onnxruntime's own profiler costs more per node than these nodes take, so it is not used;
* Python ``select`` against the bare ``session.run`` it makes (the runtime's own overhead), and
  ``select`` on the shapes no kernel can run (its "why" path);
* node counts, the features the trees read, the parity and selection figures of each manifest.

The machine may be shared: the load average is printed before and after; read the paired
ratios and the CPU times rather than single wall-clock figures.

    python scripts/bench/selection_latency.py --model exports/gemm_universal_gfx950_fp8_rcr \\
        --baseline /tmp/old_export/gemm_universal_gfx950_fp8_rcr [--shapes 200] [--repeats 5]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx.shape_inference  # noqa: E402
import pandas as pd  # noqa: E402

from ckpred.export.onnx import SELECTOR_OUTPUTS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BINARY = REPO / "build" / "cpp" / "ckpred_select"


def pct(values: Any, q: float) -> float:
    arr = np.sort(np.asarray(values, dtype=np.float64))
    return float(arr[min(len(arr) - 1, int(round(q * (len(arr) - 1))))]) if len(arr) else float("nan")


def old_session(path: Path) -> Any:
    """The session the previous runtime made (before this change): 1 thread, sequential, defaults."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def feature_matrix(model: onnx.ModelProto) -> tuple[onnx.NodeProto, str]:
    """The tree ensemble node and the feature matrix it reads rows of (before the ``Compress``
    that keeps the valid rows, when there is one)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    tree = next(n for n in model.graph.node if n.domain == "ai.onnx.ml" and n.op_type.startswith("TreeEnsemble"))
    features = tree.input[0]
    while features in producer and producer[features].op_type in ("Identity", "Compress"):
        features = producer[features].input[0]
    return tree, features


def sections(model: onnx.ModelProto) -> dict[str, str]:
    """Node name -> ``features`` | ``trees`` | ``topk`` | ``rest`` (features: every node the
    feature matrix depends on)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    tree, features = feature_matrix(model)
    out: dict[str, str] = {tree.name: "trees"}
    out.update({n.name: "topk" for n in model.graph.node if n.op_type == "TopK"})
    stack = [features]
    while stack:
        node = producer.get(stack.pop())
        if node is not None and node.name not in out:
            out[node.name] = "features"
            stack.extend(node.input)
    for n in model.graph.node:
        out.setdefault(n.name, "rest")
    return out


def _time_calls(fn: Any, args: list[Any], passes: int) -> float:
    """Median over passes of the median thread-CPU µs of ``fn(a)`` over ``args``."""
    for a in args[:20]:
        fn(a)
    medians = []
    for _ in range(passes):
        times = []
        for a in args:
            t0 = time.thread_time_ns()
            fn(a)
            times.append(time.thread_time_ns() - t0)
        medians.append(np.median(times) / 1e3)
    return float(np.median(medians))


def _time_runs(sess: Any, feeds: list[dict[str, np.ndarray]], passes: int) -> float:
    """:func:`_time_calls` of ``sess.run`` over the feeds."""
    return _time_calls(lambda feed: sess.run(None, feed), feeds, passes)


def breakdown(path: Path, problems: np.ndarray, passes: int) -> dict[str, float]:
    """Median thread-CPU µs per Run of the whole graph and of sub-graphs cut out of it with
    ``onnx.utils.Extractor``: the features (problem -> the feature matrix), the trees alone (fed
    the real rows they see), the rest (validity mask, selecting the rows, scattering the scores,
    TopK, id mapping; fed the real features and tree output) and TopK alone; ``run_overhead`` is a one-node graph's Run (what every Run pays
    whatever the graph), and the ``*_net`` figures subtract it once per sub-graph."""
    from onnx.utils import Extractor

    from ckpred.export.onnx import session

    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    tree, features = feature_matrix(model)
    topk = next(n for n in model.graph.node if n.op_type == "TopK")
    cut = Extractor(model)
    sub = {"features": cut.extract_model(["problem"], [features]),
           "trees": cut.extract_model([tree.input[0]], [tree.output[0]]),
           "rest": cut.extract_model(["problem", "top_k", features, tree.output[0]], list(SELECTOR_OUTPUTS)),
           "topk": cut.extract_model(list(topk.input), list(topk.output))}
    sess = {k: session(m) for k, m in sub.items()}
    full = session(model)
    top_k = np.array([5], dtype=np.int64)
    rows = [p[None, :] for p in problems]
    f = [sess["features"].run(None, {"problem": p})[0] for p in rows]
    to_trees = session(cut.extract_model(["problem"], [tree.input[0]]))
    x = [to_trees.run(None, {"problem": p})[0] for p in rows]
    y = [sess["trees"].run(None, {tree.input[0]: v})[0] for v in x]
    to_topk = session(cut.extract_model(["problem", features, tree.output[0]], [topk.input[0]]))
    masked = [to_topk.run(None, {"problem": p, features: v, tree.output[0]: w})[0] for p, v, w in zip(rows, f, y)]
    one = onnx.helper.make_model(
        onnx.helper.make_graph([onnx.helper.make_node("Identity", ["problem"], ["out"])], "one",
                               [onnx.helper.make_tensor_value_info("problem", onnx.TensorProto.INT64, ["B", None])],
                               [onnx.helper.make_tensor_value_info("out", onnx.TensorProto.INT64, ["B", None])]),
        opset_imports=model.opset_import, ir_version=model.ir_version)
    out = {"run": _time_runs(full, [{"problem": p, "top_k": top_k} for p in rows], passes),
           "features": _time_runs(sess["features"], [{"problem": p} for p in rows], passes),
           "trees": _time_runs(sess["trees"], [{tree.input[0]: v} for v in x], passes),
           "rest": _time_runs(sess["rest"], [{"problem": p, "top_k": top_k, features: v, tree.output[0]: w}
                                             for p, v, w in zip(rows, f, y)], passes),
           "topk": _time_runs(sess["topk"], [{topk.input[0]: m, topk.input[1]: np.array([5], dtype=np.int64)}
                                             for m in masked], passes),
           "run_overhead": _time_runs(session(one), [{"problem": p} for p in rows], passes)}
    for key in ("features", "trees", "rest", "topk"):
        out[f"{key}_net"] = out[key] - out["run_overhead"]
        out[f"{key}_nodes"] = len(sub[key].graph.node)
    out["unaccounted"] = out["run"] - out["run_overhead"] - sum(out[f"{k}_net"] for k in ("features", "trees", "rest"))
    return out


def python_overhead(sel: Any, rows: list[dict[str, int]], passes: int) -> dict[str, float]:
    """Median thread-CPU µs of ``select`` (cache off) and of the bare ``session.run`` it makes, on
    the shapes some kernel can run (the ``no kernel`` ones take another path, timed apart)."""
    top_k = np.array([5], dtype=np.int64)
    answered = [r for r in rows if sel.select(**r, top_k=5).ok]
    none = [r for r in rows if r not in answered]
    feeds = [{"problem": np.array([[r[n] for n in sel.problem_fields]], dtype=np.int64), "top_k": top_k}
             for r in answered]
    out = {"session_run": _time_runs(sel._session, feeds, passes),
           "select": _time_calls(lambda r: sel.select(**r, top_k=5), answered, passes),
           "no_kernel_select": (_time_calls(lambda r: sel.select(**r, top_k=5), none, max(1, passes // 2))
                                if none else float("nan"))}
    out["no_kernel_shapes"] = len(none)
    return out


def graph_facts(path: Path) -> dict[str, Any]:
    model = onnx.load(str(path))
    width = None
    for n in model.graph.node:
        if n.domain == "ai.onnx.ml" and n.op_type.startswith("TreeEnsemble"):
            ids = next(a for a in n.attribute if a.name == "nodes_featureids").ints
            width = len(set(ids))
    kinds = collections.Counter(sections(model).values())
    return {"nodes": len(model.graph.node), "feature_nodes": kinds["features"], "tree_features": width,
            "bytes": path.stat().st_size}


def python_times(base: Any, new: Any, rows: list[dict[str, int]], repeats: int) -> dict[str, Any]:
    """Wall and thread-CPU µs per ``select`` call; the two selectors alternate pass by pass (two
    sessions used call by call evict each other's caches), paired ratio per pass pair."""
    res: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in ("base", "new")}
    ratios = []
    # shapes none of whose candidates can run take the slow "why no kernel" path of select()
    no_kernel = {key: sum(not sel.select(**row, top_k=5).ok for row in rows)
                 for key, sel in (("base", base), ("new", new))}
    for _ in range(repeats):
        medians = {}
        for key, sel in (("base", base), ("new", new)):
            for row in rows[:20]:  # warm the caches for this selector
                sel.select(**row, top_k=5)
            walls = []
            for row in rows:
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                sel.select(**row, top_k=5)
                walls.append((time.perf_counter_ns() - t0) / 1e3)
                res[key]["cpu"].append((time.thread_time_ns() - c0) / 1e3)
            res[key]["wall"].extend(walls)
            medians[key] = float(np.median(walls))
        ratios.append(medians["base"] / medians["new"])
    return {"res": res, "ratio": float(np.median(ratios)), "no_kernel": no_kernel}


def cpp_times(binary: Path, model: Path, shapes_file: str) -> dict[str, float] | None:
    if not binary.exists():
        return None
    out = subprocess.run([str(binary), str(model), "--threads", "1", "--bench", "1", "--cache", "0",
                          "--shapes", shapes_file], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        print(f"  {binary}: exit {out.returncode}: {out.stderr.strip()[:200]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])["bench"]


def manifest_figures(model_dir: Path) -> str:
    m = json.loads((model_dir / "manifest.json").read_text())
    par = m.get("parity", {})
    sel = m.get("selection") or {}
    text = (f"select={m.get('select')} candidates={sel.get('candidates')} "
            f"trees={(m.get('selector_model') or m.get('model') or {}).get('n_trees')}; parity on "
            f"{par.get('shapes')} training shapes: top-1 {par.get('top1_agreement', float('nan')):.2%}, "
            f"top-{par.get('top_k')} {par.get('topk_agreement', float('nan')):.2%}, max |diff| selector "
            f"{par.get('max_abs_diff_selector')}")
    cv = sel.get("cv")
    if cv and "skipped" not in cv:
        text += f"; CV: {json.dumps({k: v for k, v in cv.items() if not isinstance(v, (list, dict))})}"
    else:
        text += "; selection.cv: not recorded (export without run_dir)"
    return text


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, type=Path, help="export dir of the new path")
    p.add_argument("--baseline", required=True, type=Path, help="export dir of the current path")
    p.add_argument("--cpp", type=Path, default=BINARY, help="ckpred_select of the new path")
    p.add_argument("--baseline-cpp", type=Path, default=None, help="ckpred_select of the current path (default --cpp)")
    p.add_argument("--shapes", type=int, default=200, help="unseen shapes (default 200)")
    p.add_argument("--repeats", type=int, default=5, help="passes over the shapes (default 5)")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    from ckpred.data.shapes import unseen_shapes
    from ckpred.runtime import KernelSelector

    load0 = os.getloadavg()
    man = json.loads((args.model / "manifest.json").read_text())
    # shapes outside the training problem ranges' grid: random, seeded (the export keeps no shape list)
    seen = pd.DataFrame(columns=["m", "n", "k"])
    shapes = unseen_shapes(seen, args.shapes)[man["graphs"]["selector"]["inputs"][0]["columns"]]
    rows = [{k: int(v) for k, v in r.items()} for r in shapes.to_dict("records")]
    problems = shapes.to_numpy(np.int64)
    print(f"load average before: {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f} on {os.cpu_count()} CPUs; "
          f"{len(rows)} unseen shapes x {args.repeats} passes, 1 thread, top_k=5")

    paths = {"base": args.baseline, "new": args.model}
    for key, label in (("base", "current"), ("new", "new")):
        f = graph_facts(paths[key] / "model.onnx")
        print(f"{label:8s} {paths[key]}: {f['nodes']} nodes ({f['feature_nodes']} feature nodes), trees read "
              f"{f['tree_features']} columns, {f['bytes'] / 1e6:.2f} MB")
        print(f"         {manifest_figures(paths[key])}")

    base = KernelSelector.load(args.baseline, cache_size=0, threads=1)
    base._session = old_session(args.baseline / "model.onnx")  # the previous session options
    new = KernelSelector.load(args.model, cache_size=0, threads=1)
    py = python_times(base, new, rows, args.repeats)
    print("\nPython KernelSelector.select per unseen shape (µs)   median    p99   CPU median")
    for key, label in (("base", "current"), ("new", "new")):
        r = py["res"][key]
        print(f"  {label:8s}                                      {pct(r['wall'], .5):7.1f} {pct(r['wall'], .99):7.1f}"
              f" {pct(r['cpu'], .5):8.1f}")
    print(f"  paired ratio current/new (median over pass pairs): {py['ratio']:.2f}x; shapes answered "
          f"'no kernel': current {py['no_kernel']['base']}, new {py['no_kernel']['new']} of {len(rows)}")

    base_bin = args.baseline_cpp or args.cpp
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        for r in problems:
            fh.write(",".join(str(int(v)) for v in r) + "\n")
    try:
        cpp: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
        for _ in range(args.repeats):
            for key, binary in (("base", base_bin), ("new", args.cpp)):
                got = cpp_times(Path(binary), paths[key], fh.name)
                if got:
                    cpp[key].append(got)
    finally:
        os.unlink(fh.name)
    if cpp["base"] and cpp["new"]:
        print(f"\nC++ ckpred_select --bench per unseen shape (µs), median over {args.repeats} runs"
              "   median    p99   CPU median")
        med = {}
        for key, label in (("base", f"current ({base_bin})"), ("new", f"new ({args.cpp})")):
            med[key] = float(np.median([b["median_us"] for b in cpp[key]]))
            print(f"  {label}\n{'':60s} {med[key]:7.1f} {np.median([b['p99_us'] for b in cpp[key]]):7.1f} "
                  f"{np.median([b['cpu_median_us'] for b in cpp[key]]):8.1f}")
        ratios = [b["median_us"] / n["median_us"] for b, n in zip(cpp["base"], cpp["new"])]
        print(f"  paired ratio current/new (median over runs): {np.median(ratios):.2f}x")
    else:
        print(f"\nC++: no result (build with ONNXRUNTIME_ROOT=... scripts/cpp/build.sh; binary {args.cpp})")

    print(f"\nBreakdown of one Run: thread-CPU µs, medians over {args.repeats} passes of {len(problems)} shapes; "
          "sub-graphs cut out of the selector and run alone")
    print("  path      run  = overhead + features (nodes) + trees + rest (nodes; of it top-k) + unaccounted")
    for key, label in (("base", "current"), ("new", "new")):
        b = breakdown(paths[key] / "model.onnx", problems, args.repeats)
        print(f"  {label:8s} {b['run']:6.1f} = {b['run_overhead']:6.1f} + {b['features_net']:6.1f} "
              f"({b['features_nodes']:3d})"
              f" + {b['trees_net']:6.1f} + {b['rest_net']:5.1f} ({b['rest_nodes']:2d}; {b['topk_net']:4.1f}) "
              f"+ {b['unaccounted']:5.1f}")
    print("\nPython select() around session.run: thread-CPU µs, shapes with an answer; 'no kernel' shapes apart")
    for key, label, sel in (("base", "current", base), ("new", "new", new)):
        o = python_overhead(sel, rows, args.repeats)
        print(f"  {label:8s} session.run {o['session_run']:6.1f}  select {o['select']:6.1f}  (select - run "
              f"{o['select'] - o['session_run']:5.1f});  no-kernel select {o['no_kernel_select']:8.1f} "
              f"({o['no_kernel_shapes']} shapes)")
    load1 = os.getloadavg()
    print(f"\nload average after: {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
