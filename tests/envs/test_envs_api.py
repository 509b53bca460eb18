"""Gymnasium API conformance, seeding, determinism and independence from the global RNGs."""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from arl.envs import ENV_SPECS, TOOL_ENV_SPECS, register_envs

register_envs()
ENV_IDS = list(ENV_SPECS)


def test_ids_registered_with_limits_and_idempotent():
    register_envs()
    register_envs()  # a second call must neither raise nor duplicate
    expected = {
        "arl/Sokoban-v0": 10,
        "arl/Sokoban-8x8-v0": 20,
        "arl/Sokoban-10x10-v0": 30,
        "arl/SokobanAltVocab-v0": 10,
        "arl/FrozenLake-v0": 10,
        "arl/FrozenLakeSlippery-v0": 10,
    }
    for env_id, steps in expected.items():
        assert gym.spec(env_id).max_episode_steps == steps
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        gym.pprint_registry()
    for env_id in expected:
        assert env_id in buf.getvalue()


@pytest.mark.parametrize("env_id", [*ENV_IDS, *TOOL_ENV_SPECS])  # a tool env's step observes reply messages
def test_check_env_passes_without_warnings(env_id):
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # check_env always warns that a made env is wrapped; that warning is about the call itself.
        warnings.filterwarnings("ignore", message=r".*different from the unwrapped version")
        check_env(gym.make(env_id))


def rollout(env: gym.Env, seed: int, steps: int = 50) -> list:
    """`steps` random actions (from a seeded Generator), resetting whenever an episode ends."""
    actions = np.random.default_rng(seed + 1000).integers(0, 4, size=steps)
    obs, info = env.reset(seed=seed)
    trace = [(obs.tobytes(), sorted(info.items()))]
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(int(a))
        trace.append((obs.tobytes(), reward, terminated, truncated, sorted(info.items())))
        if terminated or truncated:
            obs, info = env.reset()
            trace.append((obs.tobytes(), sorted(info.items())))
    return trace


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_same_seed_same_rollout(env_id):
    for seed in (0, 7):
        assert rollout(gym.make(env_id), seed) == rollout(gym.make(env_id), seed)
    assert rollout(gym.make(env_id), 1) != rollout(gym.make(env_id), 2)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_global_rng_state_is_irrelevant(env_id):
    random.seed(1)
    np.random.seed(1)
    first = rollout(gym.make(env_id), 3)
    random.seed(99)
    np.random.seed(99)
    random.random()
    np.random.random(17)
    assert rollout(gym.make(env_id), 3) == first


def test_interleaved_async_episodes_match_sequential():
    """Envs stepped in concurrent tasks (interleaving at every step) reproduce sequential runs."""
    jobs = [(env_id, seed) for env_id in ENV_IDS for seed in (0, 1, 2)]
    sequential = [rollout(gym.make(env_id), seed) for env_id, seed in jobs]

    async def run(env_id: str, seed: int) -> list:
        env = gym.make(env_id)
        actions = np.random.default_rng(seed + 1000).integers(0, 4, size=50)
        obs, info = env.reset(seed=seed)
        trace = [(obs.tobytes(), sorted(info.items()))]
        await asyncio.sleep(0)
        for a in actions:
            obs, reward, terminated, truncated, info = env.step(int(a))
            trace.append((obs.tobytes(), reward, terminated, truncated, sorted(info.items())))
            await asyncio.sleep(0)  # let every other task step before this one continues
            if terminated or truncated:
                obs, info = env.reset()
                trace.append((obs.tobytes(), sorted(info.items())))
        return trace

    async def main() -> list:
        return await asyncio.gather(*(run(env_id, seed) for env_id, seed in jobs))

    assert asyncio.run(main()) == sequential


def test_step_limit_truncates():
    env = gym.make("arl/FrozenLake-v0")
    env.reset(seed=0, options={"map": ["SFFF", "FFFF", "FFFF", "FFFG"]})
    flags = [env.step(None)[3] for _ in range(10)]  # no-op turns count against the limit
    assert flags == [False] * 9 + [True]


def test_import_is_light():
    code = (
        "import sys, arl.envs; "
        "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
