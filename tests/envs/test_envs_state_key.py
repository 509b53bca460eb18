"""`game_state_key` / `anchor_key`: the game's ``state_key()`` reached through every wrapper arl puts
around a game, the observation hash only for an env that is not an arl game, and a key that is not
a str refused (issue 43 item 2)."""

from __future__ import annotations

import doctest

import gymnasium as gym
import pytest

from arl.envs import ToolEnv, anchor_key, game_state_key, state_hash
from arl.envs import game as game_mod
from arl.envs.frozen_lake import FrozenLakeEnv
from arl.envs.text import TextEnv


class SteppedLake(FrozenLakeEnv):
    """FrozenLake whose state key also counts the steps taken (which its grid does not show)."""

    def reset(self, *, seed=None, options=None):
        self.steps_taken = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps_taken += 1
        return super().step(action)

    def state_key(self) -> str:
        return f"{self.grid_text()}|{self.steps_taken}"


def test_docstring_examples():
    failures, tried = doctest.testmod(game_mod)
    assert tried > 0 and failures == 0


@pytest.mark.parametrize("wrap", [
    lambda game: game,
    lambda game: TextEnv(game),
    lambda game: TextEnv(game, cell_separator=" ", positions=True),
    lambda game: ToolEnv(game),
    lambda game: TextEnv(gym.wrappers.TimeLimit(game, max_episode_steps=5)),
])
def test_the_games_key_through_every_wrapper(wrap):
    env = wrap(SteppedLake())
    obs, _ = env.reset(seed=0)
    assert game_state_key(env) == env.unwrapped.state_key() == f"{env.unwrapped.grid_text()}|0"
    assert anchor_key(env, obs) == (state_hash(env.unwrapped.state_key()), "game")
    env.step(None if isinstance(env, SteppedLake) else "<answer>Up</answer>")
    assert game_state_key(env).endswith("|1")  # the grid may not have changed; the key has


def test_an_env_that_is_no_game_falls_back_to_its_observation():
    class Plain(gym.Env):  # no state_key: not an arl game
        pass

    for env in (Plain(), object(), gym.wrappers.TimeLimit(Plain(), max_episode_steps=3)):
        assert game_state_key(env) is None
        assert anchor_key(env, "P_\n_G") == (state_hash("P_\n_G"), "observation")


def test_a_key_that_is_not_a_str_is_refused():
    class TupleKey(SteppedLake):
        def state_key(self):
            return (self.grid_text(), self.steps_taken)

    env = TextEnv(TupleKey())
    env.reset(seed=0)
    with pytest.raises(TypeError, match=r"TupleKey.state_key\(\) must return a str, got tuple"):
        anchor_key(env, "x")

