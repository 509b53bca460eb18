"""Scaling: framework cost per agent turn as concurrency grows and as episodes get longer.

    .venv/bin/python benchmarks/scaling.py                 # both sweeps, full size (~4 min on 2 shared cores)
    .venv/bin/python benchmarks/scaling.py --quick         # CI smoke size (~15 s)
    .venv/bin/python benchmarks/scaling.py --managers traj proxy-inprocess --concurrency 1 16 256 --turns 5 50

Same method as overhead.py (scripted engine, so the model is free and only arl is measured; the
managers are overhead.py's MANAGERS), swept along two axes:

1. concurrency: `--episodes` episodes of `--concurrency-turns` turns each per repeat, at most c of
   them running at once, for c in `--concurrency` (1 4 16 64 256);
2. episode length: `--length-episodes` episodes at concurrency `--length-concurrency`, every
   episode exactly T turns, for T in `--turns` (5 10 20 50).

Every episode lasts exactly its turn budget: the env is `bench/SokobanEndless-v0`, arl's 6x6
one-box Sokoban (same levels, same rules, same text) except that solving the level does not end the
episode, with its TimeLimit set to T (`ManagerConfig.env_kwargs={"max_episode_steps": T}`,
`max_turns=T`). The policy is the scripted engine's random `<answer>...</answer>` replies, 20%
invalid, max_tokens 32, as in overhead.py. The actual mean turns per episode are reported.

Per (manager, sweep point), median over `--repeats` (min-max); inside a repeat every sweep point
and every manager runs once, the managers in rotating order, so load drift on a shared machine
hits them alike:

- CPU us / turn: process CPU time of the batch / agent turns (the primary figure: other tenants of
  the machine do not inflate it);
- excl. backend: the same minus the scripted backend's own CPU: its `generate`, timed on the
  event-loop thread, less `BaseEngine.validate_prompt` inside it (arl's code, which every backend
  runs on every request: it stays in). The scripted backend hashes the whole prompt to pick its
  reply, so its cost grows with the prompt like a model's prefill would, and is taken out;
- validate us / turn: `BaseEngine.validate_prompt` alone (a Python pass over the prompt's ids);
- wall us / turn and turns/s (wall): elapsed time, noisy on a shared machine;
- CPU us / sample: per training sample (traj and proxy: one per episode; step: one per turn);
- x first: CPU per turn over the first sweep point's, per repeat;
- marginal CPU us / turn (length sweep; all CPU and excl. backend): (CPU per episode at T - at the
  previous T) / (T - previous T), per repeat: what one more turn costs once the per-episode costs
  (env construction and level generation, the first prompt, building the sample) are taken out;
- heap KiB / episode: one more, untimed, batch under `tracemalloc` (Python allocations only; the
  tokenizer's Rust heap is not seen): peak traced memory above the start of the batch, divided by
  its episodes. Concurrency sweep: exactly c episodes, all in flight at once; length sweep:
  `--length-concurrency` episodes. The finished episodes' trajectories and samples, which the
  batch keeps, are included.

A PNG (matplotlib, Agg) is written next to the JSON: CPU us per turn vs concurrency (log x) and vs
turns per episode, one line per manager (solid: all CPU, dotted: excluding the scripted backend).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import gymnasium as gym

sys.path.insert(0, str(Path(__file__).parent))

from _util import cell, result_path, summary, table, write_result  # noqa: E402
from overhead import MANAGERS, _entered, _rotated  # noqa: E402

from arl.config import ManagerConfig  # noqa: E402
from arl.engine import make_engine  # noqa: E402
from arl.envs import ENV_SPECS, SokobanEnv  # noqa: E402
from arl.rollout import GroupScheduler  # noqa: E402

ENV_ID = "bench/SokobanEndless-v0"
BASE_ENV = "arl/Sokoban-v0"
CLOCK = time.thread_time  # the engine timer: CPU of the event-loop thread
DEFAULT_MANAGERS = ["traj", "step", "proxy-inprocess"]


class EndlessSokoban(SokobanEnv):
    """arl's Sokoban whose solved state does not end the episode (only the TimeLimit does)."""

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, _solved, truncated, info = super().step(action)
        return obs, reward, False, truncated, info


def register_endless() -> None:
    if ENV_ID in gym.registry:
        return
    _, max_steps, kwargs = ENV_SPECS[BASE_ENV]
    # max_steps=10 bounds level generation exactly as for arl/Sokoban-v0: the same levels.
    gym.register(id=ENV_ID, entry_point=EndlessSokoban, max_episode_steps=max_steps,
                 kwargs={**kwargs, "max_steps": max_steps})


class EngineMeter:
    """CPU time inside the engine's generate (exclusive: the scripted engine never suspends), and
    inside BaseEngine.validate_prompt, the part of it that is arl's and every backend runs."""

    def __init__(self, engine: Any) -> None:
        if getattr(engine, "latency_s", 0.0):
            raise ValueError("EngineMeter needs an engine that answers without suspending")
        self.cpu = self.validate = 0.0
        generate, validate = engine.generate, engine.validate_prompt

        async def timed_generate(*args: Any, **kwargs: Any) -> Any:
            start = CLOCK()
            try:
                return await generate(*args, **kwargs)
            finally:
                self.cpu += CLOCK() - start

        def timed_validate(*args: Any, **kwargs: Any) -> Any:
            start = CLOCK()
            try:
                return validate(*args, **kwargs)
            finally:
                self.validate += CLOCK() - start

        engine.generate, engine.validate_prompt = timed_generate, timed_validate


def _config(turns: int) -> ManagerConfig:
    return ManagerConfig(max_tokens=32, max_turns=turns, env_kwargs={"max_episode_steps": turns})


def _git() -> dict[str, Any]:
    """The checkout measured: HEAD and any uncommitted changes under arl/."""
    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], capture_output=True, text=True, timeout=10,
                                  cwd=Path(__file__).parent).stdout.rstrip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD"), "dirty_arl": git("status", "--porcelain", "--", "../arl").splitlines()}


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


async def _timed(manager: Any, sched: GroupScheduler, specs: list, meter: EngineMeter, turns_target: int) -> dict:
    gc.collect()
    e0, v0 = meter.cpu, meter.validate
    w0, c0 = time.perf_counter(), time.process_time()
    batch = await sched.run(manager, specs)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    validate = meter.validate - v0
    engine = meter.cpu - e0 - validate  # the scripted backend's own work
    m = batch.metrics
    if m["rollout/abnormal_rate"]:
        raise RuntimeError(f"{m['rollout/abnormal_rate']:.0%} abnormal episodes: "
                           f"{ {k: v for k, v in m.items() if k.startswith('rollout/exit/') and v} }")
    turns, samples = int(m["rollout/num_turns"]), len(batch.samples)
    if m["rollout/mean_turns"] != turns_target:  # the endless env: every episode runs to its limit
        raise RuntimeError(f"episodes lasted {m['rollout/mean_turns']:.2f} turns on average, not {turns_target}")
    return {"cpu": cpu / turns * 1e6, "framework": (cpu - engine) / turns * 1e6,
            "validate": validate / turns * 1e6, "wall": wall / turns * 1e6,
            "cpu_sample": cpu / samples * 1e6, "turns_per_s": turns / wall, "turns": turns, "samples": samples,
            "mean_turns": m["rollout/mean_turns"], "prompt_tokens_mean": m["rollout/prompt_tokens_mean"],
            "sample_tokens_mean": m["rollout/sample_tokens_mean"]}


async def _heap_kib_per_episode(manager: Any, sched: GroupScheduler, specs: list) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        batch = await sched.run(manager, specs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del batch
    return (peak - base) / len(specs) / 1024


def _row(name: str, key: str, point: int, runs: list[dict], first: list[dict] | None) -> dict:
    row = {"manager": name, key: point}
    for field in ("cpu", "framework", "validate", "wall", "cpu_sample", "turns_per_s"):
        row[field] = summary([r[field] for r in runs])
    for field in ("turns", "samples", "mean_turns", "prompt_tokens_mean", "sample_tokens_mean"):
        row[field] = runs[-1][field]
    if first is not None:
        row["x_first"] = summary([r["cpu"] / f["cpu"] for r, f in zip(runs, first, strict=True)])
    return row


async def sweep(args: argparse.Namespace, kind: str) -> list[dict]:
    """One sweep ("concurrency" or "turns_per_episode"): every repeat runs every point and every manager."""
    engine = make_engine(backend="scripted", model="tiny", max_model_len=args.max_model_len,
                         scripted={"invalid_rate": 0.2})
    meter = EngineMeter(engine)
    names = list(args.managers)
    points = list(args.concurrency if kind == "concurrency" else args.turns)

    def geometry(p: int) -> tuple[int, int, int]:  # (episodes, concurrency, turns)
        if kind == "concurrency":
            return max(args.episodes, p), p, args.concurrency_turns
        return args.length_episodes, args.length_concurrency, p

    runs: dict[tuple[str, int], list[dict]] = {(n, p): [] for n in names for p in points}
    heap: dict[tuple[str, int], float] = {}
    maxrss: dict[int, float] = {}
    async with engine, contextlib.AsyncExitStack() as stack:
        managers = {}
        for n in names:
            for p in points:
                turns = geometry(p)[2]
                if (n, turns) not in managers:
                    managers[n, turns] = await stack.enter_async_context(_entered(MANAGERS[n](engine, _config(turns))))

        def scheduler(p: int) -> GroupScheduler:
            episodes, c, _ = geometry(p)
            return GroupScheduler(ENV_ID, num_groups=max(1, episodes // 4), group_size=4, max_concurrency=c)

        warm = scheduler(points[0])
        for manager in managers.values():  # warm-up: tokenizer caches, imports, first levels
            await warm.run(manager, warm.specs(0)[:4])
        for r in range(args.repeats):
            for p in points:
                sched, turns = scheduler(p), geometry(p)[2]
                for n in _rotated(names, r):
                    runs[n, p].append(await _timed(managers[n, turns], sched, sched.specs(r + 1), meter, turns))
                maxrss[p] = _maxrss_mib()
        if args.memory:
            for p in points:  # exactly c episodes, all in flight at once
                _, c, turns = geometry(p)
                sched = GroupScheduler(ENV_ID, num_groups=-(-c // 4), group_size=min(4, c), max_concurrency=c)
                specs = sched.specs(10_000)[:c]
                for n in names:
                    heap[n, p] = await _heap_kib_per_episode(managers[n, turns], sched, specs)
    rows = []
    for p in points:
        episodes, c, turns = geometry(p)
        for n in names:
            row = _row(n, kind, p, runs[n, p], runs[n, points[0]])
            row.update(episodes=episodes, concurrency=c, turns_per_episode=turns, maxrss_mib_after=maxrss[p])
            if (n, p) in heap:
                row["heap_kib_per_episode"] = heap[n, p]
            i = points.index(p)
            if kind == "turns_per_episode" and i > 0:  # what one more turn costs, fixed per-episode costs removed
                q = points[i - 1]
                for field in ("cpu", "framework"):
                    row[f"marginal_{field}"] = summary([(a[field] * p - b[field] * q) / (p - q)
                                                        for a, b in zip(runs[n, p], runs[n, q], strict=True)])
            rows.append(row)
    return rows


# -- output --------------------------------------------------------------------------------------


def print_tables(args: argparse.Namespace, conc: list[dict], length: list[dict]) -> None:
    def heap(row: dict) -> str:
        return f"{row['heap_kib_per_episode']:.0f}" if "heap_kib_per_episode" in row else "-"

    print(f"\n{ENV_ID} (6x6 Sokoban, solving does not end the episode), scripted engine, max_tokens 32; "
          f"microseconds, median of {args.repeats} (min–max); CPU = process CPU time, excl. backend = minus "
          "the scripted backend's own CPU (its generate less BaseEngine.validate_prompt); x first = CPU ratio to the first sweep point, per repeat")
    print(f"\nconcurrency sweep: {args.episodes} episodes/repeat (at least c), {args.concurrency_turns} turns each")
    print(table(
        ["manager", "concurrency", "CPU us / turn", "excl. backend", "wall us / turn", "turns/s (wall)",
         "x c=" + str(args.concurrency[0]), "heap KiB / episode"],
        [[r["manager"], r["concurrency"], cell(r["cpu"]), cell(r["framework"]), cell(r["wall"]),
          cell(r["turns_per_s"]), cell(r["x_first"], "{:.2f}"), heap(r)] for r in conc]))
    print(f"\nlength sweep: {args.length_episodes} episodes/repeat at concurrency {args.length_concurrency}")
    print(table(
        ["manager", "turns / episode", "prompt tokens (mean)", "CPU us / turn", "excl. backend", "validate us / turn",
         "CPU us / sample", "x " + str(args.turns[0]) + " turns", "marginal CPU us / turn", "marginal excl. backend",
         "heap KiB / episode"],
        [[r["manager"], f"{r['mean_turns']:g}", f"{r['prompt_tokens_mean']:.0f}", cell(r["cpu"]),
          cell(r["framework"]), cell(r["validate"]), cell(r["cpu_sample"]), cell(r["x_first"], "{:.2f}"),
          cell(r["marginal_cpu"]) if "marginal_cpu" in r else "-",
          cell(r["marginal_framework"]) if "marginal_framework" in r else "-", heap(r)]
         for r in length]))
    print("marginal = (CPU per episode at T - at the previous T) / (T - previous T), per repeat: the cost of one "
          "more turn once the per-episode costs (level generation, the first prompt, the sample) are taken out")


def plot(path: Path, conc: list[dict], length: list[dict], names: list[str]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for ax, rows, key, title in ((axes[0], conc, "concurrency", "concurrent episodes (log)"),
                                 (axes[1], length, "turns_per_episode", "turns per episode")):
        for i, n in enumerate(names):
            mine = [r for r in rows if r["manager"] == n]
            if not mine:
                continue
            x = [r[key] for r in mine]
            med = [r["cpu"]["median"] for r in mine]
            err = [[m - r["cpu"]["min"] for m, r in zip(med, mine, strict=True)],
                   [r["cpu"]["max"] - m for m, r in zip(med, mine, strict=True)]]
            color = f"C{i}"
            ax.errorbar(x, med, yerr=err, marker="o", color=color, capsize=3, label=f"{n}")
            ax.plot(x, [r["framework"]["median"] for r in mine], ls=":", marker=".", color=color,
                    label=f"{n} excl. scripted backend")
        if key == "concurrency":
            ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r[key] for r in rows}))
        ax.set_xticklabels([str(v) for v in sorted({r[key] for r in rows})])
        ax.set_xlabel(title)
        ax.set_ylabel("CPU µs per agent turn")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].set_title("per-turn cost vs concurrency")
    axes[1].set_title("per-turn cost vs episode length")
    axes[1].legend(fontsize=8)
    fig.suptitle("arl framework CPU per turn, scripted engine, 6x6 Sokoban (median, min–max bars)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, format="png")
    print(f"wrote {path}")


def plot_path(out: Path) -> Path:
    """results/scaling.json -> results/scaling.png; a git-ignored NAME.tmp -> NAME.png.tmp."""
    return out.with_suffix(".png.tmp" if out.suffix == ".tmp" else ".png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--managers", nargs="+", default=DEFAULT_MANAGERS, choices=list(MANAGERS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--episodes", type=int, default=128,
                        help="episodes per repeat of the concurrency sweep (at least c; multiple of 4)")
    parser.add_argument("--concurrency-turns", type=int, default=10, help="turns per episode, concurrency sweep")
    parser.add_argument("--turns", type=int, nargs="+", default=[5, 10, 20, 50])
    parser.add_argument("--length-episodes", type=int, default=64, help="episodes per repeat of the length sweep")
    parser.add_argument("--length-concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=16384, help="the scripted engine's context (50 turns fit)")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the tracemalloc pass")
    parser.add_argument("--quick", action="store_true",
                        help="smoke size: concurrency 1 8, turns 5 20, 8 episodes, 1 repeat")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/scaling.json")
    args = parser.parse_args()
    if args.quick:
        args.concurrency, args.episodes, args.turns, args.length_episodes = [1, 8], 8, [5, 20], 8
        args.length_concurrency, args.repeats = 4, 1
    args.episodes = max(4, args.episodes - args.episodes % 4)
    args.length_episodes = max(4, args.length_episodes - args.length_episodes % 4)
    started = time.perf_counter()
    checkout = _git()
    register_endless()

    conc = asyncio.run(sweep(args, "concurrency"))
    conc_s = time.perf_counter() - started
    length = asyncio.run(sweep(args, "turns_per_episode"))
    length_s = time.perf_counter() - started - conc_s

    print_tables(args, conc, length)
    out = args.out or result_path("scaling", args.quick)
    png = plot_path(out)
    plot(png, conc, length, list(args.managers))
    write_result(out, args, {"git": checkout, "env": ENV_ID, "concurrency_sweep": conc, "length_sweep": length,
                             "maxrss_mib": _maxrss_mib(), "plot": str(png),
                             "sweep_wall_s": {"concurrency": conc_s, "length": length_s}}, started)


if __name__ == "__main__":
    main()
