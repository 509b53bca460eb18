"""TrajEnvManager: token-exact samples, masks, logprobs, exits."""

from __future__ import annotations

import pytest

from arl.config import ManagerConfig
from arl.envs.prompts import traj_messages_start, traj_user_message
from arl.rollout import EpisodeSpec, TrajEnvManager, chat_ids
from arl.rollout.base import end_of_turn_ids

pytestmark = pytest.mark.anyio

ENV_IDS = ["arl/FrozenLake-v0", "arl/Sokoban-v0"]


def spec(env_id="arl/FrozenLake-v0", seed=3, member=0) -> EpisodeSpec:
    return EpisodeSpec(env_id=env_id, seed=seed, group_id=f"train_0_{seed}", episode_id=member)


def rendered_conversation(tokenizer, env_id, seed, traj, max_tokens) -> list[int]:
    """What the chat template renders for the whole conversation, replies as decoded text.

    Rebuilt from the env (fresh instance, same seed) and the recorded replies, independently of
    the manager's token bookkeeping. The render ends with the last assistant's end-of-turn (the
    template's trailing inter-message newline belongs to the next message).
    """
    from arl.envs.text import TextEnv

    env = TextEnv(env_id)
    obs, _ = env.reset(seed=seed)
    limit = env.max_steps
    messages = traj_messages_start(obs, limit, max_tokens, env.instructions)
    for k, turn in enumerate(traj.turns):
        reply = tokenizer.decode(turn.response_ids, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": reply})
        obs, *_ = env.step(reply)
        if k + 1 < len(traj.turns):
            messages.append({"role": "user", "content": traj_user_message(k + 2, obs, limit - k - 1, max_tokens)})
    ids = chat_ids(tokenizer, messages, add_generation_prompt=False)
    eot = end_of_turn_ids(tokenizer)
    while ids[-len(eot):] != eot:  # drop the trailing whitespace after the last end-of-turn
        ids.pop()
    return ids


def check_sample(tokenizer, env_id, seed, episode, max_tokens):
    traj, (sample,) = episode.trajectory, episode.samples
    assert sample.input_ids == rendered_conversation(tokenizer, env_id, seed, traj, max_tokens)
    check_alignment(episode)


def check_alignment(episode):
    traj, (sample,) = episode.trajectory, episode.samples
    # The mask covers exactly the generated tokens, in order, with their logprobs.
    generated = [tok for t in traj.turns for tok in t.response_ids]
    logprobs = [lp for t in traj.turns for lp in t.response_logprobs]
    assert [tok for tok, m in zip(sample.input_ids, sample.response_mask, strict=True) if m] == generated
    assert [lp for lp, m in zip(sample.old_logprobs, sample.response_mask, strict=True) if m] == logprobs
    assert all(lp == 0.0 for lp, m in zip(sample.old_logprobs, sample.response_mask, strict=True) if not m)
    # Every turn's prompt is a prefix of the final sample (no re-tokenization between turns).
    for t in traj.turns:
        assert sample.input_ids[: len(t.prompt_ids)] == t.prompt_ids
    assert sample.episode_score == sample.step_score == pytest.approx(traj.episode_score)
    assert traj.episode_score == pytest.approx(sum(t.reward for t in traj.turns))


@pytest.mark.parametrize("env_id", ENV_IDS)
async def test_token_exact_tiny(fake_engine, tiny_tokenizer, env_id):
    fake_engine.invalid_every = 3  # invalid replies too: they must round-trip as well
    manager = TrajEnvManager(fake_engine, ManagerConfig(max_tokens=32))
    for seed in range(4):
        episode = await manager.run_episode(spec(env_id, seed))
        traj = episode.trajectory
        assert traj.exit_reason in ("terminated", "truncated"), traj.error
        assert traj.status == "Finished" and traj.turns
        check_sample(tiny_tokenizer, env_id, seed, episode, 32)


async def test_bridge_is_chatml(fake_engine, tiny_tokenizer):
    episode = await TrajEnvManager(fake_engine, ManagerConfig(max_tokens=32)).run_episode(spec())
    turns = episode.trajectory.turns
    if len(turns) < 2:
        pytest.skip("episode ended after one turn")
    first = turns[0]
    bridge = turns[1].prompt_ids[len(first.prompt_ids) + len(first.response_ids) :]
    text = tiny_tokenizer.decode(bridge)
    assert text.startswith("\n<|im_start|>user\nTurn 2:\nObservation:\n")
    assert text.endswith("Decide the next action:<|im_end|>\n<|im_start|>assistant\n")


async def test_token_exact_scripted(scripted_engine, tiny_tokenizer):
    manager = TrajEnvManager(scripted_engine, ManagerConfig(max_tokens=48))
    for seed in range(3):
        episode = await manager.run_episode(spec("arl/Sokoban-v0", seed))
        assert episode.trajectory.ok, episode.trajectory.error
        check_sample(tiny_tokenizer, "arl/Sokoban-v0", seed, episode, 48)


async def test_token_exact_smollm2(fake_engine_cls):
    from arl.models import resolve_model

    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    except Exception as exc:  # noqa: BLE001 -- any failure to obtain the model is a skip
        pytest.skip(f"smollm2-135m unavailable: {type(exc).__name__}: {exc}")
    engine = fake_engine_cls(tokenizer, max_model_len=8192)
    engine.eot = end_of_turn_ids(tokenizer)[-1]
    engine.invalid_every = 4
    manager = TrajEnvManager(engine, ManagerConfig(max_tokens=32))
    for seed in range(2):
        episode = await manager.run_episode(spec("arl/Sokoban-v0", seed))
        assert episode.trajectory.ok, episode.trajectory.error
        check_sample(tokenizer, "arl/Sokoban-v0", seed, episode, 32)


async def test_cut_reply_is_closed_with_masked_end_of_turn(fake_engine, tiny_tokenizer):
    fake_engine.ramble = True
    manager = TrajEnvManager(fake_engine, ManagerConfig(max_tokens=8, max_turns=3))
    episode = await manager.run_episode(spec())
    traj, (sample,) = episode.trajectory, episode.samples
    assert traj.exit_reason == "truncated" and len(traj.turns) == 3
    assert all(t.finish_reason == "length" and not t.action_valid for t in traj.turns)
    eot = end_of_turn_ids(tiny_tokenizer)
    assert sample.input_ids[-1:] == eot and sample.response_mask[-1] == 0
    assert sum(sample.response_mask) == 3 * 8
    # No re-rendering check here: text cut mid-word need not re-tokenize to the same ids, which
    # is exactly why prompts are built from the engine's tokens.
    check_alignment(episode)


async def test_max_turns_caps_the_env_limit(fake_engine):
    fake_engine.invalid_every = 1  # never moves: the episode only ends by the limit
    episode = await TrajEnvManager(fake_engine, ManagerConfig(max_turns=2)).run_episode(spec())
    assert episode.trajectory.exit_reason == "truncated" and len(episode.trajectory.turns) == 2


async def test_max_length_ends_episode(fake_engine, tiny_tokenizer):
    fake_engine.invalid_every = 1
    first = len((await TrajEnvManager(fake_engine).run_episode(spec())).trajectory.turns[0].prompt_ids)
    # Room for the first turn only: the second prompt + max_tokens no longer fits.
    manager = TrajEnvManager(fake_engine, ManagerConfig(max_tokens=16, max_model_len=first + 40))
    episode = await manager.run_episode(spec())
    traj = episode.trajectory
    assert traj.exit_reason == "max_length" and traj.status == "Finished" and len(traj.turns) == 1
    assert len(episode.samples) == 1 and not episode.samples[0].ok
    # Not even the first prompt fits: no turns, no samples.
    manager = TrajEnvManager(fake_engine, ManagerConfig(max_model_len=first))
    episode = await manager.run_episode(spec())
    assert episode.trajectory.exit_reason == "max_length" and episode.samples == []


async def test_turns_share_one_token_list(fake_engine):
    """Each turn's prompt is a view of the episode's one token list (memory linear in the length),
    and each view still holds exactly what that turn was prompted with."""
    from arl.rollout import PromptView

    manager = TrajEnvManager(fake_engine, ManagerConfig(max_tokens=32))
    episode = await manager.run_episode(spec("arl/Sokoban-v0", 1))
    turns = episode.trajectory.turns
    assert len(turns) >= 2
    assert all(isinstance(t.prompt_ids, PromptView) for t in turns)
    assert len({id(t.prompt_ids._ids) for t in turns}) == 1
    lengths = [len(t.prompt_ids) for t in turns]
    assert lengths == sorted(lengths) and len(set(lengths)) == len(lengths)
    check_alignment(episode)
