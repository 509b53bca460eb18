"""verl's training loop vs arl's trainer on one FrozenLake set-up (issue 45 item 4): tables and plot.

The runs (one or more under verl's loop and one under arl's trainer, all from the same format
warm-start, `arl.integrations.verl.warm_start`), each checkpoint scored on the same 256 levels by ``arl
eval`` (verl's merged to Hugging Face first): the commands are in benchmarks/README.md, "verl's loop
beside arl's trainer". Then

    .venv/bin/python benchmarks/verl_side_by_side.py --verl NAME=OUT/verl.log [--verl NAME2=LOG2 ...] \\
      --arl-run OUT/arl/verl_side_by_side --evals OUT/evals

Per step, every run: the training episodes' mean score (verl: ``arl/episode_score``, each episode once,
or ``critic/score/mean``, a mean over rows, in a log from before arl_sync logged it; arl:
``rollout/mean_episode_score``; FrozenLake scores 1 for reaching the goal, less a small penalty per
invalid answer, so with no invalid answer it is the success rate), the invalid-answer fraction
(``arl_gigpo/invalid_frac``, ``train/gigpo_invalid_frac``) and seconds per step (verl: ``timing_s/step``;
arl: ``timing/step_s``), in bins of ``--bin`` steps; per checkpoint (``--evals``), validation success
(arl's side: ``arl-<step>`` evaluations, else its own in-training ``eval/success_rate``, the same
levels and temperature as ``arl eval``).
Writes benchmarks/results/verl-side-by-side.json and .png and prints the Markdown tables.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

from _util import RESULTS_DIR, machine

from arl.integrations.verl.console import step_metrics


def verl_rows(log: Path) -> list[dict[str, float]]:
    return [{"step": step, "score": m.get("arl/episode_score", m["critic/score/mean"]), "invalid_frac": m["arl_gigpo/invalid_frac"],
             "step_s": m["timing_s/step"]} for step, m in sorted(step_metrics(log.read_text()).items())]


def arl_rows(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{"step": r["step"], "score": r["rollout/mean_episode_score"], "invalid_frac": r["train/gigpo_invalid_frac"],
             "step_s": r["timing/step_s"]} for r in rows if "rollout/mean_episode_score" in r]


def arl_evals(run: Path) -> dict[int, float]:
    """arl's in-training validation success per step (``eval/success_rate`` in metrics.jsonl)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {int(r["step"]): float(r["eval/success_rate"]) for r in rows if "eval/success_rate" in r}


def checkpoint_evals(evals: Path, sides: list[str]) -> dict[str, dict[int, float]]:
    """Validation success per checkpoint, every side, from ``arl eval --out`` directories under
    ``evals``: ``warm`` (the shared warm-start, step 0 of every side), ``<side>-<step>`` (a verl run's
    actor merged to HF by ``python -m verl.model_merger merge``; arl's ``ckpt_<step>``)."""
    out: dict[str, dict[int, float]] = {side: {} for side in sides}
    for summary in sorted(evals.glob("*/summary.json")):
        name = summary.parent.name
        rate = json.loads(summary.read_text())["metrics"]["eval/success_rate"]
        if name == "warm":
            for side in sides:
                out[side][0] = rate
        elif "-" in name and name.rsplit("-", 1)[0] in out:
            side, step = name.rsplit("-", 1)
            out[side][int(step)] = rate
    return {side: dict(sorted(points.items())) for side, points in out.items()}


def binned(rows: list[dict[str, float]], width: int, upto: int) -> list[dict[str, float]]:
    """Steps 1..upto in bins of ``width``: mean score, mean invalid fraction, median seconds per step."""
    bins = []
    for lo in range(1, upto + 1, width):
        chunk = [r for r in rows if lo <= r["step"] < lo + width]
        if chunk:
            bins.append({"steps": f"{lo}-{chunk[-1]['step']}", "score": statistics.mean(r["score"] for r in chunk),
                         "invalid_frac": statistics.mean(r["invalid_frac"] for r in chunk),
                         "step_s": statistics.median(r["step_s"] for r in chunk)})
    return bins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verl", action="append", required=True, metavar="NAME=LOG",
                        help="a verl run: its name in the tables (and its evaluations' prefix) and its console log; repeatable")
    parser.add_argument("--arl-run", type=Path, required=True)
    parser.add_argument("--evals", type=Path, help="arl eval --out directories of the checkpoints "
                        "(warm, NAME-STEP, arl-STEP): validation success on the same levels")
    parser.add_argument("--bin", type=int, default=25, help="steps per row of the table")
    parser.add_argument("--note", default="", help="what else ran on the machine")
    args = parser.parse_args()
    runs = {name: verl_rows(Path(log)) for name, log in (v.split("=", 1) for v in args.verl)}
    runs["arl"] = arl_rows(args.arl_run)
    evals = checkpoint_evals(args.evals, list(runs)) if args.evals else {side: {} for side in runs}
    if set(evals["arl"]) <= {0}:  # no arl-<step> evaluations: arl's own validations
        evals["arl"] = {**evals["arl"], **arl_evals(args.arl_run)}
    table = {side: binned(rows, args.bin, rows[-1]["step"]) for side, rows in runs.items()}
    result = {"runs": runs, "evals": evals, "bins": table, "machine": machine(), "note": args.note}
    out = RESULTS_DIR / "verl-side-by-side.json"
    out.write_text(json.dumps(result, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if any(evals.values()) else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.6))
    for side, rows in runs.items():
        name = "arl's trainer" if side == "arl" else f"verl's loop: {side}"
        scores = [r["score"] for r in rows]
        window = [statistics.mean(scores[max(0, i - args.bin + 1): i + 1]) for i in range(len(scores))]
        axes[0].plot([r["step"] for r in rows], window, label=name)
        axes[1].plot([r["step"] for r in rows], [r["step_s"] for r in rows], label=name, lw=0.8)
        if panels == 3 and evals[side]:
            axes[2].plot(list(evals[side]), [100 * v for v in evals[side].values()], marker="o", label=name)
    axes[0].set(xlabel="step", ylabel=f"training score, mean of the last {args.bin} steps", ylim=(-0.05, 1.05))
    axes[1].set(xlabel="step", ylabel="seconds per step")
    if panels == 3:
        axes[2].set(xlabel="checkpoint step", ylabel="validation success % (same levels)", ylim=(0, 100))
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS_DIR / "verl-side-by-side.png", dpi=110)

    sides = list(runs)
    print("| steps | " + " | ".join(f"{s}: score | {s}: invalid | {s}: s/step" for s in sides) + " |")
    print("| --- |" + " --- | --- | --- |" * len(sides))
    for cells in itertools.zip_longest(*(table[s] for s in sides)):  # a side that ran fewer steps: dashes
        label = max((r["steps"] for r in cells if r), key=lambda steps: int(steps.split("-")[1]))  # the fullest bin
        # a run that stopped inside the bin says which of its steps the cell averages
        row = [f"{r['score']:.3f}{'' if r['steps'] == label else ' (steps ' + r['steps'] + ')'} | "
               f"{r['invalid_frac']:.2f} | {r['step_s']:.1f}" if r else "– | – | –" for r in cells]
        print(f"| {label} | " + " | ".join(row) + " |")
    if any(evals.values()):
        steps = sorted(set().union(*evals.values()))
        print("\n| checkpoint step | " + " | ".join(str(s) for s in steps) + " |")
        print("| --- |" + " --- |" * len(steps))
        for side in sides:
            cells = [f"{100 * evals[side][s]:.1f}%" if s in evals[side] else "–" for s in steps]
            print(f"| {side} | " + " | ".join(cells) + " |")
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
