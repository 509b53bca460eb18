"""FrozenLake: every map has a path, rewards and termination, slippery dynamics."""

from __future__ import annotations

from collections import Counter, deque

import gymnasium as gym
import numpy as np
import pytest

from arl.envs import FrozenLakeEnv, register_envs

register_envs()

LEFT, DOWN, RIGHT, UP = range(4)


def path_exists(text: str) -> bool:
    """BFS over the grid text, independent of the env: player to goal avoiding holes."""
    rows = text.split("\n")
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    start = next(k for k, v in cells.items() if v == "P")
    goal = next(k for k, v in cells.items() if v == "G")
    seen, queue = {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return True
        for q in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if q in cells and cells[q] != "O" and q not in seen:
                seen.add(q)
                queue.append(q)
    return False


@pytest.mark.parametrize("env_id", ["arl/FrozenLake-v0", "arl/FrozenLakeSlippery-v0"])
def test_every_map_has_a_path_and_maps_vary(env_id):
    env = gym.make(env_id)
    maps, starts = set(), set()
    for seed in range(300):
        env.reset(seed=seed)
        text = env.unwrapped.grid_text()
        assert text.count("P") == 1 and text.count("G") == 1, text
        assert path_exists(text), f"seed {seed}:\n{text}"
        maps.add(text)
        starts.add(text.replace("\n", "").index("P"))
    assert len(maps) >= 250
    assert len(starts) == 16  # random start, not always top-left


def test_hole_terminates_with_zero_and_shows_x():
    env = FrozenLakeEnv()
    env.reset(seed=0, options={"map": ["SHFF", "FFFF", "FFFF", "FFFG"]})
    _obs, reward, terminated, truncated, info = env.step(RIGHT)
    assert reward == 0.0 and terminated and not truncated
    assert not info["success"] and info["action_effective"]
    assert env.grid_text().split("\n")[0] == "_X__"


def test_goal_pays_one():
    env = FrozenLakeEnv()
    env.reset(seed=0, options={"map": "P__G\n_O__\n____\n____"})
    rewards = [env.step(RIGHT)[1] for _ in range(2)]
    _obs, reward, terminated, _trunc, info = env.step(RIGHT)
    assert rewards == [0.0, 0.0] and reward == 1.0 and terminated and info["success"]
    assert env.grid_text().split("\n")[0] == "___√"


def test_edge_and_noop_do_not_move():
    env = FrozenLakeEnv()
    env.reset(seed=0, options={"map": ["SFFF", "FHFH", "FFFH", "HFFG"]})
    before = env.grid_text()
    for action in (UP, LEFT, None):
        _obs, reward, terminated, _trunc, info = env.step(action)
        assert reward == 0.0 and not terminated and not info["action_effective"]
    assert env.grid_text() == before


def test_slippery_moves_intended_or_perpendicular_a_third_each():
    open_map = ["GFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFF"]
    env = FrozenLakeEnv(size=5, is_slippery=True)
    env.reset(seed=0)
    outcomes = Counter()
    for _ in range(3000):
        env.reset(options={"map": open_map})
        obs, *_ = env.step(DOWN)
        outcomes[tuple(int(x) for x in np.argwhere(obs == 3)[0])] += 1
    # From (2, 2): Down -> (3, 2) intended, Left (2, 1) and Right (2, 3) perpendicular, never Up.
    assert set(outcomes) == {(3, 2), (2, 1), (2, 3)}
    for count in outcomes.values():
        assert 850 < count < 1150


def test_non_slippery_is_deterministic_per_action():
    env = FrozenLakeEnv(size=5)
    open_map = ["GFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFF"]
    for action, expected in ((LEFT, (2, 1)), (DOWN, (3, 2)), (RIGHT, (2, 3)), (UP, (1, 2))):
        env.reset(seed=0, options={"map": open_map})
        obs, *_ = env.step(action)
        assert tuple(np.argwhere(obs == 3)[0]) == expected


def test_bad_maps_rejected():
    env = FrozenLakeEnv()
    with pytest.raises(ValueError):
        env.reset(options={"map": ["SFF", "FFF", "FFG"]})
    with pytest.raises(ValueError):
        env.reset(options={"map": ["SFFF", "FFFF", "FFFF", "FFFF"]})  # no goal
