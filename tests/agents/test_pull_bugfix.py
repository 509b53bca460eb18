"""Pull mode on the sandbox tool env: push and pull play arl/BugFix-v0 token for token alike."""

from __future__ import annotations

import json

import anyio
import attrs
import pytest

from arl.config import load_config
from arl.engine import make_engine
from arl.rollout import EpisodeSpec
from arl.rollout.factory import close_manager, make_manager

pytestmark = pytest.mark.anyio

AGENT = ["{python}", "-m", "arl.agents.examples.bugfix_agent"]
SEEDS = (0, 1)


async def play(mode: str, transport: str) -> list:
    """The seeds' episodes as ``tiny_bugfix_proxy engine.backend=scripted`` plays them, with the
    example agent program as each episode's agent in ``mode``. One at a time, on a fresh engine:
    the config's script is one list cycled across all requests, so concurrent episodes (or a
    second run on the same engine) would draw its lines in another order."""
    # Pull-mode BugFix has no hidden tests (arl.envs.bugfix.env.PULL_MODE_REFUSAL) and is refused;
    # this test compares the mechanics only, so it opts in (both modes: their env kwargs must match).
    config = load_config("tiny_bugfix_proxy", ["engine.backend=scripted",
                                               "rollout.manager.env_kwargs.allow_unhidden_tests=true"])
    engine = make_engine(attrs.evolve(config.engine, model=config.model))  # as the trainer builds it
    env_kwargs = json.dumps(config.rollout.manager.env_kwargs)
    rollout = attrs.evolve(config.rollout, proxy=attrs.evolve(
        config.rollout.proxy, runner=mode, transport=transport,
        runner_kwargs={"command": AGENT, "timeout_s": 120, "env_extra": {"ARL_ENV_KWARGS": env_kwargs}}))
    manager = make_manager(engine, rollout)
    try:
        return [await manager.run_episode(EpisodeSpec(config.rollout.env_id, seed, f"train_0_{seed}", 0))
                for seed in SEEDS]
    finally:
        await close_manager(manager)
        await engine.close()


async def test_pull_and_push_bugfix_agents_make_the_same_samples(tiny_tokenizer):
    """Push mode (the agent a plain process, its tool commands in a bubblewrap sandbox, HTTP to the
    proxy) and pull mode (the agent in a sandbox, its tool sandbox nested and so isolation "none",
    its calls over pipes) give the same samples, scores and exit reasons for the same seeds."""
    runs = {}

    async def run(mode: str, transport: str) -> None:
        runs[mode] = await play(mode, transport)

    async with anyio.create_task_group() as tg:  # the two modes side by side, each on its own engine
        tg.start_soon(run, "push", "http")
        tg.start_soon(run, "pull", "inprocess")
    push, pull = runs["push"], runs["pull"]
    for a, b in zip(push, pull, strict=True):
        assert a.trajectory.status == b.trajectory.status == "Finished", (a.trajectory.error, b.trajectory.error)
        assert a.trajectory.exit_reason == b.trajectory.exit_reason == "terminated"  # the script's submit
        assert a.trajectory.episode_score == b.trajectory.episode_score
        assert 0 < b.trajectory.episode_score < 1  # the hidden tests ran: the unfixed bug fails some
        assert [t.reward for t in a.trajectory.turns] == [t.reward for t in b.trajectory.turns]
        assert [t.action for t in b.trajectory.turns] == ["bash", "editor", "submit"]
        assert len(a.samples) == len(b.samples) == 1  # granularity traj: one growing conversation
        for x, y in zip(a.samples, b.samples, strict=True):
            assert x.input_ids == y.input_ids
            assert x.response_mask == y.response_mask
            assert x.old_logprobs == y.old_logprobs
            assert (x.step_score, x.state_key, x.step) == (y.step_score, y.state_key, y.step)
    # the tools really ran in both (the same tokens, so in pull mode too): the command, the editor
    text = tiny_tokenizer.decode(pull[0].samples[0].input_ids)
    assert "<tool_response>\nsequtils.py\n1\n[exit code 0]\n</tool_response>" in text
    assert "<tool_response>\nFiles in . (two levels deep):\nsequtils.py\n</tool_response>" in text
    assert pull[0].samples[0].info["tracker"]["untracked_assistant"] == 0
