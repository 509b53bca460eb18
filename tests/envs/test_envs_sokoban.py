"""Sokoban: solvability by an independent solver, rewards on hand-made levels, level variety."""

from __future__ import annotations

import statistics
import time

import gymnasium as gym
import numpy as np
import pytest

from arl.envs import ENV_SPECS, SokobanEnv, register_envs
from arl.envs.sokoban import VOCABULARIES

register_envs()

MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


def parse_level(text: str, symbols: str = "#_O√XPS"):
    """(walls, targets, boxes, player) from grid text; independent of the env's internals."""
    wall, _empty, target, box_on, box, player, player_on = symbols
    walls, targets, boxes, players = set(), set(), set(), []
    for r, row in enumerate(text.split("\n")):
        for c, ch in enumerate(row):
            if ch == wall:
                walls.add((r, c))
            if ch in (target, box_on, player_on):
                targets.add((r, c))
            if ch in (box, box_on):
                boxes.add((r, c))
            if ch in (player, player_on):
                players.append((r, c))
    assert len(players) == 1, text
    return frozenset(walls), frozenset(targets), frozenset(boxes), players[0]


def bfs_solution_length(text: str, limit: int, symbols: str = "#_O√XPS") -> int | None:
    """Fewest moves that put every box on a target, or None if more than `limit` are needed."""
    walls, targets, boxes, player = parse_level(text, symbols)
    if boxes <= targets:
        return 0
    frontier, seen = [(player, boxes)], {(player, boxes)}
    for depth in range(1, limit + 1):
        nxt = []
        for (r, c), bx in frontier:
            for dr, dc in MOVES.values():
                q = (r + dr, c + dc)
                if q in walls:
                    continue
                if q in bx:
                    b = (q[0] + dr, q[1] + dc)
                    if b in walls or b in bx:
                        continue
                    bx2 = (bx - {q}) | {b}
                    if bx2 <= targets:
                        return depth
                else:
                    bx2 = bx
                state = (q, bx2)
                if state not in seen:
                    seen.add(state)
                    nxt.append(state)
        frontier = nxt
    return None


SOKOBAN_IDS = [i for i in ENV_SPECS if "Sokoban" in i]


@pytest.mark.parametrize("env_id", SOKOBAN_IDS)
def test_levels_solvable_within_step_limit_and_distinct(env_id):
    env = gym.make(env_id)
    limit = env.spec.max_episode_steps
    symbols = env.unwrapped.symbols
    lengths, levels = [], set()
    for seed in range(200):
        env.reset(seed=seed)
        text = env.unwrapped.grid_text()
        levels.add(text)
        n = bfs_solution_length(text, limit, symbols)
        assert n is not None, f"{env_id} seed {seed} not solvable in {limit} moves:\n{text}"
        assert n >= 1, f"{env_id} seed {seed} starts solved"
        lengths.append(n)
    # Not all trivial: some levels need several moves.
    assert max(lengths) >= min(limit, 6)
    assert len(levels) >= 190, f"only {len(levels)} distinct levels out of 200"


def test_reset_is_fast():
    env = gym.make("arl/Sokoban-v0")
    times = []
    for seed in range(100):
        t0 = time.perf_counter()
        env.reset(seed=seed)
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.025  # requirement: well under 50 ms


# ---------------------------------------------------------------------- hand-made levels
ONE_BOX = "#####\n#P__#\n#X__#\n#O__#\n#####"


def make(level: str, **kwargs) -> SokobanEnv:
    rows = level.split("\n")
    env = SokobanEnv(dim_room=(len(rows), len(rows[0])), max_steps=None, **kwargs)
    env.reset(seed=0, options={"level": level})
    return env


def play(env: SokobanEnv, names: list[str]):
    return [env.step(env.action_names.index(n)) for n in names]


def test_solve_pays_11_minus_point1_k():
    # Player steps right, then pushes the box down twice onto the target: k = 3 moves.
    env = make("######\n#P___#\n#_X__#\n#____#\n#_O__#\n######")
    results = play(env, ["Right", "Down", "Down"])
    rewards = [r[1] for r in results]
    assert rewards == pytest.approx([-0.1, -0.1, 10.9])  # -0.1 + 1 (onto target) + 10 (solved)
    assert sum(rewards) == pytest.approx(11 - 0.1 * 3)
    _obs, _, terminated, truncated, info = results[-1]
    assert terminated and not truncated and info["success"] and info["action_effective"]
    assert "√" in env.grid_text() and "X" not in env.grid_text()
    assert [r[2] for r in results[:-1]] == [False, False]


def test_shortest_plan_total_on_bigger_level():
    env = make("#######\n#P____#\n#_X___#\n#_____#\n#__O__#\n#######")
    plan = shortest_plan(env.grid_text())
    results = play(env, plan)
    assert results[-1][2] is True and all(r[2] is False for r in results[:-1])
    assert sum(r[1] for r in results) == pytest.approx(11 - 0.1 * len(plan))


def shortest_plan(text: str) -> list[str]:
    walls, targets, boxes, player = parse_level(text)
    start = (player, boxes)
    parent = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for state in frontier:
            (r, c), bx = state
            for name, (dr, dc) in MOVES.items():
                q = (r + dr, c + dc)
                if q in walls:
                    continue
                bx2 = bx
                if q in bx:
                    b = (q[0] + dr, q[1] + dc)
                    if b in walls or b in bx:
                        continue
                    bx2 = (bx - {q}) | {b}
                s2 = (q, bx2)
                if s2 in parent:
                    continue
                parent[s2] = (state, name)
                if bx2 <= targets:
                    plan = []
                    while parent[s2] is not None:
                        s2, move = parent[s2]
                        plan.append(move)
                    return plan[::-1]
                nxt.append(s2)
        frontier = nxt
    raise AssertionError("unsolvable")


def test_push_off_target_costs_one():
    # Two boxes, one already on its target: pushing it off pays -1 - 0.1.
    env = make("######\n#P√__#\n#____#\n#_XO_#\n######")
    (_, reward, terminated, _, info) = play(env, ["Right"])[0]
    assert reward == pytest.approx(-1.1)
    assert not terminated and info["action_effective"] and not info["success"]
    assert env.grid_text().split("\n")[1] == "#_SX_#"  # player now stands on the empty target


def test_push_target_to_target_nets_zero():
    env = make("######\n#P√O_#\n#____#\n#X___#\n######")
    (_, reward, *_rest) = play(env, ["Right"])[0]
    assert reward == pytest.approx(-0.1)


def test_wall_bump_and_blocked_push_are_ineffective():
    env = make(ONE_BOX)
    before = env.grid_text()
    (_, reward, terminated, truncated, info) = play(env, ["Up"])[0]
    assert reward == pytest.approx(-0.1) and not info["action_effective"]
    assert not terminated and not truncated and env.grid_text() == before
    # Box against a box: cannot push two.
    env = make("######\n#PXX_#\n#OO__#\n######")
    (_, reward, _, _, info) = play(env, ["Right"])[0]
    assert reward == pytest.approx(-0.1) and not info["action_effective"]
    # Box against a wall.
    env = make("#####\n#_O_#\n#__X#\n#__P#\n#####")
    (_, _, _, _, info) = play(env, ["Left"])[0]
    assert info["action_effective"]  # plain move
    env = make("#####\n#_O_#\n#_PX#\n#___#\n#####")
    (_, reward, _, _, info) = play(env, ["Right"])[0]
    assert reward == pytest.approx(-0.1) and not info["action_effective"]


def test_noop_step_costs_a_step():
    env = make(ONE_BOX)
    before = env.grid_text()
    _, reward, terminated, _, info = env.step(None)
    assert reward == pytest.approx(-0.1) and not terminated and not info["action_effective"]
    assert env.grid_text() == before


def test_observation_matches_text_and_alt_vocab():
    env = make("######\n#P√__#\n#____#\n#_XO_#\n######")
    obs = env.unwrapped._obs()
    text = env.grid_text()
    symbols = VOCABULARIES["default"]
    assert text == "\n".join("".join(symbols[c] for c in row) for row in obs.tolist())
    alt = make("######\n#P√__#\n#____#\n#_XO_#\n######", vocabulary="alt")
    table = str.maketrans(VOCABULARIES["default"], VOCABULARIES["alt"])
    assert alt.grid_text() == text.translate(table)
    assert alt.state_key() == env.state_key() == text
    np.testing.assert_array_equal(alt._obs(), obs)


def test_bad_levels_rejected():
    env = SokobanEnv(dim_room=(4, 5))
    with pytest.raises(ValueError):
        env.reset(options={"level": "#####\n#P_X#\n#___#\n#####"})  # box without target
    with pytest.raises(ValueError):
        env.reset(options={"level": "#####\nP_XO#\n#___#\n#####"})  # open border
    with pytest.raises(ValueError):
        env.reset(options={"level": "####\n#PXO#\n####"})  # wrong shape


def test_min_score_rejects_one_push_levels():
    easy = SokobanEnv()
    hard = SokobanEnv(min_score=2)
    easy_lengths, hard_lengths = [], []
    for seed in range(100):
        easy.reset(seed=seed)
        hard.reset(seed=seed)
        easy_lengths.append(bfs_solution_length(easy.grid_text(), 10))
        hard_lengths.append(bfs_solution_length(hard.grid_text(), 10))
    assert 1 in easy_lengths  # the references' default (docs/reference.md §1.1) keeps the easiest levels
    assert None not in hard_lengths and min(hard_lengths) >= 2

def test_seeded_resets_generate_each_level_once_and_match_generation(monkeypatch):
    """A group's G resets with one seed build the level once (the cache), and what the cache hands
    back (level and the RNG's state after it) is what generating it on the spot gives."""
    from arl.envs import sokoban

    sokoban.seeded_level.cache_clear()
    calls = []
    real = sokoban.generate_level
    monkeypatch.setattr(sokoban, "generate_level", lambda *a: calls.append(a) or real(*a))
    envs = [sokoban.SokobanEnv(dim_room=(8, 8), num_boxes=2) for _ in range(4)]
    observations = [env.reset(seed=123)[0] for env in envs]
    assert len(calls) == 1
    assert all((o == observations[0]).all() for o in observations)

    fresh = sokoban.SokobanEnv(dim_room=(8, 8), num_boxes=2)
    fresh.reset(seed=None)  # not cached: generated from the env's own RNG
    fresh.np_random, _ = gym.utils.seeding.np_random(123)
    fresh._set_state(*real(fresh.np_random, *fresh._generation_params()))
    assert (fresh._obs() == observations[0]).all()
    assert fresh.np_random.random() == envs[0].np_random.random()  # the RNG continues identically
    before = len(calls)
    envs[1].reset(seed=124)
    assert len(calls) == before + 1 and not (envs[1]._obs() == observations[0]).all()
