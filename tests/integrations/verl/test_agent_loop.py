"""ArlAgentLoop inside verl's real agent-loop classes, with a fake server manager answering from
arl's scripted engine and from the tiny model; outputs checked the way verl's post-processing
consumes them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arl.engine.scripted import ScriptedEngine
from arl.envs.game import state_hash
from arl.envs.prompts import traj_messages_start, traj_user_message
from arl.envs.text import TextEnv
from arl.intercept.template import chat_ids, end_of_turn_ids

pytestmark = pytest.mark.anyio

ROLLOUT = {"mode": "traj", "manager": {"max_tokens": 24, "max_turns": 6}}
PROXY = {"mode": "proxy", "manager": {"max_tokens": 24, "max_turns": 6}}


def row(seed: int, env_id: str = "arl/FrozenLake-v0", uid: str = "u0", session: int = 0) -> dict:
    return {"extra_info": {"env_id": env_id, "seed": seed, "tag": "train", "index": 0}, "uid": uid,
            "session_id": session, "raw_prompt": [{"role": "user", "content": "play"}]}


def rendered(tokenizer, env_id, seed, replies, max_tokens, limit) -> list[int]:
    """The chat template's rendering of the episode: a fresh env replayed with the decoded
    replies, independently of arl's token bookkeeping (ends at the last end-of-turn)."""
    env = TextEnv(env_id)
    obs, info = env.reset(seed=seed)
    messages = traj_messages_start(info["raw_obs"], limit, max_tokens, env.instructions)
    for k, reply in enumerate(replies):
        messages.append({"role": "assistant", "content": reply})
        obs, _, terminated, truncated, info = env.step(reply)
        if k + 1 < len(replies):
            messages.append({"role": "user", "content": traj_user_message(k + 2, info["raw_obs"], limit - k - 1, max_tokens)})
    ids = chat_ids(tokenizer, messages, add_generation_prompt=False)
    eot = end_of_turn_ids(tokenizer)
    while ids[-len(eot):] != eot:
        ids.pop()
    return ids


def check_output(out, server, tokenizer):
    """What verl relies on: the mask covers exactly the generated tokens, log-probs aligned, one
    request id per episode, turn spans on the generated tokens."""
    generated = [t for c in server.calls for t in c["token_ids"]]
    logprobs = [lp for c in server.calls for lp in c["log_probs"]]
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    assert [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m] == generated
    assert [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m] == pytest.approx(logprobs)
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if not m)
    assert len({c["request_id"] for c in server.calls}) == 1
    full = out.prompt_ids + out.response_ids
    for call in server.calls:  # each turn's prompt is a prefix of the episode: no re-tokenization
        assert full[: len(call["prompt_ids"])] == call["prompt_ids"]
    spans = out.extra_fields["arl_turn_spans"]
    assert len(spans) == len(server.calls) == len(out.extra_fields["arl_state_keys"])
    covered = sorted(i for s, e in spans for i in range(s, e))
    assert covered == [i for i, m in enumerate(out.response_mask) if m]
    assert out.extra_fields["turn_scores"] == out.extra_fields["arl_step_rewards"]
    assert out.reward_score == pytest.approx(sum(out.extra_fields["arl_step_rewards"]))


@pytest.mark.parametrize("env_id", ["arl/FrozenLake-v0", "arl/Sokoban-v0"])
async def test_traj_episode_is_the_chat_template_rendering(make_loop, tiny_tokenizer, env_id):
    engine = ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=1)
    for seed in (0, 3):
        loop, server = make_loop(engine, ROLLOUT)
        out = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True},
                             **row(seed, env_id))
        check_output(out, server, tiny_tokenizer)
        replies = [tiny_tokenizer.decode(c["token_ids"], skip_special_tokens=True) for c in server.calls]
        assert out.prompt_ids + out.response_ids == rendered(tiny_tokenizer, env_id, seed, replies, 24, 6)
        # the state keys are the step manager's: the hash of the raw grid each action was taken in
        env = TextEnv(env_id)
        _, info = env.reset(seed=seed)
        keys = [state_hash(info["raw_obs"])]
        for reply in replies[:-1]:
            keys.append(state_hash(env.step(reply)[4]["raw_obs"]))
        assert out.extra_fields["arl_state_keys"] == keys
        # arl asked for what it needs; verl's own fields pass through
        params = server.calls[0]["params"]
        assert params["max_tokens"] == 24 and params["logprobs"] is True and params["top_k"] == -1
        assert params["stop_token_ids"] == end_of_turn_ids(tiny_tokenizer)[-1:]


async def test_proxy_runner_gives_the_same_rows_as_the_traj_manager(make_loop, tiny_tokenizer):
    """Any AgentRunner through the MessageTracker (here arl's GymRunner, in-process client)."""
    engine = ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=2)
    for seed in (1, 4):
        want, _ = make_loop(engine, ROLLOUT)
        got, server = make_loop(engine, PROXY)
        a = await want.run({"temperature": 1.0}, **row(seed))
        b = await got.run({"temperature": 1.0}, **row(seed))
        check_output(b, server, tiny_tokenizer)
        assert (b.prompt_ids, b.response_ids, b.response_mask) == (a.prompt_ids, a.response_ids, a.response_mask)
        assert b.response_logprobs == pytest.approx(a.response_logprobs)
        for key in ("arl_turn_spans", "arl_state_keys", "arl_step_rewards", "arl_action_valid", "arl_success"):
            assert b.extra_fields[key] == a.extra_fields[key], key


async def test_tiny_model_logprobs_are_the_models_own(make_loop, hf_engine, tiny_path):
    """With the tiny model behind the fake server, the rollout log-probs verl receives equal a
    teacher-forced forward pass over prompt + response at the masked positions."""
    from transformers import AutoModelForCausalLM

    loop, server = make_loop(hf_engine, {"mode": "traj", "manager": {"max_tokens": 12, "max_turns": 3}})
    out = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1}, **row(2))
    check_output(out, server, hf_engine.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(tiny_path, torch_dtype=torch.float32).eval()
    ids = torch.tensor([out.prompt_ids + out.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    token_lp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    response_lp = token_lp[len(out.prompt_ids) - 1:]
    mask = torch.tensor(out.response_mask, dtype=torch.bool)
    np.testing.assert_allclose(response_lp[mask].numpy(), np.array(out.response_logprobs)[mask.numpy()], atol=2e-3)


async def test_verl_postprocess_builds_the_batch(make_loop, verl_worker, tiny_tokenizer):
    """verl's own _agent_loop_postprocess + _postprocess: left-padded prompts, right-padded
    responses, the mask and log-probs at the same positions, extra fields as batch columns."""
    engine = ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=3)
    outputs, internals = [], []
    for session in range(3):
        loop, _ = make_loop(engine, ROLLOUT)
        r = row(5, session=session)
        out = await loop.run({"temperature": 1.0}, **r)
        outputs.append(out)
        internals.append(await verl_worker._agent_loop_postprocess(out, validate=False, **r))
    batch = verl_worker._postprocess(internals, input_non_tensor_batch={"uid": np.array(["u0"] * 3, dtype=object)})
    p = batch.batch["prompts"].shape[1]
    for i, out in enumerate(outputs):
        n, m = len(out.prompt_ids), len(out.response_ids)
        assert batch.batch["prompts"][i, p - n:].tolist() == out.prompt_ids
        assert batch.batch["attention_mask"][i, : p - n].sum() == 0
        assert batch.batch["responses"][i, :m].tolist() == out.response_ids
        assert batch.batch["response_mask"][i, :m].tolist() == out.response_mask
        assert batch.batch["response_mask"][i, m:].sum() == 0
        assert batch.batch["rollout_log_probs"][i, :m].tolist() == pytest.approx(out.response_logprobs, abs=1e-6)
        assert batch.batch["rm_scores"][i].sum().item() == pytest.approx(out.reward_score)
        assert batch.batch["rm_scores"][i, m - 1].item() == pytest.approx(out.reward_score)
        assert batch.non_tensor_batch["arl_turn_spans"][i] == out.extra_fields["arl_turn_spans"]
    assert list(batch.non_tensor_batch["uid"]) == ["u0"] * 3


async def test_episode_failing_before_its_first_call_returns_the_row_prompt(make_loop, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, fail_rate=1.0)
    loop, _ = make_loop(engine, ROLLOUT)
    r = row(0)
    out = await loop.run({"temperature": 1.0}, **r)
    assert out.extra_fields["arl_exit_reason"] == "engine_error"
    # one masked filler token: verl's v1 worker puts the reward on the last response token
    assert out.prompt_ids == chat_ids(tiny_tokenizer, r["raw_prompt"]) and len(out.response_ids) == 1
    assert out.response_mask == [0] and out.response_logprobs == [0.0]
    assert out.extra_fields["arl_turn_spans"] == []
    assert out.as_dict()["rm_scores"].tolist() == [out.reward_score]
    # no model call: the weight version in effect for the row (verl's sync trainer: global_steps - 1)
    out = await loop.run({"temperature": 1.0}, **r, global_steps=5)
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (4, 4)


async def test_weight_versions_span_the_episodes_calls(make_loop, tiny_tokenizer):
    """verl's loops pass on min/max_global_steps from TokenOutput.extra_fields (its v1 trainer
    tags rows with them): the first call's min, the last call's max."""
    loop, server = make_loop(ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=5), ROLLOUT)
    steps = iter(range(3, 100))
    generate = server.generate

    async def versioned(*args, **kwargs):
        out = await generate(*args, **kwargs)
        out.extra_fields = {"global_steps": next(steps)}
        out.extra_fields.update(min_global_steps=out.extra_fields["global_steps"],
                                max_global_steps=out.extra_fields["global_steps"])
        return out

    server.generate = versioned
    out = await loop.run({"temperature": 1.0}, **row(0))
    assert len(server.calls) > 1
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (3, 2 + len(server.calls))


async def test_abnormal_episode_is_masked_out(make_loop, make_verl_config, tiny_tokenizer):
    """An episode that hit max_length keeps its tokens but carries no loss (arl's mask_abnormal);
    ``mask_abnormal: false`` keeps its mask."""
    config = make_verl_config(prompt_length=300, response_length=200)
    rollout = {"mode": "traj", "manager": {"max_tokens": 24, "max_turns": 50, "max_model_len": 420}}
    loop, server = make_loop(ScriptedEngine(tiny_tokenizer, invalid_rate=1.0, seed=6), rollout, config=config)
    out = await loop.run({"temperature": 1.0}, **row(0))
    assert out.extra_fields["arl_exit_reason"] == "max_length" and out.extra_fields["arl_masked"]
    assert len(out.response_ids) > 0 and sum(out.response_mask) == 0
    loop, server = make_loop(ScriptedEngine(tiny_tokenizer, invalid_rate=1.0, seed=6),
                             {**rollout, "mask_abnormal": False}, config=config)
    out = await loop.run({"temperature": 1.0}, **row(0))
    assert out.extra_fields["arl_exit_reason"] == "max_length" and not out.extra_fields["arl_masked"]
    assert sum(out.response_mask) == sum(len(c["token_ids"]) for c in server.calls) > 0


async def test_legacy_worker_sessions_sample_apart(make_loop, tiny_tokenizer):
    """verl's legacy worker repeats a row n times (``DataProto.repeat(interleave=True)``) with no
    session id; its manager numbers the rows (``priority``). With per-request seeds on, the n
    sessions of a group must not get the same seed (nor the same trajectory id)."""
    from verl import DataProto

    rows = DataProto.from_dict(non_tensors={"extra_info": np.array([row(0)["extra_info"]], dtype=object),
                                            "uid": np.array(["u0"], dtype=object),
                                            "raw_prompt": np.array([row(0)["raw_prompt"]], dtype=object)})
    rows = rows.repeat(repeat_times=3, interleave=True)
    rows.non_tensor_batch["priority"] = np.arange(len(rows), dtype=np.int64)  # AgentLoopManager.generate_sequences
    seeds = []
    for i in range(len(rows)):
        kwargs = {k: v[i] for k, v in rows.non_tensor_batch.items()}  # AgentLoopWorker.generate_sequences
        loop, server = make_loop(ScriptedEngine(tiny_tokenizer, seed=1),
                                 {"mode": "traj", "manager": {"max_tokens": 24, "max_turns": 2, "sampling_seed": 7}})
        await loop.run({"temperature": 1.0}, **kwargs)
        seeds.append(server.calls[0]["params"]["seed"])
    assert len(set(seeds)) == 3


async def test_long_response_is_cut_to_response_length(make_loop, make_verl_config, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, seed=4)
    loop, server = make_loop(engine, ROLLOUT, config=make_verl_config(response_length=40))
    out = await loop.run({"temperature": 1.0}, **row(0))
    assert len(out.response_ids) == 40 and out.extra_fields["arl_cut_tokens"] > 0
    assert all(0 <= s < e <= 40 for s, e in out.extra_fields["arl_turn_spans"])


STEP = {"mode": "step", "manager": {"max_tokens": 8, "max_turns": 6, "history_len": 0, "prompt_style": "compact"}}


@pytest.mark.parametrize("env_id", ["arl/FrozenLake-v0", "arl/Sokoban-v0"])
async def test_step_mode_gives_one_row_per_turn_as_arls_step_manager(make_loop, tiny_tokenizer, env_id):
    """Step mode: row t is the step manager's own sample t (its prompt, reply, mask and log-probs),
    with that one turn in extra_fields, indexed by its place in the episode."""
    from arl.config import ManagerConfig
    from arl.rollout.base import EpisodeSpec
    from arl.rollout.step import StepEnvManager

    for seed in (0, 3):
        loop, server = make_loop(ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=8), STEP)
        outs = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **row(seed, env_id))
        manager = StepEnvManager(ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=8),
                                 ManagerConfig(**STEP["manager"], sampling_seed=None))
        episode = await manager.run_episode(EpisodeSpec(env_id=env_id, seed=seed, group_id="u0", episode_id=0))
        samples = episode.samples
        assert isinstance(outs, list) and len(outs) == len(samples) == len(server.calls) > 1
        assert len({c["request_id"] for c in server.calls}) == 1
        for t, (out, sample, call) in enumerate(zip(outs, samples, server.calls, strict=True)):
            assert out.prompt_ids == call["prompt_ids"]
            assert out.prompt_ids + out.response_ids == sample.input_ids
            assert [0] * len(out.prompt_ids) + out.response_mask == sample.response_mask
            assert [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m] == call["token_ids"]
            assert [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m] == \
                pytest.approx(call["log_probs"])
            f = out.extra_fields
            assert f["arl_turn_spans"] == [[0, len(out.response_ids)]] and f["arl_turn_steps"] == [t]
            assert f["arl_state_keys"] == [sample.state_key] and f["arl_state_key_sources"] == ["game"]
            assert f["arl_step_rewards"] == [pytest.approx(sample.step_score)]
            assert f["arl_action_valid"] == [sample.action_valid]
            assert out.reward_score == pytest.approx(episode.trajectory.episode_score) == f["arl_episode_score"]
            assert out.num_turns == 2
        # a fresh prompt per turn: no row's prompt holds an earlier row's reply
        assert all(len(outs[t].prompt_ids) < len(outs[0].prompt_ids) + 40 for t in range(len(outs)))


async def test_step_mode_without_a_model_call_gives_one_filler_row(make_loop, tiny_tokenizer):
    loop, _ = make_loop(ScriptedEngine(tiny_tokenizer, fail_rate=1.0), STEP)
    outs = await loop.run({"temperature": 1.0}, **row(0))
    assert len(outs) == 1 and outs[0].response_mask == [0] and outs[0].extra_fields["arl_turn_spans"] == []
    assert outs[0].extra_fields["arl_turn_steps"] == [] and outs[0].extra_fields["arl_exit_reason"] == "engine_error"


async def test_step_mode_abnormal_episode_is_masked_out(make_loop, tiny_tokenizer, failing_after):
    """An engine error on the third call: the two played turns keep their rows, with no loss."""
    loop, _ = make_loop(failing_after(ScriptedEngine(tiny_tokenizer, invalid_rate=1.0, seed=1), 2), STEP)
    outs = await loop.run({"temperature": 1.0}, **row(0))
    assert [o.extra_fields["arl_turn_steps"] for o in outs] == [[0], [1]]
    assert all(o.extra_fields["arl_masked"] and sum(o.response_mask) == 0 and o.response_ids for o in outs)


async def test_step_mode_refuses_the_legacy_worker(make_loop, tiny_tokenizer):
    """verl's legacy worker (no session id, ``priority`` instead) takes one output per row."""
    loop, server = make_loop(ScriptedEngine(tiny_tokenizer, seed=1), STEP)
    legacy = {k: v for k, v in row(0).items() if k != "session_id"}
    with pytest.raises(ValueError, match="use_v1"):
        await loop.run({"temperature": 1.0}, **legacy, priority=0)
    assert server.calls == []


def test_rollout_config_modes():
    from arl.integrations.verl.agent_loop import rollout_config

    assert rollout_config({"mode": "step"}).mode == "step"
    with pytest.raises(ValueError, match="fork"):
        rollout_config({"mode": "step", "manager": {"fork": {"k": 2}}})
    assert rollout_config(None).manager.sampling_seed is None
    assert rollout_config({"manager": {"sampling_seed": 7}}).manager.sampling_seed == 7
