"""Credit assignment: how well each advantage estimator's per-step advantages point at good actions.

    .venv/bin/python benchmarks/credit.py                  # FrozenLake 4x4, 3 geometries, full grid (~3 min on 2 cores)
    .venv/bin/python benchmarks/credit.py --game sokoban   # Sokoban 6x6 with its config (results/credit-sokoban.json)
    .venv/bin/python benchmarks/credit.py --quick          # CI smoke size (~20 s)

The learning curves take hours on a CPU; this asks a cheaper question that explains much of them.
Episodes are played with the scripted engine answering uniformly random valid actions (the policy
right after the format warm-start), through the game's step manager and prompts (FrozenLake:
configs/tiny_frozenlake_gigpo.yaml, Sokoban: configs/tiny_sokoban_gigpo.yaml; geometry G groups x
N episodes per batch). Every step's action is labelled "optimal" when it starts a shortest path
to the goal (FrozenLake: BFS on the grid it saw) or a shortest solution (Sokoban: BFS over player
and box positions; a state with no solution has no optimal action).
Each estimator's advantages of the batch are then compared with that label:

- corr: Pearson correlation of the advantage with the optimal-action indicator, per batch;
- corr given action: the same after subtracting, per action word, the batch's mean advantage of that
  action: the state-conditional part, what a policy can only learn by reading the grid;
- action share: the share of the advantage's variance explained by the action word alone. Which
  action is good depends on the map, so with few maps per batch this part swings from batch to
  batch and pushes a global action bias (the failure mode seen with 4 groups x 16 in issue 5).

Median over `--batches` batches (min-max).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _util import quiet_logs, result_path, table, write_result  # noqa: E402

quiet_logs()

REPO = Path(__file__).resolve().parent.parent
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def optimal_actions(grid: str) -> set[str]:
    """The moves that start a shortest safe path from the player (P) to the goal (G)."""
    rows = grid.split("\n")
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    player = next((rc for rc, ch in cells.items() if ch == "P"), None)
    goal = next((rc for rc, ch in cells.items() if ch == "G"), None)
    if player is None or goal is None:
        return set()
    dist, queue = {goal: 0}, collections.deque([goal])
    while queue:  # BFS from the goal over the cells that are not holes
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if nxt in cells and nxt not in dist and cells[nxt] != "O":
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    reach = {a: dist.get((player[0] + dr, player[1] + dc)) for a, (dr, dc) in MOVES.items()}
    best = min((d for d in reach.values() if d is not None), default=None)
    return {a for a, d in reach.items() if d is not None and d == best}


def sokoban_optimal_actions(grid: str) -> set[str]:
    """The moves that start a shortest solution (BFS over player and box positions, push rules
    as in arl's Sokoban: a box moves when the cell behind it is floor or a target)."""
    cells = {(r, c): ch for r, row in enumerate(grid.split("\n")) for c, ch in enumerate(row)}
    walls = {rc for rc, ch in cells.items() if ch == "#"}
    targets = {rc for rc, ch in cells.items() if ch in "O√S"}
    boxes = frozenset(rc for rc, ch in cells.items() if ch in "X√")
    player = next((rc for rc, ch in cells.items() if ch in "PS"), None)
    if player is None or not boxes:
        return set()

    def move(state: tuple, delta: tuple[int, int]) -> tuple:
        (pr, pc), bx = state
        nxt = (pr + delta[0], pc + delta[1])
        if nxt in walls or nxt not in cells:
            return state
        if nxt in bx:
            behind = (nxt[0] + delta[0], nxt[1] + delta[1])
            if behind in walls or behind in bx or behind not in cells:
                return state
            bx = (bx - {nxt}) | {behind}
        return (nxt, frozenset(bx))

    def solution_length(start: tuple, limit: int = 20_000) -> int | None:
        seen, queue = {start: 0}, collections.deque([start])
        while queue and len(seen) < limit:
            state = queue.popleft()
            if state[1] <= targets:
                return seen[state]
            for delta in MOVES.values():
                nxt = move(state, delta)
                if nxt not in seen:
                    seen[nxt] = seen[state] + 1
                    queue.append(nxt)
        return None

    start = (player, boxes)
    best = solution_length(start)
    if best is None or best == 0:
        return set()
    return {a for a, delta in MOVES.items()
            if (n := move(start, delta)) != start and solution_length(n) == best - 1}


GAMES = {"frozenlake": (REPO / "configs" / "tiny_frozenlake_gigpo.yaml", optimal_actions),
         "sokoban": (REPO / "configs" / "tiny_sokoban_gigpo.yaml", sokoban_optimal_actions)}


def estimators(grid: str) -> dict[str, dict[str, Any]]:
    """name -> gigpo/grpo keyword arguments. grid: 'small' (CI) or 'full'."""
    out: dict[str, dict[str, Any]] = {"grpo": {"estimator": "grpo"}}
    gammas, weights = ((0.5,), (10.0,)) if grid == "small" else ((0.5, 0.95), (1.0, 3.0, 10.0))
    for mode in ("mean_norm", "mean_std_norm"):
        for gamma in gammas:
            for w in weights:
                out[f"gigpo {mode} gamma={gamma} w={w:g}"] = {
                    "estimator": "gigpo", "mode": mode, "gamma": gamma, "step_weight": w}
        # verl-agent's GiGPO (episode statistics over step rows, singleton groups pass R through)
        out[f"gigpo {mode} gamma={gammas[0]} w={weights[0]:g} verl-agent"] = {
            "estimator": "gigpo", "mode": mode, "gamma": gammas[0], "step_weight": weights[0],
            "episode_stats": "steps", "singleton": "raw"}
    return out


def scores(samples: list[Any], label: np.ndarray, actions: np.ndarray, spec: dict[str, Any]) -> dict[str, float]:
    import types

    from arl.algo.estimators import estimate

    settings = types.SimpleNamespace(**{k: v for k, v in spec.items() if k not in ("estimator", "mode")},
                                     gigpo_mode=spec.get("mode"))
    adv, _ = estimate(spec["estimator"], samples, settings)
    per_action = {a: adv[actions == a].mean() for a in set(actions)}
    action_part = np.array([per_action[a] for a in actions])
    resid = adv - action_part
    return {"corr": float(np.corrcoef(adv, label)[0, 1]),
            "corr_given_action": float(np.corrcoef(resid, label)[0, 1]),
            "action_share": float(action_part.var() / adv.var()) if adv.var() > 0 else float("nan")}


async def measure(game: str, groups: int, group_size: int, batches: int, grid: str) -> dict[str, Any]:
    from arl.config import load_config
    from arl.engine import make_engine
    from arl.rollout.factory import close_manager, make_manager, make_scheduler

    config_path, optimal = GAMES[game]
    config = load_config(config_path, [f"rollout.num_groups={groups}", f"rollout.group_size={group_size}"])
    engine = make_engine(backend="scripted", model=config.model, max_model_len=config.engine.max_model_len)
    per: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    turns = []
    # RL training's batches of this config: its manager, groups and level seeds
    manager, scheduler = make_manager(engine, config.rollout), make_scheduler(config.rollout, config.seed)
    async with engine:
        try:
            for b in range(batches):
                batch = await scheduler.run(manager, scheduler.specs(b))
                samples = [s for s in batch.samples if s.num_response_tokens > 0]
                by_id = {e.trajectory.traj_id: e.trajectory for e in batch.episodes}
                steps = [by_id[s.traj_id].turns[s.step] for s in samples]
                label = np.array([float(t.action in optimal(t.observation)) for t in steps])
                actions = np.array([str(t.action) for t in steps])
                turns.append(len(samples))
                for name, spec in estimators(grid).items():
                    per[name].append(scores(samples, label, actions, spec))
        finally:
            await close_manager(manager)
    return {"game": game, "config": str(config_path), "groups": groups, "group_size": group_size,
            "samples_per_batch": statistics.median(turns),
            "estimators": {name: {k: [r[k] for r in rows] for k in rows[0]} for name, rows in per.items()}}


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.2f}–{max(xs):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=list(GAMES), default="frozenlake")
    parser.add_argument("--geometries", nargs="+", default=["4x16", "8x8", "16x4"],
                        help="groups x episodes per batch, e.g. 8x8")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="smoke size: 8x8, 2 batches, one GiGPO setting per mode")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/credit.json")
    args = parser.parse_args()
    if args.quick:
        args.geometries, args.batches = ["8x8"], 2
    grid = "small" if args.quick else "full"
    started = time.perf_counter()
    results = []
    for geometry in args.geometries:
        g, n = (int(x) for x in geometry.split("x"))
        results.append(asyncio.run(measure(args.game, g, n, args.batches, grid)))
    for r in results:
        print(f"\n{r['game']}, {r['groups']} groups x {r['group_size']} episodes ({r['samples_per_batch']:.0f} step samples per "
              f"batch), median of {args.batches} batches (min–max)\n")
        rows = sorted(r["estimators"].items(), key=lambda kv: -statistics.median(kv[1]["corr_given_action"]))
        print(table(["estimator", "corr", "corr given action", "action share"],
                    [[name, fmt(v["corr"]), fmt(v["corr_given_action"]), fmt(v["action_share"])]
                     for name, v in rows]))
    name = "credit" if args.game == "frozenlake" else f"credit-{args.game}"
    write_result(args.out or result_path(name, args.quick), args, {"game": args.game, "geometries": results}, started)


if __name__ == "__main__":
    main()
