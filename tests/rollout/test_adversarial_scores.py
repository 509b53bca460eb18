"""An agent that reports a score it should not (issue 28, class 5): NaN, Infinity, a number past
float64's comfortable range, a result too large or too deep. Each must end its own episode as
"agent_error" with the reason in the error, with finite sample scores, so the batch trains on;
before, the NaN reached the advantage computation and the training step raised."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from arl.agents import AgentRunner, EpisodeResult
from arl.agents.process import PushModeRunner
from arl.agents.runner import MAX_ABS_SCORE, MAX_RESULT_DEPTH, MAX_RESULT_STEPS
from arl.algo.advantages import grpo
from arl.config import ManagerConfig
from arl.rollout import EpisodeSpec
from arl.rollout.proxy import ProxyEnvManager

pytestmark = pytest.mark.anyio

CONFIG = ManagerConfig(max_tokens=24, episode_timeout_s=10.0)


class Reporting(AgentRunner):
    """One model call, then the result it was given, whatever it holds."""

    def __init__(self, client, result):
        super().__init__(client)
        self.result = result

    async def run_job(self, seed):
        await self.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        return self.result


@pytest.mark.parametrize("granularity", ["traj", "step"])
@pytest.mark.parametrize("bad", [
    EpisodeResult(score=float("nan")),
    EpisodeResult(score=float("inf"), step_scores=[1.0]),
    EpisodeResult(score=1.0, step_scores=[float("-inf")]),
    EpisodeResult(score=1e300),
    EpisodeResult(score=0.0, metrics={"m": float("nan")}),
], ids=["nan", "inf", "step-inf", "huge", "metric-nan"])
async def test_in_process_runner_with_non_finite_score_is_an_agent_error(fake_engine, bad, granularity):
    good = EpisodeResult(score=1.0, step_scores=[1.0])
    samples, trajs = [], []
    for i, result in enumerate((bad, good, EpisodeResult(score=0.0, step_scores=[0.0]))):
        manager = ProxyEnvManager(fake_engine, CONFIG, lambda client, spec, config, r=result: Reporting(client, r),
                                  granularity=granularity)
        episode = await manager.run_episode(EpisodeSpec("arl/FrozenLake-v0", 0, "g", i))
        samples += episode.samples
        trajs.append(episode.trajectory)
    assert (trajs[0].status, trajs[0].exit_reason) == ("Failed", "agent_error")
    assert "invalid result" in trajs[0].error and ("finite" in trajs[0].error or "beyond" in trajs[0].error)
    assert trajs[0].episode_score == 0.0
    assert [t.status for t in trajs[1:]] == ["Finished", "Finished"]
    scores = [s.step_score for s in samples]
    assert all(math.isfinite(x) for x in scores) and len(samples) == 3
    adv = grpo(scores, [s.group_id for s in samples])  # what raised in the training step before
    assert np.all(np.isfinite(adv))


async def test_runner_returning_no_episode_result_is_an_agent_error(fake_engine):
    manager = ProxyEnvManager(fake_engine, CONFIG, lambda client, spec, config: Reporting(client, {"score": 1.0}),
                              granularity="traj")
    episode = await manager.run_episode(EpisodeSpec("arl/FrozenLake-v0", 0, "g", 0))
    assert (episode.trajectory.status, episode.trajectory.exit_reason) == ("Failed", "agent_error")
    assert "EpisodeResult" in episode.trajectory.error


@pytest.mark.parametrize("raw, reason", [
    (b'{"score": NaN}', "NaN"),
    (b'{"score": Infinity}', "Infinity"),
    (b'{"score": -Infinity}', "Infinity"),
    (b'{"score": 1e999}', "finite"),
    (b'{"score": "nan"}', "finite"),
    (b'{"score": 0.5, "step_scores": [0.5, NaN]}', "NaN"),
    (b'{"score": 1e12}', "beyond"),
    (b'{"score": [1]}', "not a number"),
    (b"[" * 100_000 + b"]" * 100_000, "nested"),
    (b'{"score": 1, "step_infos": [' + b"[" * (MAX_RESULT_DEPTH + 2) + b"]" * (MAX_RESULT_DEPTH + 2) + b"]}", "nested"),
    (b'{"score": 0, "step_scores": [' + b"0," * MAX_RESULT_STEPS + b"0]}", "at most"),
    (b'{"score": 0, "error": "' + b"x" * (5 * 2**20) + b'"}', "exceeds"),
], ids=["nan", "inf", "-inf", "overflow", "nan-string", "step-nan", "huge", "list", "deep", "deep-info",
        "many-steps", "too-large"])
def test_from_bytes_refuses_what_cannot_be_trained_on(raw, reason):
    with pytest.raises((ValueError, TypeError), match=reason):
        EpisodeResult.from_bytes(raw)


def test_from_bytes_keeps_a_good_result_and_cuts_a_long_error():
    result = EpisodeResult.from_bytes(b'{"score": -0.5, "step_scores": [0, -0.5], "error": "' + b"e" * 70_000 + b'"}')
    assert result.score == -0.5 and result.step_scores == [0.0, -0.5]
    assert len(result.error) == 1 << 16
    assert EpisodeResult.from_bytes(f'{{"score": {MAX_ABS_SCORE}}}').score == MAX_ABS_SCORE


def _push(program: str, timeout_s: float = 30.0) -> PushModeRunner:
    client = SimpleNamespace(base_url="http://127.0.0.1:9/v1", api_key="token")  # never called
    return PushModeRunner(client, [sys.executable, "-c", program], timeout_s=timeout_s)


@pytest.mark.parametrize("document", ['{"score": NaN}', '{"score": 1e999, "success": true}', "[" * 100_000])
async def test_push_mode_result_with_bad_score_is_an_agent_error(document):
    program = f"import os; open(os.environ['ARL_RESULT_PATH'], 'w').write({document!r})"
    result = await _push(program).run_job(0)  # before: NaN / inf accepted, the deep one raised
    assert (result.status, result.exit_reason) == ("Failed", "agent_error")
    assert "malformed result" in result.error
    assert result.score == 0.0


async def test_push_mode_result_path_that_is_a_fifo_does_not_block():
    # a FIFO at the result path: reading it would wait forever for a writer, on the event loop
    program = "import os; os.mkfifo(os.environ['ARL_RESULT_PATH'])"
    result = await _push(program).run_job(0)
    assert (result.status, result.exit_reason) == ("Failed", "agent_error")
    assert "not a regular file" in result.error
