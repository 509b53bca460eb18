"""A batch whose every episode failed stops the run with what failed, in the warm-start and in RL.

The set-up of the bug report: a proxy-mode runner factory with the wrong signature fails every
episode as ("Failed", "agent_error"). The warm-start then died in `collate()` ("needs at least one
sample"), and RL steps trained on nothing without a word.
"""

from __future__ import annotations

import pytest
from trainer_support import scripted, small_config

from arl.rollout.base import Episode
from arl.rollout.records import Trajectory
from arl.rollout.scheduler import BatchFailedError, RolloutBatch, check_batch
from arl.train import Trainer

pytestmark = pytest.mark.anyio

RUNNER = "rollout.proxy.runner=test_failed_batches:broken_factory"


def broken_factory(client, spec, config):  # the contract's signature (a wrong one is refused at set-up:
    raise RuntimeError("this agent cannot start")  # tests/train/test_checks.py), but every episode fails


def _failed_config(tmp_path, *overrides: str):
    return small_config(tmp_path, "rollout.mode=proxy", RUNNER, "steps=1", *overrides)


@pytest.mark.parametrize("sft_steps, what", [(1, "format warm-start step 0"), (0, "training step 0")])
async def test_every_episode_failing_names_the_counts_and_the_first_error(tmp_path, sft_steps, what):
    config = _failed_config(tmp_path, f"sft.steps={sft_steps}", "sft.batch_episodes=3")
    episodes = 3 if sft_steps else 8  # sft: batch_episodes groups of one; RL: 2 groups of 4
    async with Trainer(config, engine=scripted(config)) as trainer:
        with pytest.raises(BatchFailedError) as err:
            await trainer.train()
        assert trainer.step_count == 0
    message = str(err.value)
    assert message.startswith(f"every episode of {what} failed ({episodes} of {episodes}: ")
    assert f"status Failed {episodes}; exit_reason agent_error {episodes})" in message
    assert "the first one (" in message and "/0): RuntimeError: this agent cannot start" in message
    assert len(err.value.episodes) == episodes
    assert "Traceback" in err.value.episodes[0].trajectory.traceback


def _batch(*statuses: str) -> RolloutBatch:
    episodes = [Episode(Trajectory(env_id="e", group_id="g", episode_id=i, seed=0, status=status,
                                   exit_reason="terminated" if status == "Finished" else "engine_error",
                                   error=f"boom {i}"), [])
                for i, status in enumerate(statuses)]
    return RolloutBatch(episodes=episodes, groups={"g": episodes}, samples=[], metrics={})


def test_check_batch_passes_any_batch_with_one_finished_episode():
    check_batch(_batch(), "an empty batch")
    check_batch(_batch("Failed", "Finished", "Timeout"), "a batch")
    with pytest.raises(BatchFailedError, match=r"^every episode of step 7 failed \(3 of 3: status Failed 2, "
                                               r"Timeout 1; exit_reason engine_error 3\), so there is nothing "
                                               r"to train on; the first one \(g/0\): boom 0$"):
        check_batch(_batch("Failed", "Timeout", "Failed"), "step 7")
