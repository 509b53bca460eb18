"""Credit assignment: how well each advantage estimator's per-step advantages point at good actions.

    .venv/bin/python benchmarks/credit.py                  # FrozenLake 4x4, 3 geometries, full grid (~3 min on 2 cores)
    .venv/bin/python benchmarks/credit.py --game sokoban   # Sokoban 6x6 with its config (results/credit-sokoban.json)
    .venv/bin/python benchmarks/credit.py --quick          # CI smoke size (~20 s)
    .venv/bin/python benchmarks/credit.py --geometries 8x8 --settings small   # forked vs natural groups, short table

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

- step != 0: the share of rows whose step term (A - A at step weight 0) is not zero: the rows that
  get credit of their own, beyond their episode's;
- noise: the share of the advantage's variance left inside (group, state, action) cells (rows of
  cells with two or more rows): what the same action from the same state gets beyond its mean, i.e.
  the estimator's variance around the advantage it is estimating.

Forked anchor groups (`rollout.manager.fork`, arl/rollout/fork.py) stand beside GiGPO's natural
ones at an equal engine-token budget: each batch first plays the config's G x N episodes and counts
what they cost the engine (prompt tokens once per request, n=K included, plus every generated
token); each forked arm then plays the same G levels one member per group at a time (member m plays
as member m of the natural batch: same request seeds) until it has spent that budget, to the nearest
round. The arms table gives each arm's episodes, training rows, engine tokens and anchor groups
(mean rows per group, the share of singleton groups, the share of rows in them); GRPO does not read
forked rows, so forked arms run the GiGPO settings only.

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
    for norm in ("mean_norm", "mean_std_norm"):
        for gamma in gammas:
            for w in weights:
                out[f"gigpo {norm} gamma={gamma} w={w:g}"] = {
                    "estimator": "gigpo", "norm": norm, "gamma": gamma, "step_weight": w}
        # verl-agent's GiGPO (episode statistics over step rows, singleton groups pass R through)
        out[f"gigpo {norm} gamma={gammas[0]} w={weights[0]:g} verl-agent"] = {
            "estimator": "gigpo", "norm": norm, "gamma": gammas[0], "step_weight": weights[0],
            "episode_stats": "steps", "singleton": "raw"}
    return out


def fork_arms(grid: str) -> dict[str, dict[str, Any]]:
    """Forked arm name -> `ForkConfig` keyword arguments."""
    arms: dict[str, dict[str, Any]] = {"fork k=4 at first": {"k": 4, "at": "first", "states": 1}}
    if grid == "full":
        arms["fork k=8 at first"] = {"k": 8, "at": "first", "states": 1}
        arms["fork k=4 first 3"] = {"k": 4, "at": "first", "states": 3}
    arms["fork k=4 first 3, horizon 3"] = {"k": 4, "at": "first", "states": 3, "horizon": 3}
    arms["fork k=2 every, horizon 3"] = {"k": 2, "at": "every", "horizon": 3}
    return arms


def settings_of(spec: dict[str, Any], **changes: Any) -> Any:
    import types

    fields = {k: v for k, v in spec.items() if k not in ("estimator", "norm")}
    return types.SimpleNamespace(**{**fields, "gigpo_norm": spec.get("norm"), **changes})


def noise_share(adv: np.ndarray, cells: list[tuple[Any, ...]]) -> float:
    """The share of the variance of ``adv`` left inside its cells (rows of cells with >= 2 rows)."""
    rows: dict[tuple[Any, ...], list[int]] = collections.defaultdict(list)
    for i, key in enumerate(cells):
        rows[key].append(i)
    shared = [np.asarray(r) for r in rows.values() if len(r) > 1]
    if not shared:
        return float("nan")
    values = np.concatenate([adv[r] for r in shared])
    within = sum(float(((adv[r] - adv[r].mean()) ** 2).sum()) for r in shared)
    total = float(((values - values.mean()) ** 2).sum())
    return within / total if total > 0 else float("nan")


def scores(samples: list[Any], label: np.ndarray, actions: np.ndarray, spec: dict[str, Any]) -> dict[str, float]:
    from arl.algo.estimators import estimate

    adv, _ = estimate(spec["estimator"], samples, settings_of(spec))
    per_action = {a: adv[actions == a].mean() for a in set(actions)}
    action_part = np.array([per_action[a] for a in actions])
    resid = adv - action_part
    step_nonzero = float("nan")
    if spec["estimator"] == "gigpo":
        episode_term, _ = estimate("gigpo", samples, settings_of(spec, step_weight=0.0))
        step_nonzero = float(np.mean(np.abs(adv - episode_term) > 1e-12))
    cells = [(s.group_id, s.state_key, a) for s, a in zip(samples, actions, strict=True)]
    return {"corr": float(np.corrcoef(adv, label)[0, 1]),
            "corr_given_action": float(np.corrcoef(resid, label)[0, 1]),
            "action_share": float(action_part.var() / adv.var()) if adv.var() > 0 else float("nan"),
            "step_nonzero": step_nonzero, "noise": noise_share(adv, cells)}


class CountedEngine:
    """An engine that counts what its requests cost: prompt tokens once per request (an n=K request
    prefills its prompt once) and every generated token. Everything else is the engine's."""

    def __init__(self, engine: Any) -> None:
        self._engine, self.tokens, self.requests = engine, 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, prompt_ids: Any, params: Any = None) -> Any:
        out = await self._engine.generate(prompt_ids, params)
        self.requests += 1
        self.tokens += len(prompt_ids) + sum(len(g.token_ids) for g in (out if isinstance(out, list) else [out]))
        return out


async def play_within(scheduler: Any, manager: Any, engine: CountedEngine, specs: list[Any], budget: int,
                      max_members: int) -> tuple[list[Any], int]:
    """Episodes of ``specs``' groups, member-major (member 0 of every group, then member 1, ...; member
    m plays as the natural batch's member m), until ``budget`` engine tokens are spent, to the
    nearest episode."""
    from arl.rollout import EpisodeSpec

    levels = list({s.group_id: s for s in specs}.values())
    episodes: list[Any] = []
    start = engine.tokens
    for m in range(max_members):
        for level in levels:
            spent = engine.tokens - start
            if episodes and spent + spent / len(episodes) / 2 >= budget:  # one more would overshoot more than stopping misses
                return episodes, spent
            spec = EpisodeSpec(level.env_id, level.seed, level.group_id, m, level.tag)
            episodes += (await scheduler.run(manager, [spec])).episodes
    return episodes, engine.tokens - start


def arm_rows(episodes: list[Any], optimal: Any) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """An arm's training rows (with a response token), each one's optimal-action label and action."""
    samples = [s for e in episodes for s in e.samples if s.num_response_tokens > 0]
    turn_of = {}
    for e in episodes:
        traj = e.trajectory
        turn_of.update({(traj.traj_id, t): turn for t, turn in enumerate(traj.turns)})
        turn_of.update({(b.traj_id, b.step): b.turns[0] for b in traj.branches})  # a branch's forked action
    steps = [turn_of[(s.traj_id, s.step)] for s in samples]
    label = np.array([float(t.action in optimal(t.observation)) for t in steps])
    return samples, label, np.array([str(t.action) for t in steps])


async def measure(game: str, groups: int, group_size: int, batches: int, grid: str) -> dict[str, Any]:
    import attrs

    from arl.algo.estimators import estimate
    from arl.config import ForkConfig, load_config
    from arl.engine import make_engine
    from arl.rollout.factory import close_manager, make_manager, make_scheduler

    config_path, optimal = GAMES[game]
    config = load_config(config_path, [f"rollout.num_groups={groups}", f"rollout.group_size={group_size}"])
    raw = make_engine(backend="scripted", model=config.model, max_model_len=config.engine.max_model_len)
    engine = CountedEngine(raw)
    per: dict[str, dict[str, list[dict[str, float]]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    arms: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    # RL training's batches of this config: its manager, groups and level seeds; then the forked arms
    natural, scheduler = make_manager(engine, config.rollout), make_scheduler(config.rollout, config.seed)
    managers = {"natural": natural} | {
        name: make_manager(engine, attrs.evolve(config.rollout, manager=attrs.evolve(
            config.rollout.manager, fork=ForkConfig(**kwargs)))) for name, kwargs in fork_arms(grid).items()}
    gigpo_specs = {name: spec for name, spec in estimators(grid).items() if spec["estimator"] == "gigpo"}
    async with raw:
        try:
            for b in range(batches):
                specs = scheduler.specs(b)
                before = engine.tokens
                played = {"natural": ((await scheduler.run(natural, specs)).episodes, engine.tokens - before)}
                for name, manager in managers.items():
                    if name != "natural":
                        played[name] = await play_within(scheduler, manager, engine, specs, played["natural"][1],
                                                         max_members=8 * group_size)
                for name, (episodes, tokens) in played.items():
                    samples, label, actions = arm_rows(episodes, optimal)
                    _, anchor = estimate("gigpo", samples, settings_of(next(iter(gigpo_specs.values()))))
                    arms[name].append({
                        "episodes": float(len(episodes)), "rows": float(len(samples)), "engine_tokens": float(tokens),
                        "anchor_size": anchor["gigpo_anchor_group_size_mean"],
                        "singleton_frac": anchor["gigpo_anchor_singleton_frac"],
                        "singleton_row_frac": anchor["gigpo_anchor_singleton_row_frac"],
                        "fork_groups": anchor.get("gigpo_fork_groups", 0.0)})
                    for est, spec in (estimators(grid) if name == "natural" else gigpo_specs).items():
                        per[name][est].append(scores(samples, label, actions, spec))
        finally:
            for manager in managers.values():
                await close_manager(manager)

    def columns(rows: list[dict[str, float]]) -> dict[str, list[float]]:
        return {k: [r[k] for r in rows] for k in rows[0]}

    return {"game": game, "config": str(config_path), "groups": groups, "group_size": group_size,
            "samples_per_batch": statistics.median(arms["natural"][i]["rows"] for i in range(batches)),
            "estimators": {est: columns(rows) for est, rows in per["natural"].items()},
            "arms": {name: {"fork": fork_arms(grid).get(name), "batch": columns(arms[name]),
                            "estimators": {est: columns(rows) for est, rows in per[name].items()}}
                     for name in managers}}


def fmt(xs: list[float], digits: int = 3) -> str:
    xs = [x for x in xs if x == x]  # NaN: not defined for that batch (e.g. no step term in GRPO)
    if not xs:
        return "–"
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{min(digits, 2)}f}–{max(xs):.{min(digits, 2)}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=list(GAMES), default="frozenlake")
    parser.add_argument("--geometries", nargs="+", default=["4x16", "8x8", "16x4"],
                        help="groups x episodes per batch, e.g. 8x8")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--settings", choices=["small", "full"], default=None,
                        help="estimator settings and forked arms: small (one GiGPO setting per norm, 3 forked arms) "
                             "or full (all of them, 5 forked arms; the default, --quick: small)")
    parser.add_argument("--quick", action="store_true", help="smoke size: 8x8, 2 batches, one GiGPO setting per norm")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/credit.json")
    args = parser.parse_args()
    if args.quick:
        args.geometries, args.batches = ["8x8"], 2
    grid = args.settings or ("small" if args.quick else "full")
    started = time.perf_counter()
    results = []
    for geometry in args.geometries:
        g, n = (int(x) for x in geometry.split("x"))
        results.append(asyncio.run(measure(args.game, g, n, args.batches, grid)))
    for r in results:
        print(f"\n{r['game']}, {r['groups']} groups x {r['group_size']} episodes ({r['samples_per_batch']:.0f} step samples per "
              f"batch), median of {args.batches} batches (min–max); forked arms at the natural batch's engine tokens\n")
        print(table(["arm", "episodes", "train rows", "engine tokens", "fork groups", "anchor group size",
                     "singleton groups", "rows in singletons"],
                    [[name, fmt(a["batch"]["episodes"], 0), fmt(a["batch"]["rows"], 0), fmt(a["batch"]["engine_tokens"], 0),
                      fmt(a["batch"]["fork_groups"], 0), fmt(a["batch"]["anchor_size"], 2), fmt(a["batch"]["singleton_frac"], 2),
                      fmt(a["batch"]["singleton_row_frac"], 2)] for name, a in r["arms"].items()]))
        print()
        rows = [(arm, est, v) for arm, a in r["arms"].items()
                for est, v in sorted(a["estimators"].items(), key=lambda kv: -statistics.median(kv[1]["corr_given_action"]))]
        print(table(["arm", "estimator", "corr", "corr given action", "action share", "step != 0", "noise"],
                    [[arm, est, fmt(v["corr"]), fmt(v["corr_given_action"]), fmt(v["action_share"]),
                      fmt(v["step_nonzero"], 2), fmt(v["noise"], 2)] for arm, est, v in rows]))
    name = "credit" if args.game == "frozenlake" else f"credit-{args.game}"
    write_result(args.out or result_path(name, args.quick), args, {"game": args.game, "geometries": results}, started)


if __name__ == "__main__":
    main()
