"""arl.envs.fork: a forked game continues exactly as the original would, and shares nothing with it;
a game that cannot be copied says so with NotForkableError."""

from __future__ import annotations

import doctest
import itertools
import threading

import gymnasium as gym
import pytest

from arl.envs import fork as fork_mod
from arl.envs.fork import NotForkableError, fork_env
from arl.envs.frozen_lake import FrozenLakeEnv
from arl.envs.text import TextEnv

GAMES = ["arl/FrozenLake-v0", "arl/FrozenLakeSlippery-v0", "arl/Sokoban-v0", "arl/Sokoban-8x8-v0"]
MOVES = ["Up", "Right", "Down", "Left", "Down", "Down", "Right", "Up", "Left", "Right", "Down", "Up"]


def replies(names):
    return [f"<answer>{n}</answer>" for n in names] + ["no answer"]  # an invalid turn too


def play(env, texts):
    """(observation, reward, terminated, truncated, info) per step, up to the episode's end."""
    out = []
    for text in texts:
        obs, reward, terminated, truncated, info = env.step(text)
        out.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return out


def test_docstring_examples():
    failures, tried = doctest.testmod(fork_mod)
    assert tried > 0 and failures == 0


def alive_after(env_id, seeds, after):
    """An env of the first seed from ``seeds`` whose episode is still running after ``after`` moves."""
    for seed in seeds:
        env = TextEnv(env_id)
        env.reset(seed=seed)
        done = play(env, replies(MOVES[:after])[:after])
        if not done or not (done[-1][2] or done[-1][3]):
            return env
    raise AssertionError(f"no level of {env_id} survives {after} moves")


@pytest.mark.parametrize("env_id", GAMES)
@pytest.mark.parametrize("seed", [0, 3, 11])
@pytest.mark.parametrize("after", [0, 1, 3])
def test_a_fork_continues_identically(env_id, seed, after):
    """Forked after `after` steps, fork and original see the same future under the same actions,
    slips of the slippery lake included (its generator is copied in its state)."""
    env = alive_after(env_id, range(seed, seed + 50), after)
    twin = fork_env(env)
    assert twin.unwrapped is not env.unwrapped
    assert twin.grid_text() == env.grid_text() and twin.elapsed_steps == env.elapsed_steps
    future = replies(MOVES[after:] + MOVES)
    assert play(twin, future) == play(env, future)


@pytest.mark.parametrize("env_id", GAMES)
def test_the_original_is_unaffected_by_the_forks_moves(env_id):
    """A fork played to its end leaves the original where it was: its grid, step count, step limit
    and random generator; the original then continues as an untouched copy of it does."""
    env = TextEnv(env_id)
    env.reset(seed=5)
    play(env, replies(["Right"]))
    witness = fork_env(env)  # the original's state, kept aside
    grid, elapsed = env.grid_text(), env.elapsed_steps
    for names in itertools.permutations(["Up", "Down", "Left", "Right"]):
        branch = fork_env(env)
        play(branch, replies(list(names) * 3))
    assert env.grid_text() == grid and env.elapsed_steps == elapsed
    future = replies(MOVES)
    assert play(env, future) == play(witness, future)


class LockedLake(FrozenLakeEnv):
    """A game holding something deepcopy cannot copy (a lock)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.lock = threading.Lock()


class SelfForkingLake(LockedLake):
    """The same, with a fork() that rebuilds the state deepcopy cannot copy."""

    forks_made = 0

    def fork(self):
        SelfForkingLake.forks_made += 1
        lock, self.lock = self.lock, None
        try:
            import copy

            twin = copy.deepcopy(self)
        finally:
            self.lock = lock
        twin.lock = threading.Lock()
        return twin


class SealedLake(FrozenLakeEnv):
    forkable = False


IDS = {"arl_test/LockedLake-v0": LockedLake, "arl_test/SelfForkingLake-v0": SelfForkingLake,
       "arl_test/SealedLake-v0": SealedLake}
for _id, _cls in IDS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_cls, max_episode_steps=10)


def test_an_uncopyable_game_raises_a_typed_error_naming_it():
    env = TextEnv("arl_test/LockedLake-v0")
    env.reset(seed=0)
    with pytest.raises(NotForkableError, match=r"LockedLake cannot be copied with copy.deepcopy .*fork\(\)") as info:
        fork_env(env)
    assert isinstance(info.value, TypeError) and info.value.__cause__ is not None


def test_a_game_that_declares_itself_unforkable():
    env = TextEnv("arl_test/SealedLake-v0")
    env.reset(seed=0)
    with pytest.raises(NotForkableError, match="SealedLake declares forkable = False"):
        fork_env(env)


def test_a_games_own_fork_is_used_inside_the_copied_wrappers():
    env = TextEnv("arl_test/SelfForkingLake-v0")
    env.reset(seed=2)
    before = SelfForkingLake.forks_made
    twin = fork_env(env)
    assert SelfForkingLake.forks_made == before + 1
    assert type(twin) is TextEnv and isinstance(twin.unwrapped, SelfForkingLake)
    assert twin.unwrapped is not env.unwrapped and twin.unwrapped.lock is not env.unwrapped.lock
    assert twin.env is not env.env  # the wrappers are copies too (the TimeLimit counts on its own)
    future = replies(MOVES)
    assert play(twin, future) == play(env, future)
