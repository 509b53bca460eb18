"""Episodes in which no model call reaches arl end NoData with an error that says why.

The case that prompted it: DSPy's default cache answers a repeated prompt on the client side, so
after the first member of a group (the members share a seed, hence a prompt) nothing reaches the
proxy, yet the agent still reports the cached episode's score.
"""

from __future__ import annotations

import json

import pytest

from arl.agents import AgentRunner, EpisodeResult
from arl.config import ManagerConfig
from arl.engine.scripted import ScriptedEngine
from arl.rollout import EpisodeSpec
from arl.rollout.metrics import rollout_metrics
from arl.rollout.proxy import ProxyEnvManager
from arl.train.episodes import eval_record

pytestmark = pytest.mark.anyio

CONFIG = ManagerConfig(max_tokens=24)


class CachingRunner(AgentRunner):
    """Answers a prompt it has seen from a cache shared by every episode (DSPy's process-wide
    default), and reports the same score either way."""

    def __init__(self, client, cache: dict[str, str]):
        super().__init__(client)
        self.cache = cache

    async def run_job(self, seed: int) -> EpisodeResult:
        messages = [{"role": "user", "content": f"solve level {seed}"}]
        key = json.dumps(messages)
        if key not in self.cache:
            reply = await self.client.chat.completions.create(model=self.model, messages=messages)
            self.cache[key] = reply.choices[0].message.content
        return EpisodeResult(score=1.0, success=True)


def group(n: int, seed: int = 3) -> list[EpisodeSpec]:
    return [EpisodeSpec("arl/FrozenLake-v0", seed, f"train_0_{seed}", member) for member in range(n)]


@pytest.mark.parametrize("transport", ["inprocess", "http"])
async def test_client_side_cache_hits_end_no_data_with_the_reason(tiny_tokenizer, transport):
    cache: dict[str, str] = {}
    async with ProxyEnvManager(ScriptedEngine(tiny_tokenizer), CONFIG, lambda c, s, config: CachingRunner(c, cache),
                               transport=transport, granularity="traj") as manager:
        episodes = [await manager.run_episode(spec) for spec in group(3)]
    first, *cached = episodes
    assert first.trajectory.status == "Finished", first.trajectory.error
    assert len(first.samples) == 1 and first.samples[0].step_score == 1.0
    for episode in cached:
        traj = episode.trajectory
        assert (traj.status, traj.exit_reason) == ("NoData", "no_data")
        assert episode.samples == []
        error = traj.error or ""
        assert "client-side" in error and "cache" in error
        assert "cache=False" in error  # DSPy's switch, named
        assert "base_url" in error  # or the agent called some other server
        # the agent's score is about an episode arl never saw: neither counted nor hidden
        assert (traj.episode_score, traj.success) == (0.0, False)
        assert "1" in error and "not counted" in error
    metrics = rollout_metrics(episodes)
    assert metrics["rollout/exit/no_data"] == 2.0
    assert metrics["rollout/success_rate"] == pytest.approx(1 / 3)  # the cached "successes" are not counted
    row = eval_record(0, [e.trajectory for e in episodes], keep=3, decode=lambda ids: "")
    assert [r["error"] is not None for r in row["episodes"]] == [False, True, True]
    assert "client-side" in row["episodes"][1]["error"]


async def test_runner_reported_no_data_gets_the_reason_and_keeps_its_own(tiny_tokenizer):
    class SaysNoData(AgentRunner):
        def __init__(self, client, error):
            super().__init__(client)
            self.error = error

        async def run_job(self, seed):
            return EpisodeResult(status="NoData", exit_reason="no_data", score=5.0, success=True, error=self.error)

    for own in (None, "my retriever came back empty"):
        manager = ProxyEnvManager(ScriptedEngine(tiny_tokenizer), CONFIG, lambda c, s, config, e=own: SaysNoData(c, e),
                                  granularity="traj")
        traj = (await manager.run_episode(group(1)[0])).trajectory
        assert (traj.status, traj.exit_reason) == ("NoData", "no_data")
        assert "cache" in traj.error and (own is None or own in traj.error)
        assert (traj.episode_score, traj.success) == (0.0, False)


async def test_failed_agent_without_calls_keeps_its_error(tiny_tokenizer):
    """An agent that failed before its first call is no cache hit: its own error stands."""

    class Broken(AgentRunner):
        async def run_job(self, seed):
            return EpisodeResult(status="Failed", exit_reason="agent_error", error="no such tool")

    traj = (await ProxyEnvManager(ScriptedEngine(tiny_tokenizer), CONFIG, lambda c, s, config: Broken(c),
                                  granularity="traj")
            .run_episode(group(1)[0])).trajectory
    assert (traj.status, traj.exit_reason, traj.error) == ("Failed", "agent_error", "no such tool")
