"""Reset and step rates of arl's games and wrappers, beside gymnasium's own FrozenLake-v1.

    .venv/bin/python benchmarks/envs.py            # full run, writes benchmarks/results/envs.json
    .venv/bin/python benchmarks/envs.py --quick    # smoke size (seconds), writes a .tmp file

Each cell is the median over `repeats` of the mean time per call inside one repeat; the spread is
the min..max over repeats. Resets use a fresh seed each (a new level / map every time). Steps take
random valid actions and reset (untimed) when an episode ends. The reference rows time
gymnasium's FrozenLake-v1: steps on the made env, and "reset" as generate_random_map + building
the env + reset, since gymnasium can only change the map by constructing a new env.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from arl.envs import ENV_SPECS, TextEnv, ToolEnv, register_envs  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def timed(fn: Callable[[int], None], n: int, repeats: int) -> dict[str, float]:
    """Median / min / max over repeats of the mean seconds per call (fn gets the call index)."""
    per_call = []
    for rep in range(repeats):
        t0 = time.perf_counter()
        for i in range(n):
            fn(rep * n + i)
        per_call.append((time.perf_counter() - t0) / n)
    return {
        "median_us": statistics.median(per_call) * 1e6,
        "min_us": min(per_call) * 1e6,
        "max_us": max(per_call) * 1e6,
    }


def step_timer(
    reset: Callable[[], Any], step: Callable[[int], tuple], n: int, repeats: int
) -> dict[str, float]:
    """Like `timed` for steps, excluding the resets between episodes from the clock."""
    per_call = []
    rng = np.random.default_rng(0)
    for _ in range(repeats):
        reset()
        actions = rng.integers(0, 4, size=n)
        elapsed = 0.0
        for a in actions:
            t0 = time.perf_counter()
            result = step(int(a))
            elapsed += time.perf_counter() - t0
            if result[2] or result[3]:
                reset()
        per_call.append(elapsed / n)
    return {
        "median_us": statistics.median(per_call) * 1e6,
        "min_us": min(per_call) * 1e6,
        "max_us": max(per_call) * 1e6,
    }


def bench_arl(env_id: str, wrapper: str, n_resets: int, n_steps: int, repeats: int) -> dict[str, Any]:
    if wrapper == "raw":
        env: Any = gym.make(env_id)
        names = env.unwrapped.action_names

        def step(a: int) -> tuple:
            return env.step(a)
    elif wrapper == "TextEnv":
        env = TextEnv(env_id)
        answers = [f"<answer>{name}</answer>" for name in env.action_names]

        def step(a: int) -> tuple:
            return env.step(answers[a])
    else:
        env = ToolEnv(env_id)
        names = env.action_names
        messages = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "move", "arguments": json.dumps({"direction": n})},
                    }
                ],
            }
            for n in names
        ]

        def step(a: int) -> tuple:
            return env.step(messages[a])

    from arl.envs.sokoban import seeded_level

    seeded_level.cache_clear()  # every timed reset generates its level (another wrapper reset these seeds)
    reset = timed(lambda i: env.reset(seed=i), n_resets, repeats)
    steps = step_timer(lambda: env.reset(seed=12345), step, n_steps, repeats)
    return {"env": env_id, "wrapper": wrapper, "reset": reset, "step": steps}


def bench_gym_reference(n_resets: int, n_steps: int, repeats: int) -> dict[str, Any]:
    env = gym.make("FrozenLake-v1", is_slippery=False)

    def new_map_reset(i: int) -> None:
        GymFrozenLake(desc=generate_random_map(size=4, p=0.8, seed=i), is_slippery=False).reset(seed=i)

    reset = timed(new_map_reset, n_resets, repeats)
    steps = step_timer(lambda: env.reset(seed=0), env.step, n_steps, repeats)
    return {"env": "FrozenLake-v1 (gymnasium)", "wrapper": "raw", "reset": reset, "step": steps}


def fmt(cell: dict[str, float]) -> str:
    rate = 1e6 / cell["median_us"]
    return f"{cell['median_us']:9.1f} us ({cell['min_us']:.1f}-{cell['max_us']:.1f}) {rate:9.0f}/s"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| env | wrapper | reset: median us (min-max) rate | step: median us (min-max) rate |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['env']} | {row['wrapper']} | {fmt(row['reset'])} | {fmt(row['step'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke size: a few seconds")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    args = parser.parse_args(argv)
    n_resets, n_steps, repeats = (10, 50, 2) if args.quick else (200, 2000, 5)
    out = args.out or RESULTS / ("envs-quick.tmp" if args.quick else "envs.json")

    register_envs()
    rows = [bench_gym_reference(n_resets, n_steps, repeats)]
    for env_id in ENV_SPECS:
        for wrapper in ("raw", "TextEnv", "ToolEnv"):
            rows.append(bench_arl(env_id, wrapper, n_resets, n_steps, repeats))
    print(table(rows))

    sokoban_reset_ms = rows[1]["reset"]["median_us"] / 1e3
    assert rows[1]["env"] == "arl/Sokoban-v0" and rows[1]["wrapper"] == "raw"
    print(f"\narl/Sokoban-v0 reset median: {sokoban_reset_ms:.2f} ms (budget: well under 50 ms)")

    report = {
        "quick": args.quick,
        "config": {"resets": n_resets, "steps": n_steps, "repeats": repeats},
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "gymnasium": gym.__version__,
            "numpy": np.__version__,
        },
        "results": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if sokoban_reset_ms < 50 else 1


if __name__ == "__main__":
    sys.exit(main())
