"""``python -m ckpred select``: the top-k kernels of one problem from an exported model."""

from __future__ import annotations

import json
from typing import Any

from ckpred.errors import ConfigValueError, MissingFileError
from ckpred.export import manifest as mf
from ckpred.kernels.base import load_op
from ckpred.runtime import KernelSelector
from ckpred.schema import SelectConfig
from ckpred.util import resolve_path


def select_command(cfg: SelectConfig) -> dict[str, Any]:
    """Task function of ``python -m ckpred select``: print the top-k kernels of one problem."""
    names: dict[str, Any] = {"arch": cfg.arch.name, "dtype": cfg.dtype.name, "layout": cfg.layout.name}
    op = load_op(cfg.op)
    op_name = op.name
    for key, value in cfg.problem.items():
        # Checked before the model is looked for, so a typo is named even without an export:
        # conf/problem/<op>.yaml declares the fields, but `+problem.<key>` can add any other, and
        # the values are untyped there (a problem field may be categorical).
        if key not in op.problem_names:
            raise ConfigValueError(f"problem.{key}", value, f"a field of op {op_name!r}: {op.problem_names}")
        if op.field(key).kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigValueError(f"problem.{key}", value, "an integer")
    model_dir = resolve_path(cfg.model_dir) if cfg.model_dir else \
        resolve_path(cfg.exports_dir) / mf.export_name(op_name, names["arch"], names["dtype"], names["layout"])
    if not (model_dir / mf.MANIFEST).is_file():
        raise MissingFileError(str(model_dir / mf.MANIFEST),
                               f"no exported model in {model_dir}; run `python -m ckpred export op={op_name} "
                               f"arch={names['arch']} dtype={names['dtype']} layout={names['layout']}` (or the "
                               f"same experiment=...) first or pass model_dir=<dir>")
    selector = KernelSelector.load(model_dir, threads=int(cfg.threads), cache_size=0, **names)
    answer = selector.select(dict(cfg.problem), top_k=int(cfg.top_k))
    result = answer.to_dict()
    if cfg.json:
        print(json.dumps(result))
        return result
    problem = " ".join(f"{k}={v}" for k, v in answer.problem.items())
    print(f"{op_name} {names['arch']} {names['dtype']} {names['layout']}: {problem}  (model {model_dir})")
    if answer.out_of_distribution:
        ranges = ", ".join(f"{k}={v} outside [{r[0]}, {r[1]}]" for k, (v, r) in answer.ood_fields.items())
        print(f"warning: out of the training distribution: {ranges}")
    if not answer.ok:
        print(f"no kernel: {answer.reason}")
        return result
    print(f"{answer.num_valid} valid kernels; top {len(answer.ids)}:")
    for rank, (i, name, score) in enumerate(zip(answer.ids, answer.kernels, answer.scores), 1):
        print(f"{rank:>3}  {i:>5}  {score:>14.6f}  {name}")
    return result
