"""StepEnvManager: self-contained step prompts, per-step samples, raw-observation state hashes."""

from __future__ import annotations

import pytest

from arl.config import ManagerConfig
from arl.envs.prompts import compact_messages, step_messages
from arl.envs.text import TextEnv
from arl.rollout import EpisodeSpec, StepEnvManager, chat_ids, state_hash

pytestmark = pytest.mark.anyio


def spec(env_id="arl/Sokoban-v0", seed=5, member=0) -> EpisodeSpec:
    return EpisodeSpec(env_id=env_id, seed=seed, group_id=f"train_0_{seed}", episode_id=member)


@pytest.mark.parametrize("env_id", ["arl/FrozenLake-v0", "arl/Sokoban-v0"])
async def test_step_samples(scripted_engine, tiny_tokenizer, env_id):
    scripted_engine.invalid_rate = 0.3
    config = ManagerConfig(max_tokens=32, history_len=2)
    episode = await StepEnvManager(scripted_engine, config).run_episode(spec(env_id))
    traj, samples = episode.trajectory, episode.samples
    assert traj.ok, traj.error
    assert len(samples) == len(traj.turns) >= 1

    # Replay the env with the recorded replies and rebuild every prompt independently.
    env = TextEnv(env_id)
    obs, _ = env.reset(seed=5)
    history = []
    for t, (turn, sample) in enumerate(zip(traj.turns, samples, strict=True)):
        messages = step_messages(env.instructions, obs, t, history, 2, env.max_steps - t, 32)
        prompt = chat_ids(tiny_tokenizer, messages)
        assert turn.prompt_ids == prompt
        assert sample.input_ids == prompt + turn.response_ids
        assert sample.response_mask == [0] * len(prompt) + [1] * len(turn.response_ids)
        assert sample.old_logprobs[len(prompt) :] == turn.response_logprobs
        assert sample.state_key == state_hash(obs) == turn.state_key
        assert sample.step == t and sample.step_score == turn.reward
        assert sample.episode_score == pytest.approx(traj.episode_score)
        assert sample.action_valid == turn.action_valid
        reply = tiny_tokenizer.decode(turn.response_ids, skip_special_tokens=True)
        new_obs, reward, *_ = env.step(reply)
        assert reward == turn.reward
        history.append((obs, turn.action if turn.action_valid else reply.strip(), reward))
        obs = new_obs


async def test_history_lists_every_step(fake_engine, tiny_tokenizer):
    fake_engine.invalid_every = 2  # a mix of valid and invalid steps
    config = ManagerConfig(max_tokens=32, history_len=3, max_turns=6)
    episode = await StepEnvManager(fake_engine, config).run_episode(spec("arl/Sokoban-v0", 1))
    turns = episode.trajectory.turns
    if len(turns) < 4:
        pytest.skip("episode too short")
    text = tiny_tokenizer.decode(turns[3].prompt_ids)
    assert "you have completed 3 steps" in text and "the last 3 (observation, action, reward)" in text
    for k in (1, 2, 3):
        assert f"Step {k}:\nObservation:\n" in text


async def test_equal_observations_equal_hashes(scripted_engine):
    """All members of a group start in the same state; a hash depends on the observation only."""
    manager = StepEnvManager(scripted_engine, ManagerConfig(max_tokens=32, history_len=2))
    episodes = [await manager.run_episode(spec(member=m)) for m in range(4)]
    first = [e.samples[0] for e in episodes]
    assert len({s.state_key for s in first}) == 1
    assert len({e.trajectory.turns[0].observation for e in episodes}) == 1
    by_obs: dict[str, set[str]] = {}
    for e in episodes:
        for turn, s in zip(e.trajectory.turns, e.samples, strict=True):
            by_obs.setdefault(turn.observation, set()).add(s.state_key)
    assert all(len(hashes) == 1 for hashes in by_obs.values())
    assert len({next(iter(h)) for h in by_obs.values()}) == len(by_obs)  # distinct obs, distinct hash
    # Members sample differently even though they play the same level (per-member request seeds).
    assert len({tuple(e.trajectory.turns[0].response_ids) for e in episodes}) >= 2


async def test_step_max_length(fake_engine):
    manager = StepEnvManager(fake_engine, ManagerConfig(max_model_len=64))
    episode = await manager.run_episode(spec())
    assert episode.trajectory.exit_reason == "max_length" and episode.samples == []


@pytest.mark.parametrize("system", [None, "", "Reach G."])
async def test_compact_system_prompt(scripted_engine, tiny_tokenizer, system):
    """The compact prompt carries a system turn only when one is configured (SmolLM2's template
    injects its own 20-token default otherwise); the trained prompt is exactly that rendering."""
    config = ManagerConfig(max_tokens=32, history_len=0, prompt_style="compact", system_prompt=system)
    episode = await StepEnvManager(scripted_engine, config).run_episode(spec("arl/FrozenLake-v0"))
    env = TextEnv("arl/FrozenLake-v0")
    obs, _ = env.reset(seed=5)
    messages = compact_messages(obs, env.max_steps, system)
    assert [m["role"] for m in messages] == (["user"] if system is None else ["system", "user"])
    assert episode.trajectory.turns[0].prompt_ids == chat_ids(tiny_tokenizer, messages)


def test_system_prompt_needs_compact_style():
    with pytest.raises(ValueError, match="compact"):
        ManagerConfig(prompt_style="full", system_prompt="")
