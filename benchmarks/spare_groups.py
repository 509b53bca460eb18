"""Over-provisioning: does playing spare groups and keeping the first that finish shorten a rollout?

    .venv/bin/python benchmarks/spare_groups.py                # demo config, spares 0 1 2, 5 repeats (~4 min on 2 cores)
    .venv/bin/python benchmarks/spare_groups.py --quick        # smoke size (~1 min)
    .venv/bin/python benchmarks/spare_groups.py --spares 0 2 4 rollout.max_concurrency=80

One engine and one policy: the demo config's trainer after its format warm-start (the policy a
demo step starts from). Each repeat plays, for every `--spares` k in turn (the order rotates per
repeat), one training rollout of num_groups + k groups with ``keep_groups=num_groups``
(`GroupScheduler.run`): the first num_groups groups to finish every member are kept, the others
cancelled. Per k, medians over repeats (min-max):

- rollout s: wall time until num_groups whole groups are done (what a training step waits for);
- x k=0: that over the same repeat's k=0 rollout (the ratio is taken per repeat);
- kept turns / episode and kept success: of the kept episodes only, against k=0's, which keeps
  everything: a kept batch with fewer turns or another success rate is the selection bias
  over-provisioning pays for its speed;
- dropped: groups cancelled.

With ``max_concurrency`` at or above (num_groups + k) x group_size every episode starts at once and
spares compete for the engine from the start; below it, spares wait for a free slot.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import cell, quiet_logs, result_path, summary, table, write_result  # noqa: E402

quiet_logs()

REPO = Path(__file__).resolve().parent.parent
RUN_OVERRIDES = ["eval.at_start=false", "eval.every=0", "tensorboard=false", "keep_checkpoints=1"]
QUICK_OVERRIDES = ["rollout.num_groups=2", "rollout.group_size=4", "sft.steps=2",
                   "engine.kv_cache_memory_bytes=134217728"]


async def run(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    from arl.config import load_config
    from arl.rollout.factory import make_scheduler
    from arl.train import Trainer

    rows: dict[str, list[dict[str, float]]] = {str(k): [] for k in args.spares}
    with tempfile.TemporaryDirectory() as out:
        config = load_config(args.config, [*RUN_OVERRIDES, *args.overrides, f"out_dir={out}", "name=spares"])
        async with Trainer(config, resume=False) as trainer:
            await trainer.setup()
            if config.sft.steps > 0:  # the format warm-start: the policy a demo step starts from
                from arl.train.sft import format_warm_start

                await format_warm_start(trainer)
                await trainer.push_weights()
            g = config.rollout.num_groups
            for r in range(args.repeats):
                order = args.spares[r % len(args.spares):] + args.spares[: r % len(args.spares)]
                for k in order:
                    groups = make_scheduler(config.rollout, seed=1 + r, spare_groups=k)
                    start = time.perf_counter()
                    batch = await groups.run(trainer.manager, groups.specs(r), keep_groups=g)
                    wall = time.perf_counter() - start
                    m = batch.metrics
                    rows[str(k)].append({
                        "repeat": r, "rollout_s": wall, "episodes": m["rollout/num_episodes"],
                        "turns": m["rollout/num_turns"] / max(m["rollout/num_episodes"], 1.0),
                        "success": m.get("rollout/success_rate", float("nan")),
                        "dropped": m.get("rollout/groups_dropped", 0.0),
                    })
    return rows


HEADER = ["spare groups", "repeats", "rollout s", "x k=0", "kept turns / episode", "kept success %", "dropped"]


def summarize(rows: dict[str, list[dict[str, float]]]) -> list[list[str]]:
    base = {r["repeat"]: r for r in rows["0"]}
    out = []
    for k, runs in rows.items():
        out.append([
            k, str(len(runs)),
            cell(summary([r["rollout_s"] for r in runs]), "{:.2f}"),
            cell(summary([r["rollout_s"] / base[r["repeat"]]["rollout_s"] for r in runs]), "{:.2f}"),
            cell(summary([r["turns"] for r in runs]), "{:.2f}"),
            cell(summary([r["success"] for r in runs]), "{:.1f}", scale=100),
            cell(summary([r["dropped"] for r in runs])),
        ])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. rollout.max_concurrency=80")
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny_frozenlake_gigpo.yaml"))
    parser.add_argument("--spares", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smoke size: 2 x 4 episodes, spares 0 1, 1 repeat")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/spare_groups.json")
    args = parser.parse_args()
    if 0 not in args.spares:
        parser.error("--spares must include 0 (the baseline)")
    args.spares = sorted(set(args.spares))
    if args.quick:
        args.overrides, args.spares, args.repeats = [*QUICK_OVERRIDES, *args.overrides], [0, 1], 1
    started = time.perf_counter()
    rows = asyncio.run(run(args))
    lines = summarize(rows)
    print(f"Over-provisioning, {Path(args.config).name} {' '.join(args.overrides)}: medians over repeats (min-max)")
    print(table(HEADER, lines))
    write_result(args.out or result_path("spare_groups", args.quick), args, {"rows": rows, "table": lines}, started)

if __name__ == "__main__":
    main()
