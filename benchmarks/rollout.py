"""Rollout efficiency with a real engine: generated tokens/s of a full rollout batch through each
env manager vs the raw engine generating the same number of tokens in one batch.

    .venv/bin/python benchmarks/rollout.py                          # vllm backend, every manager (~4 min on 2 cores)
    .venv/bin/python benchmarks/rollout.py --backends vllm vllm-async hf
    .venv/bin/python benchmarks/rollout.py --quick                  # CI smoke size (vllm, ~40 s)

Per backend, one engine on the tiny model serves every run. The managers (`--managers`: traj,
step, proxy-inprocess, proxy-http) come from arl's rollout factory (`_util.manager_for`; the proxy
ones run GymRunner with the "traj" tracker). Each repeat plays, for every manager in turn, one
rollout batch (`--groups` x `--group-size` Sokoban episodes, all concurrent, sampling at
temperature 1 with `--max-tokens` per call) and counts the tokens the engine generated (every
response token of every turn); then the raw engine generates the same number of tokens in one
batch: as many concurrent requests as the batch had episodes, each `ignore_eos` for an equal share
of the tokens, on a first-turn prompt of the same game. The figure is the ratio
(manager tokens/s) / (raw tokens/s), computed per repeat against that repeat's raw run (the two
run back to back, so load drift on a shared machine hits both) and reported as the median over
repeats with its spread. "ratio (CPU)" is the same ratio in tokens per process CPU-second (the
engine's threads included; not for vllm-async, whose engine core is another process): on a
shared machine it is steadier, but it does not see the engine idling while the envs step.

"vs replay": the rollout's tokens/s over the engine's when it gets every turn of that same batch
(each turn's exact prompt, ignore_eos for that turn's response length) at once, prefix cache
reset before each: the same prefill and decode work without the turn-by-turn dependency, so
what is left is the sequencing (a turn waits for the previous one and for the env) plus the
framework. The raw ratio also charges the multi-turn prefill (each turn's prompt) to the rollout.

"engine steps (busy)": for the in-process vllm backend, the engine steps (scheduler iterations) the
rollout and its replay took, and the share of their wall time the engine spent stepping
(`engine.engine_stats()`). A busy share near 100% says the engine bounded the run; then the step
count is what separates rollout from replay: an episode of T turns of up to M tokens needs about
T x (M + 1) steps one after another (a turn cannot start before the previous one ends), however
wide the batch, while the replay needs about M + 1 steps per batch its token budget allows.

What the ratio charges to the rollout: the env steps, prompt building and tokenization between
turns, the prefill of each turn's new tokens, and the tail of the batch (episodes that finish at
different times leave the engine with fewer concurrent sequences). The raw batch has one prefill
and a full batch to the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _util import MANAGER_MODES, cell, manager_for, quiet_logs, result_path, summary, table, write_result  # noqa: E402

quiet_logs()

from arl.config import ManagerConfig  # noqa: E402
from arl.engine import SamplingParams, make_engine  # noqa: E402
from arl.rollout import GroupScheduler  # noqa: E402
from arl.rollout.factory import close_manager  # noqa: E402

ENV_ID = "arl/Sokoban-v0"


async def _replay(engine: Any, batch: Any, seed: int) -> tuple[float, int]:
    """Every turn of the batch (its prompt, its response length) sent to the engine at once."""
    turns = [t for e in batch.episodes for t in e.trajectory.turns if t.response_ids]
    params = [SamplingParams(max_tokens=len(t.response_ids), ignore_eos=True, seed=seed + i)
              for i, t in enumerate(turns)]
    _reset_cache(engine)
    before = engine.engine_stats()
    start = time.perf_counter()
    gens = await asyncio.gather(*[engine.generate(list(t.prompt_ids), p) for t, p in zip(turns, params, strict=True)])
    wall = time.perf_counter() - start
    return wall, sum(len(g.token_ids) for g in gens), _engine_work(engine, before, wall)


def _engine_work(engine: Any, before: dict[str, float] | None, wall: float) -> dict[str, float]:
    """Engine steps taken since ``before`` and the share of ``wall`` spent in them (in-process vLLM)."""
    if before is None:
        return {}
    after = engine.engine_stats()
    return {"steps": after["engine_steps"] - before["engine_steps"],
            "busy": (after["engine_busy_s"] - before["engine_busy_s"]) / wall}


def _reset_cache(engine: Any) -> None:
    if hasattr(engine, "reset_prefix_cache"):
        engine.reset_prefix_cache()


def _tokens(batch: Any) -> int:
    return sum(len(t.response_ids) for e in batch.episodes for t in e.trajectory.turns)


async def _raw(engine: Any, prompt: list[int], requests: int, tokens: int, seed: int) -> tuple[float, float, int]:
    per = max(1, round(tokens / requests))
    params = [SamplingParams(max_tokens=per, ignore_eos=True, seed=seed + i) for i in range(requests)]
    start, cpu = time.perf_counter(), time.process_time()
    gens = await asyncio.gather(*[engine.generate(prompt, p) for p in params])
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return wall, cpu, sum(len(g.token_ids) for g in gens)


async def bench_backend(backend: str, args: argparse.Namespace) -> dict:
    from arl.envs.prompts import traj_messages_start
    from arl.envs.text import TextEnv
    from arl.rollout.base import chat_ids

    t0 = time.perf_counter()
    engine = make_engine(backend=backend, model="tiny", max_model_len=2048, kv_cache_memory_bytes=256 * 2**20)
    startup = time.perf_counter() - t0
    config = ManagerConfig(max_tokens=args.max_tokens, max_turns=args.max_turns)
    n_episodes = args.groups * args.group_size
    runs: dict[str, dict[str, list[float]]] = {}
    async with engine:
        env = TextEnv(ENV_ID)
        obs, _ = env.reset(seed=0)
        limit = min(x for x in (args.max_turns, env.max_steps) if x is not None)
        prompt = chat_ids(engine.tokenizer, traj_messages_start(obs, limit, args.max_tokens, env.instructions))
        managers = {name: manager_for(name, engine, config) for name in args.managers}
        sched = GroupScheduler(ENV_ID, num_groups=args.groups, group_size=args.group_size,
                               max_concurrency=n_episodes)
        # warm-up: every manager once on a small batch, and the raw path
        for manager in managers.values():
            await sched.run(manager, sched.specs(10_000)[: args.group_size])
        await _raw(engine, prompt, 2, 8, seed=0)
        for r in range(args.repeats):
            for name, manager in managers.items():
                _reset_cache(engine)
                before = engine.engine_stats()
                start, cpu = time.perf_counter(), time.process_time()
                batch = await sched.run(manager, sched.specs(r))
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                work = _engine_work(engine, before, wall)
                tokens = _tokens(batch)
                raw_wall, raw_cpu, raw_tokens = await _raw(engine, prompt, n_episodes, tokens, seed=1000 * r)
                tps, raw_tps = tokens / wall, raw_tokens / raw_wall
                replay_wall, replay_tokens, replay_work = (await _replay(engine, batch, seed=1000 * r) if args.replay
                                                           else (1, 0, {}))
                rec = runs.setdefault(name, {"tok_s": [], "raw_tok_s": [], "ratio": [], "cpu_ratio": [],
                                             "tokens": [], "turns": [], "wall_s": [], "replay_ratio": [],
                                             "steps": [], "busy": [], "replay_steps": [], "replay_busy": []})
                if work:
                    rec["steps"].append(work["steps"])
                    rec["busy"].append(work["busy"])
                if replay_work:
                    rec["replay_steps"].append(replay_work["steps"])
                    rec["replay_busy"].append(replay_work["busy"])
                rec["replay_ratio"].append(tps / (replay_tokens / replay_wall) if replay_tokens else float("nan"))
                rec["tok_s"].append(tps)
                rec["raw_tok_s"].append(raw_tps)
                rec["ratio"].append(tps / raw_tps)
                rec["cpu_ratio"].append((tokens / cpu) / (raw_tokens / raw_cpu))
                rec["tokens"].append(tokens)
                rec["turns"].append(batch.metrics["rollout/num_turns"])
                rec["wall_s"].append(wall)
                print(f"  {backend} {name} repeat {r}: {tokens} tokens in {wall:.2f} s = {tps:.0f} tok/s; "
                      f"raw {raw_tokens} in {raw_wall:.2f} s = {raw_tps:.0f} tok/s; ratio {tps / raw_tps:.2f}; "
                      f"vs replay {rec['replay_ratio'][-1]:.2f}",
                      flush=True)
        for manager in managers.values():
            await close_manager(manager)
    rows = []
    for name, rec in runs.items():
        rows.append({"backend": backend, "manager": name, "tok_s": summary(rec["tok_s"]),
                     "raw_tok_s": summary(rec["raw_tok_s"]), "ratio": summary(rec["ratio"]), "cpu_ratio": summary(rec["cpu_ratio"]),
                     "replay_ratio": summary(rec["replay_ratio"]),
                     "tokens": statistics.median(rec["tokens"]), "turns": statistics.median(rec["turns"]),
                     "wall_s": summary(rec["wall_s"]), "episodes": n_episodes,
                     **{k: summary(rec[k]) for k in ("steps", "busy", "replay_steps", "replay_busy") if rec[k]}})
    return {"backend": backend, "startup_s": startup, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["vllm"], choices=["vllm", "vllm-async", "hf"])
    parser.add_argument("--managers", nargs="+", default=list(MANAGER_MODES), choices=list(MANAGER_MODES))
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-replay", dest="replay", action="store_false")
    parser.add_argument("--quick", action="store_true", help="smoke size: vllm, 2x2 episodes, 2 turns, 1 repeat")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/rollout.json")
    args = parser.parse_args()
    if args.quick:
        args.groups, args.group_size, args.max_tokens, args.max_turns, args.repeats = 2, 2, 8, 2, 1
    started = time.perf_counter()
    results = [asyncio.run(bench_backend(b, args)) for b in args.backends]
    print(f"\ntiny model, {ENV_ID}, {args.groups}x{args.group_size} episodes per batch (all concurrent), "
          f"<= {args.max_turns} turns, max_tokens {args.max_tokens}, temperature 1; "
          f"median of {args.repeats} (min–max)")
    rows = []
    for res in results:
        for row in res["rows"]:
            rows.append([row["backend"], row["manager"], f"{row['tokens']:.0f}", f"{row['turns']:.0f}",
                         cell(row["tok_s"]), cell(row["raw_tok_s"]), cell(row["ratio"], "{:.2f}"),
                         cell(row["cpu_ratio"], "{:.2f}") if row["backend"] != "vllm-async" else "-",
                         cell(row["replay_ratio"], "{:.2f}") if args.replay else "-",
                         _steps_cell(row)])
    print(table(["backend", "manager", "tokens/batch", "turns/batch", "rollout tok/s", "raw engine tok/s",
                 "ratio (wall)", "ratio (CPU)", "vs replay (wall)", "engine steps (busy): rollout / replay"], rows))
    out = args.out or result_path("rollout", args.quick)
    png = out.with_suffix(".png")
    plot(png, results)
    write_result(out, args, {"results": results, "plot": str(png)}, started)


def _steps_cell(row: dict[str, Any]) -> str:
    """Median engine steps and busy share of the rollout and of its replay (in-process vLLM only)."""
    if "steps" not in row:
        return "-"
    text = f"{row['steps']['median']:.0f} ({row['busy']['median']:.0%})"
    if "replay_steps" in row:
        text += f" / {row['replay_steps']['median']:.0f} ({row['replay_busy']['median']:.0%})"
    return text


def plot(path: Path, results: list[dict[str, Any]]) -> None:
    """Bars: the rollout / raw-engine ratio (median, min-max whiskers) per manager, one colour per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    managers = list(dict.fromkeys(row["manager"] for res in results for row in res["rows"]))
    width = 0.8 / max(len(results), 1)
    fig, ax = plt.subplots(figsize=(8, 4))
    for k, res in enumerate(results):
        rows = {row["manager"]: row["ratio"] for row in res["rows"]}
        xs = [i + (k - (len(results) - 1) / 2) * width for i, m in enumerate(managers) if m in rows]
        med = [rows[m]["median"] for m in managers if m in rows]
        err = [[rows[m]["median"] - rows[m]["min"] for m in managers if m in rows],
               [rows[m]["max"] - rows[m]["median"] for m in managers if m in rows]]
        ax.bar(xs, med, width, yerr=err, capsize=3, label=res["backend"])
    ax.axhline(0.9, color="k", linestyle="--", linewidth=1, label="goal 0.9")
    ax.set_xticks(range(len(managers)), managers)
    ax.set_ylabel("rollout tok/s / raw engine tok/s")
    ax.set_ylim(0, 1.05)
    ax.set_title("Full-rollout throughput vs the raw engine (tiny model, CPU)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
