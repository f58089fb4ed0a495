"""``python -m ckpred replay``: autotune budgets replayed on a train run's measured tables."""

from __future__ import annotations

from typing import Any

from ckpred import autotune as at
from ckpred import replay as rp
from ckpred.util import resolve_path


def replay_command(cfg: Any) -> str:
    """Task function of ``python -m ckpred replay``; prints the table, returns the output folder."""
    run_dir = resolve_path(cfg.run_dir)
    data = rp.load_run(run_dir)
    calibration = rp.load_run(resolve_path(cfg.calibration_run_dir)) if cfg.calibration_run_dir else None
    policies: list[at.Budget] = [at.FixedK(int(k)) for k in cfg.ks]
    policies += [at.Confidence(target=float(t), within=float(cfg.within)) for t in cfg.targets]
    if cfg.learned:
        policies += [rp.Learned(target=float(t), within=float(cfg.within)) for t in cfg.targets]
    policies += [rp.Hindsight(float(cfg.within))]
    table = rp.replay_table(data, policies, calibration_data=calibration, random_seeds=int(cfg.seeds),
                            within=(float(cfg.within),), gap_to=int(cfg.gap_to))
    out = resolve_path(cfg.out) if cfg.out else run_dir / "replay"
    out.mkdir(parents=True, exist_ok=True)
    source = f"calibration from {cfg.calibration_run_dir}" if cfg.calibration_run_dir else \
        "calibration cross-fitted over the run's folds"
    text = rp.markdown(table, f"{run_dir} ({source}, score gap to the top-{int(cfg.gap_to)})")
    if cfg.learned:
        auc = rp.signal_auc(data, calibration, within=float(cfg.within), gap_to=int(cfg.gap_to))
        text += "\n\n" + rp.auc_line(auc, float(cfg.within))
    (out / "replay.md").write_text(text + "\n")
    table.to_csv(out / "replay.csv", index=False)
    rp.plot_curves({run_dir.name: table}, out / "replay.png")
    print(text)
    print(f"wrote {out / 'replay.md'}, replay.csv, replay.png")
    return str(out)
