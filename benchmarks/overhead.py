"""Env-manager overhead: framework cost per agent turn with an (almost) free scripted engine.

    .venv/bin/python benchmarks/overhead.py                  # every manager, full size
    .venv/bin/python benchmarks/overhead.py --quick          # CI smoke size
    .venv/bin/python benchmarks/overhead.py --managers traj --concurrency 1 16 64

For each manager and concurrency c, plays `--episodes` Sokoban episodes with at most c running at
once and reports wall time / number of agent turns in microseconds (median over repeats, min-max
in brackets). The scripted engine still tokenizes its reply and hashes the prompt, so the
"engine only" row (one scripted generate() on a typical prompt) is the part of each figure that
is not the manager's; at concurrency 1 the engine and env columns break the figure down (env
includes env construction and reset, i.e. level generation, spread over the turns). Prints a markdown table and writes benchmarks/results/overhead.json.

Adding a manager is one entry in MANAGERS: a factory `(engine, config) -> EnvManager`. When the
returned object is an async context manager (e.g. one that starts an HTTP proxy), the benchmark
enters it around the runs and uses what `__aenter__` returns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arl.engine import SamplingParams, make_engine
from arl.rollout import GroupScheduler, ManagerConfig, StepEnvManager, TrajEnvManager
from arl.rollout.proxy import ProxyEnvManager

RESULTS = Path(__file__).parent / "results" / "overhead.json"
ENV_ID = "arl/Sokoban-v0"

# name -> factory(engine, config) -> EnvManager (or an async context manager yielding one)
MANAGERS: dict[str, Callable[[Any, ManagerConfig], Any]] = {
    "traj": TrajEnvManager,
    "step": StepEnvManager,
    # GymRunner agents: the same episodes as "traj", through InProcessClient / the HTTP proxy
    "proxy-inprocess": lambda engine, config: ProxyEnvManager(engine, config, transport="inprocess"),
    "proxy-http": lambda engine, config: ProxyEnvManager(engine, config, transport="http"),
}


@contextlib.asynccontextmanager
async def _entered(obj: Any):
    if hasattr(obj, "__aenter__"):
        async with obj as manager:
            yield manager
    else:
        yield obj


async def bench_manager(name: str, args: argparse.Namespace) -> list[dict]:
    engine = make_engine(backend="scripted", model="tiny", scripted={"invalid_rate": 0.2})
    config = ManagerConfig(max_tokens=32)
    rows = []
    async with engine, _entered(MANAGERS[name](engine, config)) as manager:
        for c in args.concurrency:
            sched = GroupScheduler(ENV_ID, num_groups=args.episodes // 4, group_size=4, max_concurrency=c)
            await sched.run(manager, sched.specs(0)[:4])  # warm-up (tokenizer caches, env imports)
            runs, turns, parts = [], 0, {"generate": [], "env": []}
            for r in range(args.repeats):
                start = time.perf_counter()
                batch = await sched.run(manager, sched.specs(r + 1))
                wall = time.perf_counter() - start
                turns = int(batch.metrics["rollout/num_turns"])
                abnormal = batch.metrics["rollout/abnormal_rate"]
                if abnormal:
                    raise RuntimeError(f"{name}: {abnormal:.0%} of episodes ended abnormally")
                runs.append(wall / turns * 1e6)
                for key, values in parts.items():
                    values.append(sum(e.trajectory.timings[key] for e in batch.episodes) / turns * 1e6)
            row = {"manager": name, "concurrency": c, "us_per_turn": statistics.median(runs),
                   "spread": (min(runs), max(runs)), "turns": turns}
            if c == 1:  # with one episode at a time the timings do not overlap: a breakdown
                row.update({f"{k}_us": statistics.median(v) for k, v in parts.items()})
            rows.append(row)
    return rows


async def bench_engine_only(args: argparse.Namespace) -> dict:
    """The scripted engine's own cost per call, on a first-turn-sized prompt."""
    engine = make_engine(backend="scripted", model="tiny")
    async with engine:
        prompt = list(range(3, 403))  # ~ a Sokoban first prompt
        n = 200 if args.quick else 2000
        start = time.perf_counter()
        for i in range(n):
            await engine.generate(prompt, SamplingParams(max_tokens=32, seed=i))
        us = (time.perf_counter() - start) / n * 1e6
    return {"manager": "engine only", "concurrency": 1, "us_per_turn": us, "spread": (us, us), "turns": n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--managers", nargs="+", default=list(MANAGERS), choices=list(MANAGERS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--episodes", type=int, default=64, help="episodes per repeat (multiple of 4)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smoke size: 16 episodes, 1 repeat")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.repeats = 16, 1
    args.episodes = max(4, args.episodes - args.episodes % 4)

    rows = [asyncio.run(bench_engine_only(args))]
    for name in args.managers:
        rows += asyncio.run(bench_manager(name, args))
    print(f"scripted engine, {ENV_ID}, {args.episodes} episodes/repeat, "
          f"median of {args.repeats} (min-max), microseconds per agent turn")
    print("| manager | concurrency | us/turn | of which engine | of which env | turns/repeat |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        lo, hi = row["spread"]
        gen, env = (f"{row[k]:.0f}" if k in row else "-" for k in ("generate_us", "env_us"))
        print(f"| {row['manager']} | {row['concurrency']} | {row['us_per_turn']:.0f} ({lo:.0f}-{hi:.0f}) "
              f"| {gen} | {env} | {row['turns']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.platform(), "python": platform.python_version(),
            "args": {k: v for k, v in vars(args).items() if k != "out"}}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
