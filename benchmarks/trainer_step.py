"""Trainer step breakdown: rollout, advantages, update, weight push, evaluation — seconds and share.

    .venv/bin/python benchmarks/trainer_step.py                       # tiny model on CPU (~3 min on 2 cores)
    .venv/bin/python benchmarks/trainer_step.py --quick               # CI smoke size (~40 s)
    .venv/bin/python benchmarks/trainer_step.py --config configs/tiny_frozenlake_gigpo.yaml \
        --steps 6 engine.backend=vllm rollout.num_groups=16           # any config + dotted overrides

Runs `--steps` real `Trainer.step()` calls (no format warm-start, no evaluation at start) on the
config with the overrides given, and reads the step's own timing metrics: timing/rollout_s,
timing/advantages_s, timing/update_s, timing/weight_push_s, and the evaluation (what is left of
timing/step_s, on the steps where evaluation ran: every `eval.every` steps and the last). The
first step is a warm-up and is left out of the medians (first backward pass, allocator growth).
Per phase: median seconds over the measured steps (min-max) and its share of the median step
without evaluation; evaluation separately, per evaluation and amortised over `eval.every` steps.
The same script runs a GPU config: pass it with --config (and its overrides).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import cell, quiet_logs, result_path, summary, table, write_result  # noqa: E402

quiet_logs()

REPO = Path(__file__).resolve().parent.parent
PHASES = ("rollout", "advantages", "update", "weight_push")
SLEEP_PHASES = ("engine_sleep", "engine_wake")  # engine.sleep_mode=true only
DEFAULT_OVERRIDES = ["sft.steps=0", "eval.at_start=false", "eval.every=2", "eval.num_seeds=32",
                     "tensorboard=false", "keep_checkpoints=1"]


async def run(args: argparse.Namespace) -> list[dict[str, float]]:
    from arl.config import load_config
    from arl.train import Trainer

    out_dir = tempfile.mkdtemp(prefix="arl-bench-trainer-")
    overrides = [*DEFAULT_OVERRIDES, f"steps={args.steps}", f"out_dir={out_dir}", "name=bench_trainer_step",
                 *args.overrides]
    config = load_config(args.config, overrides)
    history = []
    async with Trainer(config) as trainer:
        t0 = time.perf_counter()
        await trainer.setup()
        print(f"setup (engine start, model load) {time.perf_counter() - t0:.1f} s", flush=True)
        for i in range(args.steps):
            m = await trainer.step()
            parts = {p: m[f"timing/{p}_s"] for p in PHASES + SLEEP_PHASES if f"timing/{p}_s" in m}
            step_s = m["timing/step_s"]
            row = {**parts, "eval": step_s - sum(parts.values()) if "eval/success_rate" in m else 0.0,
                   "step": step_s, "samples": m.get("train/num_samples", 0.0),
                   "response_tokens": m.get("train/num_response_tokens", 0.0),
                   "turns": m.get("rollout/num_turns", 0.0), "evaluated": "eval/success_rate" in m}
            history.append(row)
            print(f"  step {i + 1}: " + ", ".join(f"{k} {row[k]:.2f} s" for k in (*parts, "eval", "step")),
                  flush=True)
    return history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny_frozenlake_gigpo.yaml"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="smoke size: 2 steps of 2x2 episodes")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/trainer_step.json")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. rollout.num_groups=4")
    args = parser.parse_args()
    if args.quick:
        args.steps = 2
        args.overrides = ["rollout.num_groups=2", "rollout.group_size=2", "eval.num_seeds=4",
                          "engine.kv_cache_memory_bytes=134217728", *args.overrides]
    started = time.perf_counter()
    history = asyncio.run(run(args))
    measured = history[1:] if len(history) > 1 else history
    train_only = [h for h in measured if not h["evaluated"]] or measured
    step_no_eval = summary([h["step"] - h["eval"] for h in measured])
    rows, stats = [], {}
    for p in [p for p in PHASES + SLEEP_PHASES if p in measured[0]]:
        s = summary([h[p] for h in measured])
        stats[p] = s
        rows.append([p.replace("_", " "), cell(s, "{:.3f}"), f"{s['median'] / step_no_eval['median']:.1%}"])
    evals = [h["eval"] for h in history if h["evaluated"]]
    rows.append(["step (without eval)", cell(step_no_eval, "{:.3f}"), "100%"])
    if evals:
        stats["eval"] = summary(evals)
        every = next((int(o.split("=", 1)[1]) for o in [*DEFAULT_OVERRIDES, *args.overrides]
                      if o.startswith("eval.every=")), 1) or 1
        rows.append([f"evaluation (per eval; every {every} steps)", cell(stats["eval"], "{:.3f}"),
                     f"{stats['eval']['median'] / every / step_no_eval['median']:.1%} amortised"])
    print(f"\n{Path(args.config).name} + {' '.join([*DEFAULT_OVERRIDES, *args.overrides])}; "
          f"{len(measured)} measured steps after 1 warm-up (median, min–max); "
          f"{statistics.median(h['samples'] for h in measured):.0f} samples, "
          f"{statistics.median(h['response_tokens'] for h in measured):.0f} response tokens per step")
    print(table(["phase", "seconds", "share of step"], rows))
    push_share = stats["weight_push"]["median"] / step_no_eval["median"]
    print(f"weight push: {push_share:.2%} of the step (goal < 2%)")
    write_result(args.out or result_path("trainer_step", args.quick), args, {"steps": history, "phases": stats, "step_without_eval": step_no_eval,
                                  "weight_push_share": push_share, "train_only_steps": len(train_only)}, started)


if __name__ == "__main__":
    main()
