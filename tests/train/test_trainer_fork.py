"""A forked rollout (rollout.manager.fork) through the unchanged Trainer: two steps on the scripted engine."""

from __future__ import annotations

import pytest
from trainer_support import scripted, small_config

from arl.rollout import ForkEnvManager
from arl.train import Trainer

pytestmark = pytest.mark.anyio


async def test_two_forked_training_steps_end_to_end(tmp_path):
    config = small_config(tmp_path, "algo.estimator=gigpo", "rollout.manager.fork={k: 3, at: first, states: 2}",
                          "eval.at_start=true")
    async with Trainer(config, engine=scripted(config)) as trainer:
        history = await trainer.train()
        assert type(trainer.manager) is ForkEnvManager
    evaluation, *steps = history  # eval.at_start: the unforked validation panel comes first, as step 0
    assert [m["step"] for m in steps] == [1, 2] and not any("branch" in key for key in evaluation)
    for metrics in steps:
        assert metrics["train/skipped_updates"] == 0
        assert metrics["train/gigpo_fork_group_size_mean"] == 3
        assert metrics["train/gigpo_fork_groups"] == metrics["rollout/fork_states"] > 0
        assert metrics["rollout/branches"] == 2 * metrics["rollout/fork_states"]
        assert metrics["rollout/num_samples"] == metrics["rollout/num_turns"] + metrics["rollout/branches"]
