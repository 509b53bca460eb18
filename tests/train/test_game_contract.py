"""A game written outside arl/envs, with actions that are not directions, trains from the Game contract alone."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from trainer_support import small_config

from arl.engine import make_engine
from arl.envs import Game, TextEnv, check_game, register_game
from arl.train import Trainer

pytestmark = pytest.mark.anyio


class Lamps(Game):
    """Four lamps in a row, all off; "Light" lights the next one, "Wait" does nothing. Light all four."""

    action_names = ["Light", "Wait"]
    game_name = "lamps"
    description = "Four lamps stand in a row. Light them all, one per turn, left to right."
    default_format_penalty = -0.05
    symbols = "o*"
    symbol_names = {"o": "lamp off", "*": "lamp on"}

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0, 1, (1, 4), dtype=np.int8)
        self.action_space = spaces.Discrete(2)
        self.lit = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.lit = 0
        return self._obs(), {"success": False}

    def step(self, action):
        if action == 0 and self.lit < 4:
            self.lit += 1
        done = self.lit == 4
        return self._obs(), float(done), done, False, {"success": done, "action_effective": action == 0}

    def _obs(self):
        return np.array([[1] * self.lit + [0] * (4 - self.lit)], dtype=np.int8)

    def grid_text(self) -> str:
        return "*" * self.lit + "o" * (4 - self.lit)


register_game("test/Lamps-v0", Lamps, max_episode_steps=6)


def test_the_contract_names_what_is_missing():
    class NoLegend(Lamps):
        symbol_names = {"o": "lamp off"}

    check_game(Lamps())
    with pytest.raises(TypeError, match=r"no word for '\*'"):
        TextEnv(NoLegend())
    env = TextEnv("test/Lamps-v0")
    assert "o: lamp off, *: lamp on" in env.instructions and "Light, Wait" in env.instructions


async def test_a_game_with_non_directional_actions_trains_two_steps_with_the_warm_start(tmp_path):
    config = small_config(tmp_path, "rollout.env_id=test/Lamps-v0", "sft.steps=1", "sft.batch_episodes=4")
    engine = make_engine(backend="scripted", model=config.model, max_model_len=1024,
                         scripted={"invalid_rate": 0.2, "actions": ["Light", "Wait"]})
    async with Trainer(config, engine=engine) as trainer:
        await trainer.setup()
        history = await trainer.train()
    rows = [row for row in history if "rollout/valid_action_rate" in row]
    assert len(rows) == 2 and all(row["rollout/valid_action_rate"] > 0 for row in rows)
    assert next(row for row in history if "sft/steps" in row)["sft/steps"] == 1
