"""The format warm-start's teacher speaks the game's own action names."""

from __future__ import annotations

import gymnasium as gym
import pytest
from trainer_support import scripted, small_config

from arl.envs import FrozenLakeEnv
from arl.rollout import GroupScheduler
from arl.rollout.factory import close_manager
from arl.train import Trainer
from arl.train.sft import teacher_engine

pytestmark = pytest.mark.anyio

COMPASS = ["West", "South", "East", "North"]


class CompassLake(FrozenLakeEnv):
    """FrozenLake whose actions are compass points: nothing here may assume Up/Down/Left/Right."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.action_names = list(COMPASS)


if "test/CompassLake-v0" not in gym.registry:
    gym.register(id="test/CompassLake-v0", entry_point=CompassLake, max_episode_steps=10,
                 kwargs={"size": 4, "p": 0.8, "is_slippery": False})


async def _teacher_valid_rate(trainer) -> float:
    teacher = teacher_engine(trainer)
    manager = trainer.manager.derive(engine=teacher)
    groups = GroupScheduler(trainer.config.rollout.env_id, num_groups=8, group_size=1, base_seed=7, tag="sft")
    try:
        batch = await groups.run(manager, groups.specs(0))
    finally:
        await close_manager(manager)
        await teacher.close()
    return batch.metrics["rollout/valid_action_rate"]


@pytest.mark.parametrize("env_id", ["test/CompassLake-v0", "arl/Sokoban-v0"])
async def test_the_teacher_answers_in_the_games_action_names(tmp_path, env_id):
    config = small_config(tmp_path, f"rollout.env_id={env_id}")
    async with Trainer(config, engine=scripted(config)) as trainer:
        await trainer.setup()
        assert await _teacher_valid_rate(trainer) == 1.0  # "Up" in a game of "North" would be 0.0


async def test_the_warm_start_on_a_compass_game_trains_on_valid_answers_only(tmp_path):
    config = small_config(tmp_path, "rollout.env_id=test/CompassLake-v0", "sft.steps=1", "sft.batch_episodes=4",
                          "steps=1")
    async with Trainer(config, engine=scripted(config)) as trainer:
        await trainer.setup()
        assert teacher_engine(trainer).actions == tuple(COMPASS)
        history = await trainer.train()
    assert next(row for row in history if "sft/loss_last" in row)["sft/steps"] == 1
