"""verl's training loop vs arl's trainer on one FrozenLake set-up (issue 45 item 4): table and plot.

The two runs (both start from the same format warm-start, `arl.integrations.verl.warm_start`):

    mkdir -p /tmp/arl-verl-side-by-side
    OUT=/tmp/arl-verl-side-by-side STEPS=8 WARM_START=1 GROUPS_PER_STEP=4 GROUP=4 PYTHON=.venv-verl/bin/python \\
      bash arl/integrations/verl/examples/cpu_fit.sh trainer.save_freq=-1 trainer.experiment_name=frozenlake_side_by_side \\
      +algorithm.arl_gigpo.episode_stats=episodes +algorithm.arl_gigpo.singleton=zero \\
      +algorithm.arl_gigpo.invalid_penalty=0 > /tmp/arl-verl-side-by-side/verl.log 2>&1
    .venv-verl/bin/arl train benchmarks/verl_side_by_side.yaml
    .venv/bin/python benchmarks/verl_side_by_side.py --verl-log /tmp/arl-verl-side-by-side/verl.log \\
      --arl-run /tmp/arl-verl-side-by-side/arl/verl_side_by_side

Per step, both sides: the training episodes' mean score (verl: ``critic/score/mean``; arl:
``rollout/mean_episode_score``; FrozenLake scores 1 for reaching the goal, less a small penalty per
invalid answer, so with no invalid answer it is the success rate), the invalid-answer fraction
(``arl_gigpo/invalid_frac``, ``train/gigpo_invalid_frac``) and seconds per step (verl: ``timing_s/step``;
arl: ``timing/step_s``). Writes benchmarks/results/verl-side-by-side.json and
.png and prints the Markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _util import RESULTS_DIR, machine

from arl.integrations.verl.console import step_metrics


def verl_rows(log: Path) -> list[dict[str, float]]:
    return [{"step": step, "score": m["critic/score/mean"], "invalid_frac": m["arl_gigpo/invalid_frac"],
             "step_s": m["timing_s/step"]} for step, m in sorted(step_metrics(log.read_text()).items())]


def arl_rows(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{"step": r["step"], "score": r["rollout/mean_episode_score"], "invalid_frac": r["train/gigpo_invalid_frac"],
             "step_s": r["timing/step_s"]} for r in rows if "rollout/mean_episode_score" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verl-log", type=Path, required=True)
    parser.add_argument("--arl-run", type=Path, required=True)
    parser.add_argument("--note", default="", help="what else ran on the machine")
    args = parser.parse_args()
    verl, arl = verl_rows(args.verl_log), arl_rows(args.arl_run)
    result = {"verl": verl, "arl": arl, "machine": machine(), "note": args.note}
    out = RESULTS_DIR / "verl-side-by-side.json"
    out.write_text(json.dumps(result, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, rows in (("verl's loop (main_ppo, CPU)", verl), ("arl's trainer", arl)):
        ax1.plot([r["step"] for r in rows], [r["score"] for r in rows], marker="o", label=name)
        ax2.plot([r["step"] for r in rows], [r["step_s"] for r in rows], marker="o", label=name)
    ax1.set(xlabel="step", ylabel="mean episode score (16 training episodes)", ylim=(-0.05, 1.05))
    ax2.set(xlabel="step", ylabel="seconds per step")
    ax1.legend()
    fig.tight_layout()
    fig.savefig(RESULTS_DIR / "verl-side-by-side.png", dpi=110)

    print("| step | verl: score | verl: invalid | verl: s/step | arl: score | arl: invalid | arl: s/step |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    by_step = {r["step"]: r for r in arl}
    for r in verl:
        a = by_step.get(r["step"], {})
        print(f"| {r['step']} | {r['score']:.3f} | {r['invalid_frac']:.2f} | {r['step_s']:.1f} | "
              f"{a.get('score', float('nan')):.3f} | {a.get('invalid_frac', float('nan')):.2f} | "
              f"{a.get('step_s', float('nan')):.1f} |")
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
