"""Rollout test helpers: a fault-injecting fake engine and a crashing game.

`FakeEngine` answers like a (very simple) policy with canonical tokenizations of
"<answer>Action</answer>" plus the end-of-turn token, so re-rendering the conversation from the
decoded replies round-trips token for token. It can be slowed down, made to fail, or made to
ramble past max_tokens; the scripted engine (arl.engine.scripted) covers the same ground once it
is there, this one keeps the fault tests independent of it.
"""

from __future__ import annotations

import hashlib

import anyio
import gymnasium as gym
import pytest

from arl.engine.base import BaseEngine, EngineError, Generation, SamplingParams
from arl.envs.frozen_lake import FrozenLakeEnv

ACTIONS = ["Up", "Down", "Left", "Right"]
CRASHING_ID = "arl_test/CrashingFrozenLake-v0"


class FakeEngine(BaseEngine):
    name = "fake"

    def __init__(
        self,
        tokenizer,
        max_model_len: int = 2048,
        latency_s: float = 0.0,
        fail_on: set[int] | None = None,
        invalid_every: int = 0,
        ramble: bool = False,
    ):
        super().__init__(tokenizer, max_model_len, len(tokenizer))
        self.latency_s = latency_s
        self.fail_on = fail_on or set()  # request seeds whose request fails
        self.invalid_every = invalid_every  # every k-th reply is not a valid answer
        self.ramble = ramble  # never stop: always hit max_tokens
        self.calls = 0
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def _generate_n(self, prompt: list[int], params: SamplingParams) -> list[Generation]:
        self.calls += 1
        if self.latency_s:
            await anyio.sleep(self.latency_s)
        if params.seed in self.fail_on:
            raise EngineError(f"injected failure for seed {params.seed}")
        key = hashlib.sha256(f"{params.seed}|{prompt}".encode()).digest()
        if self.ramble:
            text = "<think>" + " ".join(["hmm"] * 200)
        elif self.invalid_every and key[1] % self.invalid_every == 0:
            text = "I am not sure."
        else:
            text = f"<answer>{ACTIONS[key[0] % 4]}</answer>"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eot]
        limit = self.max_new_tokens(len(prompt), params)
        finish = "stop" if len(ids) <= limit else "length"
        ids = ids[:limit]
        logprobs = [-0.25 - (k % 3) * 0.5 for k in range(len(ids))]
        return [Generation(ids, logprobs, finish, len(prompt), self.policy_version)]

    async def _update_weights(self, named_tensors) -> None:
        return None


class CrashingLake(FrozenLakeEnv):
    """FrozenLake whose step() raises on the `crash_at`-th step of an episode."""

    def __init__(self, crash_at: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.crash_at = crash_at
        self._n = 0

    def reset(self, *, seed=None, options=None):
        self._n = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self._n += 1
        if self._n >= self.crash_at:
            raise RuntimeError("the lake cracked")
        return super().step(action)


if CRASHING_ID not in gym.registry:
    gym.register(id=CRASHING_ID, entry_point=CrashingLake, max_episode_steps=10)


@pytest.fixture
def fake_engine(tiny_tokenizer):
    return FakeEngine(tiny_tokenizer)


@pytest.fixture
def fake_engine_cls():
    """The FakeEngine class (tests build their own variants; conftest is not importable)."""
    return FakeEngine


@pytest.fixture
def crashing_env_id() -> str:
    return CRASHING_ID
