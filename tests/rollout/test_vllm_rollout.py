"""Both managers against the real in-process vLLM engine on the tiny model."""

from __future__ import annotations

import math

import pytest

from arl.config import ManagerConfig
from arl.rollout import GroupScheduler, StepEnvManager, TrajEnvManager, collate

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]


@pytest.mark.parametrize("manager_cls", [TrajEnvManager, StepEnvManager])
async def test_vllm_batch(vllm_engine, manager_cls):
    sched = GroupScheduler("arl/FrozenLake-v0", num_groups=2, group_size=4, base_seed=7)
    # Short replies and few turns: the random-init tiny model rambles, this is about plumbing.
    config = ManagerConfig(max_tokens=12, max_turns=3, temperature=1.0)
    batch = await sched.run(manager_cls(vllm_engine, config), sched.specs(0))
    assert len(batch.episodes) == 8 and len(batch.groups) == 2
    for episode in batch.episodes:
        traj = episode.trajectory
        assert traj.ok, traj.error
        assert traj.turns and episode.samples
    for members in batch.groups.values():
        assert len({e.trajectory.seed for e in members}) == 1
        assert len({e.trajectory.turns[0].observation for e in members}) == 1
        # Same level, different per-member request seeds: the members do not sample alike.
        assert len({tuple(e.trajectory.turns[0].response_ids) for e in members}) > 1
    for s in batch.samples:
        resp = [lp for lp, m in zip(s.old_logprobs, s.response_mask, strict=True) if m]
        assert resp and all(math.isfinite(lp) and lp <= 0.0 for lp in resp)
        assert all(0 <= t < vllm_engine.vocab_size for t in s.input_ids)
    for episode in batch.episodes:  # the mask marks exactly the generated tokens
        generated = [t for turn in episode.trajectory.turns for t in turn.response_ids]
        marked = [t for s in episode.samples for t, m in zip(s.input_ids, s.response_mask, strict=True) if m]
        assert marked == generated
    tensors = collate(batch.samples)
    assert tensors["input_ids"].shape[0] == len(batch.samples)
