"""ProxyEnvManager faults are data: each broken episode ends with a typed status / exit reason,
its siblings in the same batch complete."""

from __future__ import annotations

import anyio
import pytest

from arl.agents import AgentRunner, EpisodeResult, GymRunner
from arl.config import ManagerConfig
from arl.intercept import ProxyServer
from arl.rollout import EpisodeSpec, TrajEnvManager, request_seed
from arl.rollout.proxy import ProxyEnvManager

pytestmark = pytest.mark.anyio

CRASHING_ID = "arl_test/CrashingFrozenLake-v0"  # registered by tests/rollout/conftest.py
CONFIG = ManagerConfig(max_tokens=24, episode_timeout_s=3.0)


class RaisingRunner(AgentRunner):
    """Makes one model call, then its own code fails."""

    async def run_job(self, seed: int) -> EpisodeResult:
        await self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "hi"}])
        raise RuntimeError("agent bug")


class HangingRunner(AgentRunner):
    """Makes two model calls, then never returns."""

    async def run_job(self, seed: int) -> EpisodeResult:
        messages = [{"role": "user", "content": "first"}]
        for text in ("a", "b"):
            reply = await self.client.chat.completions.create(model=self.model, messages=messages)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": text}]
        await anyio.sleep(3600)
        raise AssertionError("unreachable")


class ChattyRunner(AgentRunner):
    """Three model calls whatever happens (no env): the engine fault lands on a known call."""

    async def run_job(self, seed: int) -> EpisodeResult:
        messages = [{"role": "user", "content": "first"}]
        for text in ("a", "b", "c"):
            reply = await self.client.chat.completions.create(model=self.model, messages=messages)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": text}]
        return EpisodeResult(score=1.0)


class LongPromptRunner(AgentRunner):
    """Sends a prompt longer than the context on its second call; reports what it saw."""

    async def run_job(self, seed: int) -> EpisodeResult:
        messages = [{"role": "user", "content": "short"}]
        await self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=8)
        try:
            await self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": "word " * 5000}], max_tokens=8)
        except Exception as exc:  # noqa: BLE001 -- an agent that handles its errors
            return EpisodeResult(status="Finished", score=0.5, step_scores=[0.5], exit_reason="terminated",
                                 error=f"{getattr(exc, 'code', None)}")
        raise AssertionError("the long prompt was served")


def make_factory(kinds: dict[int, str]):
    def factory(client, spec: EpisodeSpec, config: ManagerConfig) -> AgentRunner:
        kind = kinds.get(spec.episode_id, "ok")
        if kind == "raise":
            return RaisingRunner(client)
        if kind == "hang":
            return HangingRunner(client)
        if kind == "long":
            return LongPromptRunner(client)
        if kind == "engine":
            return ChattyRunner(client)
        if kind == "factory":
            raise ValueError("cannot build this agent")
        if kind == "crash":  # the lake cracks on the first step, whatever the replies
            return GymRunner(client, spec.env_id, max_tokens=CONFIG.max_tokens, env_kwargs={"crash_at": 1})
        return GymRunner(client, spec.env_id, max_tokens=CONFIG.max_tokens)

    return factory


KINDS = {1: "raise", 2: "crash", 3: "engine", 4: "hang", 5: "long", 6: "factory"}
EXPECTED = {
    0: ("Finished", {"terminated", "truncated"}),
    1: ("Failed", {"agent_error"}),
    2: ("Failed", {"env_error"}),
    3: ("Failed", {"engine_error"}),
    4: ("Timeout", {"timeout"}),
    5: ("Finished", {"max_length"}),
    6: ("Failed", {"agent_error"}),
    7: ("Finished", {"terminated", "truncated"}),
}


@pytest.mark.parametrize("transport", ["inprocess", "http"])
async def test_faults_are_data(fake_engine, transport):
    specs = [
        EpisodeSpec(CRASHING_ID if i == 2 else "arl/FrozenLake-v0", seed=4, group_id="train_0_4", episode_id=i)
        for i in range(8)
    ]
    fake_engine.fail_on = {request_seed(CONFIG, specs[3], 1)}  # member 3's second model call fails
    fake_engine.max_model_len = 2048
    config = ManagerConfig(max_tokens=24, episode_timeout_s=3.0, max_model_len=2048)
    results = {}
    async with ProxyServer() as server:
        manager = ProxyEnvManager(fake_engine, config, make_factory(KINDS), transport=transport, server=server,
                                  granularity="traj")

        async def one(spec):
            results[spec.episode_id] = await manager.run_episode(spec)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for s in specs:
                    tg.start_soon(one, s)
        assert server.episode_keys == []  # every episode, failed or not, closed its route
    for member, (status, reasons) in EXPECTED.items():
        traj = results[member].trajectory
        assert (traj.status, traj.exit_reason in reasons) == (status, True), (member, traj.exit_reason, traj.error)
        for sample in results[member].samples:
            assert sample.exit_reason == traj.exit_reason
    assert "agent bug" in results[1].trajectory.error
    assert "lake cracked" in results[2].trajectory.error
    assert "injected failure" in results[3].trajectory.error
    # Completed model calls of broken episodes are still there (masked out by mask_abnormal).
    assert len(results[3].trajectory.turns) == 1 and len(results[3].samples) == 1
    hang = results[4]
    assert len(hang.trajectory.turns) == 2 and len(hang.samples) == 1
    assert hang.samples[0].response_mask.count(1) == sum(len(t.response_ids) for t in hang.trajectory.turns)
    # The handler's verdict (context full) wins over what the agent reported, its score is kept.
    assert results[5].trajectory.episode_score == 0.5
    # Healthy members are unaffected: the same samples as the trajectory manager.
    want = await TrajEnvManager(fake_engine, config).run_episode(specs[0])
    assert [s.input_ids for s in results[0].samples] == [s.input_ids for s in want.samples]


async def test_env_crash_keeps_partial_score(fake_engine):
    for seed in range(50):  # a level where the lake cracks (step 2) before the game ends
        spec = EpisodeSpec(CRASHING_ID, seed=seed, group_id="g", episode_id=0)
        want = await TrajEnvManager(fake_engine, CONFIG).run_episode(spec)
        if want.trajectory.exit_reason == "env_error":
            break
    else:
        pytest.fail("no seed reached the crash")
    got = await ProxyEnvManager(fake_engine, CONFIG, granularity="traj").run_episode(spec)
    assert (got.trajectory.status, got.trajectory.exit_reason) == ("Failed", "env_error")
    assert got.trajectory.episode_score == pytest.approx(want.trajectory.episode_score)
    # The call whose reply crashed the env was made, so the proxy keeps it (reward 0): one turn more
    # than the trajectory manager's salvage, whose rewards it otherwise matches.
    assert len(got.trajectory.turns) == len(want.trajectory.turns) + 1
    assert [t.reward for t in got.trajectory.turns[:-1]] == [t.reward for t in want.trajectory.turns]
    assert got.trajectory.turns[-1].reward == 0.0
    (sample,) = got.samples
    assert sample.input_ids[: len(want.samples[0].input_ids)] == want.samples[0].input_ids


async def test_runner_status_mapping(fake_engine):
    class Reporting(AgentRunner):
        def __init__(self, client, result):
            super().__init__(client)
            self.result = result

        async def run_job(self, seed):
            await self.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            return self.result

    cases = [
        (EpisodeResult(status="NoData", exit_reason="terminated"), ("NoData", "no_data")),
        (EpisodeResult(status="Timeout", exit_reason="whatever"), ("Timeout", "timeout")),
        (EpisodeResult(status="Failed", exit_reason="my_reason"), ("Failed", "agent_error")),
        (EpisodeResult(status="Finished", exit_reason="my_reason", score=2.0), ("Finished", "terminated")),
    ]
    for result, expected in cases:
        manager = ProxyEnvManager(fake_engine, CONFIG, lambda client, spec, config, r=result: Reporting(client, r),
                                  granularity="traj")
        episode = await manager.run_episode(EpisodeSpec("arl/FrozenLake-v0", 0, "g", 0))
        assert (episode.trajectory.status, episode.trajectory.exit_reason) == expected
        assert episode.trajectory.episode_score == result.score


async def test_no_model_call_is_no_data(fake_engine):
    class Idle(AgentRunner):
        async def run_job(self, seed):
            return EpisodeResult()

    episode = await ProxyEnvManager(fake_engine, CONFIG, lambda c, s, config: Idle(c),
                                    granularity="traj").run_episode(
        EpisodeSpec("arl/FrozenLake-v0", 0, "g", 0))
    assert (episode.trajectory.status, episode.trajectory.exit_reason) == ("NoData", "no_data")
    assert episode.samples == []
