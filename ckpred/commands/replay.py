"""``python -m ckpred replay``: autotune budgets replayed on a train run's measured tables."""

from __future__ import annotations

from ckpred import autotune as at
from ckpred import replay as rp
from ckpred.runs import run_directory
from ckpred.schema import ReplayConfig
from ckpred.util import check_replaceable, claim_run_dir, resolve_path


def replay_command(cfg: ReplayConfig) -> str:
    """Task function of ``python -m ckpred replay``; prints the table, returns the output folder."""
    run_dir = resolve_path(cfg.run_dir)
    out = resolve_path(cfg.out) if cfg.out else run_dir / "replay"
    # replay.md, replay.csv and replay.png go into out: only a replay folder ckpred made (or a new
    # or empty one) takes them; checked before any work, the folder made once the table is computed
    check_replaceable("out", cfg.out or out, run_directory("replay"))
    data = rp.load_run(run_dir)
    calibration = rp.load_run(resolve_path(cfg.calibration_run_dir)) if cfg.calibration_run_dir else None
    policies: list[at.Budget] = [at.FixedK(int(k)) for k in cfg.ks]
    policies += [at.Confidence(target=float(t), within=float(cfg.within)) for t in cfg.targets]
    if cfg.learned:
        policies += [rp.Learned(target=float(t), within=float(cfg.within)) for t in cfg.targets]
    policies += [rp.Hindsight(float(cfg.within))]
    table = rp.replay_table(data, policies, calibration_data=calibration, random_seeds=int(cfg.seeds),
                            within=(float(cfg.within),), gap_to=int(cfg.gap_to))
    claim_run_dir("out", cfg.out or out, run_directory("replay"))
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
